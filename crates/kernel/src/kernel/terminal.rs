//! How a run ends: its checkpoint when it stopped early, the outbox's catch-up, its one
//! terminal event, the steering inputs acknowledged, the lease let go.

use keel_contracts::{EventKind, RunId, Seq, TurnId, UsageTotals};

use super::{Kernel, RunReport, TurnOutcome};
use crate::Result;
use crate::failpoint::Failpoint;
use crate::ledger::Ledger;

/// What a run's loop ended with.
pub(super) struct Ending {
    pub(super) turn_id: TurnId,
    pub(super) run_id: RunId,
    pub(super) outcome: TurnOutcome,
    pub(super) usage: UsageTotals,
    /// When the run began.
    pub(super) started: tokio::time::Instant,
    /// Steering input staged at a step boundary, acknowledged once durable.
    pub(super) joined: Vec<(Seq, tokio::sync::oneshot::Sender<Seq>)>,
}

impl Kernel {
    /// Records how the run ended (exactly one terminal event) and lets its lease go.
    pub(super) async fn finish(&self, mut ledger: Ledger, ending: Ending) -> Result<RunReport> {
        let Ending { turn_id, run_id, outcome, usage, started, joined } = ending;
        let (turn, run) = (Some(turn_id), Some(run_id));
        if let TurnOutcome::Suspended { reason, report } = &outcome {
            // The run's latest results held in memory (issue #13).
            let evidence = crate::checkpoint::run_evidence(&ledger, run_id);
            ledger
                .append(
                    turn,
                    run,
                    EventKind::Checkpoint {
                        reason: reason.clone(),
                        report: report.clone(),
                        evidence,
                        usage,
                    },
                )
                .await?;
        }
        // What a script reading only the last line needs: the answer, the time, the usage.
        let duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        let kind = match &outcome {
            TurnOutcome::Completed { text } => EventKind::RunCompleted {
                reason: "the model answered without tool calls".into(),
                usage,
                answer: Some(text.clone()),
                duration_ms,
            },
            TurnOutcome::Failed { reason } => {
                EventKind::RunFailed { reason: reason.clone(), usage, answer: None, duration_ms }
            }
            TurnOutcome::Suspended { reason, report } => EventKind::RunSuspended {
                reason: reason.clone(),
                usage,
                answer: (!report.is_empty()).then(|| report.clone()),
                duration_ms,
            },
            TurnOutcome::Cancelled { reason } => {
                EventKind::RunCancelled { reason: reason.clone(), usage, answer: None, duration_ms }
            }
            TurnOutcome::Denied { reason } => {
                EventKind::RunDenied { reason: reason.clone(), usage, answer: None, duration_ms }
            }
        };
        // Every terminal-event path lets the outbox catch up first (bounded); the outbox
        // reads the store, so what is staged is committed before it flushes.
        if self.outbox.delivers() {
            ledger.commit().await?;
        }
        let _ =
            tokio::time::timeout(crate::OUTBOX_FLUSH_TIMEOUT, self.outbox.flush(ledger.session_id))
                .await;
        self.failpoints.hit(Failpoint::BeforeTerminal).await;
        ledger.append(turn, run, kind).await?;
        for (seq, sender) in joined {
            let _ = sender.send(seq);
        }
        self.failpoints.hit(Failpoint::AfterTerminal).await;
        self.drop_lease(&mut ledger).await;
        Ok(RunReport { session_id: ledger.session_id, turn_id, run_id, outcome, usage })
    }
}
