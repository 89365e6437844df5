//! `keel config`: the merged settings and where each came from.

use keel_host::error::usage;
use keel_host::root::canonical_workspace;

use crate::args::RunOptions;
use crate::config::{self, ConfigFile, ScopeValue};
use crate::exit;

/// Prints one `key = value  # origin` line per setting (user file, workspace file
/// [trusted/untrusted], flag or default), then what the workspace file could not set.
pub(crate) fn show(options: &RunOptions) -> anyhow::Result<u8> {
    let workspace = canonical_workspace(options.workspace.as_deref())?;
    let home = config::keel_home()?;
    let loaded = config::load(&home, &workspace).map_err(|e| usage(format!("{e:#}")))?;
    let visible = |text: &str| crate::safe_read::visible(text, false);
    for (role, file) in &loaded.files {
        outln!("# {role}: {}", visible(file));
    }
    outln!("# data: {}", home.display());
    let config = &loaded.config;
    let origin = |key: &str| loaded.origins.get(key).cloned();
    let flag = |name: &str| Some(format!("flag --{name}"));
    let string = |value: &Option<String>| value.as_ref().map(|text| format!("{text:?}"));
    let number = |value: Option<String>| value;
    let rows: Vec<(&str, Option<String>, Option<String>, &str)> = vec![
        row("model", options.model.as_ref().map(|v| format!("{v:?}")), flag("model")).or(
            string(&config.model),
            origin("model"),
            "(none: pass -m)",
        ),
        row("base_url", options.base_url.as_ref().map(|v| format!("{v:?}")), flag("base-url")).or(
            string(&config.base_url),
            origin("base_url"),
            "(the provider's)",
        ),
        row(
            "context_window",
            options.context_window.map(|v| v.to_string()),
            flag("context-window"),
        )
        .or(None, None, "(the model's, when keel knows it)"),
        row("max_steps", options.max_steps.map(|v| v.to_string()), flag("max-steps")).or(
            number(config.max_steps.map(|v| v.to_string())),
            origin("max_steps"),
            "(no limit)",
        ),
        row("max_tokens", options.max_tokens.map(|v| v.to_string()), flag("max-tokens")).or(
            number(config.max_tokens.map(|v| v.to_string())),
            origin("max_tokens"),
            "(no limit)",
        ),
        row("max_cost_usd", options.max_cost_usd.map(|v| v.to_string()), flag("max-cost-usd")).or(
            number(config.max_cost_usd.map(|v| v.to_string())),
            origin("max_cost_usd"),
            "(no limit)",
        ),
        row("max_time", options.max_time.as_ref().map(|v| format!("{v:?}")), flag("max-time")).or(
            string(&config.max_time),
            origin("max_time"),
            "(no limit)",
        ),
        row("max_agent_depth", None, None).or(
            number(config.max_agent_depth.map(|v| v.to_string())),
            origin("max_agent_depth"),
            "1",
        ),
        row("approval", options.approval.map(enum_text), flag("approval")).or(
            string(&config.approval),
            origin("approval"),
            "\"ask\" at a terminal, else \"deny\"",
        ),
        row("sandbox", options.sandbox.map(enum_text), flag("sandbox")).or(
            string(&config.sandbox),
            origin("sandbox"),
            "\"managed\"",
        ),
        row("mode", options.mode.map(enum_text), flag("mode")).or(
            string(&config.mode),
            origin("mode"),
            "\"live\"",
        ),
        row("envelope.reads", options.reads.as_ref().map(|v| format!("{v:?}")), flag("reads")).or(
            config.envelope.reads.as_ref().map(scope_text),
            origin("envelope.reads"),
            "\"all\"",
        ),
        row("envelope.writes", options.writes.as_ref().map(|v| format!("{v:?}")), flag("writes"))
            .or(
                config.envelope.writes.as_ref().map(scope_text),
                origin("envelope.writes"),
                "\"all\"",
            ),
        row("envelope.forbid", options.forbid.as_ref().map(|v| format!("{v:?}")), flag("forbid"))
            .or(
                config.envelope.forbid.as_ref().map(|names| list_text(names)),
                origin("envelope.forbid"),
                "[]",
            ),
        row("permissions.allow", None, None).or(
            non_empty(&config.permissions.allow),
            origin("permissions.allow"),
            "[]",
        ),
        row("permissions.deny", None, None).or(
            non_empty(&config.permissions.deny),
            origin("permissions.deny"),
            "[]",
        ),
    ];
    let width = rows.iter().map(|(key, ..)| key.len()).max().unwrap_or(0);
    for (key, value, source, default) in rows {
        match (value, source) {
            (Some(value), Some(source)) => {
                outln!("{key:<width$} = {}  # {}", visible(&value), visible(&source))
            }
            (Some(value), None) => outln!("{key:<width$} = {}", visible(&value)),
            (None, _) => outln!("{key:<width$} = {default}  # default"),
        }
    }
    print_tables(config, &loaded.origins);
    if !loaded.ignored.is_empty() {
        outln!("# ignored from the workspace file:");
        for (key, reason) in &loaded.ignored {
            outln!("#   {}: {}", visible(key), visible(reason));
        }
    }
    if loaded.ignored.iter().any(|(key, _)| is_gated(key)) {
        outln!("# to apply them: {}", crate::trust::trust_command(&workspace));
    }
    Ok(exit::COMPLETED)
}

fn is_gated(key: &str) -> bool {
    key == "model" || key == "base_url" || key.starts_with("mcp_servers.")
}

/// One setting: the flag's value if given, else the config's, else the default.
struct Row<'a> {
    key: &'a str,
    flag: Option<String>,
    flag_name: Option<String>,
}

fn row(key: &str, flag: Option<String>, flag_name: Option<String>) -> Row<'_> {
    Row { key, flag, flag_name }
}

impl<'a> Row<'a> {
    fn or(
        self,
        value: Option<String>,
        origin: Option<String>,
        default: &'a str,
    ) -> (&'a str, Option<String>, Option<String>, &'a str) {
        match self.flag {
            Some(flag) => (self.key, Some(flag), self.flag_name, default),
            None => (self.key, value, origin, default),
        }
    }
}

fn enum_text<T: clap::ValueEnum>(value: T) -> String {
    value
        .to_possible_value()
        .map(|possible| format!("{:?}", possible.get_name()))
        .unwrap_or_default()
}

fn scope_text(scope: &ScopeValue) -> String {
    match scope.to_scope() {
        keel_contracts::Scope::All => "\"all\"".into(),
        keel_contracts::Scope::Tools(names) => list_text(&names.into_iter().collect::<Vec<_>>()),
    }
}

fn list_text(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|item| format!("{item:?}")).collect();
    format!("[{}]", items.join(", "))
}

fn non_empty(items: &[String]) -> Option<String> {
    (!items.is_empty()).then(|| list_text(items))
}

fn print_tables(config: &ConfigFile, origins: &std::collections::BTreeMap<String, String>) {
    let source = |key: &str| origins.get(key).cloned().unwrap_or_default();
    for (name, server) in &config.mcp_servers {
        let what = match (&server.command, &server.url) {
            (Some(command), _) => {
                let mut parts = vec![format!("command = {command:?}")];
                if !server.args.is_empty() {
                    parts.push(format!("args = {}", list_text(&server.args)));
                }
                parts.join(", ")
            }
            (None, Some(url)) => format!("url = {url:?}"),
            (None, None) => "(no command or url)".into(),
        };
        let key = format!("mcp_servers.{name}");
        let line = format!("[{key}] {what}  # {}", source(&key));
        outln!("{}", crate::safe_read::visible(&line, false));
    }
    for sink in &config.outbox {
        let key = format!("outbox.{}", sink.name);
        let kind = format!("{:?}", sink.kind).to_lowercase();
        let line =
            format!("[[outbox]] name = {:?}, kind = {kind:?}  # {}", sink.name, source(&key));
        outln!("{}", crate::safe_read::visible(&line, false));
    }
    if !config.shell.env.is_empty() {
        let line = format!("shell.env = {:?}  # {}", config.shell.env, source("shell.env"));
        outln!("{}", crate::safe_read::visible(&line, false));
    }
}
