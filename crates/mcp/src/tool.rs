//! [`McpTool`]: one tool of an MCP server as a keel [`Tool`].

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Tool, ToolContext, ToolOutput, ToolSpec};

use crate::manager::{McpToolInfo, ServerHandle};

/// A tool of an MCP server, named `mcp__<server>__<tool>`, with declared access.
#[derive(Debug)]
pub struct McpTool {
    spec: ToolSpec,
    info: McpToolInfo,
    server: Arc<ServerHandle>,
    /// The tool's `outputSchema`, which its `structuredContent` must match.
    output_schema: Option<serde_json::Value>,
    /// keel's own `read_resource` tool of the server, not one of the server's tools.
    reads_resources: bool,
}

impl McpTool {
    pub(crate) fn new(
        spec: ToolSpec,
        info: McpToolInfo,
        server: Arc<ServerHandle>,
        output_schema: Option<serde_json::Value>,
    ) -> McpTool {
        McpTool { spec, info, server, output_schema, reads_resources: false }
    }

    /// keel's `mcp__<server>__read_resource`: `resources/read` of one URI on the server.
    pub(crate) fn read_resource(
        spec: ToolSpec,
        info: McpToolInfo,
        server: Arc<ServerHandle>,
    ) -> McpTool {
        McpTool { spec, info, server, output_schema: None, reads_resources: true }
    }

    /// What `keel mcp list` shows about it.
    pub fn info(&self) -> &McpToolInfo {
        &self.info
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// Calls the tool on its server (restarting the server if it died), within the
    /// server's tool timeout. The result text is fenced as untrusted; `isError: true`,
    /// timeouts and a dead server are `error` results.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future sends `notifications/cancelled` for the call in flight.
    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        // While it runs, the server's questions go to the user through this call.
        let running = self.server.begin_call(context.elicitor.clone());
        if self.reads_resources {
            return self.server.read_resource(&self.spec.name, arguments, &running).await;
        }
        self.server
            .call(
                &self.spec.name,
                &self.info.server_tool,
                arguments,
                self.output_schema.as_ref(),
                &running,
            )
            .await
    }
}
