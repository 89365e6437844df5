//! The full trace (`keel run -v`, `keel log -v`): one readable line for every ledger event,
//! with its seq ([`human_line`]); and a time as keel's output writes it ([`to_the_second`]).
//! The terminal view shows these lines at `-v` in place of its own.

use chrono::{DateTime, Utc};
use keel_contracts::{EventKind, RuntimeEvent};

/// A time as people read it in keel's output: RFC 3339 in UTC, to the second
/// (`2026-03-01T10:05:00Z`); the ledger and `--json` keep the full precision.
pub(crate) fn to_the_second(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
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
            format!("#{seq} schedule {schedule_id} fired for {}", to_the_second(scheduled_at))
        }
        EventKind::WaitStarted { wake_id, event, deadline, .. } => format!(
            "#{seq} waiting for {} until {}: keel wake {wake_id} [PAYLOAD]",
            clip(event, 200),
            to_the_second(deadline)
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
