//! An experiment: its spec, its cells, and running what is missing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt as _;
use keel_contracts::Store;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::attempt::{self, AttemptContext, AttemptRecord, Class};
use crate::error::{Error, Result};
use crate::ledger::{Cell, EvalLedger};
use crate::task::{self, Task, TaskError};

/// What an experiment is: tasks × subjects × repetitions. Stored in the eval ledger, so
/// `keel eval resume DIR` needs nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExperimentSpec {
    /// A task folder or a dataset (a folder of task folders), absolute.
    pub tasks: PathBuf,
    /// The subjects: `oracle` or model specs (`scripted:PATH` with an absolute path).
    pub subjects: Vec<String>,
    /// Repetitions per task and subject (at least 1).
    pub repetitions: u32,
}

impl ExperimentSpec {
    /// A spec from the command line: `tasks` and scripted paths made absolute against
    /// `cwd`, subjects checked.
    ///
    /// # Errors
    ///
    /// [`Error::Usage`] for no subjects, zero repetitions, a subject that is neither
    /// `oracle` nor `PROVIDER:MODEL`, or a tasks path that does not exist.
    pub fn new(
        tasks: &Path,
        subjects: &[String],
        repetitions: u32,
        cwd: &Path,
    ) -> Result<ExperimentSpec> {
        if subjects.is_empty() {
            return Err(Error::Usage("no subject: give -s oracle or -s PROVIDER:MODEL".into()));
        }
        if repetitions == 0 {
            return Err(Error::Usage("-n must be at least 1".into()));
        }
        let tasks = cwd.join(tasks);
        let tasks = tasks
            .canonicalize()
            .map_err(|error| Error::Usage(format!("tasks {}: {error}", tasks.display())))?;
        let mut checked = Vec::new();
        for subject in subjects {
            let subject = subject.trim();
            let subject = match subject.strip_prefix("scripted:") {
                Some(path) if Path::new(path).is_relative() => {
                    format!("scripted:{}", cwd.join(path).display())
                }
                _ => subject.to_owned(),
            };
            if subject != "oracle"
                && !subject.split_once(':').is_some_and(|(p, m)| !p.is_empty() && !m.is_empty())
            {
                return Err(Error::Usage(format!(
                    "subject '{subject}' is neither oracle nor a model spec (PROVIDER:MODEL)"
                )));
            }
            if checked.contains(&subject) {
                return Err(Error::Usage(format!("subject '{subject}' is given twice")));
            }
            checked.push(subject);
        }
        Ok(ExperimentSpec { tasks, subjects: checked, repetitions })
    }
}

/// Who attempts a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// Runs the task's `solution/solve.sh`.
    Oracle,
    /// A keel session with this model spec.
    Model(String),
}

impl Subject {
    /// The subject for a spec string.
    pub fn parse(text: &str) -> Subject {
        if text == "oracle" { Subject::Oracle } else { Subject::Model(text.to_owned()) }
    }
}

/// A callback for each finished attempt.
pub type OnAttempt = Arc<dyn Fn(&AttemptRecord) + Send + Sync>;

/// What running an experiment needs beyond its spec.
#[derive(Clone)]
pub struct EvalContext {
    /// KEEL_HOME (config, prices, trust).
    pub home: PathBuf,
    /// The keel ledger agent sessions are recorded in.
    pub store: Arc<dyn Store>,
    /// Attempts run at once (at least 1).
    pub concurrency: usize,
    /// Called with each finished attempt (progress for the user).
    pub on_attempt: Option<OnAttempt>,
}

impl std::fmt::Debug for EvalContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvalContext")
            .field("home", &self.home)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// What a run of the experiment did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Cells of the experiment.
    pub cells: usize,
    /// Cells already finished before this run (not run again).
    pub already_finished: usize,
    /// Attempts this run made.
    pub ran: usize,
    /// Attempts in the ledger that never finished (keel was killed during them).
    pub interrupted: usize,
    /// Winning attempts per class.
    pub classes: std::collections::BTreeMap<Class, usize>,
    /// `results.jsonl`.
    pub results: PathBuf,
}

/// Starts the experiment `spec` in `out`, or continues it when `out` already holds it.
///
/// # Errors
///
/// [`Error::Usage`] when `out` holds a different experiment, the tasks cannot be listed,
/// or a task or subject is unusable (see [`checked`]), before any attempt runs;
/// [`Error::Io`] / [`Error::Ledger`] when `out` cannot be written.
///
/// # Cancel safety
///
/// Dropping it leaves started attempts without results; [`resume`] runs their cells again.
pub async fn run(spec: &ExperimentSpec, out: &Path, context: &EvalContext) -> Result<Summary> {
    // Before anything is written: a broken task or subject is the user's to fix first.
    let tasks = checked(spec, out, context)?;
    std::fs::create_dir_all(out).map_err(|error| Error::io(out, error))?;
    let ledger = EvalLedger::open(out)?;
    let json = serde_json::to_string(spec).map_err(|error| Error::Usage(error.to_string()))?;
    match ledger.spec()? {
        Some(stored) => {
            let stored: ExperimentSpec = parse_spec(&ledger, &stored)?;
            if &stored != spec {
                return Err(Error::Usage(format!(
                    "{} holds a different experiment (tasks {}, subjects {}, -n {}); use \
                     `keel eval resume {}` or another --out",
                    out.display(),
                    stored.tasks.display(),
                    stored.subjects.join(", "),
                    stored.repetitions,
                    out.display()
                )));
            }
        }
        None => ledger.record_experiment(&uuid::Uuid::now_v7().to_string(), &json)?,
    }
    execute(spec, tasks, out, &ledger, context).await
}

/// Finishes the experiment in `out`: runs only the cells without a finished attempt.
///
/// # Errors
///
/// [`Error::Usage`] when `out` holds no experiment; otherwise as [`run`].
///
/// # Cancel safety
///
/// As [`run`].
pub async fn resume(out: &Path, context: &EvalContext) -> Result<Summary> {
    if !out.join("eval.sqlite").is_file() {
        return Err(Error::Usage(format!(
            "{} holds no experiment (no eval.sqlite)",
            out.display()
        )));
    }
    let ledger = EvalLedger::open(out)?;
    let Some(stored) = ledger.spec()? else {
        return Err(Error::Usage(format!("{} holds no experiment", out.display())));
    };
    let spec = parse_spec(&ledger, &stored)?;
    let tasks = checked(&spec, out, context)?;
    execute(&spec, tasks, out, &ledger, context).await
}

fn parse_spec(ledger: &EvalLedger, json: &str) -> Result<ExperimentSpec> {
    serde_json::from_str(json).map_err(|error| Error::Record {
        path: ledger.path().to_path_buf(),
        what: "experiment".into(),
        reason: error.to_string(),
    })
}

/// Every task of `spec`, loaded, once every task and subject has been checked: a task
/// folder that does not load (`task.toml`, `instruction.md`, their values), whose
/// `tests/` or `environment/` (or `solution/` with `oracle`) is a symbolic link, or has no
/// `tests/test.sh` (nor `solution/solve.sh` when `oracle` is a subject), a dataset entry
/// that is a symbolic link to a folder, and a subject no
/// agent can be built for ([`attempt::check_subject`]), are found before any attempt runs.
///
/// # Errors
///
/// [`Error::Usage`] naming every unusable task and subject at once, or when the tasks
/// cannot be listed or there are none.
fn checked(
    spec: &ExperimentSpec,
    out: &Path,
    context: &EvalContext,
) -> Result<Vec<(String, Task)>> {
    let folders = task::task_folders(&spec.tasks)
        .map_err(|error| Error::Usage(format!("tasks {}: {error}", spec.tasks.display())))?;
    // An output folder inside the dataset is not one of its tasks.
    let out_canonical = out.canonicalize().ok();
    let folders: Vec<(String, PathBuf)> =
        folders.into_iter().filter(|(_, dir)| dir.canonicalize().ok() != out_canonical).collect();
    if folders.is_empty() {
        return Err(Error::Usage(format!("{} holds no task folders", spec.tasks.display())));
    }
    let oracle = spec.subjects.iter().any(|subject| subject == "oracle");
    let mut problems = Vec::new();
    let mut tasks = Vec::new();
    for (name, dir) in &folders {
        let loaded = task::load(name, dir).and_then(|task| {
            // `tests/test.sh` through a linked `tests/` would pass the file check below.
            let mut folders = vec!["tests", "environment"];
            if oracle {
                folders.push("solution");
            }
            let is_link = |folder: &&str| {
                dir.join(folder).symlink_metadata().is_ok_and(|meta| meta.is_symlink())
            };
            if let Some(folder) = folders.into_iter().find(is_link) {
                return Err(TaskError::Linked { folder: folder.to_owned() });
            }
            let mut needed = vec!["tests/test.sh"];
            if oracle {
                needed.push("solution/solve.sh");
            }
            match needed.into_iter().find(|file| !is_regular_file(&dir.join(file))) {
                Some(file) => Err(TaskError::Missing { file: file.to_owned() }),
                None => Ok(task),
            }
        });
        match loaded {
            Ok(task) => tasks.push((name.clone(), task)),
            // A folder name is the dataset's (a hostile repository's): one line each, so no
            // name can forge a problem or a progress line of its own.
            Err(error) => problems.push(format!(
                "task {} ({}): {}",
                shown(name),
                shown(&dir.display().to_string()),
                shown(&error.to_string())
            )),
        }
    }
    let attempt_context =
        AttemptContext { home: context.home.clone(), store: context.store.clone() };
    for subject in &spec.subjects {
        if let Subject::Model(model) = Subject::parse(subject)
            && let Err(reason) = attempt::check_subject(&attempt_context, &model)
        {
            problems.push(format!("subject {}: {}", shown(subject), shown(&reason)));
        }
    }
    if problems.is_empty() {
        Ok(tasks)
    } else {
        Err(Error::Usage(format!(
            "the experiment cannot start; nothing was run:\n  {}",
            problems.join("\n  ")
        )))
    }
}

/// Whether `path` is a regular file itself (not through a symbolic link).
fn is_regular_file(path: &Path) -> bool {
    path.symlink_metadata().is_ok_and(|meta| meta.is_file())
}

async fn execute(
    spec: &ExperimentSpec,
    tasks: Vec<(String, Task)>,
    out: &Path,
    ledger: &EvalLedger,
    context: &EvalContext,
) -> Result<Summary> {
    let mut cells = Vec::new();
    for (name, _) in &tasks {
        for subject in &spec.subjects {
            for repetition in 1..=spec.repetitions {
                cells.push(Cell { task: name.clone(), subject: subject.clone(), repetition });
            }
        }
    }
    ledger.record_cells(&cells)?;
    let before = ledger.attempts()?;
    let finished = crate::ledger::winners(&before);
    let missing: Vec<&Cell> = cells.iter().filter(|cell| !finished.contains_key(*cell)).collect();
    let already_finished = cells.len() - missing.len();
    drop(finished);

    let attempt_context =
        AttemptContext { home: context.home.clone(), store: context.store.clone() };
    let results: Vec<Result<()>> = futures::stream::iter(missing.iter().map(|cell| {
        let task = tasks.iter().find(|(name, _)| name == &cell.task).map(|(_, task)| task);
        let attempt_context = &attempt_context;
        async move {
            let Some(task) = task else { return Ok(()) };
            let attempt_id = uuid::Uuid::now_v7().to_string();
            let ordinal = ledger.start_attempt(&attempt_id, cell)?;
            let dir = out
                .join("attempts")
                .join(slug(&cell.task))
                .join(slug(&cell.subject))
                .join(format!("r{:02}-a{:02}", cell.repetition, ordinal));
            std::fs::create_dir_all(&dir).map_err(|error| Error::io(&dir, error))?;
            let subject = crate::Subject::parse(&cell.subject);
            let record =
                attempt::run(attempt_context, task, &subject, cell, &attempt_id, ordinal, &dir)
                    .await;
            ledger.finish_attempt(&record)?;
            if let Some(on_attempt) = &context.on_attempt {
                on_attempt(&record);
            }
            Ok(())
        }
    }))
    .buffer_unordered(context.concurrency.max(1))
    .collect()
    .await;
    let ran = results.len();
    results.into_iter().collect::<Result<Vec<()>>>()?;

    let after = ledger.attempts()?;
    let winners = crate::ledger::winners(&after);
    let interrupted = after.iter().filter(|attempt| attempt.result.is_none()).count();
    let records: Vec<&AttemptRecord> =
        cells.iter().filter_map(|cell| winners.get(cell).copied()).collect();
    let missing_now = cells.len() - records.len();
    let rows = crate::report::rows(&records, spec.repetitions);
    let results_path = out.join("results.jsonl");
    write_atomic(&results_path, &crate::report::results_jsonl(&records))?;
    write_atomic(
        &out.join("report.md"),
        &crate::report::markdown(&rows, interrupted, missing_now),
    )?;
    write_atomic(&out.join("report.html"), &crate::report::html(&rows, interrupted, missing_now))?;
    let mut classes = std::collections::BTreeMap::new();
    for record in &records {
        *classes.entry(record.class).or_insert(0) += 1;
    }
    Ok(Summary {
        cells: cells.len(),
        already_finished,
        ran,
        interrupted,
        classes,
        results: results_path,
    })
}

/// Writes `text` to `path` through a temporary file and a rename, so a reader (or a kill)
/// never sees half a file.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).map_err(|error| Error::io(&temporary, error))?;
    std::fs::rename(&temporary, path).map_err(|error| Error::io(path, error))
}

/// A name safe as one path component: letters, digits, `.`, `_`, `-` kept, the rest `_`;
/// a name that had to change (or is long, or dots only) gets a digest of the original, so
/// two names never share a folder.
pub fn slug(name: &str) -> String {
    let mut clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    let dots_only = clean.chars().all(|c| c == '.');
    if clean == name && !dots_only && !clean.is_empty() && clean.len() <= 64 {
        return clean;
    }
    clean = clean
        .trim_start_matches('.')
        .chars()
        .rev()
        .take(48)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let digest = hex::encode(&sha2::Sha256::digest(name.as_bytes())[..4]);
    if clean.is_empty() { digest } else { format!("{clean}-{digest}") }
}

/// `text` (a task or subject name, a path, a reason) as one line with every control
/// character visible, as `keel log` shows outside text: newlines as `⏎`, escapes as `\x1b`.
pub(crate) fn shown(text: &str) -> String {
    keel_host::terminal::one_line(text, usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_one_safe_component() {
        assert_eq!(slug("oracle"), "oracle");
        assert_eq!(slug("hello-world"), "hello-world");
        for hostile in ["..", ".", "../../etc", "a/b", "", "x\0y"] {
            let slug = slug(hostile);
            assert!(
                !slug.is_empty() && !slug.contains('/') && !slug.starts_with('.'),
                "{hostile:?} → {slug}"
            );
        }
        assert_ne!(slug("a/b"), slug("a_b"));
    }
}
