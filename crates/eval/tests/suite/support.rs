//! Task folders written on the fly, an experiment context in a private KEEL_HOME, and the
//! ATIF schema check.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_eval::{AttemptRecord, EvalContext, ExperimentSpec, Summary};
use tempfile::TempDir;

pub(crate) struct Lab {
    pub(crate) home: TempDir,
    pub(crate) scratch: TempDir,
}

impl Lab {
    pub(crate) fn new() -> Lab {
        Lab { home: tempfile::tempdir().unwrap(), scratch: tempfile::tempdir().unwrap() }
    }

    pub(crate) fn context(&self) -> EvalContext {
        let store = keel_store::SqliteStore::open(self.home.path().join("keel.sqlite")).unwrap();
        EvalContext {
            home: self.home.path().to_path_buf(),
            store: Arc::new(store),
            concurrency: 2,
            on_attempt: None,
        }
    }

    pub(crate) fn dataset(&self) -> PathBuf {
        let path = self.scratch.path().join("dataset");
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    pub(crate) fn out(&self) -> PathBuf {
        self.scratch.path().join("out")
    }

    pub(crate) fn script(&self, name: &str, json: &str) -> String {
        let path = self.scratch.path().join(name);
        std::fs::write(&path, json).unwrap();
        format!("scripted:{}", path.display())
    }

    pub(crate) async fn run(
        &self,
        tasks: &Path,
        subjects: &[&str],
        repetitions: u32,
    ) -> (Summary, Vec<AttemptRecord>) {
        let subjects: Vec<String> = subjects.iter().map(|s| (*s).to_owned()).collect();
        let spec = ExperimentSpec::new(tasks, &subjects, repetitions, self.scratch.path()).unwrap();
        let summary = keel_eval::run(&spec, &self.out(), &self.context()).await.unwrap();
        (summary, results(&self.out()))
    }
}

pub(crate) fn results(out: &Path) -> Vec<AttemptRecord> {
    std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A task folder `dataset/NAME` with a host-mode Dockerfile (`WORKDIR /app`).
pub(crate) struct TaskBuilder {
    pub(crate) dir: PathBuf,
}

impl TaskBuilder {
    pub(crate) fn new(dataset: &Path, name: &str) -> TaskBuilder {
        let dir = dataset.join(name);
        for sub in ["environment", "tests", "solution"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let task = TaskBuilder { dir };
        task.file("instruction.md", "Write `ok` into /app/answer.txt.\n")
            .file(
                "task.toml",
                "version = \"1.0\"\n[verifier]\ntimeout_sec = 20.0\n[agent]\ntimeout_sec = 30.0\n",
            )
            .file("environment/Dockerfile", "FROM ubuntu:24.04\nWORKDIR /app\n")
            .file("solution/solve.sh", "echo ok > /app/answer.txt\n")
            .file(
                "tests/test.sh",
                "if [ \"$(cat /app/answer.txt 2>/dev/null)\" = ok ]; then echo 1; else echo 0; fi \
                 > /logs/verifier/reward.txt\n",
            )
    }

    pub(crate) fn file(self, path: &str, text: &str) -> TaskBuilder {
        let path = self.dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }
}

pub(crate) fn by_task<'a>(
    records: &'a [AttemptRecord],
    task: &str,
    subject_prefix: &str,
) -> Vec<&'a AttemptRecord> {
    records.iter().filter(|r| r.task == task && r.subject.starts_with(subject_prefix)).collect()
}

/// A validator of Harbor's ATIF trajectory schema (committed in crates/eval/schema by
/// scripts/atif-schema).
pub(crate) fn atif_validator() -> jsonschema::Validator {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/atif-trajectory.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

/// Every trajectory the records name validates against Harbor's schema (committed in
/// crates/eval/schema by scripts/atif-schema). Returns how many were checked.
pub(crate) fn check_trajectories(records: &[AttemptRecord]) -> usize {
    let validator = atif_validator();
    let mut checked = 0;
    for record in records {
        let Some(path) = &record.trajectory else { continue };
        let trajectory: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let errors: Vec<String> =
            validator.iter_errors(&trajectory).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{path}: {errors:#?}");
        assert_eq!(trajectory["steps"][0]["step_id"], 1);
        assert_eq!(trajectory["session_id"].as_str(), record.session_id.as_deref());
        checked += 1;
    }
    checked
}
