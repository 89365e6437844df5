//! Usage errors: what the CLI exits 2 for and the host answers 400, as one error type
//! ([`UsageError`]) that every module of the root raises ([`usage`], [`config_error`]) and
//! every surface tells apart from keel's own failures ([`is_usage`]).

/// A usage or configuration problem (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A usage or configuration error (the CLI's exit status 2, the host's 400).
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}

/// A configuration error (a [`usage`] error): `config: TEXT`, with control characters in
/// TEXT — a repository's rule, server name or value may hold a newline — shown escaped,
/// so it cannot forge lines on stderr.
pub fn config_error(text: impl std::fmt::Display) -> anyhow::Error {
    usage(format!("config: {}", crate::safe_read::visible(&text.to_string(), false)))
}

/// Whether `error` is a usage or configuration error (see [`usage`]).
pub fn is_usage(error: &anyhow::Error) -> bool {
    error.downcast_ref::<UsageError>().is_some()
}
