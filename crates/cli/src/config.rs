//! Configuration: `$KEEL_HOME/config.toml` (user), `.keel/config.toml` (workspace), flags.
//!
//! Precedence: a CLI flag beats the workspace file, which beats the user file.
//! A workspace file comes with the repository and may be hostile, so it can only narrow:
//! it may set `model`, `base_url`, the budgets (`max_steps`, `max_tokens`, `max_cost_usd`,
//! `max_time`), `mode`, the `[envelope]` keys and
//! `permissions.deny` rules, but never `sandbox`, `approval` or `permissions.allow` (those
//! are the user's, from the user file or a flag).
//!
//! `[mcp_servers.NAME]` tables come from both files: a workspace file may add servers (not
//! redefine the user's), but never mark one `trusted` or declare a tool `access = "read"`,
//! so every tool of a workspace-defined server still asks for consent. FIXME(#8): a
//! workspace-defined stdio server is still *started* (outside the sandbox) without asking.
//!
//! `[[outbox]]` tables (sinks the ledger is mirrored to, DESIGN.md §6) come from the user
//! file only: a sink sends every event of every session somewhere, so a workspace file
//! that declares one is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

/// Keys of a config file. Unknown keys are errors, so typos do not pass silently.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigFile {
    pub(crate) model: Option<String>,
    pub(crate) base_url: Option<String>,
    pub(crate) max_steps: Option<u32>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_cost_usd: Option<f64>,
    pub(crate) max_time: Option<String>,
    /// How deep sub-agents may nest (default 1: children, no grandchildren; 0: none).
    pub(crate) max_agent_depth: Option<u32>,
    pub(crate) approval: Option<String>,
    pub(crate) sandbox: Option<String>,
    pub(crate) mode: Option<String>,
    #[serde(default)]
    pub(crate) envelope: EnvelopeConfig,
    #[serde(default)]
    pub(crate) permissions: PermissionsConfig,
    /// `[mcp_servers.NAME]`: MCP servers whose tools join the built-in ones.
    #[serde(default)]
    pub(crate) mcp_servers: BTreeMap<String, keel_mcp::McpServerConfig>,
    /// `[[outbox]]`: sinks the ledger is mirrored to (user file only).
    #[serde(default)]
    pub(crate) outbox: Vec<keel_outbox::SinkConfig>,
}

/// `[permissions]`: rules such as `bash(git status*)` that pre-answer consent.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PermissionsConfig {
    #[serde(default)]
    pub(crate) allow: Vec<String>,
    #[serde(default)]
    pub(crate) deny: Vec<String>,
}

/// `[envelope]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnvelopeConfig {
    pub(crate) reads: Option<ScopeValue>,
    pub(crate) writes: Option<ScopeValue>,
    pub(crate) forbid: Option<Vec<String>>,
}

/// `"all"` or a list of tool names.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum ScopeValue {
    Text(String),
    List(Vec<String>),
}

impl ScopeValue {
    pub(crate) fn to_scope(&self) -> keel_contracts::Scope {
        match self {
            ScopeValue::Text(text) => keel_contracts::Scope::parse(text),
            ScopeValue::List(names) => {
                keel_contracts::Scope::Tools(names.iter().cloned().collect())
            }
        }
    }
}

/// Where keel keeps its data: `KEEL_HOME`, else `$XDG_DATA_HOME/keel`, else
/// `~/.local/share/keel`.
pub(crate) fn keel_home() -> anyhow::Result<PathBuf> {
    if let Some(home) = std::env::var_os("KEEL_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(data).join("keel"));
    }
    let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) else {
        bail!("cannot find a data folder: set KEEL_HOME (or XDG_DATA_HOME or HOME)");
    };
    Ok(PathBuf::from(home).join(".local/share/keel"))
}

fn load(path: &Path) -> anyhow::Result<Option<ConfigFile>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let config: ConfigFile = toml::from_str(&text)
                .with_context(|| format!("invalid config {}", path.display()))?;
            Ok(Some(config))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The user file and the workspace file, merged (workspace over user).
pub(crate) fn load_merged(keel_home: &Path, workspace: &Path) -> anyhow::Result<ConfigFile> {
    let user = load(&keel_home.join("config.toml"))?.unwrap_or_default();
    let workspace_path = workspace.join(".keel/config.toml");
    let Some(local) = load(&workspace_path)? else { return Ok(user) };
    if local.sandbox.is_some() || local.approval.is_some() || !local.permissions.allow.is_empty() {
        bail!(
            "{} sets `sandbox`, `approval` or `permissions.allow`: a workspace config cannot \
             widen the boundary; set them in {} or with a flag",
            workspace_path.display(),
            keel_home.join("config.toml").display()
        );
    }
    if !local.outbox.is_empty() {
        bail!(
            "{} declares `[[outbox]]` sinks: a workspace config cannot send the ledger \
             anywhere; declare sinks in {}",
            workspace_path.display(),
            keel_home.join("config.toml").display()
        );
    }
    let mut mcp_servers = user.mcp_servers;
    for (name, server) in local.mcp_servers {
        if mcp_servers.contains_key(&name) {
            bail!(
                "{} redefines MCP server '{name}' from {}: a workspace config may add servers, \
                 not replace the user's",
                workspace_path.display(),
                keel_home.join("config.toml").display()
            );
        }
        if server.relaxes_consent() {
            bail!(
                "{} marks MCP server '{name}' `trusted` or declares one of its tools \
                 `access = \"read\"`: a workspace config cannot skip consent; declare it in {}",
                workspace_path.display(),
                keel_home.join("config.toml").display()
            );
        }
        mcp_servers.insert(name, server);
    }
    Ok(ConfigFile {
        model: local.model.or(user.model),
        base_url: local.base_url.or(user.base_url),
        max_steps: local.max_steps.or(user.max_steps),
        max_tokens: local.max_tokens.or(user.max_tokens),
        max_cost_usd: local.max_cost_usd.or(user.max_cost_usd),
        max_time: local.max_time.or(user.max_time),
        // Depth only narrows from the workspace file.
        max_agent_depth: match (local.max_agent_depth, user.max_agent_depth) {
            (Some(local), Some(user)) => Some(local.min(user)),
            (local, user) => local.or(user),
        },
        approval: user.approval,
        sandbox: user.sandbox,
        mode: local.mode.or(user.mode),
        envelope: EnvelopeConfig {
            reads: local.envelope.reads.or(user.envelope.reads),
            writes: local.envelope.writes.or(user.envelope.writes),
            forbid: local.envelope.forbid.or(user.envelope.forbid),
        },
        // Deny rules from both files apply; allow rules only from the user's.
        permissions: PermissionsConfig {
            allow: user.permissions.allow,
            deny: user.permissions.deny.into_iter().chain(local.permissions.deny).collect(),
        },
        mcp_servers,
        outbox: user.outbox,
    })
}
