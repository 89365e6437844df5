//! The crash harness (issue 5, DESIGN.md §6): `kill -9` a scripted `keel run` at every
//! named failpoint (several hit counts each) and at seeded random moments, `keel resume`
//! until the turn completes, and check what the ledger and the workspace prove:
//!
//! - (a) every run in the ledger has exactly one terminal event, and every tool call
//!   exactly one result;
//! - (b) the reopened ledger is a prefix-extension of what was committed: each snapshot
//!   taken right after a kill is, line for line and byte for byte, the start of the final
//!   `keel log --json`;
//! - (c) no command ran twice: each bash command appends its own line to `counter.txt`,
//!   and no line appears twice; a line appears only for a call whose
//!   `tool_attempt_prepared` is durable, and every call answered `ok` left its line;
//! - (d) the last run completes.
//!
//! The script never repeats a command: the scripted model's position comes from the
//! ledger, so a resumed run continues the script, and the model never re-issues a call
//! that came back `indeterminate` or `cancelled`. A repeated line could therefore only
//! come from keel replaying a call.
//!
//! The normal suite kills at least 200 runs; `KEEL_CRASH_RUNS=N` sets how many random
//! kill points are tried (default [`RANDOM_CASES`]) on top of the named ones.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::support::{Env, stderr, stdout};

/// Six tool calls (one write, one edit, four bash commands, two of them in one step),
/// then a tool-free answer. The extra answers serve runs that resume after the answer was
/// recorded but before the run's terminal event was: the resumed run asks again.
const SCRIPT: &str = r#"{"steps":[
    {"text":"Writing notes.","tool_calls":[{"name":"write_file","arguments":{"path":"notes.txt","content":"alpha\n"}}]},
    {"tool_calls":[{"name":"bash","arguments":{"command":"echo call_1 >> counter.txt"}}]},
    {"tool_calls":[{"name":"edit_file","arguments":{"path":"notes.txt","old":"alpha","new":"beta"}}]},
    {"tool_calls":[{"name":"bash","arguments":{"command":"echo call_2 >> counter.txt"}},{"name":"bash","arguments":{"command":"echo call_3 >> counter.txt"}}]},
    {"tool_calls":[{"name":"bash","arguments":{"command":"echo call_4 >> counter.txt"}}]},
    {"text":"done"},
    {"text":"done, after a crash"},
    {"text":"done, after two crashes"},
    {"text":"done, after three crashes"},
    {"text":"done, after four crashes"}
]}"#;

const TASK: &str = "take notes and count";

/// Tool calls in [`SCRIPT`]: the hits of each per-call failpoint in an uncrashed run.
const TOOL_CALLS: u32 = 6;

/// Failpoints and how many times an uncrashed run reaches each.
const FAILPOINTS: [(&str, u32); 7] = [
    ("before_prepare", TOOL_CALLS),
    ("after_prepare", TOOL_CALLS),
    ("mid_tool", TOOL_CALLS),
    ("before_result", TOOL_CALLS),
    ("after_result", TOOL_CALLS),
    ("before_terminal", 1),
    ("after_terminal", 1),
];

/// Random kill points in the normal suite; with the 32 named ones, over 200 kills.
const RANDOM_CASES: usize = 176;

/// Cases run side by side (the work is mostly process start-up and fsync).
const THREADS: usize = 4;

/// The most resumes a case may need before its turn completes.
const MAX_RESUMES: usize = 4;

/// The line the CLI prints when it reaches `KEEL_FAILPOINT`.
const MARKER: &str = "keel-failpoint-reached";

#[derive(Debug, Clone)]
enum Kill {
    /// `KEEL_FAILPOINT=point:nth`, killed on the marker line.
    At { point: &'static str, nth: u32 },
    /// Killed at a random moment; when `resume` is set, the first resume is killed too.
    Random { run: RandomKill, resume: Option<RandomKill> },
}

/// A random moment in a process's life: after it printed `after_events` events (`--json`
/// prints each once it is durable; 0: counting from the start of the process), plus
/// `jitter` times the mean gap between events. Counting events rather than time keeps the
/// kill points spread over the whole ledger however loaded the machine is.
#[derive(Debug, Clone, Copy)]
struct RandomKill {
    after_events: usize,
    jitter: f64,
}

#[derive(Debug, Clone)]
struct Case {
    label: String,
    kill: Kill,
}

/// What the cases did, summed.
#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    /// SIGKILLs that landed on a running process (initial runs and resumes).
    kills: usize,
    /// Failpoint cases whose process printed the marker.
    markers: usize,
    /// Random kills that came after the process had already exited.
    missed: usize,
    /// Kills before the session existed.
    before_session: usize,
    resumes: usize,
    indeterminate: usize,
    cancelled: usize,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.cases += other.cases;
        self.kills += other.kills;
        self.markers += other.markers;
        self.missed += other.missed;
        self.before_session += other.before_session;
        self.resumes += other.resumes;
        self.indeterminate += other.indeterminate;
        self.cancelled += other.cancelled;
    }
}

/// SplitMix64: a seeded, deterministic list of kill points.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn fraction(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The named cases, then `random_cases` seeded random ones over a run of `n_events` events.
fn cases(random_cases: usize, n_events: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for (point, hits) in FAILPOINTS {
        for nth in 1..=hits {
            cases.push(Case { label: format!("{point}:{nth}"), kill: Kill::At { point, nth } });
        }
    }
    let mut random = SplitMix(0x6b65_656c_6372_6173);
    let mut pick = |n_events: usize| {
        // One in eight counts from the start of the process (start-up, opening the ledger,
        // the first append), with up to 16 event gaps of jitter.
        if random.next().is_multiple_of(8) {
            RandomKill { after_events: 0, jitter: 16.0 * random.fraction() }
        } else {
            let after_events = 1 + usize::try_from(random.next() % n_events as u64).unwrap();
            RandomKill { after_events, jitter: random.fraction() }
        }
    };
    for index in 0..random_cases {
        let run = pick(n_events);
        // A third of the random cases also kill the first resume, somewhere in its first
        // events (a resumed run is shorter: it continues the script).
        let resume = if index % 3 == 0 { Some(pick(n_events / 2)) } else { None };
        let label = format!(
            "random #{index}: after {} events + {:.2} gaps{}",
            run.after_events,
            run.jitter,
            resume
                .map(|kill| format!(", resume after {} + {:.2}", kill.after_events, kill.jitter))
                .unwrap_or_default()
        );
        cases.push(Case { label, kill: Kill::Random { run, resume } });
    }
    cases
}

/// How the case's processes are started.
struct Setup<'a> {
    env: &'a Env,
    workspace: &'a Path,
    model: &'a str,
    /// Mean time between two events of an uncrashed run, the scale of random jitter.
    event_gap: Duration,
}

impl Setup<'_> {
    fn run_command(&self) -> std::process::Command {
        let mut command = self.env.keel();
        command.args([
            "run",
            "-C",
            self.workspace.to_str().unwrap(),
            "-m",
            self.model,
            "--approval",
            "auto",
            "--sandbox",
            "bypass",
            "--json",
            TASK,
        ]);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        command
    }

    fn resume_command(&self, session: &str, task: Option<&str>) -> std::process::Command {
        let mut command = self.env.keel();
        command.args(["resume", session, "--approval", "auto", "--sandbox", "bypass", "--json"]);
        command.args(task);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        command
    }

    /// Starts `command` and kills it at `moment`; `true` when the kill landed.
    fn run_and_kill(
        &self,
        mut command: std::process::Command,
        moment: RandomKill,
        label: &str,
    ) -> bool {
        let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
        let pipe = child.stdout.take().unwrap();
        let (events, printed) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                if line.is_err() || events.send(()).is_err() {
                    return;
                }
            }
        });
        for _ in 0..moment.after_events {
            match printed.recv_timeout(Duration::from_secs(60)) {
                Ok(()) => {}
                // The process ended first: the kill below comes too late.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    panic!("{label}: no event within 60 s");
                }
            }
        }
        std::thread::sleep(self.event_gap.mul_f64(moment.jitter));
        kill(&mut child, label)
    }
}

/// Reads the child's stderr until the failpoint marker; `true` when it was printed.
fn wait_for_marker(child: &mut Child, label: &str) -> bool {
    let pipe = child.stderr.take().unwrap();
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) if line.starts_with(MARKER) => return true,
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("{label}: no failpoint marker within 60 s");
            }
        }
    }
}

/// Kills `child` now; `true` when the SIGKILL is what ended it.
fn kill(child: &mut Child, label: &str) -> bool {
    let _ = child.kill();
    let status = child.wait().unwrap();
    match status.signal() {
        Some(9) => true,
        Some(other) => panic!("{label}: keel died of signal {other}"),
        None => false,
    }
}

/// The session of this case's KEEL_HOME, if one was created.
fn session_of(env: &Env, label: &str) -> Option<String> {
    let output = env.run(&["sessions", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{label}: {}", stderr(&output));
    let sessions: Vec<serde_json::Value> =
        stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert!(sessions.len() <= 1, "{label}: {sessions:?}");
    sessions.first().map(|session| session["session_id"].as_str().unwrap().to_owned())
}

/// The ledger as `keel log --json` prints it, one line per event.
fn ledger_lines(env: &Env, session: &str, label: &str) -> Vec<String> {
    let output = env.run(&["log", session, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{label}: {}", stderr(&output));
    stdout(&output).lines().map(str::to_owned).collect()
}

fn parse(lines: &[String]) -> Vec<serde_json::Value> {
    lines.iter().map(|line| serde_json::from_str(line).unwrap()).collect()
}

const TERMINAL_KINDS: [&str; 5] =
    ["run_completed", "run_failed", "run_suspended", "run_cancelled", "run_denied"];

fn kind(event: &serde_json::Value) -> &str {
    event["kind"].as_str().unwrap()
}

/// Runs one case and checks (a)–(d).
fn run_case(case: &Case, script: &Path, event_gap: Duration) -> Tally {
    let label = case.label.as_str();
    let env = Env::new();
    let workspace = env.workspace();
    let model = format!("scripted:{}", script.display());
    let setup = Setup { env: &env, workspace: &workspace, model: &model, event_gap };
    let mut tally = Tally { cases: 1, ..Tally::default() };

    let killed = match &case.kill {
        Kill::At { point, nth } => {
            let mut command = setup.run_command();
            command.env("KEEL_FAILPOINT", format!("{point}:{nth}")).stderr(Stdio::piped());
            let mut child = command.spawn().unwrap();
            let reached = wait_for_marker(&mut child, label);
            assert!(reached, "{label}: the run ended without reaching the failpoint");
            tally.markers += 1;
            kill(&mut child, label)
        }
        Kill::Random { run, .. } => setup.run_and_kill(setup.run_command(), *run, label),
    };
    if killed {
        tally.kills += 1;
    } else {
        tally.missed += 1;
    }

    let Some(session) = session_of(&env, label) else {
        // Killed before `session_created` was durable: nothing ran.
        assert!(killed, "{label}: a run that was not killed left no session");
        assert!(
            !workspace.join("counter.txt").exists(),
            "{label}: a command ran without a session"
        );
        tally.before_session += 1;
        return tally;
    };
    let mut snapshots = vec![ledger_lines(&env, &session, label)];

    let mut kill_resume = match &case.kill {
        Kill::Random { resume, .. } => *resume,
        Kill::At { .. } => None,
    };
    let mut finished = false;
    for _ in 0..MAX_RESUMES {
        let events = parse(snapshots.last().unwrap());
        // Killed before the turn began: the user gives the task again.
        let task = (!events.iter().any(|event| kind(event) == "turn_started")).then_some(TASK);
        let mut command = setup.resume_command(&session, task);
        tally.resumes += 1;
        if let Some(moment) = kill_resume.take() {
            if setup.run_and_kill(command, moment, label) {
                tally.kills += 1;
            }
            snapshots.push(ledger_lines(&env, &session, label));
            continue;
        }
        let output = command.stderr(Stdio::piped()).output().unwrap();
        let message = stderr(&output);
        match output.status.code() {
            Some(0) => {}
            // The killed run had completed already (e.g. killed after its terminal event).
            Some(2) if message.contains("nothing to resume") => {}
            other => panic!("{label}: resume exited {other:?}: {message}"),
        }
        finished = true;
        break;
    }
    assert!(finished, "{label}: no completed turn after {MAX_RESUMES} resumes");

    let lines = ledger_lines(&env, &session, label);
    // (b) Every snapshot is a byte-equal prefix of the final ledger.
    for snapshot in &snapshots {
        assert!(snapshot.len() <= lines.len(), "{label}: the ledger shrank");
        for (index, (old, new)) in snapshot.iter().zip(&lines).enumerate() {
            assert_eq!(old, new, "{label}: line {} changed after resume", index + 1);
        }
    }
    let events = parse(&lines);
    check_runs(label, &events);
    let (indeterminate, cancelled) = check_calls(label, &events, &workspace);
    tally.indeterminate += indeterminate;
    tally.cancelled += cancelled;
    tally
}

/// (a) one terminal event per run, (d) the last run completed.
fn check_runs(label: &str, events: &[serde_json::Value]) {
    let mut terminals: BTreeMap<&str, usize> = BTreeMap::new();
    for event in events {
        if kind(event) == "run_started" {
            let run = event["run_id"].as_str().unwrap();
            assert!(terminals.insert(run, 0).is_none(), "{label}: run {run} started twice");
        }
    }
    for event in events.iter().filter(|event| TERMINAL_KINDS.contains(&kind(event))) {
        let run = event["run_id"].as_str().unwrap();
        *terminals.get_mut(run).unwrap_or_else(|| panic!("{label}: terminal of unknown run")) += 1;
    }
    for (run, count) in &terminals {
        assert_eq!(*count, 1, "{label}: run {run} has {count} terminal events");
    }
    let last = events.last().unwrap();
    assert_eq!(kind(last), "run_completed", "{label}: the last run did not complete: {last}");
}

/// (a) one result per call, (c) no command twice and no effect without a durable prepare.
/// Returns how many calls recovery answered `indeterminate` and `cancelled`.
fn check_calls(label: &str, events: &[serde_json::Value], workspace: &Path) -> (usize, usize) {
    let mut commands = BTreeMap::new();
    let mut prepared: BTreeMap<String, usize> = BTreeMap::new();
    let mut results: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for event in events {
        match kind(event) {
            "model_response" => {
                for call in event["tool_calls"].as_array().unwrap() {
                    let call_id = call["call_id"].as_str().unwrap().to_owned();
                    let command = call["arguments"]["command"].as_str().map(str::to_owned);
                    let first = commands.insert(call_id.clone(), command).is_none();
                    assert!(first, "{label}: call {call_id} proposed twice");
                    results.entry(call_id).or_default();
                }
            }
            "tool_attempt_prepared" => {
                *prepared.entry(event["call_id"].as_str().unwrap().to_owned()).or_default() += 1;
            }
            "tool_result" => {
                let call_id = event["call_id"].as_str().unwrap().to_owned();
                let outcome = event["outcome"].as_str().unwrap().to_owned();
                results.entry(call_id).or_default().push(outcome);
            }
            _ => {}
        }
    }
    for (call_id, outcomes) in &results {
        assert_eq!(outcomes.len(), 1, "{label}: call {call_id} has results {outcomes:?}");
        let attempts = prepared.get(call_id).copied().unwrap_or(0);
        assert!(attempts <= 1, "{label}: call {call_id} was attempted {attempts} times");
    }

    let counter = std::fs::read_to_string(workspace.join("counter.txt")).unwrap_or_default();
    let mut seen = BTreeSet::new();
    for line in counter.lines() {
        assert!(seen.insert(line), "{label}: `{line}` ran twice:\n{counter}");
    }
    for (call_id, command) in &commands {
        let Some(command) = command else { continue };
        let line = command.trim_start_matches("echo ").trim_end_matches(" >> counter.txt");
        let outcome = results[call_id][0].as_str();
        if seen.contains(line) {
            assert!(
                prepared.contains_key(call_id),
                "{label}: {line} ran without a durable prepare"
            );
        }
        if outcome == "ok" {
            assert!(seen.contains(line), "{label}: {call_id} ok but `{line}` is missing");
        }
    }
    let count = |want: &str| results.values().filter(|outcomes| outcomes[0] == want).count();
    (count("indeterminate"), count("cancelled"))
}

#[test]
fn kill_9_at_every_failpoint_and_at_random_then_resume_completes_without_replaying() {
    let started = Instant::now();
    let random_cases = match std::env::var("KEEL_CRASH_RUNS") {
        Ok(text) => text.trim().parse().expect("KEEL_CRASH_RUNS must be a number"),
        Err(_) => RANDOM_CASES,
    };
    let scratch = tempfile::tempdir().unwrap();
    let script = scratch.path().join("crash.json");
    std::fs::write(&script, SCRIPT).unwrap();

    // One uncrashed run: the script completes as designed, and gives random kills a scale.
    let env = Env::new();
    let workspace = env.workspace();
    let model = format!("scripted:{}", script.display());
    let setup =
        Setup { env: &env, workspace: &workspace, model: &model, event_gap: Duration::ZERO };
    let clock = Instant::now();
    let output =
        setup.run_command().stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap();
    let full_run = clock.elapsed();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let n_events = stdout(&output).lines().count();
    assert!(n_events > 40, "{}", stdout(&output));
    let event_gap = full_run / u32::try_from(n_events).unwrap();
    let counter = std::fs::read_to_string(workspace.join("counter.txt")).unwrap();
    assert_eq!(counter, "call_1\ncall_2\ncall_3\ncall_4\n");
    assert_eq!(std::fs::read_to_string(workspace.join("notes.txt")).unwrap(), "beta\n");

    let cases = cases(random_cases, n_events);
    let queue = Mutex::new(cases.iter());
    let total = Mutex::new(Tally::default());
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                loop {
                    let Some(case) = queue.lock().unwrap().next() else { return };
                    let tally = run_case(case, &script, event_gap);
                    total.lock().unwrap().add(&tally);
                }
            });
        }
    });
    let total = total.into_inner().unwrap();
    // Written past the test harness's capture, so the counts show in every test run.
    let _ = writeln!(
        std::io::stderr(),
        "crash harness: {} cases ({} at named failpoints, {random_cases} random) in {:.1} s: \
         {} SIGKILLs landed, {} random kills came after exit, {} kills before the session \
         existed, {} resumes, {} calls closed indeterminate, {} cancelled (uncrashed run: \
         {n_events} events in {} ms)",
        total.cases,
        total.markers,
        started.elapsed().as_secs_f64(),
        total.kills,
        total.missed,
        total.before_session,
        total.resumes,
        total.indeterminate,
        total.cancelled,
        full_run.as_millis(),
    );
    assert_eq!(total.cases, cases.len());
    assert_eq!(total.markers, FAILPOINTS.iter().map(|(_, hits)| *hits as usize).sum::<usize>());
    if random_cases >= RANDOM_CASES {
        assert!(total.kills >= 200, "only {} kills landed", total.kills);
    }
    assert!(total.indeterminate > 0, "no kill left a prepared call without its result");
}
