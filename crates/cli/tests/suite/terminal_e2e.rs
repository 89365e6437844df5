//! What the user sees at the terminal, through the real binary: the progress view (live
//! on stderr and replayed by `keel log`), `--output-format json`, `-q`, the session habits
//! (`--last`, `sessions -C/--limit`, `stop`), and the boundary rules of `--approval auto`
//! and `sandboxed` (a wider boundary needs a person or the user's own rule).

use std::path::Path;

use expect_test::expect;

use super::support::{Env, json_lines, scripted, stderr, stdout};

/// A run with an edit, a failing command and a refused call.
const EDIT_FAIL_REFUSE: &str = r#"{"steps":[
    {"tool_calls":[{"name":"read_file","arguments":{"path":"lib.py"}}]},
    {"text":"The bound is off by one.","tool_calls":[{"name":"edit_file","arguments":{"path":"lib.py","old":"range(n - 1)","new":"range(n)"}}]},
    {"tool_calls":[{"name":"bash","arguments":{"command":"echo running tests; echo 'FAIL: test_four' >&2; exit 3"}}]},
    {"tool_calls":[{"name":"write_file","arguments":{"path":"/etc/keel-terminal-test","content":"x"}}]},
    {"text":"Fixed the bound; test_four still fails.","expect":{"last_outcomes":["refused"]}}
]}"#;

/// Stable text for a snapshot: paths and ids named, durations (which vary) as `<T>`.
fn redact(text: &str, replacements: &[(&str, &str)]) -> String {
    let mut text = text.to_owned();
    for (from, to) in replacements {
        text = text.replace(from, to);
    }
    text.lines()
        .map(|line| match line.rsplit_once(" · ") {
            Some((head, tail)) if is_duration(tail) => format!("{head} · <T>"),
            _ => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_duration(text: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.');
    text.strip_suffix("ms").is_some_and(digits)
        || text.strip_suffix('s').is_some_and(|s| {
            digits(s) || s.split_once('m').is_some_and(|(m, s)| digits(m) && digits(s))
        })
}

fn session_id(env: &Env) -> String {
    let listed = stdout(&env.run(&["sessions", "--json"]));
    let line = listed.lines().next().expect("a session");
    let session: serde_json::Value = serde_json::from_str(line).unwrap();
    session["session_id"].as_str().unwrap().to_owned()
}

fn ledger(env: &Env, session: &str) -> Vec<serde_json::Value> {
    json_lines(&env.run(&["log", session, "--json"]))
}

#[test]
fn a_run_shows_one_line_per_call_and_its_log_reads_the_same() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("lib.py"), "for i in range(n - 1):\n    total += i\n").unwrap();
    let model = scripted(&env, EDIT_FAIL_REFUSE);
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "sandboxed", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The answer appears once: on stdout, not also on stderr.
    assert_eq!(stdout(&output), "Fixed the bound; test_four still fails.\n");
    let err = stderr(&output);
    assert!(!err.contains("test_four still fails"), "{err}");
    assert_eq!(
        std::fs::read_to_string(ws.join("lib.py")).unwrap().lines().next(),
        Some("for i in range(n):")
    );

    let session = session_id(&env);
    let script = model.strip_prefix("scripted:").unwrap();
    let names =
        [(session.as_str(), "<SESSION>"), (script, "<SCRIPT>"), (ws.to_str().unwrap(), "<WS>")];
    expect![[r#"
        keel session <SESSION> · scripted:<SCRIPT> · <WS>
        ▸ t
          sandbox managed · approval sandboxed
          ✓ read_file lib.py · ok · <T>
          The bound is off by one.
          ✓ edit_file lib.py · ok · <T>
            --- a/lib.py
            +++ b/lib.py
            -range(n - 1)
            +range(n)
          ✗ bash echo running tests; echo 'FAIL: test_four' >&2; exit 3 · exit 3 · <T>
            │ running tests
            │ [stderr]
            │ FAIL: test_four
          ✗ write_file /etc/keel-terminal-test · refused: approval=sandboxed: write_file writes outside the workspace, and no terminal to ask
        ✓ completed · ~17,165 in / ~97 out tokens (17,262 estimated) · 5 model calls · cost unknown · <T>"#]]
    .assert_eq(&redact(&err, &names));

    // Replay: `keel log` is the same projection, with the answer where it was given.
    let log = env.run(&["log", &session]);
    assert_eq!(log.status.code(), Some(0), "{}", stderr(&log));
    let log = stdout(&log);
    let answer = "  Fixed the bound; test_four still fails.";
    assert_eq!(log.lines().filter(|line| *line == answer).count(), 1, "{log}");
    let replayed: Vec<&str> = log.lines().filter(|line| *line != answer).collect();
    let live: Vec<&str> = err.lines().collect();
    assert_eq!(replayed, live);
    // `--last` names the same session.
    assert_eq!(stdout(&env.run(&["log", "--last"])), log);
}

#[test]
fn verbose_is_the_full_trace_and_quiet_only_the_answer() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("lib.py"), "for i in range(n - 1):\n").unwrap();
    let model = scripted(&env, EDIT_FAIL_REFUSE);
    let quiet = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "sandboxed",
        "-q",
        "t",
    ]);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert_eq!(stdout(&quiet), "Fixed the bound; test_four still fails.\n");
    assert_eq!(stderr(&quiet), "");

    std::fs::write(ws.join("lib.py"), "for i in range(n - 1):\n").unwrap();
    let verbose = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "sandboxed",
        "-v",
        "t",
    ]);
    assert_eq!(verbose.status.code(), Some(0), "{}", stderr(&verbose));
    let trace = stderr(&verbose);
    for kind in ["turn:", "gate ", "permission asked", "result call_", "run_completed"] {
        assert!(trace.contains(kind), "{kind} missing in {trace}");
    }
    assert_eq!(stdout(&verbose), "Fixed the bound; test_four still fails.\n");
    assert!(!trace.contains("test_four still fails."), "{trace}");
}

#[test]
fn output_format_json_prints_one_object_at_the_end() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(
        &env,
        r#"{"steps":[{"text":"all good","usage":{"input_tokens":120,"output_tokens":7}}]}"#,
    );
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--output-format", "json", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(text.lines().count(), 1, "{text}");
    let object: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(object["result"], "all good");
    assert_eq!(object["exit"], 0);
    assert_eq!(object["outcome"], "completed");
    assert_eq!(object["session_id"].as_str().unwrap(), session_id(&env));
    assert_eq!(object["usage"]["input_tokens"], 120);
    assert_eq!(object["usage"]["output_tokens"], 7);
    assert!(object["cost_usd"].is_null(), "{object}");
    assert!(object["duration_ms"].as_u64().is_some(), "{object}");
    assert_eq!(stderr(&output), "");
    // stream-json is --json: the event lines, exactly as the ledger keeps them.
    let streamed = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--output-format",
        "stream-json",
        "t",
    ]);
    let events = json_lines(&streamed);
    assert_eq!(events.first().unwrap()["kind"], "session_created");
    assert_eq!(events.last().unwrap()["kind"], "run_completed");
    let session = events[0]["session_id"].as_str().unwrap();
    assert_eq!(stdout(&env.run(&["log", session, "--json"])), stdout(&streamed));
    // A failed run is an object too, with its exit status.
    let failing = scripted(&env, r#"{"steps":[{"text":"x","expect":{"contains":"never sent"}}]}"#);
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &failing,
        "--output-format",
        "json",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let object: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!((object["exit"].as_u64(), object["outcome"].as_str()), (Some(1), Some("failed")));
}

#[test]
fn sessions_show_the_workspace_filter_by_dir_and_limit_with_zoned_times() {
    let env = Env::new();
    let model = scripted(
        &env,
        r#"{"steps":[{"tool_calls":[{"name":"bash","arguments":{"command":"true"}}]},{"text":"hi"}]}"#,
    );
    let a = env.scratch.path().join("a");
    let b = env.scratch.path().join("b");
    for dir in [&a, &b, &a] {
        std::fs::create_dir_all(dir).unwrap();
        let output = env.run(&[
            "run",
            "-C",
            dir.to_str().unwrap(),
            "-m",
            &model,
            "--approval",
            "sandboxed",
            "t",
        ]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        // The sandbox made .keel/ for the command (so it could not plant one); keel
        // leaves no empty folder behind.
        assert!(!dir.join(".keel").exists(), "{}", dir.display());
    }
    // The neighbour: a .keel/ the user made stays, even empty.
    let own = env.scratch.path().join("own");
    std::fs::create_dir_all(own.join(".keel")).unwrap();
    let output = env.run(&[
        "run",
        "-C",
        own.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "sandboxed",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(own.join(".keel").is_dir());
    let all = stdout(&env.run(&["sessions", "-C", env.scratch.path().to_str().unwrap()]));
    assert_eq!(all.lines().count(), 4, "{all}");
    let all: String =
        all.lines().filter(|l| !l.contains("/own")).map(|l| format!("{l}\n")).collect();
    assert_eq!(all.lines().count(), 3, "{all}");
    let a_canonical = a.canonicalize().unwrap();
    let only_a = stdout(&env.run(&["sessions", "-C", a.to_str().unwrap()]));
    assert_eq!(only_a.lines().count(), 2, "{only_a}");
    assert!(only_a.lines().all(|line| line.contains(a_canonical.to_str().unwrap())), "{only_a}");
    let limited = stdout(&env.run(&["sessions", "--limit", "2"]));
    assert_eq!(limited.lines().count(), 2, "{limited}");
    assert!(limited.lines().next().unwrap().contains("/own"), "newest first: {limited}");
    // Times carry their zone (UTC offset).
    let first = all.lines().next().unwrap();
    assert!(
        first.split_whitespace().any(|word| word.len() == 6
            && (word.starts_with('+') || word.starts_with('-'))
            && word.as_bytes()[3] == b':'),
        "{first}"
    );
}

#[test]
fn stop_without_an_active_run_says_so_and_exits_1() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"hi"}]}"#);
    assert_eq!(
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "t"]).status.code(),
        Some(0)
    );
    let output = env.run(&["stop", "--last"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("has no active run (it is completed)"), "{}", stderr(&output));
    // --last works for resume, compact and seal too.
    let resumed = env.run(&["resume", "--last", "again"]);
    assert_eq!(resumed.status.code(), Some(1), "{}", stderr(&resumed));
    assert!(stderr(&resumed).contains("script"), "{}", stderr(&resumed));
    let sealed = env.run(&["seal", "--last"]);
    assert_eq!(sealed.status.code(), Some(0), "{}", stderr(&sealed));
    assert!(stdout(&env.run(&["sessions"])).contains("sealed"));
}

// ---- A wider boundary needs a person (#11 item 7) ----

fn boundary_script(env: &Env, extra: &Path) -> String {
    scripted(
        env,
        &format!(
            r#"{{"steps":[
                {{"tool_calls":[{{"name":"write_file","arguments":{{"path":"in_ws.txt","content":"ok\n"}}}}]}},
                {{"tool_calls":[{{"name":"request_boundary","arguments":{{"paths":[{{"path":"{}","access":"write"}}],"justification":"the build writes its cache there"}}}}]}},
                {{"text":"widened"}}
            ]}}"#,
            extra.display()
        ),
    )
}

fn settled_by(events: &[serde_json::Value], tool: &str) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["kind"] == "permission_settled" && e["tool"] == tool)
        .map(|e| (e["answer"].as_str().unwrap().to_owned(), e["by"].as_str().unwrap().to_owned()))
        .collect()
}

fn widened(events: &[serde_json::Value]) -> bool {
    events.iter().any(|e| e["kind"] == "boundary_revised")
}

fn check_refused_boundary(approval: &str) {
    let env = Env::new();
    let ws = env.workspace();
    let extra = env.scratch.path().join("cache");
    let model = boundary_script(&env, &extra);
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", approval, "t"]);
    // The denial finalizes the turn (exit 4), with the reason shown.
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("request_boundary") && err.contains("a wider boundary needs a person"),
        "{err}"
    );
    let events = ledger(&env, &session_id(&env));
    assert!(!widened(&events), "approval {approval} widened the boundary");
    let (answer, by) = settled_by(&events, "request_boundary").pop().unwrap();
    assert_eq!(answer, "deny");
    assert!(
        by.starts_with(&format!("approval={approval}: a wider boundary needs a person")),
        "{by}"
    );
    // The neighbour: the same mode approved the ordinary write inside the workspace.
    assert_eq!(std::fs::read_to_string(ws.join("in_ws.txt")).unwrap(), "ok\n");
}

#[test]
fn redteam_boundary_auto_never_grants_request_boundary() {
    check_refused_boundary("auto");
}

#[test]
fn redteam_boundary_sandboxed_never_grants_request_boundary() {
    check_refused_boundary("sandboxed");
}

#[test]
fn redteam_boundary_an_explicit_user_rule_grants_only_what_it_names() {
    let env = Env::new();
    let ws = env.workspace();
    let extra = env.scratch.path().join("cache");
    std::fs::write(
        env.home.path().join("config.toml"),
        format!(
            "[permissions]\nallow = [\"request_boundary({}/*)\"]\n",
            env.scratch.path().display()
        ),
    )
    .unwrap();
    let model = boundary_script(&env, &extra);
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let events = ledger(&env, &session_id(&env));
    assert!(widened(&events));
    let (answer, by) = settled_by(&events, "request_boundary").pop().unwrap();
    assert_eq!(
        (answer.as_str(), by.as_str()),
        (
            "allow_once",
            format!("rule:request_boundary({}/*)", env.scratch.path().display()).as_str()
        )
    );
    assert!(stderr(&output).contains("⚠ boundary widened: write"), "{}", stderr(&output));

    // The rule does not reach past its pattern: `..` or another folder is refused.
    let env2 = Env::new();
    let ws2 = env2.workspace();
    std::fs::write(
        env2.home.path().join("config.toml"),
        format!(
            "[permissions]\nallow = [\"request_boundary({}/*)\"]\n",
            env2.scratch.path().join("cache").display()
        ),
    )
    .unwrap();
    let escape = env2.scratch.path().join("cache/../../etc");
    let model = boundary_script(&env2, &escape);
    let output =
        env2.run(&["run", "-C", ws2.to_str().unwrap(), "-m", &model, "--approval", "auto", "t"]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(!widened(&ledger(&env2, &session_id(&env2))));

    // Nor through a link inside the pattern that leads out of it (a command could have made
    // it, or retarget it after the grant).
    let env3 = Env::new();
    let ws3 = env3.workspace();
    let allowed = env3.scratch.path().join("cache");
    let outside = env3.scratch.path().join("outside");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, allowed.join("link")).unwrap();
    std::fs::write(
        env3.home.path().join("config.toml"),
        format!("[permissions]\nallow = [\"request_boundary({}/*)\"]\n", allowed.display()),
    )
    .unwrap();
    let model = boundary_script(&env3, &allowed.join("link"));
    let output =
        env3.run(&["run", "-C", ws3.to_str().unwrap(), "-m", &model, "--approval", "auto", "t"]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(!widened(&ledger(&env3, &session_id(&env3))));
}

#[test]
fn redteam_boundary_a_workspace_rule_does_not_grant() {
    let env = Env::new();
    let ws = env.workspace();
    let extra = env.scratch.path().join("cache");
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    std::fs::write(
        ws.join(".keel/config.toml"),
        "[permissions]\nallow = [\"request_boundary\", \"request_boundary(/*)\"]\n",
    )
    .unwrap();
    let model = boundary_script(&env, &extra);
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto", "t"]);
    assert_ne!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("permissions.allow"), "{}", stderr(&output));
    // Whatever ran, nothing was widened.
    let listed = stdout(&env.run(&["sessions", "--json"]));
    for line in listed.lines() {
        let session: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(!widened(&ledger(&env, session["session_id"].as_str().unwrap())));
    }
    // The neighbour: the same rule in the user's own config does grant.
    std::fs::remove_dir_all(ws.join(".keel")).unwrap();
    std::fs::write(
        env.home.path().join("config.toml"),
        "[permissions]\nallow = [\"request_boundary\"]\n",
    )
    .unwrap();
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn redteam_boundary_sandboxed_approves_nothing_when_the_sandbox_is_bypassed() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[{"name":"bash","arguments":{"command":"echo ran > ran.txt"}}]},
            {"tool_calls":[{"name":"write_file","arguments":{"path":"w.txt","content":"x"}}]},
            {"text":"done","expect":{"last_outcomes":["refused"]}}
        ]}"#,
    );
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "sandboxed",
        "--sandbox",
        "bypass",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!ws.join("ran.txt").exists() && !ws.join("w.txt").exists());
    let err = stderr(&output);
    assert!(
        err.contains(
            "✗ bash echo ran > ran.txt · refused: approval=sandboxed: the sandbox is bypassed"
        ),
        "{err}"
    );
    // The neighbour: managed, the same calls run without asking.
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &scripted(
            &env,
            r#"{"steps":[
            {"tool_calls":[{"name":"bash","arguments":{"command":"echo ran > ran.txt"}}]},
            {"tool_calls":[{"name":"write_file","arguments":{"path":"w.txt","content":"x"}}]},
            {"text":"done","expect":{"last_outcomes":["ok"]}}
        ]}"#,
        ),
        "--approval",
        "sandboxed",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(ws.join("ran.txt").exists() && ws.join("w.txt").exists());
}

#[test]
fn redteam_boundary_sandboxed_refuses_writes_outside_the_workspace() {
    let env = Env::new();
    let ws = env.workspace();
    let outside = env.scratch.path().join("outside.txt");
    let model = scripted(
        &env,
        &format!(
            r#"{{"steps":[
                {{"tool_calls":[{{"name":"write_file","arguments":{{"path":"../outside.txt","content":"x"}}}},
                               {{"name":"edit_file","arguments":{{"path":"{}","old":"a","new":"b"}}}}]}},
                {{"text":"done","expect":{{"last_outcomes":["refused","refused"]}}}}
            ]}}"#,
            outside.display()
        ),
    );
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "sandboxed", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!outside.exists());
    assert_eq!(
        stderr(&output).matches("writes outside the workspace, and no terminal to ask").count(),
        2,
        "{}",
        stderr(&output)
    );
}

#[test]
fn every_flag_in_help_is_in_the_readme() {
    let env = Env::new();
    let readme = std::fs::read_to_string(super::support::repo_root().join("README.md")).unwrap();
    for command in
        ["run", "resume", "sessions", "log", "stop", "compact", "seal", "acp", "wake", "config"]
    {
        let help = stdout(&env.run(&[command, "--help"]));
        let flags: Vec<&str> = help
            .lines()
            .map(str::trim_start)
            // Option lines: `-C, --workspace <DIR>  description` (not `- value: …`).
            .filter(|line| line.starts_with('-') && !line.starts_with("- "))
            .map(|line| line.split("  ").next().unwrap_or(line))
            .flat_map(|line| line.split([' ', ',']))
            .filter(|word| word.starts_with("--") && word.len() > 2)
            .filter(|flag| !matches!(*flag, "--help" | "--version"))
            .collect();
        assert!(!flags.is_empty(), "{command}: {help}");
        for flag in flags {
            assert!(readme.contains(flag), "`keel {command} {flag}` is not in README.md");
        }
    }
}

#[test]
fn redteam_terminal_the_binary_shows_no_raw_escape_from_model_files_or_output() {
    let env = Env::new();
    let ws = env.workspace();
    // Model text, a file name and a command's output that try to clear the screen, set the
    // clipboard (OSC 52), retitle the terminal, overwrite a line and reverse a name.
    let model = scripted(
        &env,
        r#"{"steps":[
            {"text":"plan\u001b[2J\u001b]0;owned\u0007","tool_calls":[{"name":"write_file","arguments":{"path":"x\u001b[8m\u202egpj.exe","content":"a\n"}}]},
            {"tool_calls":[{"name":"bash","arguments":{"command":"printf 'ok\\r\\033[2Kfake ✓ completed\\n\\033]52;c;ZXZpbA==\\007'; exit 1"}}]},
            {"text":"done\u001b[31m red \u009b2J café 日本 🚀"}
        ]}"#,
    );
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "sandboxed", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let session = session_id(&env);
    let log = stdout(&env.run(&["log", &session]));
    let trace = stdout(&env.run(&["log", &session, "-v"]));
    for (name, text) in [("stderr", stderr(&output)), ("log", log.clone()), ("log -v", trace)] {
        assert!(
            !text.contains('\x1b') && !text.contains('\r') && !text.contains('\u{9b}'),
            "{name}: {text:?}"
        );
        assert!(!text.contains('\u{202e}') && !text.contains('\x07'), "{name}: {text:?}");
    }
    assert!(log.contains("  plan\\x1b[2J\\x1b]0;owned\\x07"), "{log}");
    assert!(log.contains("✓ write_file x\\x1b[8m\\u{202e}gpj.exe · ok"), "{log}");
    // The model got the bytes escaped (`\x0d` for the CR); the terminal shows that text.
    assert!(log.contains("│ ok\\x0d\\x1b[2Kfake ✓ completed"), "{log}");
    assert!(log.contains("│ \\x1b]52;c;ZXZpbA==\\x07"), "{log}");
    assert!(log.contains("  done\\x1b[31m red \\u{9b}2J café 日本 🚀"), "{log}");
    // The file was written under its real name, and the piped answer and the JSON log
    // are exact: neutralising is for terminals only.
    assert!(ws.join("x\x1b[8m\u{202e}gpj.exe").exists());
    assert_eq!(stdout(&output), "done\x1b[31m red \u{9b}2J café 日本 🚀\n");
    let events = ledger(&env, &session);
    assert!(events.iter().any(|e| e["text"] == "plan\x1b[2J\x1b]0;owned\x07"));
}

#[test]
fn an_unreachable_endpoint_is_one_line_with_the_url_and_a_hint() {
    let env = Env::new();
    let ws = env.workspace();
    // A port with no server behind it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", "openai:m", "--base-url", &url, "t"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    let failed: Vec<&str> = err.lines().filter(|line| line.starts_with("✗ failed")).collect();
    assert_eq!(failed.len(), 1, "{err}");
    assert!(failed[0].contains(&format!("cannot reach {url}/chat/completions")), "{err}");
    assert!(failed[0].contains("is the server running, and is --base-url"), "{err}");
    // With the view off, the same single line is keel's error line.
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        "openai:m",
        "--base-url",
        &url,
        "-q",
        "t",
    ]);
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("keel: run failed: model error: cannot reach"), "{err}");
}

#[test]
fn a_sub_agent_shows_under_its_call_and_each_log_is_its_own_projection() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("notes.txt"), "the answer is 42\n").unwrap();
    let model = scripted(
        &env,
        r#"{
            "steps": [
                {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"Find the answer in notes.txt."}}]},
                {"text":"The child found 42.","expect":{"last_outcomes":["ok"]}}
            ],
            "agents": {"Find the answer in notes.txt.": {"steps": [
                {"tool_calls":[{"name":"read_file","arguments":{"path":"notes.txt"}}]},
                {"text":"42"}
            ]}}
        }"#,
    );
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    let (child, own): (Vec<&str>, Vec<&str>) = err.lines().partition(|l| l.starts_with("    ┊ "));
    assert!(child.iter().any(|l| l.contains("✓ read_file notes.txt · ok")), "{err}");
    assert!(child.contains(&"    ┊ 42"), "the child's answer is shown under the call: {err}");
    assert!(
        own.iter().any(|l| l.contains("✓ spawn_agent Find the answer in notes.txt. · ok")),
        "{err}"
    );
    // The parent's log is the parent's lines; the child's log is the child's.
    let parent = stdout(&env.run(&["log", "--last"]));
    let replayed: Vec<&str> = parent.lines().filter(|l| *l != "  The child found 42.").collect();
    assert_eq!(replayed, own);
    let listed = stdout(&env.run(&["sessions", "--json"]));
    let child_id = listed
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|s| !s["parent"].is_null())
        .unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let child_log = stdout(&env.run(&["log", &child_id]));
    let child_live: Vec<String> =
        child.iter().map(|l| l.trim_start_matches("    ┊ ").to_owned()).collect();
    let child_replayed: Vec<String> = child_log
        .lines()
        .map(|l| if l == "  42" { "42".to_owned() } else { l.to_owned() })
        .collect();
    assert_eq!(child_replayed, child_live);
}

#[test]
fn redteam_boundary_sandboxed_does_not_approve_edits_of_git_metadata_or_links_out() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    let outside = env.scratch.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
    std::os::unix::fs::symlink(ws.join(".git/hooks"), ws.join("hooks")).unwrap();
    let model = scripted(
        &env,
        r##"{"steps":[
            {"tool_calls":[
                {"name":"write_file","arguments":{"path":".git/hooks/pre-commit","content":"#!/bin/sh\nid\n"}},
                {"name":"write_file","arguments":{"path":"hooks/post-checkout","content":"#!/bin/sh\nid\n"}},
                {"name":"write_file","arguments":{"path":"out/planted","content":"x"}},
                {"name":"write_file","arguments":{"path":"src/ok.txt","content":"fine\n"}}
            ]},
            {"text":"done","expect":{"last_outcomes":["refused","refused","refused","ok"]}}
        ]}"##,
    );
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "sandboxed", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    assert_eq!(err.matches("writes git or keel metadata").count(), 2, "{err}");
    assert_eq!(err.matches("writes outside the workspace").count(), 1, "{err}");
    assert!(
        !ws.join(".git/hooks/pre-commit").exists() && !ws.join(".git/hooks/post-checkout").exists()
    );
    assert!(!outside.join("planted").exists());
    // The neighbour: an ordinary new file in the workspace was written without asking.
    assert_eq!(std::fs::read_to_string(ws.join("src/ok.txt")).unwrap(), "fine\n");
}

/// The long flags `keel ARGS --help` lists.
fn help_flags(env: &Env, args: &[&str]) -> std::collections::BTreeSet<String> {
    let mut args = args.to_vec();
    args.push("--help");
    let help = stdout(&env.run(&args));
    help.lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-') && !line.starts_with("- "))
        .map(|line| line.split("  ").next().unwrap_or(line))
        .flat_map(|line| line.split([' ', ',']))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .filter(|flag| !matches!(*flag, "--help" | "--version"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn each_command_help_lists_only_the_flags_it_honours() {
    let env = Env::new();
    let model = ["--model", "--base-url", "--context-window"];
    let envelope = ["--mode", "--reads", "--writes", "--forbid"];
    let consent = ["--sandbox", "--approval"];
    let budget = ["--max-steps", "--max-tokens", "--max-cost-usd", "--max-time"];
    let output = ["--json", "--output-format", "--quiet", "--verbose"];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        // The workspace is each ACP session's cwd, and stdout is the protocol's.
        (
            "acp",
            [
                &model[..],
                &envelope,
                &consent,
                &budget,
                &["--output-schema", "--permission-timeout"],
            ]
            .concat(),
        ),
        // A woken session keeps its workspace, mode and envelope.
        ("wake", [&model[..], &consent, &budget, &output, &["--output-schema"]].concat()),
        // Compaction asks the model for a summary; nothing else runs.
        ("compact", [&model[..], &["--last"]].concat()),
        // What the settings would be: every setting flag, nothing about output.
        ("config", [&model[..], &envelope, &consent, &budget, &["--workspace"]].concat()),
    ];
    for (command, honoured) in cases {
        let mut expected: std::collections::BTreeSet<String> =
            honoured.iter().map(|flag| (*flag).to_owned()).collect();
        expected.insert("--config".into());
        assert_eq!(help_flags(&env, &[command]), expected, "keel {command} --help");
    }
    // The neighbour: run and resume still take every group.
    for command in ["run", "resume"] {
        let flags = help_flags(&env, &[command]);
        for flag in model.iter().chain(&envelope).chain(&consent).chain(&budget).chain(&output) {
            assert!(flags.contains(*flag), "keel {command} --help lacks {flag}");
        }
        assert!(flags.contains("--workspace"), "keel {command}");
    }
    // A flag a command does not take is a usage error, not silently ignored.
    for args in [
        &["acp", "-C", "/tmp"][..],
        &["acp", "--json"],
        &["wake", "wake_x", "--mode", "plan"],
        &["wake", "wake_x", "-C", "/tmp"],
        &["compact", "--last", "--approval", "auto"],
        &["config", "--output-format", "json"],
    ] {
        let refused = env.run(args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {}", stderr(&refused));
        assert!(stderr(&refused).contains("unexpected argument"), "{args:?}: {}", stderr(&refused));
    }
    // What `keel config` takes it shows: --context-window as a flag's setting.
    let shown = stdout(&env.run(&["config", "--context-window", "5000"]));
    let row = shown.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "context_window").then(|| value.trim().to_owned())
    });
    assert_eq!(row.as_deref(), Some("5000  # flag --context-window"), "{shown}");
}

#[test]
fn a_resumed_session_shows_the_same_header_as_its_first_run() {
    let env = Env::new();
    let ws = env.workspace();
    let model =
        scripted(&env, r#"{"steps":[{"text":"first"},{"text":"second"},{"text":"third"}]}"#);
    let first = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "one"]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let header = stderr(&first).lines().next().unwrap().to_owned();
    assert!(header.starts_with("keel session "), "{header}");
    let resumed = env.run(&["resume", "--last", "two"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(stdout(&resumed), "second\n");
    let shown = stderr(&resumed);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], header, "{shown}");
    assert_eq!(lines[1], "▸ two", "{shown}");
    // And `keel log` replays both turns under the one header.
    let log = stdout(&env.run(&["log", "--last"]));
    assert_eq!(log.lines().filter(|line| line.starts_with("keel session ")).count(), 1, "{log}");
    // Quiet stays quiet.
    let quiet = env.run(&["resume", "--last", "-q", "three"]);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert_eq!((stdout(&quiet).as_str(), stderr(&quiet).as_str()), ("third\n", ""));
}
