//! The harness of the CLI-contract suite: a run whose command takes long enough to be
//! stopped, cancelled or killed mid-call, started in the background, and the wait until
//! that command runs.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::suite::support::{Env, stdout};

/// A command that sleeps 30 s (writing late.txt after), beside a read: two open calls.
pub(super) const LONG_COMMAND: &str = r#"{"steps":[
    {"tool_calls":[{"name":"bash","arguments":{"command":"sleep 30; echo late > late.txt"}},{"name":"read_file","arguments":{"path":"a.txt"}}]},
    {"text":"never"}
]}"#;

/// `keel run` of `model` in `ws` under `--approval auto --sandbox bypass`, in the
/// background; its stdout and stderr are `stdio()` (piped to read them, or null).
pub(super) fn start_run(env: &Env, ws: &Path, model: &str, stdio: fn() -> Stdio) -> Child {
    env.keel()
        .args(["run", "-C", ws.to_str().unwrap(), "-m", model, "--approval", "auto"])
        .args(["--sandbox", "bypass", "t"])
        .stdout(stdio())
        .stderr(stdio())
        .spawn()
        .unwrap()
}

/// Waits until the newest session's [`LONG_COMMAND`] runs; that session's id.
pub(super) fn wait_for_prepared(env: &Env) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = env.run(&["sessions", "--json"]);
        if let Some(line) = stdout(&listed).lines().next() {
            let session: serde_json::Value = serde_json::from_str(line).unwrap();
            let id = session["session_id"].as_str().unwrap().to_owned();
            if stdout(&env.run(&["log", &id, "-v"])).contains("run call_1_1: bash") {
                return id;
            }
        }
        assert!(Instant::now() < deadline, "the run never started its command");
        std::thread::sleep(Duration::from_millis(100));
    }
}
