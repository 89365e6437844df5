//! The harness: `check_turn`-style helpers that run the kernel against a scripted model
//! and render the ledger as stable text.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{
    Access, ApprovalMode, Effects, Envelope, EventKind, ExecutionMode, ModelClient,
    PermissionAnswer, PermissionRules, RuntimeEvent, SandboxMode, Seq, SessionId, Store, Tool,
    ToolContext, ToolOutput, ToolSpec,
};
use keel_kernel::{
    Cancellation, Instruction, Kernel, KernelDeps, NoopObserver, RunConfig, RunReport,
    SessionConfig, StaticPermissions,
};
use keel_testkit::ScriptedModel;
use keel_testkit::{FakeClock, MemStore, SeqIds};

/// What the fake tools did, in order: `name args`.
pub(crate) type InvocationLog = Arc<Mutex<Vec<String>>>;

/// A fake tool with a declared spec; records each invocation and answers from `reply`.
#[derive(Debug)]
pub(crate) struct FakeTool {
    pub(crate) spec: ToolSpec,
    pub(crate) log: InvocationLog,
    pub(crate) behaviour: Behaviour,
}

#[derive(Debug, Clone)]
pub(crate) enum Behaviour {
    Reply(String),
    Fail(String),
    Panic,
    Sleep(Duration),
}

#[async_trait]
impl Tool for FakeTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        self.log.lock().unwrap().push(format!("{} {arguments}", self.spec.name));
        match &self.behaviour {
            Behaviour::Reply(text) => ToolOutput::ok(text.clone()),
            Behaviour::Fail(text) => ToolOutput::error(text.clone()),
            Behaviour::Panic => panic!("fake tool panicked"),
            Behaviour::Sleep(duration) => {
                tokio::time::sleep(*duration).await;
                ToolOutput::ok("slept")
            }
        }
    }
}

pub(crate) fn spec(name: &str, access: Access, intrinsic: bool) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("fake {name}"),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "additionalProperties": false
        }),
        access,
        effects: match access {
            Access::Read => Effects::LOCAL_READ,
            Access::Write => Effects::LOCAL_WRITE,
        },
        intrinsic,
        first_party: access == Access::Read,
    }
}

/// The default tool set: `read` (first-party read), `write` (write), `broken` (read that
/// fails), `boom` (read that panics), `slow` (write that sleeps 60 s), `nap` (read that
/// sleeps 60 s). The kernel adds its
/// intrinsic `todo` and `plan`.
pub(crate) fn default_tools(log: &InvocationLog) -> Vec<Arc<dyn Tool>> {
    let tool = |name: &str, access, intrinsic, behaviour| -> Arc<dyn Tool> {
        Arc::new(FakeTool { spec: spec(name, access, intrinsic), log: log.clone(), behaviour })
    };
    vec![
        tool("read", Access::Read, false, Behaviour::Reply("contents of a".into())),
        tool("write", Access::Write, false, Behaviour::Reply("written".into())),
        tool("broken", Access::Read, false, Behaviour::Fail("it broke".into())),
        tool("boom", Access::Read, false, Behaviour::Panic),
        tool("slow", Access::Write, false, Behaviour::Sleep(Duration::from_secs(60))),
        tool("nap", Access::Read, false, Behaviour::Sleep(Duration::from_secs(60))),
    ]
}

/// One configured kernel over a MemStore.
pub(crate) struct Harness {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) log: InvocationLog,
    pub(crate) envelope: Envelope,
    pub(crate) mode: ExecutionMode,
    pub(crate) approval: PermissionAnswer,
    pub(crate) max_steps: Option<u32>,
    pub(crate) budget: keel_contracts::Budget,
    pub(crate) price: Option<keel_contracts::Price>,
    pub(crate) context: keel_contracts::ContextPolicy,
    /// Tools added after the default set (so default transcripts stay as they are).
    pub(crate) extra_tools: Vec<Arc<dyn Tool>>,
    pub(crate) instructions: Vec<Instruction>,
    pub(crate) skills: keel_kernel::Skills,
    pub(crate) output_schema: Option<serde_json::Value>,
    pub(crate) rules: PermissionRules,
    pub(crate) ids: Arc<SeqIds>,
    pub(crate) clock: Arc<FakeClock>,
    /// The session's workspace (`/ws`, which does not exist, unless a test needs real files).
    pub(crate) workspace: std::path::PathBuf,
}

impl Harness {
    pub(crate) fn new() -> Harness {
        Harness {
            store: Arc::new(MemStore::new()),
            log: Arc::default(),
            envelope: Envelope::executor(),
            mode: ExecutionMode::Live,
            approval: PermissionAnswer::AllowOnce,
            max_steps: None,
            budget: keel_contracts::Budget::default(),
            price: None,
            context: Default::default(),
            extra_tools: Vec::new(),
            instructions: Vec::new(),
            skills: keel_kernel::Skills::default(),
            output_schema: None,
            rules: PermissionRules::default(),
            ids: Arc::new(SeqIds::new()),
            clock: Arc::new(FakeClock::new()),
            workspace: "/ws".into(),
        }
    }

    pub(crate) fn kernel_with(&self, model: Arc<dyn ModelClient>) -> Kernel {
        self.kernel_with_permissions(model, Arc::new(StaticPermissions(self.approval)))
    }

    /// A kernel whose permission requests go to `permissions`.
    pub(crate) fn kernel_with_permissions(
        &self,
        model: Arc<dyn ModelClient>,
        permissions: Arc<dyn keel_kernel::PermissionHook>,
    ) -> Kernel {
        Kernel::new(KernelDeps {
            store: self.store.clone(),
            model,
            tools: default_tools(&self.log)
                .into_iter()
                .chain(self.extra_tools.iter().cloned())
                .collect(),
            clock: self.clock.clone(),
            ids: self.ids.clone(),
            permissions,
            observer: Arc::new(NoopObserver),
            counter: Arc::new(keel_contracts::ApproxCounter),
        })
        .unwrap()
    }

    /// A kernel over `script` that reads the time from `clock` instead of the harness's.
    pub(crate) fn kernel_with_clock(
        &self,
        script: &str,
        clock: Arc<dyn keel_contracts::Clock>,
    ) -> Kernel {
        let model = ScriptedModel::new(serde_json::from_str(script).unwrap(), "test-script");
        Kernel::new(KernelDeps {
            store: self.store.clone(),
            model: Arc::new(model),
            tools: default_tools(&self.log)
                .into_iter()
                .chain(self.extra_tools.iter().cloned())
                .collect(),
            clock,
            ids: self.ids.clone(),
            permissions: Arc::new(StaticPermissions(self.approval)),
            observer: Arc::new(NoopObserver),
            counter: Arc::new(keel_contracts::ApproxCounter),
        })
        .unwrap()
    }

    pub(crate) fn kernel(&self, script: &str) -> Kernel {
        let model = ScriptedModel::new(serde_json::from_str(script).unwrap(), "test-script");
        self.kernel_with(Arc::new(model))
    }

    pub(crate) fn run_config(&self) -> RunConfig {
        RunConfig {
            sandbox: SandboxMode::Bypass,
            approval: match self.approval {
                PermissionAnswer::Deny => ApprovalMode::Deny,
                PermissionAnswer::AllowOnce
                | PermissionAnswer::AllowSession
                | PermissionAnswer::AllowExact => ApprovalMode::Auto,
            },
            budget: keel_contracts::Budget { max_steps: self.max_steps, ..self.budget },
            price: self.price,
            context: self.context,
            instructions: self.instructions.clone(),
            rules: self.rules.clone(),
            cancel_poll: Duration::from_millis(50),
            grant_ttl: keel_kernel::DEFAULT_GRANT_TTL,
            skills: self.skills.clone(),
            output_schema: self.output_schema.clone(),
        }
    }

    pub(crate) async fn session(&self, kernel: &Kernel) -> SessionId {
        kernel
            .create_session(&SessionConfig {
                workspace: self.workspace.clone(),
                model_spec: "scripted:test".into(),
                envelope: self.envelope.clone(),
                mode: self.mode,
                base_url: None,
            })
            .await
            .unwrap()
    }

    /// Creates a session and runs one turn of `script` with `input`.
    pub(crate) async fn run(&self, script: &str, input: &str) -> (RunReport, String) {
        let kernel = self.kernel(script);
        let session = self.session(&kernel).await;
        let report = kernel
            .run_turn(session, input, &self.run_config(), &Cancellation::new())
            .await
            .unwrap();
        let ledger = self.render(session).await;
        (report, ledger)
    }

    pub(crate) async fn events(&self, session: SessionId) -> Vec<RuntimeEvent> {
        self.store.read(session, Seq(0)).await.unwrap()
    }

    pub(crate) async fn render(&self, session: SessionId) -> String {
        render(&self.events(session).await)
    }

    pub(crate) fn invocations(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

/// The ledger as text, one event per line, ids abbreviated to their counter.
pub(crate) fn render(events: &[RuntimeEvent]) -> String {
    let mut out = String::new();
    for event in events {
        let line = match &event.kind {
            EventKind::SessionCreated { model, mode, envelope, .. } => {
                format!("session_created {model} {mode:?} forbidden={:?}", envelope.forbidden)
            }
            EventKind::SessionSealed { reason } => format!("session_sealed {reason}"),
            EventKind::ScheduleFired { schedule_id, scheduled_at } => {
                format!(
                    "schedule_fired {} {}",
                    short(&schedule_id.to_string()),
                    scheduled_at.to_rfc3339()
                )
            }
            EventKind::WaitStarted { call_id, event, deadline, .. } => {
                format!("wait_started {call_id} {event:?} until {}", deadline.to_rfc3339())
            }
            EventKind::PlanApproved { by } => format!("plan_approved by {by}"),
            EventKind::ElicitationRequested { call_id, question, server, .. } => {
                format!("elicitation_requested {call_id} {question} from {server}")
            }
            EventKind::ElicitationAnswered { question, action, by, .. } => {
                format!("elicitation_answered {question} {} by {by}", action.as_str())
            }
            EventKind::ToolsChanged { added, removed, .. } => {
                format!("tools_changed +{added:?} -{removed:?}")
            }
            EventKind::TurnStarted { input } => format!("turn_started {input:?}"),
            EventKind::InputJoined { input } => format!("input_joined {input:?}"),
            EventKind::RunStarted { mode, approval, budget, resumes, .. } => format!(
                "run_started {mode:?} {approval:?} max_steps={:?}{}",
                budget.max_steps,
                resumes.map(|r| format!(" resumes={}", short(&r.to_string()))).unwrap_or_default()
            ),
            EventKind::RunComposition { provider, tools, .. } => {
                format!("run_composition {provider} tools={}", tools.join(","))
            }
            EventKind::ModelRequested { step, messages, pruned_results, purpose, .. } => {
                let pruned = if *pruned_results > 0 {
                    format!(" pruned={pruned_results}")
                } else {
                    String::new()
                };
                let purpose =
                    if purpose.is_conversation() { String::new() } else { format!(" {purpose:?}") };
                format!("model_requested step={step} messages={messages}{pruned}{purpose}")
            }
            EventKind::Compaction { covers_from, covers_to, summary, carried, .. } => format!(
                "compaction #{covers_from}..#{covers_to} {summary:?} inputs={} files={:?}",
                carried.inputs.len(),
                carried.files
            ),
            EventKind::CompactionFailed { reason, attempts } => {
                format!("compaction_failed after {attempts} attempts: {reason}")
            }
            EventKind::ModelResponse { text, tool_calls, finish_reason, purpose, .. } => {
                let calls: Vec<String> = tool_calls
                    .iter()
                    .map(|c| format!("{} {} {}", c.call_id, c.name, c.arguments))
                    .collect();
                let purpose =
                    if purpose.is_conversation() { String::new() } else { format!("{purpose:?} ") };
                format!("model_response {purpose}{finish_reason} {text:?} [{}]", calls.join("; "))
            }
            EventKind::ModelRetry { step, attempt, status, error, wait_ms, purpose, .. } => {
                let purpose =
                    if purpose.is_conversation() { String::new() } else { format!(" {purpose:?}") };
                format!(
                    "model_retry step={step} attempt={attempt} status={status:?} {error} \
                     wait_ms={wait_ms}{purpose}"
                )
            }
            EventKind::BudgetExhausted { reason, report_requested } => {
                format!("budget_exhausted report_requested={report_requested} {reason}")
            }
            EventKind::Checkpoint { report, evidence, .. } => {
                let evidence: Vec<String> = evidence
                    .iter()
                    .map(|e| format!("#{} {} {}", e.seq.0, e.tool, e.outcome.as_str()))
                    .collect();
                format!("checkpoint {report:?} evidence=[{}]", evidence.join(", "))
            }
            EventKind::GateDecision { call_id, decision, reason, .. } => {
                format!("gate_decision {call_id} {decision:?} {reason}")
            }
            EventKind::PermissionRequested { call_id, access, .. } => {
                format!("permission_requested {call_id} {}", access.as_str())
            }
            EventKind::PermissionSettled { call_id, answer, by, expires_at, .. } => {
                let until = expires_at.map(|at| format!(" until {at}")).unwrap_or_default();
                format!("permission_settled {call_id} {answer:?} by {by}{until}")
            }
            EventKind::ToolCall { parent_call_id, call_id, tool, arguments } => {
                format!("tool_call {call_id} {tool} {arguments} parent={parent_call_id}")
            }
            EventKind::ToolAttemptPrepared { call_id, attempt_id, .. } => {
                format!("tool_attempt_prepared {call_id}/{}", short(&attempt_id.to_string()))
            }
            EventKind::ToolResult { call_id, attempt_id, outcome, content, .. } => format!(
                "tool_result {call_id}/{} {} {content:?}",
                attempt_id.map(|a| short(&a.to_string())).unwrap_or_else(|| "-".into()),
                outcome.as_str()
            ),
            EventKind::SkillCatalog { shown, omitted, budget_tokens, diagnostics } => format!(
                "skill_catalog shown={shown:?} omitted={omitted:?} budget={budget_tokens} \
                 diagnostics={}",
                diagnostics.len()
            ),
            EventKind::SkillActivated { call_id, name, .. } => {
                format!("skill_activated {call_id} {name}")
            }
            EventKind::ShadowIntent { call_id, tool, arguments } => {
                format!("shadow_intent {call_id} {tool} {arguments}")
            }
            EventKind::RunCompleted { reason, .. } => format!("run_completed {reason}"),
            EventKind::RunFailed { reason, .. } => format!("run_failed {reason}"),
            EventKind::RunSuspended { reason, .. } => format!("run_suspended {reason}"),
            EventKind::RunCancelled { reason, .. } => format!("run_cancelled {reason}"),
            EventKind::RunDenied { reason, .. } => format!("run_denied {reason}"),
            EventKind::BoundaryRevised { revision, boundary, .. } => format!(
                "boundary_revised {revision} read={:?} write={:?} network={}",
                boundary.read, boundary.write, boundary.network
            ),
        };
        out.push_str(&format!("#{} {line}\n", event.seq.0));
    }
    out
}

/// `00000000-0000-7000-8000-000000000007` → `id7`.
fn short(id: &str) -> String {
    let tail = id.rsplit('-').next().unwrap_or(id).trim_start_matches('0');
    format!("id{tail}")
}

/// Wraps a model and keeps every request it was sent.
#[derive(Debug)]
pub(crate) struct Recording {
    pub(crate) inner: Arc<dyn ModelClient>,
    pub(crate) requests: Arc<Mutex<Vec<keel_contracts::ModelRequest>>>,
}

#[async_trait]
impl ModelClient for Recording {
    fn info(&self) -> keel_contracts::ModelInfo {
        self.inner.info()
    }
    async fn complete(
        &self,
        request: &keel_contracts::ModelRequest,
        on_delta: &(dyn Fn(keel_contracts::StreamDelta) + Send + Sync),
    ) -> Result<keel_contracts::ModelResponse, keel_contracts::ModelError> {
        self.requests.lock().unwrap().push(request.clone());
        self.inner.complete(request, on_delta).await
    }
}

impl Harness {
    /// A kernel over `script` that records the requests it sends.
    pub(crate) fn recording_kernel(
        &self,
        script: &str,
    ) -> (Kernel, Arc<Mutex<Vec<keel_contracts::ModelRequest>>>) {
        let model = ScriptedModel::new(serde_json::from_str(script).unwrap(), "test-script");
        let requests = Arc::default();
        let recording = Recording { inner: Arc::new(model), requests: Arc::clone(&requests) };
        (self.kernel_with(Arc::new(recording)), requests)
    }
}

/// `emit {bytes}`: a first-party read that returns exactly `bytes` bytes of numbered lines.
#[derive(Debug)]
pub(crate) struct Emit(pub(crate) ToolSpec);

impl Emit {
    pub(crate) fn tool() -> Arc<dyn Tool> {
        Arc::new(Emit(ToolSpec {
            name: "emit".into(),
            description: "emits bytes".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"bytes": {"type": "integer", "minimum": 0}},
                "required": ["bytes"],
                "additionalProperties": false
            }),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: false,
            first_party: true,
        }))
    }

    pub(crate) fn content(bytes: usize) -> String {
        let mut text = String::with_capacity(bytes + 32);
        let mut line = 0;
        while text.len() < bytes {
            text.push_str(&format!("line {line:08}\n"));
            line += 1;
        }
        text.truncate(bytes);
        text
    }
}

#[async_trait]
impl Tool for Emit {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn invoke(&self, _context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let bytes = usize::try_from(arguments["bytes"].as_u64().unwrap_or(0)).unwrap();
        ToolOutput::ok(Emit::content(bytes))
    }
}
