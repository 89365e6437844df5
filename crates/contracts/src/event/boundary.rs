//! The containment a run's tools run inside: the sandbox mode, and the extra boundary the
//! user granted (`boundary_revised`).

use serde::{Deserialize, Serialize};

/// The boundary commands and file tools run inside (DESIGN.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// OS containment; a tool refuses when it cannot be enforced.
    #[default]
    Managed,
    /// No containment, by explicit user choice.
    Bypass,
}

/// Extra room outside the workspace that the user granted a session through
/// `request_boundary`. Cumulative: each revision holds everything granted so far.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Boundary {
    /// Extra read-only paths (absolute).
    pub read: Vec<String>,
    /// Extra read-write paths (absolute).
    pub write: Vec<String>,
    /// Whether commands may use the network.
    pub network: bool,
}
