//! Identities: distinct newtypes that are never interchangeable (DESIGN.md §1).

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// The id as a UUID (v7 in production, time-ordered).
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

uuid_id!(
    /// A conversation bound to a workspace and an envelope.
    SessionId
);
uuid_id!(
    /// One user input until its terminal outcome.
    TurnId
);
uuid_id!(
    /// One execution attempt of the loop for a turn; a resumed turn gets a new run.
    RunId
);
uuid_id!(
    /// One invocation of a tool for a tool call.
    AttemptId
);

/// The model's id for a proposed tool call.
///
/// Providers choose these (`call_ZR5…`, `toolu_01…`); when a provider sends none or an
/// empty one, the provider adapter mints one, so a `ToolCallId` is never empty.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolCallId(pub String);

impl ToolCallId {
    /// The id as the provider spelled it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ToolCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ToolCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ToolCallId({})", self.0)
    }
}

impl From<&str> for ToolCallId {
    fn from(value: &str) -> Self {
        ToolCallId(value.to_owned())
    }
}

/// A per-session, monotonic, gap-free sequence number; the first event of a session is 1.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Seq(pub u64);

impl Seq {
    /// The sequence number that follows this one.
    pub fn next(self) -> Seq {
        Seq(self.0 + 1)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}
