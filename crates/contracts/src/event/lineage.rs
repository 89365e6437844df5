//! Where a child session came from, as its `session_created` records it.

use serde::{Deserialize, Serialize};

use crate::{RunId, SessionId, ToolCallId, TurnId};

/// Where a child session came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// The parent session.
    pub parent_session_id: SessionId,
    /// The parent's run that spawned it.
    pub parent_run_id: RunId,
    /// The parent's turn.
    pub parent_turn_id: TurnId,
    /// The parent's `spawn_agent` call.
    pub parent_call_id: ToolCallId,
}
