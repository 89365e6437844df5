//! `run_code`: a cell's program runs on a blocking thread ([`crate::codemode`]); each of
//! its `tools.NAME(args)` comes back here as a [`NestedRequest`] and is settled like a call
//! the model proposed, through [`CallState::settle_inner`] (envelope, shadow mode, rules,
//! consent, sandbox, prepare, one `tool_result`), after a `tool_call` event that names the
//! cell's call as its parent. The program gets the recorded result text.
//!
//! Crash semantics follow from the ledger alone (see [`crate::recovery`]): the cell's own
//! call was prepared before the program started, so a crash mid-cell answers it
//! `indeterminate`, and every nested call left open is answered `indeterminate`
//! (prepared) or `cancelled` (not dispatched). A cell is never run again by recovery.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use keel_contracts::{Decision, EventKind, Outcome, ToolCall, ToolCallId, ToolOutput};

use super::{CANCELLED_WHILE_RUNNING, Call, CallState, until};
use crate::codemode::{CellEnd, NestedRequest, run_cell};
use crate::ledger::Ledger;
use crate::{Cancellation, Result};

/// The result of a call a program makes to one of keel's own tools (`run_code` itself,
/// `spawn_agent`, `request_boundary`, `plan`, …): refused, so a program neither nests
/// programs nor starts agents nor asks for a wider boundary.
pub(crate) const REFUSAL_IN_CELL: &str = "refused: a run_code program may call workspace tools \
only; this is one of keel's own tools (run_code, spawn_agent, request_boundary, plan, todo, …). \
Call it yourself, outside the program, if you need it";

/// Sets the cell's stop flag when dropped, so a program never outlives the future that
/// drives it (a cancelled or crashed run): it stops at its next instruction.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl CallState<'_> {
    /// Runs the cell of `parent` (a prepared `run_code` call) and settles its calls in
    /// the order the program makes them. Its output becomes `parent`'s result.
    pub(super) async fn run_cell(
        &mut self,
        ledger: &mut Ledger,
        parent: &Call<'_>,
        cancel: &Cancellation,
    ) -> Result<ToolOutput> {
        let code = parent
            .call
            .arguments
            .get("code")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let limits = self.code_limits;
        let stop = Arc::new(AtomicBool::new(false));
        let _stop_on_drop = StopOnDrop(stop.clone());
        let (requests, mut incoming) = tokio::sync::mpsc::channel::<NestedRequest>(1);
        let cell_stop = stop.clone();
        let mut cell =
            tokio::task::spawn_blocking(move || run_cell(&code, limits, requests, cell_stop));
        let mut made = 0u32;
        let mut open = true;
        let mut stopped = false;
        let joined = loop {
            tokio::select! {
                joined = &mut cell => break joined,
                request = incoming.recv(), if open => {
                    let Some(request) = request else {
                        open = false;
                        continue;
                    };
                    made += 1;
                    let nested = ToolCall {
                        call_id: ToolCallId(format!("{}/{made}", parent.call.call_id)),
                        name: request.tool,
                        arguments: request.arguments,
                        arguments_error: None,
                    };
                    let text = self.settle_nested(ledger, parent, nested, cancel).await?;
                    // The program may be gone (stopped); its call is recorded either way.
                    let _ = request.reply.send(text);
                }
                () = cancel.cancelled(), if !stopped => {
                    stopped = true;
                    stop.store(true, Ordering::Relaxed);
                }
                () = until(self.deadline), if !stopped => {
                    stopped = true;
                    self.out_of_time = true;
                    stop.store(true, Ordering::Relaxed);
                }
            }
        };
        let report = match joined {
            Ok(report) => report,
            Err(error) => {
                return Ok(ToolOutput::error(format!(
                    "error: the program's engine failed unexpectedly: {error}"
                )));
            }
        };
        let text = report.text(&limits);
        let outcome = match report.end {
            CellEnd::Completed => Outcome::Ok,
            CellEnd::Stopped if cancel.is_cancelled() => {
                return Ok(ToolOutput {
                    outcome: Outcome::Cancelled,
                    content: format!("{CANCELLED_WHILE_RUNNING}\n{text}"),
                    raw: None,
                });
            }
            CellEnd::Stopped => Outcome::Cancelled,
            CellEnd::Threw(_)
            | CellEnd::CpuLimit
            | CellEnd::WallLimit
            | CellEnd::MemoryLimit
            | CellEnd::NeverSettled => Outcome::Error,
        };
        Ok(ToolOutput { outcome, content: text, raw: None })
    }

    /// Records `nested` as a `tool_call` of `parent` and settles it like any call; keel's
    /// own tools are refused ([`REFUSAL_IN_CELL`]). Answers with the recorded result text.
    /// Boxed: settling may reach `run_code` again (refused, but the types recurse).
    fn settle_nested<'s>(
        &'s mut self,
        ledger: &'s mut Ledger,
        parent: &'s Call<'_>,
        nested: ToolCall,
        cancel: &'s Cancellation,
    ) -> Pin<Box<dyn Future<Output = Result<String>> + Send + 's>> {
        let (turn, run) = (parent.turn, parent.run);
        let parent_call_id = parent.call.call_id.clone();
        Box::pin(async move {
            ledger.stage(
                turn,
                run,
                EventKind::ToolCall {
                    parent_call_id,
                    call_id: nested.call_id.clone(),
                    tool: nested.name.clone(),
                    arguments: nested.arguments.clone(),
                },
            );
            let keel_own =
                self.registry.get(&nested.name).is_some_and(|tool| tool.spec().intrinsic);
            match (turn, run) {
                (Some(turn_id), Some(run_id)) if !keel_own => {
                    self.settle_inner(ledger, turn_id, run_id, &nested, cancel).await?;
                }
                _ => {
                    let call = Call { turn, run, call: &nested, hold: None };
                    call.gate(ledger, Decision::Refuse, REFUSAL_IN_CELL).await?;
                    call.result(ledger, None, Outcome::Refused, REFUSAL_IN_CELL.to_owned()).await?;
                }
            }
            let recorded = ledger.events().iter().rev().find_map(|event| match &event.kind {
                EventKind::ToolResult { call_id, content, .. } if *call_id == nested.call_id => {
                    Some(content.clone())
                }
                _ => None,
            });
            Ok(recorded
                .unwrap_or_else(|| "error: keel recorded no result for this call".to_owned()))
        })
    }
}
