//! Ledger events to OpenTelemetry GenAI telemetry (semantic conventions
//! [`SEMCONV_VERSION`]): a fold over one session's events, in seq order, that closes a span
//! when the event ending it goes by.
//!
//! A span is a pure function of the session's events up to its closing event, and its ids
//! are derived from ledger identities, so delivering the same events again yields the same
//! spans with the same ids:
//!
//! - trace id: the run id's 16 bytes (one trace per run);
//! - `invoke_agent` span id: SHA-256 of `invoke_agent`, run id (first 8 bytes);
//! - `chat {model}` span id: SHA-256 of `chat`, run id, seq of the `model_requested`;
//! - `execute_tool {tool}` span id: SHA-256 of `execute_tool`, run id, call id.
//!
//! An `execute_tool` span is emitted only for a call whose `tool_attempt_prepared` and
//! `tool_result` are both in the same run: a call refused, shadowed or never dispatched is
//! an event on its run's `invoke_agent` span instead, and a run never shows a tool
//! execution for an attempt another run made (an indeterminate attempt stays in the trace
//! of the run that attempted it, as `error.type = indeterminate`, and nowhere else).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use keel_contracts::{
    AttemptId, EventKind, Lineage, Outcome, RequestPurpose, RunId, RuntimeEvent, Seq, SessionId,
    ToolCallId, TurnId, Usage, UsageTotals,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, Status, span, status};
use sha2::{Digest, Sha256};

/// The OpenTelemetry semantic conventions version the spans and metrics follow.
pub const SEMCONV_VERSION: &str = "1.41.0";

/// Longest captured content value, in bytes (each text is cut to it, on a char boundary).
const CONTENT_CAP: usize = 16 * 1024;

/// One measurement for a metric, from a span that closed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observation {
    /// Which histogram.
    pub(crate) metric: MetricKind,
    /// The measured value (tokens, or seconds).
    pub(crate) value: f64,
    /// The series' attributes, sorted by key.
    pub(crate) attributes: Vec<(String, String)>,
    /// When the measured operation started and ended (Unix ns).
    pub(crate) start_unix_ns: u64,
    pub(crate) end_unix_ns: u64,
}

/// The two GenAI client histograms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum MetricKind {
    /// `gen_ai.client.token.usage` (`{token}`).
    TokenUsage,
    /// `gen_ai.client.operation.duration` (`s`).
    OperationDuration,
}

/// What one folded batch produced, in the order of the events that closed it.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub(crate) spans: Vec<Span>,
    pub(crate) observations: Vec<Observation>,
}

/// Where a session's fold stands: the facts of open runs needed to close their spans.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fold {
    /// The last seq folded (`#0`: none).
    pub(crate) last: Seq,
    capture: bool,
    lineage: Option<Lineage>,
    /// The session's model spec, for runs without a `run_composition`.
    model_spec: String,
    /// Turn inputs, kept only when content is captured.
    inputs: BTreeMap<TurnId, String>,
    runs: BTreeMap<RunId, RunState>,
}

#[derive(Debug, Clone)]
struct RunState {
    turn_id: Option<TurnId>,
    start_unix_ns: u64,
    resumes: Option<RunId>,
    provider: Option<String>,
    model: Option<String>,
    system_prompt: Option<String>,
    chat: Option<OpenChat>,
    /// Calls the model proposed in this run: name and (when captured) arguments.
    calls: BTreeMap<ToolCallId, Option<String>>,
    attempts: BTreeMap<AttemptId, OpenAttempt>,
    /// Calls answered without being executed, as span events of `invoke_agent`.
    not_executed: Vec<span::Event>,
}

#[derive(Debug, Clone)]
struct OpenChat {
    seq: Seq,
    start_unix_ns: u64,
    step: u32,
    purpose: RequestPurpose,
    retry_error: Option<String>,
}

#[derive(Debug, Clone)]
struct OpenAttempt {
    call_id: ToolCallId,
    start_unix_ns: u64,
}

impl Fold {
    /// A fold for a session not seen yet; `capture` opts in to content attributes.
    pub(crate) fn new(capture: bool) -> Fold {
        Fold { capture, ..Fold::default() }
    }

    /// Folds `event` (the next of its session), adding what it closes to `out`.
    pub(crate) fn apply(&mut self, event: &RuntimeEvent, out: &mut Output) {
        self.last = event.seq;
        let ts = nanos(event.ts);
        let session_id = event.session_id;
        match &event.kind {
            EventKind::SessionCreated { model, lineage, .. } => {
                self.model_spec = model.clone();
                self.lineage = lineage.clone();
            }
            EventKind::TurnStarted { input } => {
                if self.capture
                    && let Some(turn_id) = event.turn_id
                {
                    // Only the latest turn's input can still be needed.
                    self.inputs.clear();
                    self.inputs.insert(turn_id, input.clone());
                }
            }
            EventKind::RunStarted { resumes, .. } => {
                let Some(run_id) = event.run_id else { return };
                self.runs.insert(
                    run_id,
                    RunState {
                        turn_id: event.turn_id,
                        start_unix_ns: ts,
                        resumes: *resumes,
                        provider: None,
                        model: None,
                        system_prompt: None,
                        chat: None,
                        calls: BTreeMap::new(),
                        attempts: BTreeMap::new(),
                        not_executed: Vec::new(),
                    },
                );
            }
            EventKind::RunComposition { provider, model, system_prompt, .. } => {
                let capture = self.capture;
                if let Some(run) = self.run(event.run_id) {
                    run.provider = Some(provider.clone());
                    run.model = Some(model.clone());
                    if capture {
                        run.system_prompt = Some(system_prompt.clone());
                    }
                }
            }
            EventKind::ModelRequested { step, purpose, .. } => {
                let Some(run_id) = event.run_id else { return };
                let (spec_provider, spec_model) = split_spec(&self.model_spec);
                let Some(run) = self.runs.get_mut(&run_id) else { return };
                if let Some(open) = run.chat.take() {
                    // A request without a response before the next one: it failed.
                    let span = chat_span(session_id, run_id, run, &open, spec_provider, spec_model);
                    out.push_chat(span.close_failed(ts, "_OTHER"));
                }
                run.chat = Some(OpenChat {
                    seq: event.seq,
                    start_unix_ns: ts,
                    step: *step,
                    purpose: *purpose,
                    retry_error: None,
                });
            }
            EventKind::ModelRetry { error, .. } => {
                if let Some(run) = self.run(event.run_id)
                    && let Some(open) = run.chat.as_mut()
                {
                    open.retry_error = Some(error.clone());
                }
            }
            EventKind::ModelResponse {
                text,
                tool_calls,
                usage,
                finish_reason,
                estimated_usage,
                ..
            } => {
                let Some(run_id) = event.run_id else { return };
                let capture = self.capture;
                let (spec_provider, spec_model) = split_spec(&self.model_spec);
                let Some(run) = self.runs.get_mut(&run_id) else { return };
                for call in tool_calls {
                    let arguments = capture.then(|| cap(call.arguments.to_string()));
                    run.calls.insert(call.call_id.clone(), arguments);
                }
                let open = run.chat.take().unwrap_or(OpenChat {
                    seq: event.seq,
                    start_unix_ns: ts,
                    step: 0,
                    purpose: RequestPurpose::Conversation,
                    retry_error: None,
                });
                let mut span = chat_span(session_id, run_id, run, &open, spec_provider, spec_model);
                span.usage(usage, estimated_usage.is_some());
                span.attr_strings(
                    "gen_ai.response.finish_reasons",
                    vec![finish_reason.to_string()],
                );
                if capture {
                    let mut parts = Vec::new();
                    if !text.is_empty() {
                        parts.push(
                            serde_json::json!({"type": "text", "content": cap(text.clone())}),
                        );
                    }
                    for call in tool_calls {
                        parts.push(serde_json::json!({"type": "tool_call", "id": call.call_id,
                            "name": call.name, "arguments": capped_json(&call.arguments)}));
                    }
                    let message = serde_json::json!([{"role": "assistant", "parts": parts,
                        "finish_reason": finish_reason.to_string()}]);
                    span.attr("gen_ai.output.messages", message.to_string());
                }
                let series = span.series();
                for (kind, figure) in
                    [("input", usage.input_tokens), ("output", output_tokens(usage))]
                {
                    if let Some(figure) = figure {
                        let mut attributes = series.clone();
                        attributes.push(("gen_ai.token.type".into(), kind.into()));
                        attributes.sort();
                        out.observations.push(Observation {
                            metric: MetricKind::TokenUsage,
                            value: figure as f64,
                            attributes,
                            start_unix_ns: open.start_unix_ns,
                            end_unix_ns: ts,
                        });
                    }
                }
                out.push_chat(span.close_ok(ts));
            }
            EventKind::ToolAttemptPrepared { call_id, attempt_id, .. } => {
                if let Some(run) = self.run(event.run_id) {
                    run.attempts.insert(
                        *attempt_id,
                        OpenAttempt { call_id: call_id.clone(), start_unix_ns: ts },
                    );
                }
            }
            EventKind::ToolResult { call_id, attempt_id, tool, outcome, content, .. } => {
                let Some(run_id) = event.run_id else { return };
                let capture = self.capture;
                let Some(run) = self.runs.get_mut(&run_id) else { return };
                let attempt = attempt_id.and_then(|id| run.attempts.remove(&id));
                let Some(attempt) = attempt.filter(|attempt| attempt.call_id == *call_id) else {
                    // Not executed in this run: refused, shadowed, cancelled before dispatch,
                    // or an attempt of another run.
                    let mut attributes = vec![
                        kv("gen_ai.tool.name", tool.clone()),
                        kv("gen_ai.tool.call.id", call_id.to_string()),
                        kv("keel.tool.outcome", outcome.as_str()),
                    ];
                    attributes.sort_by(|a, b| a.key.cmp(&b.key));
                    run.not_executed.push(span::Event {
                        time_unix_nano: ts,
                        name: "keel.tool_call.not_executed".into(),
                        attributes,
                        ..Default::default()
                    });
                    return;
                };
                let provider = run.provider.clone();
                let model = run.model.clone();
                let arguments = run.calls.get(call_id).cloned().flatten();
                let mut span = Building::new(
                    session_id,
                    run_id,
                    span_id(&["execute_tool", &run_id.to_string(), call_id.as_str()]),
                    format!("execute_tool {tool}"),
                    span::SpanKind::Internal,
                    attempt.start_unix_ns,
                );
                span.attr("gen_ai.operation.name", "execute_tool");
                span.attr("gen_ai.tool.name", tool.clone());
                span.attr("gen_ai.tool.call.id", call_id.to_string());
                span.attr("gen_ai.tool.type", "function");
                span.attr("keel.tool.outcome", outcome.as_str());
                if let Some(attempt_id) = attempt_id {
                    span.attr("keel.tool.attempt.id", attempt_id.0.to_string());
                }
                if capture {
                    if let Some(arguments) = arguments {
                        span.attr("gen_ai.tool.call.arguments", arguments);
                    }
                    span.attr("gen_ai.tool.call.result", cap(content.clone()));
                }
                let mut series = vec![
                    ("gen_ai.operation.name".to_owned(), "execute_tool".to_owned()),
                    ("gen_ai.tool.name".to_owned(), tool.clone()),
                ];
                if let Some(provider) = provider {
                    series.push(("gen_ai.provider.name".into(), provider));
                }
                if let Some(model) = model {
                    series.push(("gen_ai.request.model".into(), model));
                }
                let closed = match outcome {
                    Outcome::Ok => span.close_ok(ts),
                    // Its effect is unknown and so is its end: the span claims no duration.
                    Outcome::Indeterminate => {
                        span.close_failed(attempt.start_unix_ns, "indeterminate")
                    }
                    other => span.close_failed(ts, other.as_str()),
                };
                if *outcome != Outcome::Indeterminate {
                    if *outcome != Outcome::Ok {
                        series.push(("error.type".into(), outcome.as_str().into()));
                    }
                    series.sort();
                    out.observations.push(Observation {
                        metric: MetricKind::OperationDuration,
                        value: seconds(attempt.start_unix_ns, ts),
                        attributes: series,
                        start_unix_ns: attempt.start_unix_ns,
                        end_unix_ns: ts,
                    });
                }
                out.spans.push(closed);
            }
            kind if kind.is_run_terminal() => {
                let Some(run_id) = event.run_id else { return };
                let (spec_provider, spec_model) = split_spec(&self.model_spec);
                let Some(mut run) = self.runs.remove(&run_id) else { return };
                let (outcome, usage, answer) = terminal(kind);
                if let Some(open) = run.chat.take() {
                    let error = match outcome {
                        "cancelled" => "cancelled".to_owned(),
                        _ => open.retry_error.clone().unwrap_or_else(|| "_OTHER".into()),
                    };
                    let span =
                        chat_span(session_id, run_id, &run, &open, spec_provider, spec_model);
                    out.push_chat(span.close_failed(ts, &error));
                }
                let input = run.turn_id.and_then(|turn| self.inputs.get(&turn).cloned());
                out.spans.push(
                    self.agent_span(session_id, run_id, run, outcome, usage, answer, input, ts),
                );
            }
            _ => {}
        }
    }

    fn run(&mut self, run_id: Option<RunId>) -> Option<&mut RunState> {
        run_id.and_then(|run_id| self.runs.get_mut(&run_id))
    }

    #[allow(clippy::too_many_arguments)]
    fn agent_span(
        &self,
        session_id: SessionId,
        run_id: RunId,
        run: RunState,
        outcome: &str,
        usage: Option<&UsageTotals>,
        answer: Option<&String>,
        input: Option<String>,
        end: u64,
    ) -> Span {
        let (spec_provider, spec_model) = split_spec(&self.model_spec);
        let mut span = Building::new(
            session_id,
            run_id,
            agent_span_id(run_id),
            "invoke_agent".into(),
            span::SpanKind::Internal,
            run.start_unix_ns,
        );
        span.parent = Vec::new();
        span.attr("gen_ai.operation.name", "invoke_agent");
        span.attr(
            "gen_ai.provider.name",
            run.provider.clone().unwrap_or_else(|| spec_provider.into()),
        );
        span.attr("gen_ai.request.model", run.model.clone().unwrap_or_else(|| spec_model.into()));
        span.attr("keel.run.outcome", outcome);
        if let Some(turn_id) = run.turn_id {
            span.attr("keel.turn.id", turn_id.to_string());
        }
        if let Some(usage) = usage {
            span.attr_int("gen_ai.usage.input_tokens", usage.input_tokens);
            span.attr_int(
                "gen_ai.usage.output_tokens",
                usage.output_tokens + usage.reasoning_tokens,
            );
            span.attr_int("gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens);
            span.attr_int("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens);
            if let Some(cost) = usage.cost_usd {
                span.attributes.push(KeyValue {
                    key: "keel.usage.cost_usd".into(),
                    value: Some(AnyValue { value: Some(any_value::Value::DoubleValue(cost)) }),
                    ..Default::default()
                });
            }
        }
        if let Some(previous) = run.resumes {
            span.attr("keel.run.resumes", previous.to_string());
            span.links.push(link(previous, agent_span_id(previous), "resumes"));
        }
        if let Some(lineage) = &self.lineage {
            span.attr("keel.parent.session_id", lineage.parent_session_id.to_string());
            span.attr("keel.parent.call_id", lineage.parent_call_id.to_string());
            let parent_call = span_id(&[
                "execute_tool",
                &lineage.parent_run_id.to_string(),
                lineage.parent_call_id.as_str(),
            ]);
            span.links.push(link(lineage.parent_run_id, parent_call, "parent_call"));
        }
        if self.capture {
            if let Some(system) = &run.system_prompt {
                let value = serde_json::json!([{"type": "text", "content": cap(system.clone())}]);
                span.attr("gen_ai.system_instructions", value.to_string());
            }
            if let Some(input) = input {
                let value = serde_json::json!([{"role": "user",
                    "parts": [{"type": "text", "content": cap(input)}]}]);
                span.attr("gen_ai.input.messages", value.to_string());
            }
            if let Some(answer) = answer {
                let value = serde_json::json!([{"role": "assistant",
                    "parts": [{"type": "text", "content": cap(answer.clone())}]}]);
                span.attr("gen_ai.output.messages", value.to_string());
            }
        }
        span.events = run.not_executed;
        match outcome {
            "completed" | "suspended" => span.close_ok(end),
            failed => span.close_failed(end, failed),
        }
    }
}

impl Output {
    fn push_chat(&mut self, (span, observation): (Span, Observation)) {
        self.spans.push(span);
        self.observations.push(observation);
    }
}

/// A span being assembled.
#[derive(Debug)]
struct Building {
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    name: String,
    kind: span::SpanKind,
    start_unix_ns: u64,
    attributes: Vec<KeyValue>,
    links: Vec<span::Link>,
    events: Vec<span::Event>,
    /// For a chat span: its duration metric's series.
    duration_series: Option<Vec<(String, String)>>,
}

impl Building {
    fn new(
        session_id: SessionId,
        run_id: RunId,
        id: [u8; 8],
        name: String,
        kind: span::SpanKind,
        start_unix_ns: u64,
    ) -> Building {
        let mut building = Building {
            trace: run_id.0.as_bytes().to_vec(),
            id: id.to_vec(),
            parent: agent_span_id(run_id).to_vec(),
            name,
            kind,
            start_unix_ns,
            attributes: Vec::new(),
            links: Vec::new(),
            events: Vec::new(),
            duration_series: None,
        };
        building.attr("gen_ai.conversation.id", session_id.to_string());
        building.attr("keel.run.id", run_id.to_string());
        building
    }

    fn attr(&mut self, key: &str, value: impl Into<String>) {
        self.attributes.push(kv(key, value));
    }

    fn attr_int(&mut self, key: &str, value: u64) {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        self.attributes.push(KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }),
            ..Default::default()
        });
    }

    fn attr_strings(&mut self, key: &str, values: Vec<String>) {
        let values = values
            .into_iter()
            .map(|value| AnyValue { value: Some(any_value::Value::StringValue(value)) })
            .collect();
        self.attributes.push(KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue { values })),
            }),
            ..Default::default()
        });
    }

    /// The usage attributes of one response; reasoning tokens count as output, as the
    /// conventions ask (keel keeps them apart).
    fn usage(&mut self, usage: &Usage, estimated: bool) {
        if let Some(input) = usage.input_tokens {
            self.attr_int("gen_ai.usage.input_tokens", input);
        }
        if let Some(output) = output_tokens(usage) {
            self.attr_int("gen_ai.usage.output_tokens", output);
        }
        if let Some(cached) = usage.cached_input_tokens {
            self.attr_int("gen_ai.usage.cache_read.input_tokens", cached);
        }
        if let Some(reasoning) = usage.reasoning_tokens {
            self.attr_int("gen_ai.usage.reasoning.output_tokens", reasoning);
        }
        if estimated {
            self.attributes.push(KeyValue {
                key: "keel.usage.incomplete".into(),
                value: Some(AnyValue { value: Some(any_value::Value::BoolValue(true)) }),
                ..Default::default()
            });
        }
    }

    /// The metric series of a chat span (its operation, provider and model).
    fn series(&self) -> Vec<(String, String)> {
        self.duration_series.clone().unwrap_or_default()
    }

    fn finish(mut self, end: u64, status: Status) -> Span {
        self.attributes.sort_by(|a, b| a.key.cmp(&b.key));
        Span {
            trace_id: self.trace,
            span_id: self.id,
            parent_span_id: self.parent,
            name: self.name,
            kind: self.kind as i32,
            start_time_unix_nano: self.start_unix_ns,
            end_time_unix_nano: end.max(self.start_unix_ns),
            attributes: self.attributes,
            links: self.links,
            events: self.events,
            status: Some(status),
            ..Default::default()
        }
    }

    fn close_ok(self, end: u64) -> Span {
        self.finish(end, Status { code: status::StatusCode::Unset as i32, message: String::new() })
    }

    fn close_failed(mut self, end: u64, error: &str) -> Span {
        self.attr("error.type", error);
        let status = Status { code: status::StatusCode::Error as i32, message: error.to_owned() };
        self.finish(end, status)
    }
}

/// A chat span being assembled, with its duration observation attached on close.
struct ChatBuilding {
    inner: Building,
}

impl ChatBuilding {
    fn usage(&mut self, usage: &Usage, estimated: bool) {
        self.inner.usage(usage, estimated);
    }
    fn attr(&mut self, key: &str, value: impl Into<String>) {
        self.inner.attr(key, value);
    }
    fn attr_strings(&mut self, key: &str, values: Vec<String>) {
        self.inner.attr_strings(key, values);
    }
    fn series(&self) -> Vec<(String, String)> {
        self.inner.series()
    }
    fn observation(&self, end: u64, error: Option<&str>) -> Observation {
        let mut attributes = self.inner.series();
        if let Some(error) = error {
            attributes.push(("error.type".into(), error.into()));
        }
        attributes.sort();
        Observation {
            metric: MetricKind::OperationDuration,
            value: seconds(self.inner.start_unix_ns, end),
            attributes,
            start_unix_ns: self.inner.start_unix_ns,
            end_unix_ns: end,
        }
    }
    fn close_ok(self, end: u64) -> (Span, Observation) {
        let observation = self.observation(end, None);
        (self.inner.close_ok(end), observation)
    }
    fn close_failed(self, end: u64, error: &str) -> (Span, Observation) {
        let observation = self.observation(end, Some(error));
        (self.inner.close_failed(end, error), observation)
    }
}

fn chat_span(
    session_id: SessionId,
    run_id: RunId,
    run: &RunState,
    open: &OpenChat,
    spec_provider: &str,
    spec_model: &str,
) -> ChatBuilding {
    let provider = run.provider.clone().unwrap_or_else(|| spec_provider.into());
    let model = run.model.clone().unwrap_or_else(|| spec_model.into());
    let name = if model.is_empty() { "chat".to_owned() } else { format!("chat {model}") };
    let mut inner = Building::new(
        session_id,
        run_id,
        span_id(&["chat", &run_id.to_string(), &open.seq.0.to_string()]),
        name,
        span::SpanKind::Client,
        open.start_unix_ns,
    );
    inner.attr("gen_ai.operation.name", "chat");
    inner.attr("gen_ai.provider.name", provider.clone());
    inner.attr("gen_ai.request.model", model.clone());
    inner.attr_int("keel.model.step", u64::from(open.step));
    if !open.purpose.is_conversation() {
        inner.attr("keel.request.purpose", "compaction");
    }
    inner.duration_series = Some(vec![
        ("gen_ai.operation.name".into(), "chat".into()),
        ("gen_ai.provider.name".into(), provider),
        ("gen_ai.request.model".into(), model),
    ]);
    ChatBuilding { inner }
}

/// A terminal kind's outcome word, usage and answer.
fn terminal(kind: &EventKind) -> (&'static str, Option<&UsageTotals>, Option<&String>) {
    match kind {
        EventKind::RunCompleted { usage, answer, .. } => {
            ("completed", Some(usage), answer.as_ref())
        }
        EventKind::RunFailed { usage, answer, .. } => ("failed", Some(usage), answer.as_ref()),
        EventKind::RunSuspended { usage, answer, .. } => {
            ("suspended", Some(usage), answer.as_ref())
        }
        EventKind::RunCancelled { usage, answer, .. } => {
            ("cancelled", Some(usage), answer.as_ref())
        }
        EventKind::RunDenied { usage, answer, .. } => ("denied", Some(usage), answer.as_ref()),
        _ => ("failed", None, None),
    }
}

/// `gen_ai.usage.output_tokens`: keel's output plus reasoning tokens, when output is known.
fn output_tokens(usage: &Usage) -> Option<u64> {
    usage.output_tokens.map(|output| output + usage.reasoning_tokens.unwrap_or(0))
}

/// `openai:gpt-4o` → (`openai`, `gpt-4o`); a spec without a colon is all model.
fn split_spec(spec: &str) -> (&str, &str) {
    spec.split_once(':').unwrap_or(("", spec))
}

fn link(run_id: RunId, span: [u8; 8], kind: &str) -> span::Link {
    span::Link {
        trace_id: run_id.0.as_bytes().to_vec(),
        span_id: span.to_vec(),
        attributes: vec![kv("keel.link.type", kind)],
        ..Default::default()
    }
}

/// The `invoke_agent` span id of `run_id`.
pub(crate) fn agent_span_id(run_id: RunId) -> [u8; 8] {
    span_id(&["invoke_agent", &run_id.to_string()])
}

/// The first 8 bytes of SHA-256 over `parts` (each length-prefixed); never all zero.
pub(crate) fn span_id(parts: &[&str]) -> [u8; 8] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

pub(crate) fn kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }),
        ..Default::default()
    }
}

/// `ts` in Unix nanoseconds (0 before 1970 or past 2262).
pub(crate) fn nanos(ts: DateTime<Utc>) -> u64 {
    ts.timestamp_nanos_opt().and_then(|ns| u64::try_from(ns).ok()).unwrap_or(0)
}

fn seconds(start: u64, end: u64) -> f64 {
    end.saturating_sub(start) as f64 / 1e9
}

/// `text`, cut to [`CONTENT_CAP`] bytes on a char boundary.
fn cap(mut text: String) -> String {
    if text.len() > CONTENT_CAP {
        let mut end = CONTENT_CAP;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("…[truncated]");
    }
    text
}

/// `value` as JSON, or its capped text when the JSON is too long.
fn capped_json(value: &serde_json::Value) -> serde_json::Value {
    let text = value.to_string();
    if text.len() > CONTENT_CAP { serde_json::Value::String(cap(text)) } else { value.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_ids_are_stable_unambiguous_and_never_zero() {
        let run = RunId(uuid::Uuid::from_u128(7));
        assert_eq!(agent_span_id(run), agent_span_id(run));
        assert_ne!(span_id(&["ab", "c"]), span_id(&["a", "bc"]), "parts are length-prefixed");
        assert_ne!(
            span_id(&["chat", &run.to_string(), "5"]),
            span_id(&["chat", &run.to_string(), "6"])
        );
        assert_ne!(span_id(&[]), [0; 8]);
    }

    #[test]
    fn content_is_cut_on_a_char_boundary() {
        let text = "é".repeat(CONTENT_CAP);
        let cut = cap(text);
        assert!(cut.len() <= CONTENT_CAP + "…[truncated]".len());
        assert!(cut.ends_with("…[truncated]"));
        assert_eq!(cap("short".into()), "short");
    }
}
