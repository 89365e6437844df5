//! The progress view, live on stderr and replayed by `keel log`: one line per call, `-v`
//! and `-q`, `--output-format json`, escapes from the model and commands neutralised, an
//! unreachable endpoint in one line, a sub-agent under its call, and a resumed session's
//! header.

use expect_test::expect;

use super::harness::{ledger, session_id};
use crate::suite::support::{Env, json_lines, scripted, stderr, stdout};

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

#[test]
fn a_run_shows_one_line_per_call_and_its_log_reads_the_same() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("lib.py"), "for i in range(n - 1):\n    total += i\n").unwrap();
    let model = scripted(&env, EDIT_FAIL_REFUSE);
    let output = env.run_t(&ws, &model, &["--approval", "sandboxed"]);
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
    let quiet = env.run_t(&ws, &model, &["--approval", "sandboxed", "-q"]);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert_eq!(stdout(&quiet), "Fixed the bound; test_four still fails.\n");
    assert_eq!(stderr(&quiet), "");

    std::fs::write(ws.join("lib.py"), "for i in range(n - 1):\n").unwrap();
    let verbose = env.run_t(&ws, &model, &["--approval", "sandboxed", "-v"]);
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
    let output = env.run_t(&ws, &model, &["--output-format", "json"]);
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
    let streamed = env.run_t(&ws, &model, &["--output-format", "stream-json"]);
    let events = json_lines(&streamed);
    assert_eq!(events.first().unwrap()["kind"], "session_created");
    assert_eq!(events.last().unwrap()["kind"], "run_completed");
    let session = events[0]["session_id"].as_str().unwrap();
    assert_eq!(stdout(&env.run(&["log", session, "--json"])), stdout(&streamed));
    // A failed run is an object too, with its exit status.
    let failing = scripted(&env, r#"{"steps":[{"text":"x","expect":{"contains":"never sent"}}]}"#);
    let output = env.run_t(&ws, &failing, &["--output-format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let object: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!((object["exit"].as_u64(), object["outcome"].as_str()), (Some(1), Some("failed")));
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
    let output = env.run_t(&ws, &model, &["--approval", "sandboxed"]);
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
    let output = env.run_t(&ws, "openai:m", &["--base-url", &url]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    let failed: Vec<&str> = err.lines().filter(|line| line.starts_with("✗ failed")).collect();
    assert_eq!(failed.len(), 1, "{err}");
    assert!(failed[0].contains(&format!("cannot reach {url}/chat/completions")), "{err}");
    assert!(failed[0].contains("is the server running, and is --base-url"), "{err}");
    // With the view off, the same single line is keel's error line.
    let output = env.run_t(&ws, "openai:m", &["--base-url", &url, "-q"]);
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
    let output = env.run_t(&ws, &model, &["--approval", "auto"]);
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
