//! The harness of the ACP suite: the official SDK's client (crates/cli/tests/acp) run on a
//! scenario against `keel acp`, `keel acp` spoken to line by line, a scripted model with a
//! price, and what the client saw and the ledger kept.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::suite::support::{Env, json_lines, repo_root};

/// The folder with the installed ACP SDK: `KEEL_ACP_CLIENT_DIR`, else crates/cli/tests/acp.
/// Fails (never skips) when it is not installed.
fn client_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_ACP_CLIENT_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("crates/cli/tests/acp"));
    assert!(
        dir.join("node_modules/@agentclientprotocol/sdk/package.json").is_file(),
        "the ACP SDK is not installed in {}: run `scripts/test`, which installs it (or point \
         KEEL_ACP_CLIENT_DIR at a folder with its node_modules)",
        dir.display()
    );
    dir
}

/// Runs crates/cli/tests/acp/client.mjs SCENARIO against `keel acp ARGS`; what it saw.
pub(super) fn run_client(
    env: &Env,
    scenario: &str,
    args: &[String],
    cwd: &Path,
    extra: &[(&str, &str)],
) -> Value {
    let mut command = Command::new("node");
    command
        .arg(repo_root().join("crates/cli/tests/acp/client.mjs"))
        .arg(scenario)
        .env("KEEL_ACP_CLIENT_DIR", client_dir())
        .env("KEEL_BIN", env!("CARGO_BIN_EXE_keel"))
        .env("KEEL_ARGS", serde_json::to_string(args).unwrap())
        .env("ACP_CWD", cwd)
        .env("KEEL_HOME", env.home.path())
        .env("XDG_CONFIG_HOME", env.home.path().join("xdg-config"))
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .stdin(Stdio::null());
    for (key, value) in extra {
        command.env(key, value);
    }
    let output = command.output().expect("node runs (Node.js is a test prerequisite)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the ACP client failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

/// The session's ledger, `keel log --json` (which must succeed).
pub(super) fn keel_log(env: &Env, session: &str) -> Vec<Value> {
    let output = env.run(&["log", session, "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    json_lines(&output)
}

/// The `session/update`s of kind `kind` the client saw.
pub(super) fn updates_of<'a>(seen: &'a Value, kind: &str) -> Vec<&'a Value> {
    seen["updates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|update| update["sessionUpdate"] == kind)
        .collect()
}

/// Writes the script and a price for it; the `keel acp` arguments that use them.
pub(super) fn scripted_args(env: &Env, name: &str, script: &str) -> Vec<String> {
    let path = env.write_script(name, script);
    std::fs::write(
        env.home.path().join("prices.toml"),
        format!("[\"scripted:{}\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n", path.display()),
    )
    .unwrap();
    vec![
        "-m".into(),
        format!("scripted:{}", path.display()),
        "--context-window".into(),
        "100000".into(),
    ]
}

/// `keel acp` spoken to line by line: the raw protocol, for what no SDK would send.
pub(super) struct Raw {
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
}

impl Raw {
    pub(super) fn start(env: &Env, args: &[String]) -> Raw {
        Raw::start_with(env, args, &[])
    }

    pub(super) fn start_with(env: &Env, args: &[String], vars: &[(&str, &str)]) -> Raw {
        let mut command = env.keel();
        for (key, value) in vars {
            command.env(key, value);
        }
        let mut child = command
            .arg("acp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value = serde_json::from_str(&line).unwrap_or_else(|e| {
                    panic!("keel acp wrote a line that is not JSON ({e}): {line}")
                });
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Raw { child, stdin, lines }
    }

    pub(super) fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The next message `keep` accepts (others are dropped); fails after 30 s.
    pub(super) fn until(&mut self, what: &str, mut keep: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(value) if keep(&value) => return value,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("no {what} within 30 s"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("keel acp closed stdout before {what}")
                }
            }
        }
    }

    pub(super) fn response(&mut self, id: u64) -> Value {
        self.until(&format!("response {id}"), |v| v["id"] == id && v.get("method").is_none())
    }

    /// The answer to prompt `id`, failing if a permission request comes first: no
    /// request may come, the answer is the next message with this id.
    pub(super) fn answer_without_asking(&mut self, id: u64) -> Value {
        self.until(&format!("the answer to prompt {id}"), |v| {
            assert_ne!(v["method"], "session/request_permission", "asked under {v}");
            v["id"] == id
        })
    }

    pub(super) fn initialize(&mut self) {
        self.send(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#);
        let init = self.response(1);
        assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    }

    /// `session/new` in `cwd` as request `id`; its response.
    pub(super) fn new_session(&mut self, id: u64, cwd: &Path) -> Value {
        self.send(
            &json!({"jsonrpc":"2.0","id":id,"method":"session/new","params":{"cwd":cwd,"mcpServers":[]}})
                .to_string(),
        );
        self.response(id)
    }

    /// [`Raw::new_session`]'s new session id.
    pub(super) fn open_session(&mut self, id: u64, cwd: &Path) -> String {
        self.new_session(id, cwd)["result"]["sessionId"].as_str().unwrap().to_owned()
    }

    /// Sends `session/prompt` as request `id`: `text` to `session`.
    pub(super) fn prompt(&mut self, id: u64, session: &str, text: &str) {
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":session,"prompt":[{"type":"text","text":text}]}}).to_string());
    }

    /// `session/set_mode` of `session` to `mode` as request `id`; its response.
    pub(super) fn set_mode(&mut self, id: u64, session: &str, mode: &str) -> Value {
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":"session/set_mode","params":{"sessionId":session,"modeId":mode}}).to_string());
        self.response(id)
    }

    /// Answers the permission request `asked` by selecting `option`.
    pub(super) fn select(&mut self, asked: &Value, option: &str) {
        self.send(&json!({"jsonrpc":"2.0","id":asked["id"],"result":{"outcome":{"outcome":"selected","optionId":option}}}).to_string());
    }

    pub(super) fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "keel acp did not exit within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
