//! Fault injection at the store trait (issue 5): a ledger write that fails (I/O error,
//! fsync failure, disk full) ends the run with an error, never `completed`; nothing the
//! store acknowledged is lost; once the store heals, `resume` closes the broken run and the
//! turn finishes.

use std::sync::{Arc, Mutex};

use keel_contracts::{EventKind, RuntimeEvent, Seq, SessionId, StreamDelta};
use keel_kernel::{
    Cancellation, Kernel, KernelDeps, KernelError, Observer, StaticPermissions, TurnOutcome,
};
use keel_testkit::ScriptedModel;
use keel_testkit::{Fault, FaultyStore};

use super::support::{Harness, default_tools};

/// One write, then a tool-free answer; the third step answers a run that resumes after the
/// answer was recorded but its terminal event was not.
const SCRIPT: &str = r#"{"steps":[
    {"tool_calls":[{"name":"write","arguments":{"path":"a"}}]},
    {"text":"done"},
    {"text":"done after recovery"}
]}"#;

/// The event kinds whose append fails in turn, in loop order.
const KINDS: [&str; 4] =
    ["model_response", "tool_attempt_prepared", "tool_result", "run_completed"];

fn faults() -> [Fault; 3] {
    [Fault::DiskFull, Fault::FsyncFailed, Fault::Io("disk I/O error: write failed".into())]
}

/// Keeps every event the kernel reports durable: what the store acknowledged.
#[derive(Debug, Default)]
struct Acknowledged(Mutex<Vec<RuntimeEvent>>);

impl Observer for Acknowledged {
    fn on_event(&self, event: &RuntimeEvent) {
        self.0.lock().unwrap().push(event.clone());
    }
    fn on_delta(&self, _delta: &StreamDelta) {}
}

/// A harness whose ledger goes through a [`FaultyStore`].
struct Faulty {
    harness: Harness,
    store: Arc<FaultyStore>,
    acknowledged: Arc<Acknowledged>,
    kernel: Kernel,
}

impl Faulty {
    fn new() -> Faulty {
        let mut harness = Harness::new();
        let store = Arc::new(FaultyStore::new(harness.store.clone()));
        harness.store = store.clone();
        let acknowledged = Arc::new(Acknowledged::default());
        let model = ScriptedModel::new(serde_json::from_str(SCRIPT).unwrap(), "test-script");
        let kernel = Kernel::new(KernelDeps {
            store: store.clone(),
            model: Arc::new(model),
            tools: default_tools(&harness.log),
            clock: harness.clock.clone(),
            ids: harness.ids.clone(),
            permissions: Arc::new(StaticPermissions(harness.approval)),
            observer: acknowledged.clone(),
            counter: Arc::new(keel_contracts::ApproxCounter),
        })
        .unwrap();
        Faulty { harness, store, acknowledged, kernel }
    }

    /// What really reached the wrapped store.
    async fn written(&self, session: SessionId) -> Vec<RuntimeEvent> {
        self.store.inner().read(session, Seq(0)).await.unwrap()
    }

    /// Creates a session and runs [`Faulty::fail_then_recover_in`] on it.
    async fn fail_then_recover(&self, what: &str, fault: &Fault) -> Vec<RuntimeEvent> {
        let session = self.harness.session(&self.kernel).await;
        self.fail_then_recover_in(session, what, fault).await
    }

    /// Runs a turn in `session` with the store failing as arranged by the caller, checks the
    /// failure, heals the store, resumes, and checks the recovery. Returns the ledger.
    async fn fail_then_recover_in(
        &self,
        session: SessionId,
        what: &str,
        fault: &Fault,
    ) -> Vec<RuntimeEvent> {
        let config = self.harness.run_config();
        let result = self.kernel.run_turn(session, "go", &config, &Cancellation::new()).await;
        match &result {
            Err(KernelError::Append(error)) => {
                assert!(error.to_string().contains(&fault.message()), "{what}: {error}");
            }
            Ok(report) => {
                assert!(
                    matches!(report.outcome, TurnOutcome::Failed { .. }),
                    "{what}: a run whose ledger failed ended {:?}",
                    report.outcome
                );
            }
            Err(other) => panic!("{what}: unexpected error {other}"),
        }
        let before = self.written(session).await;
        assert_eq!(
            before,
            *self.acknowledged.0.lock().unwrap(),
            "{what}: the store holds exactly what it acknowledged"
        );
        assert!(
            !before.iter().any(|event| matches!(event.kind, EventKind::RunCompleted { .. })),
            "{what}: never completed"
        );
        assert!(self.harness.invocations().len() <= 1, "{what}: {:?}", self.harness.invocations());

        self.store.heal();
        let report = match self.kernel.resume(session, &config, &Cancellation::new()).await {
            Ok(report) => report,
            // The fault hit `turn_started` itself: the turn never began, so it is given again.
            Err(KernelError::NothingToResume(_)) => {
                assert!(
                    !before.iter().any(|event| matches!(event.kind, EventKind::TurnStarted { .. })),
                    "{what}: nothing to resume although a turn started"
                );
                self.kernel.run_turn(session, "go", &config, &Cancellation::new()).await.unwrap()
            }
            Err(other) => panic!("{what}: resume after heal failed: {other}"),
        };
        assert!(matches!(report.outcome, TurnOutcome::Completed { .. }), "{what}: {report:?}");
        let after = self.written(session).await;
        assert_eq!(after[..before.len()], before[..], "{what}: the healed ledger extends the old");
        assert_eq!(after, *self.acknowledged.0.lock().unwrap(), "{what}");
        check_one_terminal_per_run(what, &after);
        // The write ran at most once: an indeterminate attempt is never replayed.
        assert!(self.harness.invocations().len() <= 1, "{what}: {:?}", self.harness.invocations());
        after
    }
}

/// Every run has exactly one terminal event.
fn check_one_terminal_per_run(what: &str, events: &[RuntimeEvent]) {
    let runs: Vec<_> = events
        .iter()
        .filter(|event| matches!(event.kind, EventKind::RunStarted { .. }))
        .map(|event| event.run_id)
        .collect();
    for run in runs {
        let terminals = events
            .iter()
            .filter(|event| event.run_id == run && event.kind.is_run_terminal())
            .count();
        assert_eq!(terminals, 1, "{what}: run {run:?} has {terminals} terminal events");
    }
}

fn outcomes(events: &[RuntimeEvent]) -> Vec<&'static str> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult { outcome, .. } => Some(outcome.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_failed_append_of_each_kind_ends_the_run_with_an_error_and_loses_nothing() {
    for kind in KINDS {
        for fault in faults() {
            let what = format!("{kind} {fault:?}");
            let faulty = Faulty::new();
            faulty.store.fail_appends_of_kind(kind, fault.clone());
            let ledger = faulty.fail_then_recover(&what, &fault).await;
            // What recovery made of the write depends on where the ledger failed.
            let (want_outcomes, want_invocations): (&[&str], usize) = match kind {
                // No response recorded: the resumed run asks again and the write runs once.
                "model_response" => (&["ok"], 1),
                // The prepare shares its commit with the model's response (group commit):
                // neither is recorded, the write never ran, and the resumed run asks again.
                "tool_attempt_prepared" => (&["ok"], 1),
                // Ran, but its result was lost: `indeterminate`, not replayed.
                "tool_result" => (&["indeterminate"], 1),
                // Everything but the terminal event was recorded.
                "run_completed" => (&["ok"], 1),
                _ => unreachable!("KINDS"),
            };
            assert_eq!(outcomes(&ledger), want_outcomes, "{what}");
            assert_eq!(faulty.harness.invocations().len(), want_invocations, "{what}");
            let failed: Vec<&str> = ledger
                .iter()
                .filter_map(|event| match &event.kind {
                    EventKind::RunFailed { reason, .. } => Some(reason.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(failed, vec![keel_kernel::recovery::INTERRUPTED_REASON], "{what}");
        }
    }
}

#[tokio::test]
async fn a_ledger_that_stops_accepting_writes_after_any_append_loses_nothing() {
    // How many appends a healthy turn takes, after `session_created`.
    let healthy = Faulty::new();
    let session = healthy.harness.session(&healthy.kernel).await;
    let report = healthy
        .kernel
        .run_turn(session, "go", &healthy.harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }));
    let n_turn_appends = healthy.store.append_calls() - 1;
    // Group commit: the request; the response, gate, consent and prepare; the result with
    // the next request; the answer with the terminal event.
    assert_eq!(n_turn_appends, 4);

    let mut cases = 0;
    for n in 0..n_turn_appends {
        for fault in faults() {
            for transient in [false, true] {
                let what = format!("after {n} appends, {fault:?}, transient {transient}");
                let faulty = Faulty::new();
                let session = faulty.harness.session(&faulty.kernel).await;
                let base = faulty.store.append_calls();
                if transient {
                    // One append fails and the next would succeed: the run must still stop,
                    // not carry on past a hole in the ledger.
                    faulty.store.fail_nth_append(base + n + 1, fault.clone());
                } else {
                    // A disk that fills up: every later append fails.
                    faulty.store.fail_appends_after(base + n, fault.clone());
                }
                let ledger = faulty.fail_then_recover_in(session, &what, &fault).await;
                assert!(
                    matches!(ledger.last().unwrap().kind, EventKind::RunCompleted { .. }),
                    "{what}"
                );
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 6 * n_turn_appends);
}
