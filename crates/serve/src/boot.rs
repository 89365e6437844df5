//! Boot: what `keel serve` does at start (open the store, check the roots, load the token,
//! bind, print the address and the login link, start the takeover loop and the
//! scheduler), then serve until the process ends.

use std::sync::Arc;

use keel_host::root;

use crate::auth::{AppState, WebAuth};
use crate::config::ServeConfig;
use crate::state::Host;
use crate::{api, schedules, token};

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
    let host = Arc::new(Host::new(store, home, config.clone()));
    let listener = tokio::net::TcpListener::bind(config.listen).await.map_err(|error| {
        keel_host::error::usage(format!("cannot listen on {}: {error}", config.listen))
    })?;
    let address = listener.local_addr()?;
    let web = Arc::new(WebAuth::default());
    let login = web.mint(None)?;
    let router =
        api::router(AppState { host: host.clone(), token: token.secret.into(), web: web.clone() });
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
