//! Declared access against real servers: config first; otherwise stdio tools are writes
//! and remote tools are writes with external egress; `readOnlyHint` counts only for a
//! trusted server.

use keel_contracts::{Access, Egress, requires_consent};
use keel_mcp::{AccessSource, McpToolInfo, ServerState};

use super::support::{HttpEverything, Scratch, everything_stdio, tool};

fn find<'a>(tools: &'a [McpToolInfo], server_tool: &str) -> &'a McpToolInfo {
    tools.iter().find(|tool| tool.server_tool == server_tool).unwrap()
}

#[tokio::test]
async fn declared_access_table_with_real_servers() {
    let http = HttpEverything::start();
    let scratch = Scratch::new();
    let servers = scratch
        .start(&[
            // Untrusted local server, two declarations.
            (
                "local",
                &everything_stdio(
                    "[tools.echo]\naccess = \"read\"\n[tools.get-sum]\naccess = \"write\"\negress = \"external\"\n",
                ),
            ),
            // Trusted local server: its readOnlyHint counts where nothing is declared.
            ("trusted", &everything_stdio("trusted = true\n[tools.get-sum]\naccess = \"write\"\n")),
            // Remote server: external egress unless declared.
            (
                "remote",
                &format!(
                    "url = \"{}\"\n[tools.echo]\naccess = \"read\"\n[tools.get-sum]\naccess = \"read\"\negress = \"internal\"\n",
                    http.url()
                ),
            ),
        ])
        .await;
    for status in servers.statuses() {
        assert_eq!(status.state, ServerState::Connected, "{status:?}");
    }
    let statuses = servers.statuses();
    let (local, trusted, remote) = (&statuses[0].tools, &statuses[1].tools, &statuses[2].tools);
    // (tools, server tool) -> (access, egress, source, readOnlyHint shown)
    let table = [
        (local, "echo", Access::Read, Egress::None, AccessSource::Config, Some(true)),
        (local, "get-sum", Access::Write, Egress::External, AccessSource::Config, Some(true)),
        (local, "get-env", Access::Write, Egress::None, AccessSource::Default, Some(true)),
        (trusted, "echo", Access::Read, Egress::None, AccessSource::TrustedHint, Some(true)),
        (trusted, "get-sum", Access::Write, Egress::None, AccessSource::Config, Some(true)),
        (remote, "echo", Access::Read, Egress::External, AccessSource::Config, Some(true)),
        (remote, "get-sum", Access::Read, Egress::Internal, AccessSource::Config, Some(true)),
        (remote, "get-env", Access::Write, Egress::External, AccessSource::Default, Some(true)),
    ];
    for (tools, server_tool, access, egress, source, hint) in table {
        let info = find(tools, server_tool);
        assert_eq!(
            (info.access, info.effects.egress, info.source, info.read_only_hint),
            (access, egress, source, hint),
            "{}",
            info.name
        );
    }
    // The specs the kernel gates on say the same; none is intrinsic or first-party.
    for tool in servers.tools() {
        let spec = tool.spec();
        assert!(!spec.intrinsic && !spec.first_party, "{}", spec.name);
    }
    let consent = |name: &str| requires_consent(tool(&servers, name).spec());
    assert!(!consent("mcp__local__echo"));
    assert!(consent("mcp__local__get-env"));
    assert!(!consent("mcp__trusted__echo"));
    assert!(consent("mcp__remote__echo"), "a remote read still asks: external egress");
    assert!(!consent("mcp__remote__get-sum"));
}
