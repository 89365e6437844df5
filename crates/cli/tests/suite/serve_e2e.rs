//! `keel serve` over real HTTP (DESIGN.md §9 "Host HTTP API"): the real binary on
//! 127.0.0.1:0, reqwest as the client, the scripted model, and `kill -9` of the host.

pub(crate) mod harness;

mod admission;
mod approvals;
mod auth;
mod postgres;
mod sessions;
mod takeover;
