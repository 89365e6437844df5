//! The session listing row: how each appended event changes a session's summary.
//!
//! The fold must match `keel_testkit::MemStore` exactly; the conformance suite pins both.

use keel_contracts::{EventKind, RuntimeEvent, Seq, SessionStatus, SessionSummary};

/// Longest title kept, in characters, including the trailing ellipsis.
const TITLE_MAX_CHARS: usize = 80;

/// The summary of a session whose first stored event is `first` (normally
/// `session_created`), before `first` itself is applied.
pub(crate) fn start(first: &RuntimeEvent) -> SessionSummary {
    SessionSummary {
        id: first.session_id,
        created_at: first.ts,
        updated_at: first.ts,
        workspace: String::new(),
        model: String::new(),
        title: String::new(),
        last_seq: Seq(0),
        status: SessionStatus::Idle,
        parent: None,
        usage: keel_contracts::UsageTotals::default(),
    }
}

/// Folds one appended event into its session's summary.
///
/// The status follows run events (`run_started` → running, `run_completed` → completed,
/// …) and `session_sealed` → sealed, which is final. The title is the first non-empty
/// turn input.
pub(crate) fn apply(summary: &mut SessionSummary, event: &RuntimeEvent) {
    summary.last_seq = event.seq;
    summary.updated_at = event.ts;
    let status = match &event.kind {
        EventKind::SessionCreated { workspace, model, lineage, .. } => {
            summary.created_at = event.ts;
            summary.workspace.clone_from(workspace);
            summary.model.clone_from(model);
            summary.parent = lineage.as_ref().map(|lineage| lineage.parent_session_id);
            None
        }
        EventKind::TurnStarted { input } => {
            if summary.title.is_empty() {
                summary.title = title_from_input(input);
            }
            None
        }
        // Every purpose: summaries are model calls like any other (DESIGN.md §4).
        EventKind::ModelResponse { usage, estimated_usage, cost_usd, .. } => {
            summary.usage.add(usage, estimated_usage.as_ref(), *cost_usd);
            None
        }
        EventKind::SessionSealed { .. } => Some(SessionStatus::Sealed),
        EventKind::RunStarted { .. } => Some(SessionStatus::Running),
        EventKind::RunCompleted { .. } => Some(SessionStatus::Completed),
        EventKind::RunFailed { .. } => Some(SessionStatus::Failed),
        EventKind::RunSuspended { .. } => Some(SessionStatus::Suspended),
        EventKind::RunCancelled { .. } => Some(SessionStatus::Cancelled),
        EventKind::RunDenied { .. } => Some(SessionStatus::Denied),
        EventKind::RunComposition { .. }
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
    };
    // Sealing is final: nothing recorded afterwards makes a sealed session look runnable.
    if let Some(status) = status
        && summary.status != SessionStatus::Sealed
    {
        summary.status = status;
    }
}

/// Parses [`SessionStatus::as_str`]'s spelling.
pub(crate) fn parse_status(text: &str) -> Option<SessionStatus> {
    SessionStatus::parse(text)
}

/// The display title for a turn input: whitespace runs collapsed to one space, at most
/// [`TITLE_MAX_CHARS`] characters, ending in `…` when cut.
fn title_from_input(input: &str) -> String {
    let collapsed = input.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() <= TITLE_MAX_CHARS {
        return collapsed;
    }
    let mut title: String = collapsed.chars().take(TITLE_MAX_CHARS - 1).collect();
    title.truncate(title.trim_end().len());
    title.push('…');
    title
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_spelling_parses_back() {
        for status in SessionStatus::ALL {
            assert_eq!(parse_status(status.as_str()), Some(status));
        }
        assert_eq!(parse_status("Running"), None);
    }
}
