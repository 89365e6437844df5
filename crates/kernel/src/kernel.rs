//! [`Kernel`]: creates sessions and drives turns through the loop of DESIGN.md §3.

use std::sync::Arc;

use keel_contracts::{
    BudgetVerdict, EventKind, FinishReason, ModelRequest, RequestPurpose, RunId, SessionId, Spent,
    StreamDelta, TOOL_OUTPUT_POLICY, Tool, ToolChoice, TurnId, UsageTotals, check_budget, cost_usd,
    effective_usage, sha256_hex, usage_tokens,
};

use crate::compaction::{self, Compacted};
pub use crate::config::{
    DEFAULT_GRANT_TTL, Instruction, KernelDeps, NoopObserver, Observer, RunConfig, RunReport,
    SessionConfig, Skill, SkillOrigin, Skills, TurnOutcome,
};
use crate::context::{self, Window};
use crate::failpoint::{Failpoint, Failpoints, NoFailpoints};
use crate::ledger::Ledger;
use crate::model_call::{CallSite, call_model};
use crate::registry::Registry;
use crate::settlement::{CallPolicy, CallState, Settled};
use crate::{Cancellation, KernelError, Result, recovery};

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

/// A changing tool source and the generation and names the kernel's registry holds.
#[derive(Debug)]
struct DynamicTools {
    source: Arc<dyn keel_contracts::ToolSource>,
    generation: u64,
    names: std::collections::BTreeSet<String>,
}

/// What a run's registry holds of a changing source: its generation and tool names.
type Offered = (u64, std::collections::BTreeSet<String>);

/// The registry with the source's current tools when its generation moved past
/// `offered`'s (which is updated), with the names added and removed.
fn refresh_tools(
    dynamic: &DynamicTools,
    offered: &mut Offered,
    registry: &Registry,
) -> Option<(Registry, Vec<String>, Vec<String>)> {
    let generation = dynamic.source.generation();
    if generation == offered.0 {
        return None;
    }
    let tools = dynamic.source.tools();
    let mut now: std::collections::BTreeSet<String> =
        tools.iter().map(|tool| tool.spec().name.clone()).collect();
    let (fresh, left_out) = registry.replaced(&offered.1, tools);
    for name in &left_out {
        now.remove(name);
    }
    let added = now.difference(&offered.1).cloned().collect();
    let removed = offered.1.difference(&now).cloned().collect();
    *offered = (generation, now);
    Some((fresh, added, removed))
}

/// How deep sub-agents may nest by default: a top-level agent may spawn children, which
/// may not spawn their own.
pub const DEFAULT_MAX_AGENT_DEPTH: u32 = 1;

const BASE_PROMPT: &str = "You are keel, a coding agent working in a repository. \
Use the tools to inspect files, change them and run commands. Work step by step, check your \
changes (for example by running the project's tests), and when the task is done answer \
without tool calls, saying briefly what you did.";

/// Added to the system prompt of a run in plan mode.
const PLAN_MODE_PROMPT: &str = "\n\n# Plan mode\n\nThis session is planning: nothing may be \
changed yet. Inspect what you need with read tools, record your plan with the `plan` tool (ordered \
steps), and end with an answer that states the plan. Calls that change anything are refused until \
the user approves the plan; then you will be asked to carry it out.";

impl Kernel {
    /// A kernel over `deps`.
    ///
    /// # Errors
    ///
    /// [`crate::RegistryError`] when two tools share a name or a schema does not compile.
    pub fn new(deps: KernelDeps) -> std::result::Result<Kernel, crate::RegistryError> {
        Kernel::at_depth(deps, 0, DEFAULT_MAX_AGENT_DEPTH)
    }

    /// A kernel whose sub-agents may nest `max_agent_depth` levels deep (0: no sub-agents).
    ///
    /// # Errors
    ///
    /// As [`Kernel::new`].
    pub fn with_max_agent_depth(
        deps: KernelDeps,
        max_agent_depth: u32,
    ) -> std::result::Result<Kernel, crate::RegistryError> {
        Kernel::at_depth(deps, 0, max_agent_depth)
    }

    fn at_depth(
        deps: KernelDeps,
        depth: u32,
        max_agent_depth: u32,
    ) -> std::result::Result<Kernel, crate::RegistryError> {
        let agents = if depth < max_agent_depth {
            crate::AgentTools::Offered
        } else {
            crate::AgentTools::Withheld
        };
        let holder = if depth == 0 {
            crate::registry::Holder::Session
        } else {
            crate::registry::Holder::SubAgent
        };
        let registry = Registry::for_kernel(deps.tools.clone(), holder, agents)?;
        Ok(Kernel {
            deps,
            registry,
            depth,
            max_agent_depth,
            failpoints: Arc::new(NoFailpoints),
            outbox: Arc::new(crate::NoOutbox),
            holder: default_holder(),
            holder_liveness: Arc::new(crate::lease::UnknownLiveness),
            code_limits: crate::CodeLimits::default(),
            tool_source: None,
        })
    }

    /// This kernel, offering `source`'s current tools at every step: when its generation
    /// moves, the next model request carries its new list (recorded as `tools_changed`),
    /// gated like any tool. The kernel's tools must hold the source's tools as they are
    /// now (the composition root passes both). Sub-agents keep the list they started with.
    pub fn with_tool_source(mut self, source: Arc<dyn keel_contracts::ToolSource>) -> Kernel {
        let generation = source.generation();
        let names = source.tools().iter().map(|tool| tool.spec().name.clone()).collect();
        self.tool_source = Some(DynamicTools { source, generation, names });
        self
    }

    /// This kernel, taking session leases as `holder` (e.g. `keel pid 4242 on build-7`).
    pub fn with_lease_holder(mut self, holder: impl Into<String>) -> Kernel {
        self.holder = holder.into();
        self
    }

    /// This kernel, taking over at once a lease whose holder `liveness` reports dead
    /// (`Some(false)`), instead of waiting for it to lapse.
    pub fn with_holder_liveness(
        mut self,
        liveness: Arc<dyn crate::lease::HolderLiveness>,
    ) -> Kernel {
        self.holder_liveness = liveness;
        self
    }

    /// This kernel, flushing `outbox` before every terminal event. Children inherit it.
    pub fn with_outbox(mut self, outbox: Arc<dyn crate::Outbox>) -> Kernel {
        self.outbox = outbox;
        self
    }

    /// This kernel, running `run_code` cells within `limits` (default: [`crate::CodeLimits`]'s).
    pub fn with_code_limits(mut self, limits: crate::CodeLimits) -> Kernel {
        self.code_limits = limits;
        self
    }

    /// This kernel, offering the intrinsic `tool` after keel's own (see
    /// [`Registry::with_intrinsic`]): its calls are gated like any intrinsic's and carried
    /// out by its [`crate::Intrinsic`] hook. Sub-agents do not get it.
    ///
    /// # Errors
    ///
    /// As [`Registry::with_intrinsic`]: a name the kernel's tools hold already, a spec that
    /// does not say `intrinsic: true`, or a schema that does not compile.
    pub fn with_intrinsic(
        mut self,
        tool: Arc<dyn crate::Intrinsic>,
    ) -> std::result::Result<Kernel, crate::RegistryError> {
        self.registry = self.registry.with_intrinsic(tool)?;
        Ok(self)
    }

    /// This kernel, stopping at `failpoints` (crash tests). Children inherit them.
    pub fn with_failpoints(mut self, failpoints: Arc<dyn Failpoints>) -> Kernel {
        self.failpoints = failpoints;
        self
    }

    /// The kernel a child session runs on: the same adapters, the given tools, one level
    /// deeper.
    pub(crate) fn child_kernel(
        &self,
        tools: Vec<Arc<dyn Tool>>,
    ) -> std::result::Result<Kernel, crate::RegistryError> {
        let deps = KernelDeps { tools, ..self.deps.clone() };
        // A sub-agent's registry has keel's tools a sub-agent may have (see the registry).
        Ok(Kernel::at_depth(deps, self.depth + 1, self.max_agent_depth)?
            .with_failpoints(self.failpoints.clone())
            .with_outbox(self.outbox.clone()))
    }

    /// The tool registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

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

    fn system_prompt(
        &self,
        workspace: &str,
        config: &RunConfig,
        catalog: Option<&crate::skills::Catalog>,
    ) -> String {
        let mut prompt =
            format!("{BASE_PROMPT} {TOOL_OUTPUT_POLICY}\n\nWorkspace root: {workspace}");
        for instruction in &config.instructions {
            prompt.push_str(&format!(
                "\n\n# Instructions from {}\n\n{}",
                instruction.source,
                instruction.text.trim_end()
            ));
        }
        if let Some(catalog) = catalog {
            prompt.push_str("\n\n");
            prompt.push_str(catalog.text.trim_end());
        }
        if config.output_schema.is_some() {
            prompt.push_str(
                "\n\n# Final answer\n\nThis run needs its answer in a fixed shape: when the task \
                 is done, call `submit` with the answer as its arguments (they must match its \
                 schema). The run ends with the first valid submission; if it is invalid you are \
                 told what is wrong, so fix it and submit again.",
            );
        }
        prompt
    }

    async fn drive(
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
            match check_budget(&config.budget, &spent) {
                BudgetVerdict::Continue => {}
                BudgetVerdict::Exhausted { reason } => {
                    ledger
                        .append(
                            turn,
                            run,
                            EventKind::BudgetExhausted {
                                reason: reason.clone(),
                                report_requested: false,
                            },
                        )
                        .await?;
                    break TurnOutcome::Suspended { reason, report: String::new() };
                }
                BudgetVerdict::LastStep { reason } => {
                    ledger
                        .append(
                            turn,
                            run,
                            EventKind::BudgetExhausted {
                                reason: reason.clone(),
                                report_requested: true,
                            },
                        )
                        .await?;
                    last_step = Some(reason);
                }
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
            // Correct later estimates by what the provider reports (only ever upwards).
            if let Some(reported) = response.usage.input_tokens
                && estimated_tokens > 0
            {
                let ratio = reported as f64 / estimated_tokens as f64;
                if ratio > token_scale {
                    token_scale = ratio.min(4.0);
                }
            }
            // Unknown is not zero (DESIGN.md §4): what the provider did not report is counted
            // with keel's own tokenizer, recorded as such, and charged like reported usage.
            let estimated_usage =
                estimate_unreported(&response, estimated_tokens, self.deps.counter.as_ref());
            let charged = effective_usage(&response.usage, estimated_usage.as_ref());
            let cost = config.price.as_ref().and_then(|price| cost_usd(&charged, price));
            usage.add(&response.usage, estimated_usage.as_ref(), cost);
            spent.steps = step;
            spent.last_step_tokens = usage_tokens(&charged);
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

        if let TurnOutcome::Suspended { reason, report } = &outcome {
            // The run's latest results held in memory (issue #13).
            let evidence = crate::checkpoint::run_evidence(&ledger, run_id);
            ledger
                .append(
                    turn,
                    run,
                    EventKind::Checkpoint {
                        reason: reason.clone(),
                        report: report.clone(),
                        evidence,
                        usage,
                    },
                )
                .await?;
        }
        // What a script reading only the last line needs: the answer, the time, the usage.
        let duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        let kind = match &outcome {
            TurnOutcome::Completed { text } => EventKind::RunCompleted {
                reason: "the model answered without tool calls".into(),
                usage,
                answer: Some(text.clone()),
                duration_ms,
            },
            TurnOutcome::Failed { reason } => {
                EventKind::RunFailed { reason: reason.clone(), usage, answer: None, duration_ms }
            }
            TurnOutcome::Suspended { reason, report } => EventKind::RunSuspended {
                reason: reason.clone(),
                usage,
                answer: (!report.is_empty()).then(|| report.clone()),
                duration_ms,
            },
            TurnOutcome::Cancelled { reason } => {
                EventKind::RunCancelled { reason: reason.clone(), usage, answer: None, duration_ms }
            }
            TurnOutcome::Denied { reason } => {
                EventKind::RunDenied { reason: reason.clone(), usage, answer: None, duration_ms }
            }
        };
        // Every terminal-event path lets the outbox catch up first (bounded); the outbox
        // reads the store, so what is staged is committed before it flushes.
        if self.outbox.delivers() {
            ledger.commit().await?;
        }
        let _ =
            tokio::time::timeout(crate::OUTBOX_FLUSH_TIMEOUT, self.outbox.flush(ledger.session_id))
                .await;
        self.failpoints.hit(Failpoint::BeforeTerminal).await;
        ledger.append(turn, run, kind).await?;
        for (seq, sender) in joined {
            let _ = sender.send(seq);
        }
        self.failpoints.hit(Failpoint::AfterTerminal).await;
        self.drop_lease(&mut ledger).await;
        Ok(RunReport { session_id: ledger.session_id, turn_id, run_id, outcome, usage })
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

/// Gives each call of a response that repeats an id already taken a fresh one (`ID-2`,
/// `ID-3`, …): a provider that repeats an id (within a response or across turns) would
/// make two calls share one result, and results are paired and paged
/// (`read_tool_result`) by id.
///
/// An id is taken by an earlier call of the same response or by a call the session
/// answered: the store's indexed lookup ([`keel_contracts::Store::last_tool_result`]).
/// Every call of an earlier response has its result durable before the next model request
/// leaves (the request's append commits what the step staged; calls a dead run left open
/// are answered before the first request of the run that resumes it), so that covers
/// every earlier call of the session, and nothing of the run is kept in memory for it
/// (issue #13: the set of the run's ids grew by one a step).
///
/// # Errors
///
/// [`KernelError`] when the store cannot be read.
async fn unique_call_ids(
    store: &dyn keel_contracts::Store,
    ledger: &Ledger,
    calls: &mut [keel_contracts::ToolCall],
) -> Result<()> {
    if calls.is_empty() {
        return Ok(());
    }
    let mut taken = std::collections::BTreeSet::new();
    for call in calls.iter_mut() {
        let mut candidate = call.call_id.clone();
        let mut n = 1u64;
        while is_taken(store, ledger, &taken, &candidate).await? {
            n += 1;
            candidate = keel_contracts::ToolCallId(format!("{}-{n}", call.call_id.as_str()));
        }
        call.call_id = candidate.clone();
        taken.insert(candidate);
    }
    Ok(())
}

/// Whether `id` is taken (see [`unique_call_ids`]).
async fn is_taken(
    store: &dyn keel_contracts::Store,
    ledger: &Ledger,
    earlier: &std::collections::BTreeSet<keel_contracts::ToolCallId>,
    id: &keel_contracts::ToolCallId,
) -> Result<bool> {
    if earlier.contains(id) {
        return Ok(true);
    }
    Ok(store.last_tool_result(ledger.session_id, id).await?.is_some())
}

/// keel's own count of the figures a response's usage lacks: the request's estimated size
/// for input, the response's text, reasoning and tool calls for output. `None` when the
/// provider reported both.
pub(crate) fn estimate_unreported(
    response: &keel_contracts::ModelResponse,
    request_tokens: u64,
    counter: &dyn keel_contracts::TokenCounter,
) -> Option<keel_contracts::Usage> {
    let reported = &response.usage;
    if reported.input_tokens.is_some() && reported.output_tokens.is_some() {
        return None;
    }
    let output = || {
        let calls: u64 = response
            .tool_calls
            .iter()
            .map(|call| counter.count(&call.name) + counter.count(&call.arguments.to_string()))
            .sum();
        let reasoning: u64 = response.reasoning.iter().map(|part| counter.count(&part.text)).sum();
        counter.count(&response.text) + calls + reasoning
    };
    Some(keel_contracts::Usage {
        input_tokens: reported.input_tokens.is_none().then_some(request_tokens),
        output_tokens: reported.output_tokens.is_none().then(output),
        cached_input_tokens: None,
        reasoning_tokens: None,
    })
}

/// A label unique to this kernel instance in this process (hosts set their own with
/// [`Kernel::with_lease_holder`]).
fn default_holder() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let instance = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("keel pid {} kernel {instance}", std::process::id())
}
