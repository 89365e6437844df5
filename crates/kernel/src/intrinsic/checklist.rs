//! `todo` and `plan`: a checklist the agent keeps; the ledger is its memory. Carried out by
//! its own [`Tool::invoke`], like a workspace tool.

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Access, Effects, Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;

use super::Intrinsic;

/// `todo(items)`.
pub(crate) fn todo() -> Arc<dyn Intrinsic> {
    Arc::new(Checklist::new("todo", TODO_DESCRIPTION))
}

/// `plan(items)`.
pub(crate) fn plan() -> Arc<dyn Intrinsic> {
    Arc::new(Checklist::new("plan", PLAN_DESCRIPTION))
}

const TODO_DESCRIPTION: &str = "Record your todo list for this task: the whole list each time, \
each item with a status (pending, in_progress, done). It is kept in the session's ledger.";
const PLAN_DESCRIPTION: &str = "Record your plan for this task as ordered steps with a status \
(pending, in_progress, done). Send the whole plan each time; it is kept in the session's ledger.";

/// A checklist the agent keeps (`todo`, `plan`).
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

impl Intrinsic for Checklist {}
