//! Lenient field deserializers for the response types of every wire API.
//!
//! A provider (or a compatible server, or a newer API version) may send a field keel reads
//! with another JSON type than keel expects: an object where the format says string (the
//! `arguments` of a hosted `tool_search_call`, the `delta` of
//! `response.shell_call_output_content.delta`), a number for a string, an array for an
//! object. One such field must never make a whole event, and so a whole response,
//! unreadable (corpus cases `openai-tool-search.1`, `openai-shell-container.1`). These
//! functions are used with `#[serde(default, deserialize_with = "…")]` on the fields of
//! the wire types, so a field of the wrong type reads as absent ([`option`]) or, for text
//! that keel may need, as its JSON encoding ([`text`]).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A field of type `T`, or `None` when it is absent, `null` or of another shape.
///
/// # Errors
///
/// Only when the input is not JSON at all (which the caller reports).
pub(crate) fn option<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = Value::deserialize(deserializer)?;
    if value.is_null() {
        return Ok(None);
    }
    match serde_json::from_value(value) {
        Ok(parsed) => Ok(Some(parsed)),
        Err(error) => {
            tracing::debug!(%error, "ignoring a response field of an unexpected shape");
            Ok(None)
        }
    }
}

/// A text field: a string as is, `null` as absent, any other JSON value re-encoded as
/// JSON text (so an object of arguments is kept, not lost).
///
/// # Errors
///
/// Only when the input is not JSON at all (which the caller reports).
pub(crate) fn text<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    Ok(match Value::deserialize(deserializer)? {
        Value::Null => None,
        Value::String(text) => Some(text),
        other => Some(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Default, Deserialize)]
    #[serde(default)]
    struct Event {
        #[serde(deserialize_with = "super::text")]
        delta: Option<String>,
        #[serde(deserialize_with = "super::option")]
        index: Option<u64>,
        #[serde(deserialize_with = "super::option")]
        parts: Option<Vec<String>>,
    }

    #[test]
    fn fields_of_another_shape_never_fail_the_event() {
        let event: Event = serde_json::from_value(json!({
            "delta": {"stdout": "hi"}, "index": "three", "parts": [1, 2]
        }))
        .unwrap();
        assert_eq!(event.delta.as_deref(), Some(r#"{"stdout":"hi"}"#));
        assert_eq!(event.index, None);
        assert_eq!(event.parts, None);
        let event: Event =
            serde_json::from_value(json!({"delta": "x", "index": 2, "parts": ["a"]})).unwrap();
        assert_eq!(
            (event.delta.as_deref(), event.index, event.parts),
            (Some("x"), Some(2), Some(vec!["a".to_owned()]))
        );
        let event: Event = serde_json::from_value(json!({"delta": null})).unwrap();
        assert_eq!(event.delta, None);
    }
}
