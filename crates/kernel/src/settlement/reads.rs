//! Consecutive plain reads of one response, settled side by side: admitted in call order,
//! run concurrently, recorded in call order.

use keel_contracts::{Outcome, RunId, ToolCall, ToolOutput, TurnId};

use super::{
    AbortOnDrop, Admission, CANCELLED_BEFORE_RUN, CANCELLED_WHILE_RUNNING, Call, CallState, Held,
    Ready, STOPPED_EARLY_WHILE_RUNNING, Settled, until,
};
use crate::failpoint::Failpoint;
use crate::ledger::Ledger;
use crate::{Cancellation, Result};

/// How many plain reads of one response run at once.
const MAX_PARALLEL_READS: usize = 8;

impl CallState<'_> {
    /// How many of `tool_calls`, from the first, may run side by side: plain reads
    /// (declared `read`, not intrinsic: built-in, MCP), which change nothing another call
    /// could see. Intrinsic tools touch the run's own state and run alone.
    pub(crate) fn leading_reads(&self, tool_calls: &[ToolCall]) -> usize {
        tool_calls
            .iter()
            .take_while(|call| {
                self.registry.get(&call.name).is_some_and(|tool| {
                    let spec = tool.spec();
                    spec.access == keel_contracts::Access::Read && !spec.intrinsic
                })
            })
            .count()
    }

    /// Settles consecutive plain reads of one response side by side (at most
    /// [`MAX_PARALLEL_READS`] at a time): each is gated and its `tool_attempt_prepared`
    /// made durable in call order, then the admitted ones run concurrently, and their
    /// results are recorded in call order. Every call gets exactly one `tool_result`.
    pub(crate) async fn settle_reads(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        tool_calls: &[ToolCall],
        cancel: &Cancellation,
    ) -> Result<Settled> {
        // A call answered at its gate (refused, cancelled) is held back and recorded in
        // its place, after the results of the reads before it.
        let held: Vec<Held> = tool_calls.iter().map(|_| Held::default()).collect();
        let mut admitted = Vec::with_capacity(tool_calls.len());
        for (tool_call, hold) in tool_calls.iter().zip(&held) {
            if cancel.is_cancelled() {
                *hold.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((
                    None,
                    ToolOutput {
                        outcome: Outcome::Cancelled,
                        content: CANCELLED_BEFORE_RUN.into(),
                        raw: None,
                    },
                ));
                admitted.push(None);
                continue;
            }
            let mut admission = Admission { ready: None, hold: Some(hold) };
            self.admit(ledger, turn_id, run_id, tool_call, cancel, &mut admission).await?;
            admitted.push(admission.ready);
        }
        let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_PARALLEL_READS));
        // Questions from any of the reads are answered while the loop below awaits them.
        let (sender, mut questions) = crate::elicit::channel();
        let mut asked = vec![0u32; tool_calls.len()];
        let running: Vec<Option<(Ready, AbortOnDrop)>> = admitted
            .into_iter()
            .zip(tool_calls)
            .enumerate()
            .map(|(index, (ready, tool_call))| {
                let ready = ready?;
                let (tool, mut context) = (ready.tool.clone(), ready.context.clone());
                context.elicitor = Some(std::sync::Arc::new(crate::elicit::CallElicitor::new(
                    index,
                    sender.clone(),
                )));
                let arguments = tool_call.arguments.clone();
                let permits = permits.clone();
                let task = AbortOnDrop(tokio::spawn(async move {
                    // The semaphore is never closed; without a permit the read still runs.
                    let _permit = permits.acquire_owned().await.ok();
                    tool.invoke(&context, &arguments).await
                }));
                let failpoints = self.failpoints.clone();
                tokio::spawn(async move { failpoints.hit(Failpoint::MidTool).await });
                Some((ready, task))
            })
            .collect();
        drop(sender);
        for ((slot, tool_call), hold) in running.into_iter().zip(tool_calls).zip(held) {
            let call = Call { turn: Some(turn_id), run: Some(run_id), call: tool_call, hold: None };
            let Some((ready, mut task)) = slot else {
                let answered = hold.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some((attempt, output)) = answered {
                    call.output(ledger, attempt, output).await?;
                }
                continue;
            };
            let attempt = Some(ready.attempt_id);
            if self.out_of_time {
                call.result(
                    ledger,
                    attempt,
                    Outcome::Cancelled,
                    STOPPED_EARLY_WHILE_RUNNING.into(),
                )
                .await?;
                continue;
            }
            let output = loop {
                tokio::select! {
                    joined = task.wait() => break Some(match joined {
                        Ok(output) => output,
                        Err(error) => ToolOutput::error(format!("error: the tool failed unexpectedly: {error}")),
                    }),
                    Some(question) = questions.recv() => {
                        let Some(asking) = tool_calls.get(question.index) else { continue };
                        let asker =
                            Call { turn: Some(turn_id), run: Some(run_id), call: asking, hold: None };
                        asked[question.index] += 1;
                        let number = asked[question.index];
                        self.answer_question(ledger, &asker, number, question, cancel).await?;
                    }
                    () = cancel.cancelled() => {
                        call.result(ledger, attempt, Outcome::Cancelled, CANCELLED_WHILE_RUNNING.into())
                            .await?;
                        break None;
                    }
                    () = until(self.deadline) => {
                        self.out_of_time = true;
                        call.result(ledger, attempt, Outcome::Cancelled, STOPPED_EARLY_WHILE_RUNNING.into())
                            .await?;
                        break None;
                    }
                }
            };
            let Some(output) = output else { continue };
            if output.outcome == Outcome::Error {
                *self.failures.entry(ready.failure_key).or_insert(0) += 1;
            }
            self.failpoints.hit(Failpoint::BeforeResult).await;
            call.output(ledger, attempt, output).await?;
            self.failpoints.hit(Failpoint::AfterResult).await;
        }
        Ok(if std::mem::take(&mut self.out_of_time) { Settled::OutOfTime } else { Settled::Done })
    }
}
