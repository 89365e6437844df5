//! What the client is answered with when keel cannot do what it asked: invalid params for
//! the client's mistakes (a usage error of the composition root included), an internal
//! error for keel's own, and outside text in them made one safe line.

use keel_contracts::SessionId;

/// The client asked for something keel refuses: invalid params, with `message` as data.
pub(crate) fn invalid_params(message: impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_params().data(serde_json::json!(message.to_string()))
}

/// keel could not do it: an internal error, with `message` as data.
pub(crate) fn internal(message: impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::internal_error().data(serde_json::json!(message.to_string()))
}

/// A root error: a usage error is the client's (invalid params), the rest keel's.
pub(crate) fn root_error(error: &anyhow::Error) -> agent_client_protocol::Error {
    let text = format!("{error:#}");
    let text = keel_host::terminal::neutralize(&text).into_owned();
    if keel_host::error::is_usage(error) { invalid_params(text) } else { internal(text) }
}

/// The session runs a turn, so it cannot be switched or loaded again now.
pub(crate) fn busy(id: SessionId) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_request().data(serde_json::json!(format!(
        "session {id} is running a turn: wait for it, or send session/cancel"
    )))
}

/// A prompt sent while the running turn ended: it did not join; the client sends it again.
pub(crate) fn ending() -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_request().data(serde_json::json!(
        "the running turn ended before this prompt could join it; send it again"
    ))
}

/// Outside text (a title, an id, an error) as one line of at most 200 characters, neutralised.
pub(crate) fn one_line(text: &str) -> String {
    keel_host::terminal::one_line(text, 200)
}
