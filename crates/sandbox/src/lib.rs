//! keel-sandbox: the one place where keel starts processes (DESIGN.md §5).
//!
//! Every command keel runs goes through [`run`] with a [`CommandSpec`] and a
//! [`SandboxMode`]. A command runs non-interactively and is always cleaned up:
//!
//! - It starts in a new session (`setsid`): no controlling terminal, its own process
//!   group. Its stdin is `/dev/null`, so a prompt reads end-of-file instead of waiting.
//! - The environment gets non-interactive defaults ([`NON_INTERACTIVE_ENV`]), which the
//!   spec's own overrides may replace. In managed mode it is otherwise an allow-list
//!   ([`INHERITED_ENV`], `LC_*`, [`CommandSpec::inherit_env`]), never keel's whole
//!   environment.
//! - Completion is keyed on the exit of the spawned process plus a short drain grace
//!   ([`DRAIN_GRACE`]), never on pipe end-of-file alone, so a background child holding the
//!   pipes cannot hang the call.
//! - **Leftover policy:** when the call ends (exit, timeout or cancellation by dropping the
//!   future), the whole process group is killed with `SIGKILL`. Background jobs do not
//!   outlive the call. In bypass mode a process that deliberately leaves the group (its
//!   own `setsid`) escapes this kill; in managed mode leaving the group is refused.
//! - Output is captured per stream, capped (head and tail kept, the omitted byte count
//!   stated in the text) and converted to UTF-8 lossily.
//!
//! In [`SandboxMode::Managed`] the command is contained by the OS or not run at all
//! (module `managed`, threat model in `SECURITY.md`): Landlock confines the file system to
//! read-only system and toolchain paths plus the writable workspace
//! ([`CommandSpec::workspace`]) and a private temporary directory; seccomp refuses every
//! socket and the calls that could widen the boundary; a private mount namespace keeps git
//! hooks and config of every repository under the workspace, and `.keel/`, read-only; all
//! capabilities are dropped and `no_new_privs` is set. Everything is prepared in the parent
//! and applied in the child before `exec`, so no helper binary is needed. When any of it
//! cannot be enforced, [`run`] returns [`SandboxError::Unenforceable`] and nothing runs;
//! [`managed_support`] reports up front whether (and how far) it can be enforced.
//!
//! Also in managed mode: the command runs in its own PID namespace under a shim that kills
//! it when keel exits or is killed (`kill -9` included), so nothing it started outlives
//! keel; writable roots are `nosuid,nodev` and seccomp refuses set-id modes; credential
//! stores of the home folder are masked; other mounts of the workspace get its protected
//! view. Plants the mounts cannot prevent are recorded durably and repaired after the run
//! on every exit path, and after a crash by [`recover_plants`]. [`protected_path`] is the
//! one list of protected paths, shared with the file tools; [`is_credential_store`] names
//! the credential stores.
//!
//! A boundary the user widened on purpose (the kernel's `request_boundary`, recorded in the
//! ledger) reaches a command as extra exact paths and a network switch:
//! [`CommandSpec::allow_read`], [`CommandSpec::allow_write`], [`CommandSpec::allow_network`],
//! or a [`Boundary`] through [`CommandSpec::boundary`]. Extra paths are resolved to canonical
//! paths and granted by Landlock; one that does not exist is a
//! [`SandboxError::BoundaryPath`] and nothing runs. Protected paths inside an extra
//! writable path stay read-only. With the network allowed, IPv4 and IPv6 sockets work (no
//! Landlock TCP rule, no seccomp refusal for them); every other socket family stays
//! refused.
//!
//! [`SandboxMode::Bypass`] runs on the host by explicit user choice; the extra boundary
//! means nothing there.

mod boundary;
mod capture;
mod command;
mod error;
mod managed;
mod spec;
mod sys;

pub use boundary::Boundary;
pub use capture::CapturedText;
pub use command::{CommandOutput, DRAIN_GRACE, Termination, run};
pub use error::{Result, SandboxError};
pub use keel_contracts::SandboxMode;
pub use managed::{
    INHERITED_ENV, ManagedSupport, is_credential_store, managed_support, protected_path,
    recover_plants, set_plant_note_key,
};
pub use spec::{CommandSpec, DEFAULT_OUTPUT_CAP_BYTES, NON_INTERACTIVE_ENV};
