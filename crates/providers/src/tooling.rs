//! Which tools a request defines on the wire, and whether the model may call them: one
//! rule for every wire API.
//!
//! The rule (issue 12 item 6):
//! - Tools are off when the request says so ([`ToolChoice::None`]) or offers none.
//! - A request keeps its tool definitions when tools are off: the wire API is told
//!   "none" (`tool_choice: "none"` for OpenAI Chat Completions and Responses,
//!   `tool_choice: {"type": "none"}` for Anthropic Messages) instead of dropping the list.
//!   Anthropic's Messages API refuses a request whose messages hold `tool_use` or
//!   `tool_result` blocks without `tools` ("Requests which include `tool_use` or
//!   `tool_result` blocks must define tools", HTTP 400), and OpenAI's APIs accept
//!   `tool_choice` only beside `tools`.
//! - A request that offers no tools but whose history holds tool calls or results (a
//!   compaction summary request, a resumed session whose tools are gone) defines a stub
//!   for each tool the history names, with an open schema, and tools off: the history
//!   stays valid and nothing can be called.
//!
//! Sources: Anthropic, "Tool use" and "Messages" (`tool_choice`, `none`:
//! <https://docs.anthropic.com/en/docs/agents-and-tools/tool-use/implement-tool-use>);
//! OpenAI, "Create chat completion" and "Create a model response" (`tool_choice`:
//! <https://platform.openai.com/docs/api-reference/chat/create>,
//! <https://platform.openai.com/docs/api-reference/responses/create>).

use std::borrow::Cow;

use keel_contracts::{Message, ModelRequest, ToolChoice, ToolSchema};

/// The description of a stub tool (see the module's rule).
const STUB_DESCRIPTION: &str =
    "A tool used earlier in this conversation; it is not available in this request.";

/// One tool as a wire API defines it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DefinedTool<'a> {
    pub(crate) name: &'a str,
    pub(crate) description: &'a str,
    /// Shared with the request and serialized once (see [`ToolSchema`]).
    pub(crate) parameters: Cow<'a, ToolSchema>,
}

/// The tools of one request on the wire.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WireTools<'a> {
    /// The definitions to send (empty: send none, and no `tool_choice`).
    pub(crate) defined: Vec<DefinedTool<'a>>,
    /// Whether to send the wire API's "none" tool choice (only ever with definitions).
    pub(crate) none: bool,
}

/// The tools `request` defines on the wire (see the module's rule).
pub(crate) fn wire_tools(request: &ModelRequest) -> WireTools<'_> {
    let mut defined: Vec<DefinedTool<'_>> = request
        .tools
        .iter()
        .map(|tool| DefinedTool {
            name: &tool.name,
            description: &tool.description,
            parameters: Cow::Borrowed(&tool.parameters),
        })
        .collect();
    if defined.is_empty() {
        for name in history_tool_names(request) {
            if !defined.iter().any(|tool| tool.name == name) {
                defined.push(DefinedTool {
                    name,
                    description: STUB_DESCRIPTION,
                    parameters: Cow::Owned(ToolSchema::new(serde_json::json!({"type": "object"}))),
                });
            }
        }
    }
    let off = request.tool_choice == ToolChoice::None || request.tools.is_empty();
    let none = off && !defined.is_empty();
    WireTools { defined, none }
}

/// The tool names the history's calls and results use, in order of first use; empty names
/// are skipped (no wire API accepts them).
fn history_tool_names(request: &ModelRequest) -> impl Iterator<Item = &str> {
    request
        .messages
        .iter()
        .flat_map(|message| -> Vec<&str> {
            match message {
                Message::Assistant { tool_calls, .. } => {
                    tool_calls.iter().map(|call| call.name.as_str()).collect()
                }
                Message::ToolResult { tool, .. } => vec![tool.as_str()],
                Message::User { .. } => Vec::new(),
            }
        })
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use keel_contracts::{Outcome, ToolCall, ToolCallId, ToolDefinition};
    use serde_json::json;

    use super::*;

    fn request(tools: Vec<ToolDefinition>, choice: ToolChoice, history: bool) -> ModelRequest {
        let mut messages = vec![Message::User { text: "hi".into() }];
        if history {
            messages.push(Message::Assistant {
                text: String::new(),
                reasoning: Vec::new(),
                tool_calls: vec![ToolCall {
                    call_id: ToolCallId("c1".into()),
                    name: "read_file".into(),
                    arguments: json!({"path": "a"}),
                    arguments_error: None,
                }],
            });
            messages.push(Message::ToolResult {
                call_id: ToolCallId("c1".into()),
                tool: "read_file".into(),
                outcome: Outcome::Ok,
                content: "x".into(),
            });
        }
        ModelRequest {
            model: "m".into(),
            system: String::new(),
            messages,
            tools,
            tool_choice: choice,
            responses_in_session: 0,
            purpose: Default::default(),
        }
    }

    fn read_file() -> ToolDefinition {
        ToolDefinition {
            name: "read_file".into(),
            description: "Read a file.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}})
                .into(),
        }
    }

    #[test]
    fn tools_off_keeps_the_definitions_and_says_none() {
        let request = request(vec![read_file()], ToolChoice::None, true);
        let wire = wire_tools(&request);
        assert_eq!(wire.defined.len(), 1);
        assert_eq!(wire.defined[0].description, "Read a file.");
        assert!(wire.none);
        let request = request_auto();
        assert!(!wire_tools(&request).none);
    }

    fn request_auto() -> ModelRequest {
        request(vec![read_file()], ToolChoice::Auto, true)
    }

    #[test]
    fn no_tools_with_tool_history_defines_stubs_with_tools_off() {
        for choice in [ToolChoice::Auto, ToolChoice::None] {
            let request = request(Vec::new(), choice, true);
            let wire = wire_tools(&request);
            assert_eq!(wire.defined.len(), 1, "one stub per name");
            assert_eq!(wire.defined[0].name, "read_file");
            assert_eq!(*wire.defined[0].parameters, json!({"type": "object"}));
            assert!(wire.none);
        }
    }

    #[test]
    fn no_tools_and_no_tool_history_sends_nothing() {
        for choice in [ToolChoice::Auto, ToolChoice::None] {
            let request = request(Vec::new(), choice, false);
            assert_eq!(wire_tools(&request), WireTools { defined: Vec::new(), none: false });
        }
    }
}
