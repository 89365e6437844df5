//! Red team: which workspaces and sessions the host admits. The workspace roots, a
//! workspace holding KEEL_HOME, sealed sessions, ids in paths, and an untrusted workspace
//! config.

use reqwest::StatusCode;
use serde_json::json;

use super::harness::{Host, ledger, write_script};
use crate::suite::support::{Env, json_lines, stderr};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_workspace_outside_the_allowed_roots_is_refused() {
    let env = Env::new();
    let outside = tempfile::tempdir().unwrap();
    let script = write_script(&env, "roots.json", &["j.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    for workspace in [outside.path().to_path_buf(), env.scratch.path().join("ws/../../")] {
        std::fs::create_dir_all(env.scratch.path().join("ws")).unwrap();
        let (status, body) = client
            .post(
                "/v1/sessions",
                json!({"workspace": workspace, "model": format!("scripted:{}", script.display())}),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{workspace:?}: {body}");
    }
    let (status, _) = client
        .post("/v1/sessions", json!({"workspace": "relative/ws", "model": "scripted:/x"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A session made outside the roots (by `keel run`) is not admitted: 423, no agent code;
    // nor is it this host's to show: not listed, and reading, streaming, answering or
    // cancelling it answers 404.
    let output = env.run(&[
        "run",
        "-C",
        outside.path().to_str().unwrap(),
        "-m",
        &format!("scripted:{}", write_script(&env, "cli.json", &[]).display()),
        "--json",
        "hi",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let foreign = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let (_, list) = client.get("/v1/sessions").await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "{list}");
    // Nor does the web page list it, show it, or render its fragment.
    let page = |path: String| {
        let request = client.http.get(host.url(&path)).bearer_auth(&client.token);
        async move {
            let response = request.send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        }
    };
    let (status, html) = page("/".to_owned()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!html.contains(&foreign) && html.contains("No sessions yet."), "{html}");
    let (status, _) = page(format!("/?session={foreign}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = page(format!("/web/sessions/{foreign}/fragment")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for path in ["", "/events", "/permissions"] {
        let (status, body) = client.get(&format!("/v1/sessions/{foreign}{path}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "GET {path}: {body}");
    }
    let (status, body) = client.post(&format!("/v1/sessions/{foreign}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "cancel: {body}");
    let (status, body) = client.answer(&foreign, "c1", "deny").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "answer: {body}");
    let before = ledger(&env, &foreign).len();
    let (status, body) =
        client.post(&format!("/v1/sessions/{foreign}/turns"), json!({"input": "again"})).await;
    assert_eq!(status, StatusCode::LOCKED, "{body}");
    assert_eq!(ledger(&env, &foreign).len(), before);
    // The neighbour inside the root is created and runs.
    let inside = env.workspace();
    let session = client.create(&inside, &script, "auto").await;
    client.turn(&session, "go").await;
    client.wait_state(&session, "completed").await;
    assert!(inside.join("j.txt").exists());
    let (status, html) = page("/".to_owned()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains(&session) && !html.contains(&foreign), "{html}");
    let (status, _) = page(format!("/web/sessions/{session}/fragment")).await;
    assert_eq!(status, StatusCode::OK);
    // Summaries carry `session_id` as creation answers it (and `id`, as before).
    let (_, row) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(
        (row["session_id"].as_str(), row["id"].as_str()),
        (Some(&*session), Some(&*session))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_a_workspace_that_holds_keel_home_is_refused() {
    let env = Env::new();
    let script = write_script(&env, "home.json", &["o.txt"]);
    let home = env.home.path().to_str().unwrap().to_owned();
    let host = Host::start(&env, &["--workspace-root", &home]);
    let client = host.client();
    // An agent working there could read the token file and the ledger.
    let (status, body) = client
        .post(
            "/v1/sessions",
            json!({"workspace": home, "model": format!("scripted:{}", script.display())}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("KEEL_HOME"), "{body}");
    // The neighbour: a workspace beside it is admitted and runs.
    let workspace = env.workspace();
    let session = client.create(&workspace, &script, "auto").await;
    client.turn(&session, "go").await;
    client.wait_state(&session, "completed").await;
    assert!(workspace.join("o.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_a_sealed_session_answers_423_and_runs_nothing() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "sealed.json", &["k.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "auto").await;
    let (status, body) =
        client.post(&format!("/v1/sessions/{session}/seal"), json!({"reason": "incident 7"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sealed = ledger(&env, &session);
    for path in ["turns", "resume"] {
        let (status, body) =
            client.post(&format!("/v1/sessions/{session}/{path}"), json!({"input": "go"})).await;
        assert_eq!(status, StatusCode::LOCKED, "{path}: {body}");
        assert_eq!(body["error"]["code"], "locked");
    }
    assert_eq!(ledger(&env, &session), sealed, "a sealed session recorded something");
    assert!(!workspace.join("k.txt").exists());
    let (_, summary) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(summary["state"], "sealed");
    // The neighbour: another session of the same workspace runs.
    let other = client.create(&workspace, &script, "auto").await;
    client.turn(&other, "go").await;
    client.wait_state(&other, "completed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_path_traversal_in_ids_is_refused() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "ids.json", &["l.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    for id in ["..%2F..%2Fetc%2Fpasswd", "%2e%2e", "0190aaaa", "..", "x%00y", "%FF%FE"] {
        let (status, body) = client.get(&format!("/v1/sessions/{id}")).await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
            "{id}: {status} {body}"
        );
        assert!(body["error"]["code"].is_string(), "{id}: {body}");
    }
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "go").await;
    let pending = client.pending(&session).await;
    for call in ["..%2F..%2Fetc", "%00", "c%0Ax"] {
        let (status, body) = client.answer(&session, call, "allow_once").await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
            "{call}: {status} {body}"
        );
    }
    assert!(!workspace.join("l.txt").exists());
    // The neighbour: the real call id answers.
    let call = pending["call_id"].as_str().unwrap();
    let (status, _) = client.answer(&session, call, "allow_once").await;
    assert_eq!(status, StatusCode::OK);
    client.wait_state(&session, "completed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_an_untrusted_workspace_config_only_narrows() {
    let env = Env::new();
    let workspace = env.workspace();
    std::fs::create_dir_all(workspace.join(".keel")).unwrap();
    // The repository asks for another model and endpoint (ignored until trusted) and a
    // lower step ceiling (a narrowing, applied).
    std::fs::write(
        workspace.join(".keel/config.toml"),
        "model = \"openai:gpt-evil\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmax_steps = 1\n",
    )
    .unwrap();
    let script = write_script(&env, "trust.json", &["m.txt", "n.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    // Without a model of its own the session has none: the repository's is not applied.
    let (status, body) = client.post("/v1/sessions", json!({"workspace": workspace})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("no model"), "{body}");
    let session = client.create(&workspace, &script, "auto").await;
    let (_, summary) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(summary["model"], format!("scripted:{}", script.display()));
    client.turn(&session, "go").await;
    client.wait_state(&session, "suspended").await;
    let ledger = ledger(&env, &session);
    let started = ledger.iter().find(|e| e["kind"] == "run_started").unwrap();
    assert_eq!(started["budget"]["max_steps"], 1, "{started}");
    assert!(!ledger.iter().any(|e| e.to_string().contains("gpt-evil")));
    assert!(host.stderr().contains("keel trust"), "the host says how to trust: {}", host.stderr());
}
