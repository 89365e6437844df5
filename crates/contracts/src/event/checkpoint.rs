//! The evidence a `checkpoint` records: each tool call of the run and how it ended.

use serde::{Deserialize, Serialize};

use crate::{Outcome, Seq};

/// One tool call of a run and how it ended, as recorded in a
/// [`EventKind::Checkpoint`](crate::EventKind::Checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The seq of its `tool_result`.
    pub seq: Seq,
    /// The tool.
    pub tool: String,
    /// The call's arguments, abbreviated to at most 200 characters.
    pub arguments: String,
    /// How it ended.
    pub outcome: Outcome,
}
