//! [`KeelClient`]: keel's side of an MCP session (rmcp's `ClientHandler`): what keel tells
//! servers about itself, and its answers to what servers ask of it.
//!
//! - `elicitation/create` (a server asks the user a question) is answered by the server's
//!   [`ElicitationPolicy`]: with no one to ask it is declined; under `--approval auto` a
//!   form whose schema gives a default for every required field is accepted with the
//!   defaults. A URL elicitation (open this page) is always declined. Every answer is
//!   kept as an [`Elicitation`] for the composition root to show and record.
//! - `sampling/createMessage` is refused with an error that says keel does not lend its
//!   model to servers (keel does not offer the capability either).

use std::sync::{Arc, Mutex};

// Sampling is deprecated by SEP-2577; keel refuses it, and names its types to do so.
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, ErrorCode, FormElicitationCapability, Implementation,
};
#[allow(deprecated)]
use rmcp::model::{CreateMessageRequestParams, CreateMessageResult};
use rmcp::service::RequestContext;
use rmcp::{ClientHandler, ErrorData, RoleClient};

use crate::connection::OFFERED_PROTOCOL_VERSION;

/// How a server's `elicitation/create` is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ElicitationPolicy {
    /// Decline every request, saying why (no one can be asked: a headless run).
    #[default]
    Decline,
    /// Accept a form whose schema gives a default for every required field, with the
    /// defaults (every defaulted field filled in); decline any other (`--approval auto`).
    AcceptDefaults,
}

/// One `elicitation/create` and keel's answer, in the order they came.
#[derive(Debug, Clone, PartialEq)]
pub struct Elicitation {
    /// The server's name.
    pub server: String,
    /// The server's message to the user (untrusted text: fence it before a model sees it).
    pub message: String,
    /// `accept` or `decline`.
    pub action: &'static str,
    /// What was sent back (the defaults), for an accepted form.
    pub content: Option<serde_json::Value>,
    /// Why it was declined.
    pub reason: Option<String>,
}

/// keel's client handler for one server.
#[derive(Debug, Clone)]
pub(crate) struct KeelClient {
    server: String,
    policy: ElicitationPolicy,
    answered: Arc<Mutex<Vec<Elicitation>>>,
}

impl KeelClient {
    pub(crate) fn new(
        server: &str,
        policy: ElicitationPolicy,
        answered: Arc<Mutex<Vec<Elicitation>>>,
    ) -> KeelClient {
        KeelClient { server: server.to_owned(), policy, answered }
    }
}

/// What keel tells servers about itself: name, version, the offered protocol version, and
/// form elicitation (answered by policy; never sampling or roots).
pub(crate) fn client_info() -> ClientConfig {
    let mut capabilities = ClientCapabilities::default();
    let mut elicitation = ElicitationCapability::default();
    elicitation.form = Some(FormElicitationCapability::default());
    capabilities.elicitation = Some(elicitation);
    ClientConfig::new(capabilities, Implementation::new("keel", env!("CARGO_PKG_VERSION")))
        .with_protocol_version(OFFERED_PROTOCOL_VERSION)
}

impl ClientHandler for KeelClient {
    fn get_info(&self) -> ClientConfig {
        client_info()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let (message, answer) = answer(self.policy, &request);
        let record = Elicitation {
            server: self.server.clone(),
            message,
            action: match answer {
                Ok(_) => "accept",
                Err(_) => "decline",
            },
            content: answer.as_ref().ok().cloned(),
            reason: answer.as_ref().err().cloned(),
        };
        if let Ok(mut answered) = self.answered.lock() {
            answered.push(record);
        }
        Ok(match answer {
            Ok(content) => ElicitResult::new(ElicitationAction::Accept).with_content(content),
            Err(_) => ElicitResult::new(ElicitationAction::Decline),
        })
    }

    #[allow(deprecated)]
    async fn create_message(
        &self,
        _request: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "sampling is not supported: keel does not lend its model to MCP servers",
            None,
        ))
    }
}

/// The request's message and keel's answer: the content to accept with, or why it is
/// declined.
fn answer(
    policy: ElicitationPolicy,
    request: &ElicitRequestParams,
) -> (String, Result<serde_json::Value, String>) {
    let value = serde_json::to_value(request).unwrap_or_default();
    let message = value["message"].as_str().unwrap_or_default().to_owned();
    if value["mode"].as_str() == Some("url") || value.get("url").is_some() {
        return (message, Err("keel does not open pages that a server asks for".to_owned()));
    }
    let answer = match policy {
        ElicitationPolicy::Decline => {
            Err("no one can answer in this run (with `--approval auto`, a form whose fields all \
             have defaults is accepted with them)"
                .to_owned())
        }
        ElicitationPolicy::AcceptDefaults => defaults(&value["requestedSchema"]),
    };
    (message, answer)
}

/// The defaults of a form schema, when every required field has one.
fn defaults(schema: &serde_json::Value) -> Result<serde_json::Value, String> {
    let mut content = serde_json::Map::new();
    if let Some(properties) = schema["properties"].as_object() {
        for (name, property) in properties {
            if let Some(default) = property.get("default") {
                content.insert(name.clone(), default.clone());
            }
        }
    }
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    let missing: Vec<&str> = required
        .iter()
        .filter_map(|name| name.as_str())
        .filter(|name| !content.contains_key(*name))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "required field(s) {} have no default and no one can answer in this run",
            missing.join(", ")
        ));
    }
    Ok(serde_json::Value::Object(content))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(schema: serde_json::Value) -> ElicitRequestParams {
        serde_json::from_value(serde_json::json!({
            "mode": "form", "message": "Pick", "requestedSchema": schema
        }))
        .unwrap()
    }

    #[test]
    fn elicitation_answers_table() {
        let all_defaults = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "Ann"},
            "age": {"type": "integer", "default": 30},
            "ok": {"type": "boolean", "default": true},
            "note": {"type": "string"}
        }, "required": ["name", "age"]});
        let missing = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "Ann"},
            "token": {"type": "string"}
        }, "required": ["name", "token"]});
        let (message, accepted) =
            answer(ElicitationPolicy::AcceptDefaults, &form(all_defaults.clone()));
        assert_eq!(message, "Pick");
        assert_eq!(accepted, Ok(serde_json::json!({"name": "Ann", "age": 30, "ok": true})));
        let (_, refused) = answer_of(ElicitationPolicy::AcceptDefaults, missing);
        assert!(refused.unwrap_err().contains("token"));
        let (_, refused) = answer_of(ElicitationPolicy::Decline, all_defaults);
        assert!(refused.unwrap_err().contains("--approval auto"));
        let url: ElicitRequestParams = serde_json::from_value(serde_json::json!({
            "mode": "url", "message": "Log in", "url": "https://example.com/x",
            "elicitationId": "e1"
        }))
        .unwrap();
        let (_, refused) = answer(ElicitationPolicy::AcceptDefaults, &url);
        assert!(refused.unwrap_err().contains("does not open pages"));
    }

    fn answer_of(
        policy: ElicitationPolicy,
        schema: serde_json::Value,
    ) -> (String, Result<serde_json::Value, String>) {
        answer(policy, &form(schema))
    }

    #[test]
    fn keel_offers_form_elicitation_and_not_sampling() {
        let info = client_info();
        assert!(info.capabilities.elicitation.as_ref().is_some_and(|e| e.form.is_some()));
        assert!(info.capabilities.sampling.is_none());
    }
}
