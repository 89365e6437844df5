//! Issue #12 item 8: `keel resume` keeps what the session was. Against a local
//! OpenAI-compatible server, the real binary suspends on a step budget; the resume (with no
//! `--base-url` and an environment that points elsewhere) reaches the same server and model
//! with the same budgets; a `-m` flag changes the model, says so and is recorded.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Uri, header};
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

use super::support::{Env, json_lines, stderr, stdout};

/// One request the server saw: the path and the body.
#[derive(Clone, Default)]
struct Recorded {
    requests: Arc<Mutex<Vec<(String, Value)>>>,
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let body = json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {body}\n\n")
}

fn finish(out: &mut String, reason: &str) {
    out.push_str(&chunk(json!({}), Some(reason)));
    let usage = json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
    });
    out.push_str(&format!("data: {usage}\n\n"));
    out.push_str("data: [DONE]\n\n");
}

fn list_dir_call(id: &str) -> String {
    let mut out = chunk(
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": id, "type": "function",
             "function": {"name": "list_dir", "arguments": "{\"path\":\".\"}"}}
        ]}),
        None,
    );
    finish(&mut out, "tool_calls");
    out
}

fn text(text: &str) -> String {
    let mut out = chunk(json!({"role": "assistant", "content": text}), None);
    finish(&mut out, "stop");
    out
}

async fn completions(
    State(recorded): State<Recorded>,
    uri: Uri,
    _headers: HeaderMap,
    body: axum::body::Bytes,
) -> impl IntoResponse {
    let request: Value = serde_json::from_slice(&body).unwrap();
    // A tools-off request (the budget report) gets a report; otherwise the n-th request
    // with tools gets a tool call, except once the model is `gpt-other`, which answers.
    let tools_off =
        request["tools"].as_array().is_none_or(Vec::is_empty) || request["tool_choice"] == "none";
    let model = request["model"].as_str().unwrap_or_default().to_owned();
    let n = {
        let mut requests = recorded.requests.lock().unwrap();
        requests.push((uri.path().to_owned(), request));
        requests.len()
    };
    let body = if tools_off {
        text("Report: listed the folder. Next: answer.")
    } else if model == "gpt-other" {
        text("done with the other model")
    } else {
        list_dir_call(&format!("call_{n}"))
    };
    ([(header::CONTENT_TYPE, "text/event-stream")], body)
}

fn run_keel(env: &Env, envs: &[(&str, &str)], args: Vec<String>) -> std::process::Output {
    let mut command = env.keel();
    command.env("OPENAI_API_KEY", "sk-test-resume");
    for (name, value) in envs {
        command.env(name, value);
    }
    command.args(args).output().unwrap()
}

/// The budget of every `run_started` in the session's ledger, in order.
fn run_budgets(env: &Env, session: &str) -> Vec<Value> {
    let log = env.run(&["log", session, "--json"]);
    assert_eq!(log.status.code(), Some(0), "{}", stderr(&log));
    json_lines(&log)
        .into_iter()
        .filter(|event| event["kind"] == "run_started")
        .map(|event| event["budget"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_resume_keeps_the_endpoint_model_and_budgets() {
    let recorded = Recorded::default();
    let app =
        Router::new().route("/v1/chat/completions", post(completions)).with_state(recorded.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let base_url = format!("http://{address}/v1");

    let env = Arc::new(Env::new());
    let workspace = env.workspace();
    std::fs::write(workspace.join("a.txt"), "alpha\n").unwrap();

    // 1. A run through OPENAI_BASE_URL, suspended by its step budget: a tool call, then
    // the report the budget asks for.
    let first = {
        let env = env.clone();
        let base_url = base_url.clone();
        let args: Vec<String> = [
            "run",
            "-C",
            workspace.to_str().unwrap(),
            "-m",
            "openai:gpt-test",
            "--max-steps",
            "2",
            "--max-tokens",
            "100000",
            "--max-time",
            "10m",
            "--json",
            "list the folder",
        ]
        .map(str::to_owned)
        .to_vec();
        tokio::task::spawn_blocking(move || {
            run_keel(&env, &[("OPENAI_BASE_URL", base_url.as_str())], args)
        })
        .await
        .unwrap()
    };
    assert_eq!(first.status.code(), Some(3), "{}", stderr(&first));
    let events = json_lines(&first);
    assert_eq!(events[0]["kind"], "session_created");
    assert_eq!(events[0]["base_url"], base_url.as_str(), "the endpoint is recorded");
    assert_eq!(events[0]["model"], "openai:gpt-test");
    let session = events[0]["session_id"].as_str().unwrap().to_owned();
    assert_eq!(recorded.requests.lock().unwrap().len(), 2, "one step and its report");

    // 2. Resume with the environment pointing at a dead endpoint and no flags: the recorded
    // endpoint and model are used, and the step budget still holds (one step, then a stop).
    let second = {
        let env = env.clone();
        let args = vec!["resume".to_owned(), session.clone(), "--json".to_owned()];
        tokio::task::spawn_blocking(move || {
            run_keel(&env, &[("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")], args)
        })
        .await
        .unwrap()
    };
    assert_eq!(second.status.code(), Some(3), "the budget carried over: {}", stderr(&second));
    assert!(
        stderr(&second).contains(&format!("continuing against the session's endpoint {base_url}")),
        "{}",
        stderr(&second)
    );
    {
        let requests = recorded.requests.lock().unwrap();
        assert_eq!(requests.len(), 4, "the resumed run reached the same server");
        for (path, request) in requests.iter() {
            assert_eq!(path, "/v1/chat/completions");
            assert_eq!(request["model"], "gpt-test");
        }
    }

    // 3. A flag changes the model: said on stderr, recorded in the run's composition; the
    // endpoint is the session's, the step budget is the flag's, the others carry over.
    let third = {
        let env = env.clone();
        let args: Vec<String> =
            ["resume", &session, "-m", "openai:gpt-other", "--max-steps", "5", "--json"]
                .map(str::to_owned)
                .to_vec();
        tokio::task::spawn_blocking(move || run_keel(&env, &[], args)).await.unwrap()
    };
    assert_eq!(third.status.code(), Some(0), "{}", stderr(&third));
    assert!(
        stderr(&third).contains("-m openai:gpt-other replaces the session's model openai:gpt-test"),
        "{}",
        stderr(&third)
    );
    let events = json_lines(&third);
    let composition = events.iter().find(|event| event["kind"] == "run_composition").unwrap();
    assert_eq!(composition["model"], "gpt-other");
    {
        let requests = recorded.requests.lock().unwrap();
        assert_eq!(requests.len(), 5);
        assert_eq!(requests[4].0, "/v1/chat/completions");
        assert_eq!(requests[4].1["model"], "gpt-other");
    }

    let budgets = run_budgets(&env, &session);
    assert_eq!(budgets.len(), 3, "{budgets:?}");
    for budget in &budgets[..2] {
        assert_eq!(budget["max_steps"], 2, "{budgets:?}");
    }
    assert_eq!(budgets[2]["max_steps"], 5, "{budgets:?}");
    for budget in &budgets {
        assert_eq!(budget["max_tokens"], 100_000, "{budgets:?}");
        assert_eq!(budget["max_time"], 600_000, "{budgets:?}");
    }

    // The key never reaches the ledger.
    let log = stdout(&env.run(&["log", &session, "--json"]));
    assert!(!log.contains("sk-test-resume"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_resume_with_a_new_base_url_says_so_and_uses_it() {
    let recorded = Recorded::default();
    let app =
        Router::new().route("/v1/chat/completions", post(completions)).with_state(recorded.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let moved = Recorded::default();
    let moved_app =
        Router::new().route("/v2/chat/completions", post(completions)).with_state(moved.clone());
    let moved_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let moved_address = moved_listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(moved_listener, moved_app).await.unwrap() });

    let env = Arc::new(Env::new());
    let workspace = env.workspace();
    let first = {
        let env = env.clone();
        let args: Vec<String> = [
            "run",
            "-C",
            workspace.to_str().unwrap(),
            "-m",
            "openai:gpt-test",
            "--base-url",
            &format!("http://{address}/v1"),
            "--max-steps",
            "2",
            "--json",
            "go",
        ]
        .map(str::to_owned)
        .to_vec();
        tokio::task::spawn_blocking(move || run_keel(&env, &[], args)).await.unwrap()
    };
    assert_eq!(first.status.code(), Some(3), "{}", stderr(&first));
    let session = json_lines(&first)[0]["session_id"].as_str().unwrap().to_owned();

    let moved_url = format!("http://{moved_address}/v2");
    let second = {
        let env = env.clone();
        let args: Vec<String> =
            ["resume", &session, "--base-url", &moved_url].map(str::to_owned).to_vec();
        tokio::task::spawn_blocking(move || run_keel(&env, &[], args)).await.unwrap()
    };
    assert_eq!(second.status.code(), Some(3), "{}", stderr(&second));
    assert!(
        stderr(&second)
            .contains(&format!("--base-url {moved_url} replaces the session's endpoint")),
        "{}",
        stderr(&second)
    );
    assert_eq!(recorded.requests.lock().unwrap().len(), 2, "the old server saw only run 1");
    assert_eq!(moved.requests.lock().unwrap().len(), 2, "the flag's server saw run 2");
}
