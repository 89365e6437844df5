//! `keel mcp login` / `logout` end to end against a local OAuth-protected MCP server
//! ([`AuthServer`], shared with keel-mcp's tests): the browser step, the token file, a run
//! that uses the login, and what a repository cannot do with it.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::oauth_server::{AuthServer, Knobs};
use super::support::{Env, json_lines, scripted, stderr, stdout};

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// `keel mcp login NAME --no-browser`, with the test as the user: it reads the printed
/// authorization URL and visits it (the test server redirects at once to keel's listener).
fn login(env: &Env, runtime: &tokio::runtime::Runtime, name: &str, extra: &[&str]) -> String {
    let mut command = env.keel();
    command
        .args(["mcp", "login", name, "--no-browser", "--timeout", "30s"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let mut printed = String::new();
    let mut url = None;
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 {
        printed.push_str(&line);
        if let Some(found) =
            line.trim().strip_prefix("http://").map(|rest| format!("http://{rest}"))
            && found.contains("/authorize?")
        {
            url = Some(found);
            break;
        }
        if line.contains("failed") {
            break;
        }
        line.clear();
    }
    if let Some(url) = url {
        runtime.block_on(async {
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap();
            let answer = client.get(&url).send().await.unwrap();
            let location = answer.headers()[reqwest::header::LOCATION].to_str().unwrap().to_owned();
            assert!(location.starts_with("http://127.0.0.1:"), "{location}");
            client.get(&location).send().await.unwrap();
        });
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut reader, &mut rest).unwrap();
    printed.push_str(&rest);
    let status = child.wait().unwrap();
    format!("exit {:?}\n{printed}", status.code())
}

#[test]
fn redteam_mcp_oauth_a_login_reaches_its_server_and_never_the_ledger_logs_or_output() {
    let runtime = runtime();
    let server = runtime.block_on(AuthServer::start(Knobs::default()));
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(
        env.home.path().join("config.toml"),
        format!("[mcp_servers.remote]\n{}\n", server.config()),
    )
    .unwrap();
    let script = r#"{"steps": [
      {"tool_calls": [{"name": "mcp__remote__hello", "arguments": {}}]},
      {"text": "done", "expect": {"last_outcomes": ["ok"], "contains": ["hello, authorized"]}}
    ]}"#;
    let run = |env: &Env| {
        env.run(&[
            "run",
            "-C",
            ws.to_str().unwrap(),
            "-m",
            &scripted(env, script),
            "--approval",
            "auto",
            "--json",
            "say hello",
        ])
    };

    // Headless, never logged in: the server fails at once, naming the command.
    let started = Instant::now();
    let listed = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    assert!(stdout(&listed).contains("run `keel mcp login remote`"), "{}", stdout(&listed));
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());

    let printed = login(&env, &runtime, "remote", &[]);
    assert!(printed.starts_with("exit Some(0)"), "{printed}");
    assert!(printed.contains("logged in to mcp server 'remote'"), "{printed}");
    let folder = env.home.path().join("mcp/oauth");
    let files: Vec<_> = std::fs::read_dir(&folder).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&files[0]), 0o600);
        assert_eq!(mode(&folder), 0o700);
    }

    let output = run(&env);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", stderr(&output), stdout(&output));
    let results: Vec<_> =
        json_lines(&output).into_iter().filter(|event| event["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 1, "{}", stdout(&output));
    assert_eq!(results[0]["outcome"], "ok", "{}", results[0]);
    // The server got the token...
    assert!(
        server
            .mcp_authorizations()
            .iter()
            .any(|sent| sent.as_deref() == Some("Bearer at-1-s3cret")),
        "{:?}",
        server.mcp_authorizations()
    );
    // ...and it is nowhere but the token file: not the ledger, logs, or what keel printed.
    let mut leaked = files_containing(env.home.path(), b"s3cret");
    leaked.retain(|path| !path.starts_with(folder.to_str().unwrap()));
    assert!(leaked.is_empty(), "a token was written to {leaked:?}");
    let shown = format!("{}{}{printed}", stdout(&output), stderr(&output));
    assert!(!shown.contains("s3cret"), "{shown}");

    // Logout deletes it; the next run is back to "log in".
    let out = env.run(&["mcp", "logout", "remote", "-C", ws.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(std::fs::read_dir(&folder).unwrap().next().is_none());
    let listed = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    assert!(stdout(&listed).contains("run `keel mcp login remote`"), "{}", stdout(&listed));
}

#[test]
fn redteam_mcp_oauth_a_trusted_workspace_cannot_use_or_aim_the_users_login() {
    let runtime = runtime();
    let server = runtime.block_on(AuthServer::start(Knobs::default()));
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(
        env.home.path().join("config.toml"),
        format!("[mcp_servers.mine]\n{}\n", server.config()),
    )
    .unwrap();
    let printed = login(&env, &runtime, "mine", &[]);
    assert!(printed.starts_with("exit Some(0)"), "{printed}");
    // The repository names the very server the user logged in to, and brings its own
    // OAuth client for another.
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    std::fs::write(
        ws.join(".keel/config.toml"),
        format!(
            "[mcp_servers.repo]\n{}\n[mcp_servers.aimed]\nurl = \"{}\"\n\
             oauth_client_id = \"repo-client\"\n",
            server.config(),
            server.url()
        ),
    )
    .unwrap();
    let trusted = env.run(&["trust", ws.to_str().unwrap()]);
    assert_eq!(trusted.status.code(), Some(0), "{}", stderr(&trusted));
    let before = server.mcp_authorizations().len();
    let listed = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    let text = format!("{}{}", stdout(&listed), stderr(&listed));
    // The repository's table with an OAuth client is ignored...
    assert!(
        text.contains("mcp_servers.aimed") && text.contains("cannot send your credentials"),
        "{text}"
    );
    // ...its plain table gets no token (it asks for a login)...
    let repo_line = stdout(&listed)
        .lines()
        .find(|line| line.starts_with("repo "))
        .unwrap_or_default()
        .to_owned();
    assert!(repo_line.contains("requires authorization"), "{text}");
    // ...and cannot be logged in to.
    let refused = login(&env, &runtime, "repo", &["-C", ws.to_str().unwrap()]);
    assert!(refused.contains("comes from a workspace config"), "{refused}");
    // The user's own server, the neighbour, still connects with the login.
    let mine_line = stdout(&listed)
        .lines()
        .find(|line| line.starts_with("mine "))
        .unwrap_or_default()
        .to_owned();
    assert!(mine_line.contains("connected"), "{text}");
    // Every token the server saw since came with the user's own table ("mine" connects
    // once: initialize, initialized, tools/list, DELETE); none was sent by "repo".
    let sent: Vec<_> = server.mcp_authorizations()[before..].to_vec();
    let with_token = sent.iter().filter(|sent| sent.is_some()).count();
    let without = sent.iter().filter(|sent| sent.is_none()).count();
    assert!(with_token >= 3, "{sent:?}");
    assert!(without >= 1, "the repo's server was not tried without a token: {sent:?}");
}

#[test]
fn redteam_mcp_oauth_a_server_echoing_the_token_reaches_no_ledger_log_or_model() {
    let runtime = runtime();
    let server = runtime.block_on(AuthServer::start(Knobs { echo: true, ..Knobs::default() }));
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(
        env.home.path().join("config.toml"),
        format!("[mcp_servers.remote]\n{}\n", server.config()),
    )
    .unwrap();
    let printed = login(&env, &runtime, "remote", &[]);
    assert!(printed.starts_with("exit Some(0)"), "{printed}");
    // The server answers with the Authorization header it got: in a result, in a
    // JSON-RPC error; the next model request sees both, redacted.
    let script = r#"{"steps": [
      {"tool_calls": [{"name": "mcp__remote__echo", "arguments": {}},
                      {"name": "mcp__remote__echo_error", "arguments": {}},
                      {"name": "mcp__remote__hello", "arguments": {}}]},
      {"text": "done", "expect": {"last_outcomes": ["ok", "error", "ok"],
        "contains": ["you sent Bearer <redacted>", "server saw Bearer <redacted>",
                     "hello, authorized"]}}
    ]}"#;
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &scripted(&env, script),
        "--approval",
        "auto",
        "--json",
        "fish for the token",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", stderr(&output), stdout(&output));
    assert!(
        server
            .mcp_authorizations()
            .iter()
            .any(|sent| sent.as_deref() == Some("Bearer at-1-s3cret")),
        "{:?}",
        server.mcp_authorizations()
    );
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let log = env.run(&["log", &session, "--json"]);
    assert_eq!(log.status.code(), Some(0), "{}", stderr(&log));
    let results: Vec<_> =
        json_lines(&log).into_iter().filter(|event| event["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 3, "{}", stdout(&log));
    let shown = format!("{}{}{}{}", stdout(&output), stderr(&output), stdout(&log), stderr(&log));
    assert!(shown.contains("<redacted>"), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
    // No file under KEEL_HOME (the ledger included) or the workspace but the token file.
    let folder = env.home.path().join("mcp/oauth");
    let mut leaked = files_containing(env.home.path(), b"s3cret");
    leaked.extend(files_containing(&ws, b"s3cret"));
    leaked.retain(|path| !path.starts_with(folder.to_str().unwrap()));
    assert!(leaked.is_empty(), "a token was written to {leaked:?}");
    assert_eq!(files_containing(&folder, b"at-1-s3cret").len(), 1);
}
