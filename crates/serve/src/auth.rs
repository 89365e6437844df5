//! Who may use the host: API clients with the bearer token ([`require_token`]), and
//! browsers logged in to the web timeline with a cookie ([`WebAuth`], [`require_auth`]).
//!
//! Invariants:
//! - **The token is never shown.** It is compared in constant time and never logged,
//!   echoed or printed ([`AppState`]'s `Debug` leaves it out).
//! - **Login is one use.** `keel serve` prints `/login?token=…`; the first request with
//!   it gets an HttpOnly, SameSite=Strict cookie and the token is spent. More links come
//!   from `POST /v1/web/logins` (bearer or cookie), each good once for five minutes.
//! - **A cookie alone changes nothing.** A state-changing request with the cookie also
//!   needs `X-Keel-Web: 1` (which no cross-origin form can send, and no cross-origin
//!   script can without a CORS preflight the host never answers), an `Origin` equal to
//!   the host's own, and a loopback `Host` (against DNS rebinding) unless
//!   `--allow-remote`. API clients use the bearer token as before.

use std::collections::VecDeque;
use std::io::Read as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::Host;

/// The shared state of every handler: the host and its token.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) host: Arc<Host>,
    pub(crate) token: Arc<str>,
    /// The web timeline's login links and logged-in browsers.
    pub(crate) web: Arc<WebAuth>,
}

/// Leaves the token out, so no `{:?}` can log it.
impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("host", &self.host).finish_non_exhaustive()
    }
}

/// The cookie that carries a logged-in browser.
pub(crate) const COOKIE: &str = "keel_web";
/// The header a cookie-authenticated state-changing request must carry.
const CSRF_HEADER: &str = "x-keel-web";
/// Browsers logged in at once; the oldest is logged out past this.
const MAX_COOKIES: usize = 64;
/// Unused login links kept at once; the oldest is dropped past this.
const MAX_LOGINS: usize = 16;

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
    pub(crate) fn redeem(&self, offered: &str) -> Option<String> {
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
    pub(crate) fn has_cookie(&self, headers: &HeaderMap) -> bool {
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

/// Answers 401 unless `Authorization: Bearer TOKEN` carries the host's token (compared in
/// constant time). The token is never logged or echoed.
pub(crate) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let offered = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    match offered {
        Some(offered) if constant_time_eq(offered.as_bytes(), state.token.as_bytes()) => {
            next.run(request).await
        }
        _ => {
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token (Authorization: Bearer TOKEN; the token is \
                 KEEL_SERVE_TOKEN or KEEL_HOME/serve.token)",
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The API's guard: a logged-in browser's cookie (with the CSRF checks for a
/// state-changing request), else the bearer token ([`require_token`]).
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
    require_token(State(state), request, next).await
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

/// Whether the request is authenticated: the cookie, or the bearer token.
pub(crate) fn authenticated(state: &AppState, headers: &HeaderMap) -> bool {
    if state.web.has_cookie(headers) {
        return true;
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|offered| constant_time_eq(offered.trim().as_bytes(), state.token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
