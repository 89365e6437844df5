//! The store conformance suite: one set of behaviours every [`Store`] must show.
//!
//! A backend plugs in through [`StoreFactory`] and runs [`run_all`]; `MemStore`, SQLite and
//! PostgreSQL all run the same cases, so "identical semantics" is checked, not hoped for.
//!
//! ```
//! use std::sync::Arc;
//!
//! use keel_contracts::{Seq, SessionId, Store};
//! use keel_testkit::MemStore;
//! use keel_testkit::conformance::{self, StoreFactory};
//!
//! struct MemStoreFactory;
//!
//! #[async_trait::async_trait]
//! impl StoreFactory for MemStoreFactory {
//!     type Ledger = MemStore;
//!     async fn create(&self) -> MemStore {
//!         MemStore::new()
//!     }
//!     async fn open(&self, ledger: &MemStore) -> Arc<dyn Store> {
//!         Arc::new(ledger.clone())
//!     }
//!     async fn corrupt(&self, ledger: &MemStore, session_id: SessionId, seq: Seq, garbage: &str) {
//!         assert!(ledger.corrupt(session_id, seq, garbage));
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! conformance::run_all(&MemStoreFactory).await;
//! # });
//! ```
//!
//! The cases pin these choices, which every backend must share:
//! - Seqs start at 1 and are contiguous; a gap or a wrong start is
//!   [`AppendError::SeqConflict`] carrying the seq the store expected; seq 0, mixed
//!   sessions or a non-contiguous batch are [`AppendError::InvalidBatch`].
//! - Re-appending events byte-identical (serialized JSON) to the stored ones is a no-op;
//!   a batch may overlap the stored tail and extend it. A different event at a stored seq
//!   is `SeqConflict`. A failing batch writes nothing.
//! - `read` is all-or-nothing over its range: an undecodable record (or one whose body
//!   names another seq or session) fails the read with [`ReadError::Corrupt`] and the
//!   lowest bad seq; nothing is skipped. Events past it are read with `after` set to the
//!   bad seq; the events before it stay intact (an identical re-append of them is still a
//!   no-op) and a corrupt record is never overwritten.
//! - Sessions list newest `created_at` first (ties: larger id first). The status follows
//!   the last run event, sealing is final, the title is the first non-empty turn input
//!   with whitespace collapsed, cut to 80 characters ending in `…`. The row carries the
//!   session's usage totals: every `model_response` folded with `UsageTotals::add`.
//! - `read_kinds` returns exactly the events of the given kinds up to the bound, in seq
//!   order; `last_of_kind` the latest of one kind; `last_tool_result` the latest
//!   `tool_result` of the session for exactly that call id.
//! - A session prefix is case-insensitive hex with optional dashes; an empty or non-hex
//!   prefix matches nothing.
//! - A cancel request is taken exactly once; requesting twice before a take is one request.
//! - One lease holder at a time until the lease lapses; fencing tokens only grow (release
//!   keeps the token); an append under a lease older than the newest is `Fenced` and
//!   writes nothing.

mod append;
mod cancel;
mod durability;
mod leases;
mod read;
mod sessions;

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{
    AppendError, Clock, Envelope, EventKind, ExecutionMode, Lineage, ReadError, RunId,
    RuntimeEvent, Seq, SessionId, Store, ToolCallId, TurnId,
};
use uuid::Uuid;

use crate::{FakeClock, SeqIds};

/// How the suite gets stores of one backend.
///
/// A *ledger* is the backing storage (a temp file, a database schema, a shared
/// `MemStore`); a *handle* is one open [`Store`] on it. The suite opens several handles on
/// one ledger to test reopening and concurrent writers.
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// The backing storage; dropping it may delete everything.
    type Ledger: Send + Sync;

    /// Creates an empty ledger.
    async fn create(&self) -> Self::Ledger;

    /// Opens a new handle on `ledger`. Called again after earlier handles were dropped, to
    /// check that everything survived.
    async fn open(&self, ledger: &Self::Ledger) -> Arc<dyn Store>;

    /// Overwrites the stored record of `seq` with `garbage`, bypassing the store's API (raw
    /// SQL for a database), as disk corruption or a bad migration would.
    async fn corrupt(&self, ledger: &Self::Ledger, session_id: SessionId, seq: Seq, garbage: &str);
}

/// Runs every case, each on a fresh ledger, printing each case's name to stderr first so
/// a failure names its case.
///
/// # Panics
///
/// When the store breaks the contract; the message says how.
pub async fn run_all<F: StoreFactory>(factory: &F) {
    macro_rules! cases {
        ($($module:ident :: $case:ident),* $(,)?) => {$(
            eprintln!("store conformance: {}::{}", stringify!($module), stringify!($case));
            $module::$case(factory).await;
        )*};
    }
    cases!(
        append::empty_batch_is_a_no_op,
        append::seq_starts_at_one,
        append::seq_is_contiguous,
        append::identical_reappend_is_a_no_op,
        append::different_event_at_a_stored_seq_conflicts,
        append::a_failing_batch_writes_nothing,
        read::read_returns_events_after_the_bound,
        read::reads_by_kind_select_exactly_those_events,
        read::tool_results_are_found_by_call_id,
        sessions::sessions_list_newest_first_with_status_and_title,
        sessions::title_is_collapsed_and_truncated,
        sessions::sealing_is_final,
        sessions::usage_totals_are_kept_in_the_listing,
        sessions::prefix_resolution,
        cancel::cancel_request_is_taken_once,
        durability::reopen_keeps_everything,
        durability::corrupt_record_fails_the_read_and_is_never_skipped,
        durability::two_handles_append_to_different_sessions_concurrently,
        durability::two_handles_racing_for_one_seq_one_wins,
        leases::one_holder_at_a_time_and_tokens_only_grow,
        leases::appends_are_fenced_by_the_newest_lease,
        leases::the_current_lease_is_read_without_taking_it,
    );
}

/// Builds events with distinct, increasing timestamps.
#[derive(Debug)]
struct Events {
    clock: FakeClock,
}

impl Events {
    fn new() -> Events {
        Events { clock: FakeClock::new() }
    }

    fn event(&self, session_id: SessionId, seq: u64, kind: EventKind) -> RuntimeEvent {
        RuntimeEvent {
            seq: Seq(seq),
            session_id,
            turn_id: Some(TurnId(Uuid::from_u128(0xA0 + u128::from(seq)))),
            run_id: None,
            ts: self.clock.now(),
            kind,
        }
    }

    fn created(&self, session_id: SessionId, workspace: &str) -> RuntimeEvent {
        self.event(session_id, 1, created_kind(workspace, None))
    }

    /// Seq 1 is `session_created`, the rest are `model_requested` with distinct contents.
    fn chain(&self, session_id: SessionId, len: u64) -> Vec<RuntimeEvent> {
        let mut events = vec![self.created(session_id, "/work/repo")];
        events.extend((2..=len).map(|seq| self.filler(session_id, seq)));
        events
    }

    fn filler(&self, session_id: SessionId, seq: u64) -> RuntimeEvent {
        self.event(session_id, seq, filler_kind(seq, "original"))
    }
}

fn created_kind(workspace: &str, parent: Option<SessionId>) -> EventKind {
    EventKind::SessionCreated {
        workspace: workspace.to_owned(),
        model: "scripted:fix.json".to_owned(),
        envelope: Envelope::executor(),
        mode: ExecutionMode::Live,
        base_url: None,
        lineage: parent.map(|parent_session_id| Lineage {
            parent_session_id,
            parent_run_id: RunId(Uuid::from_u128(1)),
            parent_turn_id: TurnId(Uuid::from_u128(2)),
            parent_call_id: ToolCallId::from("c1"),
        }),
    }
}

fn filler_kind(seq: u64, variant: &str) -> EventKind {
    EventKind::ModelRequested {
        step: u32::try_from(seq).unwrap_or(u32::MAX),
        messages: seq,
        request_sha256: format!("{variant}-{seq}"),
        tokens: None,
        tokens_before_pruning: None,
        pruned_results: 0,
        purpose: keel_contracts::RequestPurpose::Conversation,
    }
}

/// A `run_started` with the defaults of every field the stores do not read, built from its
/// wire form so the suite does not churn when run parameters are added.
fn run_started() -> EventKind {
    let wire = serde_json::json!({
        "kind": "run_started",
        "mode": "live",
        "sandbox": "managed",
        "approval": "auto",
    });
    must(serde_json::from_value(wire), "run_started from its wire form")
}

fn session(n: u64) -> SessionId {
    SessionId(SeqIds::nth(n))
}

/// Unwraps `result` or panics naming `what` (the suite is test code inside a library, where
/// `unwrap` is linted out).
#[track_caller]
fn must<T, E: Debug>(result: Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{what}: unexpected error {error:?}"),
    }
}

#[track_caller]
fn assert_conflict(
    result: Result<(), AppendError>,
    session_id: SessionId,
    expected: u64,
    got: u64,
) {
    match result {
        Err(AppendError::SeqConflict { session_id: s, expected: e, got: g }) => {
            assert_eq!((s, e, g), (session_id, Seq(expected), Seq(got)), "SeqConflict fields");
        }
        other => panic!("expected SeqConflict(expected {expected}, got {got}), got {other:?}"),
    }
}

#[track_caller]
fn assert_invalid_batch(result: Result<(), AppendError>) {
    match result {
        Err(AppendError::InvalidBatch { .. }) => {}
        other => panic!("expected InvalidBatch, got {other:?}"),
    }
}

#[track_caller]
fn assert_corrupt(result: Result<Vec<RuntimeEvent>, ReadError>, session_id: SessionId, seq: u64) {
    match result {
        Err(ReadError::Corrupt { session_id: s, seq: q, .. }) => {
            assert_eq!((s, q), (session_id, Seq(seq)), "Corrupt fields");
        }
        other => panic!("expected Corrupt at seq {seq}, got {other:?}"),
    }
}

async fn read_all(store: &dyn Store, session_id: SessionId) -> Vec<RuntimeEvent> {
    must(store.read(session_id, Seq(0)).await, "read")
}
