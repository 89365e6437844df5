//! keel-eval: experiments over Harbor tasks (DESIGN.md §9 "Eval").
//!
//! An experiment is tasks × subjects × repetitions, stored under its `--out DIR`:
//! [`task`] reads Harbor task folders and datasets, [`environment`] turns a task's
//! `environment/` into a fresh workspace (host mode), [`attempt`] runs one attempt (the
//! subject, then the verifier) and classifies it, [`ledger`] keeps the immutable records
//! (experiment → cell → attempt → result) in `DIR/eval.sqlite`, [`trajectory`] projects an
//! agent session's ledger onto Harbor's ATIF `trajectory.json`, and [`report`] writes
//! `results.jsonl`, `report.md` and `report.html`. [`experiment`] ties them together:
//! [`run`] starts (or continues) an experiment, [`resume`] finishes an interrupted one.
//!
//! Invariants:
//! - An attempt is recorded as started before anything of it runs, and its result once;
//!   neither record is ever changed or deleted (the ledger's triggers refuse it).
//! - A cell (task, subject, repetition) is done once one of its attempts has a result; the
//!   earliest such attempt is the one that counts, so a re-run never replaces it.
//! - `infra_error` and `verifier_error` are never scored: they carry no reward and are
//!   left out of pass rates and mean rewards.
//! - Agents are ordinary keel sessions built by the one composition root
//!   (`keel_host::root`); this crate keeps no wiring of its own.
#![forbid(unsafe_code)]

pub mod attempt;
pub mod environment;
pub mod error;
pub mod experiment;
pub mod ledger;
pub mod report;
pub mod task;
pub mod trajectory;

pub use attempt::{AttemptRecord, Class};
pub use error::{Error, Result};
pub use experiment::{EvalContext, ExperimentSpec, Subject, Summary, resume, run};
