//! keel-contracts: the vocabulary every keel crate shares, and the decisions they must not
//! re-derive.
//!
//! This crate holds identities ([`SessionId`], [`TurnId`], [`RunId`], [`ToolCallId`],
//! [`AttemptId`], [`Seq`]), the durable ledger format ([`RuntimeEvent`] and [`EventKind`]),
//! the provider-neutral model messages ([`ModelRequest`], [`ModelResponse`]), tool
//! specifications ([`ToolSpec`]), the envelope and its pure decision functions
//! ([`authorize_tool_invocation`], [`effects_require_consent`], [`executes_in_shadow`]), and
//! the traits through which the kernel reaches the outside world ([`Store`],
//! [`ModelClient`], [`Tool`], [`Clock`], [`IdGen`]).
//!
//! Invariants:
//! - No I/O and no async runtime: everything here is data, pure functions or traits.
//! - Anything serialized or hashed uses ordered collections, so digests are byte-stable.
//! - Every policy decision lives here as a pure function; the kernel records its answer
//!   verbatim and nothing else re-interprets the envelope.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod budget;
mod children;
mod clock;
mod context;
mod elicit;
mod envelope;
mod event;
mod exact;
mod fence;
mod ids;
mod message;
mod model;
mod pricing;
mod rules;
mod store;
mod tool;

pub use budget::{Budget, BudgetVerdict, Spent, check_budget, effective_usage, usage_tokens};
pub use children::{REFUSAL_CHILD_TOOLS, child_allowance};
pub use clock::{Clock, IdGen, SystemClock, UuidV7Ids};
pub use context::{
    ApproxCounter, ContextPolicy, MESSAGE_OVERHEAD_TOKENS, TokenCounter, estimate_message_tokens,
    estimate_messages_tokens, estimate_request_tokens,
};
pub use elicit::{
    ElicitationAction, ElicitationAnswer, ElicitationRequest, Elicitor, FieldKind, FormField,
    FormSchema, MAX_ENUM_VALUES, MAX_FORM_FIELDS, MAX_STRING_ANSWER,
};
pub use envelope::{
    Authorization, Envelope, ExecutionMode, REFUSAL_BOUNDARY_DENIED, REFUSAL_FORBIDDEN,
    REFUSAL_NOT_IN_READS, REFUSAL_NOT_IN_WRITES, REFUSAL_PERMISSION_DENIED, REFUSAL_PLAN,
    REFUSAL_SHADOW, Scope, authorize_tool_invocation, effects_require_consent, executes_in_plan,
    executes_in_shadow, requires_consent,
};
pub use event::{
    ActivatedSkill, ApprovalMode, Boundary, CarriedContext, Decision, DigestChain, EventKind,
    Evidence, FailureCount, Lineage, PermissionAnswer, RuntimeEvent, SandboxMode, TurnFailures,
    UsageTotals,
};
pub use exact::{
    ExactText, RawBytes, escape_into, escape_note, incomplete_suffix_len, orphan_prefix_len,
    prefix_chars,
};
pub use fence::{
    NEUTRALISED_MARKER, TOOL_OUTPUT_POLICY, UNTRUSTED_POLICY, fence_untrusted, neutralise_markers,
    source_line,
};
pub use ids::{AttemptId, RunId, Seq, SessionId, ToolCallId, TurnId};
pub use message::{
    FinishReason, Message, ModelRequest, ModelResponse, ReasoningPart, RequestPurpose, RetryNotice,
    StreamDelta, ToolCall, ToolChoice, ToolDefinition, ToolSchema, Usage,
};
pub use model::{ModelClient, ModelError, ModelErrorKind, ModelInfo};
pub use pricing::{Price, cost_usd};
pub use rules::{
    CallFacts, CommandLine, DeniedPaths, PATH_RULE, PermissionRules, Rule, RuleError,
    SimpleCommand, TOOL_WILDCARD_REFUSAL, check_tool_name_pattern, tool_name_covers,
};
pub use store::{
    AppendError, Lease, LeaseError, ReadError, ResolveError, SESSION_TITLE_MAX_CHARS,
    SessionStatus, SessionSummary, Store, session_title,
};
pub use tool::{
    Access, Effects, Egress, Outcome, Tool, ToolContext, ToolOutput, ToolSource, ToolSpec,
    arguments_sha256, sha256_hex,
};
