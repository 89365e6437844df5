//! [`McpServers`]: starts every configured server, lists its tools, keeps each connection
//! and restarts a dead one on next use.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use keel_contracts::{Access, Effects, Tool, ToolOutput, ToolSpec, fence_untrusted};
use rmcp::ServiceError;
use rmcp::model::CallToolRequestParams;

use crate::access::{AccessSource, declare_access};
use crate::client::{CallGuard, Elicitation, ElicitationPolicy, KeelClient, Pause};
use crate::config::{ServerSpec, TransportSpec};
use crate::connection::Connection;
use crate::error::ConnectError;
use crate::naming::keel_tool_name;
use crate::result::render;
use crate::secrets::Secrets;
use crate::stdio::{ServerLog, TASK_REQUIRED_META};
use crate::tool::McpTool;

/// Environment variables a stdio server inherits from keel; everything else it gets from
/// its own `env` table. keel's API keys (`OPENAI_API_KEY`, ...) are never passed on.
pub const INHERITED_ENV_VARS: &[&str] = &[
    "HOME",
    "PATH",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
];

/// What servers are started with, chosen by the composition root.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Where `mcp-<server>.log` files go (e.g. `KEEL_HOME/logs`); created when missing.
    pub log_dir: PathBuf,
    /// The workspace: a stdio server's default working folder, and what a relative `cwd`
    /// resolves against.
    pub workspace: PathBuf,
    /// The inherited environment: normally the process's values of
    /// [`INHERITED_ENV_VARS`].
    pub inherited_env: BTreeMap<OsString, OsString>,
    /// The values of the variables that `bearer_token_env` keys name, read by the
    /// composition root (normally [`BearerTokens::from_env`]); keel-mcp reads no process
    /// environment itself.
    pub bearer_tokens: BearerTokens,
    /// How servers' `elicitation/create` requests are answered.
    pub elicitation: ElicitationPolicy,
    /// Where OAuth logins are stored (normally `KEEL_HOME/mcp/oauth`); `None`: URL servers
    /// get no stored OAuth tokens.
    pub oauth: Option<crate::oauth::OAuthStore>,
}

/// Bearer tokens by environment variable name. `Debug` prints the names only.
#[derive(Clone, Default)]
pub struct BearerTokens(pub BTreeMap<String, String>);

impl BearerTokens {
    /// The process environment's values of every `bearer_token_env` of `specs` that is set
    /// and not empty.
    pub fn from_env(specs: &[ServerSpec]) -> BearerTokens {
        let mut tokens = BTreeMap::new();
        for spec in specs {
            if let TransportSpec::Http { bearer_token_env: Some(variable), .. } = &spec.transport
                && let Ok(value) = std::env::var(variable)
                && !value.is_empty()
            {
                tokens.insert(variable.clone(), value);
            }
        }
        BearerTokens(tokens)
    }
}

impl std::fmt::Debug for BearerTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.keys().map(|name| (name, "<redacted>"))).finish()
    }
}

/// Whether a server is usable, as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Initialized and its tools listed.
    Connected,
    /// Start-up failed; the server contributes no tools.
    Failed {
        /// Why, for humans.
        reason: String,
    },
}

/// One MCP tool as `keel mcp list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolInfo {
    /// The name the model calls it by (`mcp__fs__read_file`).
    pub name: String,
    /// The server's own name for it.
    pub server_tool: String,
    /// Declared access.
    pub access: Access,
    /// Declared effects.
    pub effects: Effects,
    /// Who declared the access.
    pub source: AccessSource,
    /// The server's own `readOnlyHint`: shown, never trusted unless the server is.
    pub read_only_hint: Option<bool>,
}

/// One configured server as `keel mcp list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerStatus {
    /// The server's name.
    pub name: String,
    /// `stdio: COMMAND ARGS` or `http: URL`.
    pub transport: String,
    /// Connected, or why not.
    pub state: ServerState,
    /// Its tools, in the server's order.
    pub tools: Vec<McpToolInfo>,
    /// Things the user should know: declarations for tools the server does not offer,
    /// tools left out because their names collide.
    pub notes: Vec<String>,
    /// The server's log (stdio servers).
    pub log_path: Option<PathBuf>,
}

/// The configured MCP servers and their tools.
#[derive(Debug)]
pub struct McpServers {
    statuses: Vec<ServerStatus>,
    handles: Vec<Arc<ServerHandle>>,
    /// Every server's current tools (changed by `tools/list_changed`).
    lists: Arc<crate::client::ToolLists>,
}

impl McpServers {
    /// Starts every server in parallel (each bounded by its startup timeout), initializes
    /// it and lists its tools (following `nextCursor`). Never fails as a whole: a server
    /// that does not start is reported in [`McpServers::statuses`] and contributes no
    /// tools.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future kills the stdio servers started so far.
    pub async fn start(specs: Vec<ServerSpec>, options: StartOptions) -> McpServers {
        let options = Arc::new(options);
        let lists = Arc::new(crate::client::ToolLists::default());
        let started = futures::future::join_all(
            specs
                .into_iter()
                .enumerate()
                .map(|(index, spec)| start_one(spec, options.clone(), (lists.clone(), index))),
        )
        .await;
        let mut statuses = Vec::new();
        let mut handles = Vec::new();
        for (_tools, status, handle) in started {
            statuses.push(status);
            handles.extend(handle);
        }
        McpServers { statuses, handles, lists }
    }

    /// Every `elicitation/create` answered so far, by server in configuration order, each
    /// server's in the order they came.
    pub fn elicitations(&self) -> Vec<Elicitation> {
        let mut all = Vec::new();
        for handle in &self.handles {
            if let Ok(answered) = handle.elicitations.lock() {
                all.extend(answered.iter().cloned());
            }
        }
        all
    }

    /// Every server's current tools as a [`keel_contracts::ToolSource`] for the kernel
    /// (`Kernel::with_tool_source`): a server's `notifications/tools/list_changed` lists
    /// its tools again and moves the source's generation.
    pub fn tool_source(&self) -> Arc<dyn keel_contracts::ToolSource> {
        self.lists.clone()
    }

    /// Ends every server's session, in parallel, each within a few seconds: an HTTP
    /// server's session is deleted (`DELETE`), a stdio server's input is closed and its
    /// process group killed. A tool called afterwards starts its server again.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the remaining sessions closing in the background.
    pub async fn close(&self) {
        futures::future::join_all(self.handles.iter().map(|handle| handle.close())).await;
    }

    /// The tools of every connected server, for the kernel's registry.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.lists.current().into_iter().map(|tool| tool as Arc<dyn Tool>).collect()
    }

    /// Every configured server's state, tools and notes, in configuration order.
    pub fn statuses(&self) -> &[ServerStatus] {
        &self.statuses
    }
}

async fn start_one(
    spec: ServerSpec,
    options: Arc<StartOptions>,
    lists: (Arc<crate::client::ToolLists>, usize),
) -> (Vec<Arc<McpTool>>, ServerStatus, Option<Arc<ServerHandle>>) {
    let mut status = ServerStatus {
        name: spec.name.clone(),
        transport: spec.transport.describe(),
        state: ServerState::Connected,
        tools: Vec::new(),
        notes: Vec::new(),
        log_path: None,
    };
    let log = match &spec.transport {
        TransportSpec::Stdio { .. } => match ServerLog::open(&options.log_dir, &spec.name) {
            Ok(log) => {
                status.log_path = Some(log.path().to_path_buf());
                Some(Arc::new(log))
            }
            Err(error) => {
                status.state = ServerState::Failed { reason: error.to_string() };
                return (Vec::new(), status, None);
            }
        },
        TransportSpec::Http { .. } => None,
    };
    let elicitations = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler =
        KeelClient::new(&spec.name, options.elicitation, elicitations.clone(), Some(lists));
    let server = Arc::new(ServerHandle {
        spec,
        options,
        log,
        handler,
        elicitations,
        connection: tokio::sync::Mutex::new(None),
        secrets: Secrets::default(),
    });
    server.handler.set_handle(&server);
    let listed = tokio::time::timeout(server.spec.startup_timeout, async {
        let connection = server.connect().await?;
        let tools = connection.peer().list_all_tools().await.map_err(|error| {
            connection.refusal(&server.spec, &server.options).unwrap_or_else(|| {
                ConnectError::ListTools {
                    message: error.to_string(),
                    stderr_tail: server.stderr_tail(),
                }
            })
        })?;
        Ok::<_, ConnectError>((connection, tools))
    })
    .await;
    let (connection, listed) = match listed {
        Ok(Ok(listed)) => listed,
        Ok(Err(error)) => {
            status.state = ServerState::Failed { reason: server.secrets.scrub(error.to_string()) };
            return (Vec::new(), status, None);
        }
        Err(_elapsed) => {
            let error = ConnectError::StartupTimeout {
                timeout: server.spec.startup_timeout,
                stderr_tail: server.stderr_tail(),
            };
            status.state = ServerState::Failed { reason: error.to_string() };
            return (Vec::new(), status, None);
        }
    };
    *server.connection.lock().await = Some(connection);

    let offers_resources = server
        .connection
        .lock()
        .await
        .as_ref()
        .and_then(|connection| connection.peer().peer_info())
        .is_some_and(|info| info.capabilities.resources.is_some());
    let (tools, infos, notes) = build_tools(&server, &listed, offers_resources);
    status.tools = infos;
    status.notes.extend(notes);
    if let Some((lists, index)) = server.handler.tool_lists() {
        lists.set(*index, tools.clone(), false);
    }
    (tools, status, Some(server))
}

/// The keel tools of `server` for its `listed` tools (and keel's `read_resource` when it
/// offers resources), what `keel mcp list` shows of them, and notes for the user.
pub(crate) fn build_tools(
    server: &Arc<ServerHandle>,
    listed: &[rmcp::model::Tool],
    offers_resources: bool,
) -> (Vec<Arc<McpTool>>, Vec<McpToolInfo>, Vec<String>) {
    let mut notes = Vec::new();
    let mut infos = Vec::new();
    let mut names = BTreeSet::new();
    let mut tools = Vec::new();
    let offered: BTreeSet<&str> = listed.iter().map(|tool| tool.name.as_ref()).collect();
    for undeclared in server.spec.tools.keys().filter(|name| !offered.contains(name.as_str())) {
        notes.push(format!("config declares tool '{undeclared}', which the server does not offer"));
    }
    for listed_tool in listed {
        let server_tool = listed_tool.name.to_string();
        if listed_tool.meta.as_ref().is_some_and(|meta| meta.0.contains_key(TASK_REQUIRED_META)) {
            notes.push(format!(
                "tool '{server_tool}' left out: it can only run as a task (taskSupport = \
                 required), which keel does not support yet"
            ));
            continue;
        }
        let name = keel_tool_name(&server.spec.name, &server_tool);
        if !names.insert(name.clone()) {
            notes.push(format!(
                "tool '{server_tool}' left out: its name {name} is taken by another tool"
            ));
            continue;
        }
        let read_only_hint = listed_tool.annotations.as_ref().and_then(|a| a.read_only_hint);
        let declared = declare_access(
            server.spec.transport.kind(),
            server.spec.trusted,
            server.spec.tools.get(&server_tool),
            read_only_hint,
        );
        let info = McpToolInfo {
            name: name.clone(),
            server_tool: server_tool.clone(),
            access: declared.access,
            effects: declared.effects,
            source: declared.source,
            read_only_hint,
        };
        let mut parameters = serde_json::Value::Object((*listed_tool.input_schema).clone());
        if parameters.get("type").is_none() {
            parameters["type"] = serde_json::Value::from("object");
        }
        // The server's own words about its tool are untrusted input like its results.
        let description = match listed_tool.description.as_deref() {
            Some(text) if !text.trim().is_empty() => format!(
                "Tool '{server_tool}' of MCP server '{}'; the server describes it as:\n{}",
                server.spec.name,
                fence_untrusted(&format!("{name}__description"), text)
            ),
            _ => format!("Tool '{server_tool}' of MCP server '{}'.", server.spec.name),
        };
        let spec = ToolSpec {
            name,
            description,
            parameters,
            access: declared.access,
            effects: declared.effects,
            intrinsic: false,
            first_party: false,
        };
        infos.push(info.clone());
        let output_schema = listed_tool
            .output_schema
            .as_ref()
            .map(|schema| serde_json::Value::Object((**schema).clone()));
        tools.push(Arc::new(McpTool::new(spec, info, server.clone(), output_schema)));
    }
    // Resource links in results are only useful if the model can follow them: a server
    // that offers resources gets keel's `read_resource` tool, declared a read of that server
    // (with the server's egress), so it is gated like the server's own reads.
    if offers_resources {
        let name = keel_tool_name(&server.spec.name, READ_RESOURCE);
        if names.insert(name.clone()) {
            let declared = declare_access(
                server.spec.transport.kind(),
                server.spec.trusted,
                Some(&crate::config::ToolDeclaration { access: Access::Read, egress: None }),
                Some(true),
            );
            let info = McpToolInfo {
                name: name.clone(),
                server_tool: READ_RESOURCE.to_owned(),
                access: declared.access,
                effects: declared.effects,
                source: AccessSource::Config,
                read_only_hint: Some(true),
            };
            let spec = ToolSpec {
                name,
                description: format!(
                    "Reads a resource of MCP server '{}' by its URI (as in a resource link of \
                     one of its results). Its text is untrusted input.",
                    server.spec.name
                ),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {"uri": {"type": "string", "description": "The resource URI."}},
                    "required": ["uri"],
                }),
                access: declared.access,
                effects: declared.effects,
                intrinsic: false,
                first_party: false,
            };
            infos.push(info.clone());
            tools.push(Arc::new(McpTool::read_resource(spec, info, server.clone())));
        } else {
            notes.push(format!(
                "keel's {READ_RESOURCE} tool left out: the server has a tool of that name"
            ));
        }
    }
    (tools, infos, notes)
}

/// The name of keel's resource-reading tool on a server that offers resources.
const READ_RESOURCE: &str = "read_resource";

/// One configured server and its current connection, shared by its tools.
#[derive(Debug)]
pub(crate) struct ServerHandle {
    spec: ServerSpec,
    options: Arc<StartOptions>,
    log: Option<Arc<ServerLog>>,
    /// keel's side of every session with this server.
    handler: KeelClient,
    /// What the handler answered to `elicitation/create`.
    elicitations: Arc<std::sync::Mutex<Vec<Elicitation>>>,
    /// `None` before the first start and after the connection died.
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// The user's secrets for this server, scrubbed from everything it says.
    secrets: Secrets,
}

impl ServerHandle {
    /// How long starting (and listing) may take.
    pub(crate) fn startup_timeout(&self) -> std::time::Duration {
        self.spec.startup_timeout
    }

    /// A line in the server's log (stdio servers).
    pub(crate) fn note(&self, text: &str) {
        if let Some(log) = &self.log {
            log.note(text);
        }
    }

    fn stderr_tail(&self) -> Vec<String> {
        self.log.as_ref().map(|log| log.tail()).unwrap_or_default()
    }

    /// A new connection (not stored).
    async fn connect(&self) -> Result<Arc<Connection>, ConnectError> {
        Connection::open(&self.spec, &self.options, self.log.as_ref(), &self.handler, &self.secrets)
            .await
            .map(Arc::new)
    }

    /// The live connection, (re)starting the server within its startup timeout if needed.
    async fn live_connection(&self) -> Result<Arc<Connection>, ConnectError> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref().filter(|c| c.is_alive()) {
            return Ok(connection.clone());
        }
        // Drop a dead connection first: that kills what is left of its process group.
        *slot = None;
        if let Some(log) = &self.log {
            log.note("restarting");
        }
        let connection = tokio::time::timeout(self.spec.startup_timeout, self.connect())
            .await
            .map_err(|_elapsed| ConnectError::StartupTimeout {
            timeout: self.spec.startup_timeout,
            stderr_tail: self.stderr_tail(),
        })??;
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// Closes the current connection, if any (see [`Connection::close`]).
    async fn close(&self) {
        let connection = self.connection.lock().await.take();
        if let Some(connection) = connection {
            connection.close().await;
        }
    }

    /// Marks a call of this server as running (its questions go to `elicitor`) until the
    /// guard is dropped.
    pub(crate) fn begin_call(
        &self,
        elicitor: Option<Arc<dyn keel_contracts::Elicitor>>,
    ) -> CallGuard {
        self.handler.begin_call(elicitor)
    }

    /// Forgets `connection` if it is still the current one.
    async fn discard(&self, connection: &Arc<Connection>) {
        let mut slot = self.connection.lock().await;
        if slot.as_ref().is_some_and(|current| Arc::ptr_eq(current, connection)) {
            *slot = None;
        }
    }

    /// Calls `server_tool` with `arguments` within the tool timeout; the result is fenced
    /// as untrusted text from `source` (the keel tool name) and scrubbed of the user's
    /// secrets for this server (a server may echo its `Authorization` header).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while the call is in flight sends `notifications/cancelled`
    /// for it (rmcp's abandoned-request guard); the connection stays usable.
    pub(crate) async fn call(
        &self,
        source: &str,
        server_tool: &str,
        arguments: &serde_json::Value,
        output_schema: Option<&serde_json::Value>,
        running: &CallGuard,
    ) -> ToolOutput {
        let output = self.call_unscrubbed(source, server_tool, arguments, output_schema, running);
        self.scrubbed(output.await)
    }

    /// `output` with the user's secrets for this server replaced by `<redacted>`.
    fn scrubbed(&self, mut output: ToolOutput) -> ToolOutput {
        output.content = self.secrets.scrub(output.content);
        // Exact bytes could show a secret the text shows escaped: keep the text only.
        if output.raw.is_some() {
            output.raw = None;
        }
        output
    }

    /// [`ServerHandle::call`] before the secrets are scrubbed.
    async fn call_unscrubbed(
        &self,
        source: &str,
        server_tool: &str,
        arguments: &serde_json::Value,
        output_schema: Option<&serde_json::Value>,
        running: &CallGuard,
    ) -> ToolOutput {
        let server = &self.spec.name;
        let arguments = match arguments {
            serde_json::Value::Object(object) => Some(object.clone()),
            serde_json::Value::Null => None,
            _ => return ToolOutput::error("error: the arguments must be a JSON object"),
        };
        let connection = match self.live_connection().await {
            Ok(connection) => connection,
            Err(error) => {
                return ToolOutput::error(format!(
                    "error: MCP server '{server}' is not available: {}",
                    self.fence_stderr(&error.to_string())
                ));
            }
        };
        let mut params = CallToolRequestParams::new(server_tool.to_owned());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        let timeout = self.spec.tool_timeout;
        let started = tokio::time::Instant::now();
        let mut connection = connection;
        let pause = &running.pause;
        let mut called = within(timeout, pause, connection.peer().call_tool(params.clone())).await;
        // An HTTP server that refused the session (it restarted, or forgot it) did not run
        // the call: send it once more on a new session, within what is left of the timeout.
        if let Ok(Err(error)) = &called
            && lost_connection(error)
            && connection.lost_its_session()
        {
            self.discard(&connection).await;
            match self.live_connection().await {
                Ok(fresh) => {
                    connection = fresh;
                    let left =
                        timeout.saturating_sub(started.elapsed().saturating_sub(pause.paused()));
                    called = within(left, pause, connection.peer().call_tool(params)).await;
                }
                Err(error) => {
                    return ToolOutput::error(format!(
                        "error: MCP server '{server}' forgot keel's session and a new one could \
                         not be started: {}",
                        self.fence_stderr(&error.to_string())
                    ));
                }
            }
        }
        // Refused for authorization (a login that expired and could not be refreshed, or
        // too few scopes): say what the user can do about it.
        if let Ok(Err(_)) = &called
            && let Some(refusal) = connection.refusal(&self.spec, &self.options)
        {
            if !connection.is_alive() {
                self.discard(&connection).await;
            }
            return ToolOutput::error(format!(
                "error: MCP server '{server}' refused the call: {refusal}"
            ));
        }
        match called {
            Ok(Ok(result)) => {
                if let Some(problem) = structured_mismatch(output_schema, &result) {
                    return ToolOutput::error(format!(
                        "error: the result of MCP tool '{server_tool}' of server '{server}' \
                         does not match the tool's outputSchema: {problem}"
                    ));
                }
                let (outcome, text) = render(&result);
                ToolOutput { outcome, content: fence_untrusted(source, &text), raw: None }
            }
            Err(Elapsed) => ToolOutput::error(format!(
                "error: MCP tool '{server_tool}' of server '{server}' did not answer within {} ms; \
                 the server was told to cancel it",
                timeout.as_millis()
            )),
            Ok(Err(error)) if lost_connection(&error) || !connection.is_alive() => {
                let status = connection.exit_status().await;
                self.discard(&connection).await;
                if status.is_none()
                    && let Some(http) = connection.last_http_error()
                {
                    // The HTTP error text may quote the server's body: its words, fenced.
                    return ToolOutput::error(format!(
                        "error: the request to MCP server '{server}' failed; a new session is \
                         started on next use:\n{}",
                        fence_untrusted(source, &http)
                    ));
                }
                let how = match status {
                    Some(status) => format!("exited ({status})"),
                    None => "closed the connection".to_owned(),
                };
                if let Some(log) = &self.log {
                    log.note(&format!("{how} during a call to '{server_tool}'"));
                }
                ToolOutput::error(format!(
                    "error: MCP server '{server}' {how} before answering; it will be restarted \
                     on next use{}",
                    self.fence_stderr("")
                ))
            }
            Ok(Err(ServiceError::McpError(error))) => ToolOutput::error(format!(
                "error: MCP server '{server}' answered with an error ({}):\n{}",
                error.code.0,
                fence_untrusted(source, &error.message)
            )),
            Ok(Err(error)) => ToolOutput::error(format!(
                "error: the call to MCP server '{server}' failed: {error}"
            )),
        }
    }

    /// `resources/read` of `arguments.uri`, within the tool timeout; text contents as they
    /// are, binary ones summarized, all fenced as untrusted text from `source` and scrubbed
    /// of the user's secrets for this server.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future sends `notifications/cancelled` for the request in flight.
    pub(crate) async fn read_resource(
        &self,
        source: &str,
        arguments: &serde_json::Value,
        running: &CallGuard,
    ) -> ToolOutput {
        let output = self.read_resource_unscrubbed(source, arguments, running).await;
        self.scrubbed(output)
    }

    /// [`ServerHandle::read_resource`] before the secrets are scrubbed.
    async fn read_resource_unscrubbed(
        &self,
        source: &str,
        arguments: &serde_json::Value,
        running: &CallGuard,
    ) -> ToolOutput {
        let server = &self.spec.name;
        let Some(uri) = arguments["uri"].as_str().filter(|uri| !uri.is_empty()) else {
            return ToolOutput::error("error: `uri` (a string) is required");
        };
        let connection = match self.live_connection().await {
            Ok(connection) => connection,
            Err(error) => {
                return ToolOutput::error(format!(
                    "error: MCP server '{server}' is not available: {}",
                    self.fence_stderr(&error.to_string())
                ));
            }
        };
        let params = rmcp::model::ReadResourceRequestParams::new(uri);
        let read =
            within(self.spec.tool_timeout, &running.pause, connection.peer().read_resource(params))
                .await;
        let result = match read {
            Ok(Ok(result)) => result,
            Err(Elapsed) => {
                return ToolOutput::error(format!(
                    "error: MCP server '{server}' did not answer resources/read within {} ms",
                    self.spec.tool_timeout.as_millis()
                ));
            }
            Ok(Err(ServiceError::McpError(error))) => {
                return ToolOutput::error(format!(
                    "error: MCP server '{server}' answered with an error ({}):\n{}",
                    error.code.0,
                    fence_untrusted(source, &error.message)
                ));
            }
            Ok(Err(error)) => {
                if lost_connection(&error) {
                    self.discard(&connection).await;
                }
                return ToolOutput::error(format!(
                    "error: resources/read on MCP server '{server}' failed: {error}"
                ));
            }
        };
        let value = serde_json::to_value(&result).unwrap_or_default();
        let mut parts = Vec::new();
        for contents in value["contents"].as_array().into_iter().flatten() {
            let uri = contents["uri"].as_str().unwrap_or(uri);
            if let Some(text) = contents["text"].as_str() {
                parts.push(format!("[resource: {uri}]\n{text}"));
            } else if let Some(blob) = contents["blob"].as_str() {
                let mime = contents["mimeType"].as_str().unwrap_or("application/octet-stream");
                parts.push(format!("[resource: {uri}, {mime}, {} base64 bytes]", blob.len()));
            }
        }
        if parts.is_empty() {
            parts.push("(no contents)".to_owned());
        }
        ToolOutput::ok(fence_untrusted(source, &parts.join("\n")))
    }

    /// `prefix` and the server's last stderr lines, fenced: they are the server's words.
    fn fence_stderr(&self, prefix: &str) -> String {
        let tail = self.stderr_tail();
        if tail.is_empty() {
            return prefix.to_owned();
        }
        let source = format!("mcp__{}__stderr", self.spec.name);
        format!(
            "{prefix}\nlast lines of its stderr:\n{}",
            fence_untrusted(&source, &tail.join("\n"))
        )
    }
}

/// Why a successful result's `structuredContent` does not satisfy the tool's
/// `outputSchema` (a tool with a schema must send it), or `None` when it does or there is no
/// schema. An error result (`isError`) is not checked.
fn structured_mismatch(
    schema: Option<&serde_json::Value>,
    result: &rmcp::model::CallToolResult,
) -> Option<String> {
    let schema = schema?;
    if result.is_error == Some(true) {
        return None;
    }
    let Some(structured) = &result.structured_content else {
        return Some("the result has no structuredContent".to_owned());
    };
    let validator = match jsonschema::validator_for(schema) {
        Ok(validator) => validator,
        Err(error) => return Some(format!("the outputSchema itself is invalid: {error}")),
    };
    let problems: Vec<String> =
        validator.iter_errors(structured).take(3).map(|error| error.to_string()).collect();
    (!problems.is_empty()).then(|| {
        let text = problems.join("; ");
        text.chars().take(500).collect()
    })
}

/// A request that did not answer within its timeout.
#[derive(Debug)]
struct Elapsed;

/// `future` within `timeout`, not counting the time the call's questions were open (a
/// person answering a server's question is not the server being slow).
///
/// # Cancel safety
///
/// Dropping it drops `future`.
async fn within<T>(
    timeout: std::time::Duration,
    pause: &Pause,
    future: impl std::future::Future<Output = T>,
) -> Result<T, Elapsed> {
    let started = tokio::time::Instant::now();
    let mut future = std::pin::pin!(future);
    let mut deadline = started + timeout;
    loop {
        tokio::select! {
            output = &mut future => return Ok(output),
            () = tokio::time::sleep_until(deadline) => {
                let counted = started.elapsed().saturating_sub(pause.paused());
                if counted >= timeout {
                    return Err(Elapsed);
                }
                deadline = tokio::time::Instant::now() + (timeout - counted);
            }
        }
    }
}

fn lost_connection(error: &ServiceError) -> bool {
    matches!(error, ServiceError::TransportClosed | ServiceError::TransportSend(_))
}
