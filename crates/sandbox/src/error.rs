//! Why a command could not be carried out.

use std::io;
use std::path::PathBuf;

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, SandboxError>;

/// Why [`run`](crate::run) could not carry out a command.
///
/// A command that ran and exited non-zero, was killed by a signal or timed out is not an
/// error: it is a [`CommandOutput`](crate::CommandOutput) with its
/// [`Termination`](crate::Termination).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// Managed containment cannot be enforced here, so nothing was run (fail closed).
    #[error("managed sandbox cannot be enforced ({missing}); the command was not run")]
    Unenforceable {
        /// What is missing, e.g. `landlock abi 4 or newer`.
        missing: String,
    },
    /// An extra boundary path ([`CommandSpec::allow_read`](crate::CommandSpec::allow_read),
    /// [`CommandSpec::allow_write`](crate::CommandSpec::allow_write)) cannot be granted: it
    /// does not exist, cannot be resolved to a canonical path, or lies inside a protected
    /// path. Nothing was run.
    #[error("boundary path {} cannot be granted ({reason}); the command was not run", path.display())]
    BoundaryPath {
        /// The path as given.
        path: PathBuf,
        /// Why, e.g. `No such file or directory (os error 2)`.
        reason: String,
    },
    /// The working directory does not exist or is not a directory.
    #[error("working directory {} is not a directory", cwd.display())]
    BadWorkingDirectory {
        /// The directory asked for.
        cwd: PathBuf,
    },
    /// The process could not be started (program not found, not executable, ...).
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program asked for.
        program: String,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// Waiting for the process failed.
    #[error("cannot wait for {program}: {source}")]
    Wait {
        /// The program asked for.
        program: String,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
}
