//! Why a network client could not be built. Failures of a model request are
//! [`ModelError`](keel_contracts::ModelError)s, mapped in `failure.rs`.

/// Why a network client could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("base url {base_url:?} is not an absolute http(s) url")]
    InvalidBaseUrl {
        /// The URL given.
        base_url: String,
    },
    /// The API key cannot be sent in an HTTP header (it has control characters or
    /// non-ASCII bytes). The key itself is not repeated here.
    #[error("api key contains characters that cannot be sent in an http header")]
    InvalidApiKey,
    /// A setting is out of the range the provider accepts.
    #[error("invalid {setting}: {reason}")]
    InvalidSetting {
        /// The configuration field, e.g. `thinking_budget_tokens`.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be set up (for example, no TLS roots).
    #[error("http client could not be built: {message}")]
    HttpClient {
        /// The HTTP library's message.
        message: String,
    },
}
