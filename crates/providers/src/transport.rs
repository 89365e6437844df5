//! The HTTP side shared by the network clients: building the client and endpoint, sending
//! one request with timeouts, mapping an error status (through `crate::failure`), and
//! reading a body or a `text/event-stream` (through `crate::sse`).
//!
//! Each client owns its wire format and its assembler; this module knows nothing about
//! either. It hands every server-sent event to a callback and reports how the body ended.
//!
//! Invariants:
//! - A response with an error status is never fed to the SSE parser.
//! - Every body read is bounded in size and in idle time.
//! - The API key is sent as a sensitive header and appears in no error message, log line
//!   or `Debug` output.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use keel_contracts::{ModelError, ModelErrorKind};
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::error::BuildError;
use crate::failure;
use crate::retry::Failure;
use crate::sse::{SseEvent, SseParser};

/// The most of an error body that is read, in bytes; the rest is ignored.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Whether a stream goes on after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep reading.
    Continue,
    /// The provider's end-of-response event arrived: the response is complete.
    Done,
}

/// How an event stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// An event handler returned [`Flow::Done`]; the rest of the body was not read.
    Done,
    /// The body ended without an end-of-response event; the caller decides whether what
    /// it has is complete.
    BodyEnded,
}

/// What [`Transport::read_body`] does with a body longer than its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overflow {
    /// Keep the first bytes, drop the rest (error bodies only explain a failure).
    Truncate,
    /// Fail: a cut body would be a wrong answer.
    Fail,
}

/// Timeouts of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// The longest wait for a TCP (and TLS) connection.
    pub(crate) connect: Duration,
    /// The longest wait from sending a request to receiving the response headers.
    pub(crate) request: Duration,
    /// The longest silence allowed between two pieces of a response body.
    pub(crate) stream_idle: Duration,
}

/// One endpoint, its headers and a connection pool.
#[derive(Clone)]
pub(crate) struct Transport {
    endpoint: reqwest::Url,
    headers: HeaderMap,
    secret: Option<String>,
    timeouts: Timeouts,
    http: reqwest::Client,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("endpoint", &self.endpoint.as_str())
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// The API key of a client and the header it is sent in.
#[derive(Clone)]
pub(crate) struct Credential<'a> {
    /// The header, e.g. `authorization` or `x-api-key`.
    pub(crate) header: HeaderName,
    /// The header's value with the key in it, e.g. `Bearer sk-…`.
    pub(crate) value: &'a str,
    /// The key alone, redacted from every message.
    pub(crate) secret: &'a str,
}

impl fmt::Debug for Credential<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential").field("header", &self.header).finish_non_exhaustive()
    }
}

/// One HTTP client per connect timeout, tokio runtime and scheme (an http-only client
/// loads no root certificates), shared by every transport built
/// there. Building a client loads and parses the system's root certificates (≈ 40% of
/// `keel serve`'s CPU when every run built its own; BENCHMARKS.md "Host"); a shared one
/// also reuses connections across runs. Per runtime, because a pooled connection belongs
/// to the runtime that opened it. Headers and credentials are per request, never the
/// client's, so sharing carries none of them. At most 16 are kept (the oldest dropped).
fn shared_client(
    connect: std::time::Duration,
    plain_http: bool,
) -> Result<reqwest::Client, BuildError> {
    type Key = (Option<tokio::runtime::Id>, std::time::Duration, bool);
    static CLIENTS: std::sync::Mutex<Vec<(Key, reqwest::Client)>> =
        std::sync::Mutex::new(Vec::new());
    let runtime = tokio::runtime::Handle::try_current().ok().map(|handle| handle.id());
    let key = (runtime, connect, plain_http);
    let mut clients = CLIENTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, client)) = clients.iter().find(|(k, _)| *k == key) {
        return Ok(client.clone());
    }
    let mut builder = reqwest::Client::builder()
        .connect_timeout(connect)
        .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")));
    if plain_http {
        // No TLS to an http endpoint: skip loading the system's root certificates (the
        // platform verifier reads the whole store when the client is built). With no
        // roots, a redirect to https fails verification: closed, never unverified.
        builder = builder.tls_certs_only(std::iter::empty());
    }
    let client =
        builder.build().map_err(|error| BuildError::HttpClient { message: error.to_string() })?;
    if clients.len() >= 16 {
        clients.remove(0);
    }
    clients.push((key, client.clone()));
    Ok(client)
}

impl Transport {
    /// A transport for `{base_url}/{path}`.
    ///
    /// `headers` are sent with every request; the credential's header is marked sensitive.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidBaseUrl`] when `base_url` is not an absolute http(s) URL,
    /// [`BuildError::InvalidApiKey`] when the key cannot be sent in a header,
    /// [`BuildError::HttpClient`] when the HTTP client cannot be set up.
    pub(crate) fn new(
        base_url: &str,
        path: &str,
        mut headers: HeaderMap,
        credential: Option<Credential<'_>>,
        timeouts: Timeouts,
    ) -> Result<Self, BuildError> {
        let invalid_url = || BuildError::InvalidBaseUrl { base_url: base_url.to_owned() };
        let endpoint = format!("{}/{path}", base_url.trim().trim_end_matches('/'));
        let endpoint = reqwest::Url::parse(&endpoint).map_err(|_| invalid_url())?;
        if !matches!(endpoint.scheme(), "http" | "https") || endpoint.host_str().is_none() {
            return Err(invalid_url());
        }
        let secret = match credential {
            Some(credential) => {
                let mut value = HeaderValue::from_str(credential.value)
                    .map_err(|_| BuildError::InvalidApiKey)?;
                value.set_sensitive(true);
                headers.insert(credential.header, value);
                Some(credential.secret.to_owned()).filter(|secret| !secret.is_empty())
            }
            None => None,
        };
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let http = shared_client(timeouts.connect, endpoint.scheme() == "http")?;
        Ok(Transport { endpoint, headers, secret, timeouts, http })
    }

    /// The URL requests are sent to.
    pub(crate) fn endpoint(&self) -> &reqwest::Url {
        &self.endpoint
    }

    /// The API key, for redaction.
    pub(crate) fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    /// Sends `body` and waits for the response headers. A success status returns the
    /// response; an error status is read and mapped by `failure::http_failure`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the request and closes its connection.
    pub(crate) async fn send(
        &self,
        body: Bytes,
        accept: &'static str,
    ) -> Result<reqwest::Response, Failure> {
        let request = self
            .http
            .post(self.endpoint.clone())
            .headers(self.headers.clone())
            .header(header::ACCEPT, accept)
            .body(body);
        let response = match tokio::time::timeout(self.timeouts.request, request.send()).await {
            Err(_elapsed) => {
                return Err(self.error(
                    ModelErrorKind::Transport,
                    None,
                    format!("no response within {:?}", self.timeouts.request),
                ));
            }
            Ok(Err(error)) => {
                return Err(self.error(
                    ModelErrorKind::Transport,
                    None,
                    format!("request failed: {}", error_chain(&error)),
                ));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let headers = response.headers();
        let retry_after = failure::retry_after(
            header_str(headers, "retry-after-ms"),
            header_str(headers, header::RETRY_AFTER.as_str()),
            header_str(headers, header::DATE.as_str()),
        );
        // The body only explains the failure: a partial or unreadable one still maps.
        let body = self
            .read_body(response, MAX_ERROR_BODY_BYTES, Overflow::Truncate)
            .await
            .unwrap_or_default();
        let failure = failure::http_failure(status.as_u16(), &body, retry_after, self.secret());
        tracing::debug!(
            endpoint = self.endpoint.path(),
            status = status.as_u16(),
            kind = ?failure.error.kind,
            "model request failed"
        );
        Err(failure)
    }

    /// Reads a `text/event-stream` body, handing each event to `on_event` in order, until
    /// a handler returns [`Flow::Done`] or the body ends.
    ///
    /// At the end of the body, a last event whose lines were complete but which lacked its
    /// blank line is still handed over (some servers omit it).
    ///
    /// # Errors
    ///
    /// The first error `on_event` returns; [`ModelErrorKind::Stream`] when the body stalls
    /// longer than the idle timeout, is aborted, or breaks the SSE parser's limits.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the connection; what was handed over stays handed over.
    pub(crate) async fn read_events(
        &self,
        mut response: reqwest::Response,
        mut on_event: impl FnMut(&SseEvent) -> Result<Flow, ModelError>,
    ) -> Result<StreamEnd, Failure> {
        let mut parser = SseParser::new();
        while let Some(chunk) = self.next_chunk(&mut response, "stream").await? {
            let events = parser
                .push(&chunk)
                .map_err(|error| self.error(ModelErrorKind::Stream, None, error.to_string()))?;
            for event in &events {
                if on_event(event)? == Flow::Done {
                    return Ok(StreamEnd::Done);
                }
            }
        }
        if let Some(event) = parser.finish()
            && on_event(&event)? == Flow::Done
        {
            return Ok(StreamEnd::Done);
        }
        Ok(StreamEnd::BodyEnded)
    }

    /// Reads a whole body, at most `limit_bytes` of it; `overflow` says what happens to a
    /// longer one.
    ///
    /// # Errors
    ///
    /// [`ModelErrorKind::Stream`] when the body stalls, is aborted, or (with
    /// [`Overflow::Fail`]) is longer than the limit.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the connection.
    pub(crate) async fn read_body(
        &self,
        mut response: reqwest::Response,
        limit_bytes: usize,
        overflow: Overflow,
    ) -> Result<Vec<u8>, Failure> {
        let mut body = Vec::new();
        while let Some(chunk) = self.next_chunk(&mut response, "response body").await? {
            if body.len().saturating_add(chunk.len()) > limit_bytes {
                if overflow == Overflow::Truncate {
                    let room = limit_bytes.saturating_sub(body.len());
                    body.extend_from_slice(chunk.get(..room).unwrap_or_default());
                    return Ok(body);
                }
                return Err(self.error(
                    ModelErrorKind::Stream,
                    None,
                    format!("response body exceeds {limit_bytes} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The next piece of a body, `None` at its end.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future loses nothing that was returned before.
    async fn next_chunk(
        &self,
        response: &mut reqwest::Response,
        what: &str,
    ) -> Result<Option<Bytes>, Failure> {
        match tokio::time::timeout(self.timeouts.stream_idle, response.chunk()).await {
            Err(_elapsed) => Err(self.error(
                ModelErrorKind::Stream,
                None,
                format!("{what} stalled: no data for {:?}", self.timeouts.stream_idle),
            )),
            Ok(Err(error)) => Err(self.error(
                ModelErrorKind::Stream,
                None,
                format!("{what} aborted: {}", error_chain(&error)),
            )),
            Ok(Ok(chunk)) => Ok(chunk),
        }
    }

    /// A failure of `kind` whose message has the key removed.
    pub(crate) fn error(
        &self,
        kind: ModelErrorKind,
        status: Option<u16>,
        message: impl AsRef<str>,
    ) -> Failure {
        Failure::from(ModelError::new(
            kind,
            status,
            failure::redact(message.as_ref(), self.secret()),
        ))
    }
}

/// Whether a response says its body is JSON.
pub(crate) fn is_json(response: &reqwest::Response) -> bool {
    header_str(response.headers(), header::CONTENT_TYPE.as_str())
        .is_some_and(|content_type| content_type.to_ascii_lowercase().contains("json"))
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// An error and its sources, one after the other (reqwest's own message is terse).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeouts() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(1),
            request: Duration::from_secs(1),
            stream_idle: Duration::from_secs(1),
        }
    }

    #[test]
    fn endpoint_is_built_from_the_base_url() {
        let transport = Transport::new(
            "http://127.0.0.1:11434/v1/",
            "responses",
            HeaderMap::new(),
            None,
            timeouts(),
        )
        .unwrap();
        assert_eq!(transport.endpoint().as_str(), "http://127.0.0.1:11434/v1/responses");
    }

    #[test]
    fn bad_base_urls_and_keys_are_rejected() {
        for base_url in ["", "api.openai.com/v1", "ftp://host/v1", "file:///tmp"] {
            assert!(
                matches!(
                    Transport::new(base_url, "x", HeaderMap::new(), None, timeouts()),
                    Err(BuildError::InvalidBaseUrl { .. })
                ),
                "{base_url}"
            );
        }
        let credential = Credential {
            header: HeaderName::from_static("x-api-key"),
            value: "line\nbreak-secret",
            secret: "line\nbreak-secret",
        };
        let error =
            Transport::new("http://localhost", "x", HeaderMap::new(), Some(credential), timeouts())
                .unwrap_err();
        assert!(matches!(error, BuildError::InvalidApiKey));
        assert!(!error.to_string().contains("break-secret"));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let credential = Credential {
            header: HeaderName::from_static("x-api-key"),
            value: "sk-very-secret",
            secret: "sk-very-secret",
        };
        assert!(!format!("{credential:?}").contains("sk-very-secret"));
        let transport =
            Transport::new("http://localhost", "x", HeaderMap::new(), Some(credential), timeouts())
                .unwrap();
        assert!(!format!("{transport:?}").contains("sk-very-secret"));
        let failure = transport.error(ModelErrorKind::Stream, None, "echo sk-very-secret");
        assert_eq!(failure.error.message, "echo [redacted]");
    }
}
