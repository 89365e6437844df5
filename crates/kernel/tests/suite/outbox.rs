//! Every terminal-event path lets the outbox catch up first.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use keel_contracts::{Seq, SessionId, Store};
use keel_kernel::{Cancellation, Outbox};

use super::support::Harness;

/// Records, at each flush, the kind of the last durable event of the session.
#[derive(Debug)]
struct Recording {
    store: Arc<dyn Store>,
    seen: Mutex<Vec<String>>,
}

#[async_trait]
impl Outbox for Recording {
    async fn flush(&self, session_id: SessionId) {
        let events = self.store.read(session_id, Seq(0)).await.unwrap();
        let last = events.last().map(|e| e.kind.name().to_owned()).unwrap_or_default();
        self.seen.lock().unwrap().push(last);
    }
}

#[tokio::test(start_paused = true)]
async fn the_outbox_is_flushed_before_every_terminal_event() {
    let harness = Harness::new();
    let outbox = Arc::new(Recording { store: harness.store.clone(), seen: Mutex::default() });
    let script = r#"{"steps":[{"tool_calls":[{"name":"slow","arguments":{}}]},{"text":"done"}]}"#;
    let kernel = harness.kernel(script).with_outbox(outbox.clone());
    let session = harness.session(&kernel).await;
    // A run that dies mid-tool: the next run closes it (a terminal event), then completes.
    let never = Cancellation::new();
    let config = harness.run_config();
    let dying = kernel.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(std::time::Duration::from_secs(1), dying).await.is_err());
    kernel.run_turn(session, "again", &config, &Cancellation::new()).await.unwrap();
    let seen = outbox.seen.lock().unwrap().clone();
    // Flushed before the recovery's run_failed (after its indeterminate result) and before the second run's run_completed,
    // each time with the terminal event not yet recorded.
    assert_eq!(seen, vec!["tool_result", "model_response"]);
}
