//! Configuration: the user's files, the workspace's `.keel/config.toml`, and flags.
//!
//! **User files** (the user's own settings, full authority), later beating earlier key by
//! key: `$XDG_CONFIG_HOME/keel/config.toml` (else `~/.config/keel/config.toml`), then
//! `$KEEL_HOME/config.toml` (the older place, still read: a `KEEL_HOME` set for one
//! environment carries its own settings). `--config FILE` replaces both.
//!
//! **The workspace file** comes with the repository and may be hostile. Untrusted, it may
//! only narrow what the user chose, and each of its values is combined with the user's so
//! the result is never wider: budgets (`max_steps`, `max_tokens`, `max_cost_usd`,
//! `max_time`, `max_agent_depth`) take the lower value, `mode = "shadow"` wins over `live`
//! (and `plan`, which wins over `live`),
//! `[envelope] reads`/`writes` are intersected, `forbid` and `permissions.deny` are added.
//! Keys that start a process, send data or change the model or its endpoint (`model`,
//! `base_url`, `[mcp_servers.NAME]`) apply only once the user trusted this exact file
//! (`keel trust`, see [`crate::trust`]). User-only keys (`sandbox`, `approval`,
//! `permissions.allow`, `[[outbox]]`) are ignored with a warning, trusted or not, and so is
//! a workspace MCP server that redefines a user's server or relaxes consent (`trusted`,
//! `access = "read"`). keel prints once, on stderr, what it ignored and how to trust.
//!
//! **Flags** beat both files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::bail;
use serde::Deserialize;

use crate::safe_read::{self, Outcome};
use crate::trust;

/// Largest config file read, in bytes.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Keys of a config file. Unknown keys are errors, so typos do not pass silently.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub max_steps: Option<u32>,
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
    pub max_time: Option<String>,
    /// How deep sub-agents may nest (default 1: children, no grandchildren; 0: none).
    pub max_agent_depth: Option<u32>,
    pub approval: Option<String>,
    pub sandbox: Option<String>,
    pub mode: Option<String>,
    #[serde(default)]
    pub envelope: EnvelopeConfig,
    #[serde(default)]
    pub permissions: PermissionsConfig,
    /// `[mcp_servers.NAME]`: MCP servers whose tools join the built-in ones.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, keel_mcp::McpServerConfig>,
    /// `[[outbox]]`: sinks the ledger is mirrored to (user file only).
    #[serde(default)]
    pub outbox: Vec<keel_outbox::SinkConfig>,
    /// `[shell]`: what commands get (user file only).
    #[serde(default)]
    pub shell: ShellConfig,
}

/// `[shell]`: `env = ["NAME", ...]`, environment variables `bash` commands inherit in
/// managed mode beyond the sandbox's allow-list. User file only: a repository naming
/// `GITHUB_TOKEN` here would hand it to every command.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellConfig {
    #[serde(default)]
    pub env: Vec<String>,
}

/// `[permissions]`: rules such as `bash(git status*)` that pre-answer consent.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionsConfig {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// `[envelope]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeConfig {
    pub reads: Option<ScopeValue>,
    pub writes: Option<ScopeValue>,
    pub forbid: Option<Vec<String>>,
}

/// `"all"` or a list of tool names.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ScopeValue {
    Text(String),
    List(Vec<String>),
}

impl ScopeValue {
    pub fn to_scope(&self) -> keel_contracts::Scope {
        match self {
            ScopeValue::Text(text) => keel_contracts::Scope::parse(text),
            ScopeValue::List(names) => {
                keel_contracts::Scope::Tools(names.iter().cloned().collect())
            }
        }
    }

    fn from_scope(scope: &keel_contracts::Scope) -> ScopeValue {
        match scope {
            keel_contracts::Scope::All => ScopeValue::Text("all".into()),
            keel_contracts::Scope::Tools(names) => {
                ScopeValue::List(names.iter().cloned().collect())
            }
        }
    }
}

/// Where keel keeps its data: `KEEL_HOME`, else `$XDG_DATA_HOME/keel`, else
/// `~/.local/share/keel`.
pub fn keel_home() -> anyhow::Result<PathBuf> {
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

/// `--config FILE`, when given: the user's config for this process.
static CONFIG_FLAG: OnceLock<PathBuf> = OnceLock::new();

/// Makes `FILE` (from `--config FILE`) the user's config for this process, instead of the
/// default user files. Called once, before anything is loaded.
pub fn use_config_file(path: PathBuf) {
    let _ = CONFIG_FLAG.set(path);
}

/// The user's config folder: `$XDG_CONFIG_HOME/keel` (when absolute), else
/// `~/.config/keel`; `None` without either variable.
pub fn user_config_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
    {
        return Some(dir.join("keel"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|home| PathBuf::from(home).join(".config/keel"))
}

/// The user files, lowest precedence first, each with whether it must exist.
fn user_files(home: &Path) -> Vec<(PathBuf, bool)> {
    if let Some(path) = CONFIG_FLAG.get() {
        return vec![(path.clone(), true)];
    }
    let mut files: Vec<(PathBuf, bool)> = Vec::new();
    if let Some(dir) = user_config_dir() {
        files.push((dir.join("config.toml"), false));
    }
    let legacy = home.join("config.toml");
    if files.iter().all(|(path, _)| *path != legacy) {
        files.push((legacy, false));
    }
    files
}

/// Parses a config file's bytes; `path` names it in errors.
pub fn parse(bytes: &[u8], path: &Path) -> anyhow::Result<ConfigFile> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("invalid config {}: not UTF-8 text", path.display()))?;
    // The parse error quotes the file, which may be hostile: make its controls visible.
    toml::from_str(text).map_err(|error| {
        anyhow::anyhow!(
            "invalid config {}: {}",
            path.display(),
            safe_read::visible(&error.to_string(), true)
        )
    })
}

/// A workspace's `.keel/config.toml`, read as hostile input: not through a symlink, only
/// a regular file that resolves inside the workspace, at most 1 MiB, never blocking.
#[derive(Debug)]
pub struct WorkspaceFile {
    /// `WORKSPACE/.keel/config.toml`.
    pub path: PathBuf,
    /// What reading it gave.
    pub outcome: Outcome,
}

/// Reads `workspace`'s (canonical) `.keel/config.toml` (see [`WorkspaceFile`]).
pub fn read_workspace_file(workspace: &Path) -> WorkspaceFile {
    let path = workspace.join(".keel/config.toml");
    let rules = safe_read::Rules {
        cap: MAX_CONFIG_BYTES,
        follow_symlink: false,
        confine_to: Some(workspace),
    };
    let outcome = safe_read::read(&path, rules);
    WorkspaceFile { path, outcome }
}

/// The keys of `file` that apply only from a trusted workspace file.
pub fn gated_keys(file: &ConfigFile) -> Vec<String> {
    let mut keys = Vec::new();
    if file.model.is_some() {
        keys.push("model".to_owned());
    }
    if file.base_url.is_some() {
        keys.push("base_url".to_owned());
    }
    keys.extend(file.mcp_servers.keys().map(|name| format!("mcp_servers.{name}")));
    keys
}

/// The keys of `file` that only the user's config may set.
fn user_only_keys(file: &ConfigFile) -> Vec<String> {
    let mut keys = Vec::new();
    if file.approval.is_some() {
        keys.push("approval".to_owned());
    }
    if file.sandbox.is_some() {
        keys.push("sandbox".to_owned());
    }
    if !file.permissions.allow.is_empty() {
        keys.push("permissions.allow".to_owned());
    }
    keys.extend(file.outbox.iter().map(|sink| format!("outbox.{}", sink.name)));
    if !file.shell.env.is_empty() {
        keys.push("shell.env".to_owned());
    }
    keys
}

/// The merged config, with where each value came from and what was left out.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The settings to use (flags are applied later, by the command).
    pub config: ConfigFile,
    /// Where each set key came from, by dotted name (`envelope.reads`, `mcp_servers.fs`).
    pub origins: BTreeMap<String, String>,
    /// Workspace keys that were not applied, each with why.
    pub ignored: Vec<(String, String)>,
    /// Each file considered, with its state (`user file`, `PATH (absent)`).
    pub files: Vec<(&'static str, String)>,
    /// Lines to print once on stderr.
    pub notes: Vec<String>,
}

impl Loaded {
    fn origin(&mut self, key: &str, label: &str) {
        let entry = self.origins.entry(key.to_owned()).or_default();
        if entry.is_empty() {
            *entry = label.to_owned();
        } else if !entry.split(" + ").any(|part| part == label) {
            entry.push_str(" + ");
            entry.push_str(label);
        }
    }

    fn set_origin(&mut self, key: &str, label: &str) {
        self.origins.insert(key.to_owned(), label.to_owned());
    }

    fn ignore(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.ignored.push((key.into(), reason.into()));
    }
}

/// The user's files and the workspace file, merged (module docs), with the notes to print.
pub fn load(home: &Path, workspace: &Path) -> anyhow::Result<Loaded> {
    let mut loaded = Loaded::default();
    let mut user_label = None;
    for (path, required) in user_files(home) {
        let rules =
            safe_read::Rules { cap: MAX_CONFIG_BYTES, follow_symlink: true, confine_to: None };
        match safe_read::read(&path, rules) {
            Outcome::Missing if required => bail!("--config {}: no such file", path.display()),
            Outcome::Missing => {
                loaded.files.push(("user file", format!("{} (absent)", path.display())))
            }
            Outcome::Skipped(reason) => bail!("cannot read {}: {reason}", path.display()),
            Outcome::Bytes(bytes) => {
                let file = parse(&bytes, &path)?;
                let label = format!("user {}", path.display());
                overlay_user(&mut loaded, file, &label);
                loaded.files.push(("user file", path.display().to_string()));
                user_label = Some(path.display().to_string());
            }
        }
    }
    let user_place = user_label.unwrap_or_else(|| {
        user_config_dir()
            .map(|dir| dir.join("config.toml").display().to_string())
            .unwrap_or_else(|| home.join("config.toml").display().to_string())
    });

    let file = read_workspace_file(workspace);
    let shown = file.path.display().to_string();
    let bytes = match file.outcome {
        Outcome::Missing => {
            loaded.files.push(("workspace file", format!("{shown} (absent)")));
            return Ok(loaded);
        }
        Outcome::Skipped(reason) => {
            loaded.files.push(("workspace file", format!("{shown} [ignored: {reason}]")));
            loaded.notes.push(format!("keel: ignored {shown}: {reason}"));
            return Ok(loaded);
        }
        Outcome::Bytes(bytes) => bytes,
    };
    let local = parse(&bytes, &file.path)?;
    let state = trust::state(home, workspace, &trust::sha256_hex(&bytes));
    let trusted = state == trust::State::Trusted;
    loaded.files.push(("workspace file", format!("{shown} [{}]", state.label())));
    let label = format!("workspace {shown} [{}]", if trusted { "trusted" } else { "untrusted" });

    for key in user_only_keys(&local) {
        loaded.ignore(key, format!("only your own config may set it ({user_place} or a flag)"));
    }
    narrow(&mut loaded, &local, &label, &shown)?;

    let mut waiting = Vec::new();
    if trusted {
        if let Some(model) = local.model {
            loaded.config.model = Some(model);
            loaded.set_origin("model", &label);
        }
        if let Some(base_url) = local.base_url {
            loaded.config.base_url = Some(base_url);
            loaded.set_origin("base_url", &label);
        }
        for (name, mut server) in local.mcp_servers {
            // Never the user's stored OAuth logins for a server the repository names.
            server.from_workspace = true;
            let key = format!("mcp_servers.{name}");
            let taken = loaded.config.mcp_servers.contains_key(&name);
            if taken {
                loaded.ignore(key, "it redefines a server of your own config");
            } else if server.relaxes_consent() {
                loaded.ignore(
                    key,
                    "it marks the server `trusted` or a tool `access = \"read\"`: a workspace \
                     config cannot skip consent",
                );
            } else if server.sends_credentials() {
                loaded.ignore(
                    key,
                    "it sets `headers`, `bearer_token_env` or an `oauth_*` key: a workspace \
                     config cannot send your credentials to a server it chooses",
                );
            } else {
                loaded.config.mcp_servers.insert(name, server);
                loaded.set_origin(&key, &label);
            }
        }
    } else {
        for key in gated_keys(&local) {
            loaded.ignore(key.clone(), state.label());
            waiting.push(key);
        }
    }

    for (key, reason) in &loaded.ignored {
        if !waiting.contains(key) {
            loaded.notes.push(format!("keel: ignored `{key}` from {shown}: {reason}"));
        }
    }
    if !waiting.is_empty() {
        let keys: Vec<String> = waiting.iter().map(|key| format!("`{key}`")).collect();
        loaded.notes.push(format!(
            "keel: ignored {} from {shown}: {}",
            keys.join(", "),
            state.label()
        ));
        // Trusting helps only when the records can be used at all.
        if matches!(state, trust::State::Untrusted | trust::State::Changed) {
            loaded.notes.push(format!(
                "keel: review {shown}, then run `{}` to apply {}",
                trust::trust_command(workspace),
                waiting.join(", ")
            ));
        }
    }
    Ok(loaded)
}

/// [`load`], with its notes printed once on stderr: what `run`, `resume`, `compact` and
/// `mcp list` use.
pub fn load_merged(home: &Path, workspace: &Path) -> anyhow::Result<ConfigFile> {
    let loaded = load(home, workspace)?;
    for note in &loaded.notes {
        eprintln!("{}", safe_read::visible(note, false));
    }
    Ok(loaded.config)
}

/// A user file over what came before: each key it sets wins; lists and tables add up.
fn overlay_user(loaded: &mut Loaded, file: ConfigFile, label: &str) {
    macro_rules! take {
        ($($field:ident),*) => {$(
            if file.$field.is_some() {
                loaded.config.$field = file.$field;
                loaded.set_origin(stringify!($field), label);
            }
        )*};
    }
    take!(model, base_url, max_steps, max_tokens, max_cost_usd, max_time, max_agent_depth);
    take!(approval, sandbox, mode);
    if file.envelope.reads.is_some() {
        loaded.config.envelope.reads = file.envelope.reads;
        loaded.set_origin("envelope.reads", label);
    }
    if file.envelope.writes.is_some() {
        loaded.config.envelope.writes = file.envelope.writes;
        loaded.set_origin("envelope.writes", label);
    }
    if file.envelope.forbid.is_some() {
        loaded.config.envelope.forbid = file.envelope.forbid;
        loaded.set_origin("envelope.forbid", label);
    }
    if !file.permissions.allow.is_empty() {
        loaded.config.permissions.allow.extend(file.permissions.allow);
        loaded.origin("permissions.allow", label);
    }
    if !file.permissions.deny.is_empty() {
        loaded.config.permissions.deny.extend(file.permissions.deny);
        loaded.origin("permissions.deny", label);
    }
    for (name, server) in file.mcp_servers {
        loaded.set_origin(&format!("mcp_servers.{name}"), label);
        loaded.config.mcp_servers.insert(name, server);
    }
    for sink in file.outbox {
        loaded.set_origin(&format!("outbox.{}", sink.name), label);
        loaded.config.outbox.push(sink);
    }
    if !file.shell.env.is_empty() {
        loaded.config.shell.env.extend(file.shell.env);
        loaded.origin("shell.env", label);
    }
}

/// Applies the workspace keys that narrow, each combined with what the user chose.
fn narrow(loaded: &mut Loaded, local: &ConfigFile, label: &str, shown: &str) -> anyhow::Result<()> {
    fn lower<T: PartialOrd + Copy + std::fmt::Display>(
        loaded: &mut Loaded,
        key: &str,
        current: Option<T>,
        default: Option<T>,
        wanted: Option<T>,
        label: &str,
    ) -> Option<T> {
        let Some(wanted) = wanted else { return current };
        match current.or(default) {
            Some(now) if wanted.partial_cmp(&now) != Some(std::cmp::Ordering::Less) => {
                if wanted != now {
                    loaded.ignore(
                        format!("{key} = {wanted}"),
                        format!("a workspace config may only lower it (yours: {now})"),
                    );
                }
                current
            }
            _ => {
                loaded.set_origin(key, label);
                Some(wanted)
            }
        }
    }
    let config = &loaded.config;
    let (steps, tokens, cost, depth) =
        (config.max_steps, config.max_tokens, config.max_cost_usd, config.max_agent_depth);
    loaded.config.max_steps = lower(loaded, "max_steps", steps, None, local.max_steps, label);
    loaded.config.max_tokens = lower(loaded, "max_tokens", tokens, None, local.max_tokens, label);
    loaded.config.max_cost_usd =
        lower(loaded, "max_cost_usd", cost, None, local.max_cost_usd, label);
    loaded.config.max_agent_depth = lower(
        loaded,
        "max_agent_depth",
        depth,
        Some(keel_kernel::DEFAULT_MAX_AGENT_DEPTH),
        local.max_agent_depth,
        label,
    );

    if let Some(text) = &local.max_time {
        let Some(wanted) = crate::duration::parse_duration(text) else {
            bail!(
                "invalid config {shown}: max_time '{text}' is not a duration such as 90s or 10m (at most 876000h)"
            );
        };
        let current = loaded.config.max_time.as_deref().map(crate::duration::parse_duration);
        match current {
            // The user's own value is invalid: keep it so its error is reported.
            Some(None) => {}
            Some(Some(now)) if wanted >= now => {
                if wanted != now {
                    loaded.ignore(
                        format!("max_time = {text}"),
                        format!("a workspace config may only lower it (yours: {now:?})"),
                    );
                }
            }
            _ => {
                loaded.config.max_time = Some(text.clone());
                loaded.set_origin("max_time", label);
            }
        }
    }

    match local.mode.as_deref() {
        None => {}
        Some("shadow") => {
            loaded.config.mode = Some("shadow".into());
            loaded.set_origin("mode", label);
        }
        Some("live") if loaded.config.mode.as_deref() == Some("shadow") => {
            loaded.ignore("mode = live", "a workspace config cannot undo your shadow mode");
        }
        Some("plan") if loaded.config.mode.as_deref() == Some("shadow") => {
            loaded.ignore("mode = plan", "a workspace config cannot undo your shadow mode");
        }
        // Planning narrows live: writes wait for the user's approval of the plan.
        Some("plan") => {
            loaded.config.mode = Some("plan".into());
            loaded.set_origin("mode", label);
        }
        Some("live") if loaded.config.mode.as_deref() == Some("plan") => {
            loaded.ignore("mode = live", "a workspace config cannot undo your plan mode");
        }
        Some("live") => {}
        Some(other) => bail!("invalid config {shown}: unknown mode '{other}'"),
    }

    for (key, wanted, current) in [
        ("envelope.reads", &local.envelope.reads, loaded.config.envelope.reads.clone()),
        ("envelope.writes", &local.envelope.writes, loaded.config.envelope.writes.clone()),
    ] {
        let Some(wanted) = wanted else { continue };
        let wanted = wanted.to_scope();
        let now = current.as_ref().map_or(keel_contracts::Scope::All, ScopeValue::to_scope);
        let combined = now.intersect(&wanted);
        if combined != wanted {
            loaded.ignore(
                format!("{key} = {}", scope_text(&wanted)),
                format!("a workspace config may only narrow it (yours: {})", scope_text(&now)),
            );
        }
        if combined != now {
            let value = Some(ScopeValue::from_scope(&combined));
            if key == "envelope.reads" {
                loaded.config.envelope.reads = value;
            } else {
                loaded.config.envelope.writes = value;
            }
            loaded.origin(key, label);
        }
    }
    if let Some(forbid) = &local.envelope.forbid
        && !forbid.is_empty()
    {
        let list = loaded.config.envelope.forbid.get_or_insert_with(Vec::new);
        for name in forbid {
            if !list.contains(name) {
                list.push(name.clone());
            }
        }
        loaded.origin("envelope.forbid", label);
    }
    if !local.permissions.deny.is_empty() {
        loaded.config.permissions.deny.extend(local.permissions.deny.iter().cloned());
        loaded.origin("permissions.deny", label);
    }
    Ok(())
}

fn scope_text(scope: &keel_contracts::Scope) -> String {
    match scope {
        keel_contracts::Scope::All => "\"all\"".into(),
        keel_contracts::Scope::Tools(names) => {
            let names: Vec<String> = names.iter().map(|name| format!("{name:?}")).collect();
            format!("[{}]", names.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> ConfigFile {
        parse(text.as_bytes(), Path::new("test.toml")).unwrap()
    }

    fn narrowed(user: &str, workspace: &str) -> Loaded {
        let mut loaded = Loaded::default();
        overlay_user(&mut loaded, file(user), "user");
        narrow(&mut loaded, &file(workspace), "workspace", "ws").unwrap();
        loaded
    }

    #[test]
    fn a_workspace_file_only_narrows_each_key() {
        let loaded = narrowed(
            "max_steps = 10\nmax_cost_usd = 1.0\nmax_time = \"10m\"\n\
             [envelope]\nreads = [\"read_file\", \"grep\"]\nforbid = [\"bash\"]\n",
            "max_steps = 20\nmax_cost_usd = 0.5\nmax_time = \"1h\"\nmax_agent_depth = 3\n\
             [envelope]\nreads = [\"grep\", \"glob\"]\nwrites = [\"edit_file\"]\n\
             forbid = [\"todo\"]\n[permissions]\ndeny = [\"bash(rm*)\"]\n",
        );
        let config = &loaded.config;
        assert_eq!(config.max_steps, Some(10));
        assert_eq!(config.max_cost_usd, Some(0.5));
        assert_eq!(config.max_time.as_deref(), Some("10m"));
        assert_eq!(config.max_agent_depth, None, "depth above the default 1 is ignored");
        let scope = |value: &Option<ScopeValue>| value.as_ref().map(ScopeValue::to_scope);
        assert_eq!(
            scope(&config.envelope.reads),
            Some(keel_contracts::Scope::Tools(["grep".to_owned()].into()))
        );
        assert_eq!(
            scope(&config.envelope.writes),
            Some(keel_contracts::Scope::Tools(["edit_file".to_owned()].into()))
        );
        assert_eq!(config.envelope.forbid, Some(vec!["bash".to_owned(), "todo".to_owned()]));
        assert_eq!(config.permissions.deny, ["bash(rm*)"]);
        assert_eq!(loaded.origins["max_cost_usd"], "workspace");
        assert_eq!(loaded.origins["max_steps"], "user");
        assert_eq!(loaded.origins["envelope.reads"], "user + workspace");
        let ignored: Vec<&str> = loaded.ignored.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(
            ignored,
            [
                "max_steps = 20",
                "max_agent_depth = 3",
                "max_time = 1h",
                "envelope.reads = [\"glob\", \"grep\"]"
            ]
        );
    }

    #[test]
    fn plan_narrows_live_and_never_undoes_shadow() {
        assert_eq!(narrowed("", "mode = \"plan\"").config.mode.as_deref(), Some("plan"));
        assert_eq!(
            narrowed("mode = \"plan\"", "mode = \"live\"").config.mode.as_deref(),
            Some("plan")
        );
        assert_eq!(
            narrowed("mode = \"shadow\"", "mode = \"plan\"").config.mode.as_deref(),
            Some("shadow")
        );
    }

    #[test]
    fn shadow_wins_and_an_unknown_mode_or_duration_is_an_error() {
        assert_eq!(narrowed("", "mode = \"shadow\"").config.mode.as_deref(), Some("shadow"));
        let kept = narrowed("mode = \"shadow\"", "mode = \"live\"");
        assert_eq!(kept.config.mode.as_deref(), Some("shadow"));
        assert_eq!(kept.ignored.len(), 1);
        let mut loaded = Loaded::default();
        assert!(narrow(&mut loaded, &file("mode = \"wide\""), "w", "ws").is_err());
        assert!(narrow(&mut loaded, &file("max_time = \"soon\""), "w", "ws").is_err());
    }

    #[test]
    fn gated_and_user_only_keys_are_named() {
        let local = file(
            "model = \"m\"\nbase_url = \"u\"\nsandbox = \"bypass\"\napproval = \"auto\"\n\
             [permissions]\nallow = [\"bash\"]\n[mcp_servers.fs]\ncommand = \"x\"\n\
             [[outbox]]\nname = \"leak\"\nkind = \"jsonl\"\npath = \"/tmp/x\"\n",
        );
        assert_eq!(gated_keys(&local), ["model", "base_url", "mcp_servers.fs"]);
        assert_eq!(
            user_only_keys(&local),
            ["approval", "sandbox", "permissions.allow", "outbox.leak"]
        );
    }
}
