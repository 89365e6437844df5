//! The redirect listener: a one-shot HTTP server on 127.0.0.1 that waits for the
//! authorization server's redirect carrying this login's `state`.

use std::sync::Arc;

use reqwest::Url;

use crate::error::OAuthError;

/// A listener on a free port of 127.0.0.1 for the redirect, with its redirect URI
/// (`http://127.0.0.1:PORT/callback`).
///
/// # Errors
///
/// [`OAuthError::Callback`] when keel cannot listen there.
pub(super) async fn listen() -> Result<(tokio::net::TcpListener, String), OAuthError> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|error| OAuthError::Callback(format!("cannot listen on 127.0.0.1: {error}")))?;
    let port =
        listener.local_addr().map_err(|error| OAuthError::Callback(error.to_string()))?.port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    Ok((listener, redirect_uri))
}

/// The parts of the redirect keel needs.
pub(super) struct Callback {
    pub(super) code: String,
    pub(super) issuer: Option<String>,
}

/// What the loopback listener's handler needs: the login's `state`, and where the first
/// redirect that carries it is sent.
struct Redirects {
    state: String,
    first: tokio::sync::mpsc::Sender<Result<Callback, OAuthError>>,
}

/// Serves HTTP on `listener` (axum) until a `GET /callback` whose `state` is `state`
/// arrives: its code (or the authorization server's error). Other requests get 404, 405
/// or 400 and are otherwise ignored, so a stray or forged request cannot end the login;
/// connections are served side by side, so a stalled one holds up nothing.
///
/// Cancel safety: dropping it closes the listener.
pub(super) async fn wait_for_redirect(
    listener: tokio::net::TcpListener,
    state: &str,
) -> Result<Callback, OAuthError> {
    let (first, mut received) = tokio::sync::mpsc::channel(1);
    let redirects = Arc::new(Redirects { state: state.to_owned(), first });
    let app = axum::Router::new()
        .route("/callback", axum::routing::get(on_callback))
        .fallback(|| async { page(axum::http::StatusCode::NOT_FOUND, "Not found.") })
        .with_state(redirects);
    tokio::select! {
        served = async { axum::serve(listener, app).await } => {
            Err(OAuthError::Callback(match served {
                Ok(()) => "the loopback listener stopped".to_owned(),
                Err(error) => format!("the loopback listener failed: {error}"),
            }))
        }
        Some(callback) = received.recv() => callback,
    }
}

/// `GET /callback`: the redirect when its `state` is the login's (then it is handed to
/// [`wait_for_redirect`], once), else 400.
async fn on_callback(
    axum::extract::State(redirects): axum::extract::State<Arc<Redirects>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> axum::response::Response {
    use axum::http::StatusCode;
    let Ok(mut url) = Url::parse("http://127.0.0.1/callback") else {
        return page(StatusCode::INTERNAL_SERVER_ERROR, "keel could not read the redirect.");
    };
    url.set_query(query.as_deref());
    let param = |name: &str| {
        url.query_pairs().find(|(key, _)| key == name).map(|(_, value)| value.into_owned())
    };
    if param("state").as_deref() != Some(redirects.state.as_str()) {
        return page(StatusCode::BAD_REQUEST, "The state does not match this login.");
    }
    if let Some(error) = param("error") {
        let description = param("error_description").unwrap_or_default();
        let text: String = format!("{error} {description}")
            .chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect();
        let _ = redirects.first.try_send(Err(OAuthError::Callback(format!(
            "the authorization server answered: {}",
            text.trim()
        ))));
        return page(StatusCode::OK, "The authorization was refused; see the terminal.");
    }
    let Some(code) = param("code").filter(|code| !code.is_empty()) else {
        return page(StatusCode::BAD_REQUEST, "The redirect carries no code.");
    };
    let _ = redirects.first.try_send(Ok(Callback { code, issuer: param("iss") }));
    page(StatusCode::OK, "keel is logged in. You can close this window.")
}

/// A small HTML page saying `text`, not cached, closing the connection.
fn page(status: axum::http::StatusCode, text: &str) -> axum::response::Response {
    use axum::http::header;
    use axum::response::IntoResponse as _;
    let body = format!("<!doctype html><title>keel</title><p>{text}</p>\n");
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONNECTION, "close"),
        ],
        body,
    )
        .into_response()
}
