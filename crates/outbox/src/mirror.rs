//! The [`Mirror`]: delivers ledger events to its sinks in the background, with redrive,
//! and on demand ([`Mirror::flush`]).
//!
//! Each sink has a slot: its durable cursors and its failure state, behind one async lock.
//! Whoever delivers for a sink (the background task, a flush) holds that lock from the
//! ledger read to the cursor write, so two deliveries of one sink never interleave and a
//! cursor never moves past an event the sink did not acknowledge.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError};

use futures::future::join_all;
use keel_contracts::{Seq, SessionId, SessionStatus, Store};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{BuildContext, MirrorConfig, RetryPolicy, SinkConfig, SinkName};
use crate::cursor::CursorFile;
use crate::error::{ConfigError, DeliveryError, OpenError};
use crate::sink::Sink;

/// Mirrors a store's events to sinks. Dropping it stops the background task; what was
/// not delivered yet is delivered by the next mirror over the same cursor folder.
#[derive(Debug)]
pub struct Mirror {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// A sink that did not catch up with a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkLag {
    /// The sink.
    pub sink: SinkName,
    /// The session it is behind on.
    pub session_id: SessionId,
    /// The last seq it delivered of that session (`#0`: none).
    pub delivered: Seq,
    /// Why (a [`DeliveryError`]'s message).
    pub error: String,
}

#[derive(Debug)]
struct Shared {
    store: Arc<dyn Store>,
    poll_interval: std::time::Duration,
    retry: RetryPolicy,
    flush_attempts: u32,
    slots: Vec<Slot>,
    /// Per session, the highest seq known to be recorded: the sessions to deliver.
    known: std::sync::Mutex<BTreeMap<SessionId, Seq>>,
    wake: Notify,
}

#[derive(Debug)]
struct Slot {
    name: SinkName,
    sink: Arc<dyn Sink>,
    cursor_path: PathBuf,
    state: tokio::sync::Mutex<SlotState>,
}

#[derive(Debug)]
struct SlotState {
    cursors: CursorFile,
    /// Consecutive failed attempts.
    failures: u32,
    /// The background task leaves the sink alone until then.
    retry_at: Option<Instant>,
}

impl Mirror {
    /// Starts mirroring `store` to the sinks of `configs` (the user's `[[outbox]]`
    /// tables).
    ///
    /// # Errors
    ///
    /// [`OpenError::Config`] for an invalid table or a name used twice, else as
    /// [`Mirror::start`].
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn from_config(
        store: Arc<dyn Store>,
        configs: &[SinkConfig],
        config: MirrorConfig,
    ) -> Result<Mirror, OpenError> {
        let context = BuildContext { store: store.clone(), otlp_env: config.otlp_env.clone() };
        let sinks =
            configs.iter().map(|table| table.build(&context)).collect::<Result<Vec<_>, _>>()?;
        Mirror::start(store, sinks, config)
    }

    /// Starts mirroring `store` to `sinks`: opens (or starts) each sink's cursor file and
    /// spawns the background task, which first catches up sessions left behind by earlier
    /// processes (see the crate docs).
    ///
    /// # Errors
    ///
    /// [`OpenError::CursorDir`] when the cursor folder cannot be created,
    /// [`OpenError::Cursor`] when a cursor file cannot be read, decoded or created,
    /// [`OpenError::Config`] when two sinks share a name.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn start(
        store: Arc<dyn Store>,
        sinks: Vec<(SinkName, Arc<dyn Sink>)>,
        config: MirrorConfig,
    ) -> Result<Mirror, OpenError> {
        std::fs::create_dir_all(&config.cursor_dir).map_err(|error| OpenError::CursorDir {
            path: config.cursor_dir.clone(),
            message: error.to_string(),
        })?;
        let mut slots: Vec<Slot> = Vec::with_capacity(sinks.len());
        for (name, sink) in sinks {
            if slots.iter().any(|slot| slot.name == name) {
                return Err(ConfigError::DuplicateName { name: name.to_string() }.into());
            }
            let cursor_path = config.cursor_dir.join(format!("{name}.json"));
            let cursors = CursorFile::open(&cursor_path, &sink.target(), config.clock.now())?;
            let state = SlotState { cursors, failures: 0, retry_at: None };
            slots.push(Slot { name, sink, cursor_path, state: tokio::sync::Mutex::new(state) });
        }
        let shared = Arc::new(Shared {
            store,
            poll_interval: config.poll_interval,
            retry: config.retry,
            flush_attempts: config.flush_attempts.max(1),
            slots,
            known: std::sync::Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
        });
        let task = tokio::spawn(Shared::run(shared.clone()));
        Ok(Mirror { shared, task })
    }

    /// The sinks' names, in configuration order.
    pub fn sinks(&self) -> Vec<SinkName> {
        self.shared.slots.iter().map(|slot| slot.name.clone()).collect()
    }

    /// Records that `session_id` has events up to `seq` and wakes the background task.
    /// Cheap and non-blocking: call it for every event that became durable.
    pub fn notify(&self, session_id: SessionId, seq: Seq) {
        self.shared.note(session_id, seq);
        self.shared.wake.notify_one();
    }

    /// Delivers every event recorded for `session_id` so far to every sink, and returns
    /// the sinks that did not catch up (empty when all did). A failing sink is retried
    /// with backoff up to [`MirrorConfig::flush_attempts`] times, or once when it was
    /// failing already; the background task keeps redriving it afterwards.
    ///
    /// # Cancel safety
    ///
    /// If dropped, no cursor moved past an event its sink did not acknowledge; a batch
    /// in flight counts as not delivered and is sent again (at least once).
    pub async fn flush(&self, session_id: SessionId) -> Vec<SinkLag> {
        self.shared.note(session_id, Seq(0));
        self.shared.drive_all(&[(session_id, None)]).await
    }

    /// [`Mirror::flush`] for every session this mirror has seen (notified, flushed or
    /// caught up), for a process about to exit.
    ///
    /// # Cancel safety
    ///
    /// As [`Mirror::flush`].
    pub async fn flush_known(&self) -> Vec<SinkLag> {
        // Read each session rather than trust the noted seqs: a flushed session is noted
        // without one.
        let sessions: Vec<(SessionId, Option<Seq>)> =
            self.shared.known_sessions().into_iter().map(|(id, _)| (id, None)).collect();
        self.shared.drive_all(&sessions).await
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shared {
    fn note(&self, session_id: SessionId, seq: Seq) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = known.entry(session_id).or_default();
        *entry = (*entry).max(seq);
    }

    fn known_sessions(&self) -> Vec<(SessionId, Seq)> {
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.iter().map(|(id, seq)| (*id, *seq)).collect()
    }

    /// The background task: catch up, then deliver whenever woken or every poll
    /// interval, leaving failing sinks alone until their backoff ends.
    async fn run(self: Arc<Shared>) {
        self.catch_up().await;
        loop {
            let sessions: Vec<(SessionId, Option<Seq>)> =
                self.known_sessions().into_iter().map(|(id, seq)| (id, Some(seq))).collect();
            let retries =
                join_all(self.slots.iter().map(|slot| self.background_pass(slot, &sessions))).await;
            let poll_at = Instant::now() + self.poll_interval;
            let wake_at = retries.into_iter().flatten().fold(poll_at, Instant::min);
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// Notes the sessions earlier processes left behind: not running (a running session
    /// belongs to a live process, or is noted when it is resumed) and, for some sink,
    /// short of their last seq, or without a cursor and updated since the sink began.
    async fn catch_up(&self) {
        // Nothing to catch up from a ledger that cannot list; the sessions this process
        // touches are still delivered.
        let Ok(summaries) = self.store.sessions().await else { return };
        for slot in &self.slots {
            let state = slot.state.lock().await;
            for summary in &summaries {
                if summary.status == SessionStatus::Running {
                    continue;
                }
                let behind = match state.cursors.get(summary.id) {
                    Some(delivered) => delivered < summary.last_seq,
                    None => summary.updated_at >= state.cursors.since(),
                };
                if behind {
                    self.note(summary.id, summary.last_seq);
                }
            }
        }
    }

    /// One background attempt for `slot`, unless it is backing off; returns when it
    /// wants to be tried again.
    async fn background_pass(
        &self,
        slot: &Slot,
        sessions: &[(SessionId, Option<Seq>)],
    ) -> Option<Instant> {
        let mut state = slot.state.lock().await;
        if let Some(retry_at) = state.retry_at
            && retry_at > Instant::now()
        {
            return Some(retry_at);
        }
        let result = self.pass(slot, &mut state, sessions).await;
        self.record(&mut state, result.is_ok());
        state.retry_at
    }

    /// Every sink, concurrently, through [`Shared::drive`]; the lags of those that did
    /// not catch up.
    async fn drive_all(&self, sessions: &[(SessionId, Option<Seq>)]) -> Vec<SinkLag> {
        join_all(self.slots.iter().map(|slot| self.drive(slot, sessions)))
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Attempts `slot` until it delivered `sessions` or ran out of attempts, backing off
    /// in between.
    async fn drive(&self, slot: &Slot, sessions: &[(SessionId, Option<Seq>)]) -> Option<SinkLag> {
        // A sink that is down already gets one attempt: every terminal event waits for
        // a flush, and the background task keeps redriving it.
        let attempts = if slot.state.lock().await.failures >= self.flush_attempts {
            1
        } else {
            self.flush_attempts
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = {
                let mut state = slot.state.lock().await;
                let result = self.pass(slot, &mut state, sessions).await;
                self.record(&mut state, result.is_ok());
                result
            };
            match result {
                Ok(()) => return None,
                Err(lag) if attempt >= attempts => return Some(lag),
                Err(_) => tokio::time::sleep(self.retry.delay(attempt)).await,
            }
        }
    }

    fn record(&self, state: &mut SlotState, delivered: bool) {
        if delivered {
            state.failures = 0;
            state.retry_at = None;
        } else {
            state.failures = state.failures.saturating_add(1);
            state.retry_at = Some(Instant::now() + self.retry.delay(state.failures));
        }
    }

    /// Delivers each session's undelivered events to `slot`'s sink. A session whose
    /// ledger cannot be read is passed over (its events stay due); a sink failure ends
    /// the pass. `Some(seq)` with a session means nothing past `seq` is known to exist,
    /// so a cursor there needs no read.
    async fn pass(
        &self,
        slot: &Slot,
        state: &mut SlotState,
        sessions: &[(SessionId, Option<Seq>)],
    ) -> Result<(), SinkLag> {
        let mut unread = None;
        for &(session_id, known) in sessions {
            let delivered = state.cursors.get(session_id).unwrap_or_default();
            if known.is_some_and(|known| delivered >= known) {
                continue;
            }
            let lag = |state: &SlotState, error: DeliveryError| SinkLag {
                sink: slot.name.clone(),
                session_id,
                delivered: state.cursors.get(session_id).unwrap_or_default(),
                error: error.to_string(),
            };
            match self.deliver_session(slot, state, session_id).await {
                Ok(()) => {}
                Err(error @ DeliveryError::Read { .. }) => {
                    unread.get_or_insert_with(|| lag(state, error));
                }
                Err(error) => return Err(lag(state, error)),
            }
        }
        unread.map_or(Ok(()), Err)
    }

    /// Reads `session_id` after the sink's cursor and delivers it in batches, moving and
    /// writing the cursor after each acknowledged batch.
    async fn deliver_session(
        &self,
        slot: &Slot,
        state: &mut SlotState,
        session_id: SessionId,
    ) -> Result<(), DeliveryError> {
        let after = state.cursors.get(session_id).unwrap_or_default();
        let events = self
            .store
            .read(session_id, after)
            .await
            .map_err(|error| DeliveryError::Read { session_id, message: error.to_string() })?;
        for batch in events.chunks(slot.sink.max_batch().max(1)) {
            let Some(last) = batch.last() else { continue };
            slot.sink.deliver(batch).await?;
            state.cursors.advance(session_id, last.seq);
            let cursors = state.cursors.clone();
            let path = slot.cursor_path.clone();
            let cursor_error =
                |message: String| DeliveryError::Cursor { path: slot.cursor_path.clone(), message };
            tokio::task::spawn_blocking(move || cursors.write(&path))
                .await
                .map_err(|join| cursor_error(join.to_string()))?
                .map_err(|io| cursor_error(io.to_string()))?;
        }
        Ok(())
    }
}
