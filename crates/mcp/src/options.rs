//! What MCP servers are started with, chosen by the composition root ([`StartOptions`]):
//! the log folder, the workspace, the inherited environment ([`INHERITED_ENV_VARS`]), bearer
//! tokens ([`BearerTokens`]), the elicitation policy and the OAuth store.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use crate::client::ElicitationPolicy;
use crate::config::{ServerSpec, TransportSpec};
use crate::oauth::OAuthStore;

/// Environment variables a stdio server inherits from keel; everything else it gets from
/// its own `env` table. keel's API keys (`OPENAI_API_KEY`, ...) are never passed on.
pub const INHERITED_ENV_VARS: &[&str] = &[
    "HOME",
    "PATH",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
];

/// What servers are started with, chosen by the composition root.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Where `mcp-<server>.log` files go (e.g. `KEEL_HOME/logs`); created when missing.
    pub log_dir: PathBuf,
    /// The workspace: a stdio server's default working folder, and what a relative `cwd`
    /// resolves against.
    pub workspace: PathBuf,
    /// The inherited environment: normally the process's values of
    /// [`INHERITED_ENV_VARS`].
    pub inherited_env: BTreeMap<OsString, OsString>,
    /// The values of the variables that `bearer_token_env` keys name, read by the
    /// composition root (normally [`BearerTokens::from_env`]); keel-mcp reads no process
    /// environment itself.
    pub bearer_tokens: BearerTokens,
    /// How servers' `elicitation/create` requests are answered.
    pub elicitation: ElicitationPolicy,
    /// Where OAuth logins are stored (normally `KEEL_HOME/mcp/oauth`); `None`: URL servers
    /// get no stored OAuth tokens.
    pub oauth: Option<OAuthStore>,
}

/// Bearer tokens by environment variable name. `Debug` prints the names only.
#[derive(Clone, Default)]
pub struct BearerTokens(pub BTreeMap<String, String>);

impl BearerTokens {
    /// The process environment's values of every `bearer_token_env` of `specs` that is set
    /// and not empty.
    pub fn from_env(specs: &[ServerSpec]) -> BearerTokens {
        let mut tokens = BTreeMap::new();
        for spec in specs {
            if let TransportSpec::Http { bearer_token_env: Some(variable), .. } = &spec.transport
                && let Ok(value) = std::env::var(variable)
                && !value.is_empty()
            {
                tokens.insert(variable.clone(), value);
            }
        }
        BearerTokens(tokens)
    }
}

impl std::fmt::Debug for BearerTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.keys().map(|name| (name, "<redacted>"))).finish()
    }
}
