//! The person an ACP session's [`keel_host::approval::Approver`] asks: the client, through
//! `session/request_permission`.
//!
//! - `allow_once` allows the call; `allow_always` is a grant for this session
//!   (`allow_session`); `reject_once` denies the call; `reject_always` denies it and every
//!   later call of that tool in this session without asking (kept in the ledger as the
//!   settlement's `by`, so it holds after `session/load` too).
//! - The wait is bounded: no answer in time is a deny, and the reason is recorded.
//! - A cancelled request (the turn was cancelled) is a deny.
//! - A server's question (MCP elicitation) is asked with ACP's `elicitation/create`
//!   (form mode, scoped to the session and the tool call) when the client offered form
//!   elicitation in `initialize`; otherwise it is declined with that reason. The wait is
//!   bounded by the same timeout (then it is a cancel).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    ToolCallUpdate, ToolCallUpdateFields,
};
use async_trait::async_trait;
use keel_contracts::{ElicitationAnswer, EventKind, PermissionAnswer, RuntimeEvent, SessionId};
use keel_kernel::{ElicitationQuestion, PermissionHook, PermissionRequest};

/// `by` of a settlement the client answered with `reject_always`.
pub const BY_REJECT_ALWAYS: &str = "client: reject_always";

/// Option ids offered in every request, and the answers they stand for.
const OPTIONS: [(&str, &str, PermissionOptionKind); 4] = [
    ("allow_once", "Allow once", PermissionOptionKind::AllowOnce),
    ("allow_always", "Allow for this session", PermissionOptionKind::AllowAlways),
    ("reject_once", "Reject", PermissionOptionKind::RejectOnce),
    ("reject_always", "Reject for this session", PermissionOptionKind::RejectAlways),
];

/// Asks the ACP client. See the module doc.
pub struct ClientPerson {
    cx: ConnectionTo<Client>,
    session: Arc<OnceLock<SessionId>>,
    timeout: Duration,
    rejected: Mutex<HashSet<String>>,
    /// Whether the client offered form elicitation.
    elicits: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for ClientPerson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientPerson").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl ClientPerson {
    /// A person for one session (its id in `session` once known); `history` is the
    /// session's ledger so far (the tools the client rejected for the session stay
    /// rejected). A child agent's request is asked in the session the client knows.
    pub fn new(
        cx: ConnectionTo<Client>,
        session: Arc<OnceLock<SessionId>>,
        timeout: Duration,
        history: &[RuntimeEvent],
        elicits: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        let rejected = rejected_for_the_session(history);
        ClientPerson { cx, session, timeout, rejected: Mutex::new(rejected), elicits }
    }

    fn rejected(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.rejected.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The tools the client answered `reject_always` for in `history`: denied for the rest of
/// the session, whatever the approval mode (a later `session/set_mode auto` does not ask,
/// so the assembly also turns these into deny rules).
pub fn rejected_for_the_session(history: &[RuntimeEvent]) -> HashSet<String> {
    history
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::PermissionSettled { tool, by, answer: PermissionAnswer::Deny, .. }
                if by == BY_REJECT_ALWAYS =>
            {
                Some(tool.clone())
            }
            _ => None,
        })
        .collect()
}

/// Who answered a question through the ACP client.
const BY_CLIENT: &str = "client";

#[async_trait]
impl PermissionHook for ClientPerson {
    async fn elicit(&self, question: &ElicitationQuestion<'_>) -> ElicitationAnswer {
        use agent_client_protocol::v1::schema::{CreateElicitationRequest, ElicitationAction};
        if !self.elicits.load(std::sync::atomic::Ordering::Relaxed) {
            return ElicitationAnswer::decline(
                "keel",
                "the ACP client does not offer elicitation (clientCapabilities.elicitation.form)",
            );
        }
        let session = self.session.get().copied().unwrap_or(question.session_id);
        let request = serde_json::json!({
            "mode": "form",
            "sessionId": session.to_string(),
            "toolCallId": question.call_id.as_str(),
            "message": format!(
                "MCP server '{}' asks (its words, not keel's): {}",
                keel_host::terminal::one_line(&question.request.server, 60),
                question.request.message
            ),
            "requestedSchema": question.request.schema,
        });
        let request: CreateElicitationRequest = match serde_json::from_value(request) {
            Ok(request) => request,
            Err(error) => {
                let text = keel_host::terminal::one_line(&error.to_string(), 200);
                return ElicitationAnswer::decline(
                    "keel",
                    format!("the form cannot be put in an ACP request: {text}"),
                );
            }
        };
        let sent = self.cx.send_request(request);
        let response = match tokio::time::timeout(self.timeout, sent.block_task()).await {
            Err(_) => {
                return ElicitationAnswer::cancel(
                    BY_CLIENT,
                    format!(
                        "client: no answer within {}s (permission timeout)",
                        self.timeout.as_secs()
                    ),
                );
            }
            Ok(Err(error)) => {
                let text = keel_host::terminal::one_line(&error.to_string(), 200);
                return ElicitationAnswer::cancel(
                    BY_CLIENT,
                    format!("client: the request failed: {text}"),
                );
            }
            Ok(Ok(response)) => response,
        };
        match response.action {
            ElicitationAction::Accept(accepted) => {
                let content = serde_json::to_value(accepted.content.unwrap_or_default())
                    .unwrap_or_else(|_| serde_json::json!({}));
                ElicitationAnswer::accept(content, BY_CLIENT)
            }
            ElicitationAction::Decline => ElicitationAnswer::decline(BY_CLIENT, "client: declined"),
            ElicitationAction::Cancel => ElicitationAnswer::cancel(BY_CLIENT, "client: cancelled"),
            _ => ElicitationAnswer::decline(BY_CLIENT, "client: an answer keel does not know"),
        }
    }

    async fn decide(&self, request: &PermissionRequest<'_>) -> (PermissionAnswer, String) {
        if self.rejected().contains(request.tool) {
            return (
                PermissionAnswer::Deny,
                "client: reject_always, earlier in this session".to_owned(),
            );
        }
        let call = ToolCallUpdate::new(
            request.call_id.as_str().to_owned(),
            ToolCallUpdateFields::new()
                .title(crate::render::title(request.tool, request.arguments))
                .kind(crate::render::kind_of(request.tool))
                .raw_input(request.arguments.clone()),
        );
        let options = OPTIONS
            .iter()
            .map(|(id, name, kind)| PermissionOption::new(*id, *name, *kind))
            .collect();
        let session = self.session.get().copied().unwrap_or(request.session_id);
        let sent =
            self.cx.send_request(RequestPermissionRequest::new(session.to_string(), call, options));
        let answer = match tokio::time::timeout(self.timeout, sent.block_task()).await {
            Err(_) => {
                return (
                    PermissionAnswer::Deny,
                    format!(
                        "client: no answer within {}s (permission timeout)",
                        self.timeout.as_secs()
                    ),
                );
            }
            Ok(Err(error)) => {
                let text = keel_host::terminal::one_line(&error.to_string(), 200);
                return (PermissionAnswer::Deny, format!("client: the request failed: {text}"));
            }
            Ok(Ok(response)) => response.outcome,
        };
        match answer {
            RequestPermissionOutcome::Selected(selected) => match &*selected.option_id.0 {
                "allow_once" => (PermissionAnswer::AllowOnce, "client: allow_once".to_owned()),
                "allow_always" => {
                    (PermissionAnswer::AllowSession, "client: allow_always".to_owned())
                }
                "reject_once" => (PermissionAnswer::Deny, "client: reject_once".to_owned()),
                "reject_always" => {
                    self.rejected().insert(request.tool.to_owned());
                    (PermissionAnswer::Deny, BY_REJECT_ALWAYS.to_owned())
                }
                other => (
                    PermissionAnswer::Deny,
                    format!(
                        "client: unknown option '{}', taken as reject",
                        keel_host::terminal::one_line(other, 60)
                    ),
                ),
            },
            RequestPermissionOutcome::Cancelled => {
                (PermissionAnswer::Deny, "client: cancelled".to_owned())
            }
            _ => (PermissionAnswer::Deny, "client: an answer keel does not know".to_owned()),
        }
    }
}
