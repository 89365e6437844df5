//! `[mcp_servers.NAME]` tables: what the user writes ([`McpServerConfig`]) and what keel
//! runs ([`ServerSpec`], after [`McpServerConfig::validate`]).
//!
//! ```toml
//! [mcp_servers.fs]
//! command = "npx"
//! args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
//! tool_timeout_ms = 30000
//! [mcp_servers.fs.tools.read_text_file]
//! access = "read"
//! [mcp_servers.remote]
//! url = "http://127.0.0.1:3001/mcp"
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use keel_contracts::{Access, Egress};
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// How long a server may take to start, initialize and list its tools, unless configured.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one tool call may take, unless configured.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest server name, in characters: `mcp__NAME__` then stays within the part of a
/// tool name that [`crate::keel_tool_name`] never cuts, so `mcp__NAME__*` rules cover
/// every tool of the server.
pub const MAX_SERVER_NAME_LEN: usize = 32;

/// One `[mcp_servers.NAME]` table as written. Unknown keys are errors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program of a stdio server (looked up on `PATH`).
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables set for it, on top of the few inherited ones
    /// ([`crate::INHERITED_ENV_VARS`]); keel's own API keys are never passed on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its working folder; relative to the workspace. Default: the workspace.
    pub cwd: Option<PathBuf>,
    /// The endpoint of a streamable HTTP server (`http://` or `https://`).
    pub url: Option<String>,
    /// HTTP headers sent with every request to a URL server, as written (`Debug` shows
    /// their names only).
    #[serde(default, skip_serializing_if = "HttpHeaders::is_empty")]
    pub headers: HttpHeaders,
    /// The environment variable that holds a bearer token for a URL server, sent as
    /// `Authorization: Bearer <token>`. The token is read when the server is connected and
    /// is never stored, shown or logged.
    pub bearer_token_env: Option<String>,
    /// OAuth: a client ID the server's authorization server issued to you out of band
    /// (pre-registration). Without it `keel mcp login` registers keel dynamically
    /// (RFC 7591) where the authorization server offers it.
    pub oauth_client_id: Option<String>,
    /// OAuth: the environment variable holding the secret of `oauth_client_id`, if it has
    /// one (read by `keel mcp login`, kept with the tokens).
    pub oauth_client_secret_env: Option<String>,
    /// OAuth: the `https://` URL of a client ID metadata document you host, used as the
    /// client ID when the authorization server supports them.
    pub oauth_client_metadata_url: Option<String>,
    /// Set by a composition root for a table that came from a workspace file: such a
    /// server never gets the user's stored OAuth tokens. Never read from TOML.
    #[serde(skip)]
    pub from_workspace: bool,
    /// Start-up budget: spawn or connect, initialize, list tools.
    pub startup_timeout_ms: Option<u64>,
    /// Budget for one tool call; on expiry the call is cancelled at the server.
    pub tool_timeout_ms: Option<u64>,
    /// Whether the server's own `readOnlyHint` annotations may make undeclared tools reads.
    #[serde(default)]
    pub trusted: bool,
    /// Per-tool declarations, keyed by the server's own tool name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolDeclaration>,
}

/// `headers = {...}` of a URL server: header names to values. The values may be secrets
/// (`X-Api-Key`), so `Debug` prints the names only.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HttpHeaders(pub BTreeMap<String, String>);

impl HttpHeaders {
    /// Whether no header is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for HttpHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.keys().map(|name| (name, "<redacted>"))).finish()
    }
}

/// `[mcp_servers.NAME.tools.TOOL]`: the user's declaration of one tool's access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDeclaration {
    /// `read` or `write`.
    pub access: Access,
    /// `none`, `internal` or `external`; default: `none` for a stdio server, `external` for
    /// a URL server.
    pub egress: Option<Egress>,
}

/// A validated server: everything needed to start it and declare its tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The server's name (the `NAME` of its table), `[A-Za-z0-9_-]`, no `__`.
    pub name: String,
    /// How to reach it.
    pub transport: TransportSpec,
    /// Start-up budget.
    pub startup_timeout: Duration,
    /// Budget for one tool call.
    pub tool_timeout: Duration,
    /// Whether `readOnlyHint` counts.
    pub trusted: bool,
    /// Per-tool declarations, keyed by the server's own tool name.
    pub tools: BTreeMap<String, ToolDeclaration>,
    /// OAuth client settings of a URL server (all empty by default).
    pub oauth: OAuthClientSpec,
    /// Whether the table came from a workspace file ([`McpServerConfig::from_workspace`]):
    /// then stored OAuth tokens are never used for it.
    pub from_workspace: bool,
}

/// The user's OAuth client settings for one URL server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuthClientSpec {
    /// A pre-registered client ID (`oauth_client_id`).
    pub client_id: Option<String>,
    /// The variable holding its secret (`oauth_client_secret_env`).
    pub client_secret_env: Option<String>,
    /// A client ID metadata document URL (`oauth_client_metadata_url`).
    pub client_metadata_url: Option<String>,
}

/// How a server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportSpec {
    /// A local process speaking JSON-RPC lines on stdin/stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment.
        env: BTreeMap<String, String>,
        /// Working folder (relative ones resolve against the workspace).
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The endpoint URL.
        url: String,
        /// Headers sent with every request (names checked to be valid HTTP).
        headers: HttpHeaders,
        /// The environment variable holding the bearer token, if any.
        bearer_token_env: Option<String>,
    },
}

/// Where a server runs, as far as its default effects go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// A local process started by keel (stdio).
    Stdio,
    /// A server reached by URL: whatever it is sent may leave the machine.
    Remote,
}

impl TransportSpec {
    /// Local (stdio) or remote (URL): decides the default declared effects.
    pub fn kind(&self) -> TransportKind {
        match self {
            TransportSpec::Stdio { .. } => TransportKind::Stdio,
            TransportSpec::Http { .. } => TransportKind::Remote,
        }
    }

    /// One line for humans: `stdio: npx -y pkg .` or `http: URL`.
    pub fn describe(&self) -> String {
        match self {
            TransportSpec::Stdio { command, args, .. } => {
                let mut line = format!("stdio: {command}");
                for arg in args {
                    line.push(' ');
                    line.push_str(arg);
                }
                line
            }
            TransportSpec::Http { url, .. } => format!("http: {url}"),
        }
    }
}

impl McpServerConfig {
    /// Checks the table named `name` and resolves its defaults: a name is `[A-Za-z0-9_-]`,
    /// without `__`, at most [`MAX_SERVER_NAME_LEN`] characters.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the server and the offending key.
    pub fn validate(&self, name: &str) -> Result<ServerSpec, ConfigError> {
        let server = || name.to_owned();
        // A longer name would let `keel_tool_name` cut into the `mcp__NAME__` prefix of its
        // tools, and a server-wide rule (`mcp__NAME__*`) would no longer cover them.
        let name_ok = !name.is_empty()
            && name.len() <= MAX_SERVER_NAME_LEN
            && !name.contains("__")
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(ConfigError::InvalidName { server: server() });
        }
        let transport = match (&self.command, &self.url) {
            (None, None) => return Err(ConfigError::NoTransport { server: server() }),
            (Some(_), Some(_)) => return Err(ConfigError::BothTransports { server: server() }),
            (Some(command), None) => {
                let http_only = [
                    ("headers", !self.headers.is_empty()),
                    ("bearer_token_env", self.bearer_token_env.is_some()),
                    ("oauth_client_id", self.oauth_client_id.is_some()),
                    ("oauth_client_secret_env", self.oauth_client_secret_env.is_some()),
                    ("oauth_client_metadata_url", self.oauth_client_metadata_url.is_some()),
                ];
                if let Some((key, _)) = http_only.iter().find(|(_, set)| *set) {
                    return Err(ConfigError::HttpOnlyKey { server: server(), key });
                }
                if command.trim().is_empty() {
                    return Err(ConfigError::EmptyCommand { server: server() });
                }
                TransportSpec::Stdio {
                    command: command.clone(),
                    args: self.args.clone(),
                    env: self.env.clone(),
                    cwd: self.cwd.clone(),
                }
            }
            (None, Some(url)) => {
                let stdio_only = [
                    ("args", !self.args.is_empty()),
                    ("env", !self.env.is_empty()),
                    ("cwd", self.cwd.is_some()),
                ];
                if let Some((key, _)) = stdio_only.iter().find(|(_, set)| *set) {
                    return Err(ConfigError::StdioOnlyKey { server: server(), key });
                }
                let lower = url.to_ascii_lowercase();
                let scheme_ok = ["http://", "https://"]
                    .iter()
                    .any(|scheme| lower.starts_with(scheme) && lower.len() > scheme.len());
                if !scheme_ok {
                    return Err(ConfigError::InvalidUrl { server: server(), url: url.clone() });
                }
                for (header, value) in &self.headers.0 {
                    let valid = reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_ok()
                        && reqwest::header::HeaderValue::from_str(value).is_ok();
                    if !valid {
                        return Err(ConfigError::InvalidHeader {
                            server: server(),
                            header: header.clone(),
                        });
                    }
                }
                for variable in
                    [&self.bearer_token_env, &self.oauth_client_secret_env].into_iter().flatten()
                {
                    let valid = !variable.is_empty()
                        && variable.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !valid {
                        return Err(ConfigError::InvalidTokenVariable {
                            server: server(),
                            variable: variable.clone(),
                        });
                    }
                }
                if self.oauth_client_secret_env.is_some() && self.oauth_client_id.is_none() {
                    return Err(ConfigError::OAuthSecretWithoutId { server: server() });
                }
                if let Some(id) = &self.oauth_client_id
                    && (id.is_empty() || id.chars().any(char::is_control))
                {
                    return Err(ConfigError::InvalidOAuthClient {
                        server: server(),
                        key: "oauth_client_id",
                    });
                }
                if let Some(document) = &self.oauth_client_metadata_url {
                    let https = reqwest::Url::parse(document).is_ok_and(|parsed| {
                        parsed.scheme() == "https"
                            && parsed.host_str().is_some()
                            && parsed.path() != "/"
                    });
                    if !https {
                        return Err(ConfigError::InvalidOAuthClient {
                            server: server(),
                            key: "oauth_client_metadata_url",
                        });
                    }
                }
                TransportSpec::Http {
                    url: url.clone(),
                    headers: self.headers.clone(),
                    bearer_token_env: self.bearer_token_env.clone(),
                }
            }
        };
        let timeout = |value: Option<u64>, key: &'static str, default: Duration| match value {
            Some(0) => Err(ConfigError::ZeroTimeout { server: server(), key }),
            Some(ms) => Ok(Duration::from_millis(ms)),
            None => Ok(default),
        };
        if self.tools.keys().any(|tool| tool.is_empty()) {
            return Err(ConfigError::EmptyToolName { server: server() });
        }
        Ok(ServerSpec {
            name: name.to_owned(),
            transport,
            startup_timeout: timeout(
                self.startup_timeout_ms,
                "startup_timeout_ms",
                DEFAULT_STARTUP_TIMEOUT,
            )?,
            tool_timeout: timeout(self.tool_timeout_ms, "tool_timeout_ms", DEFAULT_TOOL_TIMEOUT)?,
            trusted: self.trusted,
            tools: self.tools.clone(),
            oauth: OAuthClientSpec {
                client_id: self.oauth_client_id.clone(),
                client_secret_env: self.oauth_client_secret_env.clone(),
                client_metadata_url: self.oauth_client_metadata_url.clone(),
            },
            from_workspace: self.from_workspace,
        })
    }

    /// Whether this table would let tools skip consent: `trusted = true` or a tool declared
    /// `access = "read"`. A composition root refuses such tables from a workspace file,
    /// which comes with the repository and can only narrow.
    pub fn relaxes_consent(&self) -> bool {
        self.trusted || self.tools.values().any(|tool| tool.access == Access::Read)
    }

    /// Whether this table sends credentials: `headers`, `bearer_token_env` or an `oauth_*`
    /// client setting. A composition root refuses such tables from a workspace file: the
    /// repository chooses the URL, so a token read from the user's environment (or an
    /// OAuth client of the user's) would go wherever the repository says.
    pub fn sends_credentials(&self) -> bool {
        !self.headers.is_empty()
            || self.bearer_token_env.is_some()
            || self.oauth_client_id.is_some()
            || self.oauth_client_secret_env.is_some()
            || self.oauth_client_metadata_url.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BTreeMap<String, McpServerConfig>, toml::de::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            mcp_servers: BTreeMap<String, McpServerConfig>,
        }
        toml::from_str::<File>(text).map(|file| file.mcp_servers)
    }

    #[test]
    fn parses_the_issue_example() {
        let servers = parse(
            r#"
            [mcp_servers.fs]
            command = "npx"
            args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
            [mcp_servers.remote]
            url = "http://127.0.0.1:3001/mcp"
            [mcp_servers.fs.tools.write_file]
            access = "write"
            [mcp_servers.fs.tools.read_text_file]
            access = "read"
            egress = "none"
            "#,
        )
        .unwrap();
        let fs = servers["fs"].validate("fs").unwrap();
        assert_eq!(fs.transport.kind(), TransportKind::Stdio);
        assert_eq!(
            fs.transport.describe(),
            "stdio: npx -y @modelcontextprotocol/server-filesystem ."
        );
        assert_eq!(fs.startup_timeout, DEFAULT_STARTUP_TIMEOUT);
        assert_eq!(fs.tool_timeout, DEFAULT_TOOL_TIMEOUT);
        assert_eq!(
            fs.tools["read_text_file"],
            ToolDeclaration { access: Access::Read, egress: Some(Egress::None) }
        );
        assert_eq!(fs.tools["write_file"].egress, None);
        assert!(servers["fs"].relaxes_consent());
        let remote = servers["remote"].validate("remote").unwrap();
        assert_eq!(
            remote.transport,
            TransportSpec::Http {
                url: "http://127.0.0.1:3001/mcp".into(),
                headers: HttpHeaders::default(),
                bearer_token_env: None,
            }
        );
        assert!(!servers["remote"].relaxes_consent());
    }

    #[test]
    fn unknown_keys_and_bad_values_do_not_parse() {
        for text in [
            "[mcp_servers.a]\ncommand = \"x\"\ncomand = \"y\"",
            "[mcp_servers.a]\ncommand = \"x\"\n[mcp_servers.a.tools.t]\naccess = \"exec\"",
            "[mcp_servers.a]\ncommand = \"x\"\n[mcp_servers.a.tools.t]\negress = \"none\"",
            "[mcp_servers.a]\ncommand = \"x\"\n[mcp_servers.a.tools.t]\naccess = \"read\"\negress = \"moon\"",
            "[mcp_servers.a]\ncommand = \"x\"\ntrusted = \"yes\"",
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn validation_errors_are_typed() {
        let server =
            |text: &str| parse(&format!("[mcp_servers.s]\n{text}")).unwrap().remove("s").unwrap();
        let cases: Vec<(&str, &str, ConfigError)> = vec![
            ("s", "", ConfigError::NoTransport { server: "s".into() }),
            (
                "s",
                "command = \"x\"\nurl = \"http://h/mcp\"",
                ConfigError::BothTransports { server: "s".into() },
            ),
            ("s", "command = \" \"", ConfigError::EmptyCommand { server: "s".into() }),
            (
                "s",
                "url = \"http://h/mcp\"\nargs = [\"a\"]",
                ConfigError::StdioOnlyKey { server: "s".into(), key: "args" },
            ),
            (
                "s",
                "url = \"http://h/mcp\"\ncwd = \"/\"",
                ConfigError::StdioOnlyKey { server: "s".into(), key: "cwd" },
            ),
            (
                "s",
                "url = \"ftp://h/mcp\"",
                ConfigError::InvalidUrl { server: "s".into(), url: "ftp://h/mcp".into() },
            ),
            (
                "s",
                "command = \"x\"\ntool_timeout_ms = 0",
                ConfigError::ZeroTimeout { server: "s".into(), key: "tool_timeout_ms" },
            ),
            (
                "s",
                "command = \"x\"\nstartup_timeout_ms = 0",
                ConfigError::ZeroTimeout { server: "s".into(), key: "startup_timeout_ms" },
            ),
            (
                "s",
                "command = \"x\"\n[mcp_servers.s.tools.\"\"]\naccess = \"read\"",
                ConfigError::EmptyToolName { server: "s".into() },
            ),
        ];
        for (name, text, expected) in cases {
            assert_eq!(server(text).validate(name), Err(expected), "{text}");
        }
        let more: Vec<(&str, ConfigError)> = vec![
            (
                "command = \"x\"\nbearer_token_env = \"T\"",
                ConfigError::HttpOnlyKey { server: "s".into(), key: "bearer_token_env" },
            ),
            (
                "command = \"x\"\nheaders = { X-A = \"1\" }",
                ConfigError::HttpOnlyKey { server: "s".into(), key: "headers" },
            ),
            (
                "url = \"http://h/mcp\"\nheaders = { \"bad name\" = \"1\" }",
                ConfigError::InvalidHeader { server: "s".into(), header: "bad name".into() },
            ),
            (
                "url = \"http://h/mcp\"\nheaders = { X-A = \"line\\nbreak\" }",
                ConfigError::InvalidHeader { server: "s".into(), header: "X-A".into() },
            ),
            (
                "url = \"http://h/mcp\"\nbearer_token_env = \"$HOME\"",
                ConfigError::InvalidTokenVariable { server: "s".into(), variable: "$HOME".into() },
            ),
        ];
        for (text, expected) in more {
            assert_eq!(server(text).validate("s"), Err(expected), "{text}");
        }
        let remote = server(
            "url = \"http://h/mcp\"\nbearer_token_env = \"MY_TOKEN\"\nheaders = { X-Api-Key = \"k3y-value\" }",
        );
        assert!(remote.sends_credentials());
        assert!(!remote.relaxes_consent());
        let spec = remote.validate("s").unwrap();
        // Header values never show in Debug output (errors, logs).
        assert!(!format!("{spec:?}").contains("k3y-value"), "{spec:?}");
        assert!(!format!("{remote:?}").contains("k3y-value"), "{remote:?}");
        assert!(format!("{spec:?}").contains("X-Api-Key"), "{spec:?}");
        let ok = server("command = \"x\"\ntool_timeout_ms = 250");
        assert_eq!(ok.validate("s").unwrap().tool_timeout, Duration::from_millis(250));
        let too_long = "s".repeat(MAX_SERVER_NAME_LEN + 1);
        for bad_name in ["", "a b", "a.b", "a__b", "ü", too_long.as_str()] {
            assert_eq!(
                ok.validate(bad_name),
                Err(ConfigError::InvalidName { server: bad_name.into() })
            );
        }
        let longest = "s".repeat(MAX_SERVER_NAME_LEN);
        for good_name in ["fs", "my-server_2", "A", longest.as_str()] {
            assert!(ok.validate(good_name).is_ok(), "{good_name}");
        }
    }

    /// A table (a workspace file's above all) cannot point OAuth anywhere: there are no
    /// keys for endpoints, redirect URIs or the resource (they come from the server's
    /// metadata and keel's loopback listener), `from_workspace` cannot be written, and the
    /// client settings that exist count as credentials (refused from a workspace file).
    #[test]
    fn redteam_mcp_oauth_a_table_cannot_name_endpoints_or_redirects_and_its_client_is_a_credential()
    {
        for key in [
            "oauth_redirect_uri = \"http://evil.example/cb\"",
            "redirect_uri = \"http://evil.example/cb\"",
            "oauth_token_url = \"https://evil.example/token\"",
            "token_endpoint = \"https://evil.example/token\"",
            "authorization_server = \"https://evil.example\"",
            "oauth_authorization_endpoint = \"https://evil.example/authorize\"",
            "oauth_resource = \"https://victim.example/mcp\"",
            "from_workspace = false",
        ] {
            let text = format!("[mcp_servers.a]\nurl = \"https://h/mcp\"\n{key}");
            assert!(parse(&text).is_err(), "{text}");
        }
        let server =
            |text: &str| parse(&format!("[mcp_servers.s]\n{text}")).unwrap().remove("s").unwrap();
        for text in [
            "url = \"https://h/mcp\"\noauth_client_id = \"abc\"",
            "url = \"https://h/mcp\"\noauth_client_id = \"abc\"\noauth_client_secret_env = \"S\"",
            "url = \"https://h/mcp\"\noauth_client_metadata_url = \"https://me.example/client.json\"",
        ] {
            assert!(server(text).sends_credentials(), "{text}");
            assert!(server(text).validate("s").is_ok(), "{text}");
        }
        // The neighbour: a plain URL table sends nothing and is accepted anywhere.
        let plain = server("url = \"https://h/mcp\"");
        assert!(!plain.sends_credentials());
        let spec = plain.validate("s").unwrap();
        assert_eq!(spec.oauth, OAuthClientSpec::default());
        assert!(!spec.from_workspace);
        let cases: Vec<(&str, ConfigError)> = vec![
            (
                "url = \"https://h/mcp\"\noauth_client_secret_env = \"S\"",
                ConfigError::OAuthSecretWithoutId { server: "s".into() },
            ),
            (
                "url = \"https://h/mcp\"\noauth_client_metadata_url = \"http://me.example/c.json\"",
                ConfigError::InvalidOAuthClient {
                    server: "s".into(),
                    key: "oauth_client_metadata_url",
                },
            ),
            (
                "url = \"https://h/mcp\"\noauth_client_id = \"\"",
                ConfigError::InvalidOAuthClient { server: "s".into(), key: "oauth_client_id" },
            ),
            (
                "command = \"x\"\noauth_client_id = \"abc\"",
                ConfigError::HttpOnlyKey { server: "s".into(), key: "oauth_client_id" },
            ),
            (
                "url = \"https://h/mcp\"\noauth_client_id = \"a\"\noauth_client_secret_env = \"$X\"",
                ConfigError::InvalidTokenVariable { server: "s".into(), variable: "$X".into() },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(server(text).validate("s"), Err(expected), "{text}");
        }
    }
}
