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
//! - **Login is one use.** `keel serve` prints `/login?token=…`; the first request with
//!   it gets an HttpOnly, SameSite=Strict cookie and the token is spent. More links come
//!   from `POST /v1/web/logins` (bearer or cookie), each good once for five minutes.
//! - **A cookie alone changes nothing.** A state-changing request with the cookie also
//!   needs `X-Keel-Web: 1` (which no cross-origin form can send, and no cross-origin
//!   script can without a CORS preflight the host never answers), an `Origin` equal to
//!   the host's own, and a loopback `Host` (against DNS rebinding) unless
//!   `--allow-remote`. API clients use the bearer token as before.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Read as _;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use keel_contracts::{RuntimeEvent, Seq, SessionId, SessionSummary};
use serde::Deserialize;
use serde_json::{Value, json};

use super::api::{ApiError, AppState};
use super::ledger;
use keel_host::terminal::neutralize;

/// The cookie that carries a logged-in browser.
const COOKIE: &str = "keel_web";
/// The header a cookie-authenticated state-changing request must carry.
const CSRF_HEADER: &str = "x-keel-web";
/// Browsers logged in at once; the oldest is logged out past this.
const MAX_COOKIES: usize = 64;
/// Unused login links kept at once; the oldest is dropped past this.
const MAX_LOGINS: usize = 16;
/// How long a login link from `POST /v1/web/logins` is good for.
const MINTED_LOGIN_TTL: Duration = Duration::from_secs(300);
/// Characters of one text shown in the timeline before it is clipped.
const MAX_TEXT: usize = 4000;
/// Lines of one diff shown.
const MAX_DIFF_LINES: usize = 200;

const PAGE_CSS: &str = include_str!("web/app.css");
const PAGE_JS: &str = include_str!("web/app.js");

/// The policy of every page: scripts and styles only from this host, no inline script
/// (so an injected `<script>` or `onerror=` would not run even if it got through), no
/// framing, forms post only here.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// Login links and logged-in browsers. Held in memory: a host restart logs browsers out.
#[derive(Default)]
pub(crate) struct WebAuth {
    logins: Mutex<VecDeque<Login>>,
    cookies: Mutex<VecDeque<String>>,
}

/// Leaves the secrets out.
impl std::fmt::Debug for WebAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebAuth").finish_non_exhaustive()
    }
}

struct Login {
    secret: String,
    expires: Option<Instant>,
}

impl WebAuth {
    /// A new login secret, good once (and until `ttl` when given).
    ///
    /// # Errors
    ///
    /// When `/dev/urandom` cannot be read.
    pub(crate) fn mint(&self, ttl: Option<Duration>) -> std::io::Result<String> {
        let secret = random_hex()?;
        let mut logins = self.logins.lock().unwrap_or_else(PoisonError::into_inner);
        if logins.len() >= MAX_LOGINS {
            logins.pop_front();
        }
        logins
            .push_back(Login { secret: secret.clone(), expires: ttl.map(|t| Instant::now() + t) });
        Ok(secret)
    }

    /// Spends a login secret: the new cookie's value, or `None` when the secret is wrong,
    /// spent or expired. Every kept secret is compared in constant time.
    fn redeem(&self, offered: &str) -> Option<String> {
        let now = Instant::now();
        let found = {
            let mut logins = self.logins.lock().unwrap_or_else(PoisonError::into_inner);
            logins.retain(|login| login.expires.is_none_or(|at| at > now));
            let mut found = None;
            for (index, login) in logins.iter().enumerate() {
                if constant_time_eq(login.secret.as_bytes(), offered.as_bytes()) {
                    found = Some(index);
                }
            }
            found.and_then(|index| logins.remove(index))
        };
        found?;
        let cookie = random_hex().ok()?;
        let mut cookies = self.cookies.lock().unwrap_or_else(PoisonError::into_inner);
        if cookies.len() >= MAX_COOKIES {
            cookies.pop_front();
        }
        cookies.push_back(cookie.clone());
        Some(cookie)
    }

    /// Whether the request carries the cookie of a logged-in browser.
    fn has_cookie(&self, headers: &HeaderMap) -> bool {
        let offered: Vec<&str> = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .collect();
        if offered.is_empty() {
            return false;
        }
        let cookies = self.cookies.lock().unwrap_or_else(PoisonError::into_inner);
        let mut hit = false;
        for value in &offered {
            for cookie in cookies.iter() {
                hit |= constant_time_eq(cookie.as_bytes(), value.as_bytes());
            }
        }
        hit
    }
}

fn random_hex() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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

/// The API's guard: a logged-in browser's cookie (with the CSRF checks for a
/// state-changing request), else the bearer token ([`super::api::require_token`]).
pub(crate) async fn require_auth(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if state.web.has_cookie(request.headers()) {
        let safe = matches!(*request.method(), Method::GET | Method::HEAD);
        if !safe && let Err(why) = same_origin(request.headers(), state.host.config.allow_remote) {
            return ApiError::forbidden(why).into_response();
        }
        return next.run(request).await;
    }
    super::api::require_token(State(state), request, next).await
}

/// The CSRF checks of a cookie-authenticated state-changing request.
fn same_origin(headers: &HeaderMap, allow_remote: bool) -> Result<(), String> {
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if text(CSRF_HEADER) != Some("1") {
        return Err("a browser request that changes something needs the X-Keel-Web: 1 header \
                    (the page's script sends it)"
            .to_owned());
    }
    let host = text("host").ok_or("the request has no Host header")?;
    if !allow_remote && !loopback_host(host) {
        return Err(format!("Host {host:?} is not a loopback address"));
    }
    match text("origin") {
        Some(origin) if origin == format!("http://{host}") => {}
        Some(_) => return Err("a cross-origin request is refused".to_owned()),
        None => return Err("a browser request that changes something needs Origin".to_owned()),
    }
    if let Some(site) = text("sec-fetch-site")
        && site != "same-origin"
    {
        return Err("a cross-site request is refused".to_owned());
    }
    Ok(())
}

/// `127.0.0.1:7711`, `[::1]:7711`, `localhost:7711`: names that cannot be rebound.
fn loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
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

/// Whether the request is authenticated: the cookie, or the bearer token.
fn authenticated(state: &AppState, headers: &HeaderMap) -> bool {
    if state.web.has_cookie(headers) {
        return true;
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|offered| constant_time_eq(offered.trim().as_bytes(), state.token.as_bytes()))
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
    rows.retain(|row| super::api::visible(host, row));
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
        states.push(super::api::shown_state(host, row).await);
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
                summary = summary_html(row, super::api::shown_state(host, row).await, &events),
                approvals = approvals_html(row.id, &events),
                entries = entries_html(&events, Seq(0)),
            );
        }
    }
    body.push_str("</div>");
    Ok(shell("keel", &body))
}

/// The page around `body`: the stylesheet and script from this host, nothing inline.
fn shell(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta \
         name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title}</title>\
         <link rel=\"stylesheet\" href=\"/web/app.css\"><script src=\"/web/app.js\" \
         defer></script></head><body><header><h1>keel</h1><span class=\"version\">{version}\
         </span><span id=\"live\" class=\"live\"></span></header>{body}</body></html>",
        title = text(title),
        version = env!("CARGO_PKG_VERSION"),
    )
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
        .filter(|row| super::api::visible(&state.host, row))
        .ok_or_else(|| ApiError::not_found(format!("no session {session_id}")))?;
    let events = state.host.events(session_id).await?;
    let after = Seq(query.after.unwrap_or(0));
    let body = json!({
        "entries": entries_html(&events, after),
        "approvals": approvals_html(session_id, &events),
        "summary": summary_html(&row, super::api::shown_state(&state.host, &row).await, &events),
        "last_seq": events.last().map_or(0, |event| event.seq.0),
    });
    Ok(harden(axum::Json(body).into_response()))
}

/// Escapes `raw` for HTML text and attribute values, with its control characters made
/// visible first.
pub(crate) fn text(raw: &str) -> String {
    let shown = neutralize(raw);
    let mut out = String::with_capacity(shown.len());
    for c in shown.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A path segment: everything but unreserved characters percent-encoded.
fn segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn clip(raw: &str, max_chars: usize) -> String {
    let mut chars = raw.chars();
    let mut out: String = chars.by_ref().take(max_chars).collect();
    if chars.next().is_some() {
        out.push_str("\n… (clipped)");
    }
    out
}

fn one_line_clip(raw: &str, max_chars: usize) -> String {
    keel_host::terminal::one_line(raw, max_chars)
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn summary_html(row: &SessionSummary, shown: &str, events: &[RuntimeEvent]) -> String {
    let usage = ledger::usage(events);
    // Counts that include keel's own estimates (the provider did not report them) are
    // marked so, never shown as exact.
    let estimated = usage.estimated_tokens > 0 || usage.responses_without_usage > 0;
    let (mark, note) = if estimated { ("~", " (estimated in part)") } else { ("", "") };
    let cost = match usage.cost_usd {
        Some(cost) => format!("${cost:.4}"),
        None => "cost unknown".to_owned(),
    };
    format!(
        "<span class=\"state state-{state}\">{state}</span> · <span \
         class=\"workspace\">{workspace}</span> · <span class=\"model\">{model}</span> · \
         <span class=\"usage\">{mark}{input} in / {mark}{output} out tokens{note}</span> · \
         <span class=\"cost\">{cost}</span>",
        state = text(shown),
        workspace = text(&row.workspace),
        model = text(&row.model),
        input = usage.input_tokens,
        output = usage.output_tokens,
    )
}

/// The pending approvals, each with its buttons: a form whose action is the API's answer
/// route; the script posts `{answer}` there with the CSRF header.
fn approvals_html(session_id: SessionId, events: &[RuntimeEvent]) -> String {
    let pending = ledger::pending(events);
    if pending.is_empty() {
        return String::new();
    }
    let mut out = String::from("<h3>Pending approvals</h3>");
    for request in &pending {
        let call = &request.call_id.0;
        let action = format!("/v1/sessions/{session_id}/permissions/{}", segment(call));
        let access = serde_json::to_value(request.access).unwrap_or(Value::Null);
        let _ = write!(
            out,
            "<div class=\"approval\" data-call=\"{call}\"><p><b class=\"tool\">{tool}</b> asks \
             for <b>{access}</b> access (call <code>{call}</code>)</p>{detail}<div \
             class=\"buttons\">",
            call = text(call),
            tool = text(&request.tool),
            access = text(access.as_str().unwrap_or("?")),
            detail = call_detail(&request.tool, &request.arguments),
        );
        for (answer, label) in [
            ("allow_once", "Allow once"),
            ("allow_session", "Allow for this session"),
            ("deny", "Deny"),
        ] {
            let _ = write!(
                out,
                "<form class=\"answer\" method=\"post\" action=\"{action}\" \
                 data-answer=\"{answer}\"><button type=\"submit\" class=\"{answer}\" \
                 name=\"answer\" value=\"{answer}\">{label}</button></form>",
                action = text(&action),
            );
        }
        out.push_str("</div></div>");
    }
    out
}

/// A tool call's arguments: a diff for `edit_file` and `write_file`, else the JSON.
fn call_detail(tool: &str, arguments: &Value) -> String {
    let path = str_of(arguments, "path");
    match tool {
        "edit_file" => {
            let mut out =
                format!("<pre class=\"diff\"><span class=\"path\">{}</span>\n", text(path));
            diff_lines(&mut out, str_of(arguments, "old"), "del", '-');
            diff_lines(&mut out, str_of(arguments, "new"), "add", '+');
            out.push_str("</pre>");
            out
        }
        "write_file" => {
            let mut out = format!(
                "<pre class=\"diff\"><span class=\"path\">{} (whole file)</span>\n",
                text(path)
            );
            diff_lines(&mut out, str_of(arguments, "content"), "add", '+');
            out.push_str("</pre>");
            out
        }
        _ => format!(
            "<pre class=\"arguments\">{}</pre>",
            text(&clip(&serde_json::to_string_pretty(arguments).unwrap_or_default(), MAX_TEXT))
        ),
    }
}

fn diff_lines(out: &mut String, body: &str, class: &str, mark: char) {
    let mut lines = body.lines();
    for line in lines.by_ref().take(MAX_DIFF_LINES) {
        let _ = writeln!(out, "<span class=\"{class}\">{mark} {}</span>", text(line));
    }
    let rest = lines.count();
    if rest > 0 {
        let _ = writeln!(out, "<span class=\"more\">… {rest} more lines</span>");
    }
}

/// The timeline entries of events after `after`.
fn entries_html(events: &[RuntimeEvent], after: Seq) -> String {
    let mut out = String::new();
    for event in events.iter().filter(|event| event.seq > after) {
        entry_html(&mut out, event);
    }
    out
}

/// A run's usage totals; counts that include keel's estimates are marked `~`.
fn usage_text(usage: &Value) -> String {
    let n = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    if n("estimated_tokens") > 0 || n("responses_without_usage") > 0 {
        format!(
            "~{} in / ~{} out tokens (estimated in part)",
            n("input_tokens"),
            n("output_tokens")
        )
    } else {
        format!("{} in / {} out tokens", n("input_tokens"), n("output_tokens"))
    }
}

fn entry_html(out: &mut String, event: &RuntimeEvent) {
    let kind = event.kind.name();
    let value = serde_json::to_value(event).unwrap_or(Value::Null);
    let mut body = String::new();
    match kind {
        "session_created" => {
            let _ = write!(
                body,
                "workspace <code>{}</code> · model <code>{}</code>",
                text(str_of(&value, "workspace")),
                text(str_of(&value, "model"))
            );
        }
        "turn_started" => {
            let _ = write!(
                body,
                "<p class=\"input\">{}</p>",
                text(&clip(str_of(&value, "input"), MAX_TEXT))
            );
        }
        "model_response" => {
            let said = str_of(&value, "text");
            if !said.is_empty() {
                let _ = write!(body, "<p class=\"text\">{}</p>", text(&clip(said, MAX_TEXT)));
            }
            for call in value.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                let name = str_of(call, "name");
                let arguments = call.get("arguments").cloned().unwrap_or(Value::Null);
                let _ = write!(
                    body,
                    "<div class=\"call\"><span class=\"tool\">→ {}</span>{}</div>",
                    text(name),
                    call_detail(name, &arguments)
                );
            }
            let cost = match value.get("cost_usd").and_then(Value::as_f64) {
                Some(cost) => format!(" · ${cost:.4}"),
                None => String::new(),
            };
            // keel's own count stands in for what the provider did not report.
            let reported = value.get("usage").cloned().unwrap_or(Value::Null);
            let estimated = value.get("estimated_usage").cloned().unwrap_or(Value::Null);
            let n = |key: &str| match reported.get(key).and_then(Value::as_u64) {
                Some(n) => n.to_string(),
                None => match estimated.get(key).and_then(Value::as_u64) {
                    Some(n) => format!("~{n}"),
                    None => "?".to_owned(),
                },
            };
            let _ = write!(
                body,
                "<p class=\"usage\">{} in / {} out tokens{cost}</p>",
                n("input_tokens"),
                n("output_tokens")
            );
        }
        "run_started" => {
            let _ = write!(
                body,
                "mode {} · sandbox {} · approval {}",
                text(str_of(&value, "mode")),
                text(str_of(&value, "sandbox")),
                text(str_of(&value, "approval"))
            );
        }
        "run_composition" => {
            let _ = write!(
                body,
                "{} <code>{}</code>",
                text(str_of(&value, "provider")),
                text(str_of(&value, "model"))
            );
        }
        "model_requested" => {
            let n = |key: &str| value.get(key).and_then(Value::as_u64).unwrap_or(0);
            let _ = write!(body, "step {} · {} messages", n("step"), n("messages"));
        }
        "tool_attempt_prepared" => {
            let _ = write!(body, "<code>{}</code>", text(str_of(&value, "tool")));
        }
        "gate_decision" => {
            let _ = write!(
                body,
                "<code>{}</code>: {} <span class=\"reason\">{}</span>",
                text(str_of(&value, "tool")),
                text(str_of(&value, "decision")),
                text(&clip(str_of(&value, "reason"), MAX_TEXT))
            );
        }
        "permission_requested" => {
            let _ = write!(
                body,
                "<code>{}</code> asks for {} access",
                text(str_of(&value, "tool")),
                text(str_of(&value, "access"))
            );
        }
        "permission_settled" => {
            let _ = write!(
                body,
                "<code>{}</code>: <b class=\"answer\">{}</b> by {}",
                text(str_of(&value, "tool")),
                text(str_of(&value, "answer")),
                text(str_of(&value, "by"))
            );
        }
        "elicitation_requested" => {
            let _ = write!(
                body,
                "MCP server <code>{}</code> asks (its words): <span class=\"reason\">{}</span> \
                 — answer with <code>POST …/questions/{}</code>",
                text(str_of(&value, "server")),
                text(&clip(str_of(&value, "message"), MAX_TEXT)),
                text(str_of(&value, "question"))
            );
        }
        // The answer's values stay in the ledger: the page names the fields only.
        "elicitation_answered" => {
            let fields = value
                .get("content")
                .and_then(Value::as_object)
                .map(|content| content.keys().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            let _ = write!(
                body,
                "<b class=\"answer\">{}</b> by {} <span class=\"reason\">{}{}</span>",
                text(str_of(&value, "action")),
                text(str_of(&value, "by")),
                text(&clip(str_of(&value, "reason"), MAX_TEXT)),
                text(&if fields.is_empty() { String::new() } else { format!(" fields: {fields}") })
            );
        }
        "tools_changed" => {
            let names = |key: &str| {
                value
                    .get(key)
                    .and_then(Value::as_array)
                    .map(|names| {
                        names.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", ")
                    })
                    .unwrap_or_default()
            };
            let _ = write!(
                body,
                "tools added: {} · removed: {}",
                text(&clip(&names("added"), MAX_TEXT)),
                text(&clip(&names("removed"), MAX_TEXT))
            );
        }
        "tool_result" => {
            let outcome = str_of(&value, "outcome");
            let _ = write!(
                body,
                "<code>{}</code> <span class=\"outcome outcome-{o}\">{o}</span><pre \
                 class=\"output\">{}</pre>",
                text(str_of(&value, "tool")),
                text(&clip(str_of(&value, "content"), MAX_TEXT)),
                o = text(outcome),
            );
        }
        "run_completed" | "run_failed" | "run_suspended" | "run_cancelled" | "run_denied" => {
            let usage = value.get("usage").cloned().unwrap_or(Value::Null);
            let _ = write!(
                body,
                "<span class=\"reason\">{}</span> · {}",
                text(&clip(str_of(&value, "reason"), MAX_TEXT)),
                usage_text(&usage)
            );
        }
        _ => {
            let mut rest = value.clone();
            if let Some(map) = rest.as_object_mut() {
                for key in ["seq", "session_id", "turn_id", "run_id", "ts", "kind"] {
                    map.remove(key);
                }
            }
            let _ = write!(
                body,
                "<pre class=\"fields\">{}</pre>",
                text(&clip(&rest.to_string(), 1000))
            );
        }
    }
    let _ = write!(
        out,
        "<li class=\"entry kind-{kind}\" data-seq=\"{seq}\"><span class=\"seq\">#{seq}</span> \
         <span class=\"kind\">{label}</span> <span class=\"ts\">{ts}</span><div \
         class=\"body\">{body}</div></li>",
        seq = event.seq.0,
        label = kind.replace('_', " "),
        ts = event.ts.format("%H:%M:%S"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimated_token_counts_are_marked_and_reported_ones_are_not() {
        let reported = serde_json::json!({"input_tokens": 120, "output_tokens": 8,
                                          "estimated_tokens": 0, "responses_without_usage": 0});
        assert_eq!(usage_text(&reported), "120 in / 8 out tokens");
        let estimated = serde_json::json!({"input_tokens": 120, "output_tokens": 8,
                                           "estimated_tokens": 8, "responses_without_usage": 1});
        assert_eq!(usage_text(&estimated), "~120 in / ~8 out tokens (estimated in part)");
    }

    #[test]
    fn text_escapes_markup_and_shows_terminal_escapes() {
        let shown = text("<script>alert(1)</script>\"onerror='x' & \u{1b}[2K\u{202e}");
        assert_eq!(
            shown,
            "&lt;script&gt;alert(1)&lt;/script&gt;&quot;onerror=&#39;x&#39; &amp; \\x1b[2K\\u{202e}"
        );
        assert_eq!(text("plain é 日本"), "plain é 日本");
    }

    #[test]
    fn a_call_id_becomes_one_encoded_path_segment() {
        assert_eq!(segment("call_1"), "call_1");
        assert_eq!(segment("../x\"<y>"), "..%2Fx%22%3Cy%3E");
    }

    #[test]
    fn a_login_secret_works_once_and_a_cookie_is_then_recognised() {
        let auth = WebAuth::default();
        let secret = auth.mint(None).unwrap();
        assert!(auth.redeem("wrong").is_none());
        let cookie = auth.redeem(&secret).unwrap();
        assert!(auth.redeem(&secret).is_none(), "a login secret worked twice");
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("a=b; {COOKIE}={cookie}").parse().unwrap());
        assert!(auth.has_cookie(&headers));
        headers.insert(header::COOKIE, format!("{COOKIE}={secret}").parse().unwrap());
        assert!(!auth.has_cookie(&headers), "the login secret passed as a cookie");
        let expired = auth.mint(Some(Duration::ZERO)).unwrap();
        assert!(auth.redeem(&expired).is_none(), "an expired login secret worked");
    }

    #[test]
    fn csrf_checks_want_the_header_a_matching_origin_and_a_loopback_host() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        let good =
            [("x-keel-web", "1"), ("host", "127.0.0.1:7711"), ("origin", "http://127.0.0.1:7711")];
        assert!(same_origin(&headers(&good), false).is_ok());
        assert!(same_origin(&headers(&good[1..]), false).is_err(), "no X-Keel-Web");
        let evil =
            [("x-keel-web", "1"), ("host", "127.0.0.1:7711"), ("origin", "http://evil.test")];
        assert!(same_origin(&headers(&evil), false).is_err());
        let rebound =
            [("x-keel-web", "1"), ("host", "evil.test:7711"), ("origin", "http://evil.test:7711")];
        assert!(same_origin(&headers(&rebound), false).is_err(), "DNS rebinding");
        assert!(same_origin(&headers(&good[..2]), false).is_err(), "no Origin");
        let site = [
            ("x-keel-web", "1"),
            ("host", "localhost:1"),
            ("origin", "http://localhost:1"),
            ("sec-fetch-site", "cross-site"),
        ];
        assert!(same_origin(&headers(&site), false).is_err());
        assert!(
            loopback_host("[::1]:80") && loopback_host("localhost") && !loopback_host("10.0.0.1:1")
        );
    }
}
