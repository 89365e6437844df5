//! keel-store: the durable ledger behind [`keel_contracts::Store`].
//!
//! [`SqliteStore`] is the default store: one embedded SQLite file per `KEEL_HOME`
//! ([`default_path`]), in WAL mode with `synchronous=FULL`, so an append that returned `Ok`
//! survives a crash or power loss, and several keel processes can share the file.
//!
//! Invariants every store keeps (and `keel_testkit::conformance` checks):
//! - Per session, seqs start at 1 and have no gaps; a batch commits wholly or not at all.
//! - A stored event is never replaced: re-appending byte-identical JSON is a no-op,
//!   anything else at a stored seq is [`keel_contracts::AppendError::SeqConflict`].
//! - A record that does not decode fails the read with
//!   [`keel_contracts::ReadError::Corrupt`]; nothing is skipped silently.
//! - The session listing is maintained in the same transaction as the events it
//!   summarizes, so it never disagrees with the ledger.
//!
//! Backends:
//!
//! | backend    | type            | feature                                      |
//! |------------|-----------------|----------------------------------------------|
//! | SQLite     | [`SqliteStore`] | always built (becomes `sqlite`, default, when a second backend lands) |
//! | PostgreSQL | not yet         | `postgres` (planned)                         |
//!
//! Entry points: [`SqliteStore::open`], [`SqliteStore::open_in_memory`], [`default_path`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod sqlite;
mod summary;

pub use error::OpenError;
pub use sqlite::{BUSY_TIMEOUT, SCHEMA_VERSION, SqliteStore, default_path};
