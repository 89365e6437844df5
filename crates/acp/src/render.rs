//! Ledger events → ACP `session/update`s: one projection, used both for the live stream
//! of a turn and for `session/load`'s replay, so an editor sees the same history either
//! way (the test in `tests/` compares them).
//!
//! The renderer keeps what a later event needs from an earlier one (a call's tool and
//! arguments for its result's diff, the context window for usage, the cost so far); it
//! reads nothing but the events it is given.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, Cost, Diff, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus,
    SessionUpdate, TextContent, ToolCall, ToolCallContent, ToolCallLocation, ToolCallStatus,
    ToolCallUpdate, ToolCallUpdateFields, ToolKind, UsageUpdate,
};
use keel_contracts::{EventKind, Outcome, RuntimeEvent};

/// Characters of a tool result shown in a `tool_call_update` (the ledger keeps it all).
pub const RESULT_CHARS: usize = 8_000;

/// Where a session's updates come from: the same [`Renderer`] feeds both.
#[derive(Debug, Default)]
pub struct Renderer {
    calls: HashMap<String, (String, serde_json::Value)>,
    context_window: Option<u64>,
    cost_usd: f64,
    unpriced: bool,
}

impl Renderer {
    /// A renderer that has seen nothing.
    pub fn new() -> Renderer {
        Renderer::default()
    }

    /// The updates `event` stands for, in order (often none).
    pub fn render(&mut self, event: &RuntimeEvent) -> Vec<SessionUpdate> {
        match &event.kind {
            EventKind::TurnStarted { input } | EventKind::InputJoined { input } => {
                vec![SessionUpdate::UserMessageChunk(text(input))]
            }
            EventKind::RunComposition { context_window, .. } => {
                self.context_window = *context_window;
                Vec::new()
            }
            kind @ EventKind::ModelResponse {
                text: answer,
                reasoning,
                tool_calls,
                usage,
                cost_usd,
                ..
            } => {
                if !kind.is_conversation_response() {
                    return Vec::new();
                }
                let mut out = Vec::new();
                for part in reasoning {
                    if !part.text.is_empty() {
                        out.push(SessionUpdate::AgentThoughtChunk(text(&part.text)));
                    }
                }
                if !answer.is_empty() {
                    out.push(SessionUpdate::AgentMessageChunk(text(answer)));
                }
                for call in tool_calls {
                    let id = call.call_id.as_str().to_owned();
                    self.calls.insert(id.clone(), (call.name.clone(), call.arguments.clone()));
                    out.push(SessionUpdate::ToolCall(
                        ToolCall::new(id, title(&call.name, &call.arguments))
                            .kind(kind_of(&call.name))
                            .status(ToolCallStatus::Pending)
                            .locations(locations(&call.arguments))
                            .raw_input(call.arguments.clone()),
                    ));
                }
                // Unknown is not zero: a cost is shown only while every response had one.
                match cost_usd {
                    Some(cost) => self.cost_usd += cost,
                    None => self.unpriced = true,
                }
                // `used` is what the context holds after this response (the prompt and
                // the answer); a usage_update needs a window, so none without one.
                if let Some(window) = self.context_window {
                    let used = usage.input_tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0);
                    let mut update = UsageUpdate::new(used, window);
                    if !self.unpriced {
                        update = update.cost(Cost::new(self.cost_usd, "USD"));
                    }
                    out.push(SessionUpdate::UsageUpdate(update));
                }
                out
            }
            EventKind::ToolAttemptPrepared { call_id, .. } => {
                vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                    call_id.as_str().to_owned(),
                    ToolCallUpdateFields::new().status(ToolCallStatus::InProgress),
                ))]
            }
            EventKind::ToolResult { call_id, tool, outcome, content, .. } => {
                let arguments = self
                    .calls
                    .get(call_id.as_str())
                    .map(|(_, arguments)| arguments.clone())
                    .unwrap_or(serde_json::Value::Null);
                let status = match outcome {
                    Outcome::Ok => ToolCallStatus::Completed,
                    _ => ToolCallStatus::Failed,
                };
                let mut body = Vec::new();
                if *outcome == Outcome::Ok
                    && let Some(diff) = diff(tool, &arguments)
                {
                    body.push(ToolCallContent::Diff(diff));
                }
                body.push(ToolCallContent::from(ContentBlock::Text(TextContent::new(
                    result_text(*outcome, content),
                ))));
                let mut out = vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                    call_id.as_str().to_owned(),
                    ToolCallUpdateFields::new().status(status).content(body),
                ))];
                if *outcome == Outcome::Ok
                    && matches!(tool.as_str(), "todo" | "plan")
                    && let Some(plan) = plan(&arguments)
                {
                    out.push(SessionUpdate::Plan(plan));
                }
                out
            }
            EventKind::RunFailed { reason, .. } => {
                vec![SessionUpdate::AgentMessageChunk(text(&format!(
                    "keel: the run failed: {reason}"
                )))]
            }
            EventKind::RunSuspended { reason, .. } => vec![SessionUpdate::AgentMessageChunk(text(
                &format!("keel: the run stopped early: {reason}"),
            ))],
            EventKind::RunDenied { reason, .. } => vec![SessionUpdate::AgentMessageChunk(text(
                &format!("keel: a permission denial ended the turn: {reason}"),
            ))],
            _ => Vec::new(),
        }
    }

    /// The updates of a whole session's events, as `session/load` replays them.
    pub fn replay(events: &[RuntimeEvent]) -> Vec<SessionUpdate> {
        let mut renderer = Renderer::new();
        events.iter().flat_map(|event| renderer.render(event)).collect()
    }
}

fn text(value: &str) -> ContentChunk {
    ContentChunk::new(ContentBlock::Text(TextContent::new(value)))
}

/// The ACP kind of a tool (DESIGN.md §9): edits, reads, searches, commands, thinking.
pub fn kind_of(tool: &str) -> ToolKind {
    match tool {
        "read_file" | "list_dir" | "read_tool_result" => ToolKind::Read,
        "write_file" | "edit_file" => ToolKind::Edit,
        "glob" | "grep" => ToolKind::Search,
        "bash" => ToolKind::Execute,
        "todo" | "plan" => ToolKind::Think,
        "fetch" | "web_fetch" => ToolKind::Fetch,
        _ => ToolKind::Other,
    }
}

/// A one-line title: the tool and what it acts on (`bash: cargo test`, `edit_file src/a.rs`).
pub fn title(tool: &str, arguments: &serde_json::Value) -> String {
    let field = |name: &str| arguments.get(name).and_then(serde_json::Value::as_str);
    let subject = match tool {
        "bash" => field("command"),
        "glob" | "grep" => field("pattern"),
        "spawn_agent" => field("task"),
        _ => field("path"),
    };
    match subject {
        Some(subject) => {
            let line = keel_host::terminal::one_line(subject, 120);
            format!("{tool} {line}")
        }
        None => tool.to_owned(),
    }
}

fn locations(arguments: &serde_json::Value) -> Vec<ToolCallLocation> {
    arguments
        .get("path")
        .and_then(serde_json::Value::as_str)
        .map(|path| vec![ToolCallLocation::new(path)])
        .unwrap_or_default()
}

fn diff(tool: &str, arguments: &serde_json::Value) -> Option<Diff> {
    let field = |name: &str| arguments.get(name).and_then(serde_json::Value::as_str);
    match tool {
        "write_file" => Some(Diff::new(field("path")?, field("content")?)),
        "edit_file" => Some(Diff::new(field("path")?, field("new")?).old_text(field("old")?)),
        _ => None,
    }
}

fn result_text(outcome: Outcome, content: &str) -> String {
    let mut shown: String = content.chars().take(RESULT_CHARS).collect();
    if shown.len() < content.len() {
        shown.push_str("\n… (cut; `keel log` has the whole result)");
    }
    match outcome {
        Outcome::Ok => shown,
        other if shown.starts_with(other.as_str()) => shown,
        other => format!("{}: {shown}", other.as_str()),
    }
}

fn plan(arguments: &serde_json::Value) -> Option<Plan> {
    let items = arguments.get("items")?.as_array()?;
    let entries = items
        .iter()
        .filter_map(|item| {
            let content = item.get("text")?.as_str()?;
            let status = match item.get("status").and_then(serde_json::Value::as_str) {
                Some("in_progress") => PlanEntryStatus::InProgress,
                Some("done") => PlanEntryStatus::Completed,
                _ => PlanEntryStatus::Pending,
            };
            Some(PlanEntry::new(content, PlanEntryPriority::Medium, status))
        })
        .collect();
    Some(Plan::new(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_contract() {
        assert_eq!(kind_of("edit_file"), ToolKind::Edit);
        assert_eq!(kind_of("bash"), ToolKind::Execute);
        assert_eq!(kind_of("grep"), ToolKind::Search);
        assert_eq!(kind_of("read_file"), ToolKind::Read);
        assert_eq!(kind_of("todo"), ToolKind::Think);
        assert_eq!(kind_of("mcp__fs__write"), ToolKind::Other);
    }

    #[test]
    fn a_title_cannot_carry_control_characters() {
        let shown = title("bash", &serde_json::json!({"command": "ls\n\u{1b}[2Jrm -rf /"}));
        assert!(!shown.contains('\n') && !shown.contains('\u{1b}'), "{shown}");
        assert!(shown.starts_with("bash ls"), "{shown}");
    }

    #[test]
    fn an_edit_result_is_a_diff_and_a_plan_is_a_plan() {
        let edit =
            diff("edit_file", &serde_json::json!({"path": "a.rs", "old": "n - 1", "new": "n"}))
                .expect("a diff");
        assert_eq!(edit.new_text, "n");
        assert_eq!(edit.old_text.as_deref(), Some("n - 1"));
        let plan = plan(&serde_json::json!({"items": [
            {"text": "read", "status": "done"}, {"text": "fix", "status": "in_progress"}
        ]}))
        .expect("a plan");
        assert_eq!(plan.entries.len(), 2);
        assert_eq!(plan.entries[0].status, PlanEntryStatus::Completed);
    }
}
