//! What the client sends, in keel's terms: a prompt's blocks as the turn's input, and the
//! MCP servers it declares as `[mcp_servers.NAME]` tables.

use agent_client_protocol::v1::schema::{ContentBlock, EmbeddedResourceResource, McpServer};

use crate::error::invalid_params;

/// The text of a prompt: text blocks as they are, embedded text resources after them,
/// resource links as `@uri` mentions.
pub(crate) fn prompt_text(blocks: &[ContentBlock]) -> String {
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
pub(crate) fn client_mcp_server(
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
