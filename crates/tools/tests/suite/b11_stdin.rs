//! B11: commands waiting for keyboard input get end-of-file at once; git never opens an
//! editor (no terminal, `GIT_EDITOR=true`).

use std::time::{Duration, Instant};

use keel_contracts::{Outcome, ToolOutput};
use serde_json::json;

use super::support::Fixture;

async fn run_b11(fixture: &Fixture, command: &str) -> (ToolOutput, Duration) {
    let started = Instant::now();
    let output = fixture.call("bash", json!({"command": command, "timeout_ms": 30_000})).await;
    (output, started.elapsed())
}

#[tokio::test]
async fn read_gets_end_of_file() {
    let fixture = Fixture::new();
    let (output, elapsed) = run_b11(&fixture, r#"read -r answer; echo "got:[$answer]""#).await;
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "got:[]\n[exit code 0]");
}

#[tokio::test]
async fn prompt_then_head_gets_end_of_file() {
    let fixture = Fixture::new();
    let (output, elapsed) =
        run_b11(&fixture, "printf 'Ok to proceed? (y) '; head -n1; echo after-prompt").await;
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    assert_eq!(output.content, "Ok to proceed? (y) after-prompt\n[exit code 0]");
}

#[tokio::test]
async fn python_readline_gets_end_of_file() {
    let fixture = Fixture::new();
    let (output, elapsed) =
        run_b11(&fixture, r#"python3 -c "import sys; print('line:', repr(sys.stdin.readline()))""#)
            .await;
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(output.content, "line: ''\n[exit code 0]");
}

#[tokio::test]
async fn git_commit_does_not_wait_for_an_editor() {
    let fixture = Fixture::new();
    let (output, elapsed) = run_b11(
        &fixture,
        "git init -q r && cd r && git config core.editor vi && git commit --allow-empty 2>&1 | tail -1",
    )
    .await;
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(output.outcome, Outcome::Ok);
    let message = output.content.lines().next().unwrap_or("");
    assert!(
        message.contains("Aborting commit due to empty commit message")
            || message.contains("tell me who you are")
            || message.contains("unable to auto-detect email address"),
        "{}",
        output.content
    );
}
