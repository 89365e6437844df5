//! Usage errors and what a run takes from its command line: exit 2 with a message and no
//! session, a scripted model's file that is no regular file or too large, a relative script
//! path, a closed stdout, and the private home every test runs in.

use std::time::Duration;

use crate::suite::support::{Env, json_lines, mkfifo, output_within, scripted, stderr, stdout};

#[test]
fn usage_errors_exit_2_with_a_message() {
    let env = Env::new();
    let ws = env.workspace();
    let ws = ws.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["run", "-C", ws, "-m", "nonsense", "t"], "invalid model spec"),
        (&["run", "-C", ws, "-m", "scripted:/nonexistent.json", "t"], "cannot read script"),
        (&["run", "-C", ws, "-m", "scripted:x", "--approval", "ask", "t"], "needs a terminal"),
        (&["run", "-C", ws, "-m", "nonsense:x", "t"], "unknown provider"),
        (
            &["run", "-C", ws, "-m", "scripted:x", "--max-time", "soon", "t"],
            "invalid duration 'soon'",
        ),
        (
            &["run", "-C", ws, "-m", "openai:no-such-model", "--max-cost-usd", "1", "t"],
            "no price known",
        ),
        // Unknown is not zero: an unpriced scripted model cannot take a cost ceiling either.
        (&["run", "-C", ws, "-m", "scripted:x", "--max-cost-usd", "1", "t"], "no price known"),
        (
            &["run", "-C", ws, "-m", "scripted:x", "--sandbox", "loose", "t"],
            "invalid value 'loose'",
        ),
        (&["run", "-C", "/nonexistent/dir", "-m", "scripted:x", "t"], "workspace /nonexistent/dir"),
        (&["log", "zzzz"], "no session matches 'zzzz'"),
        (
            &["run", "-C", ws, "-m", "scripted:x", "--max-steps", "0", "t"],
            "--max-steps must be at least 1",
        ),
        (&["run", "-C", ws, "-m", "scripted:x", "--max-time", "0s", "t"], "give a positive time"),
        // A duration needs its unit: is `10` seconds or minutes?
        (&["run", "-C", ws, "-m", "scripted:x", "--max-time", "10", "t"], "with its unit"),
        // Beyond 100 years: refused where parsed, never an overflowing deadline.
        (
            &["run", "-C", ws, "-m", "scripted:x", "--max-time", "9223372036854775807s", "t"],
            "at most 876000h",
        ),
        (&["wake", "0", "--max-time", "9300000000000000000s"], "at most 876000h"),
        // Missing key, empty model name, unknown provider: usage errors before a session.
        (&["run", "-C", ws, "-m", "openai:gpt-4o", "t"], "OPENAI_API_KEY is not set"),
        (
            &["run", "-C", ws, "-m", "anthropic:claude-sonnet-4-5", "t"],
            "ANTHROPIC_API_KEY is not set",
        ),
        (&["run", "-C", ws, "-m", "openai:", "t"], "names no model"),
        (&["run", "-C", ws, "-m", "gemini:pro", "t"], "unknown provider 'gemini'"),
        (&["log", "--last"], "there are no sessions yet"),
    ];
    for (args, message) in cases {
        let output = env.run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", stderr(&output));
        assert!(stderr(&output).contains(message), "{args:?}: {}", stderr(&output));
    }
    // None of them created a session.
    assert_eq!(stdout(&env.run(&["sessions", "--json"])), "");
}

#[test]
fn a_typo_in_a_tool_scope_is_a_usage_error_not_a_silent_no_op() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"hi"}]}"#);
    for flag in ["--forbid", "--reads", "--writes"] {
        let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, flag, "bsh", "t"]);
        assert_eq!(output.status.code(), Some(2), "{flag}: {}", stderr(&output));
        assert!(
            stderr(&output).contains(&format!("unknown tool 'bsh' in {flag}")),
            "{}",
            stderr(&output)
        );
    }
}

/// A FIFO given as the scripted model's file is refused (exit 2), never opened for a
/// blocking read that would hang keel; so is a script past the 16 MiB cap. The neighbour:
/// a regular script beside them runs.
#[test]
fn redteam_input_a_fifo_or_oversized_scripted_model_file_is_refused_not_hung() {
    let env = Env::new();
    let ws = env.workspace();
    let fifo = env.scratch.path().join("script.fifo");
    mkfifo(&fifo);
    let run = |model: String| {
        let mut command = env.keel();
        command.args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "hi"]);
        output_within(command, Duration::from_secs(30))
    };
    let output = run(format!("scripted:{}", fifo.display()));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("is not a regular file"), "{}", stderr(&output));
    let huge = env.scratch.path().join("huge.json");
    std::fs::File::create(&huge).unwrap().set_len(16 * 1024 * 1024 + 1).unwrap();
    let output = run(format!("scripted:{}", huge.display()));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("more than the 16777216 bytes"), "{}", stderr(&output));
    let hello = env.write_script("hello.json", r#"{"steps":[{"text":"hello there"}]}"#);
    let output = run(format!("scripted:{}", hello.display()));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "hello there\n");
}

#[test]
fn a_relative_script_path_is_recorded_absolute_so_resume_works_from_anywhere() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(
        env.scratch.path().join("two.json"),
        r#"{"steps":[{"text":"first"},{"text":"second"}]}"#,
    )
    .unwrap();
    let output = env
        .keel()
        .current_dir(env.scratch.path())
        .args(["run", "-C", ws.to_str().unwrap(), "-m", "scripted:two.json", "--json", "t"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let events = json_lines(&output);
    let session = events[0]["session_id"].as_str().unwrap().to_owned();
    assert!(events[0]["model"].as_str().unwrap().starts_with("scripted:/"), "{}", events[0]);
    let resumed = env.keel().current_dir("/").args(["resume", &session, "again"]).output().unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(stdout(&resumed).trim(), "second");
}

#[test]
fn a_closed_stdout_is_not_a_panic() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"a long answer"}]}"#);
    for _ in 0..3 {
        assert_eq!(env.run_t(&ws, &model, &[]).status.code(), Some(0));
    }
    for args in [vec!["sessions"], vec!["run", "-C", ws.to_str().unwrap(), "-m", &model, "t"]] {
        let mut child = env
            .keel()
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        assert!(!stderr(&output).contains("panicked"), "{args:?}: {}", stderr(&output));
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", stderr(&output));
    }
}

#[test]
fn the_test_environment_has_a_private_home() {
    let env = Env::new();
    let ws = env.workspace();
    let home = env.home.path().to_str().unwrap();
    let model = scripted(
        &env,
        &serde_json::json!({"steps": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo \"home=$HOME\""}}]},
            {"text": "done", "expect": {"contains": format!("home={home}")}}
        ]})
        .to_string(),
    );
    let output = env.run_t(&ws, &model, &["--approval", "auto", "--sandbox", "bypass"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "done\n");
}
