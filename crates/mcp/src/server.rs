//! One configured server and its current connection ([`ServerHandle`]), shared by its
//! tools: (re)connecting within the startup timeout, calling a tool or reading a resource
//! within the tool timeout (not counting time the user spent answering the server's
//! questions), and scrubbing and fencing what the server says.

use std::sync::Arc;

use keel_contracts::{ToolOutput, fence_untrusted};
use rmcp::ServiceError;
use rmcp::model::CallToolRequestParams;

use crate::client::{CallGuard, Elicitation, KeelClient, Pause};
use crate::config::ServerSpec;
use crate::connection::Connection;
use crate::error::ConnectError;
use crate::options::StartOptions;
use crate::result::render;
use crate::secrets::Secrets;
use crate::stdio::ServerLog;

/// One configured server and its current connection, shared by its tools.
#[derive(Debug)]
pub(crate) struct ServerHandle {
    /// The server's validated configuration.
    pub(crate) spec: ServerSpec,
    /// What it was started with.
    pub(crate) options: Arc<StartOptions>,
    /// Its log (stdio servers).
    pub(crate) log: Option<Arc<ServerLog>>,
    /// keel's side of every session with this server.
    pub(crate) handler: KeelClient,
    /// What the handler answered to `elicitation/create`.
    pub(crate) elicitations: Arc<std::sync::Mutex<Vec<Elicitation>>>,
    /// `None` before the first start and after the connection died.
    pub(crate) connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// The user's secrets for this server, scrubbed from everything it says.
    pub(crate) secrets: Secrets,
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

    pub(crate) fn stderr_tail(&self) -> Vec<String> {
        self.log.as_ref().map(|log| log.tail()).unwrap_or_default()
    }

    /// A new connection (not stored).
    pub(crate) async fn connect(&self) -> Result<Arc<Connection>, ConnectError> {
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
    pub(crate) async fn close(&self) {
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
