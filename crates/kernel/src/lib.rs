//! keel-kernel: the durable, policy-gated turn loop (DESIGN.md §3).
//!
//! Entry points: [`Kernel::create_session`], [`Kernel::run_turn`] and [`Kernel::resume`];
//! [`Kernel::seal_session`] makes a session inert.
//! The kernel receives every adapter through [`KernelDeps`] and never names a concrete
//! store, provider or tool.
//! keel's own tools are intrinsics: each carries its calls out through its [`Intrinsic`]
//! hook, and the [`Registry`] lists which ones a kernel and a run offer; settlement names
//! none of them.
//!
//! Invariants:
//! - Every fact is appended to the ledger before anything depends on it; the next model
//!   request is projected from durable events only ([`projection`]).
//! - `tool_attempt_prepared` is durable before a tool is invoked; every tool call gets
//!   exactly one `tool_result`, whatever happens (refusal, cancel, crash recovery).
//! - Gate answers come from keel-contracts' pure decision functions and are recorded
//!   verbatim in `gate_decision`.
//! - Exactly one terminal event per run.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod cancel;
mod checkpoint;
mod children;
mod codemode;
mod command_line;
pub mod compaction;
mod config;
pub mod context;
pub mod digest;
mod elicit;
mod error;
mod failpoint;
mod intrinsic;
mod kernel;
mod lease;
mod ledger;
mod model_call;
mod outbox;
mod permission;
pub mod projection;
pub mod recovery;
mod registry;
mod repeats;
mod seal;
mod settlement;
pub mod skills;
mod steering;
mod wait;

pub use cancel::Cancellation;
pub use codemode::CodeLimits;
pub use elicit::question_id;
pub use error::{KernelError, RegistryError, Result};
pub use failpoint::{Failpoint, Failpoints, NoFailpoints};
pub use intrinsic::{Admitted, Carried, Intrinsic, IntrinsicCall, Parked};
pub use kernel::{
    DEFAULT_GRANT_TTL, DEFAULT_MAX_AGENT_DEPTH, Instruction, Kernel, KernelDeps, NoopObserver,
    Observer, RunConfig, RunReport, SessionConfig, Skill, SkillOrigin, Skills, TurnOutcome,
};
pub use lease::{HolderLiveness, LEASE_RENEW_EVERY, LEASE_TTL, UnknownLiveness};
pub use outbox::{NoOutbox, OUTBOX_FLUSH_TIMEOUT, Outbox};
pub use permission::{
    ElicitationQuestion, NOBODY_TO_ASK, PermissionHook, PermissionRequest, StaticPermissions,
    answer_by_policy,
};
pub use registry::{AgentTools, Registry};
pub use seal::APPROVED_PLAN_TASK;
pub use steering::{Joined, Steering, SteeringClosed};
pub use wait::{
    MAX_WAIT, TIMED_OUT, WAIT, WAITING_REASON, Waiting, WakeAnswer, same_wake_id, waiting,
    wake_session,
};
