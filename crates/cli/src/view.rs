//! The terminal view of a run: one pure projection from ledger events to lines
//! (HOUSE-STYLE §3, "a surface is a projection"), used by the live run and by `keel log`
//! alike, so both read the same.
//!
//! [`View::lines`] folds events in ledger order; what it remembers (a call's arguments
//! until its result, when an attempt started, the usage so far) is derived from earlier
//! events of the same ledger and nothing else, so feeding a session's events to a fresh
//! view gives exactly the lines the live run showed. Every piece of text from outside
//! keel (model text, arguments, file names, tool output) goes through
//! [`crate::terminal`] before it is part of a line.
//!
//! At the default verbosity a run reads as one line per tool call (tool, a short summary
//! of its arguments, outcome, duration), edits as a unified diff, the tail of a failing
//! command, the model's text between calls, and a closing line with tokens, cost and
//! time; `-v` shows every event (the full trace), `-q` only the answer.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use keel_contracts::{
    Decision, EventKind, Outcome, PermissionAnswer, RequestPurpose, RuntimeEvent, SandboxMode,
    UsageTotals,
};

use crate::terminal::{Paint, block, neutralize, one_line};

/// How much the view shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verbosity {
    /// The answer only (`-q`).
    Quiet,
    /// One line per tool call, diffs, failing tails, a summary (the default).
    Normal,
    /// Every event, one line each (`-v`).
    Verbose,
}

/// How the view renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ViewOptions {
    pub(crate) verbosity: Verbosity,
    /// keel's colours (only when the output is a terminal).
    pub(crate) paint: Paint,
}

/// What a line is for: progress goes to stderr in a live run; the answer is printed once,
/// on stdout, by the run itself, so a live run skips it and `keel log` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LineKind {
    Progress,
    Answer,
}

/// One line of the view (it holds no newline unless it is the answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) kind: LineKind,
    pub(crate) text: String,
}

/// What the view remembers about a call until its result.
#[derive(Debug, Clone, Default)]
struct PendingCall {
    tool: String,
    arguments: serde_json::Value,
    started_at: Option<DateTime<Utc>>,
    /// Why it was withheld (a gate's reason, or who denied the permission).
    refused_by: Option<String>,
}

/// The fold from ledger events to lines. See the module doc.
#[derive(Debug)]
pub(crate) struct View {
    options: ViewOptions,
    calls: BTreeMap<String, PendingCall>,
    run_started_at: Option<DateTime<Utc>>,
    usage: UsageTotals,
    /// What is happening now, for a live spinner: set by a request or an attempt.
    activity: Option<String>,
}

/// Lines of an edit's diff shown at most.
const MAX_DIFF_LINES: usize = 40;
/// Lines of a failing command's output shown (its tail).
const FAILING_TAIL_LINES: usize = 8;
/// Characters of a line of tool output or diff shown.
const MAX_LINE_CHARS: usize = 200;
/// Characters of an argument summary.
const MAX_SUMMARY_CHARS: usize = 80;

impl View {
    pub(crate) fn new(options: ViewOptions) -> View {
        View {
            options,
            calls: BTreeMap::new(),
            run_started_at: None,
            usage: UsageTotals::default(),
            activity: None,
        }
    }

    /// The lines `event` adds, in order.
    pub(crate) fn lines(&mut self, event: &RuntimeEvent) -> Vec<Line> {
        let mut out = Vec::new();
        let answer = self.fold(event, &mut out);
        match self.options.verbosity {
            Verbosity::Quiet => out.clear(),
            Verbosity::Normal => {}
            Verbosity::Verbose => {
                out.clear();
                if let Some(line) = crate::trace::human_line(event, answer.is_some())
                    .map(|l| neutralize(&l).into_owned())
                {
                    out.push(progress(line));
                }
            }
        }
        if let Some(text) = answer {
            out.push(Line { kind: LineKind::Answer, text: neutralize(&text).into_owned() });
        }
        out
    }

    /// What is running now, with the tokens and cost so far (for a live spinner); `None`
    /// between runs.
    pub(crate) fn status(&self) -> Option<String> {
        let activity = self.activity.as_ref()?;
        let tokens =
            self.usage.input_tokens + self.usage.output_tokens + self.usage.reasoning_tokens;
        let mut status = activity.clone();
        if tokens > 0 {
            status.push_str(&format!(" · {} tokens", thousands(tokens)));
            if let Some(usd) = self.usage.cost_usd {
                status.push_str(&format!(" · ${usd:.4}"));
            }
        }
        Some(status)
    }

    /// Updates the state and pushes the default view's lines; returns the answer text when
    /// `event` carries the run's answer.
    fn fold(&mut self, event: &RuntimeEvent, out: &mut Vec<Line>) -> Option<String> {
        let paint = self.options.paint;
        match &event.kind {
            EventKind::SessionCreated { workspace, model, lineage, .. } => {
                let child = if lineage.is_some() { " (sub-agent)" } else { "" };
                out.push(progress(format!(
                    "{} session {}{child} · {} · {}",
                    paint.bold("keel"),
                    event.session_id,
                    one_line(model, 120),
                    one_line(workspace, 200)
                )));
            }
            EventKind::SessionSealed { reason } => {
                out.push(progress(format!("sealed: {}", one_line(reason, 200))));
            }
            EventKind::TurnStarted { input } => {
                out.push(progress(format!("{} {}", paint.cyan("▸"), one_line(input, 160))));
            }
            EventKind::PlanApproved { by } => {
                out.push(progress(format!("plan approved by {}", one_line(by, 80))));
            }
            EventKind::InputJoined { input } => {
                out.push(progress(format!("{} joined: {}", paint.cyan("▸"), one_line(input, 160))));
            }
            EventKind::RunStarted { sandbox, approval, budget, resumes, .. } => {
                self.run_started_at = Some(event.ts);
                self.usage = UsageTotals::default();
                let mut line = format!(
                    "  {}sandbox {} · approval {}",
                    if resumes.is_some() { "resumed · " } else { "" },
                    serde_plain(sandbox),
                    serde_plain(approval)
                );
                if let Some(n) = budget.max_steps {
                    line.push_str(&format!(" · max {n} steps"));
                }
                if let Some(n) = budget.max_tokens {
                    line.push_str(&format!(" · max {} tokens", thousands(n)));
                }
                if let Some(usd) = budget.max_cost_usd {
                    line.push_str(&format!(" · max ${usd}"));
                }
                if let Some(time) = budget.max_time {
                    line.push_str(&format!(" · max {}", duration_text(time.as_millis())));
                }
                if *sandbox == SandboxMode::Bypass {
                    line.push_str(&format!(" · {}", paint.yellow("SANDBOX BYPASSED")));
                }
                out.push(progress(paint.dim(&line)));
                self.activity = Some("starting".to_owned());
            }
            EventKind::RunComposition { .. } => {}
            EventKind::ModelRequested { step, purpose, .. } => {
                self.activity = Some(if purpose.is_conversation() {
                    format!("thinking (step {step})")
                } else {
                    "summarising earlier conversation for compaction".to_owned()
                });
            }
            // A failed attempt the provider client retries. The live view never echoes
            // streamed text (the answer is printed once, from the final `model_response`),
            // so nothing the failed attempt streamed is shown twice; the line says why the
            // wait happens.
            EventKind::ModelRetry { attempt, status, error, wait_ms, purpose, .. } => {
                let cause = match status {
                    Some(status) => status.to_string(),
                    None => one_line(error, 40),
                };
                let call = if purpose.is_conversation() { "" } else { " (compaction summary)" };
                out.push(progress(format!(
                    "  {} retry {attempt} after {cause}, waiting {}{call}",
                    paint.yellow("↻"),
                    wait_text(*wait_ms)
                )));
                self.activity = Some(format!("retrying (attempt {attempt}) after {cause}"));
            }
            // keel's own call: a summary for compaction, charged like any call, never an answer.
            EventKind::ModelResponse {
                text,
                usage,
                estimated_usage,
                cost_usd,
                purpose: RequestPurpose::Compaction,
                ..
            } => {
                self.usage.add(usage, estimated_usage.as_ref(), *cost_usd);
                let mut charged = UsageTotals::default();
                charged.add(usage, estimated_usage.as_ref(), *cost_usd);
                out.push(progress(paint.dim(&format!(
                    "  compaction summary written ({} chars · {})",
                    thousands(text.chars().count() as u64),
                    usage_text(&charged)
                ))));
            }
            EventKind::Compaction { tokens_before, tokens_after, .. } => {
                out.push(progress(paint.dim(&format!(
                    "  context compacted: ~{} → ~{} tokens",
                    thousands(*tokens_before),
                    thousands(*tokens_after)
                ))));
            }
            EventKind::CompactionFailed { reason, .. } => {
                out.push(progress(format!(
                    "  {} compaction failed: {}",
                    paint.yellow("!"),
                    one_line(reason, 200)
                )));
            }
            EventKind::ModelResponse {
                text,
                tool_calls,
                usage,
                estimated_usage,
                cost_usd,
                purpose: RequestPurpose::Conversation,
                ..
            } => {
                self.usage.add(usage, estimated_usage.as_ref(), *cost_usd);
                for call in tool_calls {
                    self.calls.insert(
                        call.call_id.0.clone(),
                        PendingCall {
                            tool: call.name.clone(),
                            arguments: call.arguments.clone(),
                            ..PendingCall::default()
                        },
                    );
                }
                if tool_calls.is_empty() {
                    self.activity = Some("answering".to_owned());
                    if !text.is_empty() {
                        return Some(text.clone());
                    }
                } else if !text.trim().is_empty() {
                    for line in block(text.trim(), 6, MAX_LINE_CHARS, false) {
                        out.push(progress(paint.dim(&format!("  {line}"))));
                    }
                }
            }
            EventKind::BudgetExhausted { reason, report_requested } => {
                let next = if *report_requested { "; one last step for a report" } else { "" };
                out.push(progress(format!(
                    "  {} {}{next}",
                    paint.yellow("!"),
                    one_line(reason, 200)
                )));
            }
            EventKind::Checkpoint { reason, report, .. } => {
                out.push(progress(
                    paint.dim(&format!("  checkpoint recorded ({})", one_line(reason, 120))),
                ));
                if !report.is_empty() {
                    return Some(report.clone());
                }
            }
            EventKind::GateDecision { call_id, decision, reason, .. } => match decision {
                Decision::Refuse => {
                    if let Some(call) = self.calls.get_mut(&call_id.0) {
                        call.refused_by = Some(reason.clone());
                    }
                }
                Decision::Allow | Decision::Ask | Decision::Shadow => {}
            },
            EventKind::PermissionRequested { call_id, .. } => {
                if let Some(call) = self.calls.get(&call_id.0) {
                    self.activity = Some(format!("waiting for an answer: {}", call.tool));
                }
            }
            EventKind::PermissionSettled { call_id, answer, by, .. } => match answer {
                PermissionAnswer::Deny => {
                    if let Some(call) = self.calls.get_mut(&call_id.0) {
                        call.refused_by = Some(by.clone());
                    }
                }
                PermissionAnswer::AllowOnce
                | PermissionAnswer::AllowSession
                | PermissionAnswer::AllowExact => {}
            },
            EventKind::ToolsChanged { added, removed, .. } => {
                let mut parts = Vec::new();
                if !added.is_empty() {
                    parts.push(format!("added {}", one_line(&added.join(", "), 200)));
                }
                if !removed.is_empty() {
                    parts.push(format!("removed {}", one_line(&removed.join(", "), 200)));
                }
                out.push(progress(paint.dim(&format!("  tools changed: {}", parts.join("; ")))));
            }
            EventKind::ElicitationRequested { server, .. } => {
                self.activity =
                    Some(format!("waiting for an answer to MCP server {}", one_line(server, 60)));
            }
            EventKind::ElicitationAnswered { action, by, reason, .. } => {
                self.activity = None;
                let why = reason.as_deref().map(|why| format!(": {}", one_line(why, 160)));
                out.push(progress(paint.dim(&format!(
                    "  question {} by {}{}",
                    match action {
                        keel_contracts::ElicitationAction::Accept => "answered",
                        keel_contracts::ElicitationAction::Decline => "declined",
                        keel_contracts::ElicitationAction::Cancel => "cancelled",
                    },
                    one_line(by, 60),
                    why.unwrap_or_default()
                ))));
            }
            EventKind::ScheduleFired { schedule_id, scheduled_at } => {
                out.push(progress(format!(
                    "  schedule {schedule_id} fired for {}",
                    crate::trace::to_the_second(scheduled_at)
                )));
            }
            EventKind::WaitStarted { wake_id, event, deadline, .. } => {
                out.push(progress(format!(
                    "  {} waiting for {} until {} — keel wake {wake_id} [PAYLOAD]",
                    paint.yellow("…"),
                    one_line(event, 160),
                    crate::trace::to_the_second(deadline)
                )));
            }
            EventKind::BoundaryRevised { boundary, justification, .. } => {
                let mut room = Vec::new();
                if !boundary.read.is_empty() {
                    room.push(format!("read {}", one_line(&boundary.read.join(", "), 200)));
                }
                if !boundary.write.is_empty() {
                    room.push(format!("write {}", one_line(&boundary.write.join(", "), 200)));
                }
                if boundary.network {
                    room.push("network".to_owned());
                }
                out.push(progress(format!(
                    "  {} boundary widened: {} — {}",
                    paint.yellow("⚠"),
                    room.join(" · "),
                    one_line(justification, 160)
                )));
            }
            // A program's call (Code Mode) shows like the model's own, under its id.
            EventKind::ToolCall { call_id, tool, arguments, .. } => {
                self.calls.insert(
                    call_id.0.clone(),
                    PendingCall {
                        tool: tool.clone(),
                        arguments: arguments.clone(),
                        ..PendingCall::default()
                    },
                );
            }
            EventKind::ToolAttemptPrepared { call_id, tool, .. } => {
                let call = self.calls.entry(call_id.0.clone()).or_default();
                call.started_at = Some(event.ts);
                if call.tool.is_empty() {
                    call.tool.clone_from(tool);
                }
                self.activity =
                    Some(format!("{} {}", one_line(tool, 40), summary(tool, &call.arguments)));
            }
            EventKind::ToolResult { call_id, tool, outcome, content, .. } => {
                let call = self.calls.remove(&call_id.0).unwrap_or_default();
                let duration = call
                    .started_at
                    .and_then(|start| (event.ts - start).to_std().ok())
                    .map(|elapsed| duration_text(elapsed.as_millis()));
                self.tool_lines(tool, &call, *outcome, content, duration, out);
                self.activity = Some("thinking".to_owned());
            }
            EventKind::ShadowIntent { .. } | EventKind::SkillActivated { .. } => {}
            EventKind::SkillCatalog { omitted, diagnostics, .. } => {
                if !omitted.is_empty() {
                    out.push(progress(format!(
                        "  {} skills catalog: {} left out for room ({})",
                        paint.yellow("⚠"),
                        omitted.len(),
                        one_line(&omitted.join(", "), 200)
                    )));
                }
                if !diagnostics.is_empty() {
                    out.push(progress(format!(
                        "  {} {} skill(s) skipped (see `keel log`)",
                        paint.yellow("⚠"),
                        diagnostics.len()
                    )));
                }
            }
            EventKind::RunCompleted { usage, .. } => {
                self.run_end(event, paint.green("✓"), "completed".to_owned(), usage, out);
            }
            EventKind::RunFailed { reason, usage, .. } => {
                let what = format!("failed: {}", short_reason(reason));
                self.run_end(event, paint.red("✗"), what, usage, out);
            }
            EventKind::RunSuspended { reason, usage, .. } => {
                let what = format!("suspended: {}", short_reason(reason));
                self.run_end(event, paint.yellow("‖"), what, usage, out);
            }
            EventKind::RunCancelled { reason, usage, .. } => {
                let what = format!("cancelled: {}", short_reason(reason));
                self.run_end(event, paint.yellow("⊘"), what, usage, out);
            }
            EventKind::RunDenied { reason, usage, .. } => {
                let what = format!("denied: {}", short_reason(reason));
                self.run_end(event, paint.red("✗"), what, usage, out);
            }
        }
        None
    }

    /// The closing line of a run: how it ended, tokens, steps, cost and time.
    fn run_end(
        &mut self,
        event: &RuntimeEvent,
        mark: String,
        what: String,
        usage: &UsageTotals,
        out: &mut Vec<Line>,
    ) {
        let elapsed = self
            .run_started_at
            .and_then(|start| (event.ts - start).to_std().ok())
            .map(|elapsed| format!(" · {}", duration_text(elapsed.as_millis())))
            .unwrap_or_default();
        let cost =
            usage.cost_usd.map_or_else(|| "cost unknown".to_owned(), |usd| format!("${usd:.4}"));
        out.push(progress(format!("{mark} {what} · {} · {cost}{elapsed}", usage_text(usage))));
        self.activity = None;
        self.calls.clear();
    }

    /// The line of one finished call, and the diff or output tail under it.
    fn tool_lines(
        &self,
        tool: &str,
        call: &PendingCall,
        outcome: Outcome,
        content: &str,
        duration: Option<String>,
        out: &mut Vec<Line>,
    ) {
        let paint = self.options.paint;
        let name = one_line(tool, 40);
        let summary = summary(tool, &call.arguments);
        let timing = duration.map(|d| format!(" · {d}")).unwrap_or_default();
        let failed_exit =
            (tool == "bash" && outcome == Outcome::Ok).then(|| command_failure(content)).flatten();
        let (mark, result) = match outcome {
            Outcome::Ok => match &failed_exit {
                Some(status) => (paint.red("✗"), paint.red(status)),
                None => (paint.green("✓"), "ok".to_owned()),
            },
            Outcome::Error => (paint.red("✗"), paint.red("error")),
            Outcome::Refused => {
                let why = match call.refused_by.as_deref() {
                    Some("user") => "denied at the prompt".to_owned(),
                    Some(by) => one_line(by.strip_prefix("refused: ").unwrap_or(by), 160),
                    None => one_line(content.strip_prefix("refused: ").unwrap_or(content), 120),
                };
                (paint.red("✗"), paint.red(&format!("refused: {why}")))
            }
            Outcome::ShadowDenied => (paint.yellow("◌"), "shadow: recorded, not run".to_owned()),
            Outcome::Cancelled => (paint.yellow("⊘"), "cancelled".to_owned()),
            Outcome::Indeterminate => (paint.yellow("?"), paint.yellow("indeterminate")),
        };
        out.push(progress(format!("  {mark} {} {summary} · {result}{timing}", paint.bold(&name))));
        match outcome {
            Outcome::Ok if failed_exit.is_some() => {
                let output = command_output(content);
                for line in block(output, FAILING_TAIL_LINES, MAX_LINE_CHARS, true) {
                    out.push(progress(format!("    {} {line}", paint.dim("│"))));
                }
            }
            Outcome::Ok if matches!(tool, "edit_file" | "write_file") => {
                for line in diff_lines(tool, &call.arguments, paint) {
                    out.push(progress(format!("    {line}")));
                }
            }
            Outcome::Error => {
                for line in block(content, 4, MAX_LINE_CHARS, true) {
                    out.push(progress(format!("    {} {line}", paint.dim("│"))));
                }
            }
            // Reported before the model continues (recovery records it at resume): the user
            // should know an effect may have happened.
            Outcome::Indeterminate => out.push(progress(format!(
                "    {} keel stopped while this call ran: whether it took effect is unknown, \
                 and it is never run again by itself; check before relying on it",
                paint.yellow("⚠")
            ))),
            Outcome::Ok | Outcome::Refused | Outcome::ShadowDenied | Outcome::Cancelled => {}
        }
    }
}

fn progress(text: String) -> Line {
    Line { kind: LineKind::Progress, text }
}

/// A short, neutralised summary of a call's arguments: the command, the path, the pattern
/// or the task, else compact JSON.
pub(crate) fn summary(tool: &str, arguments: &serde_json::Value) -> String {
    let text = |key: &str| arguments.get(key).and_then(serde_json::Value::as_str);
    let main = match tool {
        "bash" => text("command"),
        "read_file" | "write_file" | "edit_file" | "list_dir" => text("path"),
        "glob" | "grep" => text("pattern"),
        "spawn_agent" => text("task"),
        "wait_agent" => text("agent_id"),
        _ => None,
    };
    match main {
        Some(value) => {
            let mut shown = one_line(value, MAX_SUMMARY_CHARS);
            if matches!(tool, "glob" | "grep")
                && let Some(path) = text("path")
            {
                shown.push_str(&format!(" in {}", one_line(path, 60)));
            }
            shown
        }
        None if arguments.is_null()
            || arguments.as_object().is_some_and(serde_json::Map::is_empty) =>
        {
            String::new()
        }
        None => one_line(&arguments.to_string(), MAX_SUMMARY_CHARS),
    }
}

/// `exit 1` (or `killed by signal 9`) when a command's result says it did not succeed.
/// A command result's output without its status line and keel's trailing notes.
fn command_output(content: &str) -> &str {
    let mut output = content.trim_end();
    while let Some((head, last)) = output.rsplit_once('\n') {
        let status = last.starts_with("[exit code ") || last.starts_with("[killed by signal ");
        output = head;
        if status {
            break;
        }
        if !last.starts_with("[keel: ") {
            return content.trim_end();
        }
    }
    output
}

fn command_failure(content: &str) -> Option<String> {
    // keel's own note on escaped bytes may follow the status line.
    let last = content.trim_end().rsplit('\n').find(|line| !line.starts_with("[keel: "))?;
    if let Some(code) = last.strip_prefix("[exit code ").and_then(|s| s.strip_suffix(']')) {
        return (code != "0").then(|| format!("exit {}", one_line(code, 12)));
    }
    last.strip_prefix("[killed by signal ")
        .and_then(|s| s.strip_suffix(']'))
        .map(|signal| format!("killed by signal {}", one_line(signal, 12)))
}

/// An edit as a unified diff (`--- a/PATH`, `+++ b/PATH`, then `-`/`+`/` ` lines of the
/// replaced text); a written file as its added lines. Neutralised, then coloured.
fn diff_lines(tool: &str, arguments: &serde_json::Value, paint: Paint) -> Vec<String> {
    let text = |key: &str| arguments.get(key).and_then(serde_json::Value::as_str).unwrap_or("");
    let path = one_line(text("path"), 160);
    let (old, new) = match tool {
        "edit_file" => (text("old"), text("new")),
        _ => ("", text("content")),
    };
    let mut lines = vec![
        paint.dim(&format!(
            "--- {}",
            if old.is_empty() && tool == "write_file" {
                "/dev/null".to_owned()
            } else {
                format!("a/{path}")
            }
        )),
        paint.dim(&format!("+++ b/{path}")),
    ];
    let diff = similar::TextDiff::from_lines(old, new);
    let mut n_changes = 0usize;
    for change in diff.iter_all_changes() {
        n_changes += 1;
        if n_changes > MAX_DIFF_LINES {
            continue;
        }
        let body = one_line(change.value().trim_end_matches('\n'), MAX_LINE_CHARS);
        lines.push(match change.tag() {
            similar::ChangeTag::Delete => paint.red(&format!("-{body}")),
            similar::ChangeTag::Insert => paint.green(&format!("+{body}")),
            similar::ChangeTag::Equal => format!(" {body}"),
        });
    }
    if n_changes > MAX_DIFF_LINES {
        lines.push(paint.dim(&crate::terminal::more_lines(n_changes - MAX_DIFF_LINES)));
    }
    lines
}

/// `1,234 in / 56 out tokens` (plus reasoning tokens when there are any).
/// Tokens as they were known: reported figures plainly, keel's estimates of unreported ones
/// marked (`~`, "estimated"), and "unknown" (never "0") when nothing was reported or
/// estimated.
fn usage_text(usage: &UsageTotals) -> String {
    let unknown = usage.responses > 0
        && usage.responses_without_usage == usage.responses
        && usage.estimated_tokens == 0;
    let mut text = if unknown {
        "tokens unknown".to_owned()
    } else {
        let mark = if usage.estimated_tokens > 0 { "~" } else { "" };
        format!(
            "{mark}{} in / {mark}{} out tokens",
            thousands(usage.input_tokens),
            thousands(usage.output_tokens)
        )
    };
    if usage.estimated_tokens > 0 {
        text.push_str(&format!(" ({} estimated)", thousands(usage.estimated_tokens)));
    }
    if usage.reasoning_tokens > 0 {
        text.push_str(&format!(" ({} reasoning)", thousands(usage.reasoning_tokens)));
    }
    let calls = usage.responses;
    text.push_str(&format!(" · {calls} model call{}", if calls == 1 { "" } else { "s" }));
    text
}

/// A run's reason as one line that says what to do: an unreachable endpoint is named
/// with a hint, an HTML error page is cut to its title, and anything else is clipped.
pub(crate) fn short_reason(reason: &str) -> String {
    one_line(&explain_failure(reason.trim()), 300)
}

fn explain_failure(reason: &str) -> String {
    // reqwest: "error sending request for url (URL): client error (Connect): …: CAUSE".
    if let Some((_, rest)) = reason.split_once("error sending request for url (")
        && let Some((url, causes)) = rest.split_once(')')
    {
        let cause = causes.rsplit(": ").next().unwrap_or(causes).trim();
        let hint =
            if cause.contains("refused") || cause.contains("dns") || cause.contains("resolve") {
                "is the server running, and is --base-url (or OPENAI_BASE_URL) right?"
            } else if cause.contains("certificate") || cause.contains("tls") {
                "the server's TLS certificate was not accepted"
            } else {
                "check the network and --base-url"
            };
        let head = reason.split("request failed").next().unwrap_or("").trim_end_matches(": ");
        let head = if head.is_empty() { String::new() } else { format!("{head}: ") };
        return format!("{head}cannot reach {url}: {cause}; {hint}");
    }
    // An HTML page where an API answer was expected (a proxy or a wrong URL).
    let lower = reason.to_ascii_lowercase();
    if let Some(start) = lower.find("<!doctype html").or_else(|| lower.find("<html")) {
        let title = lower.find("<title>").and_then(|open| {
            let body = &reason[open + "<title>".len()..];
            body.find("</").map(|close| body[..close].trim().to_owned())
        });
        let head = reason[..start].trim_end();
        return format!(
            "{head} an HTML page{} (is --base-url an API endpoint, such as …/v1?)",
            title.map(|t| format!(" \"{t}\"")).unwrap_or_default()
        );
    }
    reason.to_owned()
}

/// `12345` → `12,345`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `340ms`, `2.4s`, `1m05s`.
pub(crate) fn duration_text(millis: u128) -> String {
    if millis < 1000 {
        format!("{millis}ms")
    } else if millis < 60_000 {
        format!("{}.{}s", millis / 1000, (millis % 1000) / 100)
    } else {
        let seconds = millis / 1000;
        format!("{}m{:02}s", seconds / 60, seconds % 60)
    }
}

/// A retry's wait: `250ms`, `4s` for whole seconds, else as [`duration_text`].
fn wait_text(millis: u64) -> String {
    if millis >= 1000 && millis.is_multiple_of(1000) && millis < 60_000 {
        format!("{}s", millis / 1000)
    } else {
        duration_text(u128::from(millis))
    }
}

fn serde_plain<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}

#[cfg(test)]
mod tests;
