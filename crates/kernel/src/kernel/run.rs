//! The loop of DESIGN.md §3 that drives one run: compose it (system prompt, tools,
//! catalog), then step by step project a request that fits the window, call the model,
//! settle the calls it proposes, until an answer, a halt or a budget ends it.

use std::sync::Arc;

use keel_contracts::{
    EventKind, FinishReason, ModelRequest, RequestPurpose, RunId, Spent, StreamDelta, ToolChoice,
    TurnId, UsageTotals, sha256_hex,
};

use super::budget::{self, Charged, StepBudget};
use super::call_ids::unique_call_ids;
use super::prompt::PLAN_MODE_PROMPT;
use super::terminal::Ending;
use super::tool_source::{Offered, refresh_tools};
use super::{FirstResult, Kernel, RunConfig, RunReport, TurnOutcome};
use crate::compaction::{self, Compacted};
use crate::context::{self, Window};
use crate::ledger::Ledger;
use crate::model_call::{CallSite, call_model};
use crate::settlement::{CallPolicy, CallState, Settled};
use crate::{Cancellation, Result, recovery};

impl Kernel {
    pub(super) async fn drive(
        &self,
        ledger: Ledger,
        turn_id: TurnId,
        resumes: Option<RunId>,
        config: &RunConfig,
        cancel: &Cancellation,
        steering: &crate::Steering,
    ) -> Result<RunReport> {
        self.drive_with(ledger, turn_id, resumes, None, config, cancel, steering).await
    }

    /// [`Kernel::drive`], with `first` (a woken `wait`'s result) staged right after
    /// `run_started`, so both are durable together.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn drive_with(
        &self,
        ledger: Ledger,
        turn_id: TurnId,
        resumes: Option<RunId>,
        first: Option<FirstResult>,
        config: &RunConfig,
        cancel: &Cancellation,
        steering: &crate::Steering,
    ) -> Result<RunReport> {
        let report =
            self.drive_steered(ledger, turn_id, resumes, first, config, cancel, steering).await;
        // Input that could not join learns so; later sends are refused (a new turn's).
        steering.close();
        report
    }

    #[allow(clippy::too_many_arguments)]
    async fn drive_steered(
        &self,
        mut ledger: Ledger,
        turn_id: TurnId,
        resumes: Option<RunId>,
        first: Option<FirstResult>,
        config: &RunConfig,
        cancel: &Cancellation,
        steering: &crate::Steering,
    ) -> Result<RunReport> {
        // An unknown window gets a default, so pruning and compaction bound every request
        // and a step costs the same at step 100 and 10 000 (issue #13).
        let config = &RunConfig { context: config.context.or_default_window(), ..config.clone() };
        let (workspace, envelope, mode) = match ledger.first().map(|event| &event.kind) {
            Some(EventKind::SessionCreated { workspace, envelope, mode, .. }) => {
                (workspace.clone(), envelope.clone(), *mode)
            }
            _ => unreachable!("load() checked that seq 1 is session_created"),
        };
        // A plan the user approved makes the session's later runs live (a fact: held in
        // memory whatever was dropped).
        let mode = if mode == keel_contracts::ExecutionMode::Plan
            && ledger
                .events()
                .iter()
                .any(|event| matches!(event.kind, EventKind::PlanApproved { .. }))
        {
            keel_contracts::ExecutionMode::Live
        } else {
            mode
        };
        // A stop requested before this run began is stale.
        let _ = self.deps.store.take_cancel_request(ledger.session_id).await;
        let _keeper = crate::lease::LeaseKeeper::spawn(
            self.deps.store.clone(),
            self.deps.clock.clone(),
            ledger.lease.clone(),
            cancel.clone(),
        );
        let _watcher = crate::cancel::StopWatcher::spawn(
            self.deps.store.clone(),
            ledger.session_id,
            cancel.clone(),
            config.cancel_poll,
        );

        let run_id = self.deps.ids.run_id();
        let (turn, run) = (Some(turn_id), Some(run_id));
        // Staged, like everything the loop records that decides nothing outside the
        // process: committed before the first model request, prepare, prompt or terminal
        // event (docs/decisions.md, "Group commit in the kernel").
        ledger.stage(
            turn,
            run,
            EventKind::RunStarted {
                mode,
                sandbox: config.sandbox,
                approval: config.approval,
                budget: config.budget,
                resumes,
            },
        );
        if let Some(first) = first {
            let bytes = first.content.len() as u64;
            ledger.stage(
                turn,
                run,
                EventKind::ToolResult {
                    call_id: first.call_id,
                    attempt_id: None,
                    tool: first.tool,
                    outcome: first.outcome,
                    content: first.content,
                    bytes,
                    raw: None,
                },
            );
        }
        let info = self.deps.model.info();
        let catalog = crate::skills::catalog(
            &config.skills,
            config.context.budget().unwrap_or(0),
            self.deps.counter.as_ref(),
        );
        let mut system = self.system_prompt(&workspace, config, catalog.as_ref());
        if mode == keel_contracts::ExecutionMode::Plan {
            system.push_str(PLAN_MODE_PROMPT);
        }
        // Fails only for a per-run tool that cannot be registered (a schema that does not
        // compile, a clashing name): nothing has run, and a host checks these first.
        let registry = self.registry.for_run(config)?;
        // A changing source's tools as they are now (they may have changed since the
        // kernel was built): part of the run's composition, not a change within it.
        let mut offered: Option<Offered> =
            self.tool_source.as_ref().map(|dynamic| (dynamic.generation, dynamic.names.clone()));
        let registry = match (&self.tool_source, offered.as_mut()) {
            (Some(dynamic), Some(state)) => refresh_tools(dynamic, state, &registry)
                .map(|(fresh, _, _)| fresh)
                .unwrap_or(registry),
            _ => registry,
        };
        let registry = Arc::new(registry);
        ledger.stage(
            turn,
            run,
            EventKind::RunComposition {
                provider: info.provider.clone(),
                model: info.model.clone(),
                context_window: info.context_window,
                system_prompt_sha256: sha256_hex(system.as_bytes()),
                system_prompt: system.clone(),
                tools: registry.names(),
                tools_sha256: registry.definitions_sha256(),
            },
        );
        if catalog.is_some() || !config.skills.diagnostics.is_empty() {
            let (shown, omitted, budget_tokens) = match &catalog {
                Some(catalog) => {
                    (catalog.shown.clone(), catalog.omitted.clone(), catalog.budget_tokens)
                }
                None => (Vec::new(), Vec::new(), 0),
            };
            ledger.stage(
                turn,
                run,
                EventKind::SkillCatalog {
                    shown,
                    omitted,
                    budget_tokens,
                    diagnostics: config.skills.diagnostics.clone(),
                },
            );
        }

        let mut usage = UsageTotals::default();
        let (boundary_revision, boundary_so_far) = ledger
            .events()
            .iter()
            .rev()
            .find_map(|event| match &event.kind {
                EventKind::BoundaryRevised { revision, boundary, .. } => {
                    Some((*revision, boundary.clone()))
                }
                _ => None,
            })
            .unwrap_or_default();
        let started = tokio::time::Instant::now();
        // A `max_time` whose deadline lies beyond the representable (a library caller's
        // `Duration::MAX`) is no deadline at all: no clock reaches it, so none is kept.
        let deadline = config.budget.max_time.and_then(|max_time| started.checked_add(max_time));
        let mut calls = CallState::new(
            &self.deps,
            registry.clone(),
            self,
            CallPolicy {
                workspace: workspace.into(),
                envelope,
                mode,
                sandbox: config.sandbox,
                rules: config.rules.clone(),
                deadline,
                run: config.clone(),
                failpoints: self.failpoints.clone(),
                boundary: boundary_so_far.clone(),
                revision: boundary_revision,
                code_limits: self.code_limits,
            },
        );
        calls.seed_failures(ledger.failures_in_turn(turn_id).await?);
        // Calls a dead run left waiting for consent are asked again, in order, before the
        // model sees anything (DESIGN.md §6: a pending permission request survives a crash).
        let (awaiting_turn, _, awaiting) = recovery::awaiting_calls(ledger.events());
        let mut denied_before_start = None;
        if awaiting_turn == Some(turn_id) {
            for call in &awaiting {
                if cancel.is_cancelled() || denied_before_start.is_some() {
                    calls.answer_cancelled(&mut ledger, turn_id, run_id, call).await?;
                } else {
                    calls.settle(&mut ledger, turn_id, run_id, call, cancel).await?;
                    denied_before_start = calls.take_denial();
                }
            }
        }
        // The system prompt and the tool definitions are fixed for the run: count them once,
        // not on every step.
        let mut definitions = registry.definitions();
        // Room for a carried note's move to the system prompt (its heading, and the user-role
        // line that may then stand first): reserved on every step, a few dozen tokens.
        let system_tokens = self.deps.counter.count(&system)
            + context::carried_note_overhead(self.deps.counter.as_ref());
        let mut definitions_tokens =
            self.deps.counter.count(&serde_json::to_string(&definitions).unwrap_or_default());
        let mut spent = Spent::default();
        // The fitted request kept between steps: each step projects, estimates and hashes
        // only what it added (issue #13).
        let mut projected = context::IncrementalContext::new();
        // The provider said the context is too long: the step compacts and is sent again,
        // once (`too_long_retried`), as the same step number.
        let mut force_compaction = false;
        let mut too_long_retried = false;
        let mut token_scale: f64 = 1.0;
        let mut step: u32 = 0;
        let mut last_step: Option<String> = None;
        // Steering input staged at a step boundary, acknowledged once durable.
        let mut joined: Vec<(
            keel_contracts::Seq,
            tokio::sync::oneshot::Sender<keel_contracts::Seq>,
        )> = Vec::new();
        let outcome = loop {
            if let Some(reason) = denied_before_start.take() {
                break TurnOutcome::Denied { reason };
            }
            if cancel.is_cancelled() {
                break TurnOutcome::Cancelled { reason: "cancelled by the user".into() };
            }
            spent.elapsed = started.elapsed();
            match budget::check_step(&mut ledger, (turn, run), &config.budget, &spent).await? {
                StepBudget::Go => {}
                StepBudget::Exhausted(reason) => {
                    break TurnOutcome::Suspended { reason, report: String::new() };
                }
                StepBudget::LastStep(reason) => last_step = Some(reason),
            }
            step += 1;
            let step_started = tokio::time::Instant::now();
            // The step boundary: input sent while the run was active joins here, after
            // every call of the last step was answered (docs/decisions.md, "Steering").
            // Durable with this step's model request; its senders learn the seq then.
            for (input, sender) in steering.take() {
                let seq = ledger.stage(turn, run, EventKind::InputJoined { input }).seq;
                joined.push((seq, sender));
            }
            // A changing source's new tools are offered from this step's request on.
            if let (Some(dynamic), Some(state)) = (&self.tool_source, offered.as_mut())
                && let Some((fresh, added, removed)) =
                    refresh_tools(dynamic, state, calls.registry())
            {
                // A `list_changed` that changed nothing (same names, same definitions) is
                // not recorded; a changed description or schema is (same names, new hash).
                let tools_sha256 = fresh.definitions_sha256();
                if !added.is_empty()
                    || !removed.is_empty()
                    || tools_sha256 != calls.registry().definitions_sha256()
                {
                    ledger.stage(
                        turn,
                        run,
                        EventKind::ToolsChanged { added, removed, tools_sha256 },
                    );
                    definitions = fresh.definitions();
                    definitions_tokens = self
                        .deps
                        .counter
                        .count(&serde_json::to_string(&definitions).unwrap_or_default());
                }
                calls.set_registry(Arc::new(fresh));
            }
            // The last permitted step runs with tools off, so the model writes its report;
            // the definitions stay in the request (a history with tool calls needs them on
            // Anthropic's API, and the prompt prefix stays cacheable).
            let tool_choice = if last_step.is_some() { ToolChoice::None } else { ToolChoice::Auto };
            // Lent to the request and taken back after the call: not copied every step.
            let tools = std::mem::take(&mut definitions);
            let fixed_tokens =
                system_tokens + if tools.is_empty() { 0 } else { definitions_tokens };
            let window = Window {
                policy: &config.context,
                counter: self.deps.counter.as_ref(),
                fixed_tokens,
                scale: token_scale,
            };
            // The ledger checked its active compaction while it held what that covers.
            projected.trust(ledger.checks());
            let mut fitted = projected.fit(ledger.events(), &window);
            // The drop-oldest fallback's request, built from scratch (it is not recorded,
            // so the next step tries compaction again).
            let mut dropped = None;
            let forced = std::mem::take(&mut force_compaction);
            if fitted.over_budget || forced {
                let mut room =
                    config.context.budget().unwrap_or(0).saturating_sub(fixed_tokens) / 2;
                if forced {
                    // The provider's window is smaller than keel's estimate: keep at most
                    // half of what was just refused.
                    room = room.min(fitted.tokens.saturating_sub(fixed_tokens) / 2);
                }
                let call = compaction::SummaryCall {
                    ids: (turn, run),
                    step,
                    price: config.price.as_ref(),
                };
                let (compacted, summary_spend) =
                    self.compact(&mut ledger, call, &window, room, cancel).await?;
                usage.absorb(&summary_spend);
                // Summaries are model calls like any other: they count against the budgets.
                spent.tokens += summary_spend.tokens();
                spent.cost_usd += summary_spend.cost_usd.unwrap_or(0.0);
                if matches!(compacted, Compacted::Done) {
                    projected.trust(ledger.checks());
                    fitted = projected.fit(ledger.events(), &window);
                }
                if fitted.over_budget {
                    let fallback = compaction::drop_oldest_checked(
                        ledger.events(),
                        &window,
                        &mut ledger.checks().clone(),
                    );
                    fitted = context::FitSummary::from(&fallback);
                    dropped = Some(fallback);
                }
                if fitted.over_budget {
                    break TurnOutcome::Failed {
                        reason: format!(
                            "the context window is too small: the smallest request keel can build \
                             is ~{} tokens, over the budget of {} tokens",
                            fitted.tokens,
                            config.context.budget().unwrap_or(0)
                        ),
                    };
                }
            }
            let from_cache = dropped.is_none();
            let (system, messages) = match dropped {
                Some(fallback) => context::place_carried_note(&system, fallback.messages),
                None => projected.take_request(&system),
            };
            let mut request = ModelRequest {
                model: info.model.clone(),
                system,
                messages,
                tools,
                tool_choice,
                responses_in_session: ledger.responses(),
                purpose: RequestPurpose::Conversation,
            };
            let request_sha256 = if from_cache {
                projected.digest(&request)
            } else {
                crate::digest::request_digest(&request)
            };
            // Committed before the request leaves the process, with what was staged since
            // the last commit (the previous step's results): a step's first durable commit.
            ledger
                .append(
                    turn,
                    run,
                    EventKind::ModelRequested {
                        step,
                        messages: request.messages.len() as u64,
                        request_sha256,
                        tokens: Some(fitted.tokens),
                        tokens_before_pruning: fitted.tokens_before_pruning,
                        pruned_results: fitted.pruned_results,
                        purpose: RequestPurpose::Conversation,
                    },
                )
                .await?;
            for (seq, sender) in joined.drain(..) {
                let _ = sender.send(seq);
            }
            let estimated_tokens = fitted.tokens;
            let observer = self.deps.observer.clone();
            let on_delta = move |delta: StreamDelta| observer.on_delta(&delta);
            let site = CallSite { ids: (turn, run), step, purpose: RequestPurpose::Conversation };
            let answer = call_model(
                self.deps.model.as_ref(),
                &mut ledger,
                &site,
                &request,
                &on_delta,
                cancel,
            )
            .await?;
            if from_cache {
                // The next step changes these messages where it must, instead of rebuilding.
                projected.restore(std::mem::take(&mut request.messages));
            }
            definitions = std::mem::take(&mut request.tools);
            let Some(response) = answer else {
                break TurnOutcome::Cancelled {
                    reason: "cancelled by the user while the model was answering".into(),
                };
            };
            let response = match response {
                Ok(response) => response,
                Err(error)
                    if error.kind == keel_contracts::ModelErrorKind::ContextTooLong
                        && !too_long_retried
                        && last_step.is_none() =>
                {
                    // Recorded: this step's `model_requested` stays without a response, a
                    // `compaction` follows, then the step's request again.
                    too_long_retried = true;
                    force_compaction = true;
                    step -= 1;
                    continue;
                }
                Err(error) => {
                    let status = error.status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
                    break TurnOutcome::Failed {
                        reason: format!("model error{status}: {}", error.message),
                    };
                }
            };
            too_long_retried = false;
            budget::rescale(&mut token_scale, response.usage.input_tokens, estimated_tokens);
            let Charged { estimated_usage, tokens, cost } = budget::charge(
                &response,
                estimated_tokens,
                config.price.as_ref(),
                self.deps.counter.as_ref(),
            );
            usage.add(&response.usage, estimated_usage.as_ref(), cost);
            spent.steps = step;
            spent.last_step_tokens = tokens;
            spent.tokens += spent.last_step_tokens;
            spent.last_step_cost_usd = cost.unwrap_or(0.0);
            spent.cost_usd += spent.last_step_cost_usd;
            let mut response = response;
            unique_call_ids(self.deps.store.as_ref(), &ledger, &mut response.tool_calls).await?;
            let tool_calls = response.tool_calls.clone();
            let finish_reason = response.finish_reason.clone();
            let text = response.text.clone();
            // Staged: durable with the step's prepare (its second commit) or the terminal
            // event. Lost in a crash before that, the model is simply asked again (the
            // scripted model's position and the session's responses come from the ledger).
            ledger.stage(
                turn,
                run,
                EventKind::ModelResponse {
                    text: response.text,
                    reasoning: response.reasoning,
                    tool_calls: response.tool_calls,
                    usage: response.usage,
                    raw_usage: response.raw_usage,
                    finish_reason: response.finish_reason,
                    cost_usd: cost,
                    estimated_usage,
                    purpose: RequestPurpose::Conversation,
                },
            );
            if let Some(reason) = last_step.take() {
                // Tools were off: calls proposed anyway are answered, never run.
                for call in &tool_calls {
                    calls.answer_stopped_early(&mut ledger, turn_id, run_id, call).await?;
                }
                break TurnOutcome::Suspended { reason, report: text };
            }
            if tool_calls.is_empty() {
                let answered = matches!(
                    finish_reason,
                    FinishReason::Stop | FinishReason::ToolCalls | FinishReason::Other(_)
                );
                if answered && !steering.close_if_empty() {
                    // Input arrived while the model answered: the run goes on with it.
                    spent.last_step_elapsed = step_started.elapsed();
                    continue;
                }
                break match finish_reason {
                    FinishReason::Stop | FinishReason::ToolCalls | FinishReason::Other(_) => {
                        match &config.output_schema {
                            None => TurnOutcome::Completed { text },
                            Some(schema) => crate::intrinsic::text_answer(schema, &text),
                        }
                    }
                    FinishReason::Length => TurnOutcome::Failed {
                        reason: "the model's answer was cut off by its output limit \
                                 (finish_reason length)"
                            .into(),
                    },
                    FinishReason::ContentFilter | FinishReason::Refusal => TurnOutcome::Failed {
                        reason: format!("the model refused or was filtered ({finish_reason})"),
                    },
                };
            }
            calls.remaining = config.budget.remaining(&spent);
            calls.begin_step();
            let mut cancelled = false;
            let mut out_of_time = false;
            let mut denied: Option<String> = None;
            // Calls in order; consecutive plain reads run side by side, any other call
            // alone, after the reads before it and before the calls after it.
            let mut next = 0;
            while let Some(call) = tool_calls.get(next) {
                if out_of_time {
                    calls.answer_stopped_early(&mut ledger, turn_id, run_id, call).await?;
                    next += 1;
                    continue;
                }
                if denied.is_some() {
                    calls.answer_cancelled(&mut ledger, turn_id, run_id, call).await?;
                    next += 1;
                    continue;
                }
                if calls.is_parked() {
                    calls.answer_after_wait(&mut ledger, turn_id, run_id, call).await?;
                    next += 1;
                    continue;
                }
                if cancelled || cancel.is_cancelled() {
                    cancelled = true;
                    calls.answer_cancelled(&mut ledger, turn_id, run_id, call).await?;
                    next += 1;
                    continue;
                }
                let reads = calls.leading_reads(&tool_calls[next..]);
                let settled = if reads > 1 {
                    let batch = &tool_calls[next..next + reads];
                    next += reads;
                    calls.settle_reads(&mut ledger, turn_id, run_id, batch, cancel).await?
                } else {
                    next += 1;
                    calls.settle(&mut ledger, turn_id, run_id, call, cancel).await?
                };
                out_of_time = settled == Settled::OutOfTime;
                denied = calls.take_denial();
            }
            // What children spent counts against this run.
            let child_spent = calls.take_child_spent();
            let submitted = calls.take_submitted();
            usage.absorb(&child_spent);
            spent.tokens += child_spent.tokens();
            spent.cost_usd += child_spent.cost_usd.unwrap_or(0.0);
            if let Some(reason) = denied {
                break TurnOutcome::Denied { reason };
            }
            if let Some(answer) = submitted {
                break TurnOutcome::Completed { text: answer };
            }

            if let Some(parked) = calls.take_parked() {
                ledger.stage(
                    turn,
                    run,
                    EventKind::WaitStarted {
                        call_id: parked.call_id,
                        wake_id: parked.wake_id,
                        event: parked.event,
                        deadline: parked.deadline,
                    },
                );
                break TurnOutcome::Suspended {
                    reason: crate::wait::WAITING_REASON.to_owned(),
                    report: String::new(),
                };
            }
            if out_of_time {
                let max = config.budget.max_time.unwrap_or_default().as_millis();
                break TurnOutcome::Suspended {
                    reason: format!(
                        "stopped early: time budget exhausted ({max} ms) while a tool ran"
                    ),
                    report: String::new(),
                };
            }
            if cancelled || cancel.is_cancelled() {
                break TurnOutcome::Cancelled { reason: "cancelled by the user".into() };
            }
            spent.last_step_elapsed = step_started.elapsed();
        };

        let ending = Ending { turn_id, run_id, outcome, usage, started, joined };
        self.finish(ledger, ending).await
    }
}
