//! keel-store: the durable ledger behind [`keel_contracts::Store`].
//!
//! `SqliteStore` is the default store: one embedded SQLite file per `KEEL_HOME`
//! (`default_path`), in WAL mode with `synchronous=FULL`, so an append that returned `Ok`
//! survives a crash or power loss, and several keel processes can share the file.
//! `PgStore` keeps the ledger in PostgreSQL, for several hosts sharing one ledger.
//!
//! Invariants every store keeps (and `keel_testkit::conformance` checks):
//! - Per session, seqs start at 1 and have no gaps; a batch commits wholly or not at all.
//! - A stored event is never replaced: re-appending byte-identical JSON is a no-op,
//!   anything else at a stored seq is [`keel_contracts::AppendError::SeqConflict`].
//! - A record that does not decode fails the read with
//!   [`keel_contracts::ReadError::Corrupt`]; nothing is skipped silently.
//! - The session listing is maintained in the same transaction as the events it
//!   summarizes, so it never disagrees with the ledger.
//! - Two writers (handles, processes, hosts) never interleave the check and the insert of
//!   an append to one session: one wins each seq, the other gets `SeqConflict`.
//!
//! Backends, each behind a cargo feature:
//!
//! | backend    | type          | feature              | entry points                                        |
//! |------------|---------------|----------------------|-----------------------------------------------------|
//! | SQLite     | `SqliteStore` | `sqlite` (default)   | `SqliteStore::open`, `SqliteStore::open_in_memory`, `default_path` |
//! | PostgreSQL | `PgStore`     | `postgres`           | `PgStore::connect`                                  |
//!
//! Both features may be on at once; the composition root (keel-cli, keel-host) picks one
//! at run time.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod record;
pub mod schedules;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod summary;

pub use error::OpenError;
#[cfg(feature = "postgres")]
pub use postgres::{
    CONNECT_TIMEOUT, IDLE_IN_TRANSACTION_TIMEOUT, LOCK_TIMEOUT, MAX_CONNECTIONS, PG_SCHEMA_VERSION,
    POOL_WAIT_TIMEOUT, PgStore,
};
pub use schedules::{FireRow, FireState, ScheduleRow, Schedules, SchedulesError, WakeRow};
#[cfg(feature = "sqlite")]
pub use sqlite::{BUSY_TIMEOUT, CANCEL_PROBE_TTL, SCHEMA_VERSION, SqliteStore, default_path};
