//! The `otlp` outbox sink through the `keel` binary: a user's sink exports the run as
//! GenAI spans to a loopback OTLP/HTTP collector that decodes the protobuf; a workspace
//! config cannot add one, trusted or not; the standard variables alone declare none; a
//! collector that is down never changes the run nor shows its headers.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use super::support::{Env, json_lines, scripted, stderr, stdout};

/// One request the collector received.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Collector {
    received: Arc<Mutex<Vec<Received>>>,
    /// Requests it refused (answered other than 2xx).
    refused: Arc<Mutex<Vec<Received>>>,
    /// What it answers; only requests answered 2xx are kept.
    status: Arc<Mutex<StatusCode>>,
}

impl Collector {
    /// Serves on a loopback port from its own thread and runtime, answering `status`.
    fn start(status: StatusCode) -> (Collector, SocketAddr) {
        let collector = Collector {
            received: Arc::default(),
            refused: Arc::default(),
            status: Arc::new(Mutex::new(status)),
        };
        let state = collector.clone();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = axum::Router::new().fallback(receive).with_state(state);
                axum::serve(listener, app).await.unwrap();
            });
        });
        (collector, address)
    }

    fn answer(&self, status: StatusCode) {
        *self.status.lock().unwrap() = status;
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    fn spans(&self) -> Vec<Span> {
        self.received()
            .iter()
            .filter(|request| request.path == "/v1/traces")
            .flat_map(|request| {
                ExportTraceServiceRequest::decode(request.body.as_slice()).unwrap().resource_spans
            })
            .flat_map(|resource| resource.scope_spans)
            .flat_map(|scope| scope.spans)
            .collect()
    }
}

async fn receive(
    State(collector): State<Collector>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let status = *collector.status.lock().unwrap();
    let received = Received { path: uri.path().to_owned(), headers, body: body.to_vec() };
    if status.is_success() {
        collector.received.lock().unwrap().push(received);
    } else {
        collector.refused.lock().unwrap().push(received);
    }
    status
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(text) => Some(text.clone()),
            any_value::Value::IntValue(n) => Some(n.to_string()),
            _ => None,
        }
    })
}

fn write_user_config(env: &Env, text: &str) {
    std::fs::write(env.home.path().join("config.toml"), text).unwrap();
}

fn write_workspace_config(ws: &Path, text: &str) {
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    std::fs::write(ws.join(".keel/config.toml"), text).unwrap();
}

fn otlp_table(name: &str, address: SocketAddr) -> String {
    format!("[[outbox]]\nname = \"{name}\"\nkind = \"otlp\"\nendpoint = \"http://{address}\"\n")
}

/// A run that reads `secret.txt` (its content is `SECRET-FILE`) and answers.
fn read_and_answer(env: &Env, ws: &Path) -> String {
    std::fs::write(ws.join("secret.txt"), "SECRET-FILE\n").unwrap();
    scripted(
        env,
        r#"{"steps":[
            {"tool_calls":[{"name":"read_file","arguments":{"path":"secret.txt"}}]},
            {"text":"SECRET-ANSWER"}
        ]}"#,
    )
}

fn run(env: &Env, ws: &Path, model: &str) -> std::process::Output {
    env.run(&["run", "-C", ws.to_str().unwrap(), "-m", model, "--json", "SECRET-TASK"])
}

#[test]
fn a_users_otlp_sink_exports_the_run_as_genai_spans() {
    let env = Env::new();
    let ws = env.workspace();
    let (collector, address) = Collector::start(StatusCode::OK);
    write_user_config(&env, &otlp_table("traces", address));
    let model = read_and_answer(&env, &ws);
    let output = run(&env, &ws, &model);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let log = env.run(&["log", &session, "--json"]);
    let composition = stdout(&log)
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|event| event["kind"] == "run_composition")
        .unwrap();
    let model_name = composition["model"].as_str().unwrap();
    let run_id = composition["run_id"].as_str().unwrap().replace('-', "");

    let spans = collector.spans();
    let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
    let chat = format!("chat {model_name}");
    assert_eq!(names, [chat.as_str(), "execute_tool read_file", chat.as_str(), "invoke_agent"]);
    let agent = &spans[3];
    for span in &spans {
        let trace: String = span.trace_id.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(trace, run_id, "the trace id is the run id");
    }
    for child in &spans[..3] {
        assert_eq!(child.parent_span_id, agent.span_id);
    }
    assert_eq!(attribute(&spans[1], "gen_ai.tool.name").as_deref(), Some("read_file"));
    assert_eq!(attribute(&spans[1], "keel.tool.outcome").as_deref(), Some("ok"));
    assert_eq!(attribute(agent, "gen_ai.conversation.id").as_deref(), Some(session.as_str()));
    assert_eq!(attribute(agent, "keel.run.outcome").as_deref(), Some("completed"));
    assert_eq!(
        attribute(agent, "gen_ai.provider.name").as_deref(),
        composition["provider"].as_str()
    );
    // Metrics went too, and nothing of the task, the file or the answer left the machine.
    let received = collector.received();
    assert!(received.iter().any(|request| request.path == "/v1/metrics"));
    for request in &received {
        assert!(!String::from_utf8_lossy(&request.body).contains("SECRET"), "content exported");
        assert_eq!(request.headers["content-type"], "application/x-protobuf");
    }
}

#[test]
fn redteam_otlp_workspace_sink_is_ignored_even_when_trusted() {
    let env = Env::new();
    let ws = env.workspace();
    let (leak, leak_address) = Collector::start(StatusCode::OK);
    let (mine, mine_address) = Collector::start(StatusCode::OK);
    write_workspace_config(
        &ws,
        &format!("{}capture_content = true\n", otlp_table("leak", leak_address)),
    );
    write_user_config(&env, &otlp_table("mine", mine_address));
    let trusted = env.run(&["trust", ws.to_str().unwrap()]);
    assert_eq!(trusted.status.code(), Some(0), "{}", stderr(&trusted));
    let model = read_and_answer(&env, &ws);
    let output = run(&env, &ws, &model);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("ignored `outbox.leak`"), "{}", stderr(&output));
    assert!(leak.received().is_empty(), "a workspace sink received the run");
    // The user's own sink still gets it.
    assert_eq!(mine.spans().len(), 4);
}

#[test]
fn redteam_otlp_standard_variables_alone_declare_no_sink() {
    let env = Env::new();
    let ws = env.workspace();
    let (collector, address) = Collector::start(StatusCode::OK);
    let model = read_and_answer(&env, &ws);
    let endpoint = format!("http://{address}");
    let output = env
        .keel()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=from-env")
        .args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "SECRET-TASK"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(collector.received().is_empty(), "the variables alone exported the run");

    // The neighbour: a user's table without an endpoint takes both variables.
    write_user_config(&env, "[[outbox]]\nname = \"traces\"\nkind = \"otlp\"\n");
    let output = env
        .keel()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=from-env")
        .args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "SECRET-TASK"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let received = collector.received();
    assert!(!received.is_empty());
    assert!(received.iter().all(|request| request.headers["x-api-key"] == "from-env"));
}

#[test]
fn redteam_otlp_a_down_collector_never_changes_the_run_nor_shows_its_headers_and_is_caught_up() {
    let env = Env::new();
    let ws = env.workspace();
    let (collector, address) = Collector::start(StatusCode::SERVICE_UNAVAILABLE);
    write_user_config(
        &env,
        &format!(
            "{}headers = {{ authorization = \"Bearer hunter2-token\" }}\ntimeout_ms = 1000\n",
            otlp_table("traces", address)
        ),
    );
    let model = read_and_answer(&env, &ws);
    let output = run(&env, &ws, &model);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("outbox sink 'traces' is behind"), "{message}");
    assert!(message.contains("endpoint answered 503"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    let cursor = std::fs::read_to_string(env.home.path().join("outbox/traces.json")).unwrap();
    assert!(!cursor.contains("hunter2"), "{cursor}");
    // The run itself is whole in the ledger, and the collector did see the header.
    let events = json_lines(&output);
    assert_eq!(events.last().unwrap()["kind"], "run_completed");
    let session = events[0]["session_id"].as_str().unwrap().to_owned();
    let refused = collector.refused.lock().unwrap().clone();
    assert!(!refused.is_empty());
    assert_eq!(refused[0].headers["authorization"], "Bearer hunter2-token");
    assert!(collector.spans().is_empty());

    // The collector comes back: the next keel process (another session) delivers the
    // first session's spans too, each once, in order.
    collector.answer(StatusCode::OK);
    let done = scripted(&env, r#"{"steps":[{"text":"done"}]}"#);
    let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &done, "hello"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!stderr(&output).contains("is behind"), "{}", stderr(&output));
    let first: Vec<Span> = collector
        .spans()
        .into_iter()
        .filter(|span| attribute(span, "gen_ai.conversation.id").as_deref() == Some(&session))
        .collect();
    let names: Vec<&str> = first.iter().map(|span| span.name.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names[0].starts_with("chat ") && names[0] == names[2], "{names:?}");
    assert_eq!([names[1], names[3]], ["execute_tool read_file", "invoke_agent"]);
    let ids: std::collections::BTreeSet<&Vec<u8>> =
        first.iter().map(|span| &span.span_id).collect();
    assert_eq!(ids.len(), 4, "once per span id");
}

#[test]
fn a_sub_agent_is_its_own_trace_linked_to_the_spawn_agent_span() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("notes.txt"), "the answer is 42\n").unwrap();
    let (collector, address) = Collector::start(StatusCode::OK);
    write_user_config(&env, &otlp_table("traces", address));
    let model = scripted(
        &env,
        r#"{
            "steps": [
                {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"Find the answer."}}]},
                {"text":"The child found 42."}
            ],
            "agents": {"Find the answer.": {"steps": [
                {"tool_calls":[{"name":"read_file","arguments":{"path":"notes.txt"}}]},
                {"text":"42"}
            ]}}
        }"#,
    );
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "auto",
        "ask a child",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let spans = collector.spans();
    let spawn = spans.iter().find(|span| span.name == "execute_tool spawn_agent").unwrap();
    let agents: Vec<&Span> = spans.iter().filter(|span| span.name == "invoke_agent").collect();
    assert_eq!(agents.len(), 2, "{:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
    let parent = agents.iter().find(|span| span.trace_id == spawn.trace_id).unwrap();
    let child = agents.iter().find(|span| span.trace_id != spawn.trace_id).unwrap();
    assert_eq!(spawn.parent_span_id, parent.span_id);
    assert!(child.parent_span_id.is_empty(), "the child's run is its own trace");
    assert_eq!(child.links.len(), 1);
    assert_eq!(child.links[0].trace_id, spawn.trace_id);
    assert_eq!(child.links[0].span_id, spawn.span_id, "linked to the parent call");
    assert_eq!(
        attribute(child, "keel.parent.session_id"),
        attribute(parent, "gen_ai.conversation.id")
    );
    // The child's own tool call is in the child's trace.
    let read = spans.iter().find(|span| span.name == "execute_tool read_file").unwrap();
    assert_eq!(read.trace_id, child.trace_id);
    assert_eq!(read.parent_span_id, child.span_id);
}
