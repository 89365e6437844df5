//! One attempt: a fresh workspace, the subject (an agent session, or `oracle` running
//! `solution/solve.sh`), then the verifier (`tests/test.sh`) and its reward, classified.
//!
//! The attempt's folder (`DIR/attempts/TASK/SUBJECT/rRR-aNN/`) holds `workspace/`, copies
//! of `tests/` (and `solution/` for the oracle), `logs/agent/` and `logs/verifier/`, the
//! agent's `trajectory.json` and `result.json`. Commands run in the managed sandbox with
//! the workspace at the task's `WORKDIR`, the tests at `/tests` and the logs at `/logs`
//! ([`keel_sandbox::CommandSpec::map_dir`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_contracts::{ApprovalMode, SandboxMode, Store};
use keel_host::root::{self, Assembly, RunSettings};
use keel_kernel::{Cancellation, NoopObserver, SessionConfig, TurnOutcome};
use keel_sandbox::{CommandSpec, SandboxError, Termination};
use serde::{Deserialize, Serialize};

use crate::environment::{self, Plan};
use crate::experiment::Subject;
use crate::ledger::Cell;
use crate::task::Task;

/// The largest reward file read, in bytes.
pub const MAX_REWARD_BYTES: u64 = 64 * 1024;
/// How long past its time budget an agent run may take before it is cancelled.
pub const AGENT_GRACE: Duration = Duration::from_secs(10);

/// How an attempt ended (DESIGN.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// The reward reached the task's threshold (1 unless `metadata.pass_threshold`).
    Passed,
    /// The verifier ran and the reward is below the threshold.
    Failed,
    /// The agent ran out of its time budget; the verifier still ran and its reward is
    /// kept, but it is not a pass.
    AgentTimeout,
    /// The attempt could not be carried out (the task folder, the environment, the
    /// sandbox, the subject's setup): not scored.
    InfraError,
    /// The verifier gave no usable reward (no file, not a number, a crash, a timeout):
    /// not scored.
    VerifierError,
}

impl Class {
    /// The class's name in `results.jsonl`.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Passed => "passed",
            Class::Failed => "failed",
            Class::AgentTimeout => "agent_timeout",
            Class::InfraError => "infra_error",
            Class::VerifierError => "verifier_error",
        }
    }

    /// Whether the attempt is a measurement of the subject (scored), rather than a failure
    /// of the infrastructure or the verifier.
    pub fn is_scored(self) -> bool {
        match self {
            Class::Passed | Class::Failed | Class::AgentTimeout => true,
            Class::InfraError | Class::VerifierError => false,
        }
    }
}

/// One finished attempt: a line of `results.jsonl` (the contract's fields first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The task's name.
    pub task: String,
    /// The subject as given.
    pub subject: String,
    /// The repetition, from 1.
    pub repetition: u32,
    /// The class.
    pub class: Class,
    /// The verifier's reward; `null` for `infra_error` and `verifier_error`.
    pub reward: Option<f64>,
    /// Input tokens of the agent's session; `null` when unknown (no session ran).
    pub input_tokens: Option<u64>,
    /// Output tokens of the agent's session; `null` when unknown.
    pub output_tokens: Option<u64>,
    /// Cost in USD; `null` when unknown (a model without a price, or no session).
    pub cost_usd: Option<f64>,
    /// Wall-clock time of the whole attempt, in milliseconds.
    pub duration_ms: u64,
    /// The agent's keel session (`keel log SESSION`); `null` for the oracle.
    pub session_id: Option<String>,
    /// Path of the attempt's `trajectory.json`; `null` when no agent session ran.
    pub trajectory: Option<String>,
    /// The attempt's id.
    pub attempt_id: String,
    /// The attempt's ordinal within its cell (1 for the first).
    pub attempt: u32,
    /// How the agent's run ended (`completed`, `failed`, `suspended`, `timed_out`, ...).
    pub agent_outcome: Option<String>,
    /// Why, for every class but `passed` (and for an agent that did not complete).
    pub reason: Option<String>,
}

/// What an attempt needs from the experiment.
#[derive(Debug, Clone)]
pub struct AttemptContext {
    /// KEEL_HOME: the user's config, prices and trust records.
    pub home: PathBuf,
    /// The keel ledger the agent sessions are recorded in.
    pub store: Arc<dyn Store>,
}

/// What the agent phase produced.
#[derive(Debug, Default)]
struct AgentPhase {
    timed_out: bool,
    outcome: Option<String>,
    reason: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cost_usd: Option<f64>,
    session_id: Option<String>,
    trajectory: Option<String>,
}

/// Runs one attempt of `cell` in `dir` (created here) and returns its record. Never
/// fails: what goes wrong is the record's class.
///
/// # Cancel safety
///
/// Not cancel safe: dropping it kills any running command, but may leave the agent's
/// session with an open run (closed by the next keel that starts) and no record.
pub async fn run(
    context: &AttemptContext,
    task: &Task,
    subject: &Subject,
    cell: &Cell,
    attempt_id: &str,
    ordinal: u32,
    dir: &Path,
) -> AttemptRecord {
    let started = std::time::Instant::now();
    let mut record = AttemptRecord {
        task: cell.task.clone(),
        subject: cell.subject.clone(),
        repetition: cell.repetition,
        class: Class::InfraError,
        reward: None,
        input_tokens: None,
        output_tokens: None,
        cost_usd: None,
        duration_ms: 0,
        session_id: None,
        trajectory: None,
        attempt_id: attempt_id.to_owned(),
        attempt: ordinal,
        agent_outcome: None,
        reason: None,
    };
    match attempt(context, task, subject, dir).await {
        Ok((class, reward, agent, reason)) => {
            record.class = class;
            record.reward = reward;
            record.input_tokens = agent.input_tokens;
            record.output_tokens = agent.output_tokens;
            record.cost_usd = agent.cost_usd;
            record.session_id = agent.session_id;
            record.trajectory = agent.trajectory;
            record.agent_outcome = agent.outcome;
            record.reason = reason.or(agent.reason);
        }
        Err(Failure { class, reason }) => {
            record.class = class;
            record.reason = Some(reason);
        }
    }
    record.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    if let Ok(json) = serde_json::to_vec_pretty(&record) {
        let _ = std::fs::write(dir.join("result.json"), json);
    }
    record
}

/// An attempt that could not be scored.
#[derive(Debug)]
struct Failure {
    class: Class,
    reason: String,
}

fn infra(reason: impl Into<String>) -> Failure {
    Failure { class: Class::InfraError, reason: reason.into() }
}

type Outcome = (Class, Option<f64>, AgentPhase, Option<String>);

async fn attempt(
    context: &AttemptContext,
    task: &Task,
    subject: &Subject,
    dir: &Path,
) -> Result<Outcome, Failure> {
    let agent_timeout = task.config.agent_timeout().map_err(|e| infra(e.to_string()))?;
    let verifier_timeout = task.config.verifier_timeout().map_err(|e| infra(e.to_string()))?;
    let threshold = task.config.pass_threshold().map_err(|e| infra(e.to_string()))?;
    let Plan::Host { workdir, copies } =
        environment::plan(&task.dir, task.config.environment.docker_image.as_deref())
    else {
        let Plan::NeedsDocker { reason } =
            environment::plan(&task.dir, task.config.environment.docker_image.as_deref())
        else {
            return Err(infra("the environment cannot be planned"));
        };
        return Err(infra(if environment::docker_available().await {
            format!("{reason}; Docker environments are not supported by keel eval yet")
        } else {
            format!("{reason}, and Docker is not available (no docker daemon answers)")
        }));
    };

    let workspace = dir.join("workspace");
    let tests = dir.join("tests");
    let logs = dir.join("logs");
    for folder in [&workspace, &tests, &logs.join("agent"), &logs.join("verifier")] {
        std::fs::create_dir_all(folder)
            .map_err(|error| infra(format!("{}: {error}", folder.display())))?;
    }
    environment::build(&task.dir.join("environment"), &copies, &workspace)
        .map_err(|reason| infra(format!("environment: {reason}")))?;
    let test_script = task.dir.join("tests").join("test.sh");
    if !test_script.symlink_metadata().is_ok_and(|m| m.is_file()) {
        return Err(infra("tests/test.sh is missing (or not a regular file)"));
    }
    environment::copy_tree(&task.dir.join("tests"), &tests)
        .map_err(|reason| infra(format!("tests: {reason}")))?;
    let workspace = workspace
        .canonicalize()
        .map_err(|error| infra(format!("{}: {error}", workspace.display())))?;

    let mounts =
        Mounts { workspace: workspace.clone(), workdir: workdir.clone(), logs: logs.clone() };
    let agent = match subject {
        Subject::Oracle => oracle(task, dir, &mounts, agent_timeout).await?,
        Subject::Model(spec) => agent(context, task, spec, dir, &mounts, agent_timeout).await?,
    };

    let reward = verify(task, &tests, &mounts, verifier_timeout).await;
    let reward = match reward {
        Ok(reward) => reward,
        Err(failure) => return Ok((failure.class, None, agent, Some(failure.reason))),
    };
    let class = if agent.timed_out {
        Class::AgentTimeout
    } else if reward >= threshold {
        Class::Passed
    } else {
        Class::Failed
    };
    let reason = match class {
        Class::AgentTimeout => Some(format!(
            "the agent ran out of its time budget ({} s); the verifier still ran: reward {reward}",
            agent_timeout.as_secs_f64()
        )),
        Class::Failed => Some(format!("reward {reward} is below the pass threshold {threshold}")),
        Class::Passed | Class::InfraError | Class::VerifierError => None,
    };
    Ok((class, Some(reward), agent, reason))
}

/// Where a command of the attempt sees what.
#[derive(Debug)]
struct Mounts {
    workspace: PathBuf,
    workdir: Option<PathBuf>,
    logs: PathBuf,
}

impl Mounts {
    fn spec(&self, script: &str, timeout: Duration) -> CommandSpec {
        let mut spec = CommandSpec::new("bash", &self.workspace, timeout)
            .arg(script)
            .workspace(&self.workspace)
            .allow_write(&self.logs)
            .map_dir(&self.logs, "/logs")
            .output_cap_bytes(256 * 1024);
        if let Some(workdir) = &self.workdir {
            spec = spec.map_dir(&self.workspace, workdir);
        }
        spec
    }
}

fn sandbox_failure(what: &str, error: &SandboxError) -> Failure {
    infra(format!("{what} could not run in the managed sandbox: {error}"))
}

/// The oracle: `bash /solution/solve.sh` in the workspace.
async fn oracle(
    task: &Task,
    dir: &Path,
    mounts: &Mounts,
    timeout: Duration,
) -> Result<AgentPhase, Failure> {
    let solution = dir.join("solution");
    let source = task.dir.join("solution");
    if !source.join("solve.sh").symlink_metadata().is_ok_and(|m| m.is_file()) {
        return Err(infra("solution/solve.sh is missing (or not a regular file)"));
    }
    environment::copy_tree(&source, &solution)
        .map_err(|reason| infra(format!("solution: {reason}")))?;
    let mut spec = mounts
        .spec("/solution/solve.sh", timeout)
        .allow_read(&solution)
        .map_dir(&solution, "/solution");
    for (key, value) in task.config.environment.env.iter().chain(&task.config.solution.env) {
        spec = spec.env(key, value);
    }
    let output = keel_sandbox::run(&spec, SandboxMode::Managed)
        .await
        .map_err(|error| sandbox_failure("solution/solve.sh", &error))?;
    let log = format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}\n",
        output.termination, output.stdout.text, output.stderr.text
    );
    write_log(&mounts.logs.join("agent"), "oracle.txt", log.as_bytes());
    let timed_out = matches!(output.termination, Termination::TimedOut { .. });
    Ok(AgentPhase {
        timed_out,
        outcome: Some(if timed_out { "timed_out".into() } else { output.termination.to_string() }),
        input_tokens: Some(0),
        output_tokens: Some(0),
        cost_usd: Some(0.0),
        ..AgentPhase::default()
    })
}

/// The settings an agent attempt runs with: `model`, the managed sandbox, consent inside
/// it, and `timeout` as its time budget.
fn agent_settings(model: &str, timeout: Duration) -> RunSettings {
    RunSettings {
        model: Some(model.to_owned()),
        sandbox: Some(SandboxMode::Managed),
        approval: Some(ApprovalMode::Sandboxed),
        max_time: Some(format!("{}ms", timeout.as_millis().max(1))),
        ..RunSettings::default()
    }
}

/// Checks that an agent can be built for the subject `model` before any attempt runs: its
/// settings resolve through the composition root as an attempt's do (the user's config,
/// prices) and its model client builds (a known provider, a readable and valid script, the
/// provider's key when its own endpoint is used). Nothing is started or recorded.
///
/// # Errors
///
/// Why it cannot be built, as the composition root says it.
pub fn check_subject(context: &AttemptContext, model: &str) -> std::result::Result<(), String> {
    // No attempt's workspace exists yet; one that does not exist reads as an empty one
    // (no workspace config, instructions or skills), which is what a task's fresh
    // workspace can add to the model settings before it is trusted: nothing.
    let workspace = context.home.join("eval").join("subject-check");
    let settings = agent_settings(model, crate::task::DEFAULT_AGENT_TIMEOUT);
    let prepared = root::prepare(&context.home, &workspace, &settings, None, &context.store, None)
        .map_err(|error| format!("{error:#}"))?;
    let resolved = &prepared.resolved;
    keel_host::provider::model_client(
        &resolved.model_spec,
        resolved.base_url.as_deref(),
        resolved.context_window,
    )
    .map(drop)
    .map_err(|error| format!("{error:#}"))
}

/// An agent: an ordinary keel session in the workspace, built by the composition root,
/// with the task's agent timeout as its time budget.
async fn agent(
    context: &AttemptContext,
    task: &Task,
    model: &str,
    dir: &Path,
    mounts: &Mounts,
    timeout: Duration,
) -> Result<AgentPhase, Failure> {
    // As `root::canonical_workspace`, with the experiment's KEEL_HOME rather than the
    // environment's: plant notes are keyed with the key of the home the session uses.
    let workspace = mounts.workspace.clone();
    keel_host::plant_key::install(&context.home, &workspace);
    let _repaired = keel_sandbox::recover_plants(&workspace);
    let settings = agent_settings(model, timeout);
    let setup = |error: anyhow::Error| infra(format!("agent {model}: {error:#}"));
    let prepared = root::prepare(&context.home, &workspace, &settings, None, &context.store, None)
        .map_err(setup)?;
    let Assembly { kernel, resolved, outbox, mcp: _mcp } = root::assemble(
        prepared,
        &context.home,
        &workspace,
        context.store.clone(),
        Arc::new(NoopObserver),
    )
    .await
    .map_err(setup)?;
    let session_id = kernel
        .create_session(&SessionConfig {
            workspace: workspace.clone(),
            model_spec: resolved.model_spec.clone(),
            envelope: resolved.envelope.clone(),
            mode: resolved.mode,
            base_url: resolved.recorded_base_url.clone(),
        })
        .await
        .map_err(|error| infra(format!("agent {model}: cannot create its session: {error}")))?;
    let input = match &mounts.workdir {
        Some(workdir) => format!(
            "{}\n\n(Your workspace {} is what the task calls {}.)",
            task.instruction,
            workspace.display(),
            workdir.display()
        ),
        None => task.instruction.clone(),
    };
    let cancel = Cancellation::new();
    let run = kernel.run_turn(session_id, &input, &resolved.run, &cancel);
    tokio::pin!(run);
    let mut hard_timeout = false;
    let report = tokio::select! {
        report = &mut run => report,
        () = tokio::time::sleep(timeout + AGENT_GRACE) => {
            hard_timeout = true;
            cancel.cancel();
            run.await
        }
    };
    outbox.finish().await;
    let mut phase =
        AgentPhase { session_id: Some(session_id.to_string()), ..AgentPhase::default() };
    match report {
        Ok(report) => {
            phase.input_tokens = Some(report.usage.input_tokens);
            phase.output_tokens = Some(report.usage.output_tokens);
            phase.cost_usd = report.usage.cost_usd;
            let (outcome, reason) = match &report.outcome {
                TurnOutcome::Completed { .. } => ("completed", None),
                TurnOutcome::Failed { reason } => ("failed", Some(reason.clone())),
                TurnOutcome::Suspended { reason, .. } => {
                    if reason.contains("time budget") {
                        phase.timed_out = true;
                    }
                    ("suspended", Some(reason.clone()))
                }
                TurnOutcome::Cancelled { reason } => ("cancelled", Some(reason.clone())),
                TurnOutcome::Denied { reason } => ("denied", Some(reason.clone())),
            };
            phase.outcome = Some(outcome.to_owned());
            phase.reason = reason.map(|reason| format!("agent run {outcome}: {reason}"));
        }
        Err(error) => {
            phase.outcome = Some("error".to_owned());
            phase.reason = Some(format!("agent run error: {error}"));
        }
    }
    if hard_timeout {
        phase.timed_out = true;
    }
    match context.store.read(session_id, keel_contracts::Seq(0)).await {
        Ok(events) => {
            let trajectory = crate::trajectory::from_events(&events);
            let path = dir.join("trajectory.json");
            match serde_json::to_vec_pretty(&trajectory) {
                Ok(json) if std::fs::write(&path, &json).is_ok() => {
                    phase.trajectory = Some(path.display().to_string());
                }
                _ => {}
            }
        }
        Err(error) => {
            phase
                .reason
                .get_or_insert_with(|| format!("trajectory: cannot read the session: {error}"));
        }
    }
    Ok(phase)
}

/// Writes keel's own log `name` into `dir`, a folder the task's sandboxed scripts could
/// write: they may have left a link (symbolic or hard) at `dir/name`, or put a link in
/// place of `dir`, which a plain write would follow out of the experiment, writing the
/// user's files with the script's output. So `dir` must still be a real folder (else the
/// log is not written), whatever is at `name` is unlinked first, and the file is created
/// anew (`O_CREAT|O_EXCL`, which never follows a link). Best effort: a log that cannot be
/// written is left out.
fn write_log(dir: &Path, name: &str, bytes: &[u8]) {
    use std::io::Write;
    if !dir.symlink_metadata().is_ok_and(|meta| meta.is_dir()) {
        return;
    }
    let path = dir.join(name);
    if path.symlink_metadata().is_ok() && std::fs::remove_file(&path).is_err() {
        return;
    }
    if let Ok(mut file) = std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        let _ = file.write_all(bytes);
    }
}

/// Runs `tests/test.sh` and reads its reward.
async fn verify(
    task: &Task,
    tests: &Path,
    mounts: &Mounts,
    timeout: Duration,
) -> Result<f64, Failure> {
    let verifier_error = |reason: String| Failure { class: Class::VerifierError, reason };
    let mut spec =
        mounts.spec("/tests/test.sh", timeout).allow_read(tests).map_dir(tests, "/tests");
    for (key, value) in task.config.environment.env.iter().chain(&task.config.verifier.env) {
        spec = spec.env(key, value);
    }
    let output = keel_sandbox::run(&spec, SandboxMode::Managed)
        .await
        .map_err(|error| sandbox_failure("tests/test.sh", &error))?;
    let verifier_logs = mounts.logs.join("verifier");
    write_log(&verifier_logs, "test-stdout.txt", output.stdout.text.as_bytes());
    write_log(&verifier_logs, "test-stderr.txt", output.stderr.text.as_bytes());
    if let Termination::TimedOut { after } = output.termination {
        return Err(verifier_error(format!(
            "tests/test.sh timed out after {} s",
            after.as_secs_f64()
        )));
    }
    read_reward(&verifier_logs).map_err(|reason| {
        verifier_error(format!("{reason} (tests/test.sh ended with {})", output.termination))
    })
}

/// The reward in `verifier_logs`: `reward.txt` (a number), else `reward.json` (a number,
/// or an object with a numeric `reward`, or with exactly one numeric value).
///
/// # Errors
///
/// Why there is no usable reward: no file, not a regular file (a FIFO, a link), too
/// large, not a finite number.
pub fn read_reward(verifier_logs: &Path) -> Result<f64, String> {
    // The verifier could have put a link in place of its folder: the reward is read only
    // from the folder keel made.
    if !verifier_logs.symlink_metadata().is_ok_and(|meta| meta.is_dir()) {
        return Err("logs/verifier is no longer a folder (the verifier replaced it)".into());
    }
    let text_path = verifier_logs.join("reward.txt");
    let json_path = verifier_logs.join("reward.json");
    let read = |path: &Path| environment::read_regular(path, MAX_REWARD_BYTES);
    match read(&text_path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            return match text.trim().parse::<f64>() {
                Ok(value) if value.is_finite() => Ok(value),
                _ => Err(format!(
                    "reward.txt is not a number: {:?}",
                    text.trim().chars().take(80).collect::<String>()
                )),
            };
        }
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("reward.txt cannot be read: {error}"));
        }
        Err(_) => {}
    }
    let bytes = match read(&json_path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err("no reward: the verifier wrote neither reward.txt nor reward.json".into());
        }
        Err(error) => return Err(format!("reward.json cannot be read: {error}")),
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|error| format!("reward.json is not JSON: {error}"))?;
    let number = match &value {
        serde_json::Value::Number(number) => number.as_f64(),
        serde_json::Value::Object(map) => match map.get("reward") {
            Some(reward) => reward.as_f64(),
            None => {
                let numbers: Vec<f64> =
                    map.values().filter_map(serde_json::Value::as_f64).collect();
                if map.len() == 1 { numbers.first().copied() } else { None }
            }
        },
        _ => None,
    };
    number
        .filter(|value| value.is_finite())
        .ok_or_else(|| "reward.json holds no numeric reward".to_owned())
}
