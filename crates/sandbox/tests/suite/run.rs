//! `run` in bypass mode: completion, cleanup, capture.

use std::path::Path;
use std::time::Duration;

use keel_sandbox::{CommandSpec, SandboxError, SandboxMode, Termination, run};

fn bash(dir: &Path, script: &str, timeout: Duration) -> CommandSpec {
    CommandSpec::new("bash", dir, timeout).arg("-c").arg(script)
}

/// Whether `pid` is a live process (not absent, not a zombie).
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

async fn wait_dead(pid: u32) -> bool {
    for _ in 0..50 {
        if !is_alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    false
}

fn read_pid(path: &Path) -> u32 {
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

#[tokio::test]
async fn captures_stdout_stderr_and_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &bash(dir.path(), "echo out; sleep 0.1; echo err >&2; exit 3", Duration::from_secs(10)),
        SandboxMode::Bypass,
    )
    .await
    .unwrap();
    assert_eq!(out.termination, Termination::Exited { code: 3 });
    assert_eq!(out.stdout.text, "out\n");
    assert_eq!(out.stderr.text, "err\n");
    assert_eq!(out.last_line.as_deref(), Some("err"));
}

#[tokio::test]
async fn runs_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&bash(dir.path(), "pwd -P", Duration::from_secs(10)), SandboxMode::Bypass)
        .await
        .unwrap();
    assert_eq!(out.stdout.text.trim(), dir.path().canonicalize().unwrap().to_str().unwrap());
}

#[tokio::test]
async fn reports_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&bash(dir.path(), "kill -TERM $$", Duration::from_secs(10)), SandboxMode::Bypass)
        .await
        .unwrap();
    assert_eq!(out.termination, Termination::Signaled { signal: 15 });
    assert_eq!(out.termination.to_string(), "killed by signal 15");
}

#[tokio::test]
async fn stdin_is_at_end_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &bash(dir.path(), "read -r answer; echo \"got:[$answer] $?\"", Duration::from_secs(10)),
        SandboxMode::Bypass,
    )
    .await
    .unwrap();
    assert_eq!(out.stdout.text, "got:[] 1\n");
    assert!(out.elapsed < Duration::from_secs(2));
}

#[tokio::test]
async fn new_session_without_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        "ps -o sid= -p $$; echo pid $$; (exec 3</dev/tty) 2>/dev/null && echo tty || echo no-tty";
    let out =
        run(&bash(dir.path(), script, Duration::from_secs(10)), SandboxMode::Bypass).await.unwrap();
    let mut lines = out.stdout.text.lines();
    let sid = lines.next().unwrap().trim().to_owned();
    let pid = lines.next().unwrap().trim_start_matches("pid ").to_owned();
    assert_eq!(sid, pid, "the shell leads its own session");
    assert_eq!(lines.next(), Some("no-tty"));
}

#[tokio::test]
async fn non_interactive_environment_and_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let spec = bash(
        dir.path(),
        "echo $GIT_EDITOR $GIT_TERMINAL_PROMPT $CI $PAGER $GIT_PAGER $DEBIAN_FRONTEND $TERM $EXTRA",
        Duration::from_secs(10),
    )
    .env("PAGER", "less")
    .env("EXTRA", "x");
    let out = run(&spec, SandboxMode::Bypass).await.unwrap();
    assert_eq!(out.stdout.text, "true 0 1 less cat noninteractive dumb x\n");
}

#[tokio::test]
async fn background_child_does_not_hang_the_call_and_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("bg.pid");
    let script = format!("sleep 1000 & echo $! > {}; echo started", pid_file.display());
    let out = run(&bash(dir.path(), &script, Duration::from_secs(60)), SandboxMode::Bypass)
        .await
        .unwrap();
    assert!(out.elapsed < Duration::from_secs(2), "{:?}", out.elapsed);
    assert!(out.termination.success());
    assert_eq!(out.stdout.text, "started\n");
    assert!(wait_dead(read_pid(&pid_file)).await, "the background child was killed with its group");
}

#[tokio::test]
async fn timeout_kills_the_group_and_reports_the_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("bg.pid");
    let script = format!(
        "sleep 1000 & echo $! > {}; printf 'Ok to proceed? (y) '; sleep 1000",
        pid_file.display()
    );
    let out = run(&bash(dir.path(), &script, Duration::from_millis(500)), SandboxMode::Bypass)
        .await
        .unwrap();
    assert_eq!(out.termination, Termination::TimedOut { after: Duration::from_millis(500) });
    assert!(out.elapsed < Duration::from_secs(3), "{:?}", out.elapsed);
    assert_eq!(out.last_line.as_deref(), Some("Ok to proceed? (y)"));
    assert!(wait_dead(read_pid(&pid_file)).await, "the background child was killed at the timeout");
}

#[tokio::test]
async fn dropping_the_future_kills_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("fg.pid");
    let script = format!("sleep 1000 & echo $! > {}; sleep 1000", pid_file.display());
    let spec = bash(dir.path(), &script, Duration::from_secs(600));
    let call = run(&spec, SandboxMode::Bypass);
    let cancelled = tokio::time::timeout(Duration::from_millis(500), call).await;
    assert!(cancelled.is_err(), "the call was still running");
    assert!(wait_dead(read_pid(&pid_file)).await, "cancellation killed the group");
}

#[tokio::test]
async fn output_is_capped_with_head_and_tail() {
    let dir = tempfile::tempdir().unwrap();
    let script = "echo FIRST; head -c 100000 /dev/zero | tr '\\0' x; echo; echo LAST";
    let spec = bash(dir.path(), script, Duration::from_secs(10)).output_cap_bytes(1000);
    let out = run(&spec, SandboxMode::Bypass).await.unwrap();
    assert!(out.stdout.text.starts_with("FIRST\n"));
    assert!(out.stdout.text.ends_with("LAST\n"));
    assert_eq!(out.stdout.total_bytes, 6 + 100_000 + 1 + 5);
    assert_eq!(out.stdout.omitted_bytes, out.stdout.total_bytes - 1000);
    assert!(out.stdout.text.contains(&format!("{} bytes omitted", out.stdout.omitted_bytes)));
    assert!(out.stdout.text.contains("capped at 1000 bytes"));
}

#[tokio::test]
async fn non_utf8_output_is_made_safe() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &bash(dir.path(), "printf 'a\\377\\376b\\n'", Duration::from_secs(10)),
        SandboxMode::Bypass,
    )
    .await
    .unwrap();
    // Issue #12: escaped, never replaced by U+FFFD, and exact beside the text.
    assert_eq!(out.stdout.text, "a\\xff\\xfeb\n");
    assert_eq!(out.stdout.exact.n_escaped(), 2);
    assert_eq!(out.stdout.exact.clone().finish().1.unwrap().0, b"a\xff\xfeb\n");
}

#[tokio::test]
async fn missing_program_is_a_spawn_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = CommandSpec::new("keel-no-such-program", dir.path(), Duration::from_secs(1));
    let error = run(&spec, SandboxMode::Bypass).await.unwrap_err();
    assert!(matches!(error, SandboxError::Spawn { .. }), "{error:?}");
}

#[tokio::test]
async fn missing_working_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = bash(&dir.path().join("nope"), "true", Duration::from_secs(1));
    let error = run(&spec, SandboxMode::Bypass).await.unwrap_err();
    assert!(matches!(error, SandboxError::BadWorkingDirectory { .. }), "{error:?}");
}
