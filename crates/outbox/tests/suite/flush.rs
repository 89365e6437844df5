//! A flush is bounded when a sink is down, and the events stay due.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{RuntimeEvent, Seq};
use keel_outbox::{DeliveryError, JsonlSink, Mirror, MirrorConfig, Sink, SinkConfig, SinkName};
use keel_testkit::{FakeClock, MemStore};
use tokio::time::Instant;

use super::support::{file_lines, record, session, store_arc, stored_lines};

/// Fails every delivery until healed, then appends to a JSON-lines file.
#[derive(Debug)]
struct Flaky {
    down: AtomicBool,
    attempts: AtomicU32,
    file: JsonlSink,
}

#[async_trait]
impl Sink for Flaky {
    fn target(&self) -> String {
        self.file.target()
    }

    fn max_batch(&self) -> usize {
        2
    }

    async fn deliver(&self, events: &[RuntimeEvent]) -> Result<(), DeliveryError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(DeliveryError::Status { status: 503 });
        }
        self.file.deliver(events).await
    }
}

/// The kernel's bound on a flush (keel_kernel::OUTBOX_FLUSH_TIMEOUT).
const KERNEL_BOUND: Duration = Duration::from_secs(5);

#[tokio::test(start_paused = true)]
async fn flush_gives_up_in_bounded_time_while_the_sink_is_down_and_delivers_once_it_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let store = MemStore::new();
    let clock = Arc::new(FakeClock::new());
    let id = session(1);
    record(&store, &clock, id, 1, 5).await;
    let sink = Arc::new(Flaky {
        down: AtomicBool::new(true),
        attempts: AtomicU32::new(0),
        file: JsonlSink::new(path.clone()),
    });
    // Defaults: 3 attempts, backoff 250 ms then 500 ms.
    let config = MirrorConfig::new(dir.path().join("outbox"), clock.clone());
    let mirror = Mirror::start(
        store_arc(&store),
        vec![(SinkName::new("flaky").unwrap(), sink.clone())],
        config,
    )
    .unwrap();

    let started = Instant::now();
    let lags = mirror.flush(id).await;
    let first = started.elapsed();
    assert!(first >= Duration::from_millis(750) && first < KERNEL_BOUND, "{first:?}");
    assert_eq!(lags.len(), 1, "{lags:?}");
    assert_eq!(
        (lags[0].sink.as_str(), lags[0].session_id, lags[0].delivered),
        ("flaky", id, Seq(0))
    );
    assert_eq!(lags[0].error, "endpoint answered 503");
    assert!(file_lines(&path).is_empty());

    // Known to be down: one attempt, no waiting.
    let started = Instant::now();
    assert_eq!(mirror.flush(id).await.len(), 1);
    assert!(started.elapsed() < Duration::from_millis(250), "{:?}", started.elapsed());

    // Nothing was skipped meanwhile: once the sink is up, everything arrives once.
    sink.down.store(false, Ordering::SeqCst);
    assert!(mirror.flush(id).await.is_empty());
    assert_eq!(file_lines(&path), stored_lines(&store, id).await);
}

#[tokio::test(start_paused = true)]
async fn flush_of_a_webhook_that_never_answers_is_bounded_by_its_timeouts() {
    // Connections are accepted by the kernel's backlog and never answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = MemStore::new();
    let clock = Arc::new(FakeClock::new());
    let id = session(1);
    record(&store, &clock, id, 1, 3).await;
    let hook: SinkConfig = toml::from_str(&format!(
        "name = \"hook\"\nkind = \"webhook\"\nurl = \"http://{address}/\"\ntimeout_ms = 1000"
    ))
    .unwrap();
    let mirror = Mirror::from_config(
        store_arc(&store),
        &[hook],
        MirrorConfig::new(dir.path().join("outbox"), clock.clone()),
    )
    .unwrap();

    let started = Instant::now();
    let lags = mirror.flush(id).await;
    // Three attempts of at most 1 s each, with 250 ms and 500 ms between them.
    assert!(started.elapsed() <= Duration::from_millis(3750), "{:?}", started.elapsed());
    assert_eq!(lags.len(), 1, "{lags:?}");
    assert_eq!(lags[0].delivered, Seq(0));
    drop(silent);
}

#[test]
fn the_mirror_is_a_shareable_handle() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Mirror>();
    assert_send_sync::<keel_outbox::SinkLag>();
}
