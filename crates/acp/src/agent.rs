//! The agent for one connection ([`AcpAgent`]): what `keel acp` was started with, the
//! sessions it opened, and what each request does with them — `session/new`, `/load`,
//! `/list`, `/set_mode`, `/prompt` and `/cancel` — each session built by the composition
//! root.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, CurrentModeUpdate, Implementation, InitializeResponse,
    ListSessionsRequest, ListSessionsResponse, LoadSessionRequest, LoadSessionResponse,
    McpCapabilities, McpServer, NewSessionRequest, NewSessionResponse, PromptCapabilities,
    PromptRequest, SessionCapabilities, SessionInfo, SessionListCapabilities, SessionNotification,
    SessionUpdate, SetSessionModeRequest, SetSessionModeResponse,
};
use keel_contracts::{EventKind, RuntimeEvent, Seq, SessionId, Store};
use keel_host::root::{self, Assembly, RunSettings, SessionFacts};
use keel_kernel::{Cancellation, PermissionHook, SessionConfig, Steering};
use tokio::task::JoinHandle;

use crate::client::{client_mcp_server, prompt_text};
use crate::error::{busy, ending, internal, invalid_params, one_line, root_error};
use crate::live::{Claim, Live, LiveUpdates, Running, lock};
use crate::modes::{MODES, modes};
use crate::{person, render};

/// What `keel acp` was started with.
#[derive(Debug, Clone)]
pub struct AcpOptions {
    /// Settings from the command line (model, endpoint, approval, sandbox, budgets).
    pub settings: RunSettings,
    /// How long a `session/request_permission` may stay unanswered; then it is a deny
    /// with that reason recorded.
    pub permission_timeout: Duration,
}

/// The agent's state for one connection.
pub(crate) struct AcpAgent {
    pub(crate) home: PathBuf,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) options: AcpOptions,
    pub(crate) sessions: Mutex<HashMap<SessionId, Arc<Live>>>,
    pub(crate) turns: Mutex<Vec<JoinHandle<()>>>,
    /// Whether the client offered form elicitation in `initialize`: then a server's
    /// questions are asked with `elicitation/create`, else declined.
    pub(crate) client_elicits: Arc<std::sync::atomic::AtomicBool>,
}

impl AcpAgent {
    pub(crate) fn initialize() -> InitializeResponse {
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

    pub(crate) async fn new_session(
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
    pub(crate) async fn set_mode(
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

    pub(crate) async fn load_session(
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

    pub(crate) async fn list_sessions(
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
    pub(crate) fn start_prompt(
        &self,
        request: PromptRequest,
    ) -> Result<Claim, agent_client_protocol::Error> {
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

    pub(crate) fn cancel(&self, notification: &CancelNotification) {
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
