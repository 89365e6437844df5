//! The SSE stream of a session (DESIGN.md §9): its ledger, then what is appended to it.
//!
//! Each ledger event is one SSE event: `id:` its seq, `event:` its kind, `data:` the
//! `RuntimeEvent` JSON (as `keel log --json` prints it). The stream replays from
//! `Last-Event-ID` or `?after=` out of the store, so a client that reconnects (after a
//! host restart too) loses nothing and sees nothing twice. Pending permission requests are
//! re-sent on every subscribe as `permission_pending` events without an `id:` (so they do
//! not move the client's Last-Event-ID). `: ping` comments keep idle connections alive.
//!
//! Memory is bounded per client: events pass through a channel of `sse_buffer` entries; a
//! client that takes none for `slow_client` is dropped, with a final `dropped` event
//! saying why (when it reads again).

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use axum::response::sse::Event;
use futures::Stream;
use keel_contracts::{RuntimeEvent, Seq, SessionId};
use tokio::sync::mpsc;

use crate::ledger;
use crate::state::Host;

/// One message of the stream, before it is spelled as SSE.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Frame {
    /// A ledger event: its seq, kind and JSON.
    Ledger { seq: Seq, kind: &'static str, json: String },
    /// A pending permission request, re-sent (no id).
    Pending(String),
    /// A server's question without an answer, re-sent (no id).
    Question(String),
    /// A keep-alive comment.
    Ping,
    /// The host gave up on the store.
    Error(String),
    /// The host dropped the client, and why.
    Dropped(String),
}

impl Frame {
    fn into_event(self) -> Event {
        let reason = |why: String| serde_json::json!({"reason": why}).to_string();
        match self {
            Frame::Ledger { seq, kind, json } => {
                Event::default().id(seq.0.to_string()).event(kind).data(json)
            }
            Frame::Pending(json) => Event::default().event("permission_pending").data(json),
            Frame::Question(json) => Event::default().event("question_pending").data(json),
            Frame::Ping => Event::default().comment(" ping"),
            Frame::Error(why) => Event::default().event("error").data(reason(why)),
            Frame::Dropped(why) => Event::default().event("dropped").data(reason(why)),
        }
    }
}

/// The stream of `session_id`'s events after `after`, as SSE.
pub(crate) fn stream(
    host: Arc<Host>,
    session_id: SessionId,
    after: Seq,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    futures::StreamExt::map(frames(host, session_id, after), |frame| Ok(frame.into_event()))
}

/// The stream's frames: a producer task fills a bounded channel from the store.
pub(crate) fn frames(
    host: Arc<Host>,
    session_id: SessionId,
    after: Seq,
) -> impl Stream<Item = Frame> + Send + 'static {
    let (sender, receiver) = mpsc::channel::<Frame>(host.config.sse_buffer.max(1));
    let reason: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    tokio::spawn(produce(host, session_id, after, sender, reason.clone()));
    futures::stream::unfold((receiver, reason, false), |(mut receiver, reason, ended)| async move {
        if ended {
            return None;
        }
        match receiver.recv().await {
            Some(frame) => Some((frame, (receiver, reason, false))),
            None => {
                let why = reason.lock().unwrap_or_else(PoisonError::into_inner).take()?;
                Some((Frame::Dropped(why), (receiver, reason, true)))
            }
        }
    })
}

/// Why the producer stopped.
enum Stop {
    /// The client went away.
    Gone,
    /// The client took nothing for too long.
    Slow,
}

async fn produce(
    host: Arc<Host>,
    session_id: SessionId,
    after: Seq,
    sender: mpsc::Sender<Frame>,
    reason: Arc<Mutex<Option<String>>>,
) {
    let stall = host.config.slow_client;
    let send = |event: Frame| {
        let sender = sender.clone();
        async move {
            match sender.send_timeout(event, stall).await {
                Ok(()) => Ok(()),
                Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(Stop::Gone),
                Err(mpsc::error::SendTimeoutError::Timeout(_)) => Err(Stop::Slow),
            }
        }
    };
    let mut woken = host.feed.subscribe(session_id);
    let mut ping = tokio::time::interval(host.config.ping_interval);
    ping.tick().await;
    let result: Result<(), Stop> = async {
        // Replay and pending requests first: one read of the whole ledger.
        let events = match host.store.read(session_id, Seq(0)).await {
            Ok(events) => events,
            Err(error) => return send(Frame::Error(error.to_string())).await,
        };
        let mut last = after;
        for event in events.iter().filter(|event| event.seq > after) {
            send(ledger_event(event)).await?;
            last = event.seq;
        }
        for pending in ledger::pending(&events).iter().filter(|p| p.requested_seq <= after) {
            send(Frame::Pending(serde_json::to_string(pending).unwrap_or_default())).await?;
        }
        for question in ledger::questions(&events).iter().filter(|q| q.requested_seq <= after) {
            send(Frame::Question(serde_json::to_string(question).unwrap_or_default())).await?;
        }
        loop {
            tokio::select! {
                _ = woken.changed() => {}
                () = tokio::time::sleep(host.config.poll_interval) => {}
                _ = ping.tick() => {
                    send(Frame::Ping).await?;
                    continue;
                }
                () = sender.closed() => return Err(Stop::Gone),
            }
            let events = match host.store.read(session_id, last).await {
                Ok(events) => events,
                Err(error) => {
                    eprintln!("keel serve: cannot read session {session_id}: {error}");
                    continue;
                }
            };
            for event in &events {
                send(ledger_event(event)).await?;
                last = event.seq;
            }
        }
    }
    .await;
    if let Err(Stop::Slow) = result {
        *reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(format!(
            "slow client: no event taken for {}, so the host dropped the stream; reconnect \
             with Last-Event-ID to continue",
            keel_host::duration::human_duration(stall)
        ));
    }
}

/// One ledger event as a frame: the `RuntimeEvent` JSON of `keel log --json`.
fn ledger_event(event: &RuntimeEvent) -> Frame {
    Frame::Ledger {
        seq: event.seq,
        kind: event.kind.name(),
        json: serde_json::to_string(event).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use keel_contracts::{EventKind, Store};

    use super::*;
    use crate::config::ServeConfig;

    fn turn(session_id: SessionId, seq: u64) -> RuntimeEvent {
        RuntimeEvent {
            seq: Seq(seq),
            session_id,
            turn_id: None,
            run_id: None,
            ts: chrono::DateTime::UNIX_EPOCH,
            kind: EventKind::TurnStarted { input: format!("input {seq}") },
        }
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_dropped_with_a_reason_and_memory_stays_bounded() {
        let store = Arc::new(keel_testkit::MemStore::new());
        let session_id = SessionId(uuid::Uuid::from_u128(7));
        let events: Vec<RuntimeEvent> = (1..=50).map(|seq| turn(session_id, seq)).collect();
        store.append(&events).await.unwrap();
        let home = tempfile::tempdir().unwrap();
        let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), Vec::new());
        config.sse_buffer = 4;
        config.slow_client = Duration::from_millis(200);
        config.poll_interval = Duration::from_millis(20);
        let host = Arc::new(Host::new(store, home.path().to_path_buf(), config));

        // A client that reads along gets everything, in order.
        let reader: Vec<Frame> = frames(host.clone(), session_id, Seq(0)).take(50).collect().await;
        let seqs: Vec<u64> = reader
            .iter()
            .filter_map(|frame| match frame {
                Frame::Ledger { seq, .. } => Some(seq.0),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, (1..=50).collect::<Vec<_>>());

        // A client that takes nothing: the host buffers 4 frames, then gives up.
        let stalled = frames(host, session_id, Seq(0));
        tokio::time::sleep(Duration::from_millis(600)).await;
        let rest: Vec<Frame> = stalled.collect().await;
        assert_eq!(rest.len(), 5, "{rest:?}");
        assert!(rest[..4].iter().all(|frame| matches!(frame, Frame::Ledger { .. })));
        match &rest[4] {
            Frame::Dropped(why) => assert!(why.starts_with("slow client"), "{why}"),
            other => panic!("expected a dropped frame, got {other:?}"),
        }
    }
}
