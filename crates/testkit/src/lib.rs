//! keel-testkit: dev-only helpers for keel's tests.
//!
//! - [`FakeClock`] and [`SeqIds`] make ledgers byte-stable across runs: timestamps start at
//!   2026-01-01T00:00:00Z and step 1 ms per reading, ids count up from
//!   `00000000-0000-7000-8000-000000000001`.
//! - [`MemStore`] is the in-memory reference implementation of [`keel_contracts::Store`];
//!   every other store must behave exactly like it.
//! - [`FaultyStore`] wraps any store and fails appends on command (disk full, fsync), for
//!   the kernel's fault tests.
//! - [`CountingStore`] wraps any store and records each durable commit (the event kinds of
//!   every acknowledged append), for the kernel's group-commit tests.
//! - [`conformance`] is the one generic store suite that `MemStore`, SQLite and PostgreSQL
//!   all run.
//! - `postgres` (feature `postgres`) starts a throwaway PostgreSQL server per test binary
//!   and hands each test a fresh database.
//!
//! Invariant: this crate depends on keel-contracts and the scripted model (keel-providers
//! without default features), never on keel-kernel or a concrete store, so any crate may
//! dev-depend on it without a cycle.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod clock;
pub mod conformance;
mod counting_store;
mod faulty_store;
mod ids;
mod mem_store;
#[cfg(feature = "postgres")]
pub mod postgres;

pub use clock::FakeClock;
pub use counting_store::CountingStore;
pub use faulty_store::{Fault, FaultyStore};
pub use ids::SeqIds;
/// The scripted model of DESIGN.md §9, for tests that drive a kernel (re-exported so
/// keel-kernel's tests need no adapter crate).
pub use keel_providers::ScriptedModel;
pub use mem_store::MemStore;
