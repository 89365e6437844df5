//! `keel serve` under load (issue #15, BENCHMARKS.md "Host: many sessions"): the real
//! binary, N sessions driven at once over HTTP against a loopback OpenAI-compatible server
//! that answers every request after 50 ms; and the host's RSS over N idle sessions.
//!
//! `cargo bench -p keel-cli --bench serve_load -- [SESSIONS] [STEPS]` (default 1000 5).
//! Each session runs one turn of STEPS model steps (STEPS-1 `todo` calls, then an
//! answer), all sessions at once. The ideal step rate is SESSIONS / 50 ms: every session
//! always waiting on its model. Prints the figures; exits non-zero only on a failure of
//! the run itself (a bench reports, it does not judge).
// A bench, like a test, stops at the first broken assumption.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

const TOKEN: &str = "bench-token-0123456789abcdef";
const MODEL_DELAY: Duration = Duration::from_millis(50);

#[derive(Clone)]
struct Mock {
    /// The whole SSE body to answer a request whose conversation holds `n` tool results
    /// with, at index `n` (the last one answers in text): rendered once, so the mock
    /// spends nothing per request but counting the results and one write.
    replies: Arc<Vec<bytes::Bytes>>,
    served: Arc<AtomicU64>,
    /// The request bodies' bytes, all requests together.
    body_bytes: Arc<AtomicU64>,
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let body = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "mock",
                      "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {body}\n\n")
}

fn finish(out: &mut String, reason: &str) {
    out.push_str(&chunk(json!({}), Some(reason)));
    let usage = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "mock",
                       "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10,
                       "total_tokens": 110}});
    out.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
}

/// The OpenAI streaming body answering a conversation with `results` tool results, in a
/// turn of `steps` steps: a `todo` call until it has `steps - 1` of them, then an answer.
fn reply(results: usize, steps: usize) -> bytes::Bytes {
    let mut out = String::new();
    if results + 1 < steps {
        let arguments = json!({"items": [{"text": format!("step {results}"), "status": "done"}]});
        out.push_str(&chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                   "id": format!("call_{results}"), "type": "function",
                   "function": {"name": "todo", "arguments": arguments.to_string()}}]}),
            None,
        ));
        finish(&mut out, "tool_calls");
    } else {
        out.push_str(&chunk(json!({"role": "assistant", "content": "Done."}), None));
        finish(&mut out, "stop");
    }
    bytes::Bytes::from(out)
}

/// Sleeps 50 ms, then answers with the reply for the number of tool results in the
/// request (its messages with `"role":"tool"`, as keel's compact JSON spells them).
async fn completions(State(mock): State<Mock>, body: axum::body::Bytes) -> impl IntoResponse {
    tokio::time::sleep(MODEL_DELAY).await;
    let results =
        std::str::from_utf8(&body).map_or(0, |text| text.matches(r#""role":"tool""#).count());
    let last = mock.replies.len().saturating_sub(1);
    let out = mock.replies[results.min(last)].clone();
    mock.served.fetch_add(1, Ordering::Relaxed);
    mock.body_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    ([(header::CONTENT_TYPE, "text/event-stream")], out)
}

/// The floor on this machine (`KEEL_BENCH_FLOOR=1`): no host at all. SESSIONS tasks in
/// this process each send STEPS requests in a row to the same mock, with bodies of the size
/// keel's average (13 178 bytes: a fixed head plus one message per step, the tool results
/// the mock counts), over one pooled `reqwest` client as keel's provider uses, and read
/// each streamed answer to its end. What a host that records nothing, projects nothing and
/// runs no tool would reach, and the CPU that the model's side and bare HTTP cost per step.
async fn floor(mock: &Mock, mock_address: std::net::SocketAddr, sessions: usize, steps: usize) {
    let url = format!("http://{mock_address}/v1/chat/completions");
    let http = reqwest::Client::builder().build().expect("a client");
    let head = format!(
        r#"{{"model":"mock","stream":true,"stream_options":{{"include_usage":true}},"tools":[{{"type":"function","function":{{"name":"pad","description":"{}"}}}}],"messages":[{{"role":"system","content":"You are keel."}},{{"role":"user","content":"go"}}"#,
        "x".repeat(11_000)
    );
    let body = |results: usize| {
        let mut body = head.clone();
        for n in 0..results {
            body.push_str(&format!(
                r#",{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_{n}","type":"function","function":{{"name":"todo","arguments":"{{}}"}}}}]}},{{"role":"tool","tool_call_id":"call_{n}","content":"todo recorded: 1/1 done"}}"#
            ));
        }
        body.push_str("]}");
        bytes::Bytes::from(body)
    };
    let bodies: Arc<Vec<bytes::Bytes>> = Arc::new((0..steps.max(1)).map(body).collect());
    let cpu_before = cpu_seconds(std::process::id());
    let served_before = mock.served.load(Ordering::Relaxed);
    let body_bytes_before = mock.body_bytes.load(Ordering::Relaxed);
    let started = Instant::now();
    let runs = (0..sessions).map(|_| {
        let (http, url, bodies) = (http.clone(), url.clone(), Arc::clone(&bodies));
        tokio::spawn(async move {
            for step in 0..steps {
                let response = http
                    .post(&url)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(bodies[step].clone())
                    .send()
                    .await
                    .expect("the mock answers");
                let answer = response.bytes().await.expect("its body");
                assert!(answer.ends_with(b"data: [DONE]\n\n"));
            }
        })
    });
    for run in futures::future::join_all(runs).await {
        run.expect("a run");
    }
    let elapsed = started.elapsed();
    let cpu = cpu_seconds(std::process::id()) - cpu_before;
    let done = mock.served.load(Ordering::Relaxed) - served_before;
    let body_bytes = mock.body_bytes.load(Ordering::Relaxed) - body_bytes_before;
    let rate = done as f64 / elapsed.as_secs_f64();
    let ideal = sessions as f64 / MODEL_DELAY.as_secs_f64();
    println!(
        "floor (no host): {done} steps in {:.2} s: {rate:.0} steps/s; ideal {ideal:.0} steps/s: \
         {:.1}% of ideal; mock + bare client {cpu:.1} CPU s ({:.3} ms per step, {:.0}% of 2 \
         cores); request bodies {:.0} bytes on average; load average {}",
        elapsed.as_secs_f64(),
        100.0 * rate / ideal,
        1000.0 * cpu / done.max(1) as f64,
        100.0 * cpu / elapsed.as_secs_f64() / 2.0,
        body_bytes as f64 / done.max(1) as f64,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
}

/// The ledger's floor on this machine (`KEEL_BENCH_FLOOR=store`): no HTTP, no model, no
/// kernel. SESSIONS tasks each append STEPS steps' events to their own session of one
/// `SqliteStore` (WAL, `synchronous=FULL`, under TMPDIR), as fast as the store takes them,
/// in the kernel's two commits per tool step (the model's response, the gate decision and
/// the prepared attempt; then the tool result with the next request). The events are a real
/// `keel run`'s (`serve_load_step.jsonl`: the turn's start, then one `todo` step), given
/// each session's id and the next seqs. What the durable ledger alone allows per second.
async fn store_floor(sessions: usize, steps: usize) {
    use keel_contracts::{RuntimeEvent, Seq, SessionId, Store as _};
    let events: Vec<RuntimeEvent> = include_str!("serve_load_step.jsonl")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a recorded event"))
        .collect();
    let (start, step) = events.split_at(4);
    let dir = tempfile::tempdir().expect("a folder for the ledger");
    let store = Arc::new(keel_store::SqliteStore::open(dir.path().join("keel.sqlite")).unwrap());
    let renumber = |session_id: SessionId, from: u64, events: &[RuntimeEvent]| {
        let mut events = events.to_vec();
        for (n, event) in (from..).zip(&mut events) {
            event.session_id = session_id;
            event.seq = Seq(n);
        }
        events
    };
    let ids: Vec<SessionId> = (0..sessions)
        .map(|n| {
            SessionId(uuid::Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0000 + n as u128))
        })
        .collect();
    for id in &ids {
        store.append(&renumber(*id, 1, start)).await.expect("the turn's start");
    }
    let cpu_before = cpu_seconds(std::process::id());
    let started = Instant::now();
    let runs = ids.iter().map(|id| {
        let (store, id) = (Arc::clone(&store), *id);
        // [requested, response, gate, prepared, result]: the first step's request was
        // made with the turn; each commit is the response, gate and prepare, then the
        // result and the next step's request.
        let (request, rest) = step.split_first().expect("a step");
        let (first, second) =
            (rest[..3].to_vec(), [&rest[3..], std::slice::from_ref(request)].concat());
        tokio::spawn(async move {
            let mut seq = 5;
            for _ in 0..steps {
                for commit in [&first, &second] {
                    let batch = renumber(id, seq, commit);
                    store.append(&batch).await.expect("an append");
                    seq += batch.len() as u64;
                }
            }
        })
    });
    for run in futures::future::join_all(runs.collect::<Vec<_>>()).await {
        run.expect("a run");
    }
    let elapsed = started.elapsed();
    let cpu = cpu_seconds(std::process::id()) - cpu_before;
    let done = (sessions * steps) as f64;
    let rate = done / elapsed.as_secs_f64();
    let ideal = sessions as f64 / MODEL_DELAY.as_secs_f64();
    println!(
        "store floor (no HTTP, no kernel): {done} steps ({} events, {} commits) in {:.2} s: \
         {rate:.0} steps/s ({:.0} events/s); ideal {ideal:.0} steps/s: {:.1}% of ideal; \
         {cpu:.1} CPU s ({:.3} ms per step); load average {}",
        sessions * steps * 5,
        store.n_commits(),
        elapsed.as_secs_f64(),
        rate * 5.0,
        100.0 * rate / ideal,
        1000.0 * cpu / done,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
}

/// Resident set size of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The number of threads of `pid`.
fn threads(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of `pid`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let sessions: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let steps: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);

    let replies = (0..steps.max(1)).map(|results| reply(results, steps)).collect();
    let mock = Mock {
        replies: Arc::new(replies),
        served: Arc::new(AtomicU64::new(0)),
        body_bytes: Arc::new(AtomicU64::new(0)),
    };
    let app =
        Router::new().route("/v1/chat/completions", post(completions)).with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the mock");
    let mock_address = listener.local_addr().expect("the mock's address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    match std::env::var("KEEL_BENCH_FLOOR").as_deref() {
        Ok("store") => return store_floor(sessions, steps).await,
        Ok(_) => return floor(&mock, mock_address, sessions, steps).await,
        Err(_) => {}
    }

    let home = tempfile::tempdir().expect("a KEEL_HOME");
    let scratch = tempfile::tempdir().expect("a scratch folder");
    let workspace = scratch.path().join("ws");
    std::fs::create_dir_all(&workspace).expect("the workspace");
    // `KEEL_BENCH_HOST_BIN=/path/keel`: another build of the host (a copy of an earlier
    // one, to compare before and after with the same bench).
    let host_bin =
        std::env::var("KEEL_BENCH_HOST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_keel").into());
    let mut host = std::process::Command::new(host_bin);
    // `KEEL_BENCH_HOST_PRELOAD=/path/libmimalloc.so.2`: the host (only) with another
    // allocator, to compare it with glibc's without another build.
    if let Ok(preload) = std::env::var("KEEL_BENCH_HOST_PRELOAD") {
        host.env("LD_PRELOAD", preload);
    }
    let mut child = host
        .env("KEEL_HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("xdg"))
        .env("KEEL_SERVE_TOKEN", TOKEN)
        .env("OPENAI_API_KEY", "sk-bench")
        .args(["serve", "--listen", "127.0.0.1:0", "--max-runs"])
        .arg((sessions * 2).to_string())
        .arg("--workspace-root")
        .arg(scratch.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start keel serve");
    let pid = child.id();
    let stdout = child.stdout.take().expect("its stdout");
    let base = {
        use std::io::BufRead as _;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        std::thread::spawn(move || for _ in lines {});
        first.trim_start_matches("keel serve: listening on ").trim().to_owned()
    };
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("a client");
    let base_url = format!("http://{mock_address}/v1");

    // Idle sessions: the host's RSS before and after creating them.
    let health = http.get(format!("{base}/v1/health")).send().await.expect("health");
    assert!(health.status().is_success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_before = rss_kib(pid);
    let create = |http: reqwest::Client| {
        let (base, base_url, workspace) = (base.clone(), base_url.clone(), workspace.clone());
        async move {
            let response = http
                .post(format!("{base}/v1/sessions"))
                .bearer_auth(TOKEN)
                .json(&json!({"workspace": workspace, "model": "openai:mock",
                              "base_url": base_url, "approval": "auto"}))
                .send()
                .await
                .expect("create a session");
            assert_eq!(response.status(), 201);
            let body: Value = response.json().await.expect("its id");
            body["session_id"].as_str().expect("an id").to_owned()
        }
    };
    let mut ids = Vec::with_capacity(sessions);
    let started = Instant::now();
    for batch in (0..sessions).collect::<Vec<_>>().chunks(50) {
        let made = futures::future::join_all(batch.iter().map(|_| create(http.clone()))).await;
        ids.extend(made);
    }
    let created_in = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = rss_kib(pid);
    let per_session = (rss_idle.saturating_sub(rss_before)) as f64 * 1024.0 / sessions as f64;
    println!(
        "idle: {sessions} sessions created in {:.2} s; host RSS {rss_before} KiB -> {rss_idle} KiB: \
         {:.1} KB per idle session",
        created_in.as_secs_f64(),
        per_session / 1000.0
    );

    // All sessions at once: one turn of STEPS steps each.
    let cpu_before = cpu_seconds(pid);
    let bench_cpu_before = cpu_seconds(std::process::id());
    let served_before = mock.served.load(Ordering::Relaxed);
    let body_bytes_before = mock.body_bytes.load(Ordering::Relaxed);
    let started = Instant::now();
    let turns = ids.iter().map(|id| {
        let (http, base) = (http.clone(), base.clone());
        let id = id.clone();
        async move {
            let response = http
                .post(format!("{base}/v1/sessions/{id}/turns"))
                .bearer_auth(TOKEN)
                .json(&json!({"input": "go"}))
                .send()
                .await
                .expect("post a turn");
            response.status().as_u16()
        }
    });
    let statuses = futures::future::join_all(turns).await;
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    let posted_in = started.elapsed();
    let expected = (accepted * steps) as u64;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut most_threads = threads(pid);
    let mut polls: u64 = 0;
    while mock.served.load(Ordering::Relaxed) - served_before < expected {
        assert!(Instant::now() < deadline, "the steps did not finish in 10 minutes");
        tokio::time::sleep(Duration::from_millis(5)).await;
        polls += 1;
        if polls.is_multiple_of(20) {
            most_threads = most_threads.max(threads(pid));
        }
    }
    let elapsed = started.elapsed();
    let cpu = cpu_seconds(pid) - cpu_before;
    let bench_cpu = cpu_seconds(std::process::id()) - bench_cpu_before;
    let rss_after = rss_kib(pid);
    let rate = expected as f64 / elapsed.as_secs_f64();
    let ideal = accepted as f64 / MODEL_DELAY.as_secs_f64();
    println!(
        "load: {accepted}/{sessions} turns accepted (all posted in {:.2} s), {expected} steps in \
         {:.2} s: {rate:.0} steps/s; ideal {ideal:.0} steps/s ({} x 50 ms): {:.1}% of ideal",
        posted_in.as_secs_f64(),
        elapsed.as_secs_f64(),
        steps,
        100.0 * rate / ideal
    );
    println!(
        "host: {cpu:.1} CPU s over the load ({:.2} ms CPU per step, {:.0}% of 2 cores); RSS after \
         {rss_after} KiB; at most {most_threads} threads",
        1000.0 * cpu / expected.max(1) as f64,
        100.0 * cpu / elapsed.as_secs_f64() / 2.0
    );
    let body_bytes = mock.body_bytes.load(Ordering::Relaxed) - body_bytes_before;
    println!(
        "bench (mock model + HTTP client): {bench_cpu:.1} CPU s ({:.2} ms per step); request \
         bodies {:.0} bytes on average; load average {}",
        1000.0 * bench_cpu / expected.max(1) as f64,
        body_bytes as f64 / expected.max(1) as f64,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    let _ = child.kill();
    let _ = child.wait();
}
