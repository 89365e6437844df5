//! npm's server-everything over stdio: listing, echo, get-sum, a timed-out long operation.

use std::time::{Duration, Instant};

use keel_contracts::{Access, Outcome};
use keel_mcp::ServerState;

use super::support::{Scratch, call, everything_stdio, names, server_js, unfence};

#[tokio::test]
async fn stdio_server_everything_lists_tools_and_answers_echo_and_get_sum() {
    let scratch = Scratch::new();
    let servers = scratch.start(&[("everything", &everything_stdio(""))]).await;
    let status = &servers.statuses()[0];
    assert_eq!(status.state, ServerState::Connected, "{status:?}");
    assert_eq!(status.transport, format!("stdio: node {} stdio", server_js("server-everything")));
    let names = names(&servers);
    for expected in [
        "mcp__everything__echo",
        "mcp__everything__get-sum",
        "mcp__everything__trigger-long-running-operation",
    ] {
        assert!(names.iter().any(|name| name == expected), "{expected} not in {names:?}");
    }
    // Undeclared tools of a local server are writes, whatever the server hints.
    let echo = status.tools.iter().find(|tool| tool.server_tool == "echo").unwrap();
    assert_eq!((echo.access, echo.read_only_hint), (Access::Write, Some(true)));

    let output =
        call(&servers, "mcp__everything__echo", serde_json::json!({"message": "hello keel"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(unfence(&output.content, "mcp__everything__echo"), "Echo: hello keel");

    let output =
        call(&servers, "mcp__everything__get-sum", serde_json::json!({"a": 2, "b": 40})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    let text = unfence(&output.content, "mcp__everything__get-sum");
    assert!(text.contains("42"), "{text}");
}

#[tokio::test]
async fn a_long_running_operation_times_out_in_time_and_the_server_stays_usable() {
    let scratch = Scratch::new();
    let servers =
        scratch.start(&[("everything", &everything_stdio("tool_timeout_ms = 500"))]).await;
    let started = Instant::now();
    let output = call(
        &servers,
        "mcp__everything__trigger-long-running-operation",
        serde_json::json!({"duration": 30, "steps": 3}),
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(output.outcome, Outcome::Error, "{}", output.content);
    assert!(output.content.contains("did not answer within 500 ms"), "{}", output.content);
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");

    let output =
        call(&servers, "mcp__everything__echo", serde_json::json!({"message": "after"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(unfence(&output.content, "mcp__everything__echo"), "Echo: after");
}

#[tokio::test]
async fn elicitation_is_declined_with_a_reason_and_kept_and_sampling_is_not_offered() {
    for (policy, reason_names) in [
        (keel_mcp::ElicitationPolicy::Decline, "--approval auto"),
        // server-everything requires `name`, which has no default.
        (keel_mcp::ElicitationPolicy::AcceptDefaults, "name"),
    ] {
        let scratch = Scratch::new();
        let mut options = scratch.options();
        options.elicitation = policy;
        let spec = super::support::spec("everything", &everything_stdio(""));
        let servers = keel_mcp::McpServers::start(vec![spec], options).await;
        let names = names(&servers);
        // keel offers no sampling, so the server offers no sampling tool.
        assert!(!names.iter().any(|name| name.contains("sampling")), "{names:?}");
        let output =
            call(&servers, "mcp__everything__trigger-elicitation-request", serde_json::json!({}))
                .await;
        assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
        let text = unfence(&output.content, "mcp__everything__trigger-elicitation-request");
        assert!(text.contains("declined"), "{text}");
        let asked = servers.elicitations();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!((asked[0].server.as_str(), asked[0].action), ("everything", "decline"));
        assert!(asked[0].message.contains("Please provide inputs"), "{asked:?}");
        let reason = asked[0].reason.as_deref().unwrap_or_default();
        assert!(reason.contains(reason_names), "{policy:?}: {reason}");
    }
}

#[tokio::test]
async fn resource_links_can_be_read_through_read_resource_as_a_read_of_the_server() {
    let scratch = Scratch::new();
    let servers = scratch.start(&[("everything", &everything_stdio(""))]).await;
    let status = &servers.statuses()[0];
    let read = status.tools.iter().find(|tool| tool.name == "mcp__everything__read_resource");
    let read = read.unwrap_or_else(|| panic!("no read_resource in {:?}", names(&servers)));
    // A read of a local server: no egress, so no consent; a remote one keeps its egress.
    assert_eq!((read.access, read.effects.egress), (Access::Read, keel_contracts::Egress::None));
    let output =
        call(&servers, "mcp__everything__get-resource-links", serde_json::json!({"count": 2}))
            .await;
    let text = unfence(&output.content, "mcp__everything__get-resource-links");
    let uri = text
        .lines()
        .find_map(|line| line.strip_prefix("[resource link: "))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("no resource link in {text}"))
        .to_owned();
    let output =
        call(&servers, "mcp__everything__read_resource", serde_json::json!({"uri": uri})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    let contents = unfence(&output.content, "mcp__everything__read_resource");
    assert!(contents.starts_with(&format!("[resource: {uri}")), "{contents}");
    let missing = call(&servers, "mcp__everything__read_resource", serde_json::json!({})).await;
    assert_eq!(missing.outcome, Outcome::Error, "{}", missing.content);
}
