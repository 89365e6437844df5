//! keel-acp: `keel acp`, keel as an Agent Client Protocol v1 agent on stdio (DESIGN.md §9 "ACP
//! agent"), with the official `agent-client-protocol` crate.
//!
//! - One identity: the ACP `sessionId` is the keel session id.
//! - Each session is built by the composition root ([`keel_host::root::prepare`] and
//!   [`keel_host::root::assemble`]) for its `cwd`, with workspace trust as everywhere; the
//!   client's MCP servers join the config's as the user's own (the client is the user's
//!   editor) and their calls are gated like any other.
//! - Updates come from ledger events through [`render::Renderer`], the same projection
//!   `session/load` replays.
//! - Consent goes through [`keel_host::approval::Approver`]; the person it asks is the client
//!   ([`person::ClientPerson`], `session/request_permission`), with a bounded wait.
//! - A client that disconnects mid-turn cancels the turn; the run is recorded as cancelled
//!   before the process exits.
//! - A `session/prompt` while a turn runs is queued into that turn (steering): it joins at
//!   the run's next step boundary (`input_joined`) and is answered with the turn's stop
//!   reason when the turn ends; one sent as the turn ends is refused (send it again).
//!
//! Entry point: [`serve`] with [`AcpOptions`].
#![forbid(unsafe_code)]

mod agent;
mod client;
mod connection;
mod error;
mod live;
mod modes;
pub mod person;
pub mod render;

pub use agent::AcpOptions;
pub use connection::serve;
