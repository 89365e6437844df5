//! The ledger's unit: [`RuntimeEvent`], and the kinds of fact it records (DESIGN.md §1, §9).
//!
//! This is a durable format. Field names and `kind` spellings are stable; new kinds and
//! new optional fields may be added, nothing is renamed as a side effect.

mod boundary;
mod checkpoint;
mod compaction;
mod kind;
mod lineage;
mod permission;
mod usage;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use boundary::{Boundary, SandboxMode};
pub use checkpoint::Evidence;
pub use compaction::{ActivatedSkill, CarriedContext, DigestChain, FailureCount, TurnFailures};
pub use lineage::Lineage;
pub use permission::{ApprovalMode, Decision, PermissionAnswer};
pub use usage::UsageTotals;

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

fn is_zero(value: &u64) -> bool {
    *value == 0
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
