//! The one mapping from provider failures to [`ModelError`], shared by every network
//! client: HTTP status plus error body, errors carried inside a stream, and `Retry-After`.
//!
//! Error body formats:
//! - OpenAI (Chat Completions and Responses), "Error codes"
//!   (<https://platform.openai.com/docs/guides/error-codes>): `{"error": {"message", "type",
//!   "param", "code"}}`; Responses streams also carry `{"type": "error", "code", "message"}`
//!   events and a `response.failed` whose `response.error` is `{"code", "message"}`.
//! - Anthropic, "Errors" (<https://docs.anthropic.com/en/api/errors>): `{"type": "error",
//!   "error": {"type": "invalid_request_error", "message"}}`, with the same shape in an
//!   `event: error` frame of a 200 stream (e.g. `overloaded_error`).
//!
//! Compatible servers vary (`code` may be a number, the error may be a bare string,
//! `status_code` may be present), so bodies are read leniently.
//!
//! Invariant: every message that leaves this module has the API key removed.

use std::time::{Duration, SystemTime};

use keel_contracts::{ModelError, ModelErrorKind};
use serde_json::Value;

use crate::retry::Failure;

/// The longest provider message kept in a [`ModelError`], in characters.
const MAX_MESSAGE_CHARS: usize = 2000;

/// What a provider said about a failure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProviderError {
    pub(crate) message: Option<String>,
    /// `error.code` (a string, or a number written out).
    pub(crate) code: Option<String>,
    /// `error.type`.
    pub(crate) error_type: Option<String>,
    /// An HTTP-like status given inside the body (`status_code`, or a numeric `code`).
    pub(crate) status: Option<u16>,
}

impl ProviderError {
    /// Reads an error value: an object with `message`/`code`/`type`/`status_code`, or a
    /// string that is the message.
    pub(crate) fn from_value(value: &Value) -> Self {
        match value {
            Value::Object(fields) => {
                let text = |key: &str| match fields.get(key) {
                    Some(Value::String(text)) if !text.is_empty() => Some(text.clone()),
                    Some(Value::Number(number)) => Some(number.to_string()),
                    _ => None,
                };
                let status_of = |key: &str| {
                    fields.get(key).and_then(Value::as_u64).and_then(|n| u16::try_from(n).ok())
                };
                ProviderError {
                    message: text("message").or_else(|| text("error")),
                    code: text("code"),
                    error_type: text("type"),
                    status: status_of("status_code")
                        .or_else(|| status_of("status"))
                        .or_else(|| status_of("code")),
                }
            }
            Value::String(text) if !text.is_empty() => {
                ProviderError { message: Some(text.clone()), ..ProviderError::default() }
            }
            _ => ProviderError::default(),
        }
    }

    /// Reads an HTTP error body: JSON `{"error": ...}` or a bare error object, else text.
    pub(crate) fn from_body(body: &[u8]) -> Self {
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => ProviderError::from_value(value.get("error").unwrap_or(&value)),
            Err(_) => {
                let text = String::from_utf8_lossy(body).trim().to_owned();
                ProviderError {
                    message: (!text.is_empty()).then_some(text),
                    ..ProviderError::default()
                }
            }
        }
    }

    fn has_code(&self, wanted: &[&str]) -> bool {
        [&self.code, &self.error_type]
            .into_iter()
            .flatten()
            .any(|value| wanted.iter().any(|wanted| value.eq_ignore_ascii_case(wanted)))
    }

    fn is_context_too_long(&self) -> bool {
        const MESSAGES: &[&str] = &[
            "maximum context length",
            "context_length_exceeded",
            "context length",
            "context window",
            "prompt is too long",
            "input is too long",
            "too many tokens in the prompt",
        ];
        self.has_code(&["context_length_exceeded", "string_above_max_length", "request_too_large"])
            || self.message.as_deref().is_some_and(|message| {
                let message = message.to_ascii_lowercase();
                MESSAGES.iter().any(|needle| message.contains(needle))
            })
    }

    /// The message for a [`ModelError`]: the provider's words and code, secret removed.
    fn describe(&self, fallback: &str, secret: Option<&str>) -> String {
        let mut message = self.message.clone().unwrap_or_else(|| fallback.to_owned());
        if let Some(code) = self.code.as_deref().filter(|code| !message.contains(code)) {
            message = format!("{message} (code {code})");
        }
        redact(&truncate_chars(&message, MAX_MESSAGE_CHARS), secret)
    }
}

/// Maps a non-2xx response to a failure.
///
/// 401 and 403 are [`ModelErrorKind::Auth`]; 429 is [`ModelErrorKind::QuotaExhausted`]
/// when the code says `insufficient_quota`, else [`ModelErrorKind::RateLimited`]; 503 and
/// 529 are [`ModelErrorKind::Overloaded`]; 408 is [`ModelErrorKind::Transport`]; a 4xx
/// whose code or message says the context is too long, and 413, are
/// [`ModelErrorKind::ContextTooLong`]; other 4xx are [`ModelErrorKind::InvalidRequest`];
/// other 5xx are [`ModelErrorKind::Server`].
pub(crate) fn http_failure(
    status: u16,
    body: &[u8],
    retry_after: Option<Duration>,
    secret: Option<&str>,
) -> Failure {
    let provider = ProviderError::from_body(body);
    let kind = kind_for_status(status, &provider, retry_after);
    let message = provider.describe(&format!("http status {status}"), secret);
    Failure { error: ModelError::new(kind, Some(status), message), retry_after }
}

fn kind_for_status(
    status: u16,
    provider: &ProviderError,
    retry_after: Option<Duration>,
) -> ModelErrorKind {
    match status {
        401 | 403 => ModelErrorKind::Auth,
        429 if provider.has_code(&["insufficient_quota"]) => ModelErrorKind::QuotaExhausted,
        429 => ModelErrorKind::RateLimited { retry_after },
        503 | 529 => ModelErrorKind::Overloaded,
        408 => ModelErrorKind::Transport,
        413 => ModelErrorKind::ContextTooLong,
        400..=499 if provider.is_context_too_long() => ModelErrorKind::ContextTooLong,
        400..=499 => ModelErrorKind::InvalidRequest,
        500..=599 => ModelErrorKind::Server,
        // 1xx and unfollowed 3xx: the endpoint is not a Chat Completions endpoint.
        _ => ModelErrorKind::InvalidRequest,
    }
}

/// Maps an error reported inside a 200 stream or body (an `event: error` frame, or a
/// chunk or completion with an `error` member).
///
/// A known string code or type decides (`tool_use_failed`: the server rejected the model's
/// generation, so a fresh sample may succeed: [`ModelErrorKind::Stream`];
/// `invalid_request_error`: [`ModelErrorKind::InvalidRequest`]); else a status given in the
/// body is mapped like an HTTP status; else the error is [`ModelErrorKind::Stream`]. The
/// error's `status` is the status given in the body, if any.
pub(crate) fn in_band_error(error: &Value, secret: Option<&str>) -> ModelError {
    let provider = ProviderError::from_value(error);
    let by_code = if provider.has_code(&["insufficient_quota"]) {
        Some(ModelErrorKind::QuotaExhausted)
    } else if provider.has_code(&["rate_limit_exceeded", "rate_limit_error"]) {
        Some(ModelErrorKind::RateLimited { retry_after: None })
    } else if provider.has_code(&["invalid_api_key", "authentication_error", "permission_error"]) {
        Some(ModelErrorKind::Auth)
    } else if provider.has_code(&["overloaded", "overloaded_error"]) {
        Some(ModelErrorKind::Overloaded)
    } else if provider.has_code(&["server_error", "internal_error", "api_error"]) {
        Some(ModelErrorKind::Server)
    } else if provider.has_code(&["tool_use_failed"]) {
        Some(ModelErrorKind::Stream)
    } else if provider.is_context_too_long() {
        Some(ModelErrorKind::ContextTooLong)
    } else if provider.has_code(&["invalid_request_error", "invalid_prompt", "not_found_error"]) {
        // Sending the same request again cannot succeed (Anthropic's error types, the
        // Responses API's `invalid_prompt`).
        Some(ModelErrorKind::InvalidRequest)
    } else {
        None
    };
    let kind = by_code.unwrap_or_else(|| match provider.status {
        Some(status) => kind_for_status(status, &provider, None),
        None => ModelErrorKind::Stream,
    });
    let message = provider.describe("error event in stream", secret);
    ModelError::new(kind, provider.status, message)
}

/// Reads the delay a response asks for: `retry-after-ms` (OpenAI), else `Retry-After` as
/// seconds or as an HTTP date. A date is measured against the response's own `Date`
/// header, so no local clock is read; without a `Date` header it is ignored.
pub(crate) fn retry_after(
    retry_after_ms: Option<&str>,
    retry_after: Option<&str>,
    date: Option<&str>,
) -> Option<Duration> {
    if let Some(delay) = retry_after_ms
        .and_then(|value| value.trim().parse::<f64>().ok())
        .and_then(|millis| Duration::try_from_secs_f64(millis / 1000.0).ok())
    {
        return Some(delay);
    }
    let value = retry_after?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let until: SystemTime = httpdate::parse_http_date(value).ok()?;
    let now: SystemTime = httpdate::parse_http_date(date?.trim()).ok()?;
    Some(until.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Replaces every occurrence of `secret` in `text`.
pub(crate) fn redact(text: &str, secret: Option<&str>) -> String {
    match secret.filter(|secret| !secret.is_empty()) {
        Some(secret) => text.replace(secret, "[redacted]"),
        None => text.to_owned(),
    }
}

fn truncate_chars(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn kind(status: u16, body: Value) -> ModelErrorKind {
        http_failure(status, body.to_string().as_bytes(), None, None).error.kind
    }

    #[test]
    fn status_and_body_map_to_kinds() {
        let error =
            |code: &str, message: &str| json!({"error": {"code": code, "message": message}});
        assert_eq!(kind(401, error("invalid_api_key", "bad key")), ModelErrorKind::Auth);
        assert_eq!(kind(403, json!({})), ModelErrorKind::Auth);
        assert_eq!(
            kind(429, error("insufficient_quota", "no money")),
            ModelErrorKind::QuotaExhausted
        );
        assert_eq!(
            kind(429, json!({"error": {"type": "insufficient_quota", "message": "x"}})),
            ModelErrorKind::QuotaExhausted
        );
        assert_eq!(
            kind(429, error("rate_limit_exceeded", "slow down")),
            ModelErrorKind::RateLimited { retry_after: None }
        );
        assert_eq!(kind(529, json!({"type": "error"})), ModelErrorKind::Overloaded);
        assert_eq!(kind(503, json!({})), ModelErrorKind::Overloaded);
        assert_eq!(
            kind(400, error("context_length_exceeded", "too long")),
            ModelErrorKind::ContextTooLong
        );
        assert_eq!(
            kind(
                400,
                json!({"error": {"message": "This model's maximum context length is 8192 tokens"}})
            ),
            ModelErrorKind::ContextTooLong
        );
        assert_eq!(kind(400, error("invalid_value", "bad role")), ModelErrorKind::InvalidRequest);
        assert_eq!(kind(404, json!({})), ModelErrorKind::InvalidRequest);
        assert_eq!(kind(500, json!({})), ModelErrorKind::Server);
        assert_eq!(kind(502, json!({})), ModelErrorKind::Server);
        assert_eq!(kind(408, json!({})), ModelErrorKind::Transport);
    }

    #[test]
    fn text_bodies_and_empty_bodies_keep_a_message() {
        let failure = http_failure(502, b"<html>Bad Gateway</html>", None, None);
        assert_eq!(failure.error.message, "<html>Bad Gateway</html>");
        let failure = http_failure(500, b"", None, None);
        assert_eq!(failure.error.message, "http status 500");
        assert_eq!(failure.error.status, Some(500));
    }

    #[test]
    fn secret_is_redacted_from_messages() {
        let body = json!({"error": {"message": "Incorrect API key provided: sk-secret-123.", "code": "invalid_api_key"}});
        let failure = http_failure(401, body.to_string().as_bytes(), None, Some("sk-secret-123"));
        assert!(!failure.error.message.contains("sk-secret-123"));
        assert!(failure.error.message.contains("[redacted]"));
        assert!(failure.error.message.contains("invalid_api_key"));
    }

    #[test]
    fn long_messages_are_truncated() {
        let long = "é".repeat(5000);
        let failure = http_failure(500, long.as_bytes(), None, None);
        assert_eq!(failure.error.message.chars().count(), MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn in_band_errors_map_by_code_then_status() {
        let groq = json!({"message": "Tool call validation failed", "type": "invalid_request_error", "code": "tool_use_failed", "status_code": 400});
        let error = in_band_error(&groq, None);
        assert_eq!((error.kind.clone(), error.status), (ModelErrorKind::Stream, Some(400)));
        assert!(error.is_retryable());
        let openrouter = json!({"code": 400, "message": "Token limit reached"});
        let error = in_band_error(&openrouter, None);
        assert_eq!((error.kind.clone(), error.status), (ModelErrorKind::InvalidRequest, Some(400)));
        assert!(!error.is_retryable());
        assert_eq!(in_band_error(&json!({"message": "boom"}), None).kind, ModelErrorKind::Stream);
        assert_eq!(in_band_error(&json!("boom"), None).message, "boom");
        assert_eq!(in_band_error(&json!({"code": 502}), None).kind, ModelErrorKind::Server);
        assert_eq!(
            in_band_error(&json!({"type": "overloaded_error", "message": "Overloaded"}), None).kind,
            ModelErrorKind::Overloaded
        );
    }

    #[test]
    fn anthropic_and_responses_error_types_map_in_band() {
        let anthropic = |error_type: &str, message: &str| {
            in_band_error(&json!({"type": error_type, "message": message}), None).kind
        };
        assert_eq!(anthropic("api_error", "Internal server error"), ModelErrorKind::Server);
        assert_eq!(
            anthropic("rate_limit_error", "slow down"),
            ModelErrorKind::RateLimited { retry_after: None }
        );
        assert_eq!(anthropic("permission_error", "no"), ModelErrorKind::Auth);
        assert_eq!(anthropic("invalid_request_error", "bad"), ModelErrorKind::InvalidRequest);
        assert_eq!(
            anthropic(
                "invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum"
            ),
            ModelErrorKind::ContextTooLong
        );
        assert_eq!(anthropic("request_too_large", "too big"), ModelErrorKind::ContextTooLong);
        let responses = |code: &str| in_band_error(&json!({"code": code, "message": "m"}), None);
        assert_eq!(responses("server_error").kind, ModelErrorKind::Server);
        assert_eq!(responses("invalid_prompt").kind, ModelErrorKind::InvalidRequest);
        assert_eq!(
            responses("rate_limit_exceeded").kind,
            ModelErrorKind::RateLimited { retry_after: None }
        );
        assert_eq!(responses("context_length_exceeded").kind, ModelErrorKind::ContextTooLong);
    }

    #[test]
    fn anthropic_http_bodies_map_to_kinds() {
        let body = |error_type: &str, message: &str| json!({"type": "error", "error": {"type": error_type, "message": message}});
        assert_eq!(
            kind(
                400,
                body("invalid_request_error", "prompt is too long: 201234 tokens > 200000 maximum")
            ),
            ModelErrorKind::ContextTooLong
        );
        assert_eq!(
            kind(
                400,
                body("invalid_request_error", "messages.2.content.0: unexpected `tool_use_id`")
            ),
            ModelErrorKind::InvalidRequest
        );
        assert_eq!(kind(529, body("overloaded_error", "Overloaded")), ModelErrorKind::Overloaded);
        assert_eq!(
            kind(429, body("rate_limit_error", "Number of request tokens has exceeded")),
            ModelErrorKind::RateLimited { retry_after: None }
        );
        assert_eq!(
            kind(401, body("authentication_error", "invalid x-api-key")),
            ModelErrorKind::Auth
        );
        assert_eq!(kind(413, body("request_too_large", "too big")), ModelErrorKind::ContextTooLong);
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(retry_after(None, Some("7"), None), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(None, Some(" 1.5 "), None), Some(Duration::from_millis(1500)));
        assert_eq!(retry_after(Some("250"), Some("7"), None), Some(Duration::from_millis(250)));
        assert_eq!(
            retry_after(
                None,
                Some("Sun, 06 Nov 1994 08:49:40 GMT"),
                Some("Sun, 06 Nov 1994 08:49:37 GMT")
            ),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(
                None,
                Some("Sun, 06 Nov 1994 08:49:30 GMT"),
                Some("Sun, 06 Nov 1994 08:49:37 GMT")
            ),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(None, Some("Sun, 06 Nov 1994 08:49:40 GMT"), None), None);
        assert_eq!(retry_after(None, Some("soon"), None), None);
        assert_eq!(retry_after(None, Some("-3"), None), None);
        assert_eq!(retry_after(Some("NaN"), None, None), None);
        assert_eq!(retry_after(None, None, None), None);
    }
}
