//! `keel eval` as a user runs it: the example dataset, usage errors, and `kill -9` of the
//! keel process mid-experiment, then `keel eval resume DIR`.

use std::path::Path;
use std::time::{Duration, Instant};

use super::support::{Env, copy_dir, repo_root, stderr, stdout};

fn results(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn eval_runs_the_example_dataset_with_oracle_and_a_scripted_subject() {
    let env = Env::new();
    let out = env.scratch.path().join("out");
    let root = repo_root();
    let output = env
        .keel()
        .current_dir(&root)
        .args(["eval", "examples/eval/tasks", "-s", "oracle", "-s"])
        .arg("scripted:examples/eval/subjects/hello.json")
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).contains("8 cells"), "{}", stdout(&output));
    let lines = results(&out);
    assert_eq!(lines.len(), 8);
    for line in &lines {
        for field in [
            "task",
            "subject",
            "repetition",
            "class",
            "reward",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "duration_ms",
            "session_id",
            "trajectory",
        ] {
            assert!(line.get(field).is_some(), "{field} missing in {line}");
        }
        if line["subject"] == "oracle" {
            assert_eq!(line["class"], "passed", "{line}");
        }
    }
    let class = |task: &str| {
        lines
            .iter()
            .find(|l| l["task"] == task && l["subject"] != "oracle")
            .map(|l| l["class"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(class("hello-file"), "passed");
    assert_eq!(class("fix-calc"), "failed");
    assert_eq!(class("strict-verifier"), "verifier_error");
    // The agent's session is an ordinary keel session.
    let session = lines.iter().find_map(|l| l["session_id"].as_str()).unwrap();
    let log = env.run(&["log", session]);
    assert_eq!(log.status.code(), Some(0), "{}", stderr(&log));
    assert!(out.join("report.html").is_file() && out.join("report.md").is_file());
}

#[test]
fn eval_usage_errors_exit_2() {
    let env = Env::new();
    let out = env.scratch.path().join("out");
    let tasks = repo_root().join("examples/eval/tasks");
    let bad_subject = env
        .keel()
        .arg("eval")
        .arg(&tasks)
        .args(["-s", "gpt4"])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(bad_subject.status.code(), Some(2), "{}", stderr(&bad_subject));
    assert!(stderr(&bad_subject).contains("neither oracle nor a model spec"));
    let no_dir = env.run(&["eval", "resume", env.scratch.path().join("nothing").to_str().unwrap()]);
    assert_eq!(no_dir.status.code(), Some(2), "{}", stderr(&no_dir));
    assert!(stderr(&no_dir).contains("holds no experiment"));
    // A subject whose script is missing or invalid is found before any attempt: exit 2,
    // both named, nothing written (it used to run every attempt as infra_error, exit 0).
    let missing = env.scratch.path().join("no-such.json");
    let invalid = env.write_script("invalid.json", r#"{"steps": [{"txt": "typo"}]}"#);
    let bad_scripts = env
        .keel()
        .arg("eval")
        .arg(&tasks)
        .args(["-s", "oracle", "-s", &format!("scripted:{}", missing.display())])
        .args(["-s", &format!("scripted:{}", invalid.display())])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(bad_scripts.status.code(), Some(2), "{}", stderr(&bad_scripts));
    let message = stderr(&bad_scripts);
    assert!(message.contains(&format!("cannot read script {}", missing.display())), "{message}");
    assert!(message.contains(&format!("invalid script {}", invalid.display())), "{message}");
    assert!(!message.contains(" → "), "no attempt ran: {message}");
    assert!(!out.exists(), "nothing was written");
}

#[test]
fn eval_resume_after_kill_9_finishes_without_rerunning_finished_attempts() {
    let env = Env::new();
    let dataset = env.scratch.path().join("dataset");
    let task = dataset.join("slow");
    for sub in ["environment", "tests", "solution"] {
        std::fs::create_dir_all(task.join(sub)).unwrap();
    }
    std::fs::write(task.join("instruction.md"), "Write ok into /app/answer.txt.\n").unwrap();
    std::fs::write(task.join("task.toml"), "[agent]\ntimeout_sec = 60.0\n").unwrap();
    std::fs::write(task.join("environment/Dockerfile"), "FROM ubuntu\nWORKDIR /app\n").unwrap();
    std::fs::write(task.join("solution/solve.sh"), "sleep 1.5\necho ok > /app/answer.txt\n")
        .unwrap();
    std::fs::write(
        task.join("tests/test.sh"),
        "if [ \"$(cat /app/answer.txt)\" = ok ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
    )
    .unwrap();
    let out = env.scratch.path().join("out");
    let mut child = env
        .keel()
        .arg("eval")
        .arg(&dataset)
        .args(["-s", "oracle", "-n", "4", "-j", "1", "--out"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once one attempt has finished and the next one is running.
    let db_path = out.join("eval.sqlite");
    let deadline = Instant::now() + Duration::from_secs(60);
    let finished_before: Vec<String> = loop {
        assert!(Instant::now() < deadline, "no attempt finished in time");
        std::thread::sleep(Duration::from_millis(100));
        let Ok(db) = rusqlite::Connection::open(&db_path) else { continue };
        let count = |sql: &str| db.query_row(sql, [], |row| row.get::<_, i64>(0)).unwrap_or(0);
        let started = count("SELECT COUNT(*) FROM attempts");
        let done = count("SELECT COUNT(*) FROM results");
        if done >= 1 && started > done {
            let mut statement = db.prepare("SELECT attempt_id FROM results").unwrap();
            let ids = statement.query_map([], |row| row.get(0)).unwrap();
            break ids.collect::<Result<Vec<String>, _>>().unwrap();
        }
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(finished_before.len() < 4, "killed mid-experiment");
    assert!(!out.join("results.jsonl").exists(), "the killed run wrote no results");

    // The interrupted attempt's command died with keel: its solution never finishes.
    std::thread::sleep(Duration::from_millis(2500));
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let interrupted: Vec<(String, i64)> = {
        let mut statement = db
            .prepare(
                "SELECT a.attempt_id, a.repetition FROM attempts a LEFT JOIN results r \
                 ON r.attempt_id = a.attempt_id WHERE r.attempt_id IS NULL",
            )
            .unwrap();
        let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?))).unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    };
    assert_eq!(interrupted.len(), 1, "{interrupted:?}");
    let interrupted_dir = out.join(format!("attempts/slow/oracle/r{:02}-a01", interrupted[0].1));
    assert!(!interrupted_dir.join("workspace/answer.txt").exists(), "nothing outlived keel");
    drop(db);

    let resumed = env.run(&["eval", "resume", out.to_str().unwrap()]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let lines = results(&out);
    assert_eq!(lines.len(), 4, "{lines:?}");
    let ids: Vec<&str> = lines.iter().map(|l| l["attempt_id"].as_str().unwrap()).collect();
    for id in &finished_before {
        assert!(ids.contains(&id.as_str()), "finished attempt {id} still counts");
    }
    assert!(lines.iter().all(|l| l["class"] == "passed"), "{lines:?}");
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let count = |sql: &str| db.query_row(sql, [], |row| row.get::<_, i64>(0)).unwrap();
    // Each cell finished exactly once: finished attempts were not run again; only the
    // interrupted cell got a second attempt.
    assert_eq!(count("SELECT COUNT(*) FROM results"), 4);
    assert_eq!(count("SELECT COUNT(*) FROM attempts"), 5);
    assert_eq!(count("SELECT MAX(ordinal) FROM attempts"), 2);
    let interrupted_line = lines.iter().find(|l| l["repetition"] == interrupted[0].1).unwrap();
    assert_eq!(interrupted_line["attempt"], 2, "{interrupted_line}");
    assert!(stdout(&resumed).contains(&format!("{} finished before", finished_before.len())));
}

/// A hostile dataset's folder names (a newline and a forged progress line, raw escapes)
/// cannot forge a line on stderr, in the exit-2 problem list or in report.md: every name
/// is shown on one line with its controls visible. The neighbour: the tasks still run and
/// pass under oracle, named as they are.
#[test]
fn redteam_eval_task_names_cannot_forge_output_lines_or_write_escapes() {
    let env = Env::new();
    let forged = "keel eval: fake · oracle · #1 → passed (reward 1)";
    let newline_name = format!("a\n{forged}");
    let escape_name = "b\u{1b}[2K\u{1b}]52;c;eA==\u{7}x";
    let hello = repo_root().join("examples/eval/tasks/hello-file");
    let tasks = env.scratch.path().join("tasks");
    copy_dir(&hello, &tasks.join(&newline_name));
    copy_dir(&hello, &tasks.join(escape_name));
    let out = env.scratch.path().join("out");
    let output =
        env.keel().arg("eval").arg(&tasks).args(["-s", "oracle"]).arg("--out").arg(&out).output();
    let output = output.unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(!text.lines().any(|line| line == forged), "a forged line: {text}");
    assert!(!text.contains('\u{1b}'), "raw escape on stderr: {text:?}");
    assert!(text.contains(&format!("keel eval: a⏎{forged} · oracle · #1 → passed")), "{text}");
    assert!(text.contains("keel eval: b\\x1b[2K"), "{text}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(!report.contains('\u{1b}') && !report.contains('\u{7}'), "{report:?}");
    assert!(!report.lines().any(|line| line.starts_with(forged)), "{report}");
    assert!(report.contains("a⏎keel eval: fake"), "{report}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(!html.contains('\u{1b}'), "raw escape in report.html");
    // The problem list of a dataset that cannot start (exit 2) shows names the same way.
    std::fs::remove_file(tasks.join(&newline_name).join("tests/test.sh")).unwrap();
    std::fs::remove_file(tasks.join(escape_name).join("tests/test.sh")).unwrap();
    let out = env.scratch.path().join("out2");
    let output =
        env.keel().arg("eval").arg(&tasks).args(["-s", "oracle"]).arg("--out").arg(&out).output();
    let output = output.unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(!text.lines().any(|line| line.trim_start().starts_with("keel eval: fake")), "{text}");
    assert!(!text.contains('\u{1b}'), "raw escape in the problems: {text:?}");
    assert_eq!(text.matches("tests/test.sh").count(), 2, "{text}");
    assert!(text.contains("task a⏎keel eval: fake"), "{text}");
}
