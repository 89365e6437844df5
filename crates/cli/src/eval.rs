//! `keel eval` and `keel eval resume DIR`: parse, call keel-eval (which builds each agent
//! through the composition root), print progress on stderr and the summary on stdout.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use keel_eval::{AttemptRecord, EvalContext, ExperimentSpec};
use keel_host::error::usage;
use keel_host::root::{self, open_store};

use crate::args::EvalCommand;
use crate::exit;

pub(crate) async fn command(
    command: Option<EvalCommand>,
    tasks: Option<PathBuf>,
    subjects: &[String],
    repetitions: u32,
    concurrency: usize,
    out: Option<PathBuf>,
) -> anyhow::Result<u8> {
    let (home, store) = open_store().await?;
    // Agent sessions of an experiment killed earlier may have open runs: close them.
    root::repair(store.clone()).await;
    let on_attempt: Arc<dyn Fn(&AttemptRecord) + Send + Sync> = Arc::new(|record| {
        let reward =
            record.reward.map_or_else(|| "no reward".to_owned(), |r| format!("reward {r}"));
        eprintln!(
            "keel eval: {} · {} · #{} → {} ({reward}){}",
            crate::terminal::one_line(&record.task, usize::MAX),
            crate::terminal::one_line(&record.subject, usize::MAX),
            record.repetition,
            record.class.as_str(),
            record
                .reason
                .as_deref()
                .map(|reason| format!(": {}", crate::terminal::one_line(reason, usize::MAX)))
                .unwrap_or_default()
        );
    });
    let context = |concurrency: usize| EvalContext {
        home: home.clone(),
        store: store.clone(),
        concurrency: concurrency.max(1),
        on_attempt: Some(on_attempt.clone()),
    };
    // Paths in results.jsonl (trajectories) are made from DIR: absolute, so they hold from
    // any folder.
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let (summary, out) = match command {
        Some(EvalCommand::Resume { dir, concurrency }) => {
            let dir = cwd.join(dir);
            (keel_eval::resume(&dir, &context(concurrency)).await, dir)
        }
        None => {
            let (Some(tasks), Some(out)) = (tasks, out) else {
                return Err(usage("keel eval needs DATASET_OR_TASK, -s SUBJECT and --out DIR"));
            };
            let out = cwd.join(out);
            let spec = ExperimentSpec::new(&tasks, subjects, repetitions, &cwd)
                .map_err(|error| usage(error.to_string()))?;
            (keel_eval::run(&spec, &out, &context(concurrency)).await, out)
        }
    };
    let summary = summary.map_err(|error| match error {
        keel_eval::Error::Usage(message) => usage(message),
        other => anyhow::Error::new(other),
    })?;
    let classes = summary
        .classes
        .iter()
        .map(|(class, count)| format!("{} {count}", class.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    outln!(
        "{} cells: {} finished before, {} run now ({classes}); {} interrupted attempt(s) on record",
        summary.cells,
        summary.already_finished,
        summary.ran,
        summary.interrupted
    );
    outln!("results: {}", summary.results.display());
    outln!("report: {}", out.join("report.md").display());
    Ok(exit::COMPLETED)
}
