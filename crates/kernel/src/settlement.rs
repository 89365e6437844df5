//! Tool settlement: resolve, validate, gate, prepare durably, invoke, record the result
//! (DESIGN.md §3 steps 3–4). Every call that reaches here gets exactly one `tool_result`.
//!
//! One path for every tool, in stages: [`admit`](CallState::admit) (resolve → validate →
//! gate → consent and grants → an intrinsic's admission → prepare), then
//! [`carry_out`](CallState::carry_out) (an intrinsic's hook, or the tool's `invoke`) and
//! the result. Which tool is intrinsic and how it is carried out is the registry's answer;
//! nothing here names a tool.
//!
//! - `admit`: the gate, up to the durable prepare.
//! - `consent`: asking, and the grants that spare asking.
//! - `carry_out`: the hook or the tool's task, cancel and time budget, the result.
//! - `questions`: a running tool's questions (elicitation).
//! - `reads`: consecutive plain reads side by side.
//! - `cell`: a `run_code` program's calls, settled through this same path.
//! - `lent`: what the settlement lends keel's own intrinsics.

mod admit;
mod carry_out;
mod cell;
mod consent;
mod lent;
mod questions;
mod reads;

use std::collections::BTreeMap;
use std::path::PathBuf;

use keel_contracts::{
    AttemptId, Budget, Decision, Envelope, EventKind, ExecutionMode, Outcome, PermissionRules,
    RunId, SandboxMode, ToolCall, ToolContext, ToolOutput, TurnId, UsageTotals,
};

use crate::failpoint::Failpoints;
use crate::intrinsic::{AFTER_PARKED, Children, Intrinsic, Parked};
use crate::ledger::Ledger;
use crate::registry::Registry;
use crate::{Cancellation, KernelDeps, Result};

use carry_out::{AbortOnDrop, until};

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
}
