//! The ledger's unit: [`RuntimeEvent`], and the kinds of fact it records (DESIGN.md §1, §9).
//!
//! This is a durable format. Field names and `kind` spellings are stable; new kinds and
//! new optional fields may be added, nothing is renamed as a side effect.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{
    Access, AttemptId, Envelope, ExecutionMode, FinishReason, Outcome, ReasoningPart,
    RequestPurpose, RunId, Seq, SessionId, ToolCall, ToolCallId, TurnId, Usage,
};

/// One fact in a session's ledger.
///
/// Serialized as one flat JSON object: `seq`, `session_id`, `turn_id`, `run_id`, `ts`,
/// `kind`, and the kind's own fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeEvent {
    /// Per-session position, gap-free from 1.
    pub seq: Seq,
    /// The session.
    pub session_id: SessionId,
    /// The turn, where the fact belongs to one.
    pub turn_id: Option<TurnId>,
    /// The run, where the fact belongs to one.
    pub run_id: Option<RunId>,
    /// When it was recorded (UTC).
    pub ts: DateTime<Utc>,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Where a child session came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// The parent session.
    pub parent_session_id: SessionId,
    /// The parent's run that spawned it.
    pub parent_run_id: RunId,
    /// The parent's turn.
    pub parent_turn_id: TurnId,
    /// The parent's `spawn_agent` call.
    pub parent_call_id: ToolCallId,
}

/// The boundary commands and file tools run inside (DESIGN.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// OS containment; a tool refuses when it cannot be enforced.
    #[default]
    Managed,
    /// No containment, by explicit user choice.
    Bypass,
}

/// How permission requests are answered for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Ask the user at a terminal.
    Ask,
    /// Allow every request, except a wider boundary (`request_boundary`), which needs a
    /// person or an explicit rule in the user's own config.
    Auto,
    /// Allow the calls the managed sandbox contains (commands, file edits inside the
    /// workspace, the boundary never widened); ask for anything else (refuse headless).
    /// Approves nothing when the sandbox is bypassed.
    Sandboxed,
    /// Deny every request.
    Deny,
}

/// A gate's answer for one tool call, as recorded in `gate_decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The call may run without asking.
    Allow,
    /// The call is refused.
    Refuse,
    /// The call needs consent: a permission request follows.
    Ask,
    /// Shadow mode withholds the call.
    Shadow,
}

/// The answer to a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionAnswer {
    /// Allow this call.
    AllowOnce,
    /// Allow this tool for the rest of the session (a durable grant).
    AllowSession,
    /// Allow this exact call (same tool, same arguments) again without asking, until the
    /// grant's mandatory expiry: an execution grant, keyed to the session and the SHA-256
    /// of the arguments.
    AllowExact,
    /// Deny: the call is refused.
    Deny,
}

/// Extra room outside the workspace that the user granted a session through
/// `request_boundary`. Cumulative: each revision holds everything granted so far.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Boundary {
    /// Extra read-only paths (absolute).
    pub read: Vec<String>,
    /// Extra read-write paths (absolute).
    pub write: Vec<String>,
    /// Whether commands may use the network.
    pub network: bool,
}

/// Usage summed over responses. Responses that reported no usage are counted, so a total
/// is never silently understated.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Sum of reported input tokens.
    pub input_tokens: u64,
    /// Sum of reported output tokens.
    pub output_tokens: u64,
    /// Sum of reported cached input tokens.
    pub cached_input_tokens: u64,
    /// Sum of reported reasoning tokens.
    pub reasoning_tokens: u64,
    /// Model responses counted.
    pub responses: u64,
    /// Of those, responses whose usage was not (fully) reported: their missing figures are
    /// keel's own estimates.
    pub responses_without_usage: u64,
    /// Of `input_tokens + output_tokens`, the tokens keel estimated because the provider did
    /// not report them (0 when every figure was reported).
    #[serde(default)]
    pub estimated_tokens: u64,
    /// Total cost in USD; `None` (unknown) as soon as one response's cost is unknown.
    #[serde(default)]
    pub cost_usd: Option<f64>,
}

impl UsageTotals {
    /// The totals of a session whose responses could not be read: one response, its usage
    /// not reported and its cost unknown, so a listing shows "unknown", never zero.
    pub fn unknown() -> UsageTotals {
        UsageTotals { responses: 1, responses_without_usage: 1, ..UsageTotals::default() }
    }

    /// Adds another total (a child's spend to its parent's).
    pub fn absorb(&mut self, other: &UsageTotals) {
        if other.responses == 0 {
            return;
        }
        self.cost_usd = match (self.responses, self.cost_usd, other.cost_usd) {
            (0, _, cost) => cost,
            (_, Some(total), Some(cost)) => Some(total + cost),
            _ => None,
        };
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.responses += other.responses;
        self.responses_without_usage += other.responses_without_usage;
        self.estimated_tokens += other.estimated_tokens;
    }

    /// Tokens these totals count against a token ceiling: input, output and reasoning
    /// (the sum [`crate::usage_tokens`] takes per response).
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.reasoning_tokens
    }

    /// Adds one response's usage and cost (`None`: unknown). `estimated` is keel's own count
    /// for what the provider did not report (`model_response.estimated_usage`): a missing
    /// input or output figure is taken from it and the response is counted in
    /// `responses_without_usage` and `estimated_tokens`, so an unreported figure is never
    /// counted as 0 (DESIGN.md §4).
    pub fn add(&mut self, usage: &Usage, estimated: Option<&Usage>, cost_usd: Option<f64>) {
        self.cost_usd = match (self.responses, self.cost_usd, cost_usd) {
            (0, _, cost) => cost,
            (_, Some(total), Some(cost)) => Some(total + cost),
            _ => None,
        };
        self.responses += 1;
        let guess = |figure: Option<u64>| figure.unwrap_or(0);
        let input =
            usage.input_tokens.unwrap_or_else(|| guess(estimated.and_then(|e| e.input_tokens)));
        let output =
            usage.output_tokens.unwrap_or_else(|| guess(estimated.and_then(|e| e.output_tokens)));
        if usage.input_tokens.is_none() || usage.output_tokens.is_none() {
            self.responses_without_usage += 1;
            self.estimated_tokens +=
                usage.input_tokens.map_or(input, |_| 0) + usage.output_tokens.map_or(output, |_| 0);
        }
        self.input_tokens += input;
        self.output_tokens += output;
        self.cached_input_tokens += usage.cached_input_tokens.unwrap_or(0);
        self.reasoning_tokens += usage.reasoning_tokens.unwrap_or(0);
    }
}

/// The compaction a chained compaction digest extends (issue #13): the later compaction's
/// `digest` is `sha256(chain.digest ++ "\n" ++ JSON of each event after chain.covers_to up to
/// its own covers_to, one per line)`, so each compaction hashes only what was covered since
/// the previous one, and a change to an event covered by the previous one invalidates that
/// one and with it every compaction chained on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestChain {
    /// Seq of the compaction event extended.
    pub compaction: Seq,
    /// Its last covered seq: the chained digest hashes the events after it.
    pub covers_to: Seq,
    /// Its digest.
    pub digest: String,
}

/// The repeated-failure guard's counts for one turn as of a compaction's `covers_to`
/// (issue #13): a resume of a turn that began before the events it reads continues from
/// them instead of reading the covered part of the turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnFailures {
    /// The turn open at `covers_to`.
    pub turn_id: TurnId,
    /// Its failures so far, by call.
    pub counts: Vec<FailureCount>,
}

/// How often one call (tool and arguments) failed in a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureCount {
    /// The tool.
    pub tool: String,
    /// SHA-256 of the arguments' JSON.
    pub arguments_sha256: String,
    /// `error` results so far.
    pub failures: u32,
}

/// What a compaction carries forward verbatim, extracted by keel from the covered events.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CarriedContext {
    /// Every user input in the covered range, in order (the task and its constraints).
    pub inputs: Vec<String>,
    /// The latest `todo`/`plan` items, as the agent recorded them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<serde_json::Value>,
    /// Files the covered tool calls named (`path` arguments), in first-use order.
    pub files: Vec<String>,
    /// Skills activated in the covered range (`skill_activated`), in first-activation
    /// order, each with the text its activation returned, so an activated skill survives
    /// compaction.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<ActivatedSkill>,
}

/// A skill the agent activated, as a compaction carries it forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivatedSkill {
    /// The skill's name.
    pub name: String,
    /// What `activate_skill` returned to the model (the body, fenced when it came with the
    /// workspace).
    pub text: String,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// One tool call of a run and how it ended, as recorded in a [`EventKind::Checkpoint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The seq of its `tool_result`.
    pub seq: Seq,
    /// The tool.
    pub tool: String,
    /// The call's arguments, abbreviated to at most 200 characters.
    pub arguments: String,
    /// How it ended.
    pub outcome: Outcome,
}

/// What a [`RuntimeEvent`] records. Tagged by `kind` (snake_case) on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// A session began. Always seq 1.
    SessionCreated {
        /// The workspace root (canonical path).
        workspace: String,
        /// The model spec (`openai:gpt-4o`, `scripted:fix.json`).
        model: String,
        /// The session's envelope.
        envelope: Envelope,
        /// The execution mode that binds every run of the session.
        mode: ExecutionMode,
        /// The provider endpoint the session runs against (`http://127.0.0.1:11434/v1`),
        /// with userinfo and secret-looking query parameters removed; absent for scripted
        /// models and for sessions recorded before it existed. `keel resume` continues
        /// against it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base_url: Option<String>,
        /// Set for child sessions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lineage: Option<Lineage>,
    },
    /// The user approved the plan of a session in plan mode: its runs from here on are
    /// live (the session's `mode` stays `plan` in `session_created`; this event changes
    /// what binds later runs).
    PlanApproved {
        /// Who approved (`user`, `remote (keel serve)`).
        by: String,
    },
    /// The session was sealed: it never runs agent code again.
    SessionSealed {
        /// Why.
        reason: String,
    },
    /// A turn began with the user's input.
    TurnStarted {
        /// The input text.
        input: String,
    },
    /// Input the user sent while the run was active (steering), joined at a step
    /// boundary: after the previous step's calls were all answered, before the next model
    /// request. The model reads it as a user message there.
    InputJoined {
        /// The input text.
        input: String,
    },
    /// A run of the loop began for the turn.
    RunStarted {
        /// Execution mode.
        mode: ExecutionMode,
        /// Boundary for tools.
        sandbox: SandboxMode,
        /// How permission requests are answered.
        approval: ApprovalMode,
        /// The run's ceilings (steps, tokens, cost, wall-clock in ms); absent ones unset.
        #[serde(default)]
        budget: crate::Budget,
        /// The run this one continues (for resumed turns).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resumes: Option<RunId>,
    },
    /// The run's composition baseline, recorded once per run.
    RunComposition {
        /// Provider name (`openai`, `scripted`).
        provider: String,
        /// Model name.
        model: String,
        /// The model's context window in tokens, when known.
        context_window: Option<u64>,
        /// The system prompt sent on every request of this run.
        system_prompt: String,
        /// SHA-256 of the system prompt.
        system_prompt_sha256: String,
        /// Tool names offered, in order.
        tools: Vec<String>,
        /// SHA-256 of the serialized tool definitions.
        tools_sha256: String,
    },
    /// A request was sent to the model.
    ModelRequested {
        /// Step number within the run, from 1.
        step: u32,
        /// Messages in the projected request.
        messages: u64,
        /// SHA-256 of the serialized request.
        request_sha256: String,
        /// Estimated size of the request in tokens (see `TokenCounter`).
        #[serde(default)]
        tokens: Option<u64>,
        /// Estimated size before old tool results were pruned from the projection, when
        /// any were.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens_before_pruning: Option<u64>,
        /// Tool results shown as stubs (or previews) in this request.
        #[serde(default, skip_serializing_if = "is_zero")]
        pruned_results: u64,
        /// What the request is for: a conversation step (absent on the wire) or a call keel
        /// makes for itself, such as a compaction summary. Every model call is recorded.
        #[serde(default, skip_serializing_if = "RequestPurpose::is_conversation")]
        purpose: RequestPurpose,
    },
    /// A prefix of the projection was folded into a summary (DESIGN.md §7). The ledger keeps
    /// every covered event; only the projection changes.
    Compaction {
        /// First covered seq.
        covers_from: Seq,
        /// Last covered seq.
        covers_to: Seq,
        /// SHA-256 over the covered events' JSON, one per line, or chained on `chain` (see
        /// [`DigestChain`]): the compaction is invalid when the covered events no longer
        /// hash to it.
        digest: String,
        /// The earlier compaction `digest` is chained on; absent when it hashes every
        /// covered event from `covers_from` (the first compaction of a session, and every
        /// compaction written before chaining).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chain: Option<DigestChain>,
        /// Conversation responses recorded in the session before this event (the scripted
        /// model's position), so a resume that starts reading here need not count them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        responses_before: Option<u64>,
        /// The repeated-failure counts of the turn open at `covers_to`, up to it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failures: Option<TurnFailures>,
        /// The model's summary of the covered conversation.
        summary: String,
        /// What keel carries forward verbatim, whatever the summary says.
        carried: CarriedContext,
        /// Estimated request tokens before and after.
        tokens_before: u64,
        /// Estimated request tokens after.
        tokens_after: u64,
    },
    /// Compaction was tried and did not happen (the summary failed or was malformed).
    CompactionFailed {
        /// Why.
        reason: String,
        /// Summary requests made.
        attempts: u32,
    },
    /// The model's whole response.
    ModelResponse {
        /// Visible text.
        text: String,
        /// Reasoning blocks, byte-exact.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reasoning: Vec<ReasoningPart>,
        /// Proposed tool calls.
        tool_calls: Vec<ToolCall>,
        /// Reported usage, normalised.
        usage: Usage,
        /// The provider's own usage object(s), exactly as received (see
        /// [`crate::ModelResponse::raw_usage`]); absent when it reported none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw_usage: Option<serde_json::Value>,
        /// Why the model stopped.
        finish_reason: FinishReason,
        /// Cost of this response in USD; `null` when the price is unknown. Computed from
        /// `usage`, with `estimated_usage` standing in for what the provider did not report
        /// (so then it is an estimate too).
        #[serde(default)]
        cost_usd: Option<f64>,
        /// keel's own count (its tokenizer) of what the provider did not report: present
        /// only when `usage` lacks input or output tokens (DESIGN.md §4, "unknown is not
        /// zero"). Budgets and totals use it in place of the missing figures.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        estimated_usage: Option<Usage>,
        /// What the request was for; absent on the wire for a conversation step. Only
        /// conversation responses are part of the projected history.
        #[serde(default, skip_serializing_if = "RequestPurpose::is_conversation")]
        purpose: RequestPurpose,
    },
    /// A model request failed and the provider client is about to send it again: recorded
    /// before the next attempt's response, so the ledger shows every retry, in order, before
    /// the step's `model_response` (or the run's failure). Whatever the failed attempt
    /// streamed is discarded; only the final response counts.
    ModelRetry {
        /// The step of the request being retried (as in its `model_requested`).
        step: u32,
        /// The attempt about to be made: 2 for the first retry.
        attempt: u32,
        /// The failed attempt's HTTP status, when there was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        /// The kind of failure (`rate_limited`, `overloaded`, `server`, `transport`, `stream`).
        error: String,
        /// The provider's message (or the client's), never a secret.
        #[serde(default)]
        message: String,
        /// The wait chosen before the next attempt, in milliseconds (`Retry-After`, capped,
        /// when the server sent one; otherwise backoff with jitter).
        wait_ms: u64,
        /// What the request was for; absent on the wire for a conversation step.
        #[serde(default, skip_serializing_if = "RequestPurpose::is_conversation")]
        purpose: RequestPurpose,
    },
    /// A budget ceiling was reached or is one step away (DESIGN.md §4).
    BudgetExhausted {
        /// Which ceiling, with figures; starts with "stopped early".
        reason: String,
        /// Whether one last step runs with tools off for the model's report.
        report_requested: bool,
    },
    /// Where a run stands when it stops early: enough to resume from.
    Checkpoint {
        /// Why the run stopped ("stopped early: …").
        reason: String,
        /// The model's own report (what was done, what it believes, what is next); empty
        /// when no report step could run.
        report: String,
        /// The run's tool calls and how they ended, as evidence of what was done.
        evidence: Vec<Evidence>,
        /// Usage totals of the run so far.
        usage: UsageTotals,
    },
    /// A gate's decision for a call.
    GateDecision {
        /// The call.
        call_id: ToolCallId,
        /// The tool.
        tool: String,
        /// The decision.
        decision: Decision,
        /// The rule or refusal text behind it.
        reason: String,
    },
    /// Consent was requested for a call.
    PermissionRequested {
        /// The call.
        call_id: ToolCallId,
        /// The tool.
        tool: String,
        /// The tool's real access kind.
        access: Access,
        /// The call's arguments, as shown to the user.
        arguments: serde_json::Value,
    },
    /// Consent was answered.
    PermissionSettled {
        /// The call.
        call_id: ToolCallId,
        /// The tool.
        tool: String,
        /// The tool's real access kind.
        access: Access,
        /// The answer.
        answer: PermissionAnswer,
        /// Who answered (`user`, `approval=auto`, `rule:…`, `grant`).
        by: String,
        /// For an execution grant: the SHA-256 of the exact arguments it covers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments_sha256: Option<String>,
        /// For an execution grant: when it expires (mandatory for a grant to be used).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<DateTime<Utc>>,
    },
    /// A tool's server asked the user a question while the call ran (MCP
    /// `elicitation/create`). Never part of what the model sees.
    ElicitationRequested {
        /// The call the question came during.
        call_id: ToolCallId,
        /// The tool.
        tool: String,
        /// The question's id within the session (`CALL.qN`, URL-path-safe: see
        /// `keel_kernel::question_id`), for answering it.
        question: String,
        /// The MCP server that asks.
        server: String,
        /// Its message (untrusted text: shown fenced, control characters removed).
        message: String,
        /// The requested schema as the server sent it.
        schema: serde_json::Value,
    },
    /// The question was answered, declined or cancelled. The content goes to the server
    /// only; the model sees it only if the server puts it in its tool result.
    ElicitationAnswered {
        /// The call the question came during.
        call_id: ToolCallId,
        /// The tool.
        tool: String,
        /// The question's id (as in its `elicitation_requested`).
        question: String,
        /// Accept, decline or cancel.
        action: crate::ElicitationAction,
        /// The answer, for `accept` (checked against the schema).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<serde_json::Value>,
        /// Who answered (`user`, `approval=auto`, `remote (keel serve)`, `keel`).
        by: String,
        /// Why it was declined or cancelled.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The tools of a changing source (an MCP server's `tools/list_changed`) changed
    /// between steps: the next model request carries the new list.
    ToolsChanged {
        /// Tools offered from now on that were not before.
        added: Vec<String>,
        /// Tools no longer offered (a call to one is an `error` result).
        removed: Vec<String>,
        /// The SHA-256 of the whole new list of definitions.
        tools_sha256: String,
    },
    /// The user approved a `request_boundary`: commands of this session now run with a
    /// wider boundary.
    BoundaryRevised {
        /// 1 for the first widening, then 2, …
        revision: u32,
        /// The whole boundary granted so far.
        boundary: Boundary,
        /// The agent's justification, as shown to the user.
        justification: String,
    },
    /// The skills catalog of a run's system prompt (Agent Skills), recorded when the run
    /// has skills or skipped any: which skills the catalog names, which it left out for
    /// its budget, and why a skill found on disk was not loaded.
    SkillCatalog {
        /// Names in the catalog, in order.
        shown: Vec<String>,
        /// Names left out because the catalog's budget ran out (still activatable).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        omitted: Vec<String>,
        /// The catalog's budget in tokens (scaled to the context window).
        budget_tokens: u64,
        /// Skills that were skipped, each with where and why.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        diagnostics: Vec<String>,
    },
    /// The agent activated a skill (`activate_skill`): its body is in the result that
    /// follows, and in this event, so compaction carries it forward.
    SkillActivated {
        /// The `activate_skill` call.
        call_id: ToolCallId,
        /// The skill.
        name: String,
        /// Where its SKILL.md was read from.
        location: String,
        /// SHA-256 of the body as read.
        body_sha256: String,
        /// What the activation returned to the model.
        text: String,
    },
    /// A call a program made from inside another call (a `run_code` cell's
    /// `tools.NAME(args)`), not proposed by the model: settled like any call (gate,
    /// consent, prepare, exactly one `tool_result` under `call_id`), and never part of the
    /// conversation the model sees; the parent's own result is what the model reads.
    ToolCall {
        /// The call that made it (the `run_code` call).
        parent_call_id: ToolCallId,
        /// This call: `<parent>/<n>`, n from 1 in the order the program made them.
        call_id: ToolCallId,
        /// The tool, as the program named it.
        tool: String,
        /// Its arguments.
        arguments: serde_json::Value,
    },
    /// A tool is about to be invoked. Committed durably before any effect.
    ToolAttemptPrepared {
        /// The call.
        call_id: ToolCallId,
        /// This attempt.
        attempt_id: AttemptId,
        /// The tool.
        tool: String,
        /// SHA-256 of the canonical JSON arguments.
        arguments_sha256: String,
    },
    /// The answer to a call, whatever its outcome.
    ToolResult {
        /// The call.
        call_id: ToolCallId,
        /// The attempt, when the tool was invoked.
        attempt_id: Option<AttemptId>,
        /// The tool.
        tool: String,
        /// How it ended.
        outcome: Outcome,
        /// The text the model sees.
        content: String,
        /// Size of `content` in bytes.
        bytes: u64,
        /// The exact bytes `content` shows, base64, present only when `content` shows some
        /// of them as escapes (not UTF-8, or control bytes); see [`crate::RawBytes`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw: Option<crate::RawBytes>,
    },
    /// Shadow mode withheld a call; this is what it would have done.
    ShadowIntent {
        /// The call.
        call_id: ToolCallId,
        /// The tool.
        tool: String,
        /// Its arguments.
        arguments: serde_json::Value,
    },
    /// A schedule fired into this session (DESIGN.md §9 "Schedules and wakes"): recorded
    /// after the fire `(schedule_id, scheduled_at)` was claimed and before its turn starts.
    ScheduleFired {
        /// The schedule.
        schedule_id: uuid::Uuid,
        /// The slot this fire is for (not when it ran).
        scheduled_at: DateTime<Utc>,
    },
    /// The run parked on the intrinsic `wait` tool: the `run_suspended` (reason `waiting`)
    /// that follows ends it, and a wake with `wake_id` (or the deadline) resumes it with a
    /// new run whose first fact is the `tool_result` for `call_id`.
    WaitStarted {
        /// The `wait` call left open until the wake.
        call_id: ToolCallId,
        /// What resumes the run: `POST /v1/wakes/{wake_id}` or `keel wake WAKE_ID`.
        wake_id: String,
        /// What the agent said it waits for (its own words; shown, never interpreted).
        event: String,
        /// When the wait times out: the run resumes with `timed out`.
        deadline: DateTime<Utc>,
    },
    /// The run ended with a tool-free answer.
    RunCompleted {
        /// Why.
        reason: String,
        /// Usage totals for the run.
        usage: UsageTotals,
        /// The run's final text for a script to read: the answer of a completed run, the
        /// report of a suspended one; absent when there is none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        /// Wall-clock time from `run_started` to this event, in milliseconds; absent in
        /// ledgers written before keel recorded it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
    },
    /// The run ended in failure.
    RunFailed {
        /// Why.
        reason: String,
        /// Usage totals for the run.
        usage: UsageTotals,
        /// The run's final text for a script to read: the answer of a completed run, the
        /// report of a suspended one; absent when there is none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        /// Wall-clock time from `run_started` to this event, in milliseconds; absent in
        /// ledgers written before keel recorded it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
    },
    /// The run stopped early and can be resumed (budget, step ceiling, waiting).
    RunSuspended {
        /// Why.
        reason: String,
        /// Usage totals for the run.
        usage: UsageTotals,
        /// The run's final text for a script to read: the answer of a completed run, the
        /// report of a suspended one; absent when there is none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        /// Wall-clock time from `run_started` to this event, in milliseconds; absent in
        /// ledgers written before keel recorded it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
    },
    /// A permission denial finalized the turn (a refused `request_boundary`): the agent
    /// must not retry wider.
    RunDenied {
        /// Why.
        reason: String,
        /// Usage totals for the run.
        usage: UsageTotals,
        /// The run's final text for a script to read: the answer of a completed run, the
        /// report of a suspended one; absent when there is none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        /// Wall-clock time from `run_started` to this event, in milliseconds; absent in
        /// ledgers written before keel recorded it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
    },
    /// The run was cancelled; every open call was answered `cancelled`.
    RunCancelled {
        /// Why.
        reason: String,
        /// Usage totals for the run.
        usage: UsageTotals,
        /// The run's final text for a script to read: the answer of a completed run, the
        /// report of a suspended one; absent when there is none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        /// Wall-clock time from `run_started` to this event, in milliseconds; absent in
        /// ledgers written before keel recorded it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
    },
}

impl EventKind {
    /// The session status this event sets in the session listing: a run's start and end
    /// (`run_started` → running, `run_completed` → completed, …) and `session_sealed` →
    /// sealed; `None` for every other event, which leaves the status as it is. Stores fold
    /// it with [`crate::SessionStatus::then`] (sealing is final).
    pub fn session_status(&self) -> Option<crate::SessionStatus> {
        use crate::SessionStatus;
        match self {
            EventKind::SessionSealed { .. } => Some(SessionStatus::Sealed),
            EventKind::RunStarted { .. } => Some(SessionStatus::Running),
            EventKind::RunCompleted { .. } => Some(SessionStatus::Completed),
            EventKind::RunFailed { .. } => Some(SessionStatus::Failed),
            EventKind::RunSuspended { .. } => Some(SessionStatus::Suspended),
            EventKind::RunCancelled { .. } => Some(SessionStatus::Cancelled),
            EventKind::RunDenied { .. } => Some(SessionStatus::Denied),
            EventKind::SessionCreated { .. }
            | EventKind::TurnStarted { .. }
            | EventKind::ModelResponse { .. }
            | EventKind::RunComposition { .. }
            | EventKind::ModelRequested { .. }
            | EventKind::ModelRetry { .. }
            // A budget stop is settled by the `run_suspended` that follows it.
            | EventKind::BudgetExhausted { .. }
            | EventKind::Compaction { .. }
            | EventKind::CompactionFailed { .. }
            | EventKind::Checkpoint { .. }
            | EventKind::GateDecision { .. }
            | EventKind::PermissionRequested { .. }
            | EventKind::PermissionSettled { .. }
            | EventKind::ElicitationRequested { .. }
            | EventKind::ElicitationAnswered { .. }
            | EventKind::ToolsChanged { .. }
            | EventKind::BoundaryRevised { .. }
            | EventKind::ToolCall { .. }
            | EventKind::InputJoined { .. }
            | EventKind::PlanApproved { .. }
            | EventKind::ToolAttemptPrepared { .. }
            | EventKind::ToolResult { .. }
            | EventKind::ShadowIntent { .. }
            | EventKind::SkillCatalog { .. }
            | EventKind::SkillActivated { .. }
            | EventKind::ScheduleFired { .. }
            | EventKind::WaitStarted { .. } => None,
        }
    }

    /// The `kind` spelling on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::SessionCreated { .. } => "session_created",
            EventKind::SessionSealed { .. } => "session_sealed",
            EventKind::PlanApproved { .. } => "plan_approved",
            EventKind::TurnStarted { .. } => "turn_started",
            EventKind::InputJoined { .. } => "input_joined",
            EventKind::RunStarted { .. } => "run_started",
            EventKind::RunComposition { .. } => "run_composition",
            EventKind::ModelRequested { .. } => "model_requested",
            EventKind::ModelResponse { .. } => "model_response",
            EventKind::ModelRetry { .. } => "model_retry",
            EventKind::BudgetExhausted { .. } => "budget_exhausted",
            EventKind::Compaction { .. } => "compaction",
            EventKind::CompactionFailed { .. } => "compaction_failed",
            EventKind::Checkpoint { .. } => "checkpoint",
            EventKind::GateDecision { .. } => "gate_decision",
            EventKind::PermissionRequested { .. } => "permission_requested",
            EventKind::PermissionSettled { .. } => "permission_settled",
            EventKind::ElicitationRequested { .. } => "elicitation_requested",
            EventKind::ElicitationAnswered { .. } => "elicitation_answered",
            EventKind::ToolsChanged { .. } => "tools_changed",
            EventKind::ToolCall { .. } => "tool_call",
            EventKind::ToolAttemptPrepared { .. } => "tool_attempt_prepared",
            EventKind::ToolResult { .. } => "tool_result",
            EventKind::ShadowIntent { .. } => "shadow_intent",
            EventKind::RunCompleted { .. } => "run_completed",
            EventKind::RunFailed { .. } => "run_failed",
            EventKind::RunSuspended { .. } => "run_suspended",
            EventKind::RunCancelled { .. } => "run_cancelled",
            EventKind::RunDenied { .. } => "run_denied",
            EventKind::BoundaryRevised { .. } => "boundary_revised",
            EventKind::SkillCatalog { .. } => "skill_catalog",
            EventKind::SkillActivated { .. } => "skill_activated",
            EventKind::ScheduleFired { .. } => "schedule_fired",
            EventKind::WaitStarted { .. } => "wait_started",
        }
    }

    /// Whether this is a `model_response` of a conversation step (part of the history the
    /// projection builds), not one of keel's own calls such as a compaction summary.
    pub fn is_conversation_response(&self) -> bool {
        matches!(self, EventKind::ModelResponse { purpose: RequestPurpose::Conversation, .. })
    }

    /// Whether this kind ends a run.
    pub fn is_run_terminal(&self) -> bool {
        match self {
            EventKind::RunCompleted { .. }
            | EventKind::RunFailed { .. }
            | EventKind::RunSuspended { .. }
            | EventKind::RunCancelled { .. }
            | EventKind::RunDenied { .. } => true,
            EventKind::SessionCreated { .. }
            | EventKind::SessionSealed { .. }
            | EventKind::PlanApproved { .. }
            | EventKind::TurnStarted { .. }
            | EventKind::InputJoined { .. }
            | EventKind::RunStarted { .. }
            | EventKind::RunComposition { .. }
            | EventKind::ModelRequested { .. }
            | EventKind::ModelResponse { .. }
            | EventKind::ModelRetry { .. }
            | EventKind::BudgetExhausted { .. }
            | EventKind::Compaction { .. }
            | EventKind::CompactionFailed { .. }
            | EventKind::Checkpoint { .. }
            | EventKind::GateDecision { .. }
            | EventKind::PermissionRequested { .. }
            | EventKind::PermissionSettled { .. }
            | EventKind::ElicitationRequested { .. }
            | EventKind::ElicitationAnswered { .. }
            | EventKind::ToolsChanged { .. }
            | EventKind::ToolCall { .. }
            | EventKind::ToolAttemptPrepared { .. }
            | EventKind::ToolResult { .. }
            | EventKind::ShadowIntent { .. }
            | EventKind::SkillCatalog { .. }
            | EventKind::SkillActivated { .. }
            | EventKind::ScheduleFired { .. }
            | EventKind::WaitStarted { .. }
            | EventKind::BoundaryRevised { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn wire_shape_is_flat_with_snake_case_kind() {
        let event = RuntimeEvent {
            seq: Seq(6),
            session_id: SessionId(Uuid::nil()),
            turn_id: Some(TurnId(Uuid::nil())),
            run_id: None,
            ts: DateTime::from_timestamp(0, 0).unwrap(),
            kind: EventKind::ToolResult {
                call_id: "c1".into(),
                attempt_id: None,
                tool: "read_file".into(),
                outcome: Outcome::ShadowDenied,
                content: "x".into(),
                bytes: 1,
                raw: None,
            },
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind"], "tool_result");
        assert_eq!(json["seq"], 6);
        assert_eq!(json["outcome"], "shadow_denied");
        assert_eq!(json["run_id"], serde_json::Value::Null);
        assert_eq!(json["ts"], "1970-01-01T00:00:00Z");
        let back: RuntimeEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
        assert_eq!(back.kind.name(), "tool_result");
    }

    #[test]
    fn model_response_keeps_raw_usage_and_reads_events_written_before_it() {
        // An event written before `raw_usage` existed still reads, as "none reported".
        let old = serde_json::json!({"kind": "model_response", "text": "hi",
            "tool_calls": [], "usage": {"input_tokens": 3, "output_tokens": 1},
            "finish_reason": "stop", "cost_usd": null});
        let kind: EventKind = serde_json::from_value(old).unwrap();
        assert!(matches!(kind, EventKind::ModelResponse { raw_usage: None, .. }));
        let raw = serde_json::json!({"prompt_tokens": 3, "completion_tokens": 1,
            "total_tokens": 4, "completion_tokens_details": {"reasoning_tokens": 0}});
        let kind = EventKind::ModelResponse {
            text: "hi".into(),
            reasoning: Vec::new(),
            tool_calls: Vec::new(),
            usage: Usage { input_tokens: Some(3), output_tokens: Some(1), ..Usage::default() },
            raw_usage: Some(raw.clone()),
            finish_reason: FinishReason::Stop,
            cost_usd: None,
            estimated_usage: None,
            purpose: crate::RequestPurpose::Conversation,
        };
        let json = serde_json::to_value(&kind).unwrap();
        assert_eq!(json["raw_usage"], raw);
        assert_eq!(serde_json::from_value::<EventKind>(json).unwrap(), kind);
    }

    #[test]
    fn model_retry_wire_shape() {
        let kind = EventKind::ModelRetry {
            step: 3,
            attempt: 2,
            status: Some(429),
            error: "rate_limited".into(),
            message: "slow down".into(),
            wait_ms: 4000,
            purpose: RequestPurpose::Conversation,
        };
        let json = serde_json::to_value(&kind).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "model_retry", "step": 3, "attempt": 2, "status": 429,
                "error": "rate_limited", "message": "slow down", "wait_ms": 4000})
        );
        assert_eq!(serde_json::from_value::<EventKind>(json).unwrap(), kind);
        assert_eq!(kind.name(), "model_retry");
        assert!(!kind.is_run_terminal());
        let summary = EventKind::ModelRetry {
            step: 1,
            attempt: 3,
            status: None,
            error: "transport".into(),
            message: String::new(),
            wait_ms: 250,
            purpose: RequestPurpose::Compaction,
        };
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["purpose"], "compaction");
        assert!(json.get("status").is_none());
        assert_eq!(serde_json::from_value::<EventKind>(json).unwrap(), summary);
    }
}
