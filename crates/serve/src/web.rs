//! The web timeline (`GET /`, DESIGN.md §9): sessions, a session's live timeline and its
//! pending approvals, as server-rendered HTML with a little JS (`/web/app.js`) that
//! follows the SSE stream and answers approvals. No build step: the assets are in
//! `web/` and compiled in.
//!
//! Invariants:
//! - **Ledger text is data.** Everything the ledger holds (model text, tool output, file
//!   names, arguments, call ids) was written by a model or a repository and may be
//!   hostile: it is HTML-escaped and its control characters made visible
//!   ([`keel_host::terminal::neutralize`]) before it is put in a page; the JS only inserts
//!   what the server rendered. A Content-Security-Policy without inline script is the
//!   second wall.
//!
//! Login and the CSRF checks are in [`crate::auth`]; the HTML is rendered in [`render`].

mod render;

use std::fmt::Write as _;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use keel_contracts::{Seq, SessionId};
use serde::Deserialize;
use serde_json::json;

use crate::auth::{AppState, COOKIE, authenticated, require_auth};
use crate::error::ApiError;
use crate::sessions::{shown_state, visible};

use render::{approvals_html, entries_html, one_line_clip, shell, summary_html, text};

/// How long a login link from `POST /v1/web/logins` is good for.
const MINTED_LOGIN_TTL: Duration = Duration::from_secs(300);

const PAGE_CSS: &str = include_str!("web/app.css");
const PAGE_JS: &str = include_str!("web/app.js");

/// The policy of every page: scripts and styles only from this host, no inline script
/// (so an injected `<script>` or `onerror=` would not run even if it got through), no
/// framing, forms post only here.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// The web routes: `/` and `/login` open (they check themselves), the assets open, the
/// fragment and login-link routes behind [`require_auth`].
pub(crate) fn router(state: AppState) -> Router<AppState> {
    let protected = Router::new()
        .route("/web/sessions/{id}/fragment", get(fragment))
        .route("/v1/web/logins", post(mint_login))
        .route_layer(middleware::from_fn_with_state(state, require_auth));
    Router::new()
        .route("/", get(page))
        .route("/login", get(login))
        .route("/web/app.js", get(|| async { asset("text/javascript; charset=utf-8", PAGE_JS) }))
        .route("/web/app.css", get(|| async { asset("text/css; charset=utf-8", PAGE_CSS) }))
        .merge(protected)
}

/// The security headers every page and fragment carries.
fn harden(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    harden(([(header::CONTENT_TYPE, HeaderValue::from_static(content_type))], body).into_response())
}

fn html(status: StatusCode, body: String) -> Response {
    harden(
        (
            status,
            [(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"))],
            body,
        )
            .into_response(),
    )
}

#[derive(Debug, Deserialize)]
struct LoginQuery {
    token: Option<String>,
}

/// `GET /login?token=…`: spends the login secret, sets the cookie, sends the browser to
/// `/` (so the secret leaves the address bar). A wrong or spent secret is 401.
async fn login(State(state): State<AppState>, Query(query): Query<LoginQuery>) -> Response {
    let cookie = query.token.as_deref().and_then(|token| state.web.redeem(token.trim()));
    let Some(cookie) = cookie else {
        return html(
            StatusCode::UNAUTHORIZED,
            shell(
                "keel: not logged in",
                "<p class=\"notice\">This login link is wrong or was used already (each link \
                 works once). Use the link <code>keel serve</code> printed at start, or ask \
                 for a new one: <code>curl -X POST -H \"Authorization: Bearer $(cat \
                 $KEEL_HOME/serve.token)\" http://HOST/v1/web/logins</code>.</p>",
            ),
        );
    };
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    let value = format!("{COOKIE}={cookie}; HttpOnly; SameSite=Strict; Path=/");
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    harden(response)
}

/// `POST /v1/web/logins`: a new login link, good once for five minutes.
async fn mint_login(State(state): State<AppState>) -> Result<Response, ApiError> {
    let secret = state.web.mint(Some(MINTED_LOGIN_TTL)).map_err(ApiError::internal)?;
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({
            "path": format!("/login?token={secret}"),
            "expires_in_s": MINTED_LOGIN_TTL.as_secs(),
        })),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
struct PageQuery {
    session: Option<String>,
}

/// `GET /` and `GET /?session=ID`: the sessions and, when one is chosen (else the newest),
/// its summary, pending approvals and timeline.
async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<PageQuery>,
) -> Response {
    if !authenticated(&state, &headers) {
        return html(
            StatusCode::UNAUTHORIZED,
            shell(
                "keel: log in",
                "<p class=\"notice\">Not logged in. Open the login link <code>keel \
                 serve</code> printed (<code>http://HOST/login?token=…</code>); it works \
                 once.</p>",
            ),
        );
    }
    match render_page(&state, query.session.as_deref()).await {
        Ok(body) => html(StatusCode::OK, body),
        Err(error) => html(
            error.status,
            shell("keel: error", &format!("<p class=\"notice\">{}</p>", text(&error.message))),
        ),
    }
}

async fn render_page(state: &AppState, chosen: Option<&str>) -> Result<String, ApiError> {
    let host = &state.host;
    // The same sessions the API lists: those whose workspace the host admits.
    let mut rows = host.store.sessions().await.map_err(ApiError::internal)?;
    rows.retain(|row| visible(host, row));
    let chosen = match chosen {
        Some(id) => Some(
            rows.iter()
                .find(|row| row.id.to_string() == id.trim())
                .ok_or_else(|| ApiError::not_found("no such session"))?,
        ),
        None => rows.first(),
    };
    // Named as the API and `keel sessions` name them: a killed run is `interrupted`.
    let mut states = Vec::with_capacity(rows.len());
    for row in &rows {
        states.push(shown_state(host, row).await);
    }
    let mut body = String::new();
    body.push_str("<div class=\"layout\"><nav id=\"sessions\"><h2>Sessions</h2><ul>");
    for (row, shown) in rows.iter().zip(&states) {
        let current = chosen.is_some_and(|c| c.id == row.id);
        let _ = write!(
            body,
            "<li class=\"session state-{state}{current}\" data-session=\"{id}\"><a \
             href=\"/?session={id}\"><span class=\"title\">{title}</span><span \
             class=\"meta\">{state} · {model} · {updated}</span></a></li>",
            state = text(shown),
            current = if current { " current" } else { "" },
            id = row.id,
            title = text(&one_line_clip(&row.title, 80)),
            model = text(&row.model),
            updated = row.updated_at.format("%Y-%m-%d %H:%M:%S"),
        );
    }
    if rows.is_empty() {
        body.push_str("<li class=\"empty\">No sessions yet.</li>");
    }
    body.push_str("</ul></nav>");
    match chosen {
        None => body.push_str("<main id=\"session\"><p class=\"notice\">No session.</p></main>"),
        Some(row) => {
            let events = host.store.read(row.id, Seq(0)).await.map_err(ApiError::internal)?;
            let last = events.last().map_or(0, |event| event.seq.0);
            let _ = write!(
                body,
                "<main id=\"session\" data-session=\"{id}\" data-last-seq=\"{last}\"><h2 \
                 class=\"title\">{title}</h2><p id=\"summary\">{summary}</p><section \
                 id=\"approvals\">{approvals}</section><h3>Timeline</h3><ol \
                 id=\"timeline\">{entries}</ol></main>",
                id = row.id,
                title = text(&one_line_clip(&row.title, 200)),
                summary = summary_html(row, shown_state(host, row).await, &events),
                approvals = approvals_html(row.id, &events),
                entries = entries_html(&events, Seq(0)),
            );
        }
    }
    body.push_str("</div>");
    Ok(shell("keel", &body))
}

#[derive(Debug, Deserialize)]
struct FragmentQuery {
    after: Option<u64>,
}

/// `GET /web/sessions/{id}/fragment?after=SEQ`: what the page's script inserts when the
/// stream says something was recorded: the entries after `SEQ`, the approvals and the
/// summary, rendered (and escaped) here.
async fn fragment(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(query): Query<FragmentQuery>,
) -> Result<Response, ApiError> {
    let session_id = uuid::Uuid::try_parse(&id)
        .map(SessionId)
        .map_err(|_| ApiError::bad_request("a session id is a UUID (36 characters)"))?;
    let row = state.host.store.session(session_id).await.map_err(ApiError::internal)?;
    let row = row
        .filter(|row| visible(&state.host, row))
        .ok_or_else(|| ApiError::not_found(format!("no session {session_id}")))?;
    let events = state.host.events(session_id).await?;
    let after = Seq(query.after.unwrap_or(0));
    let body = json!({
        "entries": entries_html(&events, after),
        "approvals": approvals_html(session_id, &events),
        "summary": summary_html(&row, shown_state(&state.host, &row).await, &events),
        "last_seq": events.last().map_or(0, |event| event.seq.0),
    });
    Ok(harden(axum::Json(body).into_response()))
}
