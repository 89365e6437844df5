//! The commands: what `keel run`, `resume`, `sessions`, `log` and `stop` do.

use std::io::{IsTerminal, Read};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use keel_contracts::{
    ApprovalMode, EventKind, ExecutionMode, SandboxMode, SessionId, Store, SystemClock,
};
use keel_host::approval::TerminalPrompt;
use keel_host::error::usage;
use keel_host::root::{self, Assembly, RunSettings, SessionFacts, canonical_workspace, open_store};
use keel_kernel::{Cancellation, PermissionHook, SessionConfig};

use crate::args::{ApprovalArg, Cli, Command, Groups, McpCommand, ModeArg, RunOptions, SandboxArg};
use crate::config;
use crate::exit;
use crate::mcp;
use crate::output::{self, Printer};

pub(crate) async fn main(cli: Cli) -> u8 {
    match dispatch(cli).await {
        Ok(status) => status,
        Err(error) => {
            // Error chains may carry outside text (a provider's or server's message).
            eprintln!("keel: {}", crate::terminal::neutralize(&format!("{error:#}")));
            if keel_host::error::is_usage(&error) { exit::USAGE } else { exit::FAILED }
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    if let Some(path) = cli.config {
        config::use_config_file(path);
    }
    match cli.command {
        Command::Run { task, options } => run(task, options.into()).await,
        Command::Resume { session, task, last, approve_plan, options } => {
            // With --last the only positional argument is the task.
            let (session, task) = match (last, session, task) {
                (true, Some(task), None) => (None, Some(task)),
                (true, Some(_), Some(_)) => {
                    return Err(usage("--last takes the place of SESSION: give only TASK"));
                }
                (_, session, task) => (session, task),
            };
            let session = crate::habits::SessionArg::new(session, last);
            resume(&session, task, approve_plan, options.into()).await
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
        Command::Compact { session, last, model } => {
            let options = RunOptions::from(Groups { model: Some(model), ..Groups::default() });
            compact(&crate::habits::SessionArg::new(session, last), options).await
        }
        Command::Trust { dir } => crate::trust::command(dir.as_deref()),
        Command::Config { options } => crate::config_show::show(&options.into()),
        Command::Acp { permission_timeout, model, envelope, consent, budget, answer } => {
            let options = RunOptions::from(Groups {
                model: Some(model),
                envelope: Some(envelope),
                consent: Some(consent),
                budget: Some(budget),
                answer: Some(answer),
                ..Groups::default()
            });
            acp(&permission_timeout, &options).await
        }
        Command::Eval { command, tasks, subjects, repetitions, concurrency, out } => {
            crate::eval::command(command, tasks, &subjects, repetitions, concurrency, out).await
        }
        Command::Schedule { command } => crate::schedule::command(command).await,
        Command::Wake { wake_id, payload, model, consent, budget, answer, output } => {
            let options = RunOptions::from(Groups {
                model: Some(model),
                consent: Some(consent),
                budget: Some(budget),
                answer: Some(answer),
                output: Some(output),
                ..Groups::default()
            });
            wake(&wake_id, payload, options).await
        }
        Command::Mcp { command: McpCommand::List { workspace, json } } => {
            mcp::list(workspace.as_deref(), json).await
        }
        Command::Mcp { command: McpCommand::Login { name, workspace, timeout, no_browser } } => {
            mcp::login(&name, workspace.as_deref(), &timeout, no_browser).await
        }
        Command::Mcp { command: McpCommand::Logout { name, workspace } } => {
            mcp::logout(&name, workspace.as_deref())
        }
        Command::Serve {
            listen,
            allow_remote,
            workspace_roots,
            max_runs,
            approval_timeout,
            ping_interval,
            max_body_bytes,
        } => {
            let duration = |flag: &str, text: &str| {
                keel_host::duration::parse_duration(text).ok_or_else(|| {
                    usage(format!("{flag}: give a positive time with its unit, such as 90s or 10m"))
                })
            };
            let roots = if workspace_roots.is_empty() {
                vec![std::env::current_dir().context("cannot read the current directory")?]
            } else {
                workspace_roots
            };
            let mut config = keel_serve::ServeConfig::new(listen, roots);
            config.allow_remote = allow_remote;
            config.max_runs = max_runs.max(1);
            config.approval_timeout = duration("--approval-timeout", &approval_timeout)?;
            config.ping_interval = duration("--ping-interval", &ping_interval)?;
            config.max_body_bytes = max_body_bytes;
            keel_serve::serve(config).await?;
            Ok(exit::COMPLETED)
        }
    }
}

/// `keel acp`: the ACP agent on stdio (the workspace is each session's cwd; it takes no
/// `-C` and no output flags, stdout being the protocol's).
async fn acp(permission_timeout: &str, options: &RunOptions) -> anyhow::Result<u8> {
    let permission_timeout =
        keel_host::duration::parse_duration(permission_timeout).ok_or_else(|| {
            usage(format!(
                "invalid --permission-timeout '{permission_timeout}': give a positive time with \
             its unit, such as 90s or 5m"
            ))
        })?;
    keel_acp::serve(keel_acp::AcpOptions { settings: settings(options), permission_timeout })
        .await?;
    Ok(exit::COMPLETED)
}

/// The root's settings from `keel run`/`resume`/`compact` flags.
fn settings(options: &RunOptions) -> RunSettings {
    RunSettings {
        model: options.model.clone(),
        base_url: options.base_url.clone(),
        max_steps: options.max_steps,
        mode: options.mode.map(|mode| match mode {
            ModeArg::Live => ExecutionMode::Live,
            ModeArg::Shadow => ExecutionMode::Shadow,
            ModeArg::Plan => ExecutionMode::Plan,
        }),
        sandbox: options.sandbox.map(|sandbox| match sandbox {
            SandboxArg::Managed => SandboxMode::Managed,
            SandboxArg::Bypass => SandboxMode::Bypass,
        }),
        approval: options.approval.map(|approval| match approval {
            ApprovalArg::Ask => ApprovalMode::Ask,
            ApprovalArg::Auto => ApprovalMode::Auto,
            ApprovalArg::Sandboxed => ApprovalMode::Sandboxed,
            ApprovalArg::Deny => ApprovalMode::Deny,
        }),
        reads: options.reads.clone(),
        writes: options.writes.clone(),
        forbid: options.forbid.clone(),
        max_tokens: options.max_tokens,
        max_cost_usd: options.max_cost_usd,
        max_time: options.max_time.clone(),
        context_window: options.context_window,
        output_schema: options.output_schema.clone(),
        over_http: false,
    }
}

/// The person who answers consent questions: the terminal, when there is one.
fn terminal_person() -> Option<Arc<dyn PermissionHook>> {
    TerminalPrompt::available().then(|| Arc::new(TerminalPrompt) as Arc<dyn PermissionHook>)
}

/// The observer that shows the run: the progress view or `--json` lines.
fn printer(options: &RunOptions) -> Arc<Printer> {
    Arc::new(Printer::new(options.format(), options.verbosity()))
}

/// Whether the run's progress view goes to stderr (text output, not `-q`).
fn shows_view(options: &RunOptions) -> bool {
    options.format() == crate::args::OutputFormat::Text
        && options.verbosity() != crate::view::Verbosity::Quiet
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
    let prepared =
        root::prepare(&home, &workspace, &settings(&options), None, &store, terminal_person())?;
    let task = read_task(task)?;
    let Assembly { kernel, resolved, outbox, mcp } =
        root::assemble(prepared, &home, &workspace, store.clone(), printer(&options)).await?;
    root::check_tool_names(&kernel, &resolved.envelope)?;
    root::repair(store).await;
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
    mcp.close().await;
    let report = report?;
    let structured = options.output_schema.is_some();
    let code =
        output::finish(&report, options.format(), shows_view(&options), started_at, structured);
    if resolved.mode == ExecutionMode::Plan
        && matches!(report.outcome, keel_kernel::TurnOutcome::Completed { .. })
    {
        // Headless approval: the plan is the answer on stdout; approving is a command.
        eprintln!(
            "keel: plan mode: nothing was changed. Approve the plan and carry it out with \
             `keel resume {} --approve-plan`",
            report.session_id
        );
    }
    Ok(code)
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
    approve_plan: bool,
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
    let prepared = root::prepare(
        &home,
        &workspace,
        &settings(&options),
        Some(&facts),
        &store,
        terminal_person(),
    )?;
    let printer = printer(&options);
    let Assembly { kernel, resolved, outbox, mcp } =
        root::assemble(prepared, &home, &workspace, store, printer.clone()).await?;
    // The same header as `keel run`'s, from the session's own first event.
    if let Some(created) = events.first() {
        printer.header(created);
    }
    let cancel = cancel_on_ctrl_c();
    let task = if approve_plan {
        kernel.approve_plan(session_id, "user").await.map_err(|error| match error {
            keel_kernel::KernelError::NotPlanning(_) | keel_kernel::KernelError::Sealed(_) => {
                usage(error.to_string())
            }
            other => anyhow::Error::new(other),
        })?;
        Some(task.unwrap_or_else(|| keel_kernel::APPROVED_PLAN_TASK.to_owned()))
    } else {
        task
    };
    let report = match task {
        Some(task) if !task.trim().is_empty() => {
            kernel.run_turn(session_id, &task, &resolved.run, &cancel).await.map_err(Into::into)
        }
        Some(_) => return Err(usage("the task is empty")),
        None => {
            kernel.resume(session_id, &resolved.run, &cancel).await.map_err(|error| match error {
                keel_kernel::KernelError::NothingToResume(_)
                | keel_kernel::KernelError::Waiting { .. }
                | keel_kernel::KernelError::Sealed(_) => usage(error.to_string()),
                other => anyhow::Error::new(other),
            })
        }
    };
    outbox.finish().await;
    mcp.close().await;
    let structured = options.output_schema.is_some();
    Ok(output::finish(&report?, options.format(), shows_view(&options), started_at, structured))
}

/// `keel wake WAKE_ID [PAYLOAD]`: the wake is recorded in the store first (the first
/// payload wins; a later `keel wake` or `POST /v1/wakes` gets the first back), then the
/// run resumes in this process. A host sweeping the same ledger may resume it instead;
/// the session's lease lets only one do it.
async fn wake(wake_id: &str, payload: Option<String>, options: RunOptions) -> anyhow::Result<u8> {
    let started_at = keel_contracts::Clock::now(&SystemClock);
    // Checked before the wake is claimed: a bad flag must not use the wake up.
    if let Some(text) = &options.max_time {
        keel_host::duration::parse_max_time("--max-time", text)?;
    }
    let (home, store, schedules) = root::open_stores().await?;
    let session_id = keel_kernel::wake_session(wake_id)
        .ok_or_else(|| usage(format!("{wake_id:?} is not a wake id (wake_…)")))?;
    let events = store.read(session_id, keel_contracts::Seq(0)).await?;
    let waiting = keel_kernel::waiting(&events)
        .filter(|waiting| keel_kernel::same_wake_id(&waiting.wake_id, wake_id));
    let stored = schedules.wake(wake_id).await?.filter(|stored| stored.session_id == session_id);
    let stored = match (stored, waiting) {
        (Some(stored), None) => {
            outln!(
                "already woken ({}) at {}",
                stored.by,
                crate::trace::to_the_second(&stored.received_at)
            );
            return Ok(exit::COMPLETED);
        }
        (None, None) => return Err(usage(format!("no run waits for the wake id {wake_id}"))),
        (Some(stored), Some(_)) => stored,
        (None, Some(_)) => {
            schedules
                .claim_wake(&keel_store::WakeRow {
                    wake_id: wake_id.to_owned(),
                    session_id,
                    payload: Some(payload.unwrap_or_default()),
                    by: "cli".to_owned(),
                    received_at: keel_contracts::Clock::now(&SystemClock),
                })
                .await?
        }
    };
    keel_host::failpoints::host_point("wake_claimed").await;
    let head = session_head(&store, session_id).await?;
    crate::seal::refuse_sealed(session_id, &head)?;
    let printer = printer(&options);
    let Assembly { kernel, resolved, outbox, mcp } =
        assemble_for(&home, store, session_id, &head, &options, printer.clone()).await?;
    if let Some(created) = head.first() {
        printer.header(created);
    }
    let cancel = cancel_on_ctrl_c();
    let answer = keel_host::schedule::answer_of(&stored);
    let report = kernel.wake(session_id, wake_id, &answer, &resolved.run, &cancel).await;
    outbox.finish().await;
    mcp.close().await;
    let report = report.map_err(|error| match error {
        keel_kernel::KernelError::NotWaiting { .. } | keel_kernel::KernelError::Sealed(_) => {
            usage(error.to_string())
        }
        other => anyhow::Error::new(other),
    })?;
    Ok(output::finish(
        &report,
        options.format(),
        shows_view(&options),
        started_at,
        options.output_schema.is_some(),
    ))
}

/// The assembly that continues an existing session (`keel wake`, `keel compact`): its
/// workspace and model from `head`'s `session_created`, the settings from `options`.
async fn assemble_for(
    home: &Path,
    store: Arc<dyn Store>,
    session_id: SessionId,
    head: &[keel_contracts::RuntimeEvent],
    options: &RunOptions,
    observer: Arc<dyn keel_kernel::Observer>,
) -> anyhow::Result<Assembly> {
    let Some(EventKind::SessionCreated { workspace, .. }) = head.first().map(|e| &e.kind) else {
        bail!("session {session_id} has no session_created event");
    };
    let Some(facts) = SessionFacts::of(head) else {
        bail!("session {session_id} has no session_created event");
    };
    let workspace = canonical_workspace(Some(Path::new(&workspace)))?;
    let prepared = root::prepare(
        home,
        &workspace,
        &settings(options),
        Some(&facts),
        &store,
        terminal_person(),
    )?;
    root::assemble(prepared, home, &workspace, store, observer).await
}

async fn compact(session: &crate::habits::SessionArg, options: RunOptions) -> anyhow::Result<u8> {
    let (home, store) = open_store().await?;
    let session_id = session.resolve(&store).await?;
    let events = session_head(&store, session_id).await?;
    let Assembly { kernel, resolved, outbox, mcp } =
        assemble_for(&home, store, session_id, &events, &options, printer(&options)).await?;
    let cancel = cancel_on_ctrl_c();
    let compacted = kernel.compact_session(session_id, &resolved.run, &cancel).await;
    outbox.finish().await;
    mcp.close().await;
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
