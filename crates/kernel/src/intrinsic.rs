//! Intrinsic tools: how the agent thinks (DESIGN.md §2), and the hook through which the
//! settlement carries them out.
//!
//! An intrinsic is one of keel's own tools: exempt from the reads/writes scope, still
//! refusable through `forbidden`, gated like any call. What it does once its gate allowed
//! it is its own [`Intrinsic`] hook, which the settlement finds on the tool's registry
//! entry: the settlement never names an intrinsic. Each lives in a module of its own
//! (`todo` and `plan` in `checklist`, `read_tool_result`, `request_boundary`, `run_code`,
//! the per-run `activate_skill` and `submit`, the sub-agent tools in `agents`, `wait` in
//! [`crate::wait`]); the registry lists which ones a kernel and a run offer.
//!
//! A hook reaches the run only through the [`IntrinsicCall`] it is handed: the call, the
//! ledger, the run's configuration, its cancellation, and what the settlement lends keel's
//! own intrinsics ([`Settlement`]).

mod activate_skill;
mod agents;
mod checklist;
mod read_tool_result;
mod request_boundary;
mod run_code;
mod submit;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_contracts::{
    Access, Boundary, Budget, EventKind, IdGen, PermissionAnswer, PermissionRules, RunId,
    RuntimeEvent, SessionId, Tool, ToolCall, ToolCallId, ToolOutput, TurnId, UsageTotals,
};

pub(crate) use activate_skill::activate_skill;
pub(crate) use agents::{AgentAnswer, AgentCall, Children, agent_tools};
pub(crate) use agents::{LIST_AGENTS, READ_AGENT_OUTPUT, SPAWN_AGENT, WAIT_AGENT};
pub(crate) use checklist::{plan, todo};
pub(crate) use read_tool_result::read_tool_result;
pub(crate) use request_boundary::request_boundary;
pub(crate) use run_code::run_code;
pub(crate) use submit::{submit, text_answer};

use crate::ledger::Ledger;
use crate::{Cancellation, Result, RunConfig};

/// One of keel's own tools: a [`Tool`] whose calls, once the gate allowed them, the
/// settlement carries out through this hook instead of naming the tool.
///
/// Every call still goes the one path of the settlement: resolved and validated against
/// the spec, gated (an intrinsic's spec says `intrinsic: true`, so the reads/writes scope
/// does not apply), then [`Intrinsic::admit`] says whether it parks the run or prepares an
/// attempt, and once `tool_attempt_prepared` is durable, [`Intrinsic::carry_out`] says what
/// the call's result is. The default of both is what a workspace tool gets: an attempt,
/// then [`Tool::invoke`] on a task of its own (cancellable, bounded by the run's time
/// budget, its questions asked and recorded).
///
/// An intrinsic is registered by keel's registry, or by a composition root with
/// [`crate::Registry::with_intrinsic`] / [`crate::Kernel::with_intrinsic`]; never by a
/// workspace or MCP tool (see [`crate::RegistryError::ClaimsIntrinsic`]).
#[async_trait]
pub trait Intrinsic: Tool {
    /// What a call becomes once its gate allowed it: an attempt (the default), a parked
    /// run (keel's `wait`), or an `error` result without an attempt that counts against
    /// the repeated-failure guard.
    fn admit(&self, call: &IntrinsicCall<'_>) -> Admitted {
        let _ = call;
        Admitted::Attempt
    }

    /// Carries out a call whose `tool_attempt_prepared` is durable, and says what its
    /// result is: [`Carried::output`] is recorded as the call's `tool_result` (an `error`
    /// there does not count against the repeated-failure guard: the arguments were valid,
    /// the call did what it could); [`Carried::invoke`], the default, runs the tool like a
    /// workspace tool instead.
    ///
    /// # Errors
    ///
    /// [`crate::KernelError`] only when the runtime cannot go on (the ledger cannot be read
    /// or written); what the model should learn goes in the output.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the settlement drives it to the end, and the run's cancellation is
    /// [`IntrinsicCall::cancel`], which a hook that waits must watch. If the future is
    /// dropped anyway (the run's own future was), the attempt is durable and its result
    /// is not: recovery answers it `indeterminate`.
    async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> Result<Carried> {
        let _ = call;
        Ok(Carried::invoke())
    }
}

/// What an intrinsic call becomes once its gate allowed it (see [`Intrinsic::admit`]).
#[derive(Debug)]
pub enum Admitted {
    /// Prepare an attempt and carry the call out.
    Attempt,
    /// Park the run: no attempt, no result; the run ends suspended `waiting` and the call
    /// stays open until a wake answers it. Only keel's `wait` makes a [`Parked`].
    Park(Parked),
    /// Answer the call `error` with this text, without an attempt (its arguments cannot be
    /// carried out); it counts against the repeated-failure guard.
    Invalid(String),
}

/// What a parked run waits for, recorded as `wait_started`. Made by keel's `wait` only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    pub(crate) call_id: ToolCallId,
    pub(crate) wake_id: String,
    pub(crate) event: String,
    pub(crate) deadline: DateTime<Utc>,
}

/// Result text for a call after a parking call in the same step.
pub(crate) const AFTER_PARKED: &str =
    "cancelled: the run parked on an earlier `wait` in this step; this call was not executed";

/// What carrying an intrinsic call out gave (see [`Intrinsic::carry_out`]).
#[derive(Debug)]
pub struct Carried(pub(crate) Carry);

/// The settlement's side of [`Carried`].
#[derive(Debug)]
pub(crate) enum Carry {
    /// Record this output as the call's result, naming its attempt.
    Output(ToolOutput),
    /// The result is recorded already (a consent the run's cancel cut short).
    Answered,
    /// Invoke the tool like a workspace tool.
    Invoke,
}

impl Carried {
    /// The call's result: recorded as its `tool_result`, naming its attempt.
    pub fn output(output: ToolOutput) -> Carried {
        Carried(Carry::Output(output))
    }

    /// Run the tool's [`Tool::invoke`] as a workspace tool's would be.
    pub fn invoke() -> Carried {
        Carried(Carry::Invoke)
    }

    /// The call's result was recorded by the settlement already.
    pub(crate) fn answered() -> Carried {
        Carried(Carry::Answered)
    }
}

/// One intrinsic call as its hook sees it: the call, the ledger it is recorded in, the
/// run's configuration and cancellation, and what the settlement lends keel's own
/// intrinsics. Handed to [`Intrinsic::admit`] and [`Intrinsic::carry_out`] by the
/// settlement; lives as long as the hook runs.
pub struct IntrinsicCall<'c> {
    pub(crate) settlement: &'c mut dyn Settlement,
    pub(crate) ledger: &'c mut Ledger,
    pub(crate) turn_id: TurnId,
    pub(crate) run_id: RunId,
    pub(crate) tool_call: &'c ToolCall,
    pub(crate) arguments_sha256: &'c str,
    pub(crate) cancel: &'c Cancellation,
}

impl std::fmt::Debug for IntrinsicCall<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntrinsicCall")
            .field("session_id", &self.ledger.session_id)
            .field("turn_id", &self.turn_id)
            .field("run_id", &self.run_id)
            .field("tool_call", &self.tool_call)
            .finish_non_exhaustive()
    }
}

impl IntrinsicCall<'_> {
    /// The call the model proposed (its arguments validated against the tool's schema).
    pub fn tool_call(&self) -> &ToolCall {
        self.tool_call
    }

    /// The call's arguments.
    pub fn arguments(&self) -> &serde_json::Value {
        &self.tool_call.arguments
    }

    /// The session the call belongs to.
    pub fn session_id(&self) -> SessionId {
        self.ledger.session_id
    }

    /// The turn the call belongs to.
    pub fn turn_id(&self) -> TurnId {
        self.turn_id
    }

    /// The run the call belongs to.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// The run's configuration.
    pub fn run_config(&self) -> &RunConfig {
        self.settlement.run_config()
    }

    /// The run's cancellation: a hook that waits stops when it fires.
    pub fn cancel(&self) -> &Cancellation {
        self.cancel
    }

    /// The session's events the ledger holds, this call's `tool_attempt_prepared` last
    /// (when it has one): what the active compaction covers is not among them, facts
    /// (grants, boundary, turn and run starts and ends) always are.
    pub fn events(&self) -> &[RuntimeEvent] {
        self.ledger.events()
    }

    /// Stages `kind` in the call's turn and run: durable with the next commit.
    pub(crate) fn stage(&mut self, kind: EventKind) {
        self.ledger.stage(Some(self.turn_id), Some(self.run_id), kind);
    }
}

/// What the settlement of one run lends keel's own intrinsics: its services, and the
/// state of the run a hook may change (a submitted answer, a denied turn, a widened
/// boundary, what sub-agents spent). Implemented by the settlement's per-run state.
#[async_trait]
pub(crate) trait Settlement: Send {
    /// The run's configuration.
    fn run_config(&self) -> &RunConfig;
    /// The kernel's id source.
    fn ids(&self) -> &dyn IdGen;
    /// The kernel's clock.
    fn now(&self) -> DateTime<Utc>;
    /// The session's workspace.
    fn workspace(&self) -> &std::path::Path;
    /// The run's permission rules.
    fn rules(&self) -> &PermissionRules;
    /// The session's boundary so far and its revision.
    fn boundary(&self) -> (&Boundary, u32);
    /// Marks a boundary negotiation in this step; `false` when one happened already.
    fn begin_negotiation(&mut self) -> bool;
    /// Asks for consent (`ruled`: a rule's answer) and records the request and its answer.
    /// `None` when the run was cancelled meanwhile: a `cancelled` result is recorded then.
    async fn ask(
        &mut self,
        ledger: &mut Ledger,
        at: (TurnId, RunId, &ToolCall),
        access: Access,
        ruled: Option<(PermissionAnswer, String)>,
        arguments_sha256: &str,
        cancel: &Cancellation,
    ) -> Result<Option<PermissionAnswer>>;
    /// Records `boundary` as the session's next revision (`boundary_revised`) and binds
    /// the run's later calls to it; returns the revision.
    async fn widen_boundary(
        &mut self,
        ledger: &mut Ledger,
        at: (TurnId, RunId),
        boundary: Boundary,
        justification: String,
    ) -> Result<u32>;
    /// Ends the turn once this step's calls are answered, denied for `reason`.
    fn deny(&mut self, reason: String);
    /// Whether an answer was submitted in this step.
    fn submitted(&self) -> bool;
    /// Ends the run with `answer` (JSON text) once this step's calls are answered.
    fn submit(&mut self, answer: String);
    /// What carries out sub-agent calls.
    fn children(&self) -> &dyn Children;
    /// What the run has left.
    fn remaining(&self) -> Budget;
    /// Counts what a sub-agent spent against the run.
    fn absorb_child_spent(&mut self, spent: &UsageTotals);
    /// Runs the cell of `parent` (a prepared `run_code` call), settling its programs'
    /// calls; the cell's output is `parent`'s result.
    async fn run_cell(
        &mut self,
        ledger: &mut Ledger,
        at: (TurnId, RunId, &ToolCall),
        cancel: &Cancellation,
    ) -> Result<ToolOutput>;
}
