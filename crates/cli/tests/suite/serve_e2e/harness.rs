//! The harness of every suite that runs `keel serve` (this one, schedules and the web
//! timeline): the real binary on a free loopback port, an authenticated client, the SSE
//! stream, and the scripts and ledger reads the tests share.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::{Env, json_lines};

/// The bearer token every host is started with (unless it is to make its own).
pub(crate) const TOKEN: &str = "test-token-0123456789abcdef";

/// A running `keel serve`, killed when dropped.
pub(crate) struct Host {
    pub(crate) child: Child,
    /// `http://127.0.0.1:PORT`, as the host printed it.
    pub(crate) base: String,
    pub(crate) token: String,
    /// The web timeline's one-time login link, as the host printed it.
    pub(crate) login: String,
    stderr_path: PathBuf,
}

impl Host {
    /// Starts `keel serve` on a free loopback port with `args`, the workspace root the
    /// scratch folder, and the fixed test token.
    pub(crate) fn start(env: &Env, args: &[&str]) -> Host {
        Host::spawn(env, args, Some(TOKEN), &[])
    }

    /// [`Host::start`] with `vars` in the host's environment.
    pub(crate) fn start_with_vars(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Host {
        Host::spawn(env, args, Some(TOKEN), vars)
    }

    /// [`Host::start`] without `KEEL_SERVE_TOKEN`: the host uses (or makes) the token file
    /// in KEEL_HOME, and so does its client.
    pub(crate) fn start_with_token_file(env: &Env, args: &[&str]) -> Host {
        Host::spawn(env, args, None, &[])
    }

    fn spawn(env: &Env, args: &[&str], token: Option<&str>, vars: &[(&str, &str)]) -> Host {
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stderr_path = env.scratch.path().join(format!("serve-{n}.stderr"));
        let mut command = env.keel();
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--workspace-root"])
            .arg(env.scratch.path())
            .args(args)
            .envs(vars.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path).unwrap());
        match token {
            Some(token) => command.env("KEEL_SERVE_TOKEN", token),
            None => command.env_remove("KEEL_SERVE_TOKEN"),
        };
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next_line = || {
            let line = lines.next().unwrap_or_else(|| {
                panic!("no line; stderr: {}", std::fs::read_to_string(&stderr_path).unwrap())
            });
            line.unwrap()
        };
        let line = next_line();
        let base = line.strip_prefix("keel serve: listening on ").unwrap().trim().to_owned();
        let line = next_line();
        let login = line.strip_prefix("keel serve: web timeline at ").unwrap().trim().to_owned();
        assert!(login.starts_with(&format!("{base}/login?token=")), "{login}");
        // Keep draining stdout so the host never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        let token = match token {
            Some(token) => token.to_owned(),
            None => std::fs::read_to_string(env.home.path().join("serve.token")).unwrap(),
        };
        assert!(!login.contains(&token), "the bearer token was printed");
        Host { child, base, token, login, stderr_path }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn client(&self) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: self.base.clone(),
            token: self.token.clone(),
            stderr_path: self.stderr_path.clone(),
        }
    }

    /// What the host wrote to stderr so far.
    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// `kill -9`, and reaped, so its pid no longer reads as a live lease holder; its stderr.
    pub(crate) fn kill9(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.stderr()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An authenticated client of one host.
pub(crate) struct Client {
    pub(crate) http: reqwest::Client,
    base: String,
    pub(crate) token: String,
    stderr_path: PathBuf,
}

impl Client {
    pub(crate) async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Creates a session of the scripted model `script` in `workspace`; its id.
    pub(crate) async fn create(&self, workspace: &Path, script: &Path, approval: &str) -> String {
        let (status, body) = self
            .post(
                "/v1/sessions",
                json!({"workspace": workspace, "model": format!("scripted:{}", script.display()),
                       "approval": approval}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["session_id"].as_str().unwrap().to_owned()
    }

    /// Starts a turn of `session` with `input`; the accepted answer (turn and run ids).
    pub(crate) async fn turn(&self, session: &str, input: &str) -> Value {
        let (status, body) =
            self.post(&format!("/v1/sessions/{session}/turns"), json!({"input": input})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body
    }

    /// Answers the permission request of `call` in `session` with `answer`.
    pub(crate) async fn answer(
        &self,
        session: &str,
        call: &str,
        answer: &str,
    ) -> (StatusCode, Value) {
        self.post(&format!("/v1/sessions/{session}/permissions/{call}"), json!({"answer": answer}))
            .await
    }

    /// Waits until the session has a pending permission request; returns it.
    pub(crate) async fn pending(&self, session: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = self.get(&format!("/v1/sessions/{session}/permissions")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if let Some(first) = body.as_array().and_then(|list| list.first()) {
                return first.clone();
            }
            assert!(Instant::now() < deadline, "no pending permission request");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the session has a permission request asked after `seq` (as a restarted
    /// host asks again); returns it.
    pub(crate) async fn pending_after(
        &self,
        session: &str,
        seq: Option<u64>,
        within: Duration,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let pending = self.pending(session).await;
            if pending["requested_seq"].as_u64() > seq {
                return pending;
            }
            let host = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
            assert!(Instant::now() < deadline, "not asked again after {seq:?}: {host}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the session has a pending server question; returns it.
    pub(crate) async fn question(&self, session: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = self.get(&format!("/v1/sessions/{session}/questions")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if let Some(first) = body.as_array().and_then(|list| list.first()) {
                return first.clone();
            }
            assert!(Instant::now() < deadline, "no pending question");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the session's state is `state` and no run of it is active here.
    pub(crate) async fn wait_state(&self, session: &str, state: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, body) = self.get(&format!("/v1/sessions/{session}")).await;
            if body["state"] == state && body["active_here"] == false {
                return body;
            }
            let host = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
            assert!(Instant::now() < deadline, "session never became {state}: {body}\n{host}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The session's event stream, from after `last_event_id` when given.
    pub(crate) async fn events(&self, session: &str, last_event_id: Option<u64>) -> Sse {
        let mut request = self
            .http
            .get(format!("{}/v1/sessions/{session}/events", self.base))
            .bearer_auth(&self.token);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream")
        );
        Sse::of(response)
    }
}

/// One SSE frame.
#[derive(Debug, Clone, Default)]
pub(crate) struct Frame {
    pub(crate) id: Option<u64>,
    pub(crate) event: Option<String>,
    pub(crate) data: String,
    pub(crate) comment: bool,
}

/// An SSE stream, read frame by frame.
pub(crate) struct Sse {
    stream: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: String,
}

impl Sse {
    pub(crate) fn of(response: reqwest::Response) -> Sse {
        Sse { stream: Box::pin(response.bytes_stream()), buffer: String::new() }
    }

    /// The next frame; `None` when the stream ended (or broke, as when the host died).
    pub(crate) async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut frame = Frame::default();
                for line in block.lines() {
                    if let Some(rest) = line.strip_prefix("id:") {
                        frame.id = Some(rest.trim().parse().unwrap());
                    } else if let Some(rest) = line.strip_prefix("event:") {
                        frame.event = Some(rest.trim().to_owned());
                    } else if let Some(rest) = line.strip_prefix("data:") {
                        frame.data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
                    } else if line.starts_with(':') {
                        frame.comment = true;
                    }
                }
                return Some(frame);
            }
            match tokio::time::timeout(Duration::from_secs(30), self.stream.next()).await {
                Ok(Some(Ok(bytes))) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                Ok(Some(Err(_)) | None) => return None,
                Err(_) => panic!("no SSE data for 30 s; buffer: {}", self.buffer),
            }
        }
    }

    /// Ledger frames until one of kind `kind` (included), skipping pings and re-sent
    /// pending requests.
    pub(crate) async fn until(&mut self, kind: &str, into: &mut Vec<Frame>) -> bool {
        while let Some(frame) = self.next().await {
            if frame.id.is_none() {
                continue;
            }
            let done = frame.event.as_deref() == Some(kind);
            into.push(frame);
            if done {
                return true;
            }
        }
        false
    }
}

/// A script that writes each of `files` (one call each, content `NAME\n`), then is done.
pub(crate) fn write_script(env: &Env, name: &str, files: &[&str]) -> PathBuf {
    let mut steps: Vec<Value> = files
        .iter()
        .map(|file| {
            json!({"tool_calls": [{"name": "write_file",
                                   "arguments": {"path": file, "content": format!("{file}\n")}}]})
        })
        .collect();
    steps.push(json!({"text": "Done."}));
    env.write_script(name, &json!({ "steps": steps }).to_string())
}

/// A script whose one call (with `arguments`) asks the user config's elicit server `el` a
/// question, then expects `expect` in what came back.
pub(crate) fn question_script(env: &Env, name: &str, arguments: Value, expect: &str) -> PathBuf {
    std::fs::write(
        env.home.path().join("config.toml"),
        crate::suite::elicit_e2e::elicit_server("el", true),
    )
    .unwrap();
    let script = json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": arguments}]},
        {"text": "done", "expect": {"contains": [expect]}}
    ]});
    let path = env.scratch.path().join(name);
    std::fs::write(&path, script.to_string()).unwrap();
    path
}

/// The session's ledger as `keel log --json` prints it.
pub(crate) fn ledger(env: &Env, session: &str) -> Vec<Value> {
    ledger_with(env, &[], session)
}

/// [`ledger`], read by a keel with `vars` in its environment (another store).
pub(crate) fn ledger_with(env: &Env, vars: &[(&str, &str)], session: &str) -> Vec<Value> {
    let output = env.keel().envs(vars.iter().copied()).args(["log", session, "--json"]).output();
    json_lines(&output.unwrap())
}

/// Every frame's data is the ledger event with its seq, in order, each seq once.
pub(crate) fn assert_frames_are_the_ledger(frames: &[Frame], ledger: &[Value]) {
    let ids: Vec<u64> = frames.iter().map(|frame| frame.id.unwrap()).collect();
    let expected: Vec<u64> = (1..=ledger.len() as u64).collect();
    assert_eq!(ids, expected, "lost or duplicated events");
    for (frame, event) in frames.iter().zip(ledger) {
        let data: Value = serde_json::from_str(&frame.data).unwrap();
        assert_eq!(&data, event);
        assert_eq!(frame.event.as_deref(), event["kind"].as_str());
    }
}
