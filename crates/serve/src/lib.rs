//! keel-serve: `keel serve`, the host (DESIGN.md §9 "Host HTTP API").
//!
//! Many sessions over HTTP/SSE on the same composition root as `keel run`
//! ([`keel_host::root`]). Entry points: [`serve`] with a [`ServeConfig`]. Invariants:
//! - **Events are the ledger.** The SSE stream reads the store; an id is a ledger seq.
//! - **Approvals are ledger facts.** A hosted run's consent request is
//!   `permission_requested`; it is answered over HTTP, by deny after `approval_timeout`, or
//!   asked again by the next host that starts (`Host::resume_awaiting`).
//! - **One driver per session.** Runs go under the kernel's lease; a host takes over the
//!   runs of dead processes (`Host::take_over`), at start and periodically.
//! - **Admission before agent code.** Sealed sessions and workspaces outside the allowed
//!   roots answer 423 (403 at creation); a full host answers 503 with `Retry-After`.
//! - **Closed by default.** Loopback unless `--allow-remote`; every route but
//!   `/v1/health` needs the bearer token; bodies are capped; no CORS; the token is never
//!   printed or logged.
//! - **The web timeline** (`GET /`, `web`) escapes all ledger text, logs a browser in
//!   with a one-time link (printed at start; not the bearer token) for an HttpOnly,
//!   SameSite=Strict cookie, and takes a state change with the cookie only with its CSRF
//!   header and a same-origin `Origin`.
#![forbid(unsafe_code)]

// Its settings and its start.
mod boot;
mod config;

// The host: the runs it drives, the answers in flight, what a session's ledger says, and
// which sessions it shows.
mod approvals;
mod ledger;
mod sessions;
mod state;

// Who may call: the bearer token, browser logins.
mod auth;
mod token;

// The wire: failures as answers, extractors, request bodies.
mod error;
mod extract;
mod wire;

// The routes: sessions, answers, steering, the event stream, schedules and wakes, the web
// timeline, the OpenAPI document.
mod answers;
mod api;
mod events;
mod openapi;
mod schedules;
mod steer;
mod web;

pub use boot::serve;
pub use config::{ServeConfig, parse_listen};
