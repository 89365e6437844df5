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

use std::cell::Cell;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

thread_local! {
    /// Set while [`parse`] makes its first, strict attempt: [`option`] and [`text`] then
    /// read their field as its exact type, without building a `Value` first.
    static STRICT: Cell<bool> = const { Cell::new(false) };
}

/// Resets [`STRICT`] when the strict attempt ends, even by unwinding.
struct StrictAttempt;

impl StrictAttempt {
    fn enter() -> StrictAttempt {
        STRICT.with(|strict| strict.set(true));
        StrictAttempt
    }
}

impl Drop for StrictAttempt {
    fn drop(&mut self) {
        STRICT.with(|strict| strict.set(false));
    }
}

/// Parses `data` as `T`, whose fields use [`option`] and [`text`]: first strictly (every
/// such field of its exact type or `null`, read straight into that type), and when that
/// fails, once more leniently, where a field of another shape reads as absent or as its
/// JSON text. The two agree whenever the strict attempt succeeds (a field of the exact type
/// reads the same both ways), so the result is the lenient parse's; only the common case,
/// a well-formed event, skips building and re-reading a `Value` per field.
///
/// # Errors
///
/// The lenient parse's error: only when `data` is not JSON of `T`'s outer shape.
pub(crate) fn parse<T: DeserializeOwned>(data: &str) -> serde_json::Result<T> {
    let strict = {
        let _attempt = StrictAttempt::enter();
        serde_json::from_str(data)
    };
    match strict {
        Ok(parsed) => Ok(parsed),
        Err(_) => serde_json::from_str(data),
    }
}

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
    if STRICT.with(Cell::get) {
        return Option::<T>::deserialize(deserializer);
    }
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
    if STRICT.with(Cell::get) {
        return Option::<String>::deserialize(deserializer);
    }
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

    /// [`super::parse`] reads exactly what the lenient parse reads: well-formed events by
    /// the strict attempt, the rest by the lenient one.
    #[test]
    fn parse_agrees_with_the_lenient_parse_on_every_shape() {
        let inputs = [
            r#"{"delta": {"stdout": "hi"}, "index": "three", "parts": [1, 2]}"#,
            r#"{"delta": "x", "index": 2, "parts": ["a"]}"#,
            r#"{"delta": null, "index": null}"#,
            r#"{"index": 1.0, "parts": ["a", null]}"#,
            r#"{"index": 7, "index": 8}"#,
            r#"{"delta": "a\u00e9\n", "index": 18446744073709551615}"#,
            r#"{}"#,
            "[1, 2]",
            "not json",
        ];
        // A duplicate field fails both ways (serde's derive refuses it).
        let fields = |event: Event| (event.delta, event.index, event.parts);
        for input in inputs {
            let lenient =
                serde_json::from_str::<Event>(input).map(fields).map_err(|e| e.to_string());
            let parsed = super::parse::<Event>(input).map(fields).map_err(|e| e.to_string());
            assert_eq!(parsed, lenient, "{input}");
        }
        assert!(super::parse::<Event>("not json").is_err());
        // The strict attempt leaves no trace: a later plain parse is lenient again.
        let event: Event = serde_json::from_str(r#"{"index": "three"}"#).unwrap();
        assert_eq!(event.index, None);
    }
}
