//! What a run prints: the terminal view ([`crate::view`]) on stderr, with a spinner while
//! the model or a tool runs when stderr is a terminal; or `--json` event lines on stdout;
//! and at the end the answer (or, for `--output-format json`, one result object) on stdout.
//! `keel log` renders with the same view, so a live run and its log read alike.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_contracts::{EventKind, RuntimeEvent, StreamDelta};
use keel_kernel::{Observer, RunReport, TurnOutcome};

use crate::args::OutputFormat;
use crate::terminal::{Paint, neutralize};
use crate::view::{LineKind, Verbosity, View, ViewOptions};

/// A time as people read it in keel's output: RFC 3339 in UTC, to the second
/// (`2026-03-01T10:05:00Z`); the ledger and `--json` keep the full precision.
pub(crate) fn to_the_second(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Whether keel may colour what it writes to a terminal (`NO_COLOR` turns it off).
pub(crate) fn paint_for(is_terminal: bool) -> Paint {
    Paint { enabled: is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) }
}

/// Prints events as they become durable.
#[derive(Debug)]
pub(crate) struct Printer {
    format: OutputFormat,
    options: ViewOptions,
    views: Mutex<Views>,
    /// The live status line; only when stderr is a terminal and progress is shown.
    spinner: Option<ProgressBar>,
}

/// One view per session: the run's own (the first session seen) and its sub-agents',
/// each a projection of its own ledger, so `keel log` of any of them reads the same.
#[derive(Debug, Default)]
struct Views {
    root: Option<keel_contracts::SessionId>,
    by_session: std::collections::BTreeMap<keel_contracts::SessionId, View>,
}

impl Printer {
    pub(crate) fn new(format: OutputFormat, verbosity: Verbosity) -> Printer {
        let terminal = std::io::stderr().is_terminal();
        let options = ViewOptions { verbosity, paint: paint_for(terminal) };
        let spinner = (terminal && format == OutputFormat::Text && verbosity != Verbosity::Quiet)
            .then(new_spinner)
            .flatten();
        Printer { format, options, views: Mutex::new(Views::default()), spinner }
    }

    /// Shows a continued session's `session_created` as a new session's run shows it: the
    /// header line (`keel session ID · MODEL · WORKSPACE`) before the run's own lines.
    pub(crate) fn header(&self, created: &RuntimeEvent) {
        if self.format == OutputFormat::Text
            && matches!(created.kind, EventKind::SessionCreated { .. })
        {
            self.show(created);
        }
    }

    fn show(&self, event: &RuntimeEvent) {
        let Ok(mut views) = self.views.lock() else { return };
        let root = *views.root.get_or_insert(event.session_id);
        let is_root = event.session_id == root;
        let view =
            views.by_session.entry(event.session_id).or_insert_with(|| View::new(self.options));
        let lines = view.lines(event);
        let spinner = self.spinner.as_ref().filter(|s| !s.is_finished());
        for line in lines {
            let text = match (line.kind, is_root) {
                // The run's answer is printed once, on stdout, when the run ends.
                (LineKind::Answer, true) => continue,
                (LineKind::Progress, true) => line.text,
                // A sub-agent's lines, its answer included, sit under the call that
                // started it.
                (LineKind::Progress | LineKind::Answer, false) => {
                    line.text.lines().map(|l| format!("    ┊ {l}")).collect::<Vec<_>>().join("\n")
                }
            };
            match spinner {
                Some(spinner) => spinner.println(&text),
                None => {
                    let _ = writeln!(std::io::stderr().lock(), "{text}");
                }
            }
        }
        if !is_root && event.kind.is_run_terminal() {
            // The parent goes on; its status line stays.
            return;
        }
        let Some(spinner) = spinner else { return };
        match view.status() {
            Some(status) if spinner.message() != status => {
                spinner.reset_elapsed();
                spinner.set_message(status);
            }
            Some(_) => {}
            None if event.kind.is_run_terminal() => spinner.finish_and_clear(),
            None => {}
        }
        match &event.kind {
            // The prompt owns the terminal until it is answered: the status line is left
            // saying what waits, and is not redrawn over the question.
            EventKind::PermissionRequested { .. } | EventKind::ElicitationRequested { .. } => {
                spinner.tick();
                spinner.set_draw_target(ProgressDrawTarget::hidden());
            }
            EventKind::PermissionSettled { .. } | EventKind::ElicitationAnswered { .. } => {
                spinner.set_draw_target(ProgressDrawTarget::stderr());
            }
            _ => {}
        }
    }
}

fn new_spinner() -> Option<ProgressBar> {
    let style = ProgressStyle::with_template("{spinner} {msg} · {elapsed}").ok()?;
    let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    spinner.set_style(style.tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ "));
    spinner.set_message("starting");
    spinner.enable_steady_tick(Duration::from_millis(120));
    Some(spinner)
}

impl Drop for Printer {
    fn drop(&mut self) {
        if let Some(spinner) = &self.spinner {
            spinner.finish_and_clear();
        }
    }
}

impl Observer for Printer {
    fn on_event(&self, event: &RuntimeEvent) {
        match self.format {
            OutputFormat::StreamJson => print_json(event),
            OutputFormat::Json => {}
            OutputFormat::Text => self.show(event),
        }
    }

    fn on_delta(&self, delta: &StreamDelta) {
        // Streamed text is not echoed: the answer is printed once, on stdout, at the end,
        // and text between tool calls is part of the view. The spinner shows progress.
        if let (StreamDelta::Text(_), Some(spinner)) = (delta, &self.spinner) {
            spinner.tick();
        }
    }
}

/// Prints how the run ended and returns its exit status: the answer on stdout (text), or
/// one JSON object (`--output-format json`); reasons on stderr. `started_at` is when the
/// command began, for `duration_ms`.
///
/// When the view was shown (`view_shown`), its closing line already said how the run
/// ended, so only what to do next is added. With an output schema (`structured`), the JSON
/// object also carries the answer parsed, as `structured_output`.
pub(crate) fn finish(
    report: &RunReport,
    format: OutputFormat,
    view_shown: bool,
    started_at: DateTime<Utc>,
    structured: bool,
) -> u8 {
    use crate::app::exit;
    let (status, result, reason) = match &report.outcome {
        TurnOutcome::Completed { text } => (exit::COMPLETED, text.as_str(), None),
        TurnOutcome::Failed { reason } => (exit::FAILED, "", Some(reason.as_str())),
        TurnOutcome::Suspended { reason, report: text } => {
            (exit::SUSPENDED, text.as_str(), Some(reason.as_str()))
        }
        TurnOutcome::Cancelled { reason } => (exit::CANCELLED, "", Some(reason.as_str())),
        TurnOutcome::Denied { reason } => (exit::DENIED, "", Some(reason.as_str())),
    };
    let outcome = match &report.outcome {
        TurnOutcome::Completed { .. } => "completed",
        TurnOutcome::Failed { .. } => "failed",
        TurnOutcome::Suspended { .. } => "suspended",
        TurnOutcome::Cancelled { .. } => "cancelled",
        TurnOutcome::Denied { .. } => "denied",
    };
    match format {
        OutputFormat::Json => {
            let duration_ms = (keel_contracts::Clock::now(&keel_contracts::SystemClock)
                - started_at)
                .num_milliseconds()
                .max(0);
            let object = serde_json::json!({
                "result": result,
                "session_id": report.session_id,
                "exit": status,
                "outcome": outcome,
                "reason": reason,
                "usage": {
                    "input_tokens": report.usage.input_tokens,
                    "output_tokens": report.usage.output_tokens,
                    "cached_input_tokens": report.usage.cached_input_tokens,
                    "reasoning_tokens": report.usage.reasoning_tokens,
                    "responses": report.usage.responses,
                },
                "cost_usd": report.usage.cost_usd,
                "duration_ms": duration_ms,
            });
            let mut object = object;
            if structured && let TurnOutcome::Completed { text } = &report.outcome {
                object["structured_output"] =
                    serde_json::from_str(text).unwrap_or(serde_json::Value::Null);
            }
            outln!("{object}");
            return status;
        }
        OutputFormat::Text if !result.is_empty() => {
            // At a terminal the answer is neutralised like everything else shown there;
            // piped, it is the model's text exactly.
            if std::io::stdout().is_terminal() {
                outln!("{}", neutralize(result));
            } else {
                outln!("{result}");
            }
        }
        OutputFormat::Text | OutputFormat::StreamJson => {}
    }
    let reason = reason.map(crate::view::short_reason).unwrap_or_default();
    match &report.outcome {
        TurnOutcome::Completed { .. } => {}
        TurnOutcome::Failed { .. } if !view_shown => eprintln!("keel: run failed: {reason}"),
        TurnOutcome::Suspended { reason: why, .. } if why == keel_kernel::WAITING_REASON => {
            // Only its wake resumes a waiting run; `keel resume` refuses it.
            eprintln!(
                "keel: run waiting on `wait`; `keel wake WAKE_ID [PAYLOAD]` resumes it (the wake \
                 id is in `keel log {}`)",
                report.session_id
            );
        }
        TurnOutcome::Suspended { .. } => {
            if !view_shown {
                eprintln!("keel: run suspended ({reason}); a checkpoint was recorded");
            }
            eprintln!("keel: continue with `keel resume {}`", report.session_id);
        }
        TurnOutcome::Cancelled { .. } if !view_shown => {
            eprintln!("keel: run cancelled: {reason}");
        }
        TurnOutcome::Denied { .. } if !view_shown => {
            eprintln!("keel: run denied: {reason}; the turn ended without a wider retry");
        }
        TurnOutcome::Failed { .. } | TurnOutcome::Cancelled { .. } | TurnOutcome::Denied { .. } => {
        }
    }
    status
}

/// One event as one JSON line on stdout (the format of DESIGN.md §9).
pub(crate) fn print_json(event: &RuntimeEvent) {
    let mut stdout = std::io::stdout().lock();
    match serde_json::to_string(event) {
        Ok(line) => {
            let _ = writeln!(stdout, "{line}");
        }
        Err(error) => {
            let _ =
                writeln!(std::io::stderr(), "keel: cannot serialize event {}: {error}", event.seq);
        }
    }
    let _ = stdout.flush();
}

/// One line of at most `max_chars` characters, neutralised (see [`crate::terminal`]).
fn clip(text: &str, max_chars: usize) -> String {
    crate::terminal::one_line(text, max_chars)
}

/// The full trace (`-v`): a readable line for every event; `text_shown` when the
/// response's text is shown elsewhere (the answer). Text from outside keel is clipped and
/// neutralised; callers neutralise the whole line again.
pub(crate) fn human_line(event: &RuntimeEvent, text_shown: bool) -> Option<String> {
    let seq = event.seq.0;
    let line = match &event.kind {
        EventKind::SessionCreated { workspace, model, mode, .. } => {
            format!("#{seq} session {} · {workspace} · {model} · {mode:?}", event.session_id)
        }
        EventKind::SessionSealed { reason } => format!("#{seq} sealed: {reason}"),
        EventKind::TurnStarted { input } => format!("#{seq} turn: {}", clip(input, 200)),
        EventKind::PlanApproved { by } => format!("#{seq} plan approved by {by}"),
        EventKind::InputJoined { input } => format!("#{seq} input joined: {}", clip(input, 200)),
        EventKind::RunStarted { mode, sandbox, approval, budget, .. } => {
            let mut ceiling = String::new();
            if let Some(n) = budget.max_steps {
                ceiling.push_str(&format!(" · max {n} steps"));
            }
            if let Some(n) = budget.max_tokens {
                ceiling.push_str(&format!(" · max {n} tokens"));
            }
            if let Some(usd) = budget.max_cost_usd {
                ceiling.push_str(&format!(" · max ${usd}"));
            }
            if let Some(time) = budget.max_time {
                ceiling.push_str(&format!(" · max {} ms", time.as_millis()));
            }
            if *sandbox == keel_contracts::SandboxMode::Bypass {
                ceiling.push_str(" · SANDBOX BYPASSED");
            }
            format!(
                "#{seq} run {} · mode {} · sandbox {} · approval {}{ceiling}",
                event.run_id.map(|r| r.to_string()).unwrap_or_default(),
                serde_plain(mode),
                serde_plain(sandbox),
                serde_plain(approval),
            )
        }
        EventKind::RunComposition { provider, model, tools, .. } => {
            format!("#{seq} composition: {provider}:{model}, {} tools", tools.len())
        }
        EventKind::ModelRequested {
            step,
            messages,
            tokens,
            tokens_before_pruning,
            pruned_results,
            ..
        } => {
            let mut line = format!("#{seq} step {step}: request with {messages} messages");
            if let Some(tokens) = tokens {
                line.push_str(&format!(", ~{tokens} tokens"));
            }
            if let Some(before) = tokens_before_pruning {
                line.push_str(&format!(
                    " (pruned {pruned_results} results: ~{before} → ~{} tokens)",
                    tokens.unwrap_or(0)
                ));
            }
            line
        }
        EventKind::Compaction {
            covers_from,
            covers_to,
            tokens_before,
            tokens_after,
            carried,
            ..
        } => format!(
            "#{seq} compaction of #{covers_from}–#{covers_to}: ~{tokens_before} → ~{tokens_after} tokens; \
             carried {} inputs, {} files",
            carried.inputs.len(),
            carried.files.len()
        ),
        EventKind::ModelRetry { step, attempt, status, error, message, wait_ms, purpose } => {
            let status = status.map(|s| format!("HTTP {s}, ")).unwrap_or_default();
            let call = if purpose.is_conversation() { "" } else { " (compaction summary)" };
            format!(
                "#{seq} step {step}: retry, attempt {attempt} after {status}{error}: {}; \
                 waiting {wait_ms} ms{call}",
                crate::terminal::one_line(message, 160)
            )
        }
        EventKind::CompactionFailed { reason, attempts } => {
            format!("#{seq} compaction failed after {attempts} attempts: {reason}; not compacted")
        }
        EventKind::ModelResponse { text, tool_calls, usage, finish_reason, .. } => {
            let mut line = format!("#{seq} model ({finish_reason}");
            if let (Some(input), Some(output)) = (usage.input_tokens, usage.output_tokens) {
                line.push_str(&format!(", {input} in / {output} out tokens"));
            }
            line.push(')');
            if !text.is_empty() && !text_shown {
                line.push_str(&format!(": {}", clip(text, 400)));
            }
            for call in tool_calls {
                line.push_str(&format!(
                    "\n#{seq}   call {} {} {}",
                    call.call_id,
                    call.name,
                    clip(&call.arguments.to_string(), 200)
                ));
            }
            line
        }
        EventKind::BudgetExhausted { reason, report_requested } => {
            let next = if *report_requested { "; last step, tools off, for a report" } else { "" };
            format!("#{seq} {reason}{next}")
        }
        EventKind::Checkpoint { reason, report, evidence, .. } => {
            let mut line = format!(
                "#{seq} checkpoint ({reason}): {} tool results as evidence",
                evidence.len()
            );
            if !report.is_empty() && !text_shown {
                line.push_str(&format!("; report: {}", clip(report, 400)));
            }
            line
        }
        EventKind::ScheduleFired { schedule_id, scheduled_at } => {
            format!(
                "#{seq} schedule {schedule_id} fired for {}",
                crate::output::to_the_second(scheduled_at)
            )
        }
        EventKind::WaitStarted { wake_id, event, deadline, .. } => format!(
            "#{seq} waiting for {} until {}: keel wake {wake_id} [PAYLOAD]",
            clip(event, 200),
            crate::output::to_the_second(deadline)
        ),
        EventKind::BoundaryRevised { revision, boundary, justification } => format!(
            "#{seq} boundary widened (revision {revision}): read {:?}, write {:?}, network {} — {}",
            boundary.read,
            boundary.write,
            if boundary.network { "on" } else { "off" },
            clip(justification, 200)
        ),
        EventKind::SkillCatalog { shown, omitted, budget_tokens, diagnostics } => {
            let mut line =
                format!("#{seq} skills: {} in the catalog ({budget_tokens} tokens)", shown.len());
            if !omitted.is_empty() {
                line.push_str(&format!("; left out for room: {}", clip(&omitted.join(", "), 400)));
            }
            for diagnostic in diagnostics {
                line.push_str(&format!("\n#{seq}   skipped {}", clip(diagnostic, 400)));
            }
            line
        }
        EventKind::SkillActivated { call_id, name, location, .. } => {
            format!("#{seq}   skill {call_id}: activated {name} ({})", clip(location, 200))
        }
        EventKind::GateDecision { call_id, decision, reason, .. } => {
            format!("#{seq}   gate {call_id}: {} ({reason})", serde_plain(decision))
        }
        EventKind::PermissionRequested { call_id, tool, access, .. } => {
            format!("#{seq}   permission asked {call_id}: {tool} ({})", access.as_str())
        }
        EventKind::PermissionSettled { call_id, answer, by, expires_at, .. } => {
            let until = expires_at.map(|at| format!(" until {at}")).unwrap_or_default();
            format!("#{seq}   permission {call_id}: {} by {by}{until}", serde_plain(answer))
        }
        EventKind::ElicitationRequested { question, server, schema, .. } => {
            let fields = schema["properties"]
                .as_object()
                .map(|fields| fields.keys().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            format!(
                "#{seq}   question {question} from MCP server {}: fields {}",
                clip(server, 80),
                clip(&fields, 200)
            )
        }
        // The answer's values stay in the ledger: the log names the fields only.
        EventKind::ElicitationAnswered { question, action, content, by, reason, .. } => {
            let fields = content
                .as_ref()
                .and_then(|content| content.as_object())
                .map(|fields| fields.keys().cloned().collect::<Vec<_>>().join(", "))
                .map(|fields| format!(" (fields {})", clip(&fields, 200)))
                .unwrap_or_default();
            let why =
                reason.as_deref().map(|why| format!(": {}", clip(why, 200))).unwrap_or_default();
            format!("#{seq}   answer {question}: {} by {by}{fields}{why}", action.as_str())
        }
        EventKind::ToolsChanged { added, removed, .. } => format!(
            "#{seq} tools changed: added {} · removed {}",
            clip(&added.join(", "), 300),
            clip(&removed.join(", "), 300)
        ),
        EventKind::ToolCall { parent_call_id, call_id, tool, arguments } => format!(
            "#{seq}   call {call_id} {tool} {} (from {parent_call_id})",
            clip(&arguments.to_string(), 200)
        ),
        EventKind::ToolAttemptPrepared { call_id, tool, .. } => {
            format!("#{seq}   run {call_id}: {tool}")
        }
        EventKind::ToolResult { call_id, outcome, content, bytes, .. } => {
            format!(
                "#{seq}   result {call_id}: {} {bytes}B {}",
                outcome.as_str(),
                clip(content, 160)
            )
        }
        EventKind::ShadowIntent { call_id, tool, arguments } => {
            format!(
                "#{seq}   shadow intent {call_id}: {tool} {}",
                clip(&arguments.to_string(), 200)
            )
        }
        EventKind::RunCompleted { reason, usage, .. }
        | EventKind::RunFailed { reason, usage, .. }
        | EventKind::RunSuspended { reason, usage, .. }
        | EventKind::RunCancelled { reason, usage, .. }
        | EventKind::RunDenied { reason, usage, .. } => format!(
            "#{seq} {}: {reason} · {} in / {} out tokens over {} responses · cost {}",
            event.kind.name(),
            usage.input_tokens,
            usage.output_tokens,
            usage.responses,
            usage.cost_usd.map_or_else(|| "unknown".to_owned(), |usd| format!("${usd:.6}")),
        ),
    };
    Some(line)
}

fn serde_plain<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}
