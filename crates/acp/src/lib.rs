//! `keel acp`: keel as an Agent Client Protocol v1 agent on stdio (DESIGN.md §9 "ACP
//! agent"), with the official `agent-client-protocol` crate.
//!
//! - One identity: the ACP `sessionId` is the keel session id.
//! - Each session is built by the composition root ([`keel_host::root::prepare`] and
//!   [`keel_host::root::assemble`]) for its `cwd`, with workspace trust as everywhere; the
//!   client's MCP servers join the config's as the user's own (the client is the user's
//!   editor) and their calls are gated like any other.
//! - Updates come from ledger events through [`render::Renderer`], the same projection
//!   `session/load` replays.
//! - Consent goes through [`keel_host::approval::Approver`]; the person it asks is the client
//!   ([`person::ClientPerson`], `session/request_permission`), with a bounded wait.
//! - A client that disconnects mid-turn cancels the turn; the run is recorded as cancelled
//!   before the process exits.
//! - A `session/prompt` while a turn runs is queued into that turn (steering): it joins at
//!   the run's next step boundary (`input_joined`) and is answered with the turn's stop
//!   reason when the turn ends; one sent as the turn ends is refused (send it again).

pub mod person;
pub mod render;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, CurrentModeUpdate,
    EmbeddedResourceResource, Implementation, InitializeRequest, InitializeResponse,
    ListSessionsRequest, ListSessionsResponse, LoadSessionRequest, LoadSessionResponse,
    McpCapabilities, McpServer, NewSessionRequest, NewSessionResponse, PromptCapabilities,
    PromptRequest, PromptResponse, SessionCapabilities, SessionInfo, SessionListCapabilities,
    SessionMode, SessionModeState, SessionNotification, SessionUpdate, SetSessionModeRequest,
    SetSessionModeResponse, StopReason,
};
use agent_client_protocol::{Agent, Client, Stdio};
use keel_contracts::{
    ApprovalMode, EventKind, FinishReason, RuntimeEvent, Seq, SessionId, Store, StreamDelta,
};
use keel_kernel::{
    Cancellation, Joined, Observer, PermissionHook, SessionConfig, Steering, TurnOutcome,
};
use tokio::task::JoinHandle;

use keel_host::root::{self, Assembly, RunSettings, SessionFacts};

/// What `keel acp` was started with.
#[derive(Debug, Clone)]
pub struct AcpOptions {
    /// Settings from the command line (model, endpoint, approval, sandbox, budgets).
    pub settings: RunSettings,
    /// How long a `session/request_permission` may stay unanswered; then it is a deny
    /// with that reason recorded.
    pub permission_timeout: Duration,
}

/// Serves ACP on stdin/stdout until the client closes stdin (or SIGTERM/SIGINT); then
/// cancels every running turn and waits for its run to be recorded.
///
/// # Errors
///
/// The ledger cannot be opened, or the connection fails (not a malformed message: the
/// crate answers those and goes on).
///
/// # Cancel safety
///
/// Not cancel safe: dropping it leaves running turns to be repaired by the next keel.
pub async fn serve(options: AcpOptions) -> anyhow::Result<()> {
    let (home, store) = root::open_store().await?;
    let agent = Arc::new(AcpAgent {
        home,
        store,
        options,
        sessions: Mutex::new(HashMap::new()),
        turns: Mutex::new(Vec::new()),
        client_elicits: Arc::default(),
    });
    // The editor closing stdin ends the connection; an editor (or a supervisor) that
    // sends SIGTERM or SIGINT instead gets the same orderly end.
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let signalled = async {
        match terminate.as_mut() {
            Some(term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    let served = tokio::select! {
        served = connect(agent.clone()) => served,
        () = signalled => Ok(()),
    };
    // The client is gone (or the connection failed): no turn may go on unwatched.
    let sessions: Vec<Arc<Live>> = lock(&agent.sessions).values().cloned().collect();
    for session in &sessions {
        if let Some(running) = lock(&session.running).as_ref() {
            running.cancel.cancel();
        }
    }
    let turns: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&agent.turns));
    for turn in turns {
        let _ = turn.await;
    }
    for session in sessions {
        session.assembly.outbox.finish().await;
        session.assembly.mcp.close().await;
    }
    served.map_err(|error| anyhow::anyhow!("the ACP connection failed: {error}"))
}

async fn connect(agent: Arc<AcpAgent>) -> Result<(), agent_client_protocol::Error> {
    let (a1, a2, a3, a4, a5, a6) =
        (agent.clone(), agent.clone(), agent.clone(), agent.clone(), agent.clone(), agent.clone());
    let a0 = agent.clone();
    Agent
        .v1()
        .name("keel")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                let elicits = request
                    .client_capabilities
                    .elicitation
                    .as_ref()
                    .is_some_and(|offered| offered.form.is_some());
                a0.client_elicits.store(elicits, std::sync::atomic::Ordering::Relaxed);
                responder.respond(AcpAgent::initialize())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, cx: ConnectionTo<Client>| match a1
                .new_session(request, cx)
                .await
            {
                Ok(response) => responder.respond(response),
                Err(error) => responder.respond_with_error(error),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx: ConnectionTo<Client>| match a2
                .load_session(request, cx)
                .await
            {
                Ok(response) => responder.respond(response),
                Err(error) => responder.respond_with_error(error),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ListSessionsRequest, responder, _cx| match a3
                .list_sessions(request)
                .await
            {
                Ok(response) => responder.respond(response),
                Err(error) => responder.respond_with_error(error),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, _cx| {
                // The turn runs outside the dispatch loop, so cancel and permission
                // answers keep flowing; the responder answers when the turn ends.
                let handle = match a4.start_prompt(request) {
                    Ok(Claim::Turn { session, input, cancel, steering, answer: publish }) => {
                        tokio::spawn(async move {
                            let answer = session.run(&input, &cancel, &steering).await;
                            *lock(&session.running) = None;
                            publish.send_replace(Some(answer.clone()));
                            let _ = match answer {
                                Ok(response) => responder.respond(response),
                                Err(error) => responder.respond_with_error(error),
                            };
                        })
                    }
                    Ok(Claim::Queued { joined, mut answer }) => tokio::spawn(async move {
                        let answer = match joined.wait().await {
                            // Joined: this prompt's turn is the running one.
                            Some(_) => loop {
                                if let Some(answer) = answer.borrow_and_update().clone() {
                                    break answer;
                                }
                                if answer.changed().await.is_err() {
                                    break Err(internal("the turn ended without an answer"));
                                }
                            },
                            None => Err(ending()),
                        };
                        let _ = match answer {
                            Ok(response) => responder.respond(response),
                            Err(error) => responder.respond_with_error(error),
                        };
                    }),
                    Err(error) => return responder.respond_with_error(error),
                };
                let mut turns = lock(&a4.turns);
                turns.retain(|turn| !turn.is_finished());
                turns.push(handle);
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionModeRequest, responder, cx: ConnectionTo<Client>| {
                match a6.set_mode(request, cx).await {
                    Ok(response) => responder.respond(response),
                    Err(error) => responder.respond_with_error(error),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                a5.cancel(&notification);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(Stdio::new())
        .await
}

/// The agent's state for one connection.
struct AcpAgent {
    home: PathBuf,
    store: Arc<dyn Store>,
    options: AcpOptions,
    sessions: Mutex<HashMap<SessionId, Arc<Live>>>,
    turns: Mutex<Vec<JoinHandle<()>>>,
    /// Whether the client offered form elicitation in `initialize`: then a server's
    /// questions are asked with `elicitation/create`, else declined.
    client_elicits: Arc<std::sync::atomic::AtomicBool>,
}

/// A session this connection created or loaded: its kernel and whether a turn runs.
struct Live {
    id: SessionId,
    assembly: Assembly,
    workspace: PathBuf,
    mcp_servers: Vec<McpServer>,
    running: Mutex<Option<Running>>,
    store: Arc<dyn Store>,
}

/// A prompt turn's answer, once it ended.
type Answer = Option<Result<PromptResponse, agent_client_protocol::Error>>;

/// The turn a session runs: how to cancel it, where prompts sent meanwhile go, and its
/// answer once it ends (for the prompts that joined it).
struct Running {
    cancel: Cancellation,
    steering: Steering,
    answer: tokio::sync::watch::Receiver<Answer>,
}

/// What a `session/prompt` starts.
enum Claim {
    /// A new turn on an idle session.
    Turn {
        session: Arc<Live>,
        input: String,
        cancel: Cancellation,
        steering: Steering,
        answer: tokio::sync::watch::Sender<Answer>,
    },
    /// Input queued into the running turn; answered with that turn's answer.
    Queued { joined: Joined, answer: tokio::sync::watch::Receiver<Answer> },
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn invalid_params(message: impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_params().data(serde_json::json!(message.to_string()))
}

fn internal(message: impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::internal_error().data(serde_json::json!(message.to_string()))
}

/// A root error: a usage error is the client's (invalid params), the rest keel's.
fn root_error(error: &anyhow::Error) -> agent_client_protocol::Error {
    let text = format!("{error:#}");
    let text = keel_host::terminal::neutralize(&text).into_owned();
    if keel_host::error::is_usage(error) { invalid_params(text) } else { internal(text) }
}

impl AcpAgent {
    fn initialize() -> InitializeResponse {
        // keel speaks v1: the answer to any version asked is v1 (the client decides whether it
        // can go on with it).
        InitializeResponse::new(agent_client_protocol::schema::ProtocolVersion::V1)
            .agent_capabilities(
                AgentCapabilities::new()
                    .load_session(true)
                    .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
                    .mcp_capabilities(McpCapabilities::new().http(true))
                    .session_capabilities(
                        SessionCapabilities::new().list(SessionListCapabilities::new()),
                    ),
            )
            .agent_info(Implementation::new("keel", env!("CARGO_PKG_VERSION")).title("keel"))
    }

    /// The client's cwd as a workspace: absolute, existing, canonical.
    fn workspace(cwd: &Path) -> Result<PathBuf, agent_client_protocol::Error> {
        if !cwd.is_absolute() {
            return Err(invalid_params(format!(
                "cwd must be an absolute path, not {}",
                keel_host::terminal::one_line(&cwd.display().to_string(), 200)
            )));
        }
        root::canonical_workspace(Some(cwd)).map_err(|error| root_error(&error))
    }

    /// Builds a session's kernel for `workspace` (and the session it continues).
    #[allow(clippy::too_many_arguments)]
    async fn assemble(
        &self,
        settings: &RunSettings,
        workspace: &Path,
        facts: Option<&SessionFacts<'_>>,
        mcp_servers: &[McpServer],
        cx: &ConnectionTo<Client>,
        history: &[RuntimeEvent],
        session: Arc<OnceLock<SessionId>>,
    ) -> Result<Assembly, agent_client_protocol::Error> {
        let person: Arc<dyn PermissionHook> = Arc::new(person::ClientPerson::new(
            cx.clone(),
            session.clone(),
            self.options.permission_timeout,
            history,
            self.client_elicits.clone(),
        ));
        let mut prepared =
            root::prepare(&self.home, workspace, settings, facts, &self.store, Some(person))
                .map_err(|error| root_error(&error))?;
        // `reject_always` holds for the session in every mode: under `auto` nobody is
        // asked, so the rejected tools are deny rules of the assembly.
        let rejected = person::rejected_for_the_session(history);
        let deny = &mut prepared.resolved.run.rules.deny;
        deny.extend(rejected.iter().filter_map(|tool| keel_contracts::Rule::parse(tool).ok()));
        for server in mcp_servers {
            let (name, config) = client_mcp_server(server)?;
            prepared.config.mcp_servers.insert(name, config);
        }
        let mut renderer = render::Renderer::new();
        for event in history {
            renderer.render(event);
        }
        let observer =
            Arc::new(LiveUpdates { cx: cx.clone(), session, renderer: Mutex::new(renderer) });
        let assembly =
            root::assemble(prepared, &self.home, workspace, self.store.clone(), observer)
                .await
                .map_err(|error| root_error(&error))?;
        root::check_tool_names(&assembly.kernel, &assembly.resolved.envelope)
            .map_err(|error| root_error(&error))?;
        root::repair(self.store.clone()).await;
        Ok(assembly)
    }

    async fn new_session(
        &self,
        request: NewSessionRequest,
        cx: ConnectionTo<Client>,
    ) -> Result<NewSessionResponse, agent_client_protocol::Error> {
        let workspace = Self::workspace(&request.cwd)?;
        let slot = Arc::new(OnceLock::new());
        let settings = &self.options.settings;
        let assembly = self
            .assemble(settings, &workspace, None, &request.mcp_servers, &cx, &[], slot.clone())
            .await?;
        let resolved = &assembly.resolved;
        let id = assembly
            .kernel
            .create_session(&SessionConfig {
                workspace: workspace.clone(),
                model_spec: resolved.model_spec.clone(),
                envelope: resolved.envelope.clone(),
                mode: resolved.mode,
                base_url: resolved.recorded_base_url.clone(),
            })
            .await
            .map_err(internal)?;
        let _ = slot.set(id);
        let modes = modes(assembly.resolved.run.approval);
        self.add(id, assembly, workspace, request.mcp_servers);
        Ok(NewSessionResponse::new(id.to_string()).modes(modes))
    }

    /// Opens a session on this connection; the one it replaces, if any.
    fn add(
        &self,
        id: SessionId,
        assembly: Assembly,
        workspace: PathBuf,
        mcp_servers: Vec<McpServer>,
    ) -> Option<Arc<Live>> {
        let live = Arc::new(Live {
            id,
            assembly,
            workspace,
            mcp_servers,
            running: Mutex::new(None),
            store: self.store.clone(),
        });
        lock(&self.sessions).insert(id, live)
    }

    /// `session/set_mode`: the approval mode of the session's next turns. The session's
    /// kernel is assembled again with it (between turns only).
    async fn set_mode(
        &self,
        request: SetSessionModeRequest,
        cx: ConnectionTo<Client>,
    ) -> Result<SetSessionModeResponse, agent_client_protocol::Error> {
        let approval = MODES
            .iter()
            .find(|(id, ..)| *id == &*request.mode_id.0)
            .map(|(_, mode, ..)| *mode)
            .ok_or_else(|| {
                invalid_params(format!(
                    "unknown mode '{}': ask, sandboxed, auto or deny",
                    one_line(&request.mode_id.0)
                ))
            })?;
        let (id, events) = self.session_events(&request.session_id.0).await?;
        let live = lock(&self.sessions).get(&id).cloned().ok_or_else(|| {
            invalid_params(format!("session {id} is not open: call session/load first"))
        })?;
        if lock(&live.running).is_some() {
            return Err(busy(id));
        }
        let facts = SessionFacts::of(&events)
            .ok_or_else(|| invalid_params(format!("session {id} has no session_created event")))?;
        let settings = RunSettings { approval: Some(approval), ..self.options.settings.clone() };
        let slot = Arc::new(OnceLock::from(id));
        let assembly = self
            .assemble(
                &settings,
                &live.workspace,
                Some(&facts),
                &live.mcp_servers,
                &cx,
                &events,
                slot,
            )
            .await?;
        if let Some(old) = self.add(id, assembly, live.workspace.clone(), live.mcp_servers.clone())
        {
            old.assembly.outbox.finish().await;
            old.assembly.mcp.close().await;
        }
        cx.send_notification(SessionNotification::new(
            id.to_string(),
            SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(request.mode_id.clone())),
        ))?;
        Ok(SetSessionModeResponse::new())
    }

    async fn session_events(
        &self,
        id: &str,
    ) -> Result<(SessionId, Vec<RuntimeEvent>), agent_client_protocol::Error> {
        let parsed = uuid::Uuid::parse_str(id)
            .map_err(|_| invalid_params(format!("no keel session {}", one_line(id))))?;
        let id = SessionId(parsed);
        let events = self.store.read(id, Seq(0)).await.map_err(internal)?;
        if events.is_empty() {
            return Err(invalid_params(format!("no keel session {id}")));
        }
        Ok((id, events))
    }

    async fn load_session(
        &self,
        request: LoadSessionRequest,
        cx: ConnectionTo<Client>,
    ) -> Result<LoadSessionResponse, agent_client_protocol::Error> {
        let (id, events) = self.session_events(&request.session_id.0).await?;
        let Some(EventKind::SessionCreated { workspace, .. }) = events.first().map(|e| &e.kind)
        else {
            return Err(invalid_params(format!("session {id} has no session_created event")));
        };
        let workspace = Self::workspace(Path::new(workspace))?;
        let asked = Self::workspace(&request.cwd)?;
        if asked != workspace {
            return Err(invalid_params(format!(
                "session {id} is bound to {}, not {}",
                workspace.display(),
                asked.display()
            )));
        }
        if let Some(sealed) = events.iter().find_map(|event| match &event.kind {
            EventKind::SessionSealed { reason } => Some(reason.clone()),
            _ => None,
        }) {
            return Err(invalid_params(format!("session {id} is sealed: {}", one_line(&sealed))));
        }
        if lock(&self.sessions).get(&id).is_some_and(|live| lock(&live.running).is_some()) {
            return Err(busy(id));
        }
        let facts = SessionFacts::of(&events)
            .ok_or_else(|| invalid_params(format!("session {id} has no session_created event")))?;
        let slot = Arc::new(OnceLock::from(id));
        let settings = &self.options.settings;
        let assembly = self
            .assemble(settings, &workspace, Some(&facts), &request.mcp_servers, &cx, &events, slot)
            .await?;
        // The history, exactly as the live stream rendered it.
        for update in render::Renderer::replay(&events) {
            cx.send_notification(SessionNotification::new(id.to_string(), update))?;
        }
        let modes = modes(assembly.resolved.run.approval);
        if let Some(old) = self.add(id, assembly, workspace, request.mcp_servers) {
            old.assembly.outbox.finish().await;
            old.assembly.mcp.close().await;
        }
        Ok(LoadSessionResponse::new().modes(modes))
    }

    async fn list_sessions(
        &self,
        request: ListSessionsRequest,
    ) -> Result<ListSessionsResponse, agent_client_protocol::Error> {
        let wanted = match &request.cwd {
            Some(cwd) => Some(Self::workspace(cwd)?),
            None => None,
        };
        let sessions = self.store.sessions().await.map_err(internal)?;
        let infos = sessions
            .into_iter()
            .filter(|summary| summary.parent.is_none())
            .filter(|summary| {
                wanted.as_ref().is_none_or(|cwd| Path::new(&summary.workspace) == cwd.as_path())
            })
            .map(|summary| {
                SessionInfo::new(summary.id.to_string(), summary.workspace.clone())
                    .title(one_line(&summary.title))
                    .updated_at(summary.updated_at.to_rfc3339())
            })
            .collect();
        Ok(ListSessionsResponse::new(infos))
    }

    /// Claims the session for a turn, or queues the prompt into the turn it runs; refuses
    /// an unknown session, and a prompt sent while the running turn ends.
    fn start_prompt(&self, request: PromptRequest) -> Result<Claim, agent_client_protocol::Error> {
        let id = uuid::Uuid::parse_str(&request.session_id.0)
            .map(SessionId)
            .map_err(|_| invalid_params("unknown session: call session/new or session/load"))?;
        let session = lock(&self.sessions).get(&id).cloned().ok_or_else(|| {
            invalid_params(format!("session {id} is not open: call session/load first"))
        })?;
        let input = prompt_text(&request.prompt);
        if input.trim().is_empty() {
            return Err(invalid_params("the prompt has no text"));
        }
        let cancel = Cancellation::new();
        let steering = Steering::new();
        let (publish, answer) = tokio::sync::watch::channel(None);
        {
            let mut running = lock(&session.running);
            if let Some(turn) = running.as_ref() {
                let joined = turn.steering.send(input).map_err(|_| ending())?;
                return Ok(Claim::Queued { joined, answer: turn.answer.clone() });
            }
            *running = Some(Running { cancel: cancel.clone(), steering: steering.clone(), answer });
        }
        Ok(Claim::Turn { session, input, cancel, steering, answer: publish })
    }

    fn cancel(&self, notification: &CancelNotification) {
        let Ok(id) = uuid::Uuid::parse_str(&notification.session_id.0).map(SessionId) else {
            return;
        };
        if let Some(session) = lock(&self.sessions).get(&id)
            && let Some(running) = lock(&session.running).as_ref()
        {
            running.cancel.cancel();
        }
    }
}

/// The session modes: keel's approval modes (`--approval`), with what each means.
const MODES: [(&str, ApprovalMode, &str, &str); 4] = [
    ("ask", ApprovalMode::Ask, "Ask", "Ask before every call that needs consent"),
    (
        "sandboxed",
        ApprovalMode::Sandboxed,
        "Sandboxed",
        "Run commands and workspace edits the managed sandbox contains; ask for the rest",
    ),
    ("auto", ApprovalMode::Auto, "Auto", "Allow every call but a wider boundary"),
    ("deny", ApprovalMode::Deny, "Deny", "Refuse every call that needs consent"),
];

fn modes(current: ApprovalMode) -> SessionModeState {
    let current = MODES.iter().find(|(_, mode, ..)| *mode == current).map_or("ask", |m| m.0);
    SessionModeState::new(
        current,
        MODES
            .iter()
            .map(|(id, _, name, description)| {
                SessionMode::new(*id, *name).description(*description)
            })
            .collect(),
    )
}

fn busy(id: SessionId) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_request().data(serde_json::json!(format!(
        "session {id} is running a turn: wait for it, or send session/cancel"
    )))
}

/// A prompt sent while the running turn ended: it did not join; the client sends it again.
fn ending() -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_request().data(serde_json::json!(
        "the running turn ended before this prompt could join it; send it again"
    ))
}

fn one_line(text: &str) -> String {
    keel_host::terminal::one_line(text, 200)
}

impl Live {
    /// Runs one turn and answers with its stop reason.
    async fn run(
        &self,
        input: &str,
        cancel: &Cancellation,
        steering: &Steering,
    ) -> Result<PromptResponse, agent_client_protocol::Error> {
        let kernel = &self.assembly.kernel;
        let report = kernel
            .run_turn_steered(self.id, input, &self.assembly.resolved.run, cancel, steering)
            .await
            .map_err(|error| internal(one_line(&error.to_string())))?;
        let last_finish = match self.store.read(self.id, Seq(0)).await {
            Ok(events) => events.iter().rev().find_map(|event| match &event.kind {
                kind @ EventKind::ModelResponse { finish_reason, .. }
                    if kind.is_conversation_response() =>
                {
                    Some(finish_reason.clone())
                }
                _ => None,
            }),
            Err(_) => None,
        };
        let stop = match report.outcome {
            TurnOutcome::Completed { .. } => match last_finish {
                Some(FinishReason::Refusal | FinishReason::ContentFilter) => StopReason::Refusal,
                _ => StopReason::EndTurn,
            },
            TurnOutcome::Cancelled { .. } => StopReason::Cancelled,
            TurnOutcome::Suspended { reason, .. } => {
                if reason.contains("step budget") {
                    StopReason::MaxTurnRequests
                } else if reason.contains("token budget") {
                    StopReason::MaxTokens
                } else {
                    StopReason::EndTurn
                }
            }
            TurnOutcome::Denied { .. } => StopReason::EndTurn,
            TurnOutcome::Failed { reason } => match last_finish {
                Some(FinishReason::Length) => StopReason::MaxTokens,
                Some(FinishReason::Refusal | FinishReason::ContentFilter) => StopReason::Refusal,
                _ => return Err(internal(format!("the run failed: {}", one_line(&reason)))),
            },
        };
        Ok(PromptResponse::new(stop))
    }
}

/// The text of a prompt: text blocks as they are, embedded text resources after them,
/// resource links as `@uri` mentions.
fn prompt_text(blocks: &[ContentBlock]) -> String {
    let mut parts = Vec::new();
    for block in blocks {
        match block {
            ContentBlock::Text(text) => parts.push(text.text.clone()),
            ContentBlock::ResourceLink(link) => parts.push(format!("@{}", link.uri)),
            ContentBlock::Resource(resource) => {
                if let EmbeddedResourceResource::TextResourceContents(contents) = &resource.resource
                {
                    parts.push(format!(
                        "<resource uri=\"{}\">\n{}\n</resource>",
                        contents.uri, contents.text
                    ));
                }
            }
            _ => {}
        }
    }
    parts.join("\n")
}

/// A client-declared MCP server as a `[mcp_servers.NAME]` table, named `acp_NAME`.
fn client_mcp_server(
    server: &McpServer,
) -> Result<(String, keel_mcp::McpServerConfig), agent_client_protocol::Error> {
    let mut config = keel_mcp::McpServerConfig::default();
    let name = match server {
        McpServer::Stdio(stdio) => {
            config.command = Some(stdio.command.display().to_string());
            config.args = stdio.args.clone();
            config.env =
                stdio.env.iter().map(|var| (var.name.clone(), var.value.clone())).collect();
            stdio.name.clone()
        }
        McpServer::Http(http) => {
            // The editor's headers (a token, say) are sent with every request; the
            // editor is the user's own program, as trusted as the user's config.
            config.headers = keel_mcp::HttpHeaders(
                http.headers.iter().map(|h| (h.name.clone(), h.value.clone())).collect(),
            );
            config.url = Some(http.url.clone());
            http.name.clone()
        }
        _ => return Err(invalid_params("only stdio and http MCP servers are supported")),
    };
    // Letters and digits, single underscores between them: tool names are
    // `mcp__SERVER__TOOL`, so a name must not carry `__`.
    let clean = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("_");
    let clean: String = clean.chars().take(40).collect();
    if clean.is_empty() {
        return Err(invalid_params("an MCP server needs a name of letters or digits"));
    }
    let name = format!("acp_{clean}");
    // A server keel cannot serve as declared (a header that is not valid HTTP, say) is
    // refused here, not dropped later.
    config.validate(&name).map_err(|error| invalid_params(error.to_string()))?;
    Ok((name, config))
}

/// The observer of a session's runs: each durable event, rendered, to the client.
struct LiveUpdates {
    cx: ConnectionTo<Client>,
    session: Arc<OnceLock<SessionId>>,
    renderer: Mutex<render::Renderer>,
}

impl std::fmt::Debug for LiveUpdates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveUpdates").field("session", &self.session.get()).finish()
    }
}

impl Observer for LiveUpdates {
    fn on_event(&self, event: &RuntimeEvent) {
        // Child sessions and the session's own creation are not the client's to see.
        if self.session.get() != Some(&event.session_id) {
            return;
        }
        let updates = lock(&self.renderer).render(event);
        for update in updates {
            // The client sent the prompt itself; it is replayed only by session/load.
            if matches!(update, SessionUpdate::UserMessageChunk(_)) {
                continue;
            }
            let _ = self
                .cx
                .send_notification(SessionNotification::new(event.session_id.to_string(), update));
        }
    }

    fn on_delta(&self, _delta: &StreamDelta) {}
}
