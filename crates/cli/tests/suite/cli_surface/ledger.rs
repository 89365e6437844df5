//! `keel sessions` and `keel log` over the ledger: the tree of sub-agents, usage summed
//! over turns, a corrupt record, no ledger yet, a FIFO where the ledger should be, and a
//! read-only KEEL_HOME.

use std::time::Duration;

use crate::suite::support::{Env, json_lines, mkfifo, output_within, scripted, stderr, stdout};

#[test]
fn sub_agents_appear_under_their_parent_in_sessions_tree() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("notes.txt"), "the answer is 42\n").unwrap();
    let model = scripted(
        &env,
        r#"{
            "steps": [
                {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"Find the answer in notes.txt."}}]},
                {"text":"The child found 42.","expect":{"last_outcomes":["ok"],"contains":"completed: 42"}}
            ],
            "agents": {"Find the answer in notes.txt.": {"steps": [
                {"tool_calls":[{"name":"read_file","arguments":{"path":"notes.txt"}},{"name":"write_file","arguments":{"path":"x","content":"y"}}]},
                {"text":"42","expect":{"last_outcomes":["ok","error"]}}
            ]}}
        }"#,
    );
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "auto",
        "ask a child",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "The child found 42.");
    assert!(!ws.join("x").exists(), "a child cannot write");
    let tree = stdout(&env.run(&["sessions", "--tree"]));
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 2, "{tree}");
    assert!(lines[0].contains("ask a child") && !lines[0].starts_with(' '), "{tree}");
    assert!(lines[1].starts_with("  ") && lines[1].contains("Find the answer"), "{tree}");
}

/// Issue #13: `keel sessions` shows each session's usage from the summary table the store
/// keeps with every append, summed over every response of every turn.
#[test]
fn sessions_show_usage_summed_over_every_turn() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":300,"output_tokens":100}},
            {"text":"first","usage":{"input_tokens":400,"output_tokens":20}},
            {"text":"second","usage":{"input_tokens":500,"output_tokens":7}}
        ]}"#,
    );
    let output = env.run_t(&ws, &model, &["--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let output = env.run(&["resume", &session, "and more"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let listed: serde_json::Value =
        serde_json::from_str(stdout(&env.run(&["sessions", "--json"])).trim()).unwrap();
    assert_eq!(listed["session_id"], session.as_str());
    let usage = &listed["usage"];
    assert_eq!(
        (&usage["input_tokens"], &usage["output_tokens"], &usage["responses"]),
        (&serde_json::json!(1200), &serde_json::json!(127), &serde_json::json!(3)),
        "{listed}"
    );
    let table = stdout(&env.run(&["sessions"]));
    assert!(table.contains(&session) && table.contains("1327 tok"), "{table}");
}

/// A damaged record in one session (../shared/cases/bugs/B05's kind) is reported by what
/// reads it, and every session is still listed (`keel sessions` reads the summary table,
/// never the events: issue #13).
#[test]
fn one_corrupt_session_does_not_hide_the_others() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"hi"}]}"#);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let output = env.run_t(&ws, &model, &["--json"]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        ids.push(json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned());
    }
    let db = rusqlite::Connection::open(env.home.path().join("keel.sqlite")).unwrap();
    db.execute("UPDATE events SET body = '{\"torn' WHERE session_id = ?1 AND seq = 3", [&ids[0]])
        .unwrap();
    drop(db);
    let listed = env.run(&["sessions"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains(&ids[1]), "{}", stdout(&listed));
    assert!(stdout(&listed).contains(&ids[0]), "{}", stdout(&listed));
    let log = env.run(&["log", &ids[0]]);
    assert_eq!(log.status.code(), Some(1));
    assert!(stderr(&log).contains("corrupt event at seq 3"), "{}", stderr(&log));
}

const DONE_SCRIPT: &str = r#"{"steps":[{"text":"done"}]}"#;

/// With no ledger yet, the read-only commands say so and create nothing under KEEL_HOME
/// (no keel.sqlite, no -wal); the neighbour: after a run, the same listing shows it.
#[test]
fn sessions_and_log_without_a_ledger_create_nothing() {
    let env = Env::new();
    let listing = |env: &Env| {
        std::fs::read_dir(env.home.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("keel.sqlite"))
            .collect::<Vec<_>>()
    };
    let sessions = env.run(&["sessions"]);
    assert_eq!(sessions.status.code(), Some(0), "{}", stderr(&sessions));
    assert!(stderr(&sessions).contains("no sessions yet"), "{}", stderr(&sessions));
    let json = env.run(&["sessions", "--json"]);
    assert_eq!((json.status.code(), stdout(&json)), (Some(0), String::new()));
    let log = env.run(&["log", "zzzz"]);
    assert_eq!(log.status.code(), Some(2), "{}", stderr(&log));
    assert!(stderr(&log).contains("no session matches 'zzzz'"), "{}", stderr(&log));
    let last = env.run(&["log", "--last"]);
    assert_eq!(last.status.code(), Some(2), "{}", stderr(&last));
    assert!(stderr(&last).contains("there are no sessions yet"), "{}", stderr(&last));
    assert_eq!(listing(&env), Vec::<String>::new(), "nothing was created");
    let ws = env.workspace();
    let model = format!("scripted:{}", env.write_script("d.json", DONE_SCRIPT).display());
    let run = env.run_t(&ws, &model, &["-q"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let json = env.run(&["sessions", "--json"]);
    assert_eq!(stdout(&json).lines().count(), 1, "{}", stdout(&json));
}

/// A FIFO at `KEEL_HOME/keel.sqlite` (or at its `-wal`) is refused with a clear error by
/// the listing and by a run, never opened (SQLite's blocking open would hang). The
/// neighbour: with a regular ledger there, both work.
#[test]
fn redteam_home_a_fifo_as_the_ledger_is_refused_not_hung() {
    let env = Env::new();
    let ws = env.workspace();
    let ledger = env.home.path().join("keel.sqlite");
    let hello = scripted(&env, r#"{"steps":[{"text":"hello there"}]}"#);
    let keel = |args: &[&str]| {
        let mut command = env.keel();
        command.args(args);
        output_within(command, Duration::from_secs(30))
    };
    let run_args = ["run", "-C", ws.to_str().unwrap(), "-m", hello.as_str(), "hi"];
    mkfifo(&ledger);
    for args in [&["sessions"][..], &run_args[..]] {
        let output = keel(args);
        assert_ne!(output.status.code(), Some(0), "{args:?}");
        let err = stderr(&output);
        assert!(
            err.contains(&format!("ledger {} is not a regular file", ledger.display())),
            "{err}"
        );
        assert!(err.contains("FIFO"), "{err}");
    }
    std::fs::remove_file(&ledger).unwrap();
    let output = keel(&run_args);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // A FIFO beside a real ledger, as its WAL, is refused too.
    let wal = env.home.path().join("keel.sqlite-wal");
    // Checkpointed first, so the run's events are in the file, not only in the WAL.
    {
        let connection = rusqlite::Connection::open(&ledger).unwrap();
        connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    }
    assert!(!wal.exists());
    mkfifo(&wal);
    let output = keel(&["sessions"]);
    assert!(
        stderr(&output).contains("keel.sqlite-wal is not a regular file"),
        "{}",
        stderr(&output)
    );
    std::fs::remove_file(&wal).unwrap();
    let output = keel(&["sessions"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).lines().count(), 1, "{}", stdout(&output));

    // KEEL_HOME itself a FIFO, a plain file or a dangling link: refused by what it is.
    let scratch = tempfile::tempdir().unwrap();
    for (home, kind) in [
        (scratch.path().join("fifo"), "a FIFO"),
        (scratch.path().join("file"), "a file"),
        (scratch.path().join("dangling"), "a symbolic link to nothing"),
    ] {
        match kind {
            "a file" => std::fs::write(&home, "not a folder").unwrap(),
            "a FIFO" => mkfifo(&home),
            _ => std::os::unix::fs::symlink(scratch.path().join("missing"), &home).unwrap(),
        }
        // (Through a dangling link there is no ledger to list: `keel sessions` says so.)
        let dangling = kind.starts_with("a symbolic link");
        let commands =
            if dangling { &[&run_args[..]][..] } else { &[&["sessions"][..], &run_args[..]] };
        for args in commands {
            let mut command = env.keel();
            command.env("KEEL_HOME", &home).args(*args);
            let output = output_within(command, Duration::from_secs(30));
            assert_ne!(output.status.code(), Some(0), "{args:?}");
            let err = stderr(&output);
            let said = format!("cannot keep the ledger in {}: it is {kind}", home.display());
            assert!(err.contains(&said), "{err}");
            assert!(!err.contains("os error"), "{err}");
        }
    }
}

/// `keel ARGS` with `KEEL_HOME` bind-mounted read-only in a private mount namespace (a
/// read-only mount binds root too, unlike permission bits); the shell first proves the
/// folder cannot be written.
fn keel_in_read_only_home(env: &Env, args: &[&str]) -> std::process::Output {
    let keel = env.keel();
    let mut command = std::process::Command::new("unshare");
    command
        .args(["-m", "sh", "-c"])
        .arg(
            "mount --bind \"$KEEL_HOME\" \"$KEEL_HOME\" && mount -o remount,bind,ro \"$KEEL_HOME\" \
             && ! touch \"$KEEL_HOME/probe\" 2>/dev/null && exec \"$0\" \"$@\"",
        )
        .arg(keel.get_program())
        .args(args);
    for (key, value) in keel.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    output_within(command, Duration::from_secs(30))
}

/// With `KEEL_HOME` read-only and only the ledger file there (no `-wal`, no `-shm`),
/// `keel sessions` and `keel log` still read it; with a `-wal` that would need a `-shm`
/// created beside it, they say clearly that KEEL_HOME cannot be written. The neighbour:
/// writable again, the same home lists as before.
#[test]
fn sessions_and_log_read_a_ledger_in_a_read_only_keel_home() {
    let env = Env::new();
    let ws = env.workspace();
    let hello = scripted(&env, r#"{"steps":[{"text":"hello there"}]}"#);
    let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &hello, "--json", "hi"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let ledger = env.home.path().join("keel.sqlite");
    let beside = |suffix: &str| env.home.path().join(format!("keel.sqlite{suffix}"));
    // Checkpointed and closed by the last connection: the file alone is the ledger.
    {
        let connection = rusqlite::Connection::open(&ledger).unwrap();
        connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    }
    assert!(!beside("-wal").exists() && !beside("-shm").exists());
    let before = std::fs::read(&ledger).unwrap();

    let listed = keel_in_read_only_home(&env, &["sessions"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains(&session) && stdout(&listed).contains("completed"));
    let log = keel_in_read_only_home(&env, &["log", &session]);
    assert_eq!(log.status.code(), Some(0), "{}", stderr(&log));
    assert!(stdout(&log).contains("hello there"), "{}", stdout(&log));
    assert_eq!(std::fs::read(&ledger).unwrap(), before);

    // A WAL beside it (its events may be only there): a clear error, never a short read.
    std::fs::copy(&ledger, beside("-wal")).unwrap();
    let refused = keel_in_read_only_home(&env, &["sessions"]);
    assert_ne!(refused.status.code(), Some(0));
    let err = stderr(&refused);
    assert!(err.contains("its folder (KEEL_HOME) cannot be written"), "{err}");
    assert!(err.contains("-wal"), "{err}");
    std::fs::remove_file(beside("-wal")).unwrap();

    let listed = env.run(&["sessions"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains(&session));
}
