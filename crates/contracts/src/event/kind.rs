//! What each event kind means beyond its fields: its `kind` spelling, whether it ends a
//! run, and the session status it sets in the listing.

use super::EventKind;
use crate::RequestPurpose;

impl EventKind {
    /// The session status this event sets in the session listing: a run's start and end
    /// (`run_started` → running, `run_completed` → completed, …) and `session_sealed` →
    /// sealed; `None` for every other event, which leaves the status as it is. Stores fold
    /// it with [`crate::SessionStatus::then`] (sealing is final).
    pub fn session_status(&self) -> Option<crate::SessionStatus> {
        use crate::SessionStatus;
        match self {
            EventKind::SessionSealed { .. } => Some(SessionStatus::Sealed),
            EventKind::RunStarted { .. } => Some(SessionStatus::Running),
            EventKind::RunCompleted { .. } => Some(SessionStatus::Completed),
            EventKind::RunFailed { .. } => Some(SessionStatus::Failed),
            EventKind::RunSuspended { .. } => Some(SessionStatus::Suspended),
            EventKind::RunCancelled { .. } => Some(SessionStatus::Cancelled),
            EventKind::RunDenied { .. } => Some(SessionStatus::Denied),
            EventKind::SessionCreated { .. }
            | EventKind::TurnStarted { .. }
            | EventKind::ModelResponse { .. }
            | EventKind::RunComposition { .. }
            | EventKind::ModelRequested { .. }
            | EventKind::ModelRetry { .. }
            // A budget stop is settled by the `run_suspended` that follows it.
            | EventKind::BudgetExhausted { .. }
            | EventKind::Compaction { .. }
            | EventKind::CompactionFailed { .. }
            | EventKind::Checkpoint { .. }
            | EventKind::GateDecision { .. }
            | EventKind::PermissionRequested { .. }
            | EventKind::PermissionSettled { .. }
            | EventKind::ElicitationRequested { .. }
            | EventKind::ElicitationAnswered { .. }
            | EventKind::ToolsChanged { .. }
            | EventKind::BoundaryRevised { .. }
            | EventKind::ToolCall { .. }
            | EventKind::InputJoined { .. }
            | EventKind::PlanApproved { .. }
            | EventKind::ToolAttemptPrepared { .. }
            | EventKind::ToolResult { .. }
            | EventKind::ShadowIntent { .. }
            | EventKind::SkillCatalog { .. }
            | EventKind::SkillActivated { .. }
            | EventKind::ScheduleFired { .. }
            | EventKind::WaitStarted { .. } => None,
        }
    }

    /// The `kind` spelling on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::SessionCreated { .. } => "session_created",
            EventKind::SessionSealed { .. } => "session_sealed",
            EventKind::PlanApproved { .. } => "plan_approved",
            EventKind::TurnStarted { .. } => "turn_started",
            EventKind::InputJoined { .. } => "input_joined",
            EventKind::RunStarted { .. } => "run_started",
            EventKind::RunComposition { .. } => "run_composition",
            EventKind::ModelRequested { .. } => "model_requested",
            EventKind::ModelResponse { .. } => "model_response",
            EventKind::ModelRetry { .. } => "model_retry",
            EventKind::BudgetExhausted { .. } => "budget_exhausted",
            EventKind::Compaction { .. } => "compaction",
            EventKind::CompactionFailed { .. } => "compaction_failed",
            EventKind::Checkpoint { .. } => "checkpoint",
            EventKind::GateDecision { .. } => "gate_decision",
            EventKind::PermissionRequested { .. } => "permission_requested",
            EventKind::PermissionSettled { .. } => "permission_settled",
            EventKind::ElicitationRequested { .. } => "elicitation_requested",
            EventKind::ElicitationAnswered { .. } => "elicitation_answered",
            EventKind::ToolsChanged { .. } => "tools_changed",
            EventKind::ToolCall { .. } => "tool_call",
            EventKind::ToolAttemptPrepared { .. } => "tool_attempt_prepared",
            EventKind::ToolResult { .. } => "tool_result",
            EventKind::ShadowIntent { .. } => "shadow_intent",
            EventKind::RunCompleted { .. } => "run_completed",
            EventKind::RunFailed { .. } => "run_failed",
            EventKind::RunSuspended { .. } => "run_suspended",
            EventKind::RunCancelled { .. } => "run_cancelled",
            EventKind::RunDenied { .. } => "run_denied",
            EventKind::BoundaryRevised { .. } => "boundary_revised",
            EventKind::SkillCatalog { .. } => "skill_catalog",
            EventKind::SkillActivated { .. } => "skill_activated",
            EventKind::ScheduleFired { .. } => "schedule_fired",
            EventKind::WaitStarted { .. } => "wait_started",
        }
    }

    /// Whether this is a `model_response` of a conversation step (part of the history the
    /// projection builds), not one of keel's own calls such as a compaction summary.
    pub fn is_conversation_response(&self) -> bool {
        matches!(self, EventKind::ModelResponse { purpose: RequestPurpose::Conversation, .. })
    }

    /// Whether this kind ends a run.
    pub fn is_run_terminal(&self) -> bool {
        match self {
            EventKind::RunCompleted { .. }
            | EventKind::RunFailed { .. }
            | EventKind::RunSuspended { .. }
            | EventKind::RunCancelled { .. }
            | EventKind::RunDenied { .. } => true,
            EventKind::SessionCreated { .. }
            | EventKind::SessionSealed { .. }
            | EventKind::PlanApproved { .. }
            | EventKind::TurnStarted { .. }
            | EventKind::InputJoined { .. }
            | EventKind::RunStarted { .. }
            | EventKind::RunComposition { .. }
            | EventKind::ModelRequested { .. }
            | EventKind::ModelResponse { .. }
            | EventKind::ModelRetry { .. }
            | EventKind::BudgetExhausted { .. }
            | EventKind::Compaction { .. }
            | EventKind::CompactionFailed { .. }
            | EventKind::Checkpoint { .. }
            | EventKind::GateDecision { .. }
            | EventKind::PermissionRequested { .. }
            | EventKind::PermissionSettled { .. }
            | EventKind::ElicitationRequested { .. }
            | EventKind::ElicitationAnswered { .. }
            | EventKind::ToolsChanged { .. }
            | EventKind::ToolCall { .. }
            | EventKind::ToolAttemptPrepared { .. }
            | EventKind::ToolResult { .. }
            | EventKind::ShadowIntent { .. }
            | EventKind::SkillCatalog { .. }
            | EventKind::SkillActivated { .. }
            | EventKind::ScheduleFired { .. }
            | EventKind::WaitStarted { .. }
            | EventKind::BoundaryRevised { .. } => false,
        }
    }
}
