//! `keel serve`: the host (DESIGN.md §9 "Host HTTP API").
//!
//! Many sessions over HTTP/SSE on the same composition root as `keel run`
//! ([`keel_host::root`]). Invariants:
//! - **Events are the ledger.** The SSE stream reads the store; an id is a ledger seq.
//! - **Approvals are ledger facts.** A hosted run's consent request is
//!   `permission_requested`; it is answered over HTTP, by deny after `approval_timeout`, or
//!   asked again by the next host that starts ([`state::Host::resume_awaiting`]).
//! - **One driver per session.** Runs go under the kernel's lease; a host takes over the
//!   runs of dead processes (`state::Host::take_over`), at start and periodically.
//! - **Admission before agent code.** Sealed sessions and workspaces outside the allowed
//!   roots answer 423 (403 at creation); a full host answers 503 with `Retry-After`.
//! - **Closed by default.** Loopback unless `--allow-remote`; every route but
//!   `/v1/health` needs the bearer token; bodies are capped; no CORS; the token is never
//!   printed or logged.
//! - **The web timeline** (`GET /`, [`web`]) escapes all ledger text, logs a browser in
//!   with a one-time link (printed at start; not the bearer token) for an HttpOnly,
//!   SameSite=Strict cookie, and takes a state change with the cookie only with its CSRF
//!   header and a same-origin `Origin`.

mod api;
mod approvals;
mod events;
mod ledger;
mod openapi;
mod schedules;
mod state;
mod steer;
mod token;
mod web;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_host::root;

/// The host's settings (`keel serve` flags).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen (`127.0.0.1:7711`; port 0 picks one, printed at start).
    pub listen: SocketAddr,
    /// Whether a non-loopback `listen` is allowed (`--allow-remote`).
    pub allow_remote: bool,
    /// Workspaces must lie inside one of these (canonicalized at start).
    pub workspace_roots: Vec<PathBuf>,
    /// Runs driven at once; more answer 503.
    pub max_runs: usize,
    /// How long a permission request waits for an answer before it ends as deny.
    pub approval_timeout: Duration,
    /// Time between `: ping` comments on an idle stream.
    pub ping_interval: Duration,
    /// How often a stream re-reads the store for writes by other processes.
    pub poll_interval: Duration,
    /// A client that takes no event for this long is dropped.
    pub slow_client: Duration,
    /// Events buffered per stream.
    pub sse_buffer: usize,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// How often the host looks for runs of dead processes to take over.
    pub takeover_interval: Duration,
}

impl ServeConfig {
    /// The defaults for `listen`: 16 runs, a 10-minute approval timeout, 15 s pings,
    /// 1 s polls, 30 s for a slow client, 256 buffered events, 1 MiB bodies, a takeover
    /// check every 10 s; workspaces inside `workspace_roots`.
    pub fn new(listen: SocketAddr, workspace_roots: Vec<PathBuf>) -> ServeConfig {
        ServeConfig {
            listen,
            allow_remote: false,
            workspace_roots,
            max_runs: 16,
            approval_timeout: Duration::from_secs(600),
            ping_interval: Duration::from_secs(15),
            poll_interval: Duration::from_secs(1),
            slow_client: Duration::from_secs(30),
            sse_buffer: 256,
            max_body_bytes: 1024 * 1024,
            takeover_interval: keel_kernel::LEASE_RENEW_EVERY,
        }
    }
}

/// Runs the host until the process ends: opens the store, repairs runs dead processes
/// left open, asks pending permission requests again, then serves.
///
/// # Errors
///
/// A usage error for a non-loopback address without `allow_remote`, a workspace root
/// that does not exist, or an unusable token file; an error when the store cannot be
/// opened or the address bound.
///
/// # Cancel safety
///
/// Dropping it stops serving; runs in flight stop with the runtime and are repaired by
/// the next start.
pub async fn serve(mut config: ServeConfig) -> anyhow::Result<()> {
    if !config.listen.ip().is_loopback() && !config.allow_remote {
        return Err(keel_host::error::usage(format!(
            "refusing to listen on {}: it is not a loopback address; pass --allow-remote to \
             serve other machines (anyone who can reach it and has the token drives agents)",
            config.listen
        )));
    }
    let mut roots = Vec::new();
    for dir in &config.workspace_roots {
        let canonical = dir.canonicalize().map_err(|error| {
            keel_host::error::usage(format!("workspace root {}: {error}", dir.display()))
        })?;
        roots.push(canonical);
    }
    config.workspace_roots = roots;
    let (home, store, schedule_store) = root::open_stores().await?;
    let token = token::load(&home)?;
    let host = Arc::new(state::Host::new(store, home, config.clone()));
    let listener = tokio::net::TcpListener::bind(config.listen).await.map_err(|error| {
        keel_host::error::usage(format!("cannot listen on {}: {error}", config.listen))
    })?;
    let address = listener.local_addr()?;
    let web = Arc::new(web::WebAuth::default());
    let login = web.mint(None)?;
    let router = api::router(api::AppState {
        host: host.clone(),
        token: token.secret.into(),
        web: web.clone(),
    });
    // Printed for people and scripts (a port 0 becomes the real one); the token is not.
    {
        use std::io::Write as _;
        // A closed stdout is no reason to stop serving.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "keel serve: listening on http://{address}");
        // The web timeline's one-time login link (not the bearer token): spent on first use.
        let _ = writeln!(out, "keel serve: web timeline at http://{address}/login?token={login}");
        let _ = out.flush();
    }
    eprintln!("keel serve: bearer token from {}", token.source);
    // Runs dead processes left are taken over now and every `takeover_interval`; pending
    // requests nobody waits for are asked again.
    let resumer = host.clone();
    tokio::spawn(async move {
        resumer.take_over().await;
        resumer.resume_awaiting().await;
        let mut every = tokio::time::interval(resumer.config.takeover_interval);
        every.tick().await;
        loop {
            every.tick().await;
            resumer.take_over().await;
        }
    });
    // Schedules fire and waiting runs wake from boot, with no client connected.
    schedules::start(host.clone(), schedule_store);
    axum::serve(listener, router).await?;
    Ok(())
}

/// A `--listen` address: `IP:PORT` (`[::1]:PORT` for IPv6), or `localhost:PORT`, which is
/// the IPv4 loopback (no resolver is asked: `localhost` is always this machine here).
///
/// # Errors
///
/// A message naming the accepted forms, for any other text (a host name other than
/// `localhost`, a missing or invalid port).
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    let invalid = || {
        format!(
            "invalid address '{text}': give IP:PORT (127.0.0.1:7711, [::1]:7711) or \
             localhost:PORT"
        )
    };
    let (host, port) = text.rsplit_once(':').ok_or_else(invalid)?;
    if !host.eq_ignore_ascii_case("localhost") {
        return Err(invalid());
    }
    let port: u16 = port.parse().map_err(|_| invalid())?;
    Ok(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_ip_and_port_or_localhost_and_refuses_other_names() {
        assert_eq!(parse_listen("127.0.0.1:7711"), Ok(SocketAddr::from(([127, 0, 0, 1], 7711))));
        assert_eq!(parse_listen("localhost:7711"), Ok(SocketAddr::from(([127, 0, 0, 1], 7711))));
        assert_eq!(parse_listen("LOCALHOST:0"), Ok(SocketAddr::from(([127, 0, 0, 1], 0))));
        let v6 = parse_listen("[::1]:8080");
        assert!(v6.is_ok_and(|address| address.ip().is_loopback() && address.port() == 8080));
        let wide = parse_listen("0.0.0.0:7711");
        assert!(wide.is_ok_and(|address| !address.ip().is_loopback()));
        for bad in ["localhost", "localhost:", "localhost:99999", "example.com:7711", "", ":7711"] {
            assert!(parse_listen(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
