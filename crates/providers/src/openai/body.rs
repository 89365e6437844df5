//! Chat Completions request bodies from kept fragments (issue #15, the hosted step rate).
//!
//! The requests of one run repeat most of their body: the model, the system prompt and the
//! tool definitions are the same every step, and each step's conversation is the last
//! one's plus a few messages. [`BodyCache`] keeps each part's JSON as the wire structs
//! serialize it and writes a body by copying the kept parts, so a step escapes and
//! allocates only what is new.
//!
//! Invariant (tested against [`ChatRequest::streaming`] serialized whole, including
//! reordered argument keys and `-0.0`): a body is byte for byte what serde_json writes for
//! the request. serde_json's compact writer puts nothing between a sequence's elements
//! but `,` and writes each element independently of the others, so an element's JSON can
//! be kept and copied. A kept fragment is reused only when what it was rendered from
//! compares equal field by field *in serialization order* (a JSON object's keys in their
//! order, a number by its exact representation), never by a hash or an address, so it
//! cannot go stale.

use keel_contracts::{Message, ModelRequest, ToolCall, ToolChoice, ToolDefinition};
use serde::Serialize;
use serde_json::Value;

use super::wire::{ChatRequest, WireMessage};

/// The most message JSON kept per client, in bytes: messages past it are rendered every
/// time. Bounds the cache beside a long conversation (each kept message is also held as a
/// copy to compare with) to a few MiB per run.
const MAX_KEPT_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

/// Room added to the last body's length when sizing the next one (a step adds a few
/// messages).
const GROWTH_ROOM: usize = 4 * 1024;

/// The fragments of the requests one client sent last (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct BodyCache {
    head: Option<Head>,
    messages: Vec<Kept>,
    kept_bytes: usize,
    last_len: usize,
}

/// What comes before and after the conversation messages, and what it was made from.
#[derive(Debug)]
struct Head {
    model: String,
    system: String,
    tools: Vec<ToolDefinition>,
    none: bool,
    /// `{"model":…,"messages":[` and the system message, when there is one.
    open: Vec<u8>,
    /// Whether `open` ends with a message (the next one needs a `,`).
    open_has_message: bool,
    /// `]` and the rest of the body after `messages`.
    close: Vec<u8>,
}

/// One message as last rendered, and a copy of what it was rendered from.
#[derive(Debug)]
struct Kept {
    message: Message,
    json: Vec<u8>,
}

/// The fields of the body after `messages`, in [`ChatRequest`]'s order.
#[derive(Serialize)]
struct Rest<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<super::wire::WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    stream: bool,
    stream_options: super::wire::StreamOptions,
}

impl BodyCache {
    /// The body of the streaming request for `request`, addressed to `model`: the bytes
    /// of `serde_json::to_vec(&ChatRequest::streaming(model, request))`.
    ///
    /// # Errors
    ///
    /// serde_json's error when a part cannot be encoded (it cannot for these types).
    pub(crate) fn render(
        &mut self,
        model: &str,
        request: &ModelRequest,
    ) -> Result<Vec<u8>, serde_json::Error> {
        if request.tools.is_empty() {
            // The tools defined then depend on the history (stubs, see `crate::tooling`):
            // rare (compaction summaries), rendered whole.
            return serde_json::to_vec(&ChatRequest::streaming(model, request));
        }
        // With tools offered, "none" is sent exactly when tools are off (`crate::tooling`).
        let none = request.tool_choice == ToolChoice::None;
        let fresh = !self.head.as_ref().is_some_and(|head| {
            head.none == none
                && head.model == model
                && head.system == request.system
                && head.tools == request.tools
                && same_tools(&head.tools, &request.tools)
        });
        if fresh {
            self.head = Some(Head::render(model, request, none)?);
        }
        let BodyCache { head, messages: kept, kept_bytes, last_len } = self;
        let Some(head) = head else {
            return serde_json::to_vec(&ChatRequest::streaming(model, request));
        };
        let mut body = Vec::with_capacity(last_len.saturating_add(GROWTH_ROOM));
        body.extend_from_slice(&head.open);
        let mut first = !head.open_has_message;
        for (index, message) in request.messages.iter().enumerate() {
            if !std::mem::take(&mut first) {
                body.push(b',');
            }
            if let Some(same) = kept.get(index)
                && renders_same(&same.message, message)
            {
                body.extend_from_slice(&same.json);
                continue;
            }
            let start = body.len();
            serde_json::to_writer(&mut body, &WireMessage::from_message(message))?;
            keep(kept, kept_bytes, index, message, &body[start..]);
        }
        for dropped in kept.drain(request.messages.len().min(kept.len())..) {
            *kept_bytes = kept_bytes.saturating_sub(dropped.json.len());
        }
        body.extend_from_slice(&head.close);
        *last_len = body.len();
        Ok(body)
    }
}

/// Keeps `json` as message `index`'s rendering in `kept`, replacing what was kept there
/// (and dropping what was kept after it), within [`MAX_KEPT_MESSAGE_BYTES`] in all
/// (`kept_bytes`).
fn keep(
    kept: &mut Vec<Kept>,
    kept_bytes: &mut usize,
    index: usize,
    message: &Message,
    json: &[u8],
) {
    for dropped in kept.drain(index.min(kept.len())..) {
        *kept_bytes = kept_bytes.saturating_sub(dropped.json.len());
    }
    if kept.len() != index || kept_bytes.saturating_add(json.len()) > MAX_KEPT_MESSAGE_BYTES {
        return;
    }
    *kept_bytes += json.len();
    kept.push(Kept { message: comparable_copy(message), json: json.to_vec() });
}

impl Head {
    fn render(model: &str, request: &ModelRequest, none: bool) -> Result<Head, serde_json::Error> {
        let mut open = b"{\"model\":".to_vec();
        serde_json::to_writer(&mut open, model)?;
        open.extend_from_slice(b",\"messages\":[");
        let open_has_message = !request.system.is_empty();
        if open_has_message {
            serde_json::to_writer(&mut open, &WireMessage::System { content: &request.system })?;
        }
        let whole = ChatRequest::streaming(model, request);
        let rest = Rest {
            tools: whole.tools,
            tool_choice: whole.tool_choice,
            stream: whole.stream,
            stream_options: whole.stream_options,
        };
        let rest = serde_json::to_vec(&rest)?;
        // `{"tools":…}` becomes `],"tools":…}`: the fields after `messages`.
        let mut close = b"],".to_vec();
        close.extend_from_slice(rest.get(1..).unwrap_or_default());
        Ok(Head {
            model: model.to_owned(),
            system: request.system.clone(),
            tools: request.tools.clone(),
            none,
            open,
            open_has_message,
            close,
        })
    }
}

/// Whether the definitions serialize the same: `==` compares schemas as values, which
/// ignores the order of object keys; their kept JSON text does not.
fn same_tools(kept: &[ToolDefinition], new: &[ToolDefinition]) -> bool {
    kept.iter().zip(new).all(|(kept, new)| kept.parameters.json() == new.parameters.json())
}

/// A copy of `message` with what the Chat Completions body leaves out (reasoning) left
/// out, to compare later requests' messages with.
fn comparable_copy(message: &Message) -> Message {
    match message {
        Message::Assistant { text, reasoning: _, tool_calls } => Message::Assistant {
            text: text.clone(),
            reasoning: Vec::new(),
            tool_calls: tool_calls.clone(),
        },
        other => other.clone(),
    }
}

/// Whether `new` renders as `kept` did: every field the body holds is equal, JSON values in
/// serialization order.
fn renders_same(kept: &Message, new: &Message) -> bool {
    match (kept, new) {
        (Message::User { text: a }, Message::User { text: b }) => a == b,
        (
            Message::Assistant { text: a, tool_calls: calls_a, .. },
            Message::Assistant { text: b, tool_calls: calls_b, .. },
        ) => {
            a == b
                && calls_a.len() == calls_b.len()
                && calls_a.iter().zip(calls_b).all(|(a, b)| same_call(a, b))
        }
        (
            Message::ToolResult { call_id: id_a, content: a, .. },
            Message::ToolResult { call_id: id_b, content: b, .. },
        ) => id_a == id_b && a == b,
        _ => false,
    }
}

fn same_call(a: &ToolCall, b: &ToolCall) -> bool {
    a.call_id == b.call_id
        && a.name == b.name
        && a.arguments_error.is_some() == b.arguments_error.is_some()
        && same_json(&a.arguments, &b.arguments)
}

/// Equality that implies the same serialization: objects compare key by key in order,
/// numbers by representation (`0.0` and `-0.0`, `1` and `1.0` differ).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (Value::Number(a), Value::Number(b)) => {
            (a.as_u64(), a.as_i64()) == (b.as_u64(), b.as_i64())
                && a.is_f64() == b.is_f64()
                && a.as_f64().map(f64::to_bits) == b.as_f64().map(f64::to_bits)
        }
        (Value::String(a), Value::String(b)) => a == b,
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|((key_a, a), (key_b, b))| key_a == key_b && same_json(a, b))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use keel_contracts::{Outcome, ToolCallId};
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn tool(name: &str, description: &str, schema: Value) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: description.into(),
            parameters: schema.into(),
        }
    }

    fn request(system: &str, messages: Vec<Message>, tools: Vec<ToolDefinition>) -> ModelRequest {
        ModelRequest {
            model: "m".into(),
            system: system.into(),
            messages,
            tools,
            tool_choice: ToolChoice::Auto,
            responses_in_session: 0,
            purpose: Default::default(),
        }
    }

    fn whole(model: &str, request: &ModelRequest) -> Vec<u8> {
        serde_json::to_vec(&ChatRequest::streaming(model, request)).unwrap()
    }

    fn call(id: &str, arguments: Value) -> ToolCall {
        ToolCall {
            call_id: ToolCallId(id.into()),
            name: "todo".into(),
            arguments,
            arguments_error: None,
        }
    }

    fn assistant(text: &str, calls: Vec<ToolCall>) -> Message {
        Message::Assistant { text: text.into(), reasoning: Vec::new(), tool_calls: calls }
    }

    fn result(id: &str, content: &str) -> Message {
        Message::ToolResult {
            call_id: ToolCallId(id.into()),
            tool: "todo".into(),
            outcome: Outcome::Ok,
            content: content.into(),
        }
    }

    #[test]
    fn a_growing_conversation_gives_the_bodies_serde_json_gives() {
        let tools = vec![tool("todo", "Keep a \"list\".\n", json!({"type": "object"}))];
        let mut cache = BodyCache::default();
        let mut messages = vec![Message::User { text: "go \u{e9}\u{1}".into() }];
        for step in 0..6 {
            for system in ["", "Be brief."] {
                let request = request(system, messages.clone(), tools.clone());
                assert_eq!(cache.render("m", &request).unwrap(), whole("m", &request), "{step}");
            }
            let id = format!("call_{step}");
            messages.push(assistant("", vec![call(&id, json!({"items": [step]}))]));
            messages.push(result(&id, "done"));
        }
        assert!(!cache.messages.is_empty(), "messages are kept");
    }

    #[test]
    fn kept_parts_never_stand_for_changed_ones() {
        let mut cache = BodyCache::default();
        let tools = vec![tool("a", "A.", json!({"type": "object", "properties": {}}))];
        let mut ordered = serde_json::Map::new();
        ordered.insert("b".into(), json!(1));
        ordered.insert("a".into(), json!(2));
        let mut reordered = serde_json::Map::new();
        reordered.insert("a".into(), json!(2));
        reordered.insert("b".into(), json!(1));
        let variants = [
            vec![assistant("", vec![call("c", Value::Object(ordered))])],
            vec![assistant("", vec![call("c", Value::Object(reordered))])],
            vec![assistant("", vec![call("c", json!({"x": 0.0}))])],
            vec![assistant("", vec![call("c", json!({"x": -0.0}))])],
            vec![assistant("", vec![call("c", json!({"x": 1}))])],
            vec![assistant("", vec![call("c", json!({"x": 1.0}))])],
            vec![assistant("t", vec![call("c", json!({"x": 1}))])],
            vec![result("c", "x")],
            vec![result("d", "x")],
            vec![Message::User { text: "x".into() }],
            vec![assistant("x", Vec::new())],
        ];
        for messages in variants.iter().chain(variants.iter().rev()) {
            for tools in
                [tools.clone(), vec![tool("a", "A.", json!({"properties": {}, "type": "object"}))]]
            {
                for choice in [ToolChoice::Auto, ToolChoice::None] {
                    let mut request = request("s", messages.clone(), tools.clone());
                    request.tool_choice = choice;
                    for model in ["m", "n"] {
                        assert_eq!(
                            String::from_utf8(cache.render(model, &request).unwrap()).unwrap(),
                            String::from_utf8(whole(model, &request)).unwrap()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn requests_without_tools_are_rendered_whole() {
        let mut cache = BodyCache::default();
        let messages = vec![assistant("", vec![call("c", json!({}))]), result("c", "ok")];
        let request = request("s", messages, Vec::new());
        assert_eq!(cache.render("m", &request).unwrap(), whole("m", &request));
        assert!(cache.head.is_none() && cache.messages.is_empty());
    }

    #[test]
    fn kept_messages_stay_within_their_bound() {
        let mut cache = BodyCache::default();
        let big = "x".repeat(MAX_KEPT_MESSAGE_BYTES / 3);
        let messages: Vec<Message> = (0..5).map(|_| Message::User { text: big.clone() }).collect();
        let request = request("", messages, vec![tool("a", "", json!({}))]);
        for _ in 0..2 {
            assert_eq!(cache.render("m", &request).unwrap(), whole("m", &request));
        }
        assert!(cache.kept_bytes <= MAX_KEPT_MESSAGE_BYTES);
        assert_eq!(cache.messages.len(), 2);
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            prop_oneof![Just(0.0), Just(-0.0), Just(1.0), any::<f64>()]
                .prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
            "[a-c\"\\\\\u{1}é]{0,3}".prop_map(Value::String),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::vec(("[ab]", inner), 0..3)
                    .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
            ]
        })
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let text = "[ab\"\n]{0,3}";
        prop_oneof![
            text.prop_map(|text| Message::User { text }),
            (text, prop::collection::vec(("[cd]", arb_value(), any::<bool>()), 0..2)).prop_map(
                |(text, calls)| Message::Assistant {
                    text,
                    reasoning: Vec::new(),
                    tool_calls: calls
                        .into_iter()
                        .map(|(id, arguments, bad)| ToolCall {
                            call_id: ToolCallId(id),
                            name: "f".into(),
                            arguments,
                            arguments_error: bad.then(|| "bad".to_owned()),
                        })
                        .collect(),
                }
            ),
            ("[cd]", text).prop_map(|(id, content)| result(&id, &content)),
        ]
    }

    proptest! {
        /// Any sequence of requests (messages changed, added, removed; system and tools
        /// switched) renders each body exactly as serde_json does.
        #[test]
        fn every_body_equals_serializing_the_request(
            steps in prop::collection::vec(
                (prop::collection::vec(arb_message(), 0..5), any::<bool>(), any::<bool>(), any::<bool>()),
                1..8,
            )
        ) {
            let mut cache = BodyCache::default();
            let mut messages: Vec<Message> = Vec::new();
            for (added, grow, system, none) in steps {
                if grow { messages.extend(added) } else { messages = added }
                let tools = vec![tool("f", "F.", json!({"type": "object"}))];
                let mut request = request(if system { "s" } else { "" }, messages.clone(), tools);
                if none { request.tool_choice = ToolChoice::None }
                prop_assert_eq!(cache.render("m", &request).unwrap(), whole("m", &request));
            }
        }
    }
}
