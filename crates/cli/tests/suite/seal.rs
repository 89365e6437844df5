//! `keel seal` (DESIGN.md §6, §9): a sealed session never runs agent code again; `resume`
//! refuses it with exit 2, while `log` and `sessions` still show it.

use super::support::{Env, json_lines, stderr, stdout};

#[test]
fn a_sealed_session_is_refused_by_resume_and_still_listed_and_logged() {
    let env = Env::new();
    let ws = env.workspace();
    // Step 1 suspends the run (max 1 step, tools off); step 2 would answer a resume.
    let script = env.write_script(
        "script.json",
        r#"{"steps":[{"text":"Report: nothing done yet."},{"text":"resumed, which must not happen"}]}"#,
    );
    let model = format!("scripted:{}", script.display());
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--max-steps",
        "1",
        "--json",
        "look around",
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let prefix = &session[..13];

    let output = env.run(&["seal", prefix, "--reason", "handed over to a human"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains(&format!("sealed session {session}")), "{}", stderr(&output));

    // Resuming the interrupted turn and starting a new one are both refused.
    for args in [&["resume", prefix][..], &["resume", prefix, "one more thing"][..]] {
        let output = env.run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", stderr(&output));
        let message = stderr(&output);
        assert!(
            message.contains("is sealed (handed over to a human)")
                && message.contains("never runs agent code"),
            "{args:?}: {message}"
        );
    }
    // Sealing twice is a usage error too, and changes nothing.
    let output = env.run(&["seal", prefix]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("sealed already"), "{}", stderr(&output));

    let output = env.run(&["log", prefix, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let events = json_lines(&output);
    let kinds: Vec<&str> = events.iter().map(|event| event["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.last(), Some(&"session_sealed"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|kind| **kind == "session_sealed").count(), 1);
    assert_eq!(events.last().unwrap()["reason"], "handed over to a human");
    assert!(!kinds.contains(&"run_completed"), "no agent code ran after the seal: {kinds:?}");
    let human = stdout(&env.run(&["log", prefix]));
    assert!(human.contains("sealed: handed over to a human"), "{human}");

    let listed = stdout(&env.run(&["sessions"]));
    assert!(listed.contains(&session) && listed.contains("sealed"), "{listed}");
    let listed = stdout(&env.run(&["sessions", "--json"]));
    assert!(listed.contains("\"status\":\"sealed\""), "{listed}");
}

#[test]
fn seal_of_an_unknown_session_is_a_usage_error() {
    let env = Env::new();
    let output = env.run(&["seal", "zzzz"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("no session matches 'zzzz'"), "{}", stderr(&output));
}
