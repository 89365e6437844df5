//! OAuth 2.1 for streamable-HTTP servers, as the MCP authorization spec (2025-11-25)
//! describes, on rmcp's `auth` module: [`login`] runs the authorization-code flow once
//! (`keel mcp login NAME`), [`OAuthStore`] keeps what it got, and a connection uses the
//! stored login ([`authorized_manager`]) with refresh on expiry and on 401.
//!
//! The flow ([`login`]):
//! 1. POST `initialize` without a token; the 401's `WWW-Authenticate` names the protected
//!    resource metadata (RFC 9728) and maybe a `scope`.
//! 2. rmcp discovers: the metadata URL from the challenge, else the well-known URLs (path
//!    inserted, then root); the metadata's `resource` must name this server; then the
//!    authorization server's metadata (RFC 8414 and OpenID discovery, path-inserted forms
//!    first), whose `issuer` must match. Only addresses of the server's own class are
//!    fetched (a loopback address only for a loopback server).
//! 3. keel refuses what it cannot use safely: no metadata at all (no endpoints guessed), an
//!    authorization server that does not advertise PKCE `S256`, and an `http://` endpoint
//!    unless both it and the MCP server are on loopback.
//! 4. The client: the user's pre-registered `oauth_client_id`; else a client ID metadata
//!    document (`oauth_client_metadata_url`) where supported; else dynamic registration
//!    (RFC 7591) with a loopback redirect URI; else an error that says to pre-register.
//! 5. Scopes: the challenge's `scope`, else the resource metadata's `scopes_supported`,
//!    else none. The authorization URL carries PKCE S256, `state` and `resource` (RFC 8707,
//!    the server's URL); the [`Browser`] sends the user there; the redirect arrives at
//!    `http://127.0.0.1:PORT/callback` (keel listens there for the flow's duration only),
//!    its `state` must match, and the code is exchanged for tokens.
//!
//! Tokens live in `KEEL_HOME/mcp/oauth/<sha256 of the server's canonical URL>.json`, mode
//! 0600 in a 0700 folder, keyed by (and checked against) that URL: a token is only ever
//! sent to the URL it was issued for. `Debug` of everything here redacts them.
//!
//! The parts: `discovery` (the probe for the challenge, rmcp's discovery and keel's
//! metadata checks), `registration` (which client keel logs in as), `redirect` (the
//! one-shot loopback listener), `browser` (the [`Browser`] step), `store` (the token files,
//! [`OAuthStore`]), `credentials` (rmcp's credential store over a token file, and
//! `authorized_manager` for a connection) and `flow` (the login itself, [`login`]).

mod browser;
mod credentials;
mod discovery;
mod flow;
mod redirect;
mod registration;
mod store;
#[cfg(test)]
mod tests;

pub use crate::error::OAuthError;
pub use browser::{Browser, FetchingBrowser};
pub(crate) use credentials::authorized_manager;
pub use flow::{DEFAULT_LOGIN_TIMEOUT, LoginOptions, LoginReport, login, login_with_challenge};
pub(crate) use store::note_step_up;
pub use store::{OAuthStore, canonical_url};
