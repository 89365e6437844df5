//! The session listing row: how each appended event changes a session's summary.
//!
//! The fold must match `keel_testkit::MemStore` exactly; the conformance suite pins both.

use keel_contracts::{EventKind, Seq, SessionId, SessionStatus, SessionSummary, Usage};

use crate::record::EventHead;

/// Longest title kept, in characters, including the trailing ellipsis.
const TITLE_MAX_CHARS: usize = 80;

/// The summary of a session whose first stored event is `first` (normally
/// `session_created`), before `first` itself is applied.
pub(crate) fn start(first: &EventHead) -> SessionSummary {
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

/// What one event changes in its session's summary, besides its seq and time: taken from
/// the event when its append is prepared ([`Fold::of`]), applied with [`apply`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fold {
    /// `session_created`: where, with which model, whose child.
    Created { workspace: String, model: String, parent: Option<SessionId> },
    /// `turn_started`: the title the input makes (kept when the session has none yet).
    Title(String),
    /// `model_response`, of every purpose: summaries are model calls like any other
    /// (DESIGN.md §4).
    Usage { usage: Usage, estimated: Option<Usage>, cost_usd: Option<f64> },
    /// A run's or the session's new status.
    Status(SessionStatus),
    /// Nothing else.
    Nothing,
}

impl Fold {
    /// What `kind` changes (see [`apply`] for the rule).
    pub(crate) fn of(kind: &EventKind) -> Fold {
        match kind {
            EventKind::SessionCreated { workspace, model, lineage, .. } => Fold::Created {
                workspace: workspace.clone(),
                model: model.clone(),
                parent: lineage.as_ref().map(|lineage| lineage.parent_session_id),
            },
            EventKind::TurnStarted { input } => Fold::Title(title_from_input(input)),
            EventKind::ModelResponse { usage, estimated_usage, cost_usd, .. } => Fold::Usage {
                usage: *usage,
                estimated: *estimated_usage,
                cost_usd: *cost_usd,
            },
            EventKind::SessionSealed { .. } => Fold::Status(SessionStatus::Sealed),
            EventKind::RunStarted { .. } => Fold::Status(SessionStatus::Running),
            EventKind::RunCompleted { .. } => Fold::Status(SessionStatus::Completed),
            EventKind::RunFailed { .. } => Fold::Status(SessionStatus::Failed),
            EventKind::RunSuspended { .. } => Fold::Status(SessionStatus::Suspended),
            EventKind::RunCancelled { .. } => Fold::Status(SessionStatus::Cancelled),
            EventKind::RunDenied { .. } => Fold::Status(SessionStatus::Denied),
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
            | EventKind::WaitStarted { .. } => Fold::Nothing,
        }
    }
}

/// Folds one appended event into its session's summary.
///
/// The status follows run events (`run_started` → running, `run_completed` → completed,
/// …) and `session_sealed` → sealed, which is final. The title is the first non-empty
/// turn input.
pub(crate) fn apply(summary: &mut SessionSummary, event: &EventHead) {
    summary.last_seq = event.seq;
    summary.updated_at = event.ts;
    let status = match &event.fold {
        Fold::Created { workspace, model, parent } => {
            summary.created_at = event.ts;
            summary.workspace.clone_from(workspace);
            summary.model.clone_from(model);
            summary.parent = *parent;
            None
        }
        Fold::Title(title) => {
            if summary.title.is_empty() {
                summary.title.clone_from(title);
            }
            None
        }
        Fold::Usage { usage, estimated, cost_usd } => {
            summary.usage.add(usage, estimated.as_ref(), *cost_usd);
            None
        }
        Fold::Status(status) => Some(*status),
        Fold::Nothing => None,
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
