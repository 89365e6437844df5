//! Tool settlement: resolve, validate, gate, prepare durably, invoke, record the result
//! (DESIGN.md §3 steps 3–4). Every call that reaches here gets exactly one `tool_result`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use keel_contracts::{
    AttemptId, Authorization, Budget, CallFacts, CommandLine, Decision, Envelope, EventKind,
    ExecutionMode, Outcome, PermissionAnswer, PermissionRules, REFUSAL_PERMISSION_DENIED,
    REFUSAL_SHADOW, RunId, SandboxMode, ToolCall, ToolContext, ToolOutput, TurnId, UsageTotals,
    authorize_tool_invocation, executes_in_shadow, requires_consent,
};

use crate::failpoint::{Failpoint, Failpoints};
use crate::intrinsic::{AFTER_PARKED, Admitted, Carry, Children, Intrinsic, IntrinsicCall, Parked};
use crate::kernel::REPEATED_FAILURE_LIMIT;
use crate::ledger::Ledger;
use crate::permission::PermissionRequest;

mod cell;
use crate::registry::Registry;
use crate::{Cancellation, KernelDeps, Result};

/// Text of a result for a call cancelled before it ran.
pub(crate) const CANCELLED_BEFORE_RUN: &str =
    "cancelled: the run was cancelled before this call was executed";
/// Text of a result for a call cancelled while its tool ran.
pub(crate) const CANCELLED_WHILE_RUNNING: &str =
    "cancelled: the run was cancelled while this tool was running; its effect may be partial";

/// Text of a result for a call not run because the run stopped early (budget).
pub(crate) const STOPPED_EARLY: &str =
    "cancelled: stopped early (budget exhausted); this call was not executed";
/// Text of a result for a call whose tool was stopped by the time budget.
pub(crate) const STOPPED_EARLY_WHILE_RUNNING: &str = "cancelled: stopped early: the time budget ran out while this tool was running; its effect may be partial";

/// How settling a call ended, for the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// A result was recorded; go on.
    Done,
    /// The run's time budget ran out while the tool ran; the run must stop early.
    OutOfTime,
}

/// What binds every call of a run: the session's envelope and mode, the run's boundary,
/// rules and deadline.
pub(crate) struct CallPolicy {
    pub(crate) workspace: PathBuf,
    pub(crate) envelope: Envelope,
    pub(crate) mode: ExecutionMode,
    pub(crate) sandbox: SandboxMode,
    pub(crate) rules: PermissionRules,
    pub(crate) deadline: Option<tokio::time::Instant>,
    pub(crate) run: crate::RunConfig,
    pub(crate) failpoints: std::sync::Arc<dyn Failpoints>,
    /// The session's widened boundary at the start of the run, and its revision.
    pub(crate) boundary: keel_contracts::Boundary,
    pub(crate) revision: u32,
    /// The bounds of a `run_code` cell.
    pub(crate) code_limits: crate::CodeLimits,
}

/// Per-run state of tool settlement.
pub(crate) struct CallState<'a> {
    deps: &'a KernelDeps,
    registry: std::sync::Arc<Registry>,
    children: &'a dyn Children,
    run: crate::RunConfig,
    failpoints: std::sync::Arc<dyn Failpoints>,
    /// What the run has left, set by the loop before each step's calls.
    pub(crate) remaining: Budget,
    /// What sub-agents spent during this step's calls.
    child_spent: UsageTotals,
    workspace: PathBuf,
    envelope: Envelope,
    mode: ExecutionMode,
    sandbox: SandboxMode,
    rules: PermissionRules,
    /// What the rules deny reading, for the tools (masks for commands, skipped by searches).
    denied_paths: keel_contracts::DeniedPaths,
    /// What the rules deny writing, for commands (read-only).
    write_denied_paths: keel_contracts::DeniedPaths,
    /// When the run's time budget runs out.
    deadline: Option<tokio::time::Instant>,
    /// Set when the deadline passed while the last tool ran.
    out_of_time: bool,
    /// The session's widened boundary so far.
    boundary: keel_contracts::Boundary,
    /// Its revision number.
    revision: u32,
    /// Whether a boundary negotiation already happened in this step.
    negotiated_this_step: bool,
    /// Set when a denial must finalize the turn.
    denied: Option<String>,
    /// Failed attempts per (tool, arguments digest), for blocking identical repeats.
    failures: BTreeMap<(String, String), u32>,
    /// The final answer a valid `submit` handed in, as JSON text.
    submitted: Option<String>,
    /// Set when an intrinsic call parked the run (`wait`).
    parked: Option<Parked>,
    /// The bounds of a `run_code` cell.
    code_limits: crate::CodeLimits,
}

impl CallState<'_> {
    /// The tools calls are settled against.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Settles later calls against `registry` (a changing source's new tools).
    pub(crate) fn set_registry(&mut self, registry: std::sync::Arc<Registry>) {
        self.registry = registry;
    }

    /// Starts the repeated-failure guard from what the turn's earlier runs recorded.
    pub(crate) fn seed_failures(&mut self, failures: BTreeMap<(String, String), u32>) {
        self.failures = failures;
    }
}

/// How many plain reads of one response run at once.
pub(crate) const MAX_PARALLEL_READS: usize = 8;

/// An admitted call: gated, its prepare durable, ready to be carried out.
struct Ready {
    attempt_id: AttemptId,
    tool: std::sync::Arc<dyn keel_contracts::Tool>,
    /// The hook an intrinsic is carried out by; `None`: by [`keel_contracts::Tool::invoke`].
    intrinsic: Option<std::sync::Arc<dyn Intrinsic>>,
    context: ToolContext,
    failure_key: (String, String),
    arguments_sha256: String,
}

struct Call<'c> {
    turn: Option<TurnId>,
    run: Option<RunId>,
    call: &'c ToolCall,
    /// Where the result goes instead of the ledger while side-by-side reads run, so it is
    /// recorded in call order after the results of the calls before it.
    hold: Option<&'c Held>,
}

/// What admitting a call gave: what carrying it out needs (`None`: it was answered), and
/// where an answer goes instead of the ledger (side-by-side reads).
struct Admission<'h> {
    ready: Option<Ready>,
    hold: Option<&'h Held>,
}

/// A result held back: the attempt (if any) and the output.
type Held = std::sync::Mutex<Option<(Option<AttemptId>, ToolOutput)>>;

impl Call<'_> {
    async fn result(
        &self,
        ledger: &mut Ledger,
        attempt_id: Option<AttemptId>,
        outcome: Outcome,
        content: String,
    ) -> Result<()> {
        self.output(ledger, attempt_id, ToolOutput { outcome, content, raw: None }).await
    }

    /// Records a tool's output, its exact bytes included when it has them.
    async fn output(
        &self,
        ledger: &mut Ledger,
        attempt_id: Option<AttemptId>,
        output: ToolOutput,
    ) -> Result<()> {
        if let Some(hold) = self.hold {
            *hold.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((attempt_id, output));
            return Ok(());
        }
        let ToolOutput { outcome, content, raw } = output;
        let bytes = content.len() as u64;
        // Staged: durable with the next commit (the next model request, prepare, prompt or
        // terminal event). A crash before it leaves the attempt `indeterminate`, exactly
        // like a crash between the effect and an immediate append.
        ledger.stage(
            self.turn,
            self.run,
            EventKind::ToolResult {
                call_id: self.call.call_id.clone(),
                attempt_id,
                tool: self.call.name.clone(),
                outcome,
                content,
                bytes,
                raw,
            },
        );
        Ok(())
    }

    /// Stages the gate's decision: it decides nothing outside the process, so it is made
    /// durable with the prepare (or the result) that follows it.
    async fn gate(&self, ledger: &mut Ledger, decision: Decision, reason: &str) -> Result<()> {
        ledger.stage(
            self.turn,
            self.run,
            EventKind::GateDecision {
                call_id: self.call.call_id.clone(),
                tool: self.call.name.clone(),
                decision,
                reason: reason.to_owned(),
            },
        );
        Ok(())
    }
}

impl<'a> CallState<'a> {
    pub(crate) fn new(
        deps: &'a KernelDeps,
        registry: std::sync::Arc<Registry>,
        children: &'a dyn Children,
        policy: CallPolicy,
    ) -> CallState<'a> {
        let CallPolicy {
            workspace,
            envelope,
            mode,
            sandbox,
            rules,
            deadline,
            run,
            failpoints,
            boundary,
            revision,
            code_limits,
        } = policy;
        let denied_paths = rules.denied_paths(&workspace.display().to_string());
        let write_denied_paths = rules.write_denied_paths(&workspace.display().to_string());
        CallState {
            deps,
            registry,
            children,
            run,
            denied_paths,
            write_denied_paths,
            remaining: Budget::default(),
            failpoints,
            child_spent: UsageTotals::default(),
            workspace,
            envelope,
            mode,
            sandbox,
            rules,
            deadline,
            out_of_time: false,
            boundary,
            revision,
            negotiated_this_step: false,
            denied: None,
            failures: BTreeMap::new(),
            submitted: None,
            parked: None,
            code_limits,
        }
    }

    /// Answers a call that will not run because the run is being cancelled.
    pub(crate) async fn answer_cancelled(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        call: &ToolCall,
    ) -> Result<()> {
        let call = Call { turn: Some(turn_id), run: Some(run_id), call, hold: None };
        call.result(ledger, None, Outcome::Cancelled, CANCELLED_BEFORE_RUN.into()).await
    }

    /// Asks for consent (rules first, then the permission hook) and records the request
    /// and its answer. `None` when the run was cancelled meanwhile (a `cancelled` result is
    /// recorded then).
    async fn ask(
        &self,
        ledger: &mut Ledger,
        call: &Call<'_>,
        access: keel_contracts::Access,
        ruled: Option<(PermissionAnswer, String)>,
        arguments_sha256: &str,
        cancel: &Cancellation,
    ) -> Result<Option<PermissionAnswer>> {
        let tool_call = call.call;
        ledger.stage(
            call.turn,
            call.run,
            EventKind::PermissionRequested {
                call_id: tool_call.call_id.clone(),
                tool: tool_call.name.clone(),
                access,
                arguments: tool_call.arguments.clone(),
            },
        );
        // A request someone may take time to answer is a ledger fact before it is asked
        // (DESIGN.md §6: it survives a crash and is asked again). A rule's or a fixed
        // policy's answer comes at once: request and answer are committed with the prepare.
        let request = PermissionRequest {
            session_id: ledger.session_id,
            call_id: &tool_call.call_id,
            tool: &tool_call.name,
            access,
            arguments: &tool_call.arguments,
        };
        if ruled.is_none() && !self.deps.permissions.answers_at_once(&request) {
            ledger.commit().await?;
        }
        let (answer, by) = tokio::select! {
            answer = async {
                match ruled {
                    Some(ruled) => ruled,
                    None => self.deps.permissions.decide(&request).await,
                }
            } => answer,
            () = cancel.cancelled() => {
                call.result(ledger, None, Outcome::Cancelled, CANCELLED_BEFORE_RUN.into()).await?;
                return Ok(None);
            }
        };
        // An execution grant always carries an expiry and the exact arguments it covers.
        let (grant_sha256, expires_at) = match answer {
            PermissionAnswer::AllowExact => (
                Some(arguments_sha256.to_owned()),
                chrono::TimeDelta::from_std(self.run.grant_ttl)
                    .ok()
                    .and_then(|ttl| self.deps.clock.now().checked_add_signed(ttl)),
            ),
            PermissionAnswer::AllowOnce
            | PermissionAnswer::AllowSession
            | PermissionAnswer::Deny => (None, None),
        };
        ledger.stage(
            call.turn,
            call.run,
            EventKind::PermissionSettled {
                call_id: tool_call.call_id.clone(),
                tool: tool_call.name.clone(),
                access,
                answer,
                by,
                arguments_sha256: grant_sha256,
                expires_at,
            },
        );
        Ok(Some(answer))
    }

    /// Records a tool's question (`elicitation_requested`), asks it through the permission
    /// hook (unless keel refuses the form), checks the answer against the form, records it
    /// (`elicitation_answered`, durable before the server gets it) and hands it back. A
    /// cancelled run, a server that stops waiting or the run's deadline end it as `cancel`.
    async fn answer_question(
        &self,
        ledger: &mut Ledger,
        call: &Call<'_>,
        number: u32,
        asked: crate::elicit::Asked,
        cancel: &Cancellation,
    ) -> Result<()> {
        use keel_contracts::{ElicitationAction, ElicitationAnswer, FormSchema};
        let crate::elicit::Asked { request, mut reply, .. } = asked;
        let tool_call = call.call;
        let question = crate::elicit::question_id(&tool_call.call_id, number);
        ledger.stage(
            call.turn,
            call.run,
            EventKind::ElicitationRequested {
                call_id: tool_call.call_id.clone(),
                tool: tool_call.name.clone(),
                question: question.clone(),
                server: request.server.clone(),
                message: request.message.clone(),
                schema: request.schema.clone(),
            },
        );
        let answer = match FormSchema::parse(&request.schema) {
            Err(why) => {
                ElicitationAnswer::decline("keel", format!("keel refuses this form: {why}"))
            }
            Ok(form) => {
                let asking = crate::permission::ElicitationQuestion {
                    session_id: ledger.session_id,
                    call_id: &tool_call.call_id,
                    tool: &tool_call.name,
                    question: &question,
                    request: &request,
                    form: &form,
                };
                // A question someone may take time to answer is a ledger fact first.
                if !self.deps.permissions.elicits_at_once() {
                    ledger.commit().await?;
                }
                let answer = tokio::select! {
                    answer = self.deps.permissions.elicit(&asking) => answer,
                    () = cancel.cancelled() => {
                        ElicitationAnswer::cancel("keel", "the run was cancelled")
                    }
                    () = reply.closed() => ElicitationAnswer::cancel(
                        "keel",
                        "the server stopped waiting for the answer (its request timed out or \
                         was cancelled)",
                    ),
                    () = until(self.deadline) => {
                        ElicitationAnswer::cancel("keel", "the run's time budget ran out")
                    }
                };
                match answer.action {
                    ElicitationAction::Accept => {
                        let content = answer
                            .content
                            .clone()
                            .unwrap_or_else(|| serde_json::Value::Object(Default::default()));
                        match form.validate(&content) {
                            Ok(()) => ElicitationAnswer { content: Some(content), ..answer },
                            Err(why) => ElicitationAnswer::decline(
                                "keel",
                                format!(
                                    "the answer ({}) does not match the form: {why}; nothing of \
                                     it was sent",
                                    answer.by
                                ),
                            ),
                        }
                    }
                    ElicitationAction::Decline | ElicitationAction::Cancel => {
                        ElicitationAnswer { content: None, ..answer }
                    }
                }
            }
        };
        ledger.stage(
            call.turn,
            call.run,
            EventKind::ElicitationAnswered {
                call_id: tool_call.call_id.clone(),
                tool: tool_call.name.clone(),
                question,
                action: answer.action,
                content: answer.content.clone(),
                by: answer.by.clone(),
                reason: answer.reason.clone(),
            },
        );
        // The answer leaves the process: it is durable first.
        ledger.commit().await?;
        let _ = reply.send(answer);
        Ok(())
    }

    /// Starts a step: one boundary negotiation per step.
    pub(crate) fn begin_step(&mut self) {
        self.negotiated_this_step = false;
    }

    /// Why the turn must end now (a denied boundary request), if it must.
    pub(crate) fn take_denial(&mut self) -> Option<String> {
        self.denied.take()
    }

    /// The final answer handed in through `submit` in this step, if any (the run ends).
    pub(crate) fn take_submitted(&mut self) -> Option<String> {
        self.submitted.take()
    }

    /// Whether an intrinsic call (`wait`) parked the run in this step.
    pub(crate) fn is_parked(&self) -> bool {
        self.parked.is_some()
    }

    /// What the run parked on, if a call parked it.
    pub(crate) fn take_parked(&mut self) -> Option<Parked> {
        self.parked.take()
    }

    /// Answers a call after a parking call in the same step: not run.
    pub(crate) async fn answer_after_wait(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        call: &ToolCall,
    ) -> Result<()> {
        let call = Call { turn: Some(turn_id), run: Some(run_id), call, hold: None };
        call.result(ledger, None, Outcome::Cancelled, AFTER_PARKED.into()).await
    }

    /// What sub-agents spent since the last call of this.
    pub(crate) fn take_child_spent(&mut self) -> UsageTotals {
        std::mem::take(&mut self.child_spent)
    }

    /// Answers a call that will not run because the run stopped early.
    pub(crate) async fn answer_stopped_early(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        call: &ToolCall,
    ) -> Result<()> {
        let call = Call { turn: Some(turn_id), run: Some(run_id), call, hold: None };
        call.result(ledger, None, Outcome::Cancelled, STOPPED_EARLY.into()).await
    }

    /// Settles one call: exactly one `tool_result` is appended, unless the ledger fails.
    pub(crate) async fn settle(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        tool_call: &ToolCall,
        cancel: &Cancellation,
    ) -> Result<Settled> {
        self.settle_inner(ledger, turn_id, run_id, tool_call, cancel).await?;
        Ok(if std::mem::take(&mut self.out_of_time) { Settled::OutOfTime } else { Settled::Done })
    }

    async fn settle_inner(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        tool_call: &ToolCall,
        cancel: &Cancellation,
    ) -> Result<()> {
        let mut admission = Admission { ready: None, hold: None };
        self.admit(ledger, turn_id, run_id, tool_call, cancel, &mut admission).await?;
        let Some(ready) = admission.ready else { return Ok(()) };
        self.carry_out(ledger, turn_id, run_id, tool_call, ready, cancel).await
    }

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

    /// Resolves, validates and gates a call, then makes its `tool_attempt_prepared`
    /// durable; `admission.ready` is then what carrying it out needs. Without it, the call's
    /// `tool_result` is recorded (an error, a refusal, a cancel).
    async fn admit(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        tool_call: &ToolCall,
        cancel: &Cancellation,
        admission: &mut Admission<'_>,
    ) -> Result<()> {
        let hold = admission.hold;
        let call = Call { turn: Some(turn_id), run: Some(run_id), call: tool_call, hold };
        let name = tool_call.name.as_str();

        // Identical failing calls are blocked whatever made them fail: an unknown tool and
        // invalid arguments count like a tool's own error, in every run of the turn.
        let (failure_key, arguments_sha256) = failure_key(tool_call);
        let failed_before = self.failures.get(&failure_key).copied().unwrap_or(0);
        if failed_before >= REPEATED_FAILURE_LIMIT {
            let text = format!(
                "error: blocked: this exact call already failed {failed_before} times in this \
                 turn; change the arguments or the approach"
            );
            return call.result(ledger, None, Outcome::Error, text).await;
        }
        let Some(tool) = self.registry.get(name).cloned() else {
            let available = self.registry.names().join(", ");
            let removed = ledger.events().iter().rev().any(|event| {
                matches!(&event.kind, EventKind::ToolsChanged { removed, .. }
                    if removed.iter().any(|gone| gone == name))
            });
            let text = if removed {
                format!(
                    "error: tool '{name}' was removed by its server (tools/list_changed); it \
                     is no longer offered. Available tools: {available}"
                )
            } else {
                format!("error: unknown tool '{name}'. Available tools: {available}")
            };
            *self.failures.entry(failure_key).or_insert(0) += 1;
            return call.result(ledger, None, Outcome::Error, text).await;
        };
        if let Some(problem) = &tool_call.arguments_error {
            let text = format!(
                "error: the arguments of this call are not valid JSON ({problem}); it was not \
                 executed. Send the call again with one complete JSON object."
            );
            *self.failures.entry(failure_key).or_insert(0) += 1;
            return call.result(ledger, None, Outcome::Error, text).await;
        }
        if let Err(problems) = self.registry.validate(name, &tool_call.arguments) {
            let text = format!("error: invalid arguments for {name}: {problems}");
            *self.failures.entry(failure_key).or_insert(0) += 1;
            return call.result(ledger, None, Outcome::Error, text).await;
        }

        let spec = tool.spec();
        let allow_reason = match authorize_tool_invocation(spec, &self.envelope) {
            Authorization::Allow { reason } => reason,
            Authorization::Refuse { reason } => {
                call.gate(ledger, Decision::Refuse, reason).await?;
                return call.result(ledger, None, Outcome::Refused, reason.to_owned()).await;
            }
        };
        if self.mode == ExecutionMode::Shadow && !executes_in_shadow(spec) {
            call.gate(ledger, Decision::Shadow, REFUSAL_SHADOW).await?;
            ledger
                .append(
                    call.turn,
                    call.run,
                    EventKind::ShadowIntent {
                        call_id: tool_call.call_id.clone(),
                        tool: name.to_owned(),
                        arguments: tool_call.arguments.clone(),
                    },
                )
                .await?;
            return call.result(ledger, None, Outcome::ShadowDenied, REFUSAL_SHADOW.into()).await;
        }
        if self.mode == ExecutionMode::Plan && !keel_contracts::executes_in_plan(spec) {
            call.gate(ledger, Decision::Refuse, keel_contracts::REFUSAL_PLAN).await?;
            return call
                .result(ledger, None, Outcome::Refused, keel_contracts::REFUSAL_PLAN.into())
                .await;
        }
        // Rules are decided on the path as written and on the path it really reaches, so a
        // link or /proc/self/cwd cannot dodge a deny rule nor earn an allow rule.
        let workspace = self.workspace.display().to_string();
        // Command rules are decided per simple command of the parsed line (the shell parser
        // lives here because keel-contracts parses nothing).
        let resolved = resolved_path(&self.workspace, &tool_call.arguments);
        let line = (name == "bash")
            .then(|| tool_call.arguments.get("command").and_then(serde_json::Value::as_str))
            .flatten()
            .map(crate::command_line::parse);
        let facts = CallFacts { resolved_path: resolved.as_deref(), command: line.as_ref() };
        let ruled = self
            .rules
            .decide_with(name, &tool_call.arguments, &workspace, facts)
            .map(|(answer, rule)| (answer, format!("rule:{}", rule.text)));
        if let Some((PermissionAnswer::Deny, by)) = &ruled
            && !requires_consent(spec)
        {
            // Plain reads are not asked, but a deny rule still refuses them (B09).
            call.gate(ledger, Decision::Refuse, by).await?;
            return call
                .result(ledger, None, Outcome::Refused, REFUSAL_PERMISSION_DENIED.into())
                .await;
        }
        if requires_consent(spec) {
            let denied_by_rule = matches!(ruled, Some((PermissionAnswer::Deny, _)));
            let now = self.deps.clock.now();
            let exact =
                exact_grant(ledger, name, &arguments_sha256, now).filter(|_| !denied_by_rule);
            if let Some((seq, until)) = exact {
                let reason = format!(
                    "grant: this exact call is allowed until {until} (permission_settled #{seq})"
                );
                call.gate(ledger, Decision::Allow, &reason).await?;
            } else if let Some(seq) = session_grant(ledger, name).filter(|_| !denied_by_rule) {
                let reason = format!("grant: allowed for this session (permission_settled #{seq})");
                call.gate(ledger, Decision::Allow, &reason).await?;
            } else {
                let reason = match &line {
                    Some(CommandLine::Unresolved { reason, .. }) => format!(
                        "consent required: {} access; rules cannot allow this command line \
                         ({reason})",
                        spec.access.as_str()
                    ),
                    _ => format!("consent required: {} access", spec.access.as_str()),
                };
                call.gate(ledger, Decision::Ask, &reason).await?;
                match self.ask(ledger, &call, spec.access, ruled, &arguments_sha256, cancel).await?
                {
                    None => return Ok(()),
                    Some(PermissionAnswer::Deny) => {
                        return call
                            .result(
                                ledger,
                                None,
                                Outcome::Refused,
                                REFUSAL_PERMISSION_DENIED.into(),
                            )
                            .await;
                    }
                    Some(
                        PermissionAnswer::AllowOnce
                        | PermissionAnswer::AllowSession
                        | PermissionAnswer::AllowExact,
                    ) => {}
                }
            }
        } else {
            call.gate(ledger, Decision::Allow, allow_reason).await?;
        }

        let intrinsic = self.registry.intrinsic(name).cloned();
        if let Some(hook) = &intrinsic {
            let admitted = hook.admit(&IntrinsicCall {
                settlement: self,
                ledger,
                turn_id,
                run_id,
                tool_call,
                arguments_sha256: &arguments_sha256,
                cancel,
            });
            match admitted {
                Admitted::Attempt => {}
                Admitted::Park(parked) => {
                    self.parked = Some(parked);
                    return Ok(());
                }
                Admitted::Invalid(text) => {
                    *self.failures.entry(failure_key).or_insert(0) += 1;
                    return call.result(ledger, None, Outcome::Error, text).await;
                }
            }
        }
        let attempt_id = self.deps.ids.attempt_id();
        self.failpoints.hit(Failpoint::BeforePrepare).await;
        // The one event that must be durable before the effect: committed now, together
        // with everything staged since the model request (response, gate, consent).
        ledger
            .append(
                call.turn,
                call.run,
                EventKind::ToolAttemptPrepared {
                    call_id: tool_call.call_id.clone(),
                    attempt_id,
                    tool: name.to_owned(),
                    arguments_sha256: arguments_sha256.clone(),
                },
            )
            .await?;
        self.failpoints.hit(Failpoint::AfterPrepare).await;
        let context = ToolContext {
            workspace: self.workspace.clone(),
            session_id: ledger.session_id,
            call_id: tool_call.call_id.clone(),
            sandbox: self.sandbox,
            boundary: self.boundary.clone(),
            denied_paths: self.denied_paths.clone(),
            write_denied_paths: self.write_denied_paths.clone(),
            elicitor: None,
        };
        admission.ready =
            Some(Ready { attempt_id, tool, intrinsic, context, failure_key, arguments_sha256 });
        Ok(())
    }

    /// Carries out an admitted call (its prepare is durable) and records its result.
    async fn carry_out(
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

/// The repeated-failure guard's key for a call (tool name, SHA-256 of its arguments' JSON),
/// and that digest.
fn failure_key(call: &ToolCall) -> ((String, String), String) {
    let digest = keel_contracts::arguments_sha256(&call.arguments);
    ((call.name.clone(), digest.clone()), digest)
}

/// The repeated-failure counts a turn already has: every `error` result of its earlier
/// runs (and of this one so far), keyed like [`failure_key`], so a resume does not reset
/// the guard.
pub(crate) fn failures_in_turn(
    events: &[keel_contracts::RuntimeEvent],
    turn_id: TurnId,
) -> BTreeMap<(String, String), u32> {
    let mut calls = BTreeMap::new();
    let mut failures = BTreeMap::new();
    for event in events.iter().filter(|event| event.turn_id == Some(turn_id)) {
        match &event.kind {
            EventKind::ModelResponse { tool_calls, purpose, .. } if purpose.is_conversation() => {
                for call in tool_calls {
                    calls.insert(call.call_id.clone(), failure_key(call).0);
                }
            }
            EventKind::ToolResult { call_id, outcome: Outcome::Error, .. } => {
                if let Some(key) = calls.get(call_id) {
                    *failures.entry(key.clone()).or_insert(0) += 1;
                }
            }
            _ => {}
        }
    }
    failures
}

/// The workspace-relative path a call's `path` argument really reaches (symlinks and
/// `..` resolved through the longest existing prefix), or the absolute path when it leads
/// outside; `None` without a `path` argument.
fn resolved_path(workspace: &std::path::Path, arguments: &serde_json::Value) -> Option<String> {
    let raw = arguments.get("path")?.as_str()?;
    let joined = workspace.join(raw);
    let mut existing = joined.as_path();
    let mut rest = Vec::new();
    let canonical = loop {
        match std::fs::canonicalize(existing) {
            Ok(canonical) => break canonical,
            Err(_) => {
                rest.push(existing.file_name()?.to_owned());
                existing = existing.parent()?;
            }
        }
    };
    let full = rest.iter().rev().fold(canonical, |path, part| path.join(part));
    let root = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_owned());
    Some(match full.strip_prefix(&root) {
        Ok(relative) => relative.display().to_string(),
        Err(_) => full.display().to_string(),
    })
}

/// Resolves at `deadline`, or never when there is none.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The seq and expiry of a valid execution grant for exactly this call: same tool, same
/// arguments digest, not expired. A grant without an expiry or digest is never used (fail
/// closed: the user is asked again).
fn exact_grant(
    ledger: &Ledger,
    tool: &str,
    arguments_sha256: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<(u64, chrono::DateTime<chrono::Utc>)> {
    // Permission answers are facts: held in memory whatever was dropped.
    ledger.events().iter().rev().find_map(|event| match &event.kind {
        EventKind::PermissionSettled {
            tool: granted,
            answer: PermissionAnswer::AllowExact,
            arguments_sha256: Some(digest),
            expires_at: Some(until),
            ..
        } if granted == tool && digest == arguments_sha256 && *until > now => {
            Some((event.seq.0, *until))
        }
        _ => None,
    })
}

/// The seq of an "allow for this session" answer for `tool` in this session, if any.
fn session_grant(ledger: &Ledger, tool: &str) -> Option<u64> {
    ledger.events().iter().find_map(|event| match &event.kind {
        EventKind::PermissionSettled {
            tool: granted,
            answer: PermissionAnswer::AllowSession,
            ..
        } if granted == tool => Some(event.seq.0),
        _ => None,
    })
}

/// A spawned tool task that is aborted if its owner is dropped (cancel or crash of the
/// driving future), so no tool outlives its run.
struct AbortOnDrop(tokio::task::JoinHandle<ToolOutput>);

impl AbortOnDrop {
    /// Waits for the task without giving it up (for a `select!` in a loop).
    async fn wait(&mut self) -> std::result::Result<ToolOutput, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[async_trait::async_trait]
impl crate::intrinsic::Settlement for CallState<'_> {
    fn run_config(&self) -> &crate::RunConfig {
        &self.run
    }

    fn ids(&self) -> &dyn keel_contracts::IdGen {
        self.deps.ids.as_ref()
    }

    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.deps.clock.now()
    }

    fn workspace(&self) -> &std::path::Path {
        &self.workspace
    }

    fn rules(&self) -> &PermissionRules {
        &self.rules
    }

    fn boundary(&self) -> (&keel_contracts::Boundary, u32) {
        (&self.boundary, self.revision)
    }

    fn begin_negotiation(&mut self) -> bool {
        !std::mem::replace(&mut self.negotiated_this_step, true)
    }

    async fn ask(
        &mut self,
        ledger: &mut Ledger,
        (turn_id, run_id, tool_call): (TurnId, RunId, &ToolCall),
        access: keel_contracts::Access,
        ruled: Option<(PermissionAnswer, String)>,
        arguments_sha256: &str,
        cancel: &Cancellation,
    ) -> Result<Option<PermissionAnswer>> {
        let call = Call { turn: Some(turn_id), run: Some(run_id), call: tool_call, hold: None };
        CallState::ask(self, ledger, &call, access, ruled, arguments_sha256, cancel).await
    }

    async fn widen_boundary(
        &mut self,
        ledger: &mut Ledger,
        (turn_id, run_id): (TurnId, RunId),
        boundary: keel_contracts::Boundary,
        justification: String,
    ) -> Result<u32> {
        self.revision += 1;
        ledger
            .append(
                Some(turn_id),
                Some(run_id),
                EventKind::BoundaryRevised {
                    revision: self.revision,
                    boundary: boundary.clone(),
                    justification,
                },
            )
            .await?;
        self.boundary = boundary;
        Ok(self.revision)
    }

    fn deny(&mut self, reason: String) {
        self.denied = Some(reason);
    }

    fn submitted(&self) -> bool {
        self.submitted.is_some()
    }

    fn submit(&mut self, answer: String) {
        self.submitted = Some(answer);
    }

    fn children(&self) -> &dyn Children {
        self.children
    }

    fn remaining(&self) -> Budget {
        self.remaining
    }

    fn absorb_child_spent(&mut self, spent: &UsageTotals) {
        self.child_spent.absorb(spent);
    }

    async fn run_cell(
        &mut self,
        ledger: &mut Ledger,
        (turn_id, run_id, tool_call): (TurnId, RunId, &ToolCall),
        cancel: &Cancellation,
    ) -> Result<ToolOutput> {
        let parent = Call { turn: Some(turn_id), run: Some(run_id), call: tool_call, hold: None };
        CallState::run_cell(self, ledger, &parent, cancel).await
    }
}
