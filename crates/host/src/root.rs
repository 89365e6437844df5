//! The composition root (DESIGN.md §8): config → store, provider, tools, sandbox, MCP,
//! outbox, kernel, lease holder and liveness, startup repair. `keel run`, `keel resume`,
//! `keel compact` and `keel serve` all build their kernel here; none keeps a copy.
//!
//! A surface hands in what only it knows: the [`RunSettings`] it parsed (flags, a request
//! body), who answers a consent question when a person must (the terminal prompt, the
//! host's remote approvals), and the observer that shows the run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use keel_contracts::{
    ApprovalMode, Budget, Envelope, EventKind, ExecutionMode, PermissionRules, Rule, SandboxMode,
    Scope, Store, SystemClock, UuidV7Ids,
};
use keel_kernel::{Kernel, KernelDeps, Observer, PermissionHook, RunConfig};
use keel_store::SqliteStore;

use crate::approval::Approver;
use crate::config::{self, ConfigFile};
use crate::mcp;
use crate::pricing::PriceTable;
use crate::provider::{UsageError, model_client};

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

/// The ledger: PostgreSQL when `KEEL_DATABASE_URL` is set (a `postgres://` URL), else the
/// embedded SQLite file under KEEL_HOME.
pub async fn open_store() -> anyhow::Result<(PathBuf, Arc<dyn Store>)> {
    let (home, store, _) = open_stores().await?;
    Ok((home, store))
}

/// [`open_store`], with the same database's schedules, fires and wakes.
///
/// # Errors
///
/// As [`open_store`].
pub async fn open_stores()
-> anyhow::Result<(PathBuf, Arc<dyn Store>, Arc<dyn keel_store::Schedules>)> {
    let home = config::keel_home()?;
    if let Some(url) = database_url()? {
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(usage(
                "KEEL_DATABASE_URL must be a postgres:// URL (unset it for the embedded ledger)",
            ));
        }
        let store = Arc::new(
            keel_store::PgStore::connect(&url)
                .await
                .context("cannot open the PostgreSQL ledger named by KEEL_DATABASE_URL")?,
        );
        return Ok((home, store.clone(), store));
    }
    let path = keel_store::default_path(&home);
    // OpenError names the file: "cannot open ledger PATH: why".
    let store = Arc::new(SqliteStore::open(&path)?);
    Ok((home, store.clone(), store))
}

/// [`open_store`] for commands that only read (`keel sessions`, `keel log`): an existing,
/// current embedded ledger is opened read-only, so the command writes and fsyncs nothing;
/// with no ledger file at all, an empty in-memory ledger stands in (no sessions, and
/// nothing is created on disk); otherwise (an older schema, PostgreSQL) it is opened as
/// [`open_store`] opens it.
///
/// # Errors
///
/// As [`open_store`].
pub async fn open_store_for_reading() -> anyhow::Result<(PathBuf, Arc<dyn Store>)> {
    if database_url()?.is_none() {
        let home = config::keel_home()?;
        let path = keel_store::default_path(&home);
        if !path.try_exists().unwrap_or(true) {
            let empty = SqliteStore::open_in_memory().context("cannot open an empty ledger")?;
            return Ok((home, Arc::new(empty)));
        }
        let store = SqliteStore::open_read_only(&path)?;
        if let Some(store) = store {
            return Ok((home, Arc::new(store)));
        }
    }
    open_store().await
}

/// `KEEL_DATABASE_URL`, trimmed; `None` when unset or blank.
fn database_url() -> anyhow::Result<Option<String>> {
    match std::env::var("KEEL_DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => Ok(Some(url.trim().to_owned())),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(usage("KEEL_DATABASE_URL is not valid UTF-8"))
        }
    }
}

/// A usage or configuration error (the CLI's exit status 2, the host's 400).
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}

/// A configuration error (a [`usage`] error): `config: TEXT`, with control characters in
/// TEXT — a repository's rule, server name or value may hold a newline — shown escaped,
/// so it cannot forge lines on stderr.
pub fn config_error(text: impl std::fmt::Display) -> anyhow::Error {
    usage(format!("config: {}", crate::safe_read::visible(&text.to_string(), false)))
}

/// Whether `error` is a usage or configuration error (see [`usage`]).
pub fn is_usage(error: &anyhow::Error) -> bool {
    error.downcast_ref::<UsageError>().is_some()
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

/// The longest duration keel accepts anywhere a person or a file gives one (`--max-time`,
/// `max_time`, `--catch-up`, `--every`, timeouts): 100 years (876000h). Every deadline is
/// then representable as an `Instant`, a `SystemTime` and a chrono time, so adding one to
/// now never overflows; longer values are refused where they are parsed.
pub const MAX_DURATION: Duration = Duration::from_secs(876_000 * 3600);

/// A `--max-time` / `max_time` value, as [`parse_duration`] reads it; `field` names where
/// it came from (`--max-time`, `"max_time"`).
///
/// # Errors
///
/// A [`usage`] error naming the value, its field and the accepted range.
pub fn parse_max_time(field: &str, text: &str) -> anyhow::Result<Duration> {
    parse_duration(text).ok_or_else(|| {
        usage(format!(
            "invalid duration '{text}' ({field}): give a positive time with its unit, such as \
             500ms, 90s, 10m or 2h, at most 876000h (100 years)"
        ))
    })
}

/// `500ms`, `90s`, `10m`, `2h`: a positive number and its unit (a bare number is refused,
/// so `--max-time 10` cannot mean ten seconds to one reader and ten minutes to another),
/// at most [`MAX_DURATION`]; `None` for anything else.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return None,
    };
    // `try_`: a time too long for a `Duration` is refused like any other bad one, never a
    // panic.
    (seconds.is_finite() && seconds > 0.0)
        .then(|| Duration::try_from_secs_f64(seconds).ok())
        .flatten()
        .filter(|duration| *duration <= MAX_DURATION)
}

/// `dir` (else the current directory) made canonical, after repairing what a killed
/// managed command may have planted in it.
///
/// # Errors
///
/// A [`usage`] error when it does not exist or is not a directory.
pub fn canonical_workspace(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match dir {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let canonical = dir
        .canonicalize()
        .map_err(|error| usage(format!("workspace {}: {error}", dir.display())))?;
    if !canonical.is_dir() {
        return Err(usage(format!("workspace {} is not a directory", canonical.display())));
    }
    // A keel killed during a managed command may have left plants (a git `commondir`, a
    // linked worktree entry) behind: repair them before anything reads the workspace. Only
    // notes authenticated with the user's key are trusted (never one from the repository).
    if let Ok(home) = config::keel_home() {
        crate::plant_key::install(&home, &canonical);
    }
    for note in keel_sandbox::recover_plants(&canonical) {
        eprintln!("keel: {note}");
    }
    Ok(canonical)
}

/// The kernel for one run: the model client, built-in and MCP tools, the lease holder and
/// its liveness, the outbox and the failpoint named by `KEEL_FAILPOINT`.
///
/// # Errors
///
/// A [`usage`] error for an invalid model spec, a missing API key or failpoint; an error
/// when the tool registry cannot be assembled.
pub fn build_kernel(
    store: Arc<dyn Store>,
    resolved: &Resolved,
    observer: Arc<dyn Observer>,
    mcp: &mcp::Started,
    outbox: &crate::outbox::Outbox,
) -> anyhow::Result<Kernel> {
    let model =
        model_client(&resolved.model_spec, resolved.base_url.as_deref(), resolved.context_window)?;
    let deps = KernelDeps {
        store,
        model,
        tools: keel_tools::builtin_tools_with(&keel_tools::BuiltinOptions {
            shell_env: resolved.shell_env.clone(),
        })
        .into_iter()
        .chain(mcp.tools())
        .collect(),
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        permissions: resolved.permissions.clone(),
        observer: outbox.observer(observer),
        counter: resolved.counter.clone(),
    };
    let kernel = Kernel::with_max_agent_depth(deps, resolved.max_agent_depth)
        .context("cannot assemble the tool registry")?
        .with_wait()
        .context("cannot assemble the tool registry")?
        .with_lease_holder(lease_holder())
        .with_holder_liveness(Arc::new(LocalProcesses))
        .with_tool_source(mcp.tool_source());
    check_deny_rule_tools(&kernel, &resolved.run.rules)?;
    crate::failpoints::install(outbox.install(kernel))
}

/// Every deny rule must name a tool keel has: `Bash(rm *)` (another runtime's spelling)
/// or a typo would deny nothing while the user believes it holds. MCP tools (`mcp__…`)
/// are exempt, since a server that did not start has no tools to deny.
///
/// # Errors
///
/// A [`usage`] error naming the first deny rule whose tool is unknown.
fn check_deny_rule_tools(kernel: &Kernel, rules: &PermissionRules) -> anyhow::Result<()> {
    let known = kernel.registry().names();
    let unknown = rules.deny.iter().find(|rule| {
        let tool = rule.tool();
        tool != keel_contracts::PATH_RULE
            && !tool.starts_with("mcp__")
            && !known.iter().any(|name| name == tool)
    });
    match unknown {
        Some(rule) => Err(config_error(format!(
            "deny rule '{}' names no tool keel has, so it would deny nothing; \
             known tools: path, {}",
            rule.text,
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

/// Who this process is, for session leases: `keel pid 4242 on build-7`.
pub fn lease_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "this host".to_owned());
    format!("keel pid {} on {host}", std::process::id())
}

/// Liveness of lease holders on this host: `keel pid N on HOST` is alive while `/proc/N`
/// exists and is not a zombie (a reused pid reads as alive: the safe side); unknown for
/// other hosts.
#[derive(Debug)]
pub struct LocalProcesses;

impl keel_kernel::HolderLiveness for LocalProcesses {
    fn alive(&self, holder: &str) -> Option<bool> {
        holder_alive(holder)
    }
}

/// How every listing names a session's state (`keel sessions`, `keel log`, the HTTP API's
/// `state`): its stored status, except that an open run nobody drives is `interrupted`
/// (see [`gone_holder`]; `keel resume` continues it, and the next start closes it).
/// Reads the lease, never takes it: a listing writes nothing.
///
/// # Cancel safety
///
/// Cancel-safe: it only reads.
pub async fn shown_state(
    store: &dyn Store,
    session: &keel_contracts::SessionSummary,
) -> &'static str {
    match session.status {
        keel_contracts::SessionStatus::Running
            if gone_holder(store, session.id).await.is_some() =>
        {
            "interrupted"
        }
        status => status.as_str(),
    }
}

/// Why nobody drives the session's open run, when that is known: no process holds its
/// lease (never taken, released, or lapsed unrenewed by a holder whose liveness is
/// unknown), or its holder's process is gone (killed, crashed). `None` when a live process
/// (or one on another machine, or a store without leases) may still hold it: a holder
/// named on this machine whose process is alive still drives the run even when its lease
/// lapsed (stopped with SIGSTOP, or starved), so it is running and `keel stop` cancels it.
///
/// Reads the lease row only (`Store::current_lease`): nothing is written. A store error
/// reads as "may still be driven" (`None`): the safe side, never a false `interrupted`.
///
/// # Cancel safety
///
/// Cancel-safe: it only reads.
pub async fn gone_holder(
    store: &dyn Store,
    session_id: keel_contracts::SessionId,
) -> Option<String> {
    let now = keel_contracts::Clock::now(&keel_contracts::SystemClock);
    match store.current_lease(session_id).await {
        Ok(None) => Some("no process holds its lease".to_owned()),
        Ok(Some(lease)) => match holder_alive(&lease.holder) {
            Some(true) => None,
            Some(false) => Some(format!("the process that ran it ({}) is gone", lease.holder)),
            None if lease.expires_at <= now => Some("no process holds its lease".to_owned()),
            None => None,
        },
        Err(_) => None,
    }
}

fn holder_alive(holder: &str) -> Option<bool> {
    let rest = holder.strip_prefix("keel pid ")?;
    let (pid, host) = rest.split_once(" on ")?;
    // A role after the host name (`keel pid 7 on build-7 (inert)`) is the same process.
    let host = host.split_once(" (").map_or(host, |(host, _)| host);
    let pid: u32 = pid.parse().ok()?;
    let this_host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    if host != this_host.trim() {
        return None;
    }
    if pid == std::process::id() {
        return Some(true);
    }
    // Gone, or a zombie (killed, not yet reaped by its parent): it can write nothing more.
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Some(Path::new(&format!("/proc/{pid}")).exists());
    };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    Some(!matches!(state, Some("Z" | "X")))
}

/// Every tool the envelope names must exist: a typo in `--forbid bsh` would otherwise
/// forbid nothing, and one in `--reads` would quietly narrow the scope.
///
/// # Errors
///
/// A [`usage`] error naming the first unknown tool.
pub fn check_tool_names(kernel: &Kernel, envelope: &Envelope) -> anyhow::Result<()> {
    let known = kernel.registry().names();
    let mut unknown: Vec<(&str, &String)> = Vec::new();
    for (flag, scope) in [("--reads", &envelope.reads), ("--writes", &envelope.writes)] {
        if let Scope::Tools(names) = scope {
            unknown
                .extend(names.iter().filter(|name| !known.contains(name)).map(|name| (flag, name)));
        }
    }
    for name in &envelope.forbidden {
        if let Err(reason) = keel_contracts::check_tool_name_pattern(name) {
            return Err(usage(crate::safe_read::visible(
                &format!(
                    "invalid tool name '{name}' in --forbid (or the [envelope] config): {reason}"
                ),
                false,
            )));
        }
    }
    // `mcp__SERVER__*` covers tools the server may list later: known or not, it stands.
    unknown.extend(
        envelope
            .forbidden
            .iter()
            .filter(|name| !known.contains(name) && !is_server_wide(name))
            .map(|name| ("--forbid", name)),
    );
    if let Some((flag, name)) = unknown.first() {
        return Err(usage(crate::safe_read::visible(
            &format!(
                "unknown tool '{name}' in {flag} (or the [envelope] config); known tools: {}",
                known.join(", ")
            ),
            false,
        )));
    }
    Ok(())
}

/// Whether `name` is `mcp__SERVER__*` (checked with `check_tool_name_pattern` already).
fn is_server_wide(name: &str) -> bool {
    name.starts_with("mcp__") && name.ends_with("__*")
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

/// A run ready to go: its kernel, its settings, and the outbox and MCP servers it uses
/// (kept alive as long as the run; call [`crate::outbox::Outbox::finish`] at the end).
#[derive(Debug)]
pub struct Assembly {
    /// The kernel.
    pub kernel: Kernel,
    /// The resolved settings (the run config is `resolved.run`).
    pub resolved: Resolved,
    /// The outbox mirror.
    pub outbox: crate::outbox::Outbox,
    /// The MCP servers.
    pub mcp: mcp::Started,
}

/// Starts the outbox and the MCP servers of `prepared` and builds the kernel.
///
/// # Errors
///
/// As [`build_kernel`], plus an invalid `[[outbox]]` or `[mcp_servers]` table.
///
/// # Cancel safety
///
/// Dropping it stops the MCP servers started so far; nothing is recorded.
pub async fn assemble(
    prepared: Prepared,
    home: &Path,
    workspace: &Path,
    store: Arc<dyn Store>,
    observer: Arc<dyn Observer>,
) -> anyhow::Result<Assembly> {
    let Prepared { config, mut resolved } = prepared;
    let outbox = crate::outbox::start(&config, home, store.clone())?;
    // With no one to ask, `--approval auto` answers a server's form with its defaults.
    let elicitation = match resolved.run.approval {
        ApprovalMode::Auto => keel_mcp::ElicitationPolicy::AcceptDefaults,
        _ => keel_mcp::ElicitationPolicy::Decline,
    };
    let mcp = mcp::start(&config, home, workspace, true, elicitation).await?;
    resolved.run.instructions.splice(0..0, mcp.policy_instruction());
    let kernel = build_kernel(store, &resolved, observer, &mcp, &outbox)?;
    Ok(Assembly { kernel, resolved, outbox, mcp })
}

/// Startup repair: runs left open by processes that died are closed now, by an
/// [`inert_kernel`] on `store` that reports to no observer: the closed runs belong to other
/// sessions, so their events never reach this run's printer, `--json` writer or ACP
/// client. The one note per closed run goes to stderr.
///
/// # Cancel safety
///
/// As [`Kernel::repair_interrupted`].
pub async fn repair(store: Arc<dyn Store>) {
    let kernel = match inert_kernel(store, Arc::new(keel_kernel::NoopObserver)) {
        Ok(kernel) => kernel,
        Err(error) => {
            eprintln!("keel: could not check for interrupted runs: {error:#}");
            return;
        }
    };
    match kernel.repair_interrupted().await {
        Ok(repaired) if !repaired.is_empty() => {
            for session in repaired {
                eprintln!(
                    "keel: closed the interrupted run of session {session} (its process stopped)"
                );
            }
        }
        Ok(_) => {}
        Err(error) => eprintln!("keel: could not check for interrupted runs: {error}"),
    }
}

/// A kernel that runs no agent code: no tools, a model that is never asked, every consent
/// denied. For what needs the kernel but no run: sealing, repair. Its lease holder is
/// this process's with ` (inert)`, so it leaves this process's own live runs alone.
///
/// # Errors
///
/// None in practice (an empty registry always assembles); the registry's error otherwise.
pub fn inert_kernel(store: Arc<dyn Store>, observer: Arc<dyn Observer>) -> anyhow::Result<Kernel> {
    let kernel = Kernel::new(KernelDeps {
        store,
        model: Arc::new(NoModel),
        tools: Vec::new(),
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        permissions: Arc::new(keel_kernel::StaticPermissions(
            keel_contracts::PermissionAnswer::Deny,
        )),
        observer,
        counter: Arc::new(keel_contracts::ApproxCounter),
    })
    .context("cannot assemble an empty tool registry")?;
    // A holder of its own: this process's runs hold `lease_holder()`, which this kernel
    // must never re-acquire as its own (it would close a live run as interrupted).
    Ok(kernel
        .with_lease_holder(format!("{} (inert)", lease_holder()))
        .with_holder_liveness(Arc::new(LocalProcesses)))
}

/// The model of an inert kernel: it is never asked anything.
#[derive(Debug)]
struct NoModel;

#[async_trait::async_trait]
impl keel_contracts::ModelClient for NoModel {
    fn info(&self) -> keel_contracts::ModelInfo {
        keel_contracts::ModelInfo {
            provider: "none".into(),
            model: "none".into(),
            context_window: None,
        }
    }

    async fn complete(
        &self,
        _request: &keel_contracts::ModelRequest,
        _on_delta: &(dyn Fn(keel_contracts::StreamDelta) + Send + Sync),
    ) -> Result<keel_contracts::ModelResponse, keel_contracts::ModelError> {
        Err(keel_contracts::ModelError::new(
            keel_contracts::ModelErrorKind::InvalidRequest,
            None,
            "this kernel runs no model".to_owned(),
        ))
    }
}
