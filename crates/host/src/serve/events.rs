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

use super::ledger;
use super::state::Host;

/// The stream of `session_id`'s events after `after`.
pub(crate) fn stream(
    host: Arc<Host>,
    session_id: SessionId,
    after: Seq,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let (sender, receiver) = mpsc::channel::<Event>(host.config.sse_buffer.max(1));
    let reason: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    tokio::spawn(produce(host, session_id, after, sender, reason.clone()));
    futures::stream::unfold((receiver, reason, false), |(mut receiver, reason, ended)| async move {
        if ended {
            return None;
        }
        match receiver.recv().await {
            Some(event) => Some((Ok(event), (receiver, reason, false))),
            None => {
                let why = reason.lock().unwrap_or_else(PoisonError::into_inner).take()?;
                let data = serde_json::json!({"reason": why}).to_string();
                Some((Ok(Event::default().event("dropped").data(data)), (receiver, reason, true)))
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
    sender: mpsc::Sender<Event>,
    reason: Arc<Mutex<Option<String>>>,
) {
    let stall = host.config.slow_client;
    let send = |event: Event| {
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
            Err(error) => {
                let data = serde_json::json!({"reason": error.to_string()}).to_string();
                return send(Event::default().event("error").data(data)).await;
            }
        };
        let mut last = after;
        for event in events.iter().filter(|event| event.seq > after) {
            send(ledger_event(event)).await?;
            last = event.seq;
        }
        for pending in ledger::pending(&events).iter().filter(|p| p.requested_seq <= after) {
            let data = serde_json::to_string(pending).unwrap_or_default();
            send(Event::default().event("permission_pending").data(data)).await?;
        }
        loop {
            tokio::select! {
                _ = woken.changed() => {}
                () = tokio::time::sleep(host.config.poll_interval) => {}
                _ = ping.tick() => {
                    send(Event::default().comment(" ping")).await?;
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
            super::human_duration(stall)
        ));
    }
}

/// One ledger event as SSE.
fn ledger_event(event: &RuntimeEvent) -> Event {
    let data = serde_json::to_string(event).unwrap_or_default();
    Event::default().id(event.seq.0.to_string()).event(event.kind.name()).data(data)
}
