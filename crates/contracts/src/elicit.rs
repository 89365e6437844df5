//! Questions a tool's server asks the user during a call (MCP `elicitation/create`, form
//! mode): the request, the answer, the [`Elicitor`] a tool asks through, and the pure checks
//! of a form ([`FormSchema`]): which schemas keel shows at all, which answers it sends.
//!
//! The MCP spec restricts a form to a flat object of primitive properties (string, number,
//! integer, boolean, single- and multi-select enums). keel refuses anything else (nested
//! objects, references, huge enums, too many fields) rather than show part of it, and every
//! answer — a person's, a client's, the defaults — is checked against the schema before it
//! is sent.

use std::collections::BTreeSet;
use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// The most fields a form may have.
pub const MAX_FORM_FIELDS: usize = 32;
/// The most values one enum field may offer.
pub const MAX_ENUM_VALUES: usize = 64;
/// The most characters of one string answer (when the schema sets no smaller `maxLength`).
pub const MAX_STRING_ANSWER: usize = 4096;

/// One question from a tool's server, as the tool hands it to keel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElicitationRequest {
    /// Who asks: the MCP server's name (untrusted only in what it says, not in its name,
    /// which comes from the user's config).
    pub server: String,
    /// The server's message to the user (untrusted text).
    pub message: String,
    /// The requested schema as the server sent it.
    pub schema: serde_json::Value,
}

/// What the user did with a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationAction {
    /// Answered: the content goes to the server.
    Accept,
    /// Said no (or keel declined for them, with a reason).
    Decline,
    /// Dismissed without a choice: the run was cancelled, the wait timed out, the server
    /// stopped waiting, or the process ended.
    Cancel,
}

impl ElicitationAction {
    /// The wire spelling: `accept`, `decline`, `cancel`.
    pub fn as_str(self) -> &'static str {
        match self {
            ElicitationAction::Accept => "accept",
            ElicitationAction::Decline => "decline",
            ElicitationAction::Cancel => "cancel",
        }
    }
}

/// keel's answer to one question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElicitationAnswer {
    /// Accept, decline or cancel.
    pub action: ElicitationAction,
    /// The answer, for `accept`: an object matching the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<serde_json::Value>,
    /// Who answered (`user`, `approval=auto`, `remote (keel serve)`, `keel`).
    pub by: String,
    /// Why it was declined or cancelled, when keel knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ElicitationAnswer {
    /// An accepted answer.
    pub fn accept(content: serde_json::Value, by: impl Into<String>) -> ElicitationAnswer {
        ElicitationAnswer {
            action: ElicitationAction::Accept,
            content: Some(content),
            by: by.into(),
            reason: None,
        }
    }

    /// A declined question, with why.
    pub fn decline(by: impl Into<String>, reason: impl Into<String>) -> ElicitationAnswer {
        ElicitationAnswer {
            action: ElicitationAction::Decline,
            content: None,
            by: by.into(),
            reason: Some(reason.into()),
        }
    }

    /// A cancelled question, with why.
    pub fn cancel(by: impl Into<String>, reason: impl Into<String>) -> ElicitationAnswer {
        ElicitationAnswer {
            action: ElicitationAction::Cancel,
            content: None,
            by: by.into(),
            reason: Some(reason.into()),
        }
    }
}

/// How a tool asks the user a question during a call: the kernel hands one to each call it
/// carries out ([`crate::ToolContext::elicitor`]), records the question and its answer in
/// the ledger and asks through the run's consent channel.
#[async_trait]
pub trait Elicitor: Send + Sync + Debug {
    /// Asks `request` and waits for the answer (never an error: a question that cannot be
    /// asked is declined, one that is abandoned is cancelled, each with its reason).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the question; the kernel records it as cancelled.
    async fn elicit(&self, request: ElicitationRequest) -> ElicitationAnswer;
}

/// What one form field takes.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldKind {
    /// Text, within optional length bounds.
    Text {
        /// Fewest characters.
        min_length: Option<u64>,
        /// Most characters.
        max_length: Option<u64>,
    },
    /// A number (`integer`: a whole one), within optional bounds.
    Number {
        /// Whether only whole numbers are valid.
        integer: bool,
        /// Smallest value.
        minimum: Option<f64>,
        /// Largest value.
        maximum: Option<f64>,
    },
    /// `true` or `false`.
    Boolean,
    /// One of the values (titles beside them when the schema gives some).
    Choice {
        /// The values.
        values: Vec<String>,
        /// A title per value, or the value itself.
        titles: Vec<String>,
    },
    /// Several of the values.
    Choices {
        /// The values.
        values: Vec<String>,
        /// Fewest picks.
        min_items: Option<u64>,
        /// Most picks.
        max_items: Option<u64>,
    },
}

/// One field of a form.
#[derive(Debug, Clone, PartialEq)]
pub struct FormField {
    /// The property name (the key of the answer).
    pub name: String,
    /// The schema's `title`, when it has one (untrusted text).
    pub title: Option<String>,
    /// The schema's `description` (untrusted text).
    pub description: Option<String>,
    /// What it takes.
    pub kind: FieldKind,
    /// Whether an answer must give it.
    pub required: bool,
    /// The schema's default, when it is a valid value of the field.
    pub default: Option<serde_json::Value>,
}

/// A form schema keel accepts: flat primitive properties, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct FormSchema {
    /// The fields, in the schema's order.
    pub fields: Vec<FormField>,
}

impl FormSchema {
    /// Reads a requested schema. `Err` names why keel refuses it: not an object schema, a
    /// property that is not a flat primitive (an object, an array of anything but enum
    /// values, a `$ref`), more than [`MAX_FORM_FIELDS`] fields or [`MAX_ENUM_VALUES`]
    /// values, a required name with no property.
    pub fn parse(schema: &serde_json::Value) -> Result<FormSchema, String> {
        let Some(object) = schema.as_object() else {
            return Err("the requested schema is not a JSON object".to_owned());
        };
        if object.get("type").and_then(|t| t.as_str()) != Some("object") {
            return Err("the requested schema's type is not \"object\"".to_owned());
        }
        let empty = serde_json::Map::new();
        let properties = match object.get("properties") {
            None => &empty,
            Some(serde_json::Value::Object(properties)) => properties,
            Some(_) => return Err("the requested schema's properties are not an object".to_owned()),
        };
        if properties.len() > MAX_FORM_FIELDS {
            return Err(format!(
                "the form has {} fields; keel shows at most {MAX_FORM_FIELDS}",
                properties.len()
            ));
        }
        let mut required = BTreeSet::new();
        match object.get("required") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(names)) => {
                for name in names {
                    let Some(name) = name.as_str() else {
                        return Err("a required name is not a string".to_owned());
                    };
                    if !properties.contains_key(name) {
                        return Err(format!("required field '{}' has no property", clip(name)));
                    }
                    required.insert(name.to_owned());
                }
            }
            Some(_) => return Err("the requested schema's required is not a list".to_owned()),
        }
        let mut fields = Vec::with_capacity(properties.len());
        for (name, property) in properties {
            let kind = field_kind(name, property)?;
            let text = |key: &str| property.get(key).and_then(|v| v.as_str()).map(str::to_owned);
            let mut field = FormField {
                name: name.clone(),
                title: text("title"),
                description: text("description"),
                kind,
                required: required.contains(name),
                default: None,
            };
            // A default that is not a valid value is ignored, never sent.
            if let Some(default) = property.get("default")
                && check_value(&field, default).is_ok()
            {
                field.default = Some(default.clone());
            }
            fields.push(field);
        }
        Ok(FormSchema { fields })
    }

    /// Checks an answer: an object with only the form's fields, every required one
    /// present, each value of its field's type and within its bounds. `Err` names the first
    /// problem.
    pub fn validate(&self, content: &serde_json::Value) -> Result<(), String> {
        let Some(object) = content.as_object() else {
            return Err("the answer is not a JSON object".to_owned());
        };
        for name in object.keys() {
            if !self.fields.iter().any(|field| &field.name == name) {
                return Err(format!("'{}' is not a field of the form", clip(name)));
            }
        }
        for field in &self.fields {
            match object.get(&field.name) {
                None if field.required => {
                    return Err(format!("required field '{}' is missing", clip(&field.name)));
                }
                None => {}
                Some(value) => check_value(field, value)
                    .map_err(|why| format!("field '{}': {why}", clip(&field.name)))?,
            }
        }
        Ok(())
    }

    /// The answer made of the defaults (every field that has one), when every required
    /// field has one; else `Err` naming those that do not.
    pub fn defaults(&self) -> Result<serde_json::Value, String> {
        let mut content = serde_json::Map::new();
        let mut missing = Vec::new();
        for field in &self.fields {
            match &field.default {
                Some(default) => {
                    content.insert(field.name.clone(), default.clone());
                }
                None if field.required => missing.push(clip(&field.name)),
                None => {}
            }
        }
        if !missing.is_empty() {
            return Err(format!("required field(s) {} have no default", missing.join(", ")));
        }
        Ok(serde_json::Value::Object(content))
    }
}

impl FormField {
    /// Reads a typed answer for this field (a terminal line): text as it is, numbers and
    /// booleans (`y`/`yes`/`true`, `n`/`no`/`false`) parsed, a choice by its value or its
    /// number in the list (from 1), several choices separated by commas. `Err` says what is
    /// expected.
    pub fn parse_answer(&self, text: &str) -> Result<serde_json::Value, String> {
        let text = text.trim();
        let value = match &self.kind {
            FieldKind::Text { .. } => serde_json::Value::from(text),
            FieldKind::Number { integer: true, .. } => text
                .parse::<i64>()
                .map(serde_json::Value::from)
                .map_err(|_| "expected a whole number".to_owned())?,
            FieldKind::Number { integer: false, .. } => text
                .parse::<f64>()
                .ok()
                .and_then(|number| serde_json::Number::from_f64(number).map(Into::into))
                .ok_or_else(|| "expected a number".to_owned())?,
            FieldKind::Boolean => match text.to_ascii_lowercase().as_str() {
                "y" | "yes" | "true" => serde_json::Value::Bool(true),
                "n" | "no" | "false" => serde_json::Value::Bool(false),
                _ => return Err("expected y or n".to_owned()),
            },
            FieldKind::Choice { values, .. } => serde_json::Value::from(pick(values, text)?),
            FieldKind::Choices { values, .. } => {
                let mut picked = Vec::new();
                for part in text.split(',').map(str::trim).filter(|part| !part.is_empty()) {
                    picked.push(serde_json::Value::from(pick(values, part)?));
                }
                serde_json::Value::Array(picked)
            }
        };
        check_value(self, &value)?;
        Ok(value)
    }
}

fn pick(values: &[String], text: &str) -> Result<String, String> {
    if let Some(value) = values.iter().find(|value| value.as_str() == text) {
        return Ok(value.clone());
    }
    match text.parse::<usize>() {
        Ok(number) if (1..=values.len()).contains(&number) => Ok(values[number - 1].clone()),
        _ => Err(format!("expected one of the {} listed values (or its number)", values.len())),
    }
}

fn clip(text: &str) -> String {
    let cleaned: String = text.chars().filter(|c| !c.is_control()).take(64).collect::<String>();
    cleaned
}

fn bound(property: &serde_json::Value, key: &str) -> Result<Option<u64>, String> {
    match property.get(key) {
        None => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| format!("{key} is not a count")),
    }
}

fn number_bound(property: &serde_json::Value, key: &str) -> Result<Option<f64>, String> {
    match property.get(key) {
        None => Ok(None),
        Some(value) => value.as_f64().map(Some).ok_or_else(|| format!("{key} is not a number")),
    }
}

/// An enum's values and a title for each.
type Listed = (Vec<String>, Vec<String>);

/// The enum values of a single-select property (`enum`, or `oneOf`/`anyOf` of `const`s
/// with titles), when it is one.
fn enum_values(property: &serde_json::Value) -> Result<Option<Listed>, String> {
    let listed = |items: &Vec<serde_json::Value>| -> Result<Listed, String> {
        if items.len() > MAX_ENUM_VALUES {
            return Err(format!(
                "an enum of {} values; keel shows at most {MAX_ENUM_VALUES}",
                items.len()
            ));
        }
        let mut values = Vec::new();
        let mut titles = Vec::new();
        for item in items {
            let (value, title) = match item {
                serde_json::Value::String(value) => (value.clone(), value.clone()),
                serde_json::Value::Object(option) => {
                    let Some(value) = option.get("const").and_then(|c| c.as_str()) else {
                        return Err("an enum option without a string const".to_owned());
                    };
                    let title = option.get("title").and_then(|t| t.as_str()).unwrap_or(value);
                    (value.to_owned(), title.to_owned())
                }
                _ => return Err("an enum value that is not a string".to_owned()),
            };
            values.push(value);
            titles.push(title);
        }
        if values.is_empty() {
            return Err("an enum with no values".to_owned());
        }
        Ok((values, titles))
    };
    if let Some(items) = property.get("enum") {
        let Some(items) = items.as_array() else { return Err("enum is not a list".to_owned()) };
        let (values, mut titles) = listed(items)?;
        // The legacy `enumNames` titles the values in order.
        if let Some(names) = property.get("enumNames").and_then(|n| n.as_array())
            && names.len() == values.len()
        {
            titles = names
                .iter()
                .zip(&values)
                .map(|(n, v)| n.as_str().unwrap_or(v).to_owned())
                .collect();
        }
        return Ok(Some((values, titles)));
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(items) = property.get(key) {
            let Some(items) = items.as_array() else { return Err(format!("{key} is not a list")) };
            return listed(items).map(Some);
        }
    }
    Ok(None)
}

fn field_kind(name: &str, property: &serde_json::Value) -> Result<FieldKind, String> {
    let refuse = |why: String| format!("field '{}': {why}", clip(name));
    let Some(object) = property.as_object() else {
        return Err(refuse("its schema is not an object".to_owned()));
    };
    for nested in ["$ref", "properties", "allOf", "not", "if", "patternProperties"] {
        if object.contains_key(nested) {
            return Err(refuse(format!(
                "'{nested}' is not a flat primitive field (forms are flat)"
            )));
        }
    }
    let kind = object.get("type").and_then(|t| t.as_str());
    match kind {
        Some("string") => {
            if let Some((values, titles)) = enum_values(property).map_err(refuse)? {
                return Ok(FieldKind::Choice { values, titles });
            }
            Ok(FieldKind::Text {
                min_length: bound(property, "minLength").map_err(refuse)?,
                max_length: bound(property, "maxLength").map_err(refuse)?,
            })
        }
        Some(kind @ ("number" | "integer")) => Ok(FieldKind::Number {
            integer: kind == "integer",
            minimum: number_bound(property, "minimum").map_err(refuse)?,
            maximum: number_bound(property, "maximum").map_err(refuse)?,
        }),
        Some("boolean") => Ok(FieldKind::Boolean),
        Some("array") => {
            let items =
                property.get("items").ok_or_else(|| refuse("an array without items".into()))?;
            match enum_values(items).map_err(refuse)? {
                Some((values, _titles)) => Ok(FieldKind::Choices {
                    values,
                    min_items: bound(property, "minItems").map_err(refuse)?,
                    max_items: bound(property, "maxItems").map_err(refuse)?,
                }),
                None => Err(refuse("an array of anything but enum values".to_owned())),
            }
        }
        Some(other) => Err(refuse(format!("type '{}' is not a primitive", clip(other)))),
        None if enum_values(property).map_err(refuse)?.is_some() => {
            let (values, titles) = enum_values(property).map_err(refuse)?.unwrap_or_default();
            Ok(FieldKind::Choice { values, titles })
        }
        None => Err(refuse("no type".to_owned())),
    }
}

fn check_value(field: &FormField, value: &serde_json::Value) -> Result<(), String> {
    match &field.kind {
        FieldKind::Text { min_length, max_length } => {
            let Some(text) = value.as_str() else { return Err("expected text".to_owned()) };
            let length = text.chars().count() as u64;
            let most = max_length.unwrap_or(MAX_STRING_ANSWER as u64).min(MAX_STRING_ANSWER as u64);
            if length > most {
                return Err(format!("at most {most} characters"));
            }
            if let Some(least) = min_length
                && length < *least
            {
                return Err(format!("at least {least} characters"));
            }
        }
        FieldKind::Number { integer, minimum, maximum } => {
            let Some(number) = value.as_f64() else { return Err("expected a number".to_owned()) };
            if *integer && !(value.is_i64() || value.is_u64()) {
                return Err("expected a whole number".to_owned());
            }
            if let Some(least) = minimum
                && number < *least
            {
                return Err(format!("at least {least}"));
            }
            if let Some(most) = maximum
                && number > *most
            {
                return Err(format!("at most {most}"));
            }
        }
        FieldKind::Boolean => {
            if !value.is_boolean() {
                return Err("expected true or false".to_owned());
            }
        }
        FieldKind::Choice { values, .. } => {
            if !value.as_str().is_some_and(|text| values.iter().any(|v| v == text)) {
                return Err("not one of the offered values".to_owned());
            }
        }
        FieldKind::Choices { values, min_items, max_items } => {
            let Some(picked) = value.as_array() else { return Err("expected a list".to_owned()) };
            for item in picked {
                if !item.as_str().is_some_and(|text| values.iter().any(|v| v == text)) {
                    return Err("a pick that is not one of the offered values".to_owned());
                }
            }
            let count = picked.len() as u64;
            if let Some(least) = min_items
                && count < *least
            {
                return Err(format!("at least {least} picks"));
            }
            if let Some(most) = max_items
                && count > *most
            {
                return Err(format!("at most {most} picks"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn form() -> FormSchema {
        FormSchema::parse(&json!({"type": "object", "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8, "default": "Ann"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "score": {"type": "number"},
            "ok": {"type": "boolean", "default": true},
            "color": {"type": "string", "enum": ["red", "green"]},
            "size": {"type": "string", "oneOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 2}
        }, "required": ["name", "age"]}))
        .unwrap()
    }

    #[test]
    fn answers_are_checked_against_the_form() {
        let form = form();
        assert_eq!(form.fields.len(), 7);
        assert!(form.validate(&json!({"name": "Bo", "age": 3})).is_ok());
        assert!(
            form.validate(&json!({"name": "Bo", "age": 3, "score": 1.5, "ok": false,
                "color": "red", "size": "l", "tags": ["a", "c"]}))
                .is_ok()
        );
        let bad = [
            (json!({"name": "Bo"}), "required field 'age'"),
            (json!({"name": "", "age": 3}), "at least 1"),
            (json!({"name": "123456789", "age": 3}), "at most 8"),
            (json!({"name": "Bo", "age": 3.5}), "whole number"),
            (json!({"name": "Bo", "age": 200}), "at most 150"),
            (json!({"name": "Bo", "age": "3"}), "expected a number"),
            (json!({"name": "Bo", "age": 3, "color": "blue"}), "offered values"),
            (json!({"name": "Bo", "age": 3, "tags": ["a", "b", "c"]}), "at most 2 picks"),
            (json!({"name": "Bo", "age": 3, "extra": 1}), "not a field"),
            (json!(["Bo"]), "not a JSON object"),
        ];
        for (answer, why) in bad {
            let error = form.validate(&answer).unwrap_err();
            assert!(error.contains(why), "{answer}: {error}");
        }
    }

    #[test]
    fn defaults_answer_only_when_every_required_field_has_one() {
        assert!(form().defaults().unwrap_err().contains("age"));
        let all = FormSchema::parse(&json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "Ann"},
            "age": {"type": "integer", "default": 30},
            "bad": {"type": "integer", "default": "not a number"},
            "note": {"type": "string"}
        }, "required": ["name", "age"]}))
        .unwrap();
        assert_eq!(all.defaults().unwrap(), json!({"name": "Ann", "age": 30}));
    }

    #[test]
    fn typed_answers_are_parsed_per_field() {
        let form = form();
        let field = |name: &str| form.fields.iter().find(|f| f.name == name).unwrap().clone();
        assert_eq!(field("age").parse_answer(" 42 ").unwrap(), json!(42));
        assert!(field("age").parse_answer("x").is_err());
        assert!(field("age").parse_answer("-1").unwrap_err().contains("at least 0"));
        assert_eq!(field("ok").parse_answer("y").unwrap(), json!(true));
        assert_eq!(field("color").parse_answer("2").unwrap(), json!("green"));
        assert_eq!(field("size").parse_answer("s").unwrap(), json!("s"));
        assert_eq!(field("tags").parse_answer("a, 3").unwrap(), json!(["a", "c"]));
        assert!(field("color").parse_answer("9").is_err());
    }

    #[test]
    fn redteam_mcp_elicit_nested_or_huge_schemas_are_refused() {
        let refused = [
            json!({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}),
            json!({"type": "object", "properties": {"a": {"$ref": "#/x"}}}),
            json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}}}),
            json!({"type": "object", "properties": {"a": {"type": "string",
                "enum": (0..1000).map(|i| i.to_string()).collect::<Vec<_>>()}}}),
            json!({"type": "object", "properties": (0..100)
                .map(|i| (format!("f{i}"), json!({"type": "string"}))).collect::<serde_json::Map<_, _>>()}),
            json!({"type": "object", "properties": {}, "required": ["ghost"]}),
            json!({"type": "array"}),
            json!("form"),
        ];
        for schema in refused {
            assert!(FormSchema::parse(&schema).is_err(), "{schema}");
        }
        // The legitimate neighbour: a flat form with every primitive kind is shown.
        assert_eq!(form().fields.len(), 7);
    }
}
