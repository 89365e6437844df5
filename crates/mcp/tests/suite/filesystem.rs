//! npm's server-filesystem over stdio, rooted in a temporary workspace.

use keel_contracts::{Access, Outcome};
use keel_mcp::{AccessSource, ServerState};

use super::support::{Scratch, call, quoted, server_js, unfence};

#[tokio::test]
async fn stdio_server_filesystem_lists_tools_and_reads_a_file() {
    let scratch = Scratch::new();
    let workspace = scratch.workspace();
    std::fs::write(workspace.join("notes.txt"), "line one\nline two\n").unwrap();
    // `.` is the server's allowed folder: a stdio server runs in the workspace.
    let config = format!(
        "command = \"node\"\nargs = [{}, \".\"]\n[tools.read_text_file]\naccess = \"read\"\n",
        quoted(&server_js("server-filesystem"))
    );
    let servers = scratch.start(&[("fs", &config)]).await;
    let status = &servers.statuses()[0];
    assert_eq!(status.state, ServerState::Connected, "{status:?}");
    assert!(status.notes.is_empty(), "{:?}", status.notes);
    let tool = |name: &str| status.tools.iter().find(|tool| tool.server_tool == name).unwrap();
    assert_eq!(
        (tool("read_text_file").access, tool("read_text_file").source),
        (Access::Read, AccessSource::Config)
    );
    assert_eq!(
        (tool("write_file").access, tool("write_file").source),
        (Access::Write, AccessSource::Default)
    );
    assert_eq!(tool("list_directory").read_only_hint, Some(true));
    assert_eq!(tool("list_directory").access, Access::Write);

    let path = workspace.join("notes.txt").display().to_string();
    let output = call(&servers, "mcp__fs__read_text_file", serde_json::json!({"path": path})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(unfence(&output.content, "mcp__fs__read_text_file"), "line one\nline two");

    // Outside its root the server refuses: an error result, fenced like any server text.
    let output =
        call(&servers, "mcp__fs__read_text_file", serde_json::json!({"path": "/etc/hostname"}))
            .await;
    assert_eq!(output.outcome, Outcome::Error, "{}", output.content);
    assert!(output.content.contains("<<<untrusted:mcp__fs__read_text_file:"), "{}", output.content);
}
