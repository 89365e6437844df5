//! The commands: what `keel run`, `resume`, `sessions`, `log` and `stop` do.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use keel_contracts::{
    ApprovalMode, Budget, Envelope, EventKind, ExecutionMode, PermissionRules, Rule, SandboxMode,
    Scope, SessionId, Store, SystemClock, UuidV7Ids,
};
use keel_kernel::{Cancellation, Kernel, KernelDeps, PermissionHook, RunConfig, SessionConfig};
use keel_store::SqliteStore;

use crate::args::{ApprovalArg, Cli, Command, McpCommand, ModeArg, RunOptions, SandboxArg};
use crate::config::{self, ConfigFile};
use crate::mcp;
use crate::output::{self, Printer};
use crate::permission::{Approver, TerminalPrompt};
use crate::pricing::PriceTable;
use crate::provider::{UsageError, model_client};

/// Exit statuses (DESIGN.md §9).
pub(crate) mod exit {
    pub(crate) const COMPLETED: u8 = 0;
    pub(crate) const FAILED: u8 = 1;
    pub(crate) const USAGE: u8 = 2;
    pub(crate) const SUSPENDED: u8 = 3;
    pub(crate) const DENIED: u8 = 4;
    pub(crate) const CANCELLED: u8 = 130;
}

pub(crate) async fn main(cli: Cli) -> u8 {
    match dispatch(cli).await {
        Ok(status) => status,
        Err(error) => {
            // Error chains may carry outside text (a provider's or server's message).
            eprintln!("keel: {}", crate::terminal::neutralize(&format!("{error:#}")));
            if error.downcast_ref::<UsageError>().is_some() { exit::USAGE } else { exit::FAILED }
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    if let Some(path) = cli.config {
        config::use_config_file(path);
    }
    match cli.command {
        Command::Run { task, options } => run(task, options).await,
        Command::Resume { session, task, last, options } => {
            // With --last the only positional argument is the task.
            let (session, task) = match (last, session, task) {
                (true, Some(task), None) => (None, Some(task)),
                (true, Some(_), Some(_)) => {
                    return Err(usage("--last takes the place of SESSION: give only TASK"));
                }
                (_, session, task) => (session, task),
            };
            resume(&crate::habits::SessionArg::new(session, last), task, options).await
        }
        Command::Sessions { json, tree, workspace, limit } => {
            crate::habits::sessions(json, tree, workspace.as_deref(), limit).await
        }
        Command::Log { session, last, json, verbose } => {
            crate::habits::log(&crate::habits::SessionArg::new(session, last), json, verbose).await
        }
        Command::Stop { session, last } => {
            crate::habits::stop(&crate::habits::SessionArg::new(session, last)).await
        }
        Command::Seal { session, last, reason } => {
            let (_, store) = open_store().await?;
            let session = crate::habits::SessionArg::new(session, last).resolve(&store).await?;
            crate::seal::seal(store, &session.to_string(), reason).await
        }
        Command::Compact { session, last, options } => {
            compact(&crate::habits::SessionArg::new(session, last), options).await
        }
        Command::Trust { dir } => crate::trust::command(dir.as_deref()),
        Command::Config { options } => crate::config_show::show(&options),
        Command::Mcp { command: McpCommand::List { workspace } } => {
            mcp::list(workspace.as_deref()).await
        }
    }
}

/// The ledger: PostgreSQL when `KEEL_DATABASE_URL` is set (a `postgres://` URL), else the
/// embedded SQLite file under KEEL_HOME.
pub(crate) async fn open_store() -> anyhow::Result<(PathBuf, Arc<dyn Store>)> {
    let home = config::keel_home()?;
    let database_url = match std::env::var("KEEL_DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_owned()),
        Ok(_) | Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(usage("KEEL_DATABASE_URL is not valid UTF-8"));
        }
    };
    if let Some(url) = database_url {
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(usage(
                "KEEL_DATABASE_URL must be a postgres:// URL (unset it for the embedded ledger)",
            ));
        }
        let store = keel_store::PgStore::connect(&url)
            .await
            .context("cannot open the PostgreSQL ledger named by KEEL_DATABASE_URL")?;
        return Ok((home, Arc::new(store)));
    }
    let path = keel_store::default_path(&home);
    let store = SqliteStore::open(&path)
        .with_context(|| format!("cannot open the ledger at {}", path.display()))?;
    Ok((home, Arc::new(store)))
}

pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}

/// What a session already is, for a run that continues it (`keel resume`, `keel compact`):
/// its model and endpoint from `session_created`, and the budget of its last run.
struct SessionFacts<'a> {
    model: &'a str,
    base_url: Option<&'a str>,
    budget: Option<Budget>,
}

impl SessionFacts<'_> {
    /// The facts in a session's ledger; `None` without a `session_created` first event.
    fn of(events: &[keel_contracts::RuntimeEvent]) -> Option<SessionFacts<'_>> {
        let EventKind::SessionCreated { model, base_url, .. } = &events.first()?.kind else {
            return None;
        };
        let budget = events.iter().rev().find_map(|event| match &event.kind {
            EventKind::RunStarted { budget, .. } => Some(*budget),
            _ => None,
        });
        Some(SessionFacts { model, base_url: base_url.as_deref(), budget })
    }
}

/// Everything resolved from flags and config for one run.
struct Resolved {
    model_spec: String,
    /// The endpoint handed to the provider (may carry a key from the environment).
    base_url: Option<String>,
    /// The endpoint as `session_created` records it: no userinfo, no key-like parameters.
    recorded_base_url: Option<String>,
    envelope: Envelope,
    mode: ExecutionMode,
    run: RunConfig,
    permissions: Arc<dyn PermissionHook>,
    context_window: Option<u64>,
    max_agent_depth: u32,
    counter: Arc<dyn keel_contracts::TokenCounter>,
    /// `[shell] env` of the user's config: names commands inherit beyond the allow-list.
    shell_env: Vec<String>,
}

fn resolve(
    options: &RunOptions,
    config: &ConfigFile,
    prices: &PriceTable,
    workspace: &Path,
    session: Option<&SessionFacts<'_>>,
    store: &Arc<dyn Store>,
) -> anyhow::Result<Resolved> {
    let session_model = session.map(|session| session.model);
    let model_spec = options
        .model
        .clone()
        .or_else(|| session_model.map(str::to_owned))
        .or_else(|| config.model.clone())
        .ok_or_else(|| {
            usage(
                "no model: pass -m openai:MODEL (or scripted:PATH), or set `model` in config.toml",
            )
        })?;

    let mode = match options.mode {
        Some(ModeArg::Live) => ExecutionMode::Live,
        Some(ModeArg::Shadow) => ExecutionMode::Shadow,
        None => match config.mode.as_deref() {
            None | Some("live") => ExecutionMode::Live,
            Some("shadow") => ExecutionMode::Shadow,
            Some(other) => return Err(usage(format!("config: unknown mode '{other}'"))),
        },
    };
    let sandbox = match options.sandbox {
        Some(SandboxArg::Managed) => SandboxMode::Managed,
        Some(SandboxArg::Bypass) => SandboxMode::Bypass,
        None => match config.sandbox.as_deref() {
            None | Some("managed") => SandboxMode::Managed,
            Some("bypass") => SandboxMode::Bypass,
            Some(other) => return Err(usage(format!("config: unknown sandbox '{other}'"))),
        },
    };
    let terminal = TerminalPrompt::available();
    let mut implicit = false;
    let approval = match options.approval {
        Some(ApprovalArg::Ask) => ApprovalMode::Ask,
        Some(ApprovalArg::Auto) => ApprovalMode::Auto,
        Some(ApprovalArg::Sandboxed) => ApprovalMode::Sandboxed,
        Some(ApprovalArg::Deny) => ApprovalMode::Deny,
        None => match config.approval.as_deref() {
            Some("ask") => ApprovalMode::Ask,
            Some("auto") => ApprovalMode::Auto,
            Some("sandboxed") => ApprovalMode::Sandboxed,
            Some("deny") => ApprovalMode::Deny,
            Some(other) => return Err(usage(format!("config: unknown approval '{other}'"))),
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
        terminal,
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
        Some(text) => Some(parse_duration(text).ok_or_else(|| {
            usage(format!(
                "invalid duration '{text}': give a positive time with its unit, such as \
                 500ms, 90s, 10m or 2h"
            ))
        })?),
        None => None,
    };
    if options.max_steps.or(config.max_steps) == Some(0) {
        return Err(usage("--max-steps must be at least 1"));
    }
    if options.max_tokens.or(config.max_tokens) == Some(0) {
        return Err(usage("--max-tokens must be at least 1"));
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
        return Err(usage(format!("--max-cost-usd must be a positive amount, not {max_cost}")));
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
             $KEEL_HOME/prices.toml or drop --max-cost-usd"
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
        texts
            .iter()
            .map(|text| Rule::parse(text).map_err(|e| usage(format!("config: {e}"))))
            .collect()
    };
    let rules = PermissionRules {
        allow: parse_rules(&config.permissions.allow)?,
        deny: parse_rules(&config.permissions.deny)?,
    };

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
        },
        permissions,
        context_window,
        counter,
        max_agent_depth: config.max_agent_depth.unwrap_or(keel_kernel::DEFAULT_MAX_AGENT_DEPTH),
        shell_env: config.shell.env.clone(),
    })
}

/// Whether the run's progress view goes to stderr (text output, not `-q`).
fn shows_view(options: &RunOptions) -> bool {
    options.format() == crate::args::OutputFormat::Text
        && options.verbosity() != crate::view::Verbosity::Quiet
}

/// The endpoint for a run (what the provider gets, and what the ledger records).
///
/// `--base-url` wins. A continued session on the same provider keeps the endpoint its
/// `session_created` recorded: the configured one (config file or environment) when it is
/// that endpoint (it may carry a key the record left out), else the recorded one. A flag
/// that moves the session elsewhere, or a recorded endpoint that differs from the
/// configured one, is said on stderr; so is a flag that changes the model.
fn endpoint(
    options: &RunOptions,
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

/// `500ms`, `90s`, `10m`, `2h`: a positive number and its unit (a bare number is refused,
/// so `--max-time 10` cannot mean ten seconds to one reader and ten minutes to another).
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
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
    (seconds.is_finite() && seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
}

pub(crate) fn canonical_workspace(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
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

fn build_kernel(
    store: Arc<dyn Store>,
    resolved: &Resolved,
    options: &RunOptions,
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
        observer: outbox.observer(Arc::new(Printer::new(options.format(), options.verbosity()))),
        counter: resolved.counter.clone(),
    };
    let kernel = Kernel::with_max_agent_depth(deps, resolved.max_agent_depth)
        .context("cannot assemble the tool registry")?
        .with_lease_holder(lease_holder())
        .with_holder_liveness(Arc::new(LocalProcesses));
    crate::failpoints::install(outbox.install(kernel))
}

/// Who this process is, for session leases: `keel pid 4242 on build-7`.
fn lease_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "this host".to_owned());
    format!("keel pid {} on {host}", std::process::id())
}

/// Liveness of lease holders on this host: `keel pid N on HOST` is alive while `/proc/N`
/// exists (a reused pid reads as alive: the safe side); unknown for other hosts.
#[derive(Debug)]
struct LocalProcesses;

impl keel_kernel::HolderLiveness for LocalProcesses {
    fn alive(&self, holder: &str) -> Option<bool> {
        holder_alive(holder)
    }
}

fn holder_alive(holder: &str) -> Option<bool> {
    let rest = holder.strip_prefix("keel pid ")?;
    let (pid, host) = rest.split_once(" on ")?;
    let pid: u32 = pid.parse().ok()?;
    let this_host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    if host != this_host.trim() {
        return None;
    }
    Some(pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists())
}

/// Every tool the envelope names must exist: a typo in `--forbid bsh` would otherwise
/// forbid nothing, and one in `--reads` would quietly narrow the scope.
fn check_tool_names(kernel: &Kernel, envelope: &Envelope) -> anyhow::Result<()> {
    let known = kernel.registry().names();
    let mut unknown: Vec<(&str, &String)> = Vec::new();
    for (flag, scope) in [("--reads", &envelope.reads), ("--writes", &envelope.writes)] {
        if let Scope::Tools(names) = scope {
            unknown
                .extend(names.iter().filter(|name| !known.contains(name)).map(|name| (flag, name)));
        }
    }
    unknown.extend(
        envelope
            .forbidden
            .iter()
            .filter(|name| !known.contains(name))
            .map(|name| ("--forbid", name)),
    );
    if let Some((flag, name)) = unknown.first() {
        return Err(usage(format!(
            "unknown tool '{name}' in {flag} (or the [envelope] config); known tools: {}",
            known.join(", ")
        )));
    }
    Ok(())
}

/// Startup repair: runs left open by processes that died are closed now.
async fn repair(kernel: &Kernel) {
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

/// Cancels on the first Ctrl-C (SIGINT) or SIGTERM (what `timeout`, CI runners and
/// container stops send), so every open call is answered and every tool's process group
/// is killed; a second signal exits at once.
fn cancel_on_ctrl_c() -> Cancellation {
    let cancel = Cancellation::new();
    let flag = cancel.clone();
    tokio::spawn(async move {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        for first in [true, false] {
            match terminate.as_mut() {
                Some(term) => {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term.recv() => {}
                    }
                }
                None => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
            if first {
                eprintln!("\nkeel: cancelling (signal again to quit at once)");
                flag.cancel();
            }
        }
        std::process::exit(i32::from(exit::CANCELLED));
    });
    cancel
}

fn read_task(task: Option<String>) -> anyhow::Result<String> {
    let task = match task {
        Some(task) => task,
        None => {
            if std::io::stdin().is_terminal() {
                return Err(usage("no task: give TASK as an argument or pipe it on stdin"));
            }
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read the task from stdin")?;
            text
        }
    };
    if task.trim().is_empty() {
        return Err(usage("the task is empty"));
    }
    Ok(task)
}

async fn run(task: Option<String>, options: RunOptions) -> anyhow::Result<u8> {
    let started_at = keel_contracts::Clock::now(&SystemClock);
    let workspace = canonical_workspace(options.workspace.as_deref())?;
    let _keel_dir = crate::habits::EmptyKeelDir::watch(&workspace);
    let (home, store) = open_store().await?;
    let config = config::load_merged(&home, &workspace).map_err(|e| usage(format!("{e:#}")))?;
    let mut resolved =
        resolve(&options, &config, &PriceTable::load(&home)?, &workspace, None, &store)?;
    let task = read_task(task)?;
    let outbox = crate::outbox::start(&config, &home, store.clone())?;
    let mcp = mcp::start(&config, &home, &workspace, true).await?;
    resolved.run.instructions.splice(0..0, mcp.policy_instruction());
    let kernel = build_kernel(store, &resolved, &options, &mcp, &outbox)?;
    check_tool_names(&kernel, &resolved.envelope)?;
    repair(&kernel).await;
    let session_id = kernel
        .create_session(&SessionConfig {
            workspace: workspace.clone(),
            model_spec: resolved.model_spec.clone(),
            envelope: resolved.envelope.clone(),
            mode: resolved.mode,
            base_url: resolved.recorded_base_url.clone(),
        })
        .await?;
    let cancel = cancel_on_ctrl_c();
    let report = kernel.run_turn(session_id, &task, &resolved.run, &cancel).await;
    outbox.finish().await;
    Ok(output::finish(&report?, options.format(), shows_view(&options), started_at))
}

pub(crate) async fn resolve_session(
    store: &Arc<dyn Store>,
    prefix: &str,
) -> anyhow::Result<SessionId> {
    store.resolve_session(prefix).await.map_err(|error| usage(error.to_string()))
}

/// What `keel resume` and `keel compact` read before the kernel loads the session: its
/// `session_created`, `session_sealed` and last `run_started` (for its budget), in seq
/// order, through the store's kind index. Never the whole ledger: the kernel reads the
/// session once, from its latest compaction on.
async fn session_head(
    store: &Arc<dyn Store>,
    session_id: SessionId,
) -> anyhow::Result<Vec<keel_contracts::RuntimeEvent>> {
    let mut events =
        store.read_kinds(session_id, &["session_created"], keel_contracts::Seq(1)).await?;
    for kind in ["session_sealed", "run_started"] {
        events.extend(store.last_of_kind(session_id, kind).await?);
    }
    events.sort_by_key(|event| event.seq);
    Ok(events)
}

async fn resume(
    session: &crate::habits::SessionArg,
    task: Option<String>,
    options: RunOptions,
) -> anyhow::Result<u8> {
    let started_at = keel_contracts::Clock::now(&SystemClock);
    let (home, store) = open_store().await?;
    let session_id = session.resolve(&store).await?;
    let events = session_head(&store, session_id).await?;
    let Some(EventKind::SessionCreated { workspace, .. }) = events.first().map(|e| &e.kind) else {
        bail!("session {session_id} has no session_created event");
    };
    let Some(facts) = SessionFacts::of(&events) else {
        bail!("session {session_id} has no session_created event");
    };
    crate::seal::refuse_sealed(session_id, &events)?;
    let workspace = canonical_workspace(Some(Path::new(workspace)))?;
    let _keel_dir = crate::habits::EmptyKeelDir::watch(&workspace);
    if options.workspace.is_some() {
        eprintln!("keel: -C is ignored on resume: the session is bound to {}", workspace.display());
    }
    if options.mode.is_some()
        || options.reads.is_some()
        || options.writes.is_some()
        || options.forbid.is_some()
    {
        return Err(usage(
            "--mode, --reads, --writes and --forbid are fixed when a session is created; \
             start a new session to change them",
        ));
    }
    let config = config::load_merged(&home, &workspace).map_err(|e| usage(format!("{e:#}")))?;
    let mut resolved =
        resolve(&options, &config, &PriceTable::load(&home)?, &workspace, Some(&facts), &store)?;
    let outbox = crate::outbox::start(&config, &home, store.clone())?;
    let mcp = mcp::start(&config, &home, &workspace, true).await?;
    resolved.run.instructions.splice(0..0, mcp.policy_instruction());
    let kernel = build_kernel(store, &resolved, &options, &mcp, &outbox)?;
    let cancel = cancel_on_ctrl_c();
    let report = match task {
        Some(task) if !task.trim().is_empty() => {
            kernel.run_turn(session_id, &task, &resolved.run, &cancel).await.map_err(Into::into)
        }
        Some(_) => return Err(usage("the task is empty")),
        None => {
            kernel.resume(session_id, &resolved.run, &cancel).await.map_err(|error| match error {
                keel_kernel::KernelError::NothingToResume(_)
                | keel_kernel::KernelError::Sealed(_) => usage(error.to_string()),
                other => anyhow::Error::new(other),
            })
        }
    };
    outbox.finish().await;
    Ok(output::finish(&report?, options.format(), shows_view(&options), started_at))
}

async fn compact(session: &crate::habits::SessionArg, options: RunOptions) -> anyhow::Result<u8> {
    let (home, store) = open_store().await?;
    let session_id = session.resolve(&store).await?;
    let events = session_head(&store, session_id).await?;
    let Some(EventKind::SessionCreated { workspace, .. }) = events.first().map(|e| &e.kind) else {
        bail!("session {session_id} has no session_created event");
    };
    let Some(facts) = SessionFacts::of(&events) else {
        bail!("session {session_id} has no session_created event");
    };
    let workspace = canonical_workspace(Some(Path::new(workspace)))?;
    let config = config::load_merged(&home, &workspace).map_err(|e| usage(format!("{e:#}")))?;
    let resolved =
        resolve(&options, &config, &PriceTable::load(&home)?, &workspace, Some(&facts), &store)?;
    let outbox = crate::outbox::start(&config, &home, store.clone())?;
    let mcp = mcp::start(&config, &home, &workspace, true).await?;
    let kernel = build_kernel(store, &resolved, &options, &mcp, &outbox)?;
    let cancel = cancel_on_ctrl_c();
    let compacted = kernel.compact_session(session_id, &resolved.run, &cancel).await;
    outbox.finish().await;
    match compacted {
        Ok(Some((before, after))) => {
            eprintln!("keel: compacted session {session_id}: ~{before} → ~{after} tokens");
            Ok(exit::COMPLETED)
        }
        Ok(None) => {
            eprintln!(
                "keel: nothing was compacted (too little history, or the summary failed: see `keel log`)"
            );
            Ok(exit::FAILED)
        }
        Err(
            error @ (keel_kernel::KernelError::Sealed(_)
            | keel_kernel::KernelError::SessionNotFound(_)),
        ) => Err(usage(error.to_string())),
        Err(error) => Err(error.into()),
    }
}
