//! Classes, bad input, resume and the trajectory schema, through `keel_eval::run`.

use std::path::Path;

use keel_eval::{Class, ExperimentSpec};

use super::support::{Lab, TaskBuilder, atif_validator, by_task, check_trajectories, results};

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/eval/tasks")
}

#[tokio::test]
async fn oracle_passes_every_example_task() {
    let lab = Lab::new();
    let (summary, records) = lab.run(&examples(), &["oracle"], 1).await;
    assert_eq!(summary.cells, 4);
    assert_eq!(records.len(), 4);
    for record in &records {
        assert_eq!(record.class, Class::Passed, "{record:?}");
        assert_eq!(record.reward, Some(1.0));
        assert_eq!(record.cost_usd, Some(0.0));
        assert!(record.trajectory.is_none() && record.session_id.is_none());
    }
    let report = std::fs::read_to_string(lab.out().join("report.md")).unwrap();
    assert!(
        report.contains("| hello-file | oracle | 1 | 100.0% | 100.0% (k=1) | 1.000 |"),
        "{report}"
    );
    let html = std::fs::read_to_string(lab.out().join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("<rect"), "a chart: {html}");
    for external in ["<script", "src=", "href=", "<link", "url("] {
        assert!(!html.contains(external), "no external assets ({external})");
    }
    assert_eq!(html.matches("http").count(), 1, "only the SVG namespace names a URL");
}

const PASS: &str = r#"{"steps": [
  {"tool_calls": [{"name": "write_file", "arguments": {"path": "answer.txt", "content": "ok\n"}}], "usage": {"input_tokens": 100, "output_tokens": 10}},
  {"text": "Done.", "expect": {"last_outcomes": ["ok"]}, "usage": {"input_tokens": 150, "output_tokens": 5}}
]}"#;
const FAIL: &str = r#"{"steps": [
  {"tool_calls": [{"name": "write_file", "arguments": {"path": "answer.txt", "content": "no\n"}}]},
  {"text": "Done."}
]}"#;
const SLOW: &str = r#"{"steps": [
  {"tool_calls": [{"name": "write_file", "arguments": {"path": "answer.txt", "content": "ok\n"}}]},
  {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 4"}}]},
  {"text": "Done."}
]}"#;
const CRASH: &str = r#"{"steps": []}"#;

#[tokio::test]
async fn scripted_subjects_that_pass_fail_time_out_and_crash_get_their_classes() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    TaskBuilder::new(&dataset, "answer")
        .file("task.toml", "[verifier]\ntimeout_sec = 20.0\n[agent]\ntimeout_sec = 1.5\n");
    let pass = lab.script("pass.json", PASS);
    let fail = lab.script("fail.json", FAIL);
    let slow = lab.script("slow.json", SLOW);
    let crash = lab.script("crash.json", CRASH);
    let (summary, records) = lab.run(&dataset, &[&pass, &fail, &slow, &crash], 1).await;
    assert_eq!(summary.ran, 4);
    let class_of = |subject: &str| {
        let found = by_task(&records, "answer", subject);
        assert_eq!(found.len(), 1, "{subject}");
        found[0].clone()
    };
    let passed = class_of(&pass);
    assert_eq!((passed.class, passed.reward), (Class::Passed, Some(1.0)), "{passed:?}");
    assert_eq!((passed.input_tokens, passed.output_tokens), (Some(250), Some(15)));
    assert_eq!(passed.cost_usd, None, "the scripted model has no price: unknown, not 0");
    assert_eq!(passed.agent_outcome.as_deref(), Some("completed"));

    let failed = class_of(&fail);
    assert_eq!((failed.class, failed.reward), (Class::Failed, Some(0.0)), "{failed:?}");

    let timed_out = class_of(&slow);
    assert_eq!(timed_out.class, Class::AgentTimeout, "{timed_out:?}");
    assert_eq!(timed_out.reward, Some(1.0), "the verifier still ran and its reward is kept");
    assert!(timed_out.reason.as_deref().unwrap().contains("time budget"), "{timed_out:?}");

    let crashed = class_of(&crash);
    assert_eq!(crashed.class, Class::Failed, "{crashed:?}");
    assert_eq!(crashed.agent_outcome.as_deref(), Some("failed"));
    assert!(crashed.session_id.is_some() && crashed.trajectory.is_some());

    // Every agent attempt that ran a session wrote a trajectory in Harbor's schema.
    assert_eq!(check_trajectories(&records), 4);
    let trajectory: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(passed.trajectory.as_deref().unwrap()).unwrap(),
    )
    .unwrap();
    let sources: Vec<&str> = trajectory["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["user", "agent", "agent"]);
    assert_eq!(trajectory["steps"][1]["tool_calls"][0]["function_name"], "write_file");
    assert_eq!(
        trajectory["steps"][1]["observation"]["results"][0]["source_call_id"],
        trajectory["steps"][1]["tool_calls"][0]["tool_call_id"]
    );
    assert_eq!(trajectory["final_metrics"]["total_prompt_tokens"], 250);
    assert_eq!(trajectory["final_metrics"]["total_cost_usd"], serde_json::Value::Null);
    let report = std::fs::read_to_string(lab.out().join("report.md")).unwrap();
    assert!(report.contains("unknown"), "cost per pass is unknown without a price: {report}");
}

#[tokio::test]
async fn verifier_failures_are_verifier_error_never_zero() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    TaskBuilder::new(&dataset, "crash").file("tests/test.sh", "echo boom >&2; exit 3\n");
    TaskBuilder::new(&dataset, "slow")
        .file("task.toml", "[verifier]\ntimeout_sec = 1.0\n")
        .file("tests/test.sh", "sleep 5; echo 1 > /logs/verifier/reward.txt\n");
    TaskBuilder::new(&dataset, "not-a-number")
        .file("tests/test.sh", "echo abc > /logs/verifier/reward.txt\n");
    TaskBuilder::new(&dataset, "unreadable")
        .file("tests/test.sh", "mkdir /logs/verifier/reward.txt\n");
    TaskBuilder::new(&dataset, "json-threshold")
        .file("task.toml", "[metadata]\npass_threshold = 0.2\n")
        .file("tests/test.sh", "echo '{\"reward\": 0.25}' > /logs/verifier/reward.json\n");
    let (_, records) = lab.run(&dataset, &["oracle"], 1).await;
    let reason_of = |task: &str| {
        let record = by_task(&records, task, "oracle")[0].clone();
        assert_eq!(record.class, Class::VerifierError, "{record:?}");
        assert_eq!(record.reward, None, "{record:?}");
        record.reason.unwrap()
    };
    assert!(reason_of("crash").contains("exit code 3"));
    assert!(reason_of("slow").contains("timed out"));
    assert!(reason_of("not-a-number").contains("not a number"));
    assert!(reason_of("unreadable").contains("cannot be read"));
    let json = by_task(&records, "json-threshold", "oracle")[0];
    assert_eq!((json.class, json.reward), (Class::Passed, Some(0.25)));
    let report = std::fs::read_to_string(lab.out().join("report.md")).unwrap();
    assert!(report.contains("| crash | oracle | 1 | — | — (k=1) | — |"), "not scored: {report}");
}

/// Tasks and subjects are checked before any attempt: every unusable one is named in one
/// usage error and nothing is run or written (no attempt, no `--out` folder). A task whose
/// environment needs Docker is not unusable, only unrunnable here: its attempt is
/// `infra_error` with the reason.
#[tokio::test]
async fn unusable_tasks_and_subjects_are_usage_errors_before_any_attempt() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    let no_toml = TaskBuilder::new(&dataset, "no-toml");
    std::fs::remove_file(no_toml.dir.join("task.toml")).unwrap();
    TaskBuilder::new(&dataset, "bad-type")
        .file("task.toml", "[verifier]\ntimeout_sec = \"soon\"\n");
    TaskBuilder::new(&dataset, "bad-syntax").file("task.toml", "[verifier\ntimeout_sec = 1\n");
    TaskBuilder::new(&dataset, "bad-range").file("task.toml", "[agent]\ntimeout_sec = -5.0\n");
    let no_tests = TaskBuilder::new(&dataset, "no-tests");
    std::fs::remove_file(no_tests.dir.join("tests/test.sh")).unwrap();
    let no_solution = TaskBuilder::new(&dataset, "no-solution");
    std::fs::remove_file(no_solution.dir.join("solution/solve.sh")).unwrap();
    TaskBuilder::new(&dataset, "fine");
    let missing = format!("scripted:{}", lab.scratch.path().join("no-such-script.json").display());
    let invalid = lab.script("invalid.json", r#"{"steps": [{"txt": "typo"}]}"#);
    let good = lab.script("pass.json", PASS);
    let subjects: Vec<String> =
        ["oracle", &missing, &invalid, &good].iter().map(|s| (*s).to_owned()).collect();
    let spec = ExperimentSpec::new(&dataset, &subjects, 1, lab.scratch.path()).unwrap();
    let error = keel_eval::run(&spec, &lab.out(), &lab.context()).await.unwrap_err();
    let keel_eval::Error::Usage(message) = &error else { panic!("not a usage error: {error:?}") };
    for named in [
        "task no-toml",
        "task.toml is missing",
        "task bad-type",
        "task.toml is malformed",
        "task bad-syntax",
        "task bad-range",
        "agent.timeout_sec must be a positive number",
        "task no-tests",
        "tests/test.sh is missing",
        "task no-solution",
        "solution/solve.sh is missing",
        &format!("subject {missing}: cannot read script"),
        &format!("subject {invalid}: invalid script"),
    ] {
        assert!(message.contains(named), "{named:?} not in {message}");
    }
    assert!(!message.contains("task fine") && !message.contains(&good), "{message}");
    assert!(!lab.out().exists(), "nothing was written before the check");

    // The neighbour: without oracle, a task with no solution is fine, and the good tasks
    // and subject run; a Docker-only environment is an attempt's infra_error.
    for broken in ["no-toml", "bad-type", "bad-syntax", "bad-range", "no-tests"] {
        std::fs::remove_dir_all(dataset.join(broken)).unwrap();
    }
    TaskBuilder::new(&dataset, "needs-docker")
        .file("environment/Dockerfile", "FROM ubuntu:24.04\nRUN apt-get install -y git\n");
    let (summary, records) = lab.run(&dataset, &[&good], 1).await;
    assert_eq!(summary.cells, 3);
    assert_eq!(by_task(&records, "fine", &good)[0].class, Class::Passed);
    assert_eq!(by_task(&records, "no-solution", &good)[0].class, Class::Passed);
    let docker = by_task(&records, "needs-docker", &good)[0].clone();
    assert_eq!((docker.class, docker.reward), (Class::InfraError, None), "{docker:?}");
    let reason = docker.reason.unwrap();
    assert!(
        reason.contains("RUN needs Docker") && reason.contains("Docker is not available"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_second_run_runs_nothing_and_records_are_immutable() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    TaskBuilder::new(&dataset, "one");
    let (first, records) = lab.run(&dataset, &["oracle"], 3).await;
    assert_eq!((first.cells, first.ran), (3, 3));
    let (second, again) = lab.run(&dataset, &["oracle"], 3).await;
    assert_eq!((second.already_finished, second.ran), (3, 0));
    assert_eq!(records, again, "the earliest attempts still count");
    // A different experiment in the same folder is refused.
    let spec =
        keel_eval::ExperimentSpec::new(&dataset, &["oracle".to_owned()], 2, lab.scratch.path())
            .unwrap();
    let error = keel_eval::run(&spec, &lab.out(), &lab.context()).await.unwrap_err();
    assert!(error.to_string().contains("holds a different experiment"), "{error}");
    // The ledger refuses to change or drop a record.
    let db = rusqlite::Connection::open(lab.out().join("eval.sqlite")).unwrap();
    for statement in [
        "UPDATE results SET class = 'failed'",
        "DELETE FROM results",
        "DELETE FROM attempts",
        "DELETE FROM cells",
        "UPDATE cells SET repetition = 9",
        "UPDATE experiment SET spec = '{}'",
    ] {
        let error = db.execute(statement, []).unwrap_err();
        assert!(error.to_string().contains("immutable"), "{statement}: {error}");
    }
    // Resume finds nothing missing either.
    let resumed = keel_eval::resume(&lab.out(), &lab.context()).await.unwrap();
    assert_eq!(resumed.ran, 0);
    assert_eq!(results(&lab.out()), records);
}

#[test]
fn the_atif_schema_rejects_what_harbor_rejects() {
    // The schema check is not vacuous: a wrong source, a missing agent, no steps and a
    // tool call without its id each fail it.
    let validator = atif_validator();
    let good = serde_json::json!({
        "schema_version": "ATIF-v1.6",
        "agent": {"name": "keel", "version": "0.1.0"},
        "steps": [{"step_id": 1, "source": "user", "message": "hi"}],
    });
    assert!(validator.is_valid(&good));
    let mut bad_source = good.clone();
    bad_source["steps"][0]["source"] = "robot".into();
    let mut no_agent = good.clone();
    no_agent.as_object_mut().unwrap().remove("agent");
    let mut no_steps = good.clone();
    no_steps["steps"] = serde_json::json!([]);
    let mut bad_call = good.clone();
    bad_call["steps"][0]["tool_calls"] =
        serde_json::json!([{"function_name": "bash", "arguments": {}}]);
    for bad in [bad_source, no_agent, no_steps, bad_call] {
        assert!(!validator.is_valid(&bad), "{bad}");
    }
}

#[tokio::test]
async fn cost_per_pass_is_shown_when_every_attempt_is_priced() {
    let lab = Lab::new();
    let dataset = lab.dataset();
    TaskBuilder::new(&dataset, "answer");
    let pass = lab.script("priced.json", PASS);
    // $1 per million input tokens, $2 per million output: 250 in + 15 out = $0.00028.
    std::fs::write(
        lab.home.path().join("prices.toml"),
        format!("[\"{pass}\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n"),
    )
    .unwrap();
    let (_, records) = lab.run(&dataset, &[&pass, "oracle"], 2).await;
    let priced = by_task(&records, "answer", "scripted:");
    assert_eq!(priced.len(), 2);
    for record in priced {
        assert_eq!(record.class, Class::Passed, "{record:?}");
        assert!((record.cost_usd.unwrap() - 0.00028).abs() < 1e-12, "{record:?}");
    }
    let rows = keel_eval::report::rows(&records.iter().collect::<Vec<_>>(), 2);
    let row = rows.iter().find(|row| row.subject == pass).unwrap();
    assert_eq!((row.passes, row.pass_at_1, row.pass_at_k, row.k), (2, Some(1.0), Some(1.0), 2));
    assert!((row.cost_per_pass_usd.unwrap() - 0.00028).abs() < 1e-12, "{row:?}");
    let report = std::fs::read_to_string(lab.out().join("report.md")).unwrap();
    assert!(report.contains("| $0.0003 |"), "{report}");
}
