//! Errors: a sink's configuration, opening a mirror, and one delivery attempt.

use std::path::PathBuf;

use keel_contracts::{Seq, SessionId};

/// An `[[outbox]]` table is invalid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The name cannot name a cursor file.
    #[error(
        "outbox sink name '{name}' is invalid: use 1 to 64 letters, digits, '-' or '_', \
         starting with a letter or digit"
    )]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// Two sinks share a name (and so would share a cursor file).
    #[error("outbox sink '{name}' is declared twice")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// A key the kind needs is missing.
    #[error("outbox sink '{sink}' ({kind}) needs `{key}`")]
    MissingKey {
        /// The sink.
        sink: String,
        /// Its kind.
        kind: &'static str,
        /// The missing key.
        key: &'static str,
    },
    /// A key does not apply to the kind.
    #[error("outbox sink '{sink}' ({kind}) does not take `{key}`")]
    UnexpectedKey {
        /// The sink.
        sink: String,
        /// Its kind.
        kind: &'static str,
        /// The key that does not apply.
        key: &'static str,
    },
    /// A JSON-lines path is relative (it would depend on the current directory).
    #[error("outbox sink '{sink}': path {} must be absolute", path.display())]
    RelativePath {
        /// The sink.
        sink: String,
        /// The path given.
        path: PathBuf,
    },
    /// A webhook URL does not parse or is not http(s).
    #[error("outbox sink '{sink}': invalid url: {reason}")]
    InvalidUrl {
        /// The sink.
        sink: String,
        /// Why.
        reason: String,
    },
    /// A number is out of range (`max_batch` or `timeout_ms` of 0).
    #[error("outbox sink '{sink}': `{key}` must be positive")]
    NotPositive {
        /// The sink.
        sink: String,
        /// The key.
        key: &'static str,
    },
    /// An `otlp` sink's headers are invalid (the reason names a header, never its value).
    #[error("outbox sink '{sink}': invalid headers: {reason}")]
    InvalidHeaders {
        /// The sink.
        sink: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("outbox sink '{sink}': cannot build the HTTP client: {message}")]
    HttpClient {
        /// The sink.
        sink: String,
        /// The client's message.
        message: String,
    },
}

/// A mirror could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// A sink's configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cursor folder cannot be created.
    #[error("cannot create the outbox folder {}: {message}", path.display())]
    CursorDir {
        /// The folder.
        path: PathBuf,
        /// The I/O error.
        message: String,
    },
    /// A cursor file cannot be read, does not decode, or cannot be created.
    #[error("outbox cursor file {}: {message}", path.display())]
    Cursor {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// One delivery attempt failed; the events are sent again later.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// Writing a JSON-lines file failed (nothing of the batch is left in it).
    #[error("cannot append to {}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        message: String,
    },
    /// The endpoint (webhook or OTLP collector) answered with a status other than 2xx.
    #[error("endpoint answered {status}")]
    Status {
        /// The HTTP status.
        status: u16,
    },
    /// The endpoint could not be reached, or the request timed out.
    #[error("request failed: {message}")]
    Transport {
        /// The transport's message.
        message: String,
    },
    /// An event does not serialize.
    #[error("cannot serialize event #{seq} of session {session_id}: {message}")]
    Serialize {
        /// The session.
        session_id: SessionId,
        /// The event.
        seq: Seq,
        /// The serializer's message.
        message: String,
    },
    /// Reading the session from the ledger failed.
    #[error("cannot read session {session_id} from the ledger: {message}")]
    Read {
        /// The session.
        session_id: SessionId,
        /// The store's message.
        message: String,
    },
    /// The batch was delivered but its cursor could not be written (it is sent again
    /// after a restart).
    #[error("cannot write the outbox cursor file {}: {message}", path.display())]
    Cursor {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        message: String,
    },
}
