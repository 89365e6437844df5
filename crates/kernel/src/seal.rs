//! Sealing: making a session inert (DESIGN.md §6).
//!
//! A sealed session never runs agent code again: once `session_sealed` is durable,
//! [`Kernel::run_turn`], [`Kernel::resume`] and compaction refuse the session with
//! [`KernelError::Sealed`] before they append anything or ask the model. The ledger stays
//! readable; sealing is final.

use keel_contracts::{EventKind, Seq, SessionId};

#[cfg(doc)]
use crate::KernelError;
use crate::{Kernel, Result};

impl Kernel {
    /// Seals `session_id`: appends `session_sealed` with `reason` (no turn, no run), after
    /// which the session never runs agent code again.
    ///
    /// Sealing asks no model, runs no tool and closes no run: a run a dead process left
    /// open stays as the ledger shows it, and since the session never runs again it is
    /// never replayed either.
    ///
    /// Returns the seq of the `session_sealed` event.
    ///
    /// # Errors
    ///
    /// [`KernelError::Sealed`] when the session is sealed already (nothing is appended),
    /// [`KernelError::SessionNotFound`] and [`KernelError::MalformedSession`] as for
    /// [`Kernel::run_turn`], [`KernelError::Read`] and [`KernelError::Append`] when the
    /// ledger cannot be read or written (a concurrent append to the session, e.g. a run
    /// in another process, makes the seal lose with a seq conflict: seal again).
    ///
    /// # Cancel safety
    ///
    /// The session is sealed if and only if the append completed.
    pub async fn seal_session(&self, session_id: SessionId, reason: &str) -> Result<Seq> {
        // `load_session` refuses a sealed session, which is exactly the "already" case.
        let mut ledger = self.load_session(session_id).await?;
        self.take_lease(&mut ledger).await?;
        let seq = ledger
            .append(None, None, EventKind::SessionSealed { reason: reason.to_owned() })
            .await?
            .seq;
        self.drop_lease(&mut ledger).await;
        Ok(seq)
    }
}

/// The input of the turn that carries out an approved plan, when the user gives none.
pub const APPROVED_PLAN_TASK: &str =
    "The plan is approved. Carry it out now, step by step, and check the result.";

impl Kernel {
    /// Approves the plan of a session in plan mode: appends `plan_approved` (no turn, no
    /// run), after which the session's runs are live. The plan itself is what the last run
    /// recorded (its `plan` calls and its answer); start a turn to carry it out.
    ///
    /// Returns the seq of the `plan_approved` event.
    ///
    /// # Errors
    ///
    /// [`KernelError::NotPlanning`] when the session has no plan to approve: it was not
    /// created in plan mode, no plan-mode run of it has completed yet (there is no plan),
    /// or its plan was approved already (nothing is appended); otherwise as
    /// [`Kernel::seal_session`].
    ///
    /// # Cancel safety
    ///
    /// The plan is approved if and only if the append completed.
    pub async fn approve_plan(&self, session_id: SessionId, by: &str) -> Result<Seq> {
        let mut ledger = self.load_session(session_id).await?;
        if !has_plan_to_approve(ledger.events()) {
            return Err(crate::KernelError::NotPlanning(session_id));
        }
        self.take_lease(&mut ledger).await?;
        let seq =
            ledger.append(None, None, EventKind::PlanApproved { by: by.to_owned() }).await?.seq;
        self.drop_lease(&mut ledger).await;
        Ok(seq)
    }
}

/// Whether a session's events (`events[0]` is `session_created`) hold a plan waiting for
/// approval: the session was created in plan mode, at least one of its runs completed
/// (every run before the approval is a plan-mode run, so that run's answer is the plan),
/// and no `plan_approved` was recorded. The one rule behind [`Kernel::approve_plan`], so
/// every caller (the CLI's `--approve-plan`, the HTTP API) refuses alike.
fn has_plan_to_approve(events: &[keel_contracts::RuntimeEvent]) -> bool {
    let plan_mode = matches!(
        events.first().map(|event| &event.kind),
        Some(EventKind::SessionCreated { mode: keel_contracts::ExecutionMode::Plan, .. })
    );
    let planned = events.iter().any(|event| matches!(event.kind, EventKind::RunCompleted { .. }));
    let approved = events.iter().any(|event| matches!(event.kind, EventKind::PlanApproved { .. }));
    plan_mode && planned && !approved
}
