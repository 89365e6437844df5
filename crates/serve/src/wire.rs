//! The request bodies and query strings of the HTTP API (DESIGN.md §9), apart from the
//! handlers that read them. Unknown fields are refused (`deny_unknown_fields`), so a typo
//! in a client is a 400, never a setting silently left out.

use keel_contracts::{ApprovalMode, ExecutionMode, PermissionAnswer};
use keel_host::schedule::Overlap;
use serde::Deserialize;

/// A scope as a flag spells it, or as a list of tool names.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum ScopeText {
    Text(String),
    List(Vec<String>),
}

impl ScopeText {
    /// The scope as `keel run`'s flag spells it (`all`, `read_file,grep`).
    pub(crate) fn flag(self) -> String {
        match self {
            ScopeText::Text(text) => text,
            ScopeText::List(names) => names.join(","),
        }
    }
}

/// `envelope` of `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnvelopeBody {
    pub(crate) reads: Option<ScopeText>,
    pub(crate) writes: Option<ScopeText>,
    pub(crate) forbid: Option<ScopeText>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateBody {
    pub(crate) workspace: String,
    pub(crate) model: Option<String>,
    pub(crate) base_url: Option<String>,
    pub(crate) envelope: Option<EnvelopeBody>,
    pub(crate) mode: Option<ExecutionMode>,
    pub(crate) approval: Option<ApprovalMode>,
}

/// `POST /v1/sessions/{id}/turns`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct TurnBody {
    pub(crate) input: String,
    pub(crate) max_steps: Option<u32>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_cost_usd: Option<f64>,
    pub(crate) max_time: Option<String>,
}

/// `POST /v1/sessions/{id}/input`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InputBody {
    pub(crate) input: String,
}

/// `POST /v1/sessions/{id}/seal` (the body is optional).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct SealBody {
    pub(crate) reason: Option<String>,
}

/// `GET /v1/sessions/{id}/events?after=SEQ`.
#[derive(Debug, Deserialize)]
pub(crate) struct EventsQuery {
    pub(crate) after: Option<String>,
}

/// `POST /v1/sessions/{id}/permissions/{call_id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnswerBody {
    pub(crate) answer: PermissionAnswer,
}

/// `POST /v1/sessions/{id}/questions/{question}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QuestionBody {
    pub(crate) action: keel_contracts::ElicitationAction,
    #[serde(default)]
    pub(crate) content: Option<serde_json::Value>,
}

/// `POST /v1/schedules`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScheduleBody {
    pub(crate) every: Option<String>,
    pub(crate) cron: Option<String>,
    pub(crate) tz: Option<String>,
    pub(crate) session_id: Option<String>,
    pub(crate) workspace: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) task: String,
    pub(crate) approval: Option<ApprovalMode>,
    pub(crate) max_steps: Option<u32>,
    pub(crate) max_cost_usd: Option<f64>,
    pub(crate) overlap: Option<Overlap>,
    pub(crate) catch_up: Option<String>,
}

/// `POST /v1/wakes/{wake_id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WakeBody {
    #[serde(default)]
    pub(crate) payload: serde_json::Value,
}
