//! Time and identity sources, injected so tests are deterministic.

use std::fmt::Debug;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{AttemptId, RunId, SessionId, TurnId};

/// Where the kernel reads the current time (UTC, millisecond precision is enough).
pub trait Clock: Send + Sync + Debug {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// Where the kernel gets new ids. Production ids are UUIDv7 (time-ordered).
pub trait IdGen: Send + Sync + Debug {
    /// A fresh, never-repeated UUID.
    fn new_uuid(&self) -> Uuid;

    /// A fresh session id.
    fn session_id(&self) -> SessionId {
        SessionId(self.new_uuid())
    }
    /// A fresh turn id.
    fn turn_id(&self) -> TurnId {
        TurnId(self.new_uuid())
    }
    /// A fresh run id.
    fn run_id(&self) -> RunId {
        RunId(self.new_uuid())
    }
    /// A fresh attempt id.
    fn attempt_id(&self) -> AttemptId {
        AttemptId(self.new_uuid())
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// UUIDv7 ids from the system clock and a random source.
#[derive(Debug, Default, Clone, Copy)]
pub struct UuidV7Ids;

impl IdGen for UuidV7Ids {
    fn new_uuid(&self) -> Uuid {
        Uuid::now_v7()
    }
}
