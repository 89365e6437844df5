//! Tool-call arguments between the wire and [`ToolCall`](keel_contracts::ToolCall): streamed JSON text becomes a
//! value (or a kept error), and a call's arguments become text again for replay.
//!
//! Invariant: a call is never dropped. Arguments that are empty become `{}`; arguments that
//! do not parse are kept as the raw text (a JSON string) with `ToolCall::arguments_error`
//! set, so the kernel answers the call as malformed and never executes it.

use keel_contracts::ToolCallId;
use serde_json::Value;

/// Parses the streamed argument text of a call: `(arguments, arguments_error)`.
pub(crate) fn parse(raw: String) -> (Value, Option<String>) {
    if raw.trim().is_empty() {
        return (Value::Object(serde_json::Map::new()), None);
    }
    match serde_json::from_str::<Value>(&raw) {
        Ok(arguments) => (arguments, None),
        Err(error) => (Value::String(raw), Some(format!("arguments are not valid JSON: {error}"))),
    }
}

/// The argument text to send back for `tool_call`: a call whose arguments did not parse
/// keeps the model's raw text as a JSON string, which is sent as the model wrote it rather
/// than as a quoted copy of it. (Anthropic wants an object instead; see its wire module.)
#[cfg(feature = "openai")]
pub(crate) fn text(tool_call: &keel_contracts::ToolCall) -> String {
    match (&tool_call.arguments_error, &tool_call.arguments) {
        (Some(_), Value::String(raw)) => raw.clone(),
        (_, arguments) => arguments.to_string(),
    }
}

/// A call id for a provider that sent none: `call_` and a UUIDv7 in simple form.
pub(crate) fn mint_call_id() -> ToolCallId {
    ToolCallId(format!("call_{}", uuid::Uuid::now_v7().simple()))
}

#[cfg(test)]
mod tests {
    use keel_contracts::ToolCall;
    use serde_json::json;

    use super::*;

    #[test]
    fn empty_text_is_an_empty_object() {
        assert_eq!(parse(String::new()), (json!({}), None));
        assert_eq!(parse("  \n".to_owned()), (json!({}), None));
    }

    #[test]
    fn bad_text_is_kept_raw_with_an_error() {
        let (arguments, error) = parse("{\"a\": \"b".to_owned());
        assert_eq!(arguments, json!("{\"a\": \"b"));
        assert!(error.unwrap().starts_with("arguments are not valid JSON"));
    }

    #[cfg(feature = "openai")]
    #[test]
    fn text_round_trips_raw_arguments() {
        let (arguments, arguments_error) = parse("{\"a\": ".to_owned());
        let call = ToolCall {
            call_id: ToolCallId::from("c"),
            name: "f".into(),
            arguments,
            arguments_error,
        };
        assert_eq!(text(&call), "{\"a\": ");
        let call = ToolCall { arguments: json!({"a": 1}), arguments_error: None, ..call };
        assert_eq!(text(&call), "{\"a\":1}");
    }
}
