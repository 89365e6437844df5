//! The kernel's error type: `Err` means the runtime cannot continue; normal endings are
//! [`TurnOutcome`](crate::TurnOutcome)s.

use keel_contracts::{AppendError, ReadError, SessionId};

/// Why the kernel could not carry out a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The ledger refused a write; the run is not recorded past this point.
    #[error(transparent)]
    Append(#[from] AppendError),
    /// The ledger could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// No such session in the store.
    #[error("session {0} does not exist")]
    SessionNotFound(SessionId),
    /// The session's ledger does not start with `session_created`.
    #[error("session {session_id} is malformed: {reason}")]
    MalformedSession {
        /// The session.
        session_id: SessionId,
        /// What is wrong.
        reason: String,
    },
    /// The session is sealed and never runs agent code again.
    #[error("session {0} is sealed; it never runs agent code again")]
    Sealed(SessionId),
    /// Another process drives the session (its lease has not expired).
    #[error("session {session_id} is being driven by {holder} until {until}; try again later")]
    Leased {
        /// The session.
        session_id: SessionId,
        /// Who holds the lease.
        holder: String,
        /// When it lapses (RFC 3339).
        until: String,
    },
    /// The lease could not be taken or kept.
    #[error(transparent)]
    Lease(#[from] keel_contracts::LeaseError),
    /// A per-run tool (`activate_skill`, `submit`) could not be registered.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// `resume` without new input found nothing to continue: no turn is open (the last one
    /// ended, or the process was killed before the first task was recorded).
    #[error(
        "session {0} has nothing to resume: no turn of it is open (its last turn ended, or \
         none was recorded); give a task"
    )]
    NothingToResume(SessionId),
    /// `resume` found the session's run parked on `wait`: only its wake resumes it.
    #[error("session {session_id} waits for a wake: keel wake {wake_id} [PAYLOAD] resumes it")]
    Waiting {
        /// The session.
        session_id: SessionId,
        /// The wake id its run waits for.
        wake_id: String,
    },
    /// `wake` found no run parked on a wait with the given wake id.
    #[error("session {session_id} is not waiting for this wake: {reason}")]
    NotWaiting {
        /// The session.
        session_id: SessionId,
        /// Why.
        reason: String,
    },
    /// `approve_plan` on a session that has no plan to approve (not created in plan mode,
    /// no plan-mode run completed yet, or its plan was approved already).
    #[error(
        "session {0} has no plan to approve: it is not in plan mode, no plan-mode run of it \
         has completed yet, or its plan was approved"
    )]
    NotPlanning(SessionId),
}

/// The kernel's result type.
pub type Result<T> = std::result::Result<T, KernelError>;

/// A tool could not be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two tools share a name.
    #[error("duplicate tool name '{0}'")]
    Duplicate(String),
    /// A workspace or MCP tool claims to be intrinsic; only keel's own tools are.
    #[error("tool '{0}' claims to be intrinsic; only keel's own tools are")]
    ClaimsIntrinsic(String),
    /// A tool registered as intrinsic whose spec does not say `intrinsic: true`.
    #[error("tool '{0}' is registered as intrinsic, but its spec does not say so")]
    NotIntrinsic(String),
    /// A tool's parameter schema does not compile.
    #[error("tool '{tool}' has an invalid parameter schema: {message}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// The schema compiler's message.
        message: String,
    },
}
