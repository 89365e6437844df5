//! [`McpServers`]: starts every configured server in parallel, lists its tools and
//! reports each server's status; the servers' handles keep the connections (see
//! `crate::server`).

use std::sync::Arc;

use keel_contracts::Tool;

use crate::client::{Elicitation, KeelClient, ToolLists};
use crate::config::{ServerSpec, TransportSpec};
use crate::error::ConnectError;
use crate::options::StartOptions;
use crate::secrets::Secrets;
use crate::server::ServerHandle;
use crate::status::{ServerState, ServerStatus};
use crate::stdio::ServerLog;
use crate::tool::{McpTool, build_tools};

/// The configured MCP servers and their tools.
#[derive(Debug)]
pub struct McpServers {
    statuses: Vec<ServerStatus>,
    handles: Vec<Arc<ServerHandle>>,
    /// Every server's current tools (changed by `tools/list_changed`).
    lists: Arc<ToolLists>,
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
        let lists = Arc::new(ToolLists::default());
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
    lists: (Arc<ToolLists>, usize),
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
