//! GenAI-shaped ledgers for the `otlp` sink: a [`Ledger`] builder that appends events one
//! second apart, and [`one_run`], one run with a tool call that runs, one that is refused,
//! and content holding `SECRET` everywhere.

use chrono::{DateTime, Utc};
use keel_contracts::{
    ApprovalMode, AttemptId, Budget, Decision, Envelope, EventKind, ExecutionMode, FinishReason,
    Lineage, Outcome, RequestPurpose, RunId, RuntimeEvent, SandboxMode, Seq, SessionId, Store,
    ToolCall, TurnId, Usage, UsageTotals,
};
use keel_testkit::MemStore;

pub(crate) fn id(n: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(0x0198_0000_0000_7000_8000_0000_0000_0000 | n)
}

/// Appends events to one session, one second apart from 2026-01-01.
pub(crate) struct Ledger {
    pub(crate) session_id: SessionId,
    pub(crate) seq: u64,
    pub(crate) events: Vec<RuntimeEvent>,
}

impl Ledger {
    pub(crate) fn new(session_id: SessionId, model: &str, lineage: Option<Lineage>) -> Ledger {
        let mut ledger = Ledger { session_id, seq: 0, events: Vec::new() };
        ledger.push(
            None,
            None,
            EventKind::SessionCreated {
                workspace: "/ws".into(),
                model: model.into(),
                envelope: Envelope::executor(),
                mode: ExecutionMode::Live,
                base_url: None,
                lineage,
            },
        );
        ledger
    }

    pub(crate) fn push(
        &mut self,
        turn: Option<TurnId>,
        run: Option<RunId>,
        kind: EventKind,
    ) -> Seq {
        self.seq += 1;
        let ts = DateTime::<Utc>::from_timestamp(1_767_225_600 + self.seq as i64, 0).unwrap();
        self.events.push(RuntimeEvent {
            seq: Seq(self.seq),
            session_id: self.session_id,
            turn_id: turn,
            run_id: run,
            ts,
            kind,
        });
        Seq(self.seq)
    }

    pub(crate) fn run_started(&mut self, turn: TurnId, run: RunId, resumes: Option<RunId>) {
        self.push(
            Some(turn),
            Some(run),
            EventKind::RunStarted {
                mode: ExecutionMode::Live,
                sandbox: SandboxMode::Managed,
                approval: ApprovalMode::Auto,
                budget: Budget::default(),
                resumes,
            },
        );
        self.push(
            Some(turn),
            Some(run),
            EventKind::RunComposition {
                provider: "openai".into(),
                model: "gpt-4o".into(),
                context_window: Some(128_000),
                system_prompt: "SECRET-SYSTEM prompt".into(),
                system_prompt_sha256: "00".into(),
                tools: vec!["read_file".into(), "bash".into()],
                tools_sha256: "00".into(),
            },
        );
    }

    pub(crate) fn requested(&mut self, turn: TurnId, run: RunId, step: u32) {
        self.push(
            Some(turn),
            Some(run),
            EventKind::ModelRequested {
                step,
                messages: 2,
                request_sha256: "00".into(),
                tokens: Some(90),
                tokens_before_pruning: None,
                pruned_results: 0,
                purpose: RequestPurpose::Conversation,
            },
        );
    }

    pub(crate) fn response(
        &mut self,
        turn: TurnId,
        run: RunId,
        text: &str,
        calls: Vec<ToolCall>,
        usage: Usage,
        finish: FinishReason,
    ) {
        self.push(
            Some(turn),
            Some(run),
            EventKind::ModelResponse {
                text: text.into(),
                reasoning: Vec::new(),
                tool_calls: calls,
                usage,
                raw_usage: None,
                finish_reason: finish,
                cost_usd: None,
                estimated_usage: None,
                purpose: RequestPurpose::Conversation,
            },
        );
    }

    pub(crate) fn prepared(
        &mut self,
        turn: TurnId,
        run: RunId,
        call: &str,
        attempt: AttemptId,
        tool: &str,
    ) {
        self.push(
            Some(turn),
            Some(run),
            EventKind::ToolAttemptPrepared {
                call_id: call.into(),
                attempt_id: attempt,
                tool: tool.into(),
                arguments_sha256: "00".into(),
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn result(
        &mut self,
        turn: TurnId,
        run: RunId,
        call: &str,
        attempt: Option<AttemptId>,
        tool: &str,
        outcome: Outcome,
        content: &str,
    ) {
        self.push(
            Some(turn),
            Some(run),
            EventKind::ToolResult {
                call_id: call.into(),
                attempt_id: attempt,
                tool: tool.into(),
                outcome,
                content: content.into(),
                bytes: content.len() as u64,
                raw: None,
            },
        );
    }

    pub(crate) async fn store(&self, store: &MemStore, range: std::ops::RangeInclusive<u64>) {
        let events: Vec<RuntimeEvent> =
            self.events.iter().filter(|event| range.contains(&event.seq.0)).cloned().collect();
        store.append(&events).await.unwrap();
    }
}

pub(crate) fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall { call_id: id.into(), name: name.into(), arguments, arguments_error: None }
}

pub(crate) fn usage(input: u64, output: u64, cached: Option<u64>, reasoning: Option<u64>) -> Usage {
    Usage {
        input_tokens: Some(input),
        output_tokens: Some(output),
        cached_input_tokens: cached,
        reasoning_tokens: reasoning,
    }
}

pub(crate) const SESSION: u128 = 1;
pub(crate) const TURN: u128 = 2;
pub(crate) const RUN: u128 = 3;
pub(crate) const ATTEMPT: u128 = 4;

/// One run: a response with two calls (read_file runs, bash is refused), then an answer.
/// Every piece of content holds `SECRET`.
pub(crate) fn one_run() -> Ledger {
    let (turn, run) = (TurnId(id(TURN)), RunId(id(RUN)));
    let mut ledger = Ledger::new(SessionId(id(SESSION)), "openai:gpt-4o", None);
    ledger.push(
        Some(turn),
        None,
        EventKind::TurnStarted { input: "SECRET-INPUT fix the bug".into() },
    );
    ledger.run_started(turn, run, None); // 3, 4
    ledger.requested(turn, run, 1); // 5
    ledger.response(
        turn,
        run,
        "SECRET-TEXT let me look",
        vec![
            call("call_1", "read_file", serde_json::json!({"path": "SECRET-ARG.txt"})),
            call("call_2", "bash", serde_json::json!({"command": "rm -rf SECRET"})),
        ],
        usage(100, 20, Some(60), Some(7)),
        FinishReason::ToolCalls,
    ); // 6
    ledger.push(
        Some(turn),
        Some(run),
        EventKind::GateDecision {
            call_id: "call_1".into(),
            tool: "read_file".into(),
            decision: Decision::Allow,
            reason: "read".into(),
        },
    ); // 7
    ledger.prepared(turn, run, "call_1", AttemptId(id(ATTEMPT)), "read_file"); // 8
    ledger.result(
        turn,
        run,
        "call_1",
        Some(AttemptId(id(ATTEMPT))),
        "read_file",
        Outcome::Ok,
        "SECRET-RESULT contents",
    ); // 9
    ledger.result(turn, run, "call_2", None, "bash", Outcome::Refused, "refused: SECRET"); // 10
    ledger.requested(turn, run, 2); // 11
    ledger.response(
        turn,
        run,
        "done SECRET-ANSWER",
        vec![],
        usage(150, 5, None, None),
        FinishReason::Stop,
    ); // 12
    let mut totals = UsageTotals::default();
    totals.add(&usage(100, 20, Some(60), Some(7)), None, None);
    totals.add(&usage(150, 5, None, None), None, None);
    ledger.push(
        Some(turn),
        Some(run),
        EventKind::RunCompleted {
            reason: "answered".into(),
            usage: totals,
            answer: Some("done SECRET-ANSWER".into()),
            duration_ms: Some(10_000),
        },
    ); // 13
    ledger
}
