//! `bash`: outcomes, exit status, timeout, caps, non-UTF-8, managed mode.

use std::time::{Duration, Instant};

use keel_contracts::{Outcome, SandboxMode};
use serde_json::json;

use super::support::{Fixture, context, tool, wait_dead};

#[tokio::test]
async fn runs_in_the_workspace_root() {
    let fixture = Fixture::new();
    let output = fixture.call("bash", json!({"command": "pwd -P; echo hi >&2"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, format!("{}\n[stderr]\nhi\n[exit code 0]", fixture.root.display()));
}

#[tokio::test]
async fn non_zero_exit_is_ok_with_the_status() {
    let fixture = Fixture::new();
    let output = fixture.call("bash", json!({"command": "echo failing; exit 3"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "failing\n[exit code 3]");
}

#[tokio::test]
async fn a_signal_is_ok_with_the_signal() {
    let fixture = Fixture::new();
    let output = fixture.call("bash", json!({"command": "kill -KILL $$"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "[killed by signal 9]");
}

#[tokio::test]
async fn timeout_is_an_error_and_kills_the_group() {
    let fixture = Fixture::new();
    let started = Instant::now();
    let output = fixture
        .call(
            "bash",
            json!({"command": "sleep 1000 & echo $! > bg.pid; echo waiting; sleep 1000", "timeout_ms": 500}),
        )
        .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(output.outcome, Outcome::Error);
    assert!(
        output.content.starts_with(
            "command timed out after 500 ms and was killed with its process group; last output line: waiting"
        ),
        "{}",
        output.content
    );
    let pid: u32 = fixture.read("bg.pid").trim().parse().unwrap();
    assert!(wait_dead(pid).await, "the `sleep 1000 &` child is gone after the call");
}

#[tokio::test]
async fn output_is_capped_with_head_and_tail() {
    let fixture = Fixture::new();
    // About 15 MB of output against the 8 MiB cap per stream.
    let output =
        fixture.call("bash", json!({"command": "echo HEAD; seq 1 2000000; echo TAIL"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.starts_with("HEAD\n1\n2\n"));
    assert!(output.content.ends_with("2000000\nTAIL\n[exit code 0]"));
    assert!(
        output.content.contains("bytes omitted: output is capped at 8388608 bytes per stream"),
        "{}",
        output.content.len()
    );
    assert!(output.content.len() < 8 * 1024 * 1024 + 1024);
}

#[tokio::test]
async fn non_utf8_output_is_made_safe() {
    let fixture = Fixture::new();
    let output = fixture.call("bash", json!({"command": r"printf 'ok \xff\xfe done\n'"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    // Issue #12: escaped, never replaced by U+FFFD; the exact bytes are in `raw`.
    assert_eq!(
        output.content,
        "ok \\xff\\xfe done\n[exit code 0]\n[keel: 2 bytes shown as \\xNN escapes (not UTF-8 text or control bytes); the ledger keeps the exact bytes]\n"
    );
    assert_eq!(output.raw.unwrap().0, b"ok \xff\xfe done\n[exit code 0]");
}

#[tokio::test]
async fn bad_arguments_are_errors() {
    let fixture = Fixture::new();
    for (arguments, expected) in [
        (json!({"command": "  "}), "command is empty"),
        (json!({"command": "true", "timeout_ms": 0}), "at least 1"),
        (json!({"command": "true", "timeout_ms": 600_001}), "above the maximum"),
        (json!({"command": "true", "stdin": "y"}), "invalid arguments for bash"),
        (json!({}), "invalid arguments for bash"),
    ] {
        let output = fixture.call("bash", arguments.clone()).await;
        assert_eq!(output.outcome, Outcome::Error, "{arguments}");
        assert!(output.content.contains(expected), "{arguments}: {}", output.content);
    }
}

#[tokio::test]
async fn missing_workspace_is_an_error() {
    let fixture = Fixture::new();
    let context = super::support::context(&fixture.root.join("gone"), SandboxMode::Bypass);
    let output = super::support::call(&context, "bash", json!({"command": "true"})).await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(output.content.contains("workspace root"), "{}", output.content);
}

#[tokio::test]
async fn managed_mode_runs_contained() {
    let mut fixture = Fixture::new();
    fixture.sandbox = SandboxMode::Managed;
    let output = fixture.call("bash", json!({"command": "touch ran; touch ../escaped"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("Permission denied"), "{}", output.content);
    assert!(output.content.ends_with("[exit code 1]"), "{}", output.content);
    assert!(fixture.root.join("ran").exists());
    assert!(!fixture.outside().join("escaped").exists());
}

#[tokio::test]
async fn file_tools_work_in_managed_mode() {
    let mut fixture = Fixture::new();
    fixture.sandbox = SandboxMode::Managed;
    let output = fixture.call("write_file", json!({"path": "a.txt", "content": "x\n"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    let output = fixture.call("read_file", json!({"path": "a.txt"})).await;
    assert_eq!(output.content, "     1\tx\n");
    let output = fixture.call("read_file", json!({"path": "../a.txt"})).await;
    assert!(output.content.contains("outside the workspace"));
}

/// A boundary the user granted through `request_boundary` (carried in the tool context)
/// widens what the managed sandbox lets a command write; without it the same write fails.
#[tokio::test]
async fn a_granted_boundary_widens_managed_bash() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("granted.txt");
    let fixture = Fixture::new();
    let command = format!("echo hi > {}", target.display());
    let mut context = context(&fixture.root, keel_contracts::SandboxMode::Managed);
    let denied = tool("bash").invoke(&context, &serde_json::json!({"command": command})).await;
    assert!(!target.exists(), "wrote outside the workspace without a grant: {}", denied.content);
    context.boundary.write.push(outside.path().display().to_string());
    let granted = tool("bash").invoke(&context, &serde_json::json!({"command": command})).await;
    assert_eq!(granted.outcome, keel_contracts::Outcome::Ok, "{}", granted.content);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hi\n");
}
