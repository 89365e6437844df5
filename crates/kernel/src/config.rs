//! What a host hands the kernel and gets back: its adapters ([`KernelDeps`]), how a
//! session and a run are set up ([`SessionConfig`], [`RunConfig`]), and how a run ended
//! ([`TurnOutcome`], [`RunReport`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_contracts::{
    ApprovalMode, Budget, Clock, ContextPolicy, Envelope, ExecutionMode, IdGen, ModelClient,
    PermissionRules, Price, RunId, RuntimeEvent, SandboxMode, SessionId, Store, StreamDelta,
    TokenCounter, Tool, TurnId, UsageTotals,
};

use crate::permission::PermissionHook;

/// Receives every durable event and every streamed delta, for display.
pub trait Observer: Send + Sync + std::fmt::Debug {
    /// Called after `event` is durable.
    fn on_event(&self, event: &RuntimeEvent);
    /// Called while a model response streams (not durable; display only).
    fn on_delta(&self, delta: &StreamDelta);
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObserver;

impl Observer for NoopObserver {
    fn on_event(&self, _event: &RuntimeEvent) {}
    fn on_delta(&self, _delta: &StreamDelta) {}
}

/// Everything the kernel reaches the world through. Chosen by the composition root.
#[derive(Debug, Clone)]
pub struct KernelDeps {
    /// The ledger.
    pub store: Arc<dyn Store>,
    /// The model.
    pub model: Arc<dyn ModelClient>,
    /// The tools offered, in the order the model sees them.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// Id source.
    pub ids: Arc<dyn IdGen>,
    /// Consent.
    pub permissions: Arc<dyn PermissionHook>,
    /// Display.
    pub observer: Arc<dyn Observer>,
    /// Counts tokens for the model in use (a real tokenizer where one is known).
    pub counter: Arc<dyn TokenCounter>,
}

/// What a new session is bound to.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Workspace root (canonical).
    pub workspace: PathBuf,
    /// The model spec as the user gave it (`openai:gpt-4o`).
    pub model_spec: String,
    /// The envelope every run of the session obeys.
    pub envelope: Envelope,
    /// Execution mode; binds every run of the session.
    pub mode: ExecutionMode,
    /// The provider endpoint, recorded in `session_created` so a resume continues against
    /// it. Never a secret: the caller strips userinfo and key-like query parameters.
    pub base_url: Option<String>,
}

/// Workspace instructions to put in the system prompt (AGENTS.md and the like).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// Where it came from, e.g. `AGENTS.md`.
    pub source: String,
    /// Its text.
    pub text: String,
}

/// Where a skill came from: the user's own folders, or the workspace (a trusted one;
/// its files came with the repository, so its body reaches the model fenced as untrusted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkillOrigin {
    /// `~/.agents/skills` or the user's config folder.
    User,
    /// `.agents/skills` or `.claude/skills` of a trusted workspace.
    Workspace,
}

/// One skill (Agent Skills: a folder with a SKILL.md), loaded and checked by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// Its name (lowercase letters, digits and hyphens; the folder's name).
    pub name: String,
    /// What it is for and when to use it (at most 1024 characters).
    pub description: String,
    /// Where its SKILL.md is, as shown to the model and recorded.
    pub location: String,
    /// The Markdown after the frontmatter.
    pub body: String,
    /// The skill's other files, relative to its folder (`scripts/run.sh`), sorted.
    pub files: Vec<String>,
    /// Where it came from.
    pub origin: SkillOrigin,
}

/// The skills a run offers, and why others found on disk were not loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skills {
    /// Loaded skills, user skills first; names are unique.
    pub skills: Vec<Skill>,
    /// One line per skipped skill: where and why.
    pub diagnostics: Vec<String>,
}

/// How one run is carried out.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The boundary tools run inside.
    pub sandbox: SandboxMode,
    /// How consent is answered (recorded; the answers come from [`KernelDeps::permissions`]).
    pub approval: ApprovalMode,
    /// Ceilings for this run (steps, tokens, cost, wall-clock); a resumed run gets fresh ones.
    pub budget: Budget,
    /// The model's price, for cost accounting; `None` records costs as unknown.
    pub price: Option<Price>,
    /// How requests are kept inside the model's window.
    pub context: ContextPolicy,
    /// Workspace instructions for the system prompt.
    pub instructions: Vec<Instruction>,
    /// Pre-answers to consent requests; deny rules beat allow rules and session grants.
    pub rules: PermissionRules,
    /// How often the store is polled for a `keel stop` request.
    pub cancel_poll: Duration,
    /// How long an execution grant ("allow this exact call again") lasts. Mandatory.
    pub grant_ttl: Duration,
    /// The skills the agent may activate (a catalog in the system prompt).
    pub skills: Skills,
    /// A JSON Schema the final answer must match (`--output-schema`): the run offers the
    /// intrinsic `submit`, whose parameters are this schema, and completes with the first
    /// valid submission, as JSON text. `None`: a tool-free answer completes the run.
    pub output_schema: Option<serde_json::Value>,
}

/// How a turn's run ended. The ledger holds the matching terminal event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnOutcome {
    /// The model gave a tool-free answer.
    Completed {
        /// The answer.
        text: String,
    },
    /// The run cannot go on (provider error, truncated output, script failure).
    Failed {
        /// Why.
        reason: String,
    },
    /// The run stopped early and can be resumed; a `checkpoint` event holds its report.
    Suspended {
        /// Why ("stopped early: …").
        reason: String,
        /// The model's report from the tools-off last step (empty when none could run).
        report: String,
    },
    /// The run was cancelled.
    Cancelled {
        /// Why.
        reason: String,
    },
    /// A permission denial finalized the turn (a refused `request_boundary`).
    Denied {
        /// Why.
        reason: String,
    },
}

/// The default lifetime of an execution grant: 24 hours.
pub const DEFAULT_GRANT_TTL: Duration = Duration::from_secs(24 * 3600);

/// The result of driving a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// The session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// The run.
    pub run_id: RunId,
    /// How it ended.
    pub outcome: TurnOutcome,
    /// Usage of this run.
    pub usage: UsageTotals,
}
