//! Errors of this crate. Store operations report keel-contracts' per-operation errors
//! (`AppendError`, `ReadError`, `ResolveError`); opening a store reports [`OpenError`].

use std::path::PathBuf;

/// Opening a ledger failed. Nothing was changed, except that missing parent directories
/// may have been created and an empty ledger (file or database) may have been initialized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The ledger's parent directory could not be created.
    #[error("cannot create directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The ledger's folder (KEEL_HOME) exists and is not a directory: a file, FIFO or
    /// device there is refused before anything is created beside or inside it.
    #[error("cannot keep the ledger in {path}: it is {kind}, not a directory")]
    NotADirectory {
        /// The would-be folder.
        path: PathBuf,
        /// What it is: `a file`, `a FIFO (named pipe)`, `a device`, ….
        kind: &'static str,
    },
    /// The ledger file did not exist and could not be created (mode 0600).
    #[error("cannot create ledger file {path}")]
    CreateFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The ledger (or its `-wal`, `-shm` or `-journal` file) is not a regular file: a FIFO,
    /// device or folder there would hang or break SQLite's open, so it is refused unopened.
    #[error("ledger {path} is not a regular file (it is {kind}); keel never opens it")]
    NotRegular {
        /// The offending file.
        path: PathBuf,
        /// What it is: `a FIFO (named pipe)`, `a directory`, `a device`, ….
        kind: &'static str,
    },
    /// The ledger's folder cannot be written (a read-only KEEL_HOME) and the ledger cannot
    /// be read without writing beside it (its `-wal` must be indexed in a `-shm` SQLite
    /// cannot create there).
    #[error("ledger {path} cannot be read: its folder (KEEL_HOME) cannot be written and {why}")]
    ReadOnlyHome {
        /// The ledger file.
        path: PathBuf,
        /// What would need writing.
        why: String,
    },
    /// SQLite could not open, configure or migrate the file.
    #[error("cannot open ledger {path}")]
    Sqlite {
        /// The ledger file (`:memory:` for an in-memory ledger).
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The file system refused write-ahead logging (some network file systems do), so
    /// several processes could not share the ledger safely.
    #[error("ledger {path} cannot use write-ahead logging (journal mode stayed {journal_mode})")]
    NoWal {
        /// The ledger file.
        path: PathBuf,
        /// The journal mode SQLite kept.
        journal_mode: String,
    },
    /// The file was written by a newer keel; this one would misread it.
    #[error("ledger {path} has schema version {found}, newer than the supported {supported}")]
    NewerSchema {
        /// The ledger file.
        path: PathBuf,
        /// The version in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database URL does not parse. The URL itself is left out of the message: it may
    /// hold a password.
    #[error("invalid database url")]
    DatabaseUrl {
        /// The parser's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// PostgreSQL could not be reached, or refused to connect or to migrate the ledger.
    #[error("cannot open ledger {target}")]
    Postgres {
        /// `user@host:port/dbname` (never the password).
        target: String,
        /// The client's or the server's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database was migrated by a newer keel; this one would misread it.
    #[error("ledger {target} has schema version {found}, newer than the supported {supported}")]
    NewerDatabaseSchema {
        /// `user@host:port/dbname` (never the password).
        target: String,
        /// The version in the database.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
}
