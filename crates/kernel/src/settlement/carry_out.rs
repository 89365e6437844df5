//! Carrying out an admitted call (its prepare is durable): through its intrinsic's hook,
//! or by invoking the tool on a task of its own, cancellable and bounded by the run's time
//! budget, its questions answered meanwhile; then its one `tool_result`.

use keel_contracts::{Outcome, RunId, ToolCall, ToolOutput, TurnId};

use super::{CANCELLED_WHILE_RUNNING, Call, CallState, Ready, STOPPED_EARLY_WHILE_RUNNING};
use crate::failpoint::Failpoint;
use crate::intrinsic::{Carry, IntrinsicCall};
use crate::ledger::Ledger;
use crate::{Cancellation, Result};

impl CallState<'_> {
    /// Carries out an admitted call (its prepare is durable) and records its result.
    pub(super) async fn carry_out(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        tool_call: &ToolCall,
        ready: Ready,
        cancel: &Cancellation,
    ) -> Result<()> {
        let Ready { attempt_id, tool, intrinsic, context, failure_key, arguments_sha256 } = ready;
        let call = Call { turn: Some(turn_id), run: Some(run_id), call: tool_call, hold: None };
        if let Some(hook) = intrinsic {
            let mut lent = IntrinsicCall {
                settlement: self,
                ledger,
                turn_id,
                run_id,
                tool_call,
                arguments_sha256: &arguments_sha256,
                cancel,
            };
            match hook.carry_out(&mut lent).await?.0 {
                Carry::Output(output) => {
                    return call.output(ledger, Some(attempt_id), output).await;
                }
                Carry::Answered => return Ok(()),
                Carry::Invoke => {}
            }
        }
        let arguments = tool_call.arguments.clone();
        // The tool may ask the user questions while it runs (an MCP server's elicitation):
        // they come back here, are recorded and asked, and answered in order.
        let (sender, mut questions) = crate::elicit::channel();
        let mut context = context;
        context.elicitor = Some(std::sync::Arc::new(crate::elicit::CallElicitor::new(0, sender)));
        let mut task =
            AbortOnDrop(tokio::spawn(async move { tool.invoke(&context, &arguments).await }));
        let failpoints = self.failpoints.clone();
        tokio::spawn(async move { failpoints.hit(Failpoint::MidTool).await });
        let mut asked = 0u32;
        let output = loop {
            tokio::select! {
                joined = task.wait() => break match joined {
                    Ok(output) => output,
                    Err(error) => ToolOutput::error(format!("error: the tool failed unexpectedly: {error}")),
                },
                Some(question) = questions.recv() => {
                    asked += 1;
                    self.answer_question(ledger, &call, asked, question, cancel).await?;
                }
                () = cancel.cancelled() => {
                    return call
                        .result(ledger, Some(attempt_id), Outcome::Cancelled, CANCELLED_WHILE_RUNNING.into())
                        .await;
                }
                () = until(self.deadline) => {
                    self.out_of_time = true;
                    return call
                        .result(ledger, Some(attempt_id), Outcome::Cancelled, STOPPED_EARLY_WHILE_RUNNING.into())
                        .await;
                }
            }
        };
        if output.outcome == Outcome::Error {
            *self.failures.entry(failure_key).or_insert(0) += 1;
        }
        self.failpoints.hit(Failpoint::BeforeResult).await;
        call.output(ledger, Some(attempt_id), output).await?;
        self.failpoints.hit(Failpoint::AfterResult).await;
        Ok(())
    }
}

/// Resolves at `deadline`, or never when there is none.
pub(super) async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A spawned tool task that is aborted if its owner is dropped (cancel or crash of the
/// driving future), so no tool outlives its run.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<ToolOutput>);

impl AbortOnDrop {
    /// Waits for the task without giving it up (for a `select!` in a loop).
    pub(super) async fn wait(&mut self) -> std::result::Result<ToolOutput, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
