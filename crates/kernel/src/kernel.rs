//! [`Kernel`]: creates sessions and drives turns through the loop of DESIGN.md §3.
//!
//! This file holds the kernel and its entry points (create a session, run a turn, resume);
//! the rest is by concern:
//!
//! - `build`: construction and the `with_*` builders.
//! - `run`: the loop that drives one run, step by step.
//! - `budget`: the budget check before each step and what a response is charged.
//! - `terminal`: how a run ends (checkpoint, terminal event, outbox, lease).
//! - `prompt`: the run's system prompt.
//! - `tool_source`: a changing tool source's tools between steps.
//! - `call_ids`: call ids unique in the session.
//! - `compact`, `lease`, `wake`: `keel compact` and compaction within a run, run leases,
//!   and waking a run parked on `wait`.

mod budget;
mod build;
mod call_ids;
mod compact;
mod lease;
mod prompt;
mod run;
mod terminal;
mod tool_source;
mod wake;

use std::sync::Arc;

use keel_contracts::{EventKind, SessionId};

pub use crate::config::{
    DEFAULT_GRANT_TTL, Instruction, KernelDeps, NoopObserver, Observer, RunConfig, RunReport,
    SessionConfig, Skill, SkillOrigin, Skills, TurnOutcome,
};
use crate::failpoint::Failpoints;
use crate::ledger::Ledger;
use crate::registry::Registry;
use crate::{Cancellation, KernelError, Result, recovery};
use tool_source::DynamicTools;

/// The agent runtime kernel.
#[derive(Debug)]
pub struct Kernel {
    pub(crate) deps: KernelDeps,
    pub(crate) registry: Registry,
    /// 0 for a top-level session, 1 for its children, …
    depth: u32,
    /// Sessions at this depth may not spawn children.
    max_agent_depth: u32,
    /// Named points where a crash harness may stop the process.
    failpoints: Arc<dyn Failpoints>,
    /// Flushed before every terminal event.
    pub(crate) outbox: Arc<dyn crate::Outbox>,
    /// The label this kernel takes session leases under.
    pub(crate) holder: String,
    /// Tells whether another holder's process is alive.
    pub(crate) holder_liveness: Arc<dyn crate::lease::HolderLiveness>,
    /// The bounds of a `run_code` cell.
    code_limits: crate::CodeLimits,
    /// Tools that may change while a run goes on (MCP servers), and what the kernel's
    /// tools held of them when it was built.
    tool_source: Option<DynamicTools>,
}

/// How deep sub-agents may nest by default: a top-level agent may spawn children, which
/// may not spawn their own.
pub const DEFAULT_MAX_AGENT_DEPTH: u32 = 1;

impl Kernel {
    /// Creates a session (`session_created` at seq 1).
    ///
    /// # Errors
    ///
    /// [`KernelError::Append`] when the ledger refuses the write.
    ///
    /// # Cancel safety
    ///
    /// The session exists if and only if the append completed.
    pub async fn create_session(&self, config: &SessionConfig) -> Result<SessionId> {
        self.create_session_with(config, None).await
    }

    pub(crate) async fn create_session_with(
        &self,
        config: &SessionConfig,
        lineage: Option<keel_contracts::Lineage>,
    ) -> Result<SessionId> {
        let session_id = self.deps.ids.session_id();
        let mut ledger = Ledger::new_session(
            session_id,
            self.deps.store.clone(),
            self.deps.clock.clone(),
            self.deps.observer.clone(),
        );
        ledger
            .append(
                None,
                None,
                EventKind::SessionCreated {
                    workspace: config.workspace.display().to_string(),
                    model: config.model_spec.clone(),
                    envelope: config.envelope.clone(),
                    mode: config.mode,
                    base_url: config.base_url.clone(),
                    lineage,
                },
            )
            .await?;
        Ok(session_id)
    }

    /// Starts a new turn with `input` and drives its run to a terminal event.
    ///
    /// A run left without a terminal event by a dead process is closed first (its open
    /// calls answered, see recovery), so the new turn starts from a consistent ledger.
    ///
    /// # Errors
    ///
    /// [`KernelError`] when the ledger cannot be read or written, or the session is sealed
    /// or malformed. Provider and tool failures are not errors: they end the run `Failed`
    /// or become tool results.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancel through `cancel`, which records `run_cancelled`. If the
    /// future is dropped anyway, the ledger stays a valid prefix and the next
    /// `run_turn`/`resume` closes the run.
    pub async fn run_turn(
        &self,
        session_id: SessionId,
        input: &str,
        config: &RunConfig,
        cancel: &Cancellation,
    ) -> Result<RunReport> {
        self.run_turn_steered(session_id, input, config, cancel, &crate::Steering::new()).await
    }

    /// [`Kernel::run_turn`], taking input sent while it runs from `steering`: each input
    /// joins at the next step boundary as an `input_joined` event (see [`crate::Steering`]).
    ///
    /// # Errors
    ///
    /// As [`Kernel::run_turn`].
    ///
    /// # Cancel safety
    ///
    /// As [`Kernel::run_turn`].
    pub async fn run_turn_steered(
        &self,
        session_id: SessionId,
        input: &str,
        config: &RunConfig,
        cancel: &Cancellation,
        steering: &crate::Steering,
    ) -> Result<RunReport> {
        let mut ledger = self.load(session_id).await?;
        self.take_lease(&mut ledger).await?;
        recovery::close_dangling_run(&mut ledger, self.outbox.as_ref()).await?;
        recovery::cancel_awaiting(&mut ledger).await?;
        let turn_id = self.deps.ids.turn_id();
        // Staged: committed with the run's first model request (or its terminal event).
        ledger.stage(Some(turn_id), None, EventKind::TurnStarted { input: input.to_owned() });
        self.drive(ledger, turn_id, None, config, cancel, steering).await
    }

    /// Resumes the session's last turn with a new run: after a crash, a cancel, a failure
    /// or a suspension.
    ///
    /// # Errors
    ///
    /// [`KernelError::NothingToResume`] when the last turn completed (or there is none);
    /// otherwise as [`Kernel::run_turn`].
    ///
    /// # Cancel safety
    ///
    /// As [`Kernel::run_turn`].
    pub async fn resume(
        &self,
        session_id: SessionId,
        config: &RunConfig,
        cancel: &Cancellation,
    ) -> Result<RunReport> {
        self.resume_steered(session_id, config, cancel, &crate::Steering::new()).await
    }

    /// [`Kernel::resume`], taking input sent while it runs from `steering` (as
    /// [`Kernel::run_turn_steered`]).
    ///
    /// # Errors
    ///
    /// As [`Kernel::resume`].
    ///
    /// # Cancel safety
    ///
    /// As [`Kernel::run_turn`].
    pub async fn resume_steered(
        &self,
        session_id: SessionId,
        config: &RunConfig,
        cancel: &Cancellation,
        steering: &crate::Steering,
    ) -> Result<RunReport> {
        let mut ledger = self.load(session_id).await?;
        self.take_lease(&mut ledger).await?;
        recovery::close_dangling_run(&mut ledger, self.outbox.as_ref()).await?;
        let Some((turn_id, last_run)) = recovery::resumable_turn(ledger.events()) else {
            self.drop_lease(&mut ledger).await;
            return Err(KernelError::NothingToResume(session_id));
        };
        if let Some(waiting) = crate::wait::waiting(ledger.events()) {
            self.drop_lease(&mut ledger).await;
            return Err(KernelError::Waiting { session_id, wake_id: waiting.wake_id });
        }
        self.drive(ledger, turn_id, last_run, config, cancel, steering).await
    }

    pub(crate) async fn load_session(&self, session_id: SessionId) -> Result<Ledger> {
        self.load(session_id).await
    }

    async fn load(&self, session_id: SessionId) -> Result<Ledger> {
        let ledger = Ledger::load(
            session_id,
            self.deps.store.clone(),
            self.deps.clock.clone(),
            self.deps.observer.clone(),
        )
        .await?;
        let Some(first) = ledger.first() else {
            if ledger.last_seq() > keel_contracts::Seq(0) {
                // Loaded from a compaction on: seq 1 was not among the session's facts.
                return Err(KernelError::MalformedSession {
                    session_id,
                    reason: "first event is not session_created".into(),
                });
            }
            return Err(KernelError::SessionNotFound(session_id));
        };
        if !matches!(first.kind, EventKind::SessionCreated { .. }) {
            return Err(KernelError::MalformedSession {
                session_id,
                reason: format!("first event is {}, not session_created", first.kind.name()),
            });
        }
        // Sealing is a fact: held in memory whatever was dropped.
        if ledger.events().iter().any(|event| matches!(event.kind, EventKind::SessionSealed { .. }))
        {
            return Err(KernelError::Sealed(session_id));
        }
        Ok(ledger)
    }
}

/// A tool result a run records first, right after `run_started` (a woken `wait`).
#[derive(Debug, Clone)]
pub(crate) struct FirstResult {
    pub(crate) call_id: keel_contracts::ToolCallId,
    pub(crate) tool: String,
    pub(crate) outcome: keel_contracts::Outcome,
    pub(crate) content: String,
}
