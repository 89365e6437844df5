//! Intrinsic tools: how the agent thinks (DESIGN.md §2). They are keel's own, exempt from
//! the reads/writes scope and still refusable through `forbidden`. Only this module makes
//! intrinsic specs; the registry rejects any other tool that claims to be one.

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Access, Effects, Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;

/// The intrinsic tools, in the order the model sees them (after the workspace tools).
pub(crate) fn tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(Checklist::new("todo", TODO_DESCRIPTION)),
        Arc::new(Checklist::new("plan", PLAN_DESCRIPTION)),
        Arc::new(ReadToolResult::new()),
        Arc::new(RequestBoundary::new()),
        run_code(),
    ]
}

/// `run_code(code)`: runs a JavaScript program whose `await tools.NAME(args)` calls are
/// ordinary tool calls. Carried out by the kernel (settlement's cell path, engine in
/// [`crate::codemode`]); [`Tool::invoke`] is never reached.
fn run_code() -> Arc<dyn Tool> {
    Arc::new(KernelCarried {
        spec: ToolSpec {
            name: crate::codemode::RUN_CODE.to_owned(),
            description: "Run a JavaScript program (the body of an async function) that \
                              calls tools: `const text = await tools.read_file({path: \"a.rs\"})` \
                              makes an ordinary tool call (checked and recorded like yours) and \
                              gives its result text; a refusal or an error is that text, not an \
                              exception. `print(...)` output is this call's result. There is no \
                              file system, network, process, timer or module access, only \
                              `tools`; keel's own tools (run_code, plan, todo, spawn_agent, \
                              request_boundary, ...) are refused inside. CPU, memory, wall-time, \
                              output and call-count limits apply. Use it to loop or branch over \
                              many calls in one step."
                .to_owned(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "minLength": 1}
                },
                "required": ["code"],
                "additionalProperties": false
            }),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: true,
            first_party: true,
        },
    })
}

/// `activate_skill(name)`: returns a skill's instructions. Its `name` is an enum of the
/// run's skills, so the schema itself tells the model every name. Carried out by the
/// kernel from the run's skills; [`Tool::invoke`] is never reached.
pub(crate) fn activate_skill(names: &[String]) -> Arc<dyn Tool> {
    Arc::new(KernelCarried {
        spec: ToolSpec {
            name: crate::skills::ACTIVATE_SKILL.to_owned(),
            description: "Load a skill's instructions (and the list of its files) by name, before a task its description in the system prompt fits."
                .to_owned(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"name": {"enum": names}},
                "required": ["name"],
                "additionalProperties": false
            }),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: true,
            first_party: true,
        },
    })
}

/// `submit`.
pub(crate) const SUBMIT: &str = "submit";

/// `submit(...)`: hands in the final answer; its parameters are the run's output schema
/// (wrapped as `{"answer": ...}` when the schema is not an object's, since tool parameters
/// are objects on every provider). Carried out by the kernel; [`Tool::invoke`] is never
/// reached.
pub(crate) fn submit(schema: &serde_json::Value) -> Arc<dyn Tool> {
    Arc::new(KernelCarried {
        spec: ToolSpec {
            name: SUBMIT.to_owned(),
            description: "Hand in the final answer: the arguments must match the required \
                          output schema. The run ends with the first valid submission; an \
                          invalid one is answered with what is wrong, so fix it and submit again."
                .to_owned(),
            parameters: submit_parameters(schema),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: true,
            first_party: true,
        },
    })
}

/// Whether `schema` describes an object, so it can be `submit`'s parameters as it is.
pub(crate) fn is_object_schema(schema: &serde_json::Value) -> bool {
    schema.get("type").and_then(serde_json::Value::as_str) == Some("object")
}

fn submit_parameters(schema: &serde_json::Value) -> serde_json::Value {
    if is_object_schema(schema) {
        schema.clone()
    } else {
        serde_json::json!({
            "type": "object",
            "properties": {"answer": schema},
            "required": ["answer"],
            "additionalProperties": false
        })
    }
}

/// The answer a valid `submit` call hands in: its arguments, or their `answer` when the
/// schema was wrapped.
pub(crate) fn submitted_answer(
    schema: &serde_json::Value,
    arguments: &serde_json::Value,
) -> serde_json::Value {
    if is_object_schema(schema) {
        arguments.clone()
    } else {
        arguments.get("answer").cloned().unwrap_or(serde_json::Value::Null)
    }
}

/// How a run with an output schema ends on a tool-free answer: completed when the text is
/// JSON that matches the schema (the model answered in the shape asked), else failed with
/// what is wrong (the answer was not submitted).
pub(crate) fn text_answer(schema: &serde_json::Value, text: &str) -> crate::TurnOutcome {
    let problems = match serde_json::from_str::<serde_json::Value>(text.trim()) {
        Err(error) => format!("it is not JSON ({error})"),
        Ok(value) => match jsonschema::validator_for(schema) {
            Err(error) => format!("the output schema does not compile ({error})"),
            Ok(validator) => {
                let problems: Vec<String> =
                    validator.iter_errors(&value).map(|error| error.to_string()).collect();
                if problems.is_empty() {
                    return crate::TurnOutcome::Completed {
                        text: serde_json::to_string(&value).unwrap_or_default(),
                    };
                }
                problems.join("; ")
            }
        },
    };
    crate::TurnOutcome::Failed {
        reason: format!(
            "the model answered without calling submit, and its text does not match the \
             output schema: {problems}"
        ),
    }
}

/// An intrinsic tool the kernel carries out itself, from what the run holds.
#[derive(Debug)]
struct KernelCarried {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for KernelCarried {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error(format!("error: {} is carried out by the kernel", self.spec.name))
    }
}

/// `request_boundary`.
pub(crate) const REQUEST_BOUNDARY: &str = "request_boundary";

/// `request_boundary(paths?, network?, justification)`: asks the user to widen the
/// session's boundary by exact paths (read or write) and/or network access. Carried out by
/// the kernel through the permission path; [`Tool::invoke`] is never reached.
#[derive(Debug)]
struct RequestBoundary {
    spec: ToolSpec,
}

impl RequestBoundary {
    fn new() -> RequestBoundary {
        RequestBoundary {
            spec: ToolSpec {
                name: REQUEST_BOUNDARY.to_owned(),
                description: "Ask the user to let commands reach beyond the workspace: exact \
                              paths (read or write) and/or the network, with a justification. \
                              One request at a time. If approved, retry the call that needed \
                              it; if denied, the turn ends: do not ask again wider."
                    .to_owned(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "paths": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "path": {"type": "string", "minLength": 1},
                                    "access": {"enum": ["read", "write"]}
                                },
                                "required": ["path", "access"],
                                "additionalProperties": false
                            }
                        },
                        "network": {"type": "boolean"},
                        "justification": {"type": "string", "minLength": 1}
                    },
                    "required": ["justification"],
                    "additionalProperties": false
                }),
                access: Access::Read,
                effects: Effects::LOCAL_READ,
                intrinsic: true,
                first_party: true,
            },
        }
    }
}

#[async_trait]
impl Tool for RequestBoundary {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error("error: request_boundary is carried out by the kernel")
    }
}

/// `read_tool_result`.
pub(crate) const READ_TOOL_RESULT: &str = "read_tool_result";
/// Default page size of `read_tool_result`, in bytes.
pub(crate) const DEFAULT_PAGE_BYTES: u64 = 8 * 1024;
/// Largest page of `read_tool_result`, in bytes.
pub(crate) const MAX_PAGE_BYTES: u64 = 16 * 1024;

/// `read_tool_result(handle, offset?, limit?)`: pages a recorded tool result by byte
/// offset. Carried out by the kernel from the ledger (the full result is stored there);
/// [`Tool::invoke`] is never reached.
#[derive(Debug)]
struct ReadToolResult {
    spec: ToolSpec,
}

impl ReadToolResult {
    fn new() -> ReadToolResult {
        ReadToolResult {
            spec: ToolSpec {
                name: READ_TOOL_RESULT.to_owned(),
                description: "Read part of an earlier tool result that was shown as a preview or \
                              pruned from the context, by byte offset. `handle` is the call id \
                              named in the preview."
                    .to_owned(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "handle": {"type": "string", "minLength": 1},
                        "offset": {"type": "integer", "minimum": 0},
                        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_BYTES}
                    },
                    "required": ["handle"],
                    "additionalProperties": false
                }),
                access: Access::Read,
                effects: Effects::LOCAL_READ,
                intrinsic: true,
                first_party: true,
            },
        }
    }
}

#[async_trait]
impl Tool for ReadToolResult {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error("error: read_tool_result is carried out by the kernel")
    }
}

/// Whether `events` hold the recorded result of `handle` that [`read_tool_result`] pages.
pub(crate) fn holds_result(events: &[keel_contracts::RuntimeEvent], handle: &str) -> bool {
    events.iter().rev().any(|event| {
        matches!(&event.kind, keel_contracts::EventKind::ToolResult { call_id, tool, .. }
            if call_id.as_str() == handle && tool != READ_TOOL_RESULT)
    })
}

/// Pages the recorded result of `handle` (a call id) out of `events`.
pub(crate) fn read_tool_result(
    events: &[keel_contracts::RuntimeEvent],
    arguments: &serde_json::Value,
) -> ToolOutput {
    let handle = arguments.get("handle").and_then(|h| h.as_str()).unwrap_or_default();
    let offset = arguments.get("offset").and_then(serde_json::Value::as_u64).unwrap_or(0);
    let limit = arguments
        .get("limit")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(DEFAULT_PAGE_BYTES)
        .min(MAX_PAGE_BYTES);
    let found = events.iter().rev().find_map(|event| match &event.kind {
        keel_contracts::EventKind::ToolResult { call_id, content, tool, .. }
            if call_id.as_str() == handle && tool != READ_TOOL_RESULT =>
        {
            Some(content)
        }
        _ => None,
    });
    let Some(content) = found else {
        return ToolOutput::error(format!(
            "error: no recorded tool result has the handle '{handle}'"
        ));
    };
    let total = content.len();
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    if start >= total && total > 0 {
        return ToolOutput::error(format!(
            "error: offset {offset} is past the end ({total} bytes)"
        ));
    }
    let start = crate::projection::floor_char_boundary(content, start);
    let end = crate::projection::floor_char_boundary(
        content,
        start.saturating_add(usize::try_from(limit).unwrap_or(usize::MAX)),
    );
    let end =
        if end <= start { crate::projection::ceil_char_boundary(content, start + 1) } else { end };
    let more = if end < total {
        format!(" Next: read_tool_result {{\"handle\": \"{handle}\", \"offset\": {end}}}.")
    } else {
        " This is the end.".to_owned()
    };
    ToolOutput::ok(format!("[bytes {start}..{end} of {total}.{more}]\n{}", &content[start..end]))
}

const TODO_DESCRIPTION: &str = "Record your todo list for this task: the whole list each time, \
each item with a status (pending, in_progress, done). It is kept in the session's ledger.";
const PLAN_DESCRIPTION: &str = "Record your plan for this task as ordered steps with a status \
(pending, in_progress, done). Send the whole plan each time; it is kept in the session's ledger.";

/// `todo` and `plan`: a checklist the agent keeps; the ledger is its memory.
#[derive(Debug)]
struct Checklist {
    spec: ToolSpec,
}

#[derive(Deserialize)]
struct Items {
    items: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    text: String,
    status: String,
}

impl Checklist {
    fn new(name: &str, description: &str) -> Checklist {
        Checklist {
            spec: ToolSpec {
                name: name.to_owned(),
                description: description.to_owned(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "items": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "text": {"type": "string", "minLength": 1},
                                    "status": {"enum": ["pending", "in_progress", "done"]}
                                },
                                "required": ["text", "status"],
                                "additionalProperties": false
                            }
                        }
                    },
                    "required": ["items"],
                    "additionalProperties": false
                }),
                access: Access::Read,
                effects: Effects::LOCAL_READ,
                intrinsic: true,
                first_party: true,
            },
        }
    }
}

#[async_trait]
impl Tool for Checklist {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let items: Items = match serde_json::from_value(arguments.clone()) {
            Ok(items) => items,
            Err(error) => return ToolOutput::error(format!("error: invalid items: {error}")),
        };
        let done = items.items.iter().filter(|item| item.status == "done").count();
        let mut text = format!("{} recorded: {done}/{} done\n", self.spec.name, items.items.len());
        for item in &items.items {
            let mark = match item.status.as_str() {
                "done" => "[x]",
                "in_progress" => "[~]",
                _ => "[ ]",
            };
            text.push_str(&format!("{mark} {}\n", item.text));
        }
        ToolOutput::ok(text)
    }
}
