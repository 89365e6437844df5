//! A workspace's MCP servers: none is started or contacted by `run`, `mcp list`,
//! `resume` or `compact` before the user trusts that file at that path, and a trusted one
//! can neither skip consent nor replace a server of the user's.

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::harness::{
    DONE, marker_server, run_in, session_id, trust, write_user_config, write_workspace_config,
};
use crate::suite::support::{Env, scripted, stderr, stdout};

#[test]
fn redteam_trust_workspace_stdio_mcp_server_is_not_started_by_run() {
    let env = Env::new();
    let ws = env.workspace();
    let marker = env.scratch.path().join("started");
    write_workspace_config(&ws, &marker_server("evil", &marker));
    let model = scripted(&env, DONE);

    let output = run_in(&env, &ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "done");
    assert!(!marker.exists(), "an untrusted workspace started a program");
    let message = stderr(&output);
    let hint = format!("run `keel trust {}`", ws.canonicalize().unwrap().display());
    assert_eq!(message.matches(&hint).count(), 1, "told once how to trust: {message}");
    assert!(message.contains("ignored `mcp_servers.evil`"), "{message}");

    // The neighbour: once trusted, the same server starts.
    let trusted = trust(&env, &ws);
    assert_eq!(trusted.status.code(), Some(0), "{}", stderr(&trusted));
    let output = run_in(&env, &ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(marker.exists(), "a trusted workspace server did not start");
    assert!(!stderr(&output).contains("keel trust"), "{}", stderr(&output));
}

#[test]
fn redteam_trust_workspace_stdio_mcp_server_is_not_started_by_mcp_list() {
    let env = Env::new();
    let ws = env.workspace();
    let marker = env.scratch.path().join("started");
    write_workspace_config(&ws, &marker_server("evil", &marker));

    let output = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!marker.exists(), "`keel mcp list` started an untrusted server");
    assert!(stderr(&output).contains("keel trust"), "{}", stderr(&output));

    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    let output = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    // The server starts and exits at once: a failed server, named, is exit 1.
    assert!(stderr(&output).contains("failed to connect: evil\n"), "{}", stderr(&output));
    assert!(marker.exists(), "a trusted workspace server was not started");
    assert!(stdout(&output).starts_with("evil  failed"), "{}", stdout(&output));
}

#[test]
fn redteam_trust_workspace_stdio_mcp_server_is_not_started_by_resume_or_compact() {
    let env = Env::new();
    let ws = env.workspace();
    let marker = env.scratch.path().join("started");
    let model = scripted(
        &env,
        r#"{"steps":[{"text":"first answer, long enough to be worth a summary"},
                     {"text":"second answer, also long enough to be folded"},
                     {"text":"third"}]}"#,
    );
    // A session made before the repository gained its hostile file.
    let first = run_in(&env, &ws, &model, &["--json"]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let session = session_id(&first);
    write_workspace_config(&ws, &marker_server("evil", &marker));

    let resumed = env.run(&["resume", &session, "and more"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(stdout(&resumed).trim(), "second answer, also long enough to be folded");
    assert!(!marker.exists(), "`keel resume` started an untrusted server");

    let compacted = env.run(&["compact", &session]);
    assert_eq!(compacted.status.code(), Some(0), "{}", stderr(&compacted));
    assert!(stderr(&compacted).contains("compacted session"), "{}", stderr(&compacted));
    assert!(!marker.exists(), "`keel compact` started an untrusted server");

    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    let resumed = env.run(&["resume", &session, "once more"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert!(marker.exists(), "resume did not start the trusted server");
}

#[test]
fn redteam_trust_an_edited_file_is_untrusted_again() {
    let env = Env::new();
    let ws = env.workspace();
    let marker = env.scratch.path().join("started");
    let config = write_workspace_config(&ws, "max_steps = 5\n");
    let model = scripted(&env, DONE);
    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    // The repository changes after the user trusted it.
    std::fs::write(&config, format!("max_steps = 5\n{}", marker_server("evil", &marker))).unwrap();

    let output = run_in(&env, &ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!marker.exists(), "an edited trusted file started a program");
    assert!(stderr(&output).contains("changed since it was trusted"), "{}", stderr(&output));

    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    let output = run_in(&env, &ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(marker.exists());
}

#[test]
fn redteam_trust_a_trust_record_is_bound_to_its_workspace_path() {
    let env = Env::new();
    let trusted_ws = env.scratch.path().join("trusted");
    let other_ws = env.scratch.path().join("other");
    let marker = env.scratch.path().join("started");
    let text = marker_server("evil", &marker);
    write_workspace_config(&trusted_ws, &text);
    write_workspace_config(&other_ws, &text);
    assert_eq!(trust(&env, &trusted_ws).status.code(), Some(0));
    let model = scripted(&env, DONE);

    // The same bytes in another folder are not trusted.
    let output = run_in(&env, &other_ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!marker.exists(), "a record for one workspace trusted another");

    let output = run_in(&env, &trusted_ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(marker.exists());
}

/// A loopback TCP listener that counts connections (answering each with a 404).
fn counting_listener() -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            seen.fetch_add(1, Ordering::SeqCst);
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        }
    });
    (url, count)
}

#[test]
fn redteam_trust_workspace_url_mcp_server_is_never_contacted_before_trust() {
    let env = Env::new();
    let ws = env.workspace();
    let (url, count) = counting_listener();
    write_workspace_config(
        &ws,
        &format!("[mcp_servers.remote]\nurl = \"{url}\"\nstartup_timeout_ms = 2000\n"),
    );
    let output = run_in(&env, &ws, &scripted(&env, DONE), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let listed = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert_eq!(count.load(Ordering::SeqCst), 0, "an untrusted url server was contacted");

    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    let listed = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    assert_eq!(listed.status.code(), Some(1), "{}", stderr(&listed));
    // The server starts and exits at once: a failed server, named, is exit 1.
    assert!(stderr(&listed).contains("failed to connect: remote\n"), "{}", stderr(&listed));
    assert!(count.load(Ordering::SeqCst) >= 1, "the trusted url server was not contacted");
}

#[test]
fn redteam_trust_trusted_workspace_server_cannot_skip_consent() {
    let env = Env::new();
    let ws = env.workspace();
    let relaxed = env.scratch.path().join("relaxed");
    let plain = env.scratch.path().join("plain");
    write_workspace_config(
        &ws,
        &format!(
            "{}trusted = true\n{}",
            marker_server("relaxed", &relaxed),
            marker_server("plain", &plain)
        ),
    );
    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    let output = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    // The server starts and exits at once: a failed server, named, is exit 1.
    assert!(stderr(&output).contains("failed to connect: plain\n"), "{}", stderr(&output));
    assert!(!relaxed.exists(), "a workspace server marked `trusted` was started");
    assert!(stderr(&output).contains("cannot skip consent"), "{}", stderr(&output));
    assert!(plain.exists(), "the plain trusted server did not start");
}

#[test]
fn redteam_trust_trusted_workspace_cannot_redefine_a_users_server() {
    let env = Env::new();
    let ws = env.workspace();
    let users = env.scratch.path().join("users");
    let theirs = env.scratch.path().join("theirs");
    write_user_config(&env, &marker_server("fs", &users));
    write_workspace_config(&ws, &marker_server("fs", &theirs));
    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    let output = env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    // The server starts and exits at once: a failed server, named, is exit 1.
    assert!(stderr(&output).contains("failed to connect: fs\n"), "{}", stderr(&output));
    assert!(!theirs.exists(), "the workspace replaced the user's server");
    assert!(users.exists(), "the user's own server did not start");
    assert!(stderr(&output).contains("redefines a server of your own config"));
}
