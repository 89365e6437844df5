//! Streamable HTTP: rmcp's reqwest client with one fix, and the transport keel builds on it.
//!
//! rmcp 3.11 hands an HTTP error whose JSON body is a JSON-RPC error *without an id* (what
//! the TypeScript SDK's servers answer to a session they do not know: `400 {"error":
//! {"message": "Bad Request: No valid session ID provided"}}`) to the service as a message;
//! nothing can match it to the request, so the call waits out its whole timeout.
//! [`KeelHttpClient`] turns such an answer into an error of that request: a lost session
//! (when a session id was sent and the message names the session) becomes
//! `SessionExpired`, which makes rmcp start a new session and retry the request once; any
//! other becomes an error naming the server's message, which fails the request at once.
//! It also keeps no idle connections ([`KeelHttpClient::new`]), and gives every SSE event
//! (the answers of a POST that streams, and the GET stream) the stdio line filter's
//! rewrites before rmcp decodes it: a content block of a type rmcp does not know becomes a
//! text block naming it (else the whole result fails to decode), and a listed tool that
//! requires task augmentation is marked so the manager leaves it out. A POST answered with
//! a plain JSON body is decoded by rmcp's client before keel sees it, so there such a
//! result still fails as a whole (servers of the TypeScript SDK stream by default).
//!
//! Once a session is set up (the `notifications/initialized` POST was accepted), rmcp opens
//! the session's GET stream from a task of its own while it goes on sending requests, so
//! under CPU load a `tools/call` could reach the server before that GET did, and a server
//! that resumes a request's closed stream on "the next GET" (SEP-1699, as the conformance
//! suite's `sse-retry` server does) answered the call on it at once, before the call's own
//! stream had even closed. [`KeelHttpClient`] holds a new session's requests until the
//! server has answered that first GET (or refused it, or [`SESSION_STREAM_WAIT`] passed),
//! so the server always sees the session's stream first and a later GET of the session is
//! a reconnection.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcMessage};
use rmcp::transport::streamable_http_client::SseError;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;

/// rmcp's reqwest client, with id-less JSON-RPC error answers turned into request errors.
#[derive(Debug, Clone)]
pub(crate) struct KeelHttpClient {
    inner: reqwest::Client,
    /// Set once the server refused a request for its session (404, or an id-less error
    /// about the session): that request never ran, so it may be sent again on a new one.
    session_lost: Arc<AtomicBool>,
    /// The last failed POST, for humans (`HTTP 500 ...`): rmcp ends the session on it and
    /// keeps only "closed".
    last_error: Arc<Mutex<Option<String>>>,
    /// The `WWW-Authenticate` challenge of the last request refused with 401 or 403.
    last_challenge: Arc<Mutex<Option<String>>>,
    /// `true` from a session's accepted `notifications/initialized` until the server
    /// answered the session's first GET: requests wait for it (see the module doc).
    awaiting_session_stream: Arc<tokio::sync::watch::Sender<bool>>,
}

/// How long a new session's first request waits for the server to answer the session's
/// GET stream; after that it is sent anyway (and later ones do not wait).
pub(crate) const SESSION_STREAM_WAIT: Duration = Duration::from_secs(3);

impl KeelHttpClient {
    /// A client that keeps no idle connections: every request opens its own, so a server
    /// that restarted is never reached through a dead kept-alive socket (where a POST
    /// fails without telling whether the server got it); a request that cannot connect
    /// was never sent. Redirects are not followed: the user's `headers` and bearer token
    /// go to the URL the user configured and nowhere else (reqwest keeps custom headers
    /// across a redirect to another host), so a 3xx is an HTTP error like any other.
    ///
    /// # Errors
    ///
    /// reqwest's, when its TLS setup fails.
    pub(crate) fn new() -> Result<KeelHttpClient, reqwest::Error> {
        let inner = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(KeelHttpClient {
            inner,
            session_lost: Arc::default(),
            last_error: Arc::default(),
            last_challenge: Arc::default(),
            awaiting_session_stream: Arc::new(tokio::sync::watch::Sender::new(false)),
        })
    }

    /// Waits until no session GET stream is awaited (at most [`SESSION_STREAM_WAIT`]; then
    /// it stops being awaited).
    ///
    /// Cancel safe: dropping it only stops the waiting.
    async fn session_stream_answered(&self) {
        let mut awaiting = self.awaiting_session_stream.subscribe();
        let answered =
            tokio::time::timeout(SESSION_STREAM_WAIT, awaiting.wait_for(|awaiting| !*awaiting))
                .await;
        if answered.is_err() {
            self.awaiting_session_stream.send_replace(false);
        }
    }

    /// Notes that the server answered (or refused) a GET for a session stream.
    fn session_stream_settled(&self, last_event_id: Option<&str>) {
        // A GET with an event id resumes a request's stream; the session's own has none.
        if last_event_id.is_none() {
            self.awaiting_session_stream.send_replace(false);
        }
    }

    /// Where the last failed POST is described.
    pub(crate) fn last_error(&self) -> Arc<Mutex<Option<String>>> {
        self.last_error.clone()
    }

    /// Where the challenge of the last request refused with 401/403 is kept.
    pub(crate) fn last_challenge(&self) -> Arc<Mutex<Option<String>>> {
        self.last_challenge.clone()
    }

    /// The flag set when the server refuses keel's session.
    pub(crate) fn session_lost(&self) -> Arc<AtomicBool> {
        self.session_lost.clone()
    }
}

type Error = StreamableHttpError<reqwest::Error>;

impl StreamableHttpClient for KeelHttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let session_attached = session_id.is_some();
        let kind = MessageKind::of(&message);
        if kind == MessageKind::Other {
            self.session_stream_answered().await;
        }
        let answer = self
            .inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        let answer = match answer {
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(error), _))
                if error.id.is_none() =>
            {
                Err(orphan_error(session_attached, &error.error.message))
            }
            Ok(StreamableHttpPostResponse::Sse(stream, session)) => {
                Ok(StreamableHttpPostResponse::Sse(filtered(stream), session))
            }
            other => other,
        };
        let challenge = match &answer {
            Err(StreamableHttpError::AuthRequired(refused)) => {
                Some(refused.www_authenticate_header.clone())
            }
            Err(StreamableHttpError::InsufficientScope(refused)) => {
                Some(refused.www_authenticate_header.clone())
            }
            _ => None,
        };
        // A later answer (a retry with a refreshed token) clears it: it was mended.
        if let Ok(mut last) = self.last_challenge.lock() {
            *last = challenge;
        }
        if matches!(answer, Err(StreamableHttpError::SessionExpired)) {
            self.session_lost.store(true, Ordering::SeqCst);
        }
        // rmcp opens the session's GET stream next (it does so for every session).
        if kind == MessageKind::Initialized && session_attached && answer.is_ok() {
            self.awaiting_session_stream.send_replace(true);
        }
        if let Ok(mut last) = self.last_error.lock() {
            *last =
                answer.as_ref().err().map(|error| error.to_string().chars().take(300).collect());
        }
        answer
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        self.inner.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Error> {
        let resumes = last_event_id.clone();
        let stream = self
            .inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await;
        self.session_stream_settled(resumes.as_deref());
        stream.map(filtered)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Error> {
        let resumes = last_event_id.clone();
        let stream = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.session_stream_settled(resumes.as_deref());
        stream.map(filtered)
    }
}

/// What a POST carries, as far as the session stream ordering cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MessageKind {
    /// `initialize`: it makes the session.
    Initialize,
    /// `notifications/initialized`: after it, rmcp opens the session's GET stream.
    Initialized,
    /// Anything else: sent once the session's stream was answered.
    Other,
}

impl MessageKind {
    fn of(message: &ClientJsonRpcMessage) -> MessageKind {
        match message {
            JsonRpcMessage::Request(request)
                if matches!(request.request, ClientRequest::InitializeRequest(_)) =>
            {
                MessageKind::Initialize
            }
            JsonRpcMessage::Notification(notification)
                if matches!(
                    notification.notification,
                    ClientNotification::InitializedNotification(_)
                ) =>
            {
                MessageKind::Initialized
            }
            _ => MessageKind::Other,
        }
    }
}

/// `stream` with each event's data given the stdio filter's rewrites (see the module doc).
fn filtered(
    stream: BoxStream<'static, Result<Sse, SseError>>,
) -> BoxStream<'static, Result<Sse, SseError>> {
    use futures::StreamExt;
    stream.map(|event| event.map(rewrite_event)).boxed()
}

fn rewrite_event(mut event: Sse) -> Sse {
    if let Some(data) = &event.data {
        let bytes = data.as_bytes();
        let replaced = crate::stdio::known_blocks_only(bytes)
            .or_else(|| crate::stdio::mark_task_only_tools(bytes));
        if let Some(text) = replaced.and_then(|bytes| String::from_utf8(bytes).ok()) {
            event.data = Some(text);
        }
    }
    event
}

/// The error for an answer that is a JSON-RPC error naming no request: a lost session when
/// keel sent one and the server's message is about the session, else the message itself.
fn orphan_error(session_attached: bool, message: &str) -> Error {
    let lower = message.to_ascii_lowercase();
    if session_attached && lower.contains("session") {
        return StreamableHttpError::SessionExpired;
    }
    let preview: String = message.chars().take(300).collect();
    StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
        "the server answered with an error for no request: {preview}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_get_the_stdio_rewrites() {
        let event =
            |data: &str| Sse { event: None, data: Some(data.to_owned()), id: None, retry: None };
        let result = r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"a"},{"type":"hologram","x":1}]}}"#;
        let rewritten = rewrite_event(event(result)).data.unwrap();
        let value: serde_json::Value = serde_json::from_str(&rewritten).unwrap();
        assert_eq!(value["result"]["content"][0]["text"], "a");
        assert_eq!(
            value["result"]["content"][1]["text"],
            "[a content block of unknown type 'hologram' left out]"
        );
        let listed = r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"t","inputSchema":{"type":"object"},"execution":{"taskSupport":"required"}}]}}"#;
        let rewritten = rewrite_event(event(listed)).data.unwrap();
        assert!(rewritten.contains(crate::stdio::TASK_REQUIRED_META), "{rewritten}");
        // An ordinary event passes unchanged.
        let plain = r#"{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"b"}]}}"#;
        assert_eq!(rewrite_event(event(plain)).data.as_deref(), Some(plain));
    }

    #[test]
    fn orphan_errors_table() {
        let lost = |attached, message| {
            matches!(orphan_error(attached, message), StreamableHttpError::SessionExpired)
        };
        assert!(lost(true, "Bad Request: No valid session ID provided"));
        assert!(lost(true, "Session not found"));
        // Without a session there is none to lose; other messages fail the request.
        assert!(!lost(false, "Bad Request: No valid session ID provided"));
        assert!(!lost(true, "Internal error"));
        let text = orphan_error(true, "Internal error").to_string();
        assert!(text.contains("Internal error"), "{text}");
    }
}
