//! keel-host: the one composition root (DESIGN.md §8) and what every surface shares.
//!
//! [`root`] turns config into a kernel: the store ([`root::open_store`]), the merged
//! settings ([`root::prepare`], with workspace trust: an untrusted `.keel/config.toml` only
//! narrows), the provider, built-in and MCP tools, the sandbox, the outbox, the lease
//! holder and its liveness ([`root::assemble`]) and startup repair ([`root::repair`]).
//! `keel run`, `keel resume`, `keel compact`, `keel serve` (keel-serve) and `keel acp`
//! (keel-acp) all build their kernel there; a surface parses its input, calls the root and
//! renders, nothing more.
//!
//! Beside the root, what the surfaces share: the config and workspace [`trust`], consent
//! ([`approval`]), the schedules' core ([`schedule`]), [`skills`], [`instructions`], usage
//! errors ([`error`]) and durations ([`duration`]), and neutralising outside text for a
//! terminal ([`terminal`]). The surfaces sit above this crate; nothing here names them.
//!
//! Invariants:
//! - No surface keeps its own copy of the wiring.
//! - Consent goes through one policy ([`approval::Approver`]); a surface only supplies
//!   the person it asks (the terminal, or remote approvals recorded in the ledger).
#![forbid(unsafe_code)]

pub mod approval;
pub mod config;
pub mod duration;
pub mod elicit;
pub mod error;
pub mod failpoints;
pub mod instructions;
pub mod mcp;
pub mod outbox;
pub mod plant_key;
pub mod pricing;
pub mod provider;
pub mod root;
pub mod safe_read;
pub mod schedule;
pub mod skills;
pub mod terminal;
pub mod tokens;
pub mod trust;
