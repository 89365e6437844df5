//! What the terminal shows: `--json` event lines on stdout, or a readable progress view
//! on stderr. `keel log` uses the same rendering, so a live run and its log read alike.

use std::io::Write;
use std::sync::Mutex;

use keel_contracts::{EventKind, RuntimeEvent, StreamDelta};
use keel_kernel::Observer;

/// Prints events as they become durable.
#[derive(Debug)]
pub(crate) struct Printer {
    json: bool,
    /// Whether streamed text was already shown for the current response.
    streamed_text: Mutex<bool>,
}

impl Printer {
    pub(crate) fn new(json: bool) -> Printer {
        Printer { json, streamed_text: Mutex::new(false) }
    }
}

impl Observer for Printer {
    fn on_event(&self, event: &RuntimeEvent) {
        if self.json {
            print_json(event);
            return;
        }
        let streamed =
            self.streamed_text.lock().map(|mut s| std::mem::take(&mut *s)).unwrap_or(false);
        let mut stderr = std::io::stderr().lock();
        if streamed && matches!(event.kind, EventKind::ModelResponse { .. }) {
            let _ = writeln!(stderr);
        }
        if let Some(line) = human_line(event, streamed) {
            let _ = writeln!(stderr, "{line}");
        }
    }

    fn on_delta(&self, delta: &StreamDelta) {
        if self.json {
            return;
        }
        if let StreamDelta::Text(text) = delta {
            if let Ok(mut streamed) = self.streamed_text.lock() {
                *streamed = true;
            }
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "{text}");
            let _ = stderr.flush();
        }
    }
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

fn clip(text: &str, max_chars: usize) -> String {
    // Look at no more than the prefix that can be shown: results may be megabytes.
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(max_chars).collect();
    let head = head.replace('\n', "⏎");
    if chars.next().is_some() { format!("{head}…") } else { head }
}

/// A readable line for an event; `text_shown` when the response text was streamed already.
pub(crate) fn human_line(event: &RuntimeEvent, text_shown: bool) -> Option<String> {
    let seq = event.seq.0;
    let line = match &event.kind {
        EventKind::SessionCreated { workspace, model, mode, .. } => {
            format!("#{seq} session {} · {workspace} · {model} · {mode:?}", event.session_id)
        }
        EventKind::SessionSealed { reason } => format!("#{seq} sealed: {reason}"),
        EventKind::TurnStarted { input } => format!("#{seq} turn: {}", clip(input, 200)),
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
            if !report.is_empty() {
                line.push_str(&format!("; report: {}", clip(report, 400)));
            }
            line
        }
        EventKind::BoundaryRevised { revision, boundary, justification } => format!(
            "#{seq} boundary widened (revision {revision}): read {:?}, write {:?}, network {} — {}",
            boundary.read,
            boundary.write,
            if boundary.network { "on" } else { "off" },
            clip(justification, 200)
        ),
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
