//! The session listing row: how each appended event changes a session's summary.
//!
//! The fold must match `keel_testkit::MemStore` exactly; the conformance suite pins both.

use chrono::{DateTime, Utc};
use keel_contracts::{
    EventKind, Seq, SessionId, SessionStatus, SessionSummary, Usage, session_title,
};

/// The summary of a session whose first stored event (normally `session_created`) was
/// recorded at `first_at`, before that event itself is applied.
pub(crate) fn start(session_id: SessionId, first_at: DateTime<Utc>) -> SessionSummary {
    SessionSummary::starting(session_id, first_at)
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
            EventKind::TurnStarted { input } => Fold::Title(session_title(input)),
            EventKind::ModelResponse { usage, estimated_usage, cost_usd, .. } => {
                Fold::Usage { usage: *usage, estimated: *estimated_usage, cost_usd: *cost_usd }
            }
            other => other.session_status().map_or(Fold::Nothing, Fold::Status),
        }
    }
}

/// Folds one appended event, at `seq` and recorded at `at`, into its session's summary:
/// `fold` is what it changes ([`Fold::of`], taken when its append was prepared).
///
/// The status follows run events (`run_started` → running, `run_completed` → completed,
/// …) and `session_sealed` → sealed, which is final. The title is the first non-empty
/// turn input.
pub(crate) fn apply(summary: &mut SessionSummary, seq: Seq, at: DateTime<Utc>, fold: &Fold) {
    summary.last_seq = seq;
    summary.updated_at = at;
    match fold {
        Fold::Created { workspace, model, parent } => {
            summary.created_at = at;
            summary.workspace.clone_from(workspace);
            summary.model.clone_from(model);
            summary.parent = *parent;
        }
        Fold::Title(title) => {
            if summary.title.is_empty() {
                summary.title.clone_from(title);
            }
        }
        Fold::Usage { usage, estimated, cost_usd } => {
            summary.usage.add(usage, estimated.as_ref(), *cost_usd);
        }
        Fold::Status(status) => summary.status = summary.status.then(*status),
        Fold::Nothing => {}
    }
}

/// Parses [`SessionStatus::as_str`]'s spelling.
pub(crate) fn parse_status(text: &str) -> Option<SessionStatus> {
    SessionStatus::parse(text)
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
