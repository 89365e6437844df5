//! The README's main command: the scripted agent fixes examples/roman in a copy, and the
//! project's own test suite goes from failing to passing.

use std::process::Command;

use super::support::{Env, copy_dir, json_lines, repo_root, stderr, stdout};

fn unittest_passes(dir: &std::path::Path) -> bool {
    Command::new("python3")
        .args(["-m", "unittest", "-q"])
        .current_dir(dir)
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn scripted_agent_fixes_the_roman_example() {
    let env = Env::new();
    let project = env.scratch.path().join("roman");
    copy_dir(&repo_root().join("examples/roman"), &project);
    assert!(!unittest_passes(&project), "the example must fail before the run");

    let script = repo_root().join("examples/roman.fix.json");
    // The machine's HOME, not the test's private one: the managed sandbox lets a command
    // reach a toolchain on PATH inside HOME through its top folder (`~/.pyenv/shims` grants
    // `~/.pyenv`), and `python3` may be such a shim, as a user running the README has it.
    let mut keel = env.keel();
    match std::env::var_os("HOME") {
        Some(home) => keel.env("HOME", home),
        None => keel.env_remove("HOME"),
    };
    let output = keel
        .args([
            "run",
            "-C",
            project.to_str().unwrap(),
            "-m",
            &format!("scripted:{}", script.display()),
            "--approval",
            "auto",
            "--json",
            "Fix the failing tests",
        ])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}\nstdout: {}",
        stderr(&output),
        stdout(&output)
    );
    assert!(unittest_passes(&project), "the example's own tests pass after the run");

    let events = json_lines(&output);
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"session_created"));
    assert_eq!(kinds.last(), Some(&"run_completed"));
    let outcomes: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["ok", "ok", "ok", "ok"]);
    // The ledger kept by `keel log --json` is exactly what `--json` streamed.
    let session = events[0]["session_id"].as_str().unwrap();
    let log = env.run(&["log", session, "--json"]);
    assert_eq!(stdout(&log), stdout(&output));
}

/// The README's example under a step budget: the budget's last-step notice comes after the
/// tool results, and the script's `expect.last_outcomes` still sees them, so the run is
/// suspended (exit 3, DESIGN.md §9), not failed on a false expectation.
#[test]
fn the_roman_example_under_max_steps_is_suspended_with_exit_3() {
    let env = Env::new();
    let project = env.scratch.path().join("roman");
    copy_dir(&repo_root().join("examples/roman"), &project);
    let script = repo_root().join("examples/roman.fix.json");
    let mut keel = env.keel();
    match std::env::var_os("HOME") {
        Some(home) => keel.env("HOME", home),
        None => keel.env_remove("HOME"),
    };
    let output = keel
        .args([
            "run",
            "-C",
            project.to_str().unwrap(),
            "-m",
            &format!("scripted:{}", script.display()),
            "--approval",
            "auto",
            "--max-steps",
            "2",
            "--json",
            "Fix the failing tests",
        ])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(3),
        "stderr: {}\nstdout: {}",
        stderr(&output),
        stdout(&output)
    );
    let events = json_lines(&output);
    let last = events.last().unwrap();
    assert_eq!(last["kind"], "run_suspended", "{last}");
    assert!(last["reason"].as_str().unwrap().contains("step budget"), "{last}");
    assert!(events.iter().any(|e| e["kind"] == "checkpoint"));
    assert!(!events.iter().any(|e| e["kind"] == "run_failed"));
    // The first command ran; nothing else did (the last step is tools off).
    let outcomes: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["ok", "cancelled"]);
    assert!(!unittest_passes(&project), "no edit ran past the budget");
}
