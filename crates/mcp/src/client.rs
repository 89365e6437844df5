//! [`KeelClient`]: keel's side of an MCP session (rmcp's `ClientHandler`): what keel tells
//! servers about itself, and its answers to what servers ask of it.
//!
//! - `elicitation/create` (a server asks the user a question) is asked through the
//!   [`keel_contracts::Elicitor`] of the tool call of that server that is running (the
//!   kernel records it in the ledger and asks through the run's consent channel). A question
//!   that comes when no call of the server is running is declined: a server does not get to
//!   talk to the user on its own. A call made without an elicitor (`keel mcp` commands, the
//!   conformance client) is answered by the [`ElicitationPolicy`]: declined, or under
//!   `--approval auto` a form whose schema gives a default for every required field is
//!   accepted with the defaults. A URL elicitation (open this page) is always declined.
//!   While a question is open, the call's tool timeout does not run. Every answer is kept
//!   as an [`Elicitation`].
//! - `sampling/createMessage` is refused with an error that says keel does not lend its
//!   model to servers (keel does not offer the capability either).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use keel_contracts::{ElicitationAnswer, ElicitationRequest, Elicitor};

// Sampling is deprecated by SEP-2577; keel refuses it, and names its types to do so.
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, ErrorCode, FormElicitationCapability, Implementation, ProtocolVersion,
};
#[allow(deprecated)]
use rmcp::model::{CreateMessageRequestParams, CreateMessageResult};
use rmcp::service::RequestContext;
use rmcp::{ClientHandler, ErrorData, RoleClient};

/// How a server's `elicitation/create` is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ElicitationPolicy {
    /// Decline every request, saying why (no one can be asked: a headless run).
    #[default]
    Decline,
    /// Accept a form whose schema gives a default for every required field, with the
    /// defaults (every defaulted field filled in); decline any other (`--approval auto`).
    AcceptDefaults,
}

/// One `elicitation/create` and keel's answer, in the order they came.
#[derive(Debug, Clone, PartialEq)]
pub struct Elicitation {
    /// The server's name.
    pub server: String,
    /// The server's message to the user (untrusted text: fence it before a model sees it).
    pub message: String,
    /// `accept`, `decline` or `cancel`.
    pub action: &'static str,
    /// What was sent back (the defaults), for an accepted form.
    pub content: Option<serde_json::Value>,
    /// Why it was declined.
    pub reason: Option<String>,
}

/// keel's client handler for one server.
#[derive(Debug, Clone)]
pub(crate) struct KeelClient {
    server: String,
    policy: ElicitationPolicy,
    answered: Arc<Mutex<Vec<Elicitation>>>,
    /// The tool calls of this server running now, oldest first.
    active: Arc<Mutex<Vec<ActiveCall>>>,
    /// Where this server's current tools go when it says its list changed.
    lists: Option<(Arc<ToolLists>, usize)>,
    /// The server's handle, once made (for building its tools anew).
    handle: Arc<std::sync::OnceLock<std::sync::Weak<crate::server::ServerHandle>>>,
}

/// Every server's current tools, in configuration order: the composition root hands it to
/// the kernel as its [`keel_contracts::ToolSource`]; a server's `tools/list_changed`
/// replaces its list and moves the generation.
#[derive(Debug, Default)]
pub(crate) struct ToolLists {
    lists: Mutex<Vec<Vec<Arc<crate::McpTool>>>>,
    generation: std::sync::atomic::AtomicU64,
}

impl ToolLists {
    /// Sets server `index`'s tools; `changed` moves the generation.
    pub(crate) fn set(&self, index: usize, tools: Vec<Arc<crate::McpTool>>, changed: bool) {
        let mut lists = self.lists.lock().unwrap_or_else(PoisonError::into_inner);
        if lists.len() <= index {
            lists.resize_with(index + 1, Vec::new);
        }
        lists[index] = tools;
        if changed {
            self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Every server's current tools.
    pub(crate) fn current(&self) -> Vec<Arc<crate::McpTool>> {
        let lists = self.lists.lock().unwrap_or_else(PoisonError::into_inner);
        lists.iter().flatten().cloned().collect()
    }
}

impl keel_contracts::ToolSource for ToolLists {
    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn tools(&self) -> Vec<Arc<dyn keel_contracts::Tool>> {
        self.current().into_iter().map(|tool| tool as Arc<dyn keel_contracts::Tool>).collect()
    }
}

/// One running tool call: who asks its questions, and how long they kept the user.
#[derive(Debug, Clone)]
struct ActiveCall {
    id: u64,
    elicitor: Option<Arc<dyn Elicitor>>,
    pause: Arc<Pause>,
    /// Closed when the call ends: a question still open then is abandoned.
    ended: tokio::sync::watch::Receiver<()>,
}

/// The time a call's questions were open, which its tool timeout does not count.
#[derive(Debug, Default)]
pub(crate) struct Pause {
    state: Mutex<PauseState>,
}

#[derive(Debug, Default)]
struct PauseState {
    open: usize,
    since: Option<Instant>,
    total: Duration,
}

impl Pause {
    fn open(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.open == 0 {
            state.since = Some(Instant::now());
        }
        state.open += 1;
    }

    fn close(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.open = state.open.saturating_sub(1);
        if state.open == 0
            && let Some(since) = state.since.take()
        {
            state.total += since.elapsed();
        }
    }

    /// The time questions were open so far.
    pub(crate) fn paused(&self) -> Duration {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.total + state.since.map(|since| since.elapsed()).unwrap_or_default()
    }
}

/// Removes its call from the running ones when the call ends (or is dropped).
pub(crate) struct CallGuard {
    active: Arc<Mutex<Vec<ActiveCall>>>,
    id: u64,
    pub(crate) pause: Arc<Pause>,
    /// Dropped with the guard, which closes the call's `ended`.
    _ending: tokio::sync::watch::Sender<()>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
        active.retain(|call| call.id != self.id);
    }
}

static NEXT_CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl KeelClient {
    pub(crate) fn new(
        server: &str,
        policy: ElicitationPolicy,
        answered: Arc<Mutex<Vec<Elicitation>>>,
        lists: Option<(Arc<ToolLists>, usize)>,
    ) -> KeelClient {
        KeelClient {
            server: server.to_owned(),
            policy,
            answered,
            active: Arc::default(),
            lists,
            handle: Arc::default(),
        }
    }

    /// Names the server's handle (once it exists), for refreshing its tools.
    pub(crate) fn set_handle(&self, handle: &Arc<crate::server::ServerHandle>) {
        let _ = self.handle.set(Arc::downgrade(handle));
    }

    /// Where this server's tools are kept, and its index there.
    pub(crate) fn tool_lists(&self) -> Option<&(Arc<ToolLists>, usize)> {
        self.lists.as_ref()
    }

    /// Marks a tool call of this server as running until the guard is dropped; its
    /// questions go to `elicitor`.
    pub(crate) fn begin_call(&self, elicitor: Option<Arc<dyn Elicitor>>) -> CallGuard {
        let id = NEXT_CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pause = Arc::new(Pause::default());
        let (ending, ended) = tokio::sync::watch::channel(());
        let mut active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
        active.push(ActiveCall { id, elicitor, pause: pause.clone(), ended });
        CallGuard { active: self.active.clone(), id, pause, _ending: ending }
    }

    /// The newest running call (questions cannot name their call; several calls of one
    /// server at once are rare: side-by-side reads).
    fn running_call(&self) -> Option<ActiveCall> {
        self.active.lock().unwrap_or_else(PoisonError::into_inner).last().cloned()
    }

    fn keep(&self, record: Elicitation) {
        if let Ok(mut answered) = self.answered.lock() {
            answered.push(record);
        }
    }
}

/// Why a question that comes while no call of its server runs is declined.
pub(crate) fn no_call_running(server: &str) -> String {
    format!(
        "no tool call of MCP server '{server}' is running: keel asks the user only during a \
         call it made to the server"
    )
}

/// The protocol version keel offers in `initialize`: the newest one that still has an
/// `initialize` handshake. rmcp's `LATEST` (2026-07-28) dropped the handshake, so a client
/// that names it in `initialize` offers something the server cannot answer in kind.
pub(crate) const OFFERED_PROTOCOL_VERSION: ProtocolVersion =
    ProtocolVersion::LATEST_WITH_INITIALIZE;

/// What keel tells servers about itself: name, version, the offered protocol version, and
/// form elicitation (answered by policy; never sampling or roots).
pub(crate) fn client_info() -> ClientConfig {
    let mut capabilities = ClientCapabilities::default();
    let mut elicitation = ElicitationCapability::default();
    elicitation.form = Some(FormElicitationCapability::default());
    capabilities.elicitation = Some(elicitation);
    ClientConfig::new(capabilities, Implementation::new("keel", env!("CARGO_PKG_VERSION")))
        .with_protocol_version(OFFERED_PROTOCOL_VERSION)
}

impl ClientHandler for KeelClient {
    fn get_info(&self) -> ClientConfig {
        client_info()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let value = serde_json::to_value(&request).unwrap_or_default();
        let message = value["message"].as_str().unwrap_or_default().to_owned();
        let url = value["mode"].as_str() == Some("url") || value.get("url").is_some();
        let routed = match self.running_call() {
            _ if url => None,
            None => {
                self.keep(Elicitation {
                    server: self.server.clone(),
                    message,
                    action: "decline",
                    content: None,
                    reason: Some(no_call_running(&self.server)),
                });
                return Ok(ElicitResult::new(ElicitationAction::Decline));
            }
            Some(call) => call.elicitor.clone().map(|elicitor| (elicitor, call.pause, call.ended)),
        };
        let Some((elicitor, pause, mut ended)) = routed else {
            // No one to route to: keel's fixed policy (URL mode is always declined).
            let (message, answer) = answer(self.policy, &request);
            self.keep(Elicitation {
                server: self.server.clone(),
                message,
                action: if answer.is_ok() { "accept" } else { "decline" },
                content: answer.as_ref().ok().cloned(),
                reason: answer.as_ref().err().cloned(),
            });
            return Ok(match answer {
                Ok(content) => ElicitResult::new(ElicitationAction::Accept).with_content(content),
                Err(_) => ElicitResult::new(ElicitationAction::Decline),
            });
        };
        let asked = ElicitationRequest {
            server: self.server.clone(),
            message: message.clone(),
            schema: value["requestedSchema"].clone(),
        };
        pause.open();
        // The question is abandoned (and recorded as cancelled by the kernel) when the
        // server cancels it or the call it came during ends without it.
        let answer: ElicitationAnswer = tokio::select! {
            answer = elicitor.elicit(asked) => answer,
            _ = ended.changed() => ElicitationAnswer::cancel(
                "keel",
                "the call ended before the question was answered",
            ),
            () = context.ct.cancelled() => {
                ElicitationAnswer::cancel("keel", "the server cancelled its question")
            }
        };
        pause.close();
        self.keep(Elicitation {
            server: self.server.clone(),
            message,
            action: answer.action.as_str(),
            content: answer.content.clone(),
            reason: answer.reason.clone(),
        });
        Ok(match answer.action {
            keel_contracts::ElicitationAction::Accept => {
                let content = answer.content.unwrap_or_else(|| serde_json::json!({}));
                ElicitResult::new(ElicitationAction::Accept).with_content(content)
            }
            keel_contracts::ElicitationAction::Decline => {
                ElicitResult::new(ElicitationAction::Decline)
            }
            keel_contracts::ElicitationAction::Cancel => {
                ElicitResult::new(ElicitationAction::Cancel)
            }
        })
    }

    /// The server's tools changed: list them again and replace its tools (gated like the
    /// others: access comes from the user's config and the transport, as at start). The
    /// kernel offers the new list from its next step on. A failed listing keeps the old list.
    async fn on_tool_list_changed(&self, context: rmcp::service::NotificationContext<RoleClient>) {
        let Some((lists, index)) = &self.lists else { return };
        let Some(server) = self.handle.get().and_then(std::sync::Weak::upgrade) else { return };
        let listed =
            tokio::time::timeout(server.startup_timeout(), context.peer.list_all_tools()).await;
        let Ok(Ok(listed)) = listed else {
            server.note("tools/list_changed: listing the tools again failed; the old list stays");
            return;
        };
        let offers_resources =
            context.peer.peer_info().is_some_and(|info| info.capabilities.resources.is_some());
        let (tools, _, _) = crate::tool::build_tools(&server, &listed, offers_resources);
        lists.set(*index, tools, true);
    }

    #[allow(deprecated)]
    async fn create_message(
        &self,
        _request: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "sampling is not supported: keel does not lend its model to MCP servers",
            None,
        ))
    }
}

/// The request's message and keel's answer: the content to accept with, or why it is
/// declined.
fn answer(
    policy: ElicitationPolicy,
    request: &ElicitRequestParams,
) -> (String, Result<serde_json::Value, String>) {
    let value = serde_json::to_value(request).unwrap_or_default();
    let message = value["message"].as_str().unwrap_or_default().to_owned();
    if value["mode"].as_str() == Some("url") || value.get("url").is_some() {
        return (message, Err("keel does not open pages that a server asks for".to_owned()));
    }
    let answer = match policy {
        ElicitationPolicy::Decline => {
            Err("no one can answer in this run (with `--approval auto`, a form whose fields all \
             have defaults is accepted with them)"
                .to_owned())
        }
        ElicitationPolicy::AcceptDefaults => {
            keel_contracts::FormSchema::parse(&value["requestedSchema"])
                .map_err(|why| format!("keel refuses this form: {why}"))
                .and_then(|form| {
                    form.defaults()
                        .map_err(|missing| format!("{missing} and no one can answer in this run"))
                })
        }
    };
    (message, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(schema: serde_json::Value) -> ElicitRequestParams {
        serde_json::from_value(serde_json::json!({
            "mode": "form", "message": "Pick", "requestedSchema": schema
        }))
        .unwrap()
    }

    #[test]
    fn elicitation_answers_table() {
        let all_defaults = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "Ann"},
            "age": {"type": "integer", "default": 30},
            "ok": {"type": "boolean", "default": true},
            "note": {"type": "string"}
        }, "required": ["name", "age"]});
        let missing = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "Ann"},
            "token": {"type": "string"}
        }, "required": ["name", "token"]});
        let (message, accepted) =
            answer(ElicitationPolicy::AcceptDefaults, &form(all_defaults.clone()));
        assert_eq!(message, "Pick");
        assert_eq!(accepted, Ok(serde_json::json!({"name": "Ann", "age": 30, "ok": true})));
        let (_, refused) = answer_of(ElicitationPolicy::AcceptDefaults, missing);
        assert!(refused.unwrap_err().contains("token"));
        let (_, refused) = answer_of(ElicitationPolicy::Decline, all_defaults);
        assert!(refused.unwrap_err().contains("--approval auto"));
        let url: ElicitRequestParams = serde_json::from_value(serde_json::json!({
            "mode": "url", "message": "Log in", "url": "https://example.com/x",
            "elicitationId": "e1"
        }))
        .unwrap();
        let (_, refused) = answer(ElicitationPolicy::AcceptDefaults, &url);
        assert!(refused.unwrap_err().contains("does not open pages"));
    }

    fn answer_of(
        policy: ElicitationPolicy,
        schema: serde_json::Value,
    ) -> (String, Result<serde_json::Value, String>) {
        answer(policy, &form(schema))
    }

    #[test]
    fn keel_offers_form_elicitation_and_not_sampling() {
        let info = client_info();
        assert!(info.capabilities.elicitation.as_ref().is_some_and(|e| e.form.is_some()));
        assert!(info.capabilities.sampling.is_none());
    }

    #[test]
    fn keel_offers_the_newest_version_that_has_an_initialize_handshake() {
        let newest = ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .filter(|version| version.has_initialize())
            .max_by(|a, b| a.as_str().cmp(b.as_str()))
            .unwrap();
        assert_eq!(&OFFERED_PROTOCOL_VERSION, newest);
        assert_eq!(client_info().protocol_version, OFFERED_PROTOCOL_VERSION);
    }
}
