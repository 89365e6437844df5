//! A run's settings: what a surface chose ([`RunSettings`]), what the session it continues
//! already is ([`SessionFacts`]), and both resolved against the merged config into what the
//! kernel is given ([`resolve`], [`prepare`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_contracts::{
    ApprovalMode, Budget, Envelope, EventKind, ExecutionMode, PermissionRules, Rule, SandboxMode,
    Scope, Store,
};
use keel_kernel::{PermissionHook, RunConfig};

use crate::approval::Approver;
use crate::config::{self, ConfigFile};
use crate::duration::parse_max_time;
use crate::error::{config_error, usage};
use crate::pricing::PriceTable;

/// What a surface chose for one run, beyond the config files: `keel run`'s flags, or a
/// hosted session's request body. `None` leaves a setting to the config (or the session).
#[derive(Debug, Clone, Default)]
pub struct RunSettings {
    /// The model spec (`openai:MODEL`, `scripted:PATH`).
    pub model: Option<String>,
    /// The provider endpoint.
    pub base_url: Option<String>,
    /// Explicit step ceiling.
    pub max_steps: Option<u32>,
    /// Execution mode.
    pub mode: Option<ExecutionMode>,
    /// Tool boundary.
    pub sandbox: Option<SandboxMode>,
    /// How consent is answered.
    pub approval: Option<ApprovalMode>,
    /// `--reads all|TOOL,...`.
    pub reads: Option<String>,
    /// `--writes all|TOOL,...`.
    pub writes: Option<String>,
    /// `--forbid TOOL,...`.
    pub forbid: Option<String>,
    /// Token ceiling.
    pub max_tokens: Option<u64>,
    /// Cost ceiling in USD.
    pub max_cost_usd: Option<f64>,
    /// Wall-clock ceiling, as text (`90s`, `10m`).
    pub max_time: Option<String>,
    /// The model's context window in tokens, overriding the known one.
    pub context_window: Option<u64>,
    /// `--output-schema FILE`: a JSON Schema the final answer must match.
    pub output_schema: Option<PathBuf>,
    /// Usage errors name the host API's JSON fields (`"max_steps"`) instead of `keel
    /// run`'s flags (`--max-steps`): set for a hosted session's request.
    pub over_http: bool,
}

impl RunSettings {
    /// How a usage error names a setting: the flag, or the HTTP body's field.
    fn name<'a>(&self, flag: &'a str, field: &'a str) -> &'a str {
        if self.over_http { field } else { flag }
    }
}

/// What a session already is, for a run that continues it (`keel resume`, `keel compact`):
/// its model and endpoint from `session_created`, and the budget of its last run.
#[derive(Debug, Clone, Copy)]
pub struct SessionFacts<'a> {
    /// The model spec `session_created` recorded.
    pub model: &'a str,
    /// The endpoint `session_created` recorded.
    pub base_url: Option<&'a str>,
    /// The budget of the session's last run.
    pub budget: Option<Budget>,
    /// The approval mode of the session's last run.
    pub approval: Option<ApprovalMode>,
}

impl SessionFacts<'_> {
    /// The facts in a session's ledger; `None` without a `session_created` first event.
    pub fn of(events: &[keel_contracts::RuntimeEvent]) -> Option<SessionFacts<'_>> {
        let EventKind::SessionCreated { model, base_url, .. } = &events.first()?.kind else {
            return None;
        };
        let budget = events.iter().rev().find_map(|event| match &event.kind {
            EventKind::RunStarted { budget, .. } => Some(*budget),
            _ => None,
        });
        let approval = events.iter().rev().find_map(|event| match &event.kind {
            EventKind::RunStarted { approval, .. } => Some(*approval),
            _ => None,
        });
        Some(SessionFacts { model, base_url: base_url.as_deref(), budget, approval })
    }
}

/// Everything resolved from flags and config for one run.
#[derive(Debug)]
pub struct Resolved {
    pub model_spec: String,
    /// The endpoint handed to the provider (may carry a key from the environment).
    pub base_url: Option<String>,
    /// The endpoint as `session_created` records it: no userinfo, no key-like parameters.
    pub recorded_base_url: Option<String>,
    pub envelope: Envelope,
    pub mode: ExecutionMode,
    pub run: RunConfig,
    pub permissions: Arc<dyn PermissionHook>,
    pub context_window: Option<u64>,
    pub max_agent_depth: u32,
    pub counter: Arc<dyn keel_contracts::TokenCounter>,
    /// `[shell] env` of the user's config: names commands inherit beyond the allow-list.
    pub shell_env: Vec<String>,
}

/// Resolves `options` against the merged `config` (and the session a run continues) into
/// everything a run needs. `person` answers consent when a person must (`approval = ask`,
/// and what `sandboxed` cannot decide); without one, an unchosen approval is `deny`.
///
/// # Errors
///
/// A [`usage`] error for an invalid setting (unknown mode, zero budget, a cost budget
/// without a price, `ask` with nobody to ask).
pub fn resolve(
    options: &RunSettings,
    config: &ConfigFile,
    prices: &PriceTable,
    workspace: &Path,
    session: Option<&SessionFacts<'_>>,
    store: &Arc<dyn Store>,
    person: Option<Arc<dyn PermissionHook>>,
) -> anyhow::Result<Resolved> {
    let session_model = session.map(|session| session.model);
    let model_spec = options
        .model
        .clone()
        .or_else(|| session_model.map(str::to_owned))
        .or_else(|| config.model.clone())
        .ok_or_else(|| {
            usage(if options.over_http {
                "no model: give \"model\" (openai:MODEL or scripted:PATH) when creating the \
                 session, or set `model` in config.toml"
            } else {
                "no model: pass -m openai:MODEL (or scripted:PATH), or set `model` in config.toml"
            })
        })?;

    let mode = match options.mode {
        Some(mode) => mode,
        None => match config.mode.as_deref() {
            None | Some("live") => ExecutionMode::Live,
            Some("shadow") => ExecutionMode::Shadow,
            Some("plan") => ExecutionMode::Plan,
            Some(other) => return Err(config_error(format!("unknown mode '{other}'"))),
        },
    };
    let sandbox = match options.sandbox {
        Some(sandbox) => sandbox,
        None => match config.sandbox.as_deref() {
            None | Some("managed") => SandboxMode::Managed,
            Some("bypass") => SandboxMode::Bypass,
            Some(other) => return Err(config_error(format!("unknown sandbox '{other}'"))),
        },
    };
    let terminal = person.is_some();
    let mut implicit = false;
    let approval = match options.approval {
        Some(approval) => approval,
        None => match config.approval.as_deref() {
            Some("ask") => ApprovalMode::Ask,
            Some("auto") => ApprovalMode::Auto,
            Some("sandboxed") => ApprovalMode::Sandboxed,
            Some("deny") => ApprovalMode::Deny,
            Some(other) => return Err(config_error(format!("unknown approval '{other}'"))),
            // Headless runs must never hang on a prompt: without a terminal the default
            // answer is deny (fail closed); a refused call says why in the view.
            None if terminal => ApprovalMode::Ask,
            None => {
                implicit = true;
                ApprovalMode::Deny
            }
        },
    };
    if approval == ApprovalMode::Ask && !terminal {
        return Err(usage(
            "--approval ask needs a terminal; use --approval sandboxed (commands and edits \
             the sandbox contains run, the rest is refused), auto or deny",
        ));
    }
    let permissions: Arc<dyn PermissionHook> = Arc::new(Approver {
        mode: approval,
        implicit,
        person,
        sandbox,
        workspace: workspace.to_path_buf(),
        boundary_patterns: Approver::boundary_patterns(&config.permissions.allow),
        store: store.clone(),
    });

    let mut envelope = Envelope::executor();
    if let Some(reads) = &config.envelope.reads {
        envelope.reads = reads.to_scope();
    }
    if let Some(writes) = &config.envelope.writes {
        envelope.writes = writes.to_scope();
    }
    if let Some(forbid) = &config.envelope.forbid {
        envelope.forbidden = forbid.iter().cloned().collect();
    }
    if let Some(reads) = &options.reads {
        envelope.reads = Scope::parse(reads);
    }
    if let Some(writes) = &options.writes {
        envelope.writes = Scope::parse(writes);
    }
    if let Some(forbid) = &options.forbid {
        envelope.forbidden = forbid
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect();
    }

    let max_time = match options.max_time.as_deref().or(config.max_time.as_deref()) {
        Some(text) => {
            let field = match options.max_time {
                Some(_) => options.name("--max-time", "\"max_time\""),
                None => "max_time in config.toml",
            };
            Some(parse_max_time(field, text)?)
        }
        None => None,
    };
    if options.max_steps.or(config.max_steps) == Some(0) {
        return Err(usage(format!(
            "{} must be at least 1",
            options.name("--max-steps", "\"max_steps\"")
        )));
    }
    if options.max_tokens.or(config.max_tokens) == Some(0) {
        return Err(usage(format!(
            "{} must be at least 1",
            options.name("--max-tokens", "\"max_tokens\"")
        )));
    }
    let budget = match session.and_then(|session| session.budget) {
        // A continued session keeps the ceilings of the run it continues; a flag overrides
        // one of them, and config files (which set the original run's) do not.
        Some(recorded) => Budget {
            max_steps: options.max_steps.or(recorded.max_steps),
            max_tokens: options.max_tokens.or(recorded.max_tokens),
            max_cost_usd: options.max_cost_usd.or(recorded.max_cost_usd),
            max_time: if options.max_time.is_some() { max_time } else { recorded.max_time },
        },
        None => Budget {
            max_steps: options.max_steps.or(config.max_steps),
            max_tokens: options.max_tokens.or(config.max_tokens),
            max_cost_usd: options.max_cost_usd.or(config.max_cost_usd),
            max_time,
        },
    };
    if let Some(max_cost) = budget.max_cost_usd
        && !(max_cost.is_finite() && max_cost > 0.0)
    {
        return Err(usage(format!(
            "{} must be a positive amount, not {max_cost}",
            options.name("--max-cost-usd", "\"max_cost_usd\"")
        )));
    }
    let price = match model_spec.split_once(':') {
        Some((provider, model)) => prices.get(provider, model),
        None => None,
    };
    // Unknown is not zero (DESIGN.md §4): without a price a cost ceiling would count every
    // response as free, the scripted model's included (price it in prices.toml to test).
    if budget.max_cost_usd.is_some() && price.is_none() {
        return Err(usage(format!(
            "no price known for {model_spec}, so a cost budget cannot be enforced; add it to \
             $KEEL_HOME/prices.toml or drop {}",
            options.name("--max-cost-usd", "\"max_cost_usd\"")
        )));
    }
    // A new session records its scripted model by absolute path, so `keel resume` works
    // from any directory.
    let model_spec = match model_spec.strip_prefix("scripted:") {
        Some(path) if session_model.is_none() && Path::new(path).is_relative() => {
            match std::env::current_dir() {
                Ok(dir) => format!("scripted:{}", dir.join(path).display()),
                Err(_) => model_spec,
            }
        }
        _ => model_spec,
    };
    let (provider, model_name) = model_spec.split_once(':').unwrap_or(("", ""));
    let context_window =
        options.context_window.or_else(|| crate::tokens::known_window(provider, model_name));
    if context_window == Some(0) {
        return Err(usage("--context-window must be a positive number of tokens"));
    }
    let counter = crate::tokens::counter_for(provider, model_name);
    let (base_url, recorded_base_url) = endpoint(options, config, &model_spec, session);
    let parse_rules = |texts: &[String]| -> anyhow::Result<Vec<Rule>> {
        texts.iter().map(|text| Rule::parse(text).map_err(config_error)).collect()
    };
    let mut rules = PermissionRules {
        allow: parse_rules(&config.permissions.allow)?,
        deny: parse_rules(&config.permissions.deny)?,
    };
    // A server-wide allow would approve tools the server lists later, unseen: deny only.
    if let Some(rule) = rules.allow.iter().find(|rule| rule.is_server_wide()) {
        return Err(config_error(format!(
            "allow rule '{}': mcp__SERVER__* is supported in deny rules and --forbid only; \
             allow each tool by name",
            rule.text
        )));
    }
    if let Some(rule) = keel_home_rule(workspace)? {
        rules.deny.push(rule);
    }

    Ok(Resolved {
        model_spec,
        base_url,
        recorded_base_url,
        envelope,
        mode,
        run: RunConfig {
            sandbox,
            approval,
            budget,
            price,
            context: keel_contracts::ContextPolicy::for_window(context_window),
            instructions: crate::instructions::load(
                workspace,
                &rules.denied_paths(&workspace.display().to_string()),
            ),
            rules,
            cancel_poll: Duration::from_millis(250),
            grant_ttl: keel_kernel::DEFAULT_GRANT_TTL,
            // Loaded by `prepare`, which knows whether the workspace is trusted.
            skills: keel_kernel::Skills::default(),
            output_schema: None,
        },
        permissions,
        context_window,
        counter,
        max_agent_depth: config.max_agent_depth.unwrap_or(keel_kernel::DEFAULT_MAX_AGENT_DEPTH),
        shell_env: config.shell.env.clone(),
    })
}

/// A `KEEL_HOME` inside the workspace (`keel run` in `~`, an editor's cwd around it) holds
/// keel's own secrets: the plant-note key, `serve.token`, the ledgers of every session and
/// the trust records. It is denied like a `path(...)` rule the user wrote, so file tools
/// refuse it and commands find it masked (empty); read-only is not enough, since a model
/// that reads the plant-note key can forge notes another run would act on.
///
/// # Errors
///
/// A usage error when `KEEL_HOME` lies inside the workspace under a name that is not UTF-8
/// (a rule could not name it, so it could not be hidden: refused rather than exposed).
fn keel_home_rule(workspace: &Path) -> anyhow::Result<Option<Rule>> {
    let Ok(home) = config::keel_home() else { return Ok(None) };
    let home = home.canonicalize().unwrap_or(home);
    let workspace = workspace.canonicalize().unwrap_or_else(|_| workspace.to_path_buf());
    let Ok(relative) = home.strip_prefix(&workspace) else { return Ok(None) };
    let Some(relative) = relative.to_str() else {
        return Err(usage(format!(
            "KEEL_HOME ({}) is inside the workspace under a name keel cannot hide; \
             move KEEL_HOME or pick another workspace",
            home.display()
        )));
    };
    let pattern = if relative.is_empty() { "." } else { relative };
    // A name a rule cannot spell (quotes, `$`, a leading `~`) is refused, never left shown.
    Rule::parse(&format!("path({pattern})")).map(Some).map_err(|_| {
        usage(format!(
            "KEEL_HOME ({}) is inside the workspace under a name keel cannot hide; \
             move KEEL_HOME or pick another workspace",
            home.display()
        ))
    })
}

/// The endpoint for a run (what the provider gets, and what the ledger records).
///
/// `--base-url` wins. A continued session on the same provider keeps the endpoint its
/// `session_created` recorded: the configured one (config file or environment) when it is
/// that endpoint (it may carry a key the record left out), else the recorded one. A flag
/// that moves the session elsewhere, or a recorded endpoint that differs from the
/// configured one, is said on stderr; so is a flag that changes the model.
fn endpoint(
    options: &RunSettings,
    config: &ConfigFile,
    model_spec: &str,
    session: Option<&SessionFacts<'_>>,
) -> (Option<String>, Option<String>) {
    let provider = |spec: &str| spec.split_once(':').map(|(provider, _)| provider.to_owned());
    if let Some(session) = session
        && options.model.as_deref().is_some_and(|model| model != session.model)
    {
        eprintln!(
            "keel: -m {model_spec} replaces the session's model {} for this run (its \
             run_composition records the model used)",
            session.model
        );
    }
    let recorded = session
        .filter(|session| provider(session.model) == provider(model_spec))
        .and_then(|session| session.base_url);
    let configured = crate::provider::effective_base_url(model_spec, config.base_url.as_deref());
    let base_url = match (&options.base_url, recorded) {
        (Some(flag), recorded) => {
            if let Some(recorded) = recorded
                && crate::provider::recordable_base_url(flag) != recorded
            {
                eprintln!(
                    "keel: --base-url {} replaces the session's endpoint {recorded} for this run",
                    crate::provider::recordable_base_url(flag)
                );
            }
            Some(flag.clone())
        }
        (None, Some(recorded)) => match configured {
            Some(configured) if crate::provider::recordable_base_url(&configured) == recorded => {
                Some(configured)
            }
            _ => {
                eprintln!("keel: continuing against the session's endpoint {recorded}");
                Some(recorded.to_owned())
            }
        },
        (None, None) => config.base_url.clone(),
    };
    let recorded_base_url = crate::provider::effective_base_url(model_spec, base_url.as_deref())
        .map(|url| crate::provider::recordable_base_url(&url));
    (base_url, recorded_base_url)
}

/// A run's parts, resolved but not started: the merged config and the resolved settings.
#[derive(Debug)]
pub struct Prepared {
    /// The merged config (user files, then the workspace file, narrowed until trusted).
    pub config: ConfigFile,
    /// The resolved run settings.
    pub resolved: Resolved,
}

/// Loads the config for `workspace` and resolves `settings` against it (see [`resolve`]).
///
/// # Errors
///
/// A [`usage`] error for an invalid config file or setting; an error when the price
/// table cannot be read.
pub fn prepare(
    home: &Path,
    workspace: &Path,
    settings: &RunSettings,
    session: Option<&SessionFacts<'_>>,
    store: &Arc<dyn Store>,
    person: Option<Arc<dyn PermissionHook>>,
) -> anyhow::Result<Prepared> {
    let config = config::load_merged(home, workspace).map_err(|e| usage(format!("{e:#}")))?;
    let mut resolved =
        resolve(settings, &config, &PriceTable::load(home)?, workspace, session, store, person)?;
    let denied = resolved.run.rules.denied_paths(&workspace.display().to_string());
    resolved.run.skills =
        crate::skills::load(workspace, crate::skills::workspace_trusted(home, workspace), &denied);
    if let Some(path) = &settings.output_schema {
        resolved.run.output_schema = Some(output_schema(path)?);
    }
    Ok(Prepared { config, resolved })
}

/// The JSON Schema in `path`, checked to compile.
///
/// # Errors
///
/// A [`usage`] error when the file cannot be read, is not JSON or is not a valid schema.
pub fn output_schema(path: &Path) -> anyhow::Result<serde_json::Value> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|error| usage(format!("--output-schema {shown}: cannot read it: {error}")))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .map_err(|error| usage(format!("--output-schema {shown}: not JSON: {error}")))?;
    jsonschema::validator_for(&schema).map_err(|error| {
        usage(format!("--output-schema {shown}: not a valid JSON Schema: {error}"))
    })?;
    Ok(schema)
}
