//! One output item of a Responses stream while it builds: what the wire says of it
//! ([`Item::from_wire`]), how its `.done` form overlays what streamed
//! ([`Item::overlaid_by`]), and a call of a kind keel never declares ([`ForeignCall`]).

use serde_json::Value;

use crate::responses::wire::{self, OutputItem};

/// One output item while it streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Item {
    Message {
        text: String,
        refusal: String,
    },
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
        complete: bool,
    },
    Reasoning {
        summary: Vec<String>,
        content: String,
        encrypted_content: Option<String>,
    },
    /// An item of another kind; `call` is set when it is a call the client must answer.
    Other {
        call: Option<ForeignCall>,
    },
}

/// A call of a tool kind keel did not declare, as the item described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ForeignCall {
    /// The item's `type`, e.g. `apply_patch_call`.
    pub(super) kind: String,
    pub(super) call_id: String,
    /// The tool's name: the item's `name`, else its kind without `_call`.
    pub(super) name: String,
    /// The call's input as JSON text.
    pub(super) arguments: String,
    /// Whether the server says it runs this call itself.
    pub(super) server_side: bool,
}

impl Item {
    /// The item as the wire describes it; `complete` says whether a function call's
    /// arguments are whole.
    pub(super) fn from_wire(item: &OutputItem, complete: bool) -> Item {
        let texts = |parts: &Option<Vec<wire::ContentPartOut>>, kinds: &[&str]| -> Vec<String> {
            parts
                .iter()
                .flatten()
                .filter(|part| part.kind.as_deref().is_some_and(|kind| kinds.contains(&kind)))
                .filter_map(|part| part.text.clone().or_else(|| part.refusal.clone()))
                .collect()
        };
        match item.kind.as_deref() {
            Some("message") => Item::Message {
                text: texts(&item.content, &["output_text"]).concat(),
                refusal: texts(&item.content, &["refusal"]).concat(),
            },
            Some("function_call") => Item::FunctionCall {
                call_id: item.call_id.clone().unwrap_or_default(),
                name: item.name.clone().unwrap_or_default(),
                arguments: item.arguments.clone().unwrap_or_default(),
                complete,
            },
            Some("reasoning") => Item::Reasoning {
                summary: texts(&item.summary, &["summary_text"]),
                content: texts(&item.content, &["reasoning_text"]).concat(),
                encrypted_content: item.encrypted_content.clone(),
            },
            Some(kind) => Item::Other { call: ForeignCall::from_wire(kind, item) },
            None => Item::Other { call: None },
        }
    }

    /// This streamed item with the fields of its `.done` form laid over it; a field the
    /// `.done` form leaves empty keeps what streamed.
    pub(super) fn overlaid_by(self, done: Item) -> Item {
        let pick = |streamed: String, done: String| if done.is_empty() { streamed } else { done };
        match (self, done) {
            (
                Item::Message { text, refusal },
                Item::Message { text: done_text, refusal: done_refusal },
            ) => {
                Item::Message { text: pick(text, done_text), refusal: pick(refusal, done_refusal) }
            }
            (
                Item::FunctionCall { call_id, name, arguments, complete: _ },
                Item::FunctionCall {
                    call_id: done_id,
                    name: done_name,
                    arguments: done_arguments,
                    complete,
                },
            ) => Item::FunctionCall {
                call_id: pick(call_id, done_id),
                name: pick(name, done_name),
                arguments: pick(arguments, done_arguments),
                complete,
            },
            (
                Item::Reasoning { summary, content, encrypted_content },
                Item::Reasoning {
                    summary: done_summary,
                    content: done_content,
                    encrypted_content: done_encrypted,
                },
            ) => Item::Reasoning {
                summary: if done_summary.iter().all(String::is_empty) {
                    summary
                } else {
                    done_summary
                },
                content: pick(content, done_content),
                encrypted_content: done_encrypted.or(encrypted_content),
            },
            (_, done) => done,
        }
    }
}

impl ForeignCall {
    /// The call an item of `kind` asks the client to answer, when it is one: the API names
    /// call items `*_call`, and a call the client answers has a `call_id` (a hosted
    /// `program` item has one too, but is no call: the function calls it makes are).
    fn from_wire(kind: &str, item: &OutputItem) -> Option<ForeignCall> {
        if !kind.ends_with("_call") {
            return None;
        }
        let call_id = item.call_id.clone().filter(|id| !id.is_empty())?;
        let name = item
            .name
            .clone()
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| kind.strip_suffix("_call").unwrap_or(kind).to_owned());
        let arguments = if let Some(arguments) = &item.arguments {
            arguments.clone()
        } else if let Some(input) = &item.input {
            Value::String(input.clone()).to_string()
        } else if let Some(operation) = &item.operation {
            serde_json::json!({"operation": operation}).to_string()
        } else if let Some(action) = &item.action {
            serde_json::json!({"action": action}).to_string()
        } else {
            "{}".to_owned()
        };
        let environment = item
            .environment
            .as_ref()
            .and_then(|environment| environment.get("type"))
            .and_then(Value::as_str);
        let server_side = item.execution.as_deref() == Some("server")
            || environment.is_some_and(|environment| environment != "local");
        Some(ForeignCall { kind: kind.to_owned(), call_id, name, arguments, server_side })
    }
}
