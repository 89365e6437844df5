//! The webhook sink against a local server that fails twice (500, then a dropped
//! connection) before it accepts: every event arrives, in order, none lost, and only the
//! failed batch is sent again.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use keel_contracts::Seq;
use keel_outbox::{Mirror, SinkConfig};
use keel_testkit::{FakeClock, MemStore};

use super::support::{eventually, fast_config, record, session, store_arc};

/// One POST the server received.
#[derive(Debug, Clone)]
struct Attempt {
    events: Vec<serde_json::Value>,
    accepted: bool,
}

#[derive(Debug, Clone, Default)]
struct Server {
    attempts: Arc<Mutex<Vec<Attempt>>>,
}

impl Server {
    /// Answers the first POST 500, drops the connection of the second, accepts the rest.
    async fn start() -> (Server, SocketAddr) {
        let server = Server::default();
        let app = axum::Router::new()
            .route("/events", axum::routing::post(receive))
            .with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (server, address)
    }

    fn attempts(&self) -> Vec<Attempt> {
        self.attempts.lock().unwrap().clone()
    }

    /// The events of accepted POSTs, in arrival order.
    fn accepted(&self) -> Vec<serde_json::Value> {
        self.attempts().into_iter().filter(|a| a.accepted).flat_map(|a| a.events).collect()
    }
}

async fn receive(
    State(server): State<Server>,
    Json(events): Json<Vec<serde_json::Value>>,
) -> StatusCode {
    let n = {
        let mut attempts = server.attempts.lock().unwrap();
        attempts.push(Attempt { events, accepted: false });
        attempts.len()
    };
    match n {
        1 => StatusCode::INTERNAL_SERVER_ERROR,
        // Unwinding the connection's task closes the socket without an answer;
        // `resume_unwind` skips the panic hook, so nothing is printed.
        2 => std::panic::resume_unwind(Box::new("drop the connection")),
        _ => {
            server.attempts.lock().unwrap()[n - 1].accepted = true;
            StatusCode::NO_CONTENT
        }
    }
}

fn webhook(address: SocketAddr, max_batch: usize) -> SinkConfig {
    toml::from_str(&format!(
        "name = \"hook\"\nkind = \"webhook\"\nurl = \"http://{address}/events\"\n\
         max_batch = {max_batch}\ntimeout_ms = 5000"
    ))
    .unwrap()
}

fn seqs(events: &[serde_json::Value]) -> Vec<u64> {
    events.iter().map(|event| event["seq"].as_u64().unwrap()).collect()
}

async fn stored_values(store: &MemStore, id: keel_contracts::SessionId) -> Vec<serde_json::Value> {
    super::support::stored_lines(store, id)
        .await
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test]
async fn flush_redrives_through_a_500_and_a_dropped_connection() {
    let (server, address) = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = MemStore::new();
    let clock = Arc::new(FakeClock::new());
    let id = session(1);
    record(&store, &clock, id, 1, 10).await;
    let mirror = Mirror::from_config(
        store_arc(&store),
        &[webhook(address, 4)],
        fast_config(dir.path(), clock.clone()),
    )
    .unwrap();

    let lags = mirror.flush(id).await;
    assert!(lags.is_empty(), "{lags:?}");
    // The session predates the sink's cursor file, so only the flush sends it.
    let attempts = server.attempts();
    let outcomes: Vec<(Vec<u64>, bool)> =
        attempts.iter().map(|a| (seqs(&a.events), a.accepted)).collect();
    assert_eq!(
        outcomes,
        [
            (vec![1, 2, 3, 4], false),
            (vec![1, 2, 3, 4], false),
            (vec![1, 2, 3, 4], true),
            (vec![5, 6, 7, 8], true),
            (vec![9, 10], true),
        ]
    );
    // What was accepted is exactly the ledger, byte for byte as JSON values.
    assert_eq!(server.accepted(), stored_values(&store, id).await);

    // A later flush sends only what is new.
    record(&store, &clock, id, 11, 11).await;
    assert!(mirror.flush(id).await.is_empty());
    assert_eq!(seqs(&server.attempts().last().unwrap().events), [11]);
    assert_eq!(server.accepted(), stored_values(&store, id).await);
}

#[tokio::test]
async fn the_background_task_redrives_without_a_flush() {
    let (server, address) = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = MemStore::new();
    let clock = Arc::new(FakeClock::new());
    let mirror = Mirror::from_config(
        store_arc(&store),
        &[webhook(address, 100)],
        fast_config(dir.path(), clock.clone()),
    )
    .unwrap();
    let id = session(2);
    record(&store, &clock, id, 1, 6).await;
    mirror.notify(id, Seq(6));
    let expected = stored_values(&store, id).await;
    eventually("the webhook to accept all six", || server.accepted() == expected).await;
    let attempts = server.attempts();
    // Events arrive at least once and in order: every POST starts right after the last
    // accepted event, so duplicates come only from the two failed attempts.
    let mut delivered = 0;
    for attempt in &attempts {
        assert_eq!(seqs(&attempt.events)[0], delivered + 1, "{attempts:?}");
        if attempt.accepted {
            delivered = *seqs(&attempt.events).last().unwrap();
        }
    }
    assert_eq!(attempts.iter().filter(|a| !a.accepted).count(), 2);
    drop(mirror);
}
