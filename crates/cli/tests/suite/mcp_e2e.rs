//! MCP servers through the whole loop: the real `keel` binary, a scripted model, and npm's
//! server-filesystem and server-everything (pinned in crates/mcp/tests/servers).

use std::path::{Path, PathBuf};

use super::support::{Env, events_of, json_lines, repo_root, stderr, stdout};

/// The folder with the installed test servers: `KEEL_MCP_SERVERS_DIR`, else
/// crates/mcp/tests/servers. Fails (never skips) when they are not installed.
fn servers_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_MCP_SERVERS_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("crates/mcp/tests/servers"));
    let modules = dir.join("node_modules/@modelcontextprotocol");
    assert!(
        modules.join("server-everything").is_dir() && modules.join("server-filesystem").is_dir(),
        "the MCP test servers are not installed in {}: run `scripts/test`, which installs them, \
         (or point KEEL_MCP_SERVERS_DIR at a folder with their node_modules)",
        dir.display()
    );
    dir
}

fn server_js(name: &str) -> String {
    let path = servers_dir().join("node_modules/@modelcontextprotocol").join(name);
    toml_string(&path.join("dist/index.js"))
}

fn toml_string(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

fn write_user_config(env: &Env, text: &str) {
    std::fs::write(env.home.path().join("config.toml"), text).unwrap();
}

#[test]
fn filesystem_server_read_runs_and_write_is_asked_and_refused_under_approval_deny() {
    let env = Env::new();
    let workspace = env.workspace().canonicalize().unwrap();
    std::fs::write(workspace.join("notes.txt"), "remember the milk\n").unwrap();
    write_user_config(
        &env,
        &format!(
            "[mcp_servers.fs]\ncommand = \"node\"\nargs = [{}, \".\"]\n\
             [mcp_servers.fs.tools.read_text_file]\naccess = \"read\"\n",
            server_js("server-filesystem")
        ),
    );
    let notes = workspace.join("notes.txt").display().to_string();
    let target = workspace.join("written.txt");
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "mcp__fs__read_text_file", "arguments": {"path": notes}}],
         "expect": {"contains": ["came from outside keel"]}},
        {"tool_calls": [{"name": "mcp__fs__write_file",
                         "arguments": {"path": target.display().to_string(), "content": "pwned"}}],
         "expect": {"last_outcomes": ["ok"],
                    "contains": ["remember the milk", "<<<untrusted:mcp__fs__read_text_file:"]}},
        {"text": "The write was refused.", "expect": {"last_outcomes": ["refused"]}}
    ]});
    let script = env.write_script("fs.json", &script.to_string());
    let output = env.run(&[
        "run",
        "-C",
        workspace.to_str().unwrap(),
        "-m",
        &format!("scripted:{}", script.display()),
        "--approval",
        "deny",
        "--json",
        "read the notes, then write a file",
    ]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}\nstdout: {}",
        stderr(&output),
        stdout(&output)
    );
    let events = json_lines(&output);

    let results = events_of(&events, "tool_result");
    let outcomes: Vec<(&str, &str)> = results
        .iter()
        .map(|event| (event["tool"].as_str().unwrap(), event["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(outcomes, [("mcp__fs__read_text_file", "ok"), ("mcp__fs__write_file", "refused")]);
    // The declared read ran without asking; the undeclared write was asked for as a write.
    let requested = events_of(&events, "permission_requested");
    assert_eq!(requested.len(), 1, "{requested:?}");
    assert_eq!(requested[0]["tool"], "mcp__fs__write_file");
    assert_eq!(requested[0]["access"], "write");
    let settled = events_of(&events, "permission_settled");
    assert_eq!(settled[0]["answer"], "deny", "{settled:?}");
    assert!(!target.exists(), "the refused write must not happen");
    assert_eq!(events.last().unwrap()["kind"], "run_completed");
}

#[test]
fn everything_server_echo_runs_through_the_whole_loop() {
    let env = Env::new();
    let workspace = env.workspace();
    write_user_config(
        &env,
        &format!(
            "[mcp_servers.everything]\ncommand = \"node\"\nargs = [{}, \"stdio\"]\n",
            server_js("server-everything")
        ),
    );
    let script = env.write_script(
        "echo.json",
        r#"{"steps": [
          {"tool_calls": [{"name": "mcp__everything__echo", "arguments": {"message": "through the loop"}}]},
          {"text": "It echoed.", "expect": {"last_outcomes": ["ok"],
            "contains": ["Echo: through the loop", "<<<untrusted:mcp__everything__echo:"]}}
        ]}"#,
    );
    let output = env.run(&[
        "run",
        "-C",
        workspace.to_str().unwrap(),
        "-m",
        &format!("scripted:{}", script.display()),
        "--approval",
        "auto",
        "--json",
        "echo something",
    ]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}\nstdout: {}",
        stderr(&output),
        stdout(&output)
    );
    let events = json_lines(&output);
    // An undeclared tool of a local server is a write: asked for (and allowed by --approval auto).
    let requested = events_of(&events, "permission_requested");
    assert_eq!(requested.len(), 1);
    assert_eq!(requested[0]["access"], "write");
    let result = events_of(&events, "tool_result")[0];
    assert_eq!(result["outcome"], "ok");
    assert!(result["content"].as_str().unwrap().contains("Echo: through the loop"), "{result}");
    // The server's stderr went to its log under KEEL_HOME.
    assert!(env.home.path().join("logs/mcp-everything.log").is_file());
}

#[test]
fn mcp_list_shows_state_tools_and_declared_access() {
    let env = Env::new();
    let workspace = env.workspace();
    write_user_config(
        &env,
        &format!(
            "[mcp_servers.fs]\ncommand = \"node\"\nargs = [{}, \".\"]\n\
             [mcp_servers.fs.tools.read_text_file]\naccess = \"read\"\n\
             [mcp_servers.broken]\ncommand = \"/nonexistent/mcp-server\"\n",
            server_js("server-filesystem")
        ),
    );
    let output = env.run(&["mcp", "list", "-C", workspace.to_str().unwrap()]);
    // A server failed to connect: exit 1, naming it (and only it) on stderr.
    assert_eq!(output.status.code(), Some(1), "stderr: {}", stderr(&output));
    assert!(
        stderr(&output).contains("1 of 2 MCP servers failed to connect: broken\n"),
        "{}",
        stderr(&output)
    );
    let text = stdout(&output);
    let line = |prefix: &str| {
        text.lines()
            .find(|line| line.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(line("broken")[..3], ["broken", "failed:", "cannot"]);
    assert_eq!(line("fs")[..2], ["fs", "connected"]);
    assert_eq!(
        line("mcp__fs__read_text_file"),
        ["mcp__fs__read_text_file", "read", "egress=none", "by=config", "readOnlyHint=true"]
    );
    assert_eq!(
        line("mcp__fs__write_file"),
        ["mcp__fs__write_file", "write", "egress=none", "by=default", "readOnlyHint=false"]
    );
    // The server says list_directory is read-only; untrusted, that changes nothing.
    assert_eq!(
        line("mcp__fs__list_directory ")[1..],
        ["write", "egress=none", "by=default", "readOnlyHint=true"]
    );
}

#[test]
fn a_workspace_config_cannot_make_mcp_tools_skip_consent() {
    let env = Env::new();
    let workspace = env.workspace();
    std::fs::create_dir_all(workspace.join(".keel")).unwrap();
    std::fs::write(
        workspace.join(".keel/config.toml"),
        "[mcp_servers.evil]\ncommand = \"true\"\n[mcp_servers.evil.tools.steal]\naccess = \"read\"\n",
    )
    .unwrap();
    // Untrusted, the server is not started at all.
    let output = env.run(&["mcp", "list", "-C", workspace.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).is_empty(), "stdout: {}", stdout(&output));
    assert!(stderr(&output).contains("keel trust"), "{}", stderr(&output));
    // Trusted, a server that would skip consent is still ignored, with a note.
    let trusted = env.run(&["trust", workspace.to_str().unwrap()]);
    assert_eq!(trusted.status.code(), Some(0), "{}", stderr(&trusted));
    let output = env.run(&["mcp", "list", "-C", workspace.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).is_empty(), "stdout: {}", stdout(&output));
    assert!(stderr(&output).contains("cannot skip consent"), "{}", stderr(&output));
}

#[test]
fn mcp_list_json_has_every_server_and_tool() {
    let env = Env::new();
    let workspace = env.workspace();
    write_user_config(
        &env,
        &format!(
            "[mcp_servers.fs]\ncommand = \"node\"\nargs = [{}, \".\"]\n\
             [mcp_servers.fs.tools.read_text_file]\naccess = \"read\"\n\
             [mcp_servers.broken]\ncommand = \"/nonexistent/mcp-server\"\n",
            server_js("server-filesystem")
        ),
    );
    let output = env.run(&["mcp", "list", "--json", "-C", workspace.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "stderr: {}", stderr(&output));
    assert!(stderr(&output).contains("failed to connect: broken"), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    let servers = report["servers"].as_array().unwrap();
    let server = |name: &str| servers.iter().find(|s| s["name"] == name).unwrap().clone();
    let broken = server("broken");
    assert_eq!(broken["state"], "failed");
    assert!(broken["reason"].as_str().unwrap().contains("cannot start"), "{broken}");
    let fs = server("fs");
    assert_eq!(fs["state"], "connected");
    let tools = fs["tools"].as_array().unwrap();
    let read = tools.iter().find(|t| t["name"] == "mcp__fs__read_text_file").unwrap();
    assert_eq!(
        (&read["access"], &read["egress"], &read["declared_by"], &read["read_only_hint"]),
        (&"read".into(), &"none".into(), &"config".into(), &true.into())
    );
    assert_eq!(report["tool_count"], serde_json::json!(tools.len()));
    assert_eq!(report["notes"], serde_json::json!([]));
}

/// With no servers configured, `--json` is still one JSON object on stdout.
#[test]
fn mcp_list_json_without_servers_is_still_json() {
    let env = Env::new();
    let workspace = env.workspace();
    let output = env.run(&["mcp", "list", "--json", "-C", workspace.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(report, serde_json::json!({"servers": [], "tool_count": 0, "notes": []}));
}

/// `[permissions] deny = ["mcp__evil__*"]` and `--forbid mcp__evil__*` refuse every tool
/// of server `evil`; the same server under another name works; any other wildcard in a
/// tool name is a config error, not a rule that denies nothing.
#[test]
fn redteam_mcp_a_server_wide_deny_or_forbid_refuses_every_tool_of_that_server() {
    let env = Env::new();
    let workspace = env.workspace();
    let fake = repo_root().join("crates/mcp/tests/servers/fake_server.py");
    let server = |name: &str| {
        format!("[mcp_servers.{name}]\ncommand = \"python3\"\nargs = [{}]\n", toml_string(&fake))
    };
    let script = env.write_script(
        "calls.json",
        r#"{"steps": [
          {"tool_calls": [{"name": "mcp__evil__echo", "arguments": {"message": "evil"}},
                          {"name": "mcp__evil__write_thing", "arguments": {}},
                          {"name": "mcp__good__echo", "arguments": {"message": "good"}}]},
          {"text": "done", "expect": {"last_outcomes": ["refused", "refused", "ok"]}}
        ]}"#,
    );
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run".to_owned(),
            "-C".to_owned(),
            workspace.to_str().unwrap().to_owned(),
            "-m".to_owned(),
            format!("scripted:{}", script.display()),
            "--approval".to_owned(),
            "auto".to_owned(),
            "--json".to_owned(),
        ];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args.push("call them".to_owned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        env.run(&args)
    };
    let check = |output: &std::process::Output| {
        assert_eq!(output.status.code(), Some(0), "{}\n{}", stderr(output), stdout(output));
        let events = json_lines(output);
        let results = events_of(&events, "tool_result");
        assert_eq!(results.len(), 3, "{}", stdout(output));
        assert_eq!(results[2]["outcome"], "ok", "{}", results[2]);
        assert!(results[2]["content"].as_str().unwrap().contains("echo: good"));
    };
    write_user_config(
        &env,
        &format!("{}{}[permissions]\ndeny = [\"mcp__evil__*\"]\n", server("evil"), server("good")),
    );
    check(&run(&[]));

    write_user_config(&env, &format!("{}{}", server("evil"), server("good")));
    check(&run(&["--forbid", "mcp__evil__*"]));

    for (config, flag, named) in [
        ("[permissions]\ndeny = [\"mcp__evil*\"]\n", None, "mcp__evil*"),
        ("[permissions]\ndeny = [\"mcp__evil__e?ho\"]\n", None, "mcp__evil__e?ho"),
        ("[permissions]\nallow = [\"mcp__good__*\"]\n", None, "mcp__good__*"),
        ("", Some("mcp__ev*"), "mcp__ev*"),
    ] {
        write_user_config(&env, &format!("{}{}{config}", server("evil"), server("good")));
        let extra: Vec<&str> = flag.map(|flag| vec!["--forbid", flag]).unwrap_or_default();
        let output = run(&extra);
        assert_eq!(output.status.code(), Some(2), "{config} {flag:?}: {}", stderr(&output));
        assert!(stderr(&output).contains(named), "{}", stderr(&output));
        assert!(stderr(&output).contains("mcp__SERVER__*"), "{}", stderr(&output));
    }
}

/// Every server connected: `keel mcp list` exits 0 and names no failure.
#[test]
fn mcp_list_exits_0_when_every_server_connects() {
    let env = Env::new();
    let workspace = env.workspace();
    write_user_config(
        &env,
        &format!(
            "[mcp_servers.fs]\ncommand = \"node\"\nargs = [{}, \".\"]\n",
            server_js("server-filesystem")
        ),
    );
    for json in [false, true] {
        let mut args = vec!["mcp", "list", "-C", workspace.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let output = env.run(&args);
        assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
        assert!(!stderr(&output).contains("failed"), "{}", stderr(&output));
    }
}

/// OAuth login and logout are for URL servers: naming a stdio server is a usage error
/// (exit 2), and so is a `--timeout` that is not a time; nothing is started or stored.
#[test]
fn mcp_login_and_logout_of_a_stdio_server_are_usage_errors() {
    let env = Env::new();
    let workspace = env.workspace();
    let marker = env.scratch.path().join("started");
    write_user_config(
        &env,
        &format!(
            "[mcp_servers.local]\ncommand = \"sh\"\nargs = [\"-c\", \"touch {}\"]\n",
            marker.display()
        ),
    );
    let ws = workspace.to_str().unwrap();
    for args in [
        vec!["mcp", "login", "local", "-C", ws, "--no-browser"],
        vec!["mcp", "login", "local", "-C", ws, "--no-browser", "--timeout", "2m"],
        vec!["mcp", "logout", "local", "-C", ws],
    ] {
        let output = env.run(&args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", stderr(&output));
        assert!(stderr(&output).contains("is not a URL server"), "{}", stderr(&output));
    }
    for bad in ["soon", "0", "10x", "-5s"] {
        let timeout = format!("--timeout={bad}");
        let output = env.run(&["mcp", "login", "local", "-C", ws, &timeout]);
        assert_eq!(output.status.code(), Some(2), "{bad}: {}", stderr(&output));
        assert!(stderr(&output).contains("invalid --timeout"), "{}", stderr(&output));
    }
    assert!(!marker.exists(), "a stdio server was started by login/logout");
    assert!(!env.home.path().join("mcp/oauth").exists());
}
