//! Why an experiment cannot be started or continued. What goes wrong inside one attempt
//! is not an error: it is that attempt's class (`infra_error`, `verifier_error`, ...).

use std::path::PathBuf;

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Why an experiment cannot be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The experiment as given is unusable (no tasks, no subjects, zero repetitions, a
    /// different experiment already in the output folder).
    #[error("{0}")]
    Usage(String),
    /// A file of the experiment could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The eval ledger (`DIR/eval.sqlite`) could not be read or written.
    #[error("eval ledger {}: {source}", path.display())]
    Ledger {
        /// The ledger file.
        path: PathBuf,
        /// SQLite's reason.
        #[source]
        source: rusqlite::Error,
    },
    /// A record in the eval ledger does not parse (written by another version, or edited).
    #[error("eval ledger {}: record {what} does not parse: {reason}", path.display())]
    Record {
        /// The ledger file.
        path: PathBuf,
        /// Which record.
        what: String,
        /// Why.
        reason: String,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { path: path.into(), source }
    }
}
