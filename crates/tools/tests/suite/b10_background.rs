//! B10: the shell tool returns when the foreground shell exits, even when a background
//! process still holds the output pipes. Policy: leftover children are killed with the
//! process group when the call ends.

use std::time::{Duration, Instant};

use keel_contracts::{Outcome, ToolOutput};
use serde_json::json;

use super::support::Fixture;

async fn run_b10(fixture: &Fixture, command: &str) -> (ToolOutput, Duration) {
    let started = Instant::now();
    let output = fixture.call("bash", json!({"command": command, "timeout_ms": 60_000})).await;
    (output, started.elapsed())
}

#[tokio::test]
async fn background_sleep() {
    let fixture = Fixture::new();
    let (output, elapsed) = run_b10(&fixture, "sleep 30 & echo started").await;
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "started\n[exit code 0]");
}

#[tokio::test]
async fn background_server_and_curl() {
    let fixture = Fixture::new();
    let command = "python3 -m http.server 8765 --bind 127.0.0.1 & sleep 1; curl -s -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:8765/; echo done";
    let (output, elapsed) = run_b10(&fixture, command).await;
    // The foreground takes about 1 s (the sleep); it must return within 2 s of that.
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("\n200\ndone\n"), "{}", output.content);
    assert!(output.content.ends_with("[exit code 0]"), "{}", output.content);
    // The server died with the group: the port stops accepting connections.
    let mut closed = false;
    for _ in 0..50 {
        if std::net::TcpStream::connect("127.0.0.1:8765").is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(closed, "the background server was killed with the process group");
}

#[tokio::test]
async fn background_writer_keeps_writing() {
    let fixture = Fixture::new();
    let command = "(while true; do echo tick; sleep 0.2; done) & sleep 1; echo foreground-finished";
    let (output, elapsed) = run_b10(&fixture, command).await;
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("foreground-finished\n"), "{}", output.content);
    assert!(output.content.starts_with("tick\n"), "{}", output.content);
    assert!(output.content.ends_with("[exit code 0]"), "{}", output.content);
}

#[tokio::test]
async fn detached_background_job() {
    let fixture = Fixture::new();
    let (output, elapsed) =
        run_b10(&fixture, "sleep 3 </dev/null >/dev/null 2>&1 & echo detached").await;
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "detached\n[exit code 0]");
}
