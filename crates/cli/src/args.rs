//! Command-line syntax (DESIGN.md §9, "CLI").

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// keel: a durable, policy-gated agent runtime.
#[derive(Debug, Parser)]
#[command(name = "keel", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// Use FILE as your config instead of ~/.config/keel/config.toml and
    /// $KEEL_HOME/config.toml.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Start a new session and run one non-interactive turn (TASK, or stdin when absent).
    Run {
        /// The task. Read from stdin when absent.
        task: Option<String>,
        #[command(flatten)]
        options: RunFlags,
    },
    /// Continue a session: a new turn with TASK, or resume its interrupted run.
    Resume {
        /// Session id or unique prefix (or --last).
        #[arg(required_unless_present = "last")]
        session: Option<String>,
        /// New input; without it the last unfinished turn is resumed.
        task: Option<String>,
        /// The newest session (then the only positional argument is TASK).
        #[arg(long)]
        last: bool,
        /// Approve the plan of a session in plan mode, then carry it out live (a new turn
        /// with TASK, or "carry out the approved plan").
        #[arg(long)]
        approve_plan: bool,
        #[command(flatten)]
        options: RunFlags,
    },
    /// List sessions, newest first: id, status, last update (with its zone), tokens, cost,
    /// model, workspace, title.
    Sessions {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Children under their parents.
        #[arg(long)]
        tree: bool,
        /// Only sessions of this workspace (and the folders under it).
        #[arg(short = 'C', long = "workspace", value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// At most N sessions, the newest (a sub-agent comes with its parent).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
    },
    /// Print a session's ledger: the run's view (as `keel run` shows it), or every event.
    Log {
        /// Session id or unique prefix (or --last).
        #[arg(required_unless_present = "last")]
        session: Option<String>,
        /// The newest session.
        #[arg(long, conflicts_with = "session")]
        last: bool,
        /// One RuntimeEvent JSON object per line (the same lines `run --json` prints).
        #[arg(long)]
        json: bool,
        /// Every event, one line each (the full trace).
        #[arg(short = 'v', long, conflicts_with = "json")]
        verbose: bool,
    },
    /// Compact a session's context now (fold its earlier conversation into a summary,
    /// written by the session's model or -m's).
    Compact {
        /// Session id or unique prefix (or --last).
        #[arg(required_unless_present = "last")]
        session: Option<String>,
        /// The newest session.
        #[arg(long, conflicts_with = "session")]
        last: bool,
        #[command(flatten)]
        model: ModelFlags,
    },
    /// Make a session inert: it never runs agent code again (`log` and `sessions` still
    /// show it; `resume` refuses it).
    Seal {
        /// Session id or unique prefix (or --last).
        #[arg(required_unless_present = "last")]
        session: Option<String>,
        /// The newest session.
        #[arg(long, conflicts_with = "session")]
        last: bool,
        /// Why, recorded in the ledger (default: "sealed by the user").
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Cancel the session's active run (exit 1 when it has none).
    Stop {
        /// Session id or unique prefix (or --last).
        #[arg(required_unless_present = "last")]
        session: Option<String>,
        /// The newest session.
        #[arg(long, conflicts_with = "session")]
        last: bool,
    },
    /// Trust this workspace's .keel/config.toml as it is now (by its SHA-256), so its
    /// model, base_url and MCP servers apply; an edited file is untrusted again.
    Trust {
        /// The workspace (default: the current directory).
        dir: Option<PathBuf>,
    },
    /// Print the merged settings and where each came from (a flag given here shows as
    /// the setting it would be).
    Config {
        #[command(flatten)]
        options: ConfigFlags,
    },
    /// An Agent Client Protocol agent on stdio, for editors (Zed, JetBrains, Neovim) and
    /// acpx: each ACP session is a keel session in the client's cwd (so no -C), and
    /// stdout carries the protocol (so no output flags).
    Acp {
        /// How long a permission request may wait for the client's answer; then it is
        /// denied, with that reason recorded.
        #[arg(long, value_name = "DURATION", default_value = "5m")]
        permission_timeout: String,
        #[command(flatten)]
        model: ModelFlags,
        #[command(flatten)]
        envelope: EnvelopeFlags,
        #[command(flatten)]
        consent: ConsentFlags,
        #[command(flatten)]
        budget: BudgetFlags,
        #[command(flatten)]
        answer: AnswerFlags,
    },
    /// Experiments over Harbor tasks: tasks × subjects × repetitions, each attempt an
    /// immutable record in DIR (results.jsonl, report.md, report.html); `keel eval resume
    /// DIR` finishes an interrupted one.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Eval {
        #[command(subcommand)]
        command: Option<EvalCommand>,
        /// A Harbor task folder, or a dataset (a folder of task folders).
        #[arg(required = true, value_name = "DATASET_OR_TASK")]
        tasks: Option<PathBuf>,
        /// `oracle` (runs solution/solve.sh) or a model spec as `keel run -m` takes it
        /// (repeatable).
        #[arg(short = 's', long = "subject", value_name = "SUBJECT", required = true)]
        subjects: Vec<String>,
        /// Repetitions per task and subject.
        #[arg(short = 'n', long = "repetitions", value_name = "N", default_value_t = 1)]
        repetitions: u32,
        /// Attempts run at once.
        #[arg(short = 'j', long = "concurrency", value_name = "N", default_value_t = 1)]
        concurrency: usize,
        /// The experiment's folder (its ledger and reports); running again continues it.
        #[arg(long, value_name = "DIR", required = true)]
        out: Option<PathBuf>,
    },
    /// Schedules: turns that start without a user (fired by `keel serve`).
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
    },
    /// Wake a run parked on `wait`: records the wake (the first payload wins) and resumes
    /// the run here, in this process; no host is needed. The session keeps its workspace,
    /// mode and envelope.
    Wake {
        /// The wake id the run printed (`wake_…`).
        wake_id: String,
        /// The payload the run gets back as the `wait` result (empty when absent).
        payload: Option<String>,
        #[command(flatten)]
        model: ModelFlags,
        #[command(flatten)]
        consent: ConsentFlags,
        #[command(flatten)]
        budget: BudgetFlags,
        #[command(flatten)]
        answer: AnswerFlags,
        #[command(flatten)]
        output: OutputFlags,
    },
    /// MCP servers from config.toml.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// The host: many sessions over an HTTP/SSE API (see README "keel serve").
    Serve {
        /// Address to listen on: IP:PORT or localhost:PORT (port 0 picks a free one; the
        /// address is printed).
        #[arg(long, default_value = "127.0.0.1:7711", value_parser = keel_serve::parse_listen)]
        listen: std::net::SocketAddr,
        /// Allow a non-loopback --listen address (anyone who reaches it with the token
        /// drives agents on this machine).
        #[arg(long)]
        allow_remote: bool,
        /// Workspaces hosted sessions may use lie inside DIR (repeatable); default: the
        /// current directory.
        #[arg(long = "workspace-root", value_name = "DIR")]
        workspace_roots: Vec<PathBuf>,
        /// Runs driven at once; more answer 503 with Retry-After.
        #[arg(long, default_value_t = 16)]
        max_runs: usize,
        /// How long a permission request waits for an answer before it ends as deny.
        #[arg(long, default_value = "10m")]
        approval_timeout: String,
        /// Time between `: ping` comments on idle event streams.
        #[arg(long, default_value = "15s")]
        ping_interval: String,
        /// Largest request body in bytes.
        #[arg(long, default_value_t = 1024 * 1024)]
        max_body_bytes: usize,
    },
}

/// `keel schedule add`.
#[derive(Debug, clap::Args)]
pub(crate) struct ScheduleAdd {
    /// An interval: 90s, 10m, 1h.
    #[arg(
        long,
        value_name = "DURATION",
        conflicts_with = "cron",
        required_unless_present = "cron"
    )]
    pub(crate) every: Option<String>,
    /// A cron expression: 5 fields (min hour day month weekday), or 6 with seconds first,
    /// or 7 with a year last; e.g. "0 9 * * MON-FRI". It must fire within 5 years.
    #[arg(long, value_name = "EXPR")]
    pub(crate) cron: Option<String>,
    /// The cron expression's time zone (IANA, e.g. Europe/Berlin; default UTC). With
    /// --every it is refused (an interval has no zone).
    #[arg(long, value_name = "ZONE")]
    pub(crate) tz: Option<String>,
    /// Fire new turns into this session (id or unique prefix).
    #[arg(long, conflicts_with_all = ["workspace", "model"])]
    pub(crate) session: Option<String>,
    /// Fire new turns into the newest session (as --session with its id).
    #[arg(long, conflicts_with_all = ["session", "workspace", "model"])]
    pub(crate) last: bool,
    /// A new session per fire in this workspace.
    #[arg(short = 'C', long = "workspace", value_name = "DIR", requires = "model")]
    pub(crate) workspace: Option<PathBuf>,
    /// The model of each new session.
    #[arg(short = 'm', long, value_name = "SPEC")]
    pub(crate) model: Option<String>,
    /// Consent in fired runs of a new session (default deny: nobody is there to ask).
    #[arg(long, value_enum)]
    pub(crate) approval: Option<ApprovalArg>,
    /// When the last fire still runs: skip (default), buffer (one), allow.
    #[arg(long, value_name = "POLICY", default_value = "skip")]
    pub(crate) overlap: String,
    /// How far back slots missed while no host ran are caught up (one fire).
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub(crate) catch_up: String,
    /// Step ceiling of each fired run.
    #[arg(long, value_name = "N")]
    pub(crate) max_steps: Option<u32>,
    /// Cost ceiling of each fired run, in USD.
    #[arg(long, value_name = "X")]
    pub(crate) max_cost_usd: Option<f64>,
    /// The task of each fired turn.
    pub(crate) task: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Add a schedule: every DURATION or on a cron expression, into a session or a new
    /// session per fire from a workspace and model.
    Add(Box<ScheduleAdd>),
    /// List schedules with their last fire.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Remove a schedule (its fires stay as history).
    Rm {
        /// Schedule id or unique prefix.
        id: String,
    },
    /// Stop a schedule from firing until resumed.
    Pause {
        /// Schedule id or unique prefix.
        id: String,
    },
    /// Let a paused schedule fire again (missed slots within the catch-up window fire once).
    Resume {
        /// Schedule id or unique prefix.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum EvalCommand {
    /// Finish an interrupted experiment; finished attempts are not run again.
    Resume {
        /// The experiment's folder (`--out` of `keel eval`).
        dir: PathBuf,
        /// Attempts run at once.
        #[arg(short = 'j', long = "concurrency", value_name = "N", default_value_t = 1)]
        concurrency: usize,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Start the configured MCP servers; print each one's state, tools and declared access.
    List {
        /// Workspace whose .keel/config.toml is merged (default: the current directory).
        #[arg(short = 'C', long = "workspace", value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// Print one JSON object (`servers`, `tool_count`, `notes`) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Log in to a URL server with OAuth: opens the authorization page (or prints its URL),
    /// waits for the redirect on 127.0.0.1 and stores the tokens in KEEL_HOME/mcp/oauth.
    Login {
        /// The server's name (`[mcp_servers.NAME]` of your own config).
        name: String,
        /// Workspace whose .keel/config.toml is merged (default: the current directory).
        #[arg(short = 'C', long = "workspace", value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// How long to wait for the browser step: 90s, 5m (bare seconds also work).
        #[arg(long, default_value = "5m", value_name = "DURATION")]
        timeout: String,
        /// Do not try to open a browser; only print the URL.
        #[arg(long)]
        no_browser: bool,
    },
    /// Delete the stored OAuth login of a URL server.
    Logout {
        /// The server's name.
        name: String,
        /// Workspace whose .keel/config.toml is merged (default: the current directory).
        #[arg(short = 'C', long = "workspace", value_name = "DIR")]
        workspace: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModeArg {
    Live,
    Shadow,
    Plan,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SandboxArg {
    Managed,
    Bypass,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ApprovalArg {
    Ask,
    Auto,
    Sandboxed,
    Deny,
}

/// What `keel run` prints on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// The answer (the progress view goes to stderr).
    Text,
    /// One JSON object at the end: result, session_id, exit, outcome, reason, usage,
    /// cost_usd, duration_ms (and structured_output with --output-schema).
    Json,
    /// Every RuntimeEvent as one JSON line (the same as --json).
    StreamJson,
}

/// The model and its endpoint (every command that runs the model).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ModelFlags {
    /// openai:MODEL | openai-responses:MODEL | anthropic:MODEL | scripted:PATH
    #[arg(short = 'm', long = "model", value_name = "SPEC")]
    pub(crate) model: Option<String>,
    /// The provider's endpoint, e.g. http://127.0.0.1:11434/v1 (else OPENAI_BASE_URL).
    #[arg(long, value_name = "URL")]
    pub(crate) base_url: Option<String>,
    /// Override the model's context window, in tokens.
    #[arg(long, value_name = "TOKENS")]
    pub(crate) context_window: Option<u64>,
}

/// The envelope and mode: fixed when a session is created.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct EnvelopeFlags {
    /// live (default), shadow, or plan (reads and `plan` only; the run ends with a plan to
    /// approve with `keel resume SESSION --approve-plan`).
    #[arg(long, value_enum)]
    pub(crate) mode: Option<ModeArg>,
    /// Read tools allowed: all, or TOOL,TOOL
    #[arg(long, value_name = "all|TOOL,...")]
    pub(crate) reads: Option<String>,
    /// Write tools allowed: all, or TOOL,TOOL
    #[arg(long, value_name = "all|TOOL,...")]
    pub(crate) writes: Option<String>,
    /// Tools never to run.
    #[arg(long, value_name = "TOOL,...")]
    pub(crate) forbid: Option<String>,
}

/// How tools run and how consent is answered.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ConsentFlags {
    /// managed (default) or bypass.
    #[arg(long, value_enum)]
    pub(crate) sandbox: Option<SandboxArg>,
    /// How permission requests are answered: ask (needs a terminal); auto (allow all but a
    /// wider boundary); sandboxed (allow what the managed sandbox contains, ask or refuse
    /// the rest); deny.
    #[arg(long, value_enum)]
    pub(crate) approval: Option<ApprovalArg>,
}

/// A run's ceilings.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct BudgetFlags {
    /// Explicit step ceiling (model requests per run).
    #[arg(long, value_name = "N")]
    pub(crate) max_steps: Option<u32>,
    /// Token budget for the run.
    #[arg(long, value_name = "N")]
    pub(crate) max_tokens: Option<u64>,
    /// Cost budget for the run, in USD.
    #[arg(long, value_name = "X")]
    pub(crate) max_cost_usd: Option<f64>,
    /// Wall-clock budget for the run, with its unit: 500ms, 90s, 10m, 2h.
    #[arg(long, value_name = "DURATION")]
    pub(crate) max_time: Option<String>,
}

/// The final answer's shape.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct AnswerFlags {
    /// A JSON Schema file the final answer must match; the answer is printed as JSON.
    #[arg(long, value_name = "FILE")]
    pub(crate) output_schema: Option<PathBuf>,
}

/// What a run prints.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct OutputFlags {
    /// Print every RuntimeEvent as one JSON line on stdout (= --output-format stream-json).
    #[arg(long, conflicts_with = "output_format")]
    pub(crate) json: bool,
    /// text (default: the answer on stdout, progress on stderr), json (one object at the
    /// end) or stream-json (every event as a JSON line).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub(crate) output_format: Option<OutputFormat>,
    /// Only the answer: no progress on stderr.
    #[arg(short = 'q', long, conflicts_with = "verbose")]
    pub(crate) quiet: bool,
    /// The full trace: every event, one line each, on stderr.
    #[arg(short = 'v', long)]
    pub(crate) verbose: bool,
}

/// The setting flags: what `keel config` shows the effect of, and what `keel run` and
/// `keel resume` take besides the workspace, the answer's shape and the output.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct SettingFlags {
    #[command(flatten)]
    pub(crate) model: ModelFlags,
    #[command(flatten)]
    pub(crate) envelope: EnvelopeFlags,
    #[command(flatten)]
    pub(crate) consent: ConsentFlags,
    #[command(flatten)]
    pub(crate) budget: BudgetFlags,
}

/// The flags of `keel run` and `keel resume`: every group.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunFlags {
    /// Workspace root (default: the current directory).
    #[arg(short = 'C', long = "workspace", value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) settings: SettingFlags,
    #[command(flatten)]
    pub(crate) answer: AnswerFlags,
    #[command(flatten)]
    pub(crate) output: OutputFlags,
}

/// The flags `keel config` shows the effect of: the workspace and every setting flag.
#[derive(Debug, Clone, Args)]
pub(crate) struct ConfigFlags {
    /// The workspace whose .keel/config.toml is merged (default: the current directory).
    #[arg(short = 'C', long = "workspace", value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) settings: SettingFlags,
}

/// The settings of one command, whichever flags it takes (a group it does not take is
/// its default: unset).
#[derive(Debug, Clone, Default)]
pub(crate) struct RunOptions {
    pub(crate) workspace: Option<PathBuf>,
    pub(crate) model: Option<String>,
    pub(crate) base_url: Option<String>,
    pub(crate) max_steps: Option<u32>,
    pub(crate) json: bool,
    pub(crate) output_format: Option<OutputFormat>,
    pub(crate) quiet: bool,
    pub(crate) verbose: bool,
    pub(crate) mode: Option<ModeArg>,
    pub(crate) sandbox: Option<SandboxArg>,
    pub(crate) approval: Option<ApprovalArg>,
    pub(crate) reads: Option<String>,
    pub(crate) writes: Option<String>,
    pub(crate) forbid: Option<String>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_cost_usd: Option<f64>,
    pub(crate) max_time: Option<String>,
    pub(crate) context_window: Option<u64>,
    pub(crate) output_schema: Option<PathBuf>,
}

/// The flag groups a command takes; `None` for one it does not.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    pub(crate) workspace: Option<PathBuf>,
    pub(crate) model: Option<ModelFlags>,
    pub(crate) envelope: Option<EnvelopeFlags>,
    pub(crate) consent: Option<ConsentFlags>,
    pub(crate) budget: Option<BudgetFlags>,
    pub(crate) answer: Option<AnswerFlags>,
    pub(crate) output: Option<OutputFlags>,
}

impl From<Groups> for RunOptions {
    fn from(groups: Groups) -> RunOptions {
        let ModelFlags { model, base_url, context_window } = groups.model.unwrap_or_default();
        let EnvelopeFlags { mode, reads, writes, forbid } = groups.envelope.unwrap_or_default();
        let ConsentFlags { sandbox, approval } = groups.consent.unwrap_or_default();
        let BudgetFlags { max_steps, max_tokens, max_cost_usd, max_time } =
            groups.budget.unwrap_or_default();
        let AnswerFlags { output_schema } = groups.answer.unwrap_or_default();
        let OutputFlags { json, output_format, quiet, verbose } = groups.output.unwrap_or_default();
        RunOptions {
            workspace: groups.workspace,
            model,
            base_url,
            max_steps,
            json,
            output_format,
            quiet,
            verbose,
            mode,
            sandbox,
            approval,
            reads,
            writes,
            forbid,
            max_tokens,
            max_cost_usd,
            max_time,
            context_window,
            output_schema,
        }
    }
}

impl From<SettingFlags> for Groups {
    fn from(settings: SettingFlags) -> Groups {
        let SettingFlags { model, envelope, consent, budget } = settings;
        Groups {
            model: Some(model),
            envelope: Some(envelope),
            consent: Some(consent),
            budget: Some(budget),
            ..Groups::default()
        }
    }
}

impl From<RunFlags> for RunOptions {
    fn from(flags: RunFlags) -> RunOptions {
        RunOptions::from(Groups {
            workspace: flags.workspace,
            answer: Some(flags.answer),
            output: Some(flags.output),
            ..Groups::from(flags.settings)
        })
    }
}

impl From<ConfigFlags> for RunOptions {
    fn from(flags: ConfigFlags) -> RunOptions {
        RunOptions::from(Groups { workspace: flags.workspace, ..Groups::from(flags.settings) })
    }
}

impl RunOptions {
    /// The output format asked for (`--json` is `stream-json`).
    pub(crate) fn format(&self) -> OutputFormat {
        match (self.json, self.output_format) {
            (true, _) => OutputFormat::StreamJson,
            (false, Some(format)) => format,
            (false, None) => OutputFormat::Text,
        }
    }

    /// How much progress the terminal view shows.
    pub(crate) fn verbosity(&self) -> crate::view::Verbosity {
        match (self.quiet, self.verbose) {
            (true, _) => crate::view::Verbosity::Quiet,
            (false, true) => crate::view::Verbosity::Verbose,
            (false, false) => crate::view::Verbosity::Normal,
        }
    }
}
