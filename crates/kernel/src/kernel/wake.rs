//! Waking a run parked on `wait` ([`crate::wait`]): offering the tool, and the new run
//! whose first fact is the `wait` result.

use std::sync::Arc;

use super::{FirstResult, Kernel};
use crate::wait::{WAIT, WaitTool, WakeAnswer, same_wake_id, waiting};
use crate::{Cancellation, KernelError, Result, RunConfig, RunReport};
use keel_contracts::{Outcome, SessionId};

impl Kernel {
    /// This kernel, offering the intrinsic `wait` tool (after the others). A composition
    /// root that can wake runs (a host, `keel wake`) turns it on.
    ///
    /// # Errors
    ///
    /// [`crate::RegistryError`] if a tool called `wait` is registered already.
    pub fn with_wait(mut self) -> std::result::Result<Kernel, crate::RegistryError> {
        self.registry = self.registry.with_intrinsic(Arc::new(WaitTool::new()))?;
        Ok(self)
    }

    /// Wakes the session's run parked on `wait` with `wake_id`: a new run of its turn
    /// whose first fact is the `wait` result (`answer`), then the loop goes on as usual.
    ///
    /// # Errors
    ///
    /// [`KernelError::NotWaiting`] when the session's last run is not parked on a wait with
    /// this id (never parked, another id, answered already, a new turn began): nothing is
    /// appended. Otherwise as [`Kernel::run_turn`].
    ///
    /// # Cancel safety
    ///
    /// As [`Kernel::run_turn`]; the wake is applied if and only if the new run's
    /// `run_started` is durable (the wait result is committed with it).
    pub async fn wake(
        &self,
        session_id: SessionId,
        wake_id: &str,
        answer: &WakeAnswer,
        config: &RunConfig,
        cancel: &Cancellation,
    ) -> Result<RunReport> {
        let mut ledger = self.load_session(session_id).await?;
        self.take_lease(&mut ledger).await?;
        let found = waiting(ledger.events()).filter(|w| same_wake_id(&w.wake_id, wake_id));
        let turn = crate::recovery::resumable_turn(ledger.events());
        let (Some(waiting), Some((turn_id, last_run))) = (found, turn) else {
            self.drop_lease(&mut ledger).await;
            return Err(KernelError::NotWaiting {
                session_id,
                reason: "its last run is not parked on a wait with this wake id (it never \
                         waited, was woken already, or a new turn began)"
                    .into(),
            });
        };
        let result = FirstResult {
            call_id: waiting.call_id,
            tool: WAIT.to_owned(),
            outcome: Outcome::Ok,
            content: answer.result_text(&waiting.event),
        };
        self.drive_with(
            ledger,
            turn_id,
            last_run,
            Some(result),
            config,
            cancel,
            &crate::Steering::new(),
        )
        .await
    }
}
