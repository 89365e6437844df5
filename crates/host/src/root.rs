//! The composition root (DESIGN.md §8): config → store, provider, tools, sandbox, MCP,
//! outbox, kernel, lease holder and liveness, startup repair. `keel run`, `keel resume`,
//! `keel compact` and `keel serve` all build their kernel here; none keeps a copy.
//!
//! A surface hands in what only it knows: the [`RunSettings`] it parsed (flags, a request
//! body), who answers a consent question when a person must (the terminal prompt, the
//! host's remote approvals), and the observer that shows the run.
//!
//! By concern: `store` opens the ledger, `workspace` makes the workspace canonical,
//! `settings` resolves a run's settings against the config, `assemble` builds its kernel,
//! `lease` names lease holders and their liveness, `repair` closes runs dead processes
//! left open.

mod assemble;
mod lease;
mod repair;
mod settings;
mod store;
mod workspace;

pub use assemble::{Assembly, assemble, build_kernel, check_tool_names};
pub use lease::{LocalProcesses, gone_holder, lease_holder, shown_state};
pub use repair::{inert_kernel, repair};
pub use settings::{
    Prepared, Resolved, RunSettings, SessionFacts, output_schema, prepare, resolve,
};
pub use store::{open_store, open_store_for_reading, open_stores};
pub use workspace::canonical_workspace;
