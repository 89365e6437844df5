//! The scripted model (DESIGN.md §9): a deterministic [`ModelClient`] for offline runs,
//! demos and tests that goes through the whole loop like any provider.
//!
//! The script is JSON: `{"steps": [{"text"?, "tool_calls"?: [{"name", "arguments", "id"?}],
//! "usage"?: {"input_tokens", "output_tokens"}, "expect"?: {"last_outcomes"?, "contains"?},
//! "retries"?: [{"status"?, "error"?, "partial"?, "wait_ms"?}]}]}`.
//! A step's `retries` are failed attempts played before its answer: each streams its
//! `partial` text, then is reported as a [`StreamDelta::Retrying`] (the scripted model does
//! not actually wait).
//! Each request consumes the step at its position, which is the number of model responses
//! already recorded in the session ([`ModelRequest::responses_in_session`]), so a resumed
//! session continues where it stopped.
//!
//! Sub-agents: `"agents": {"TASK": {"steps": [...]}}` gives the script of a child session
//! whose task (its first user message) is exactly `TASK`; its positions count within the
//! child session.
//!
//! Compaction: summary requests ([`RequestPurpose::Compaction`]) are answered with the
//! script's `"compaction"` text (default `Scripted summary of N messages.`) and consume no
//! step.

use std::path::Path;

use async_trait::async_trait;
use keel_contracts::{
    FinishReason, Message, ModelClient, ModelError, ModelErrorKind, ModelInfo, ModelRequest,
    ModelResponse, Outcome, RequestPurpose, RetryNotice, StreamDelta, ToolCall, ToolCallId, Usage,
};
use serde::Deserialize;

/// The largest script file [`ScriptedModel::from_path`] loads, in bytes (16 MiB).
pub const MAX_SCRIPT_BYTES: u64 = 16 * 1024 * 1024;

/// A script that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The path is not a regular file (a FIFO, device or folder): never read, so a named
    /// pipe cannot hang keel.
    #[error(
        "cannot read script {path}: it is not a regular file (a FIFO, device or folder is never read)"
    )]
    NotRegular {
        /// The path given.
        path: String,
    },
    /// The file is larger than [`MAX_SCRIPT_BYTES`].
    #[error(
        "cannot read script {path}: it is {size} bytes, more than the {cap} bytes a script may have"
    )]
    TooLarge {
        /// The path given.
        path: String,
        /// Its size in bytes (as far as it was read).
        size: u64,
        /// [`MAX_SCRIPT_BYTES`].
        cap: u64,
    },
    /// The file is not a valid script.
    #[error("invalid script {path}: {source}")]
    Parse {
        /// The path given.
        path: String,
        /// The JSON error, with line and column.
        source: serde_json::Error,
    },
}

/// A whole script.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The replies, one per model request, in order.
    pub steps: Vec<ScriptStep>,
    /// Scripts of child sessions, by their exact task text.
    #[serde(default)]
    pub agents: std::collections::BTreeMap<String, Script>,
    /// The answer to compaction (summary) requests; they do not consume steps. Absent:
    /// `Scripted summary of N messages.`
    #[serde(default)]
    pub compaction: Option<String>,
}

/// One scripted reply.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    /// Visible text of the reply.
    #[serde(default)]
    pub text: String,
    /// Tool calls of the reply.
    #[serde(default)]
    pub tool_calls: Vec<ScriptCall>,
    /// Usage to report; absent means "not reported".
    #[serde(default)]
    pub usage: Option<ScriptUsage>,
    /// Checks on the request before answering.
    #[serde(default)]
    pub expect: Option<ScriptExpect>,
    /// Failed attempts reported as retries before the answer, in order.
    #[serde(default)]
    pub retries: Vec<ScriptRetry>,
}

/// One scripted failed attempt, reported as a retry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptRetry {
    /// The HTTP status to report; absent: none.
    #[serde(default)]
    pub status: Option<u16>,
    /// The error kind to report (default `server`).
    #[serde(default = "default_retry_error")]
    pub error: String,
    /// Text the failed attempt streamed before it failed.
    #[serde(default)]
    pub partial: String,
    /// The wait to report, in milliseconds (not actually waited).
    #[serde(default)]
    pub wait_ms: u64,
}

fn default_retry_error() -> String {
    "server".to_owned()
}

/// One scripted tool call.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptCall {
    /// The call id; when absent, `call_<step>_<index>` (both from 1).
    #[serde(default)]
    pub id: Option<String>,
    /// The tool name.
    pub name: String,
    /// The arguments object.
    #[serde(default = "empty_object")]
    pub arguments: serde_json::Value,
}

/// Scripted usage, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptUsage {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

/// Expectations checked on the request a step answers.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptExpect {
    /// Outcomes of the tool results sent since the last assistant message, in order.
    #[serde(default)]
    pub last_outcomes: Option<Vec<Outcome>>,
    /// Text that must appear somewhere in the request (system prompt, messages or tools).
    #[serde(default)]
    pub contains: Option<StringOrList>,
}

/// One string or several.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StringOrList {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// The scripted model.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    script: Script,
    name: String,
}

impl ScriptedModel {
    /// A model that answers with `script`; `name` is reported as the model name.
    pub fn new(script: Script, name: impl Into<String>) -> ScriptedModel {
        ScriptedModel { script, name: name.into() }
    }

    /// Loads a script file: a regular file of at most [`MAX_SCRIPT_BYTES`]. It is opened
    /// without blocking and checked on the open descriptor (`fstat`) before any read, so a
    /// FIFO or device at the path (even one swapped in after a look) never hangs the load.
    ///
    /// # Errors
    ///
    /// [`ScriptError::Read`] when the file cannot be read, [`ScriptError::NotRegular`] for
    /// a FIFO, device or folder, [`ScriptError::TooLarge`] past the cap,
    /// [`ScriptError::Parse`] when it is not a script (unknown fields are errors, so typos
    /// do not pass silently).
    pub fn from_path(path: &Path) -> Result<ScriptedModel, ScriptError> {
        use std::io::Read as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let shown = path.display().to_string();
        let read_error = |source| ScriptError::Read { path: shown.clone(), source };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
            .map_err(read_error)?;
        let metadata = file.metadata().map_err(read_error)?;
        if !metadata.is_file() {
            return Err(ScriptError::NotRegular { path: shown });
        }
        let too_large =
            |size| ScriptError::TooLarge { path: shown.clone(), size, cap: MAX_SCRIPT_BYTES };
        if metadata.len() > MAX_SCRIPT_BYTES {
            return Err(too_large(metadata.len()));
        }
        // Read at most one byte past the cap: a file that grows after the look is caught.
        let mut bytes = Vec::new();
        file.take(MAX_SCRIPT_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
        let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        if size > MAX_SCRIPT_BYTES {
            return Err(too_large(size));
        }
        let text = String::from_utf8(bytes).map_err(|error| {
            read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, error))
        })?;
        let script: Script = serde_json::from_str(&text)
            .map_err(|source| ScriptError::Parse { path: shown.clone(), source })?;
        Ok(ScriptedModel::new(script, shown))
    }

    /// The number of steps in the script.
    pub fn len(&self) -> usize {
        self.script.steps.len()
    }

    /// Whether the script has no steps.
    pub fn is_empty(&self) -> bool {
        self.script.steps.is_empty()
    }
}

fn script_error(message: String) -> ModelError {
    ModelError::new(ModelErrorKind::Script, None, message)
}

fn check_expect(
    step_no: usize,
    expect: &ScriptExpect,
    request: &ModelRequest,
) -> Result<(), ModelError> {
    if let Some(want) = &expect.last_outcomes {
        // The results sent since the last assistant message, in order. A user message
        // after them (the budget's last-step notice, a steering note) does not hide them.
        let since_assistant = request
            .messages
            .iter()
            .rposition(|message| matches!(message, Message::Assistant { .. }))
            .map_or(0, |idx| idx + 1);
        let got: Vec<Outcome> = request.messages[since_assistant..]
            .iter()
            .filter_map(|message| match message {
                Message::ToolResult { outcome, .. } => Some(*outcome),
                Message::User { .. } | Message::Assistant { .. } => None,
            })
            .collect();
        if &got != want {
            let show = |outcomes: &[Outcome]| {
                outcomes.iter().map(|o| o.as_str()).collect::<Vec<_>>().join(", ")
            };
            return Err(script_error(format!(
                "script step {step_no}: expected last outcomes [{}], got [{}]",
                show(want),
                show(&got)
            )));
        }
    }
    if let Some(contains) = &expect.contains {
        let haystack = serde_json::to_string(request).unwrap_or_default();
        let haystack_plain = format!(
            "{}\n{}",
            request.system,
            request
                .messages
                .iter()
                .map(|message| match message {
                    Message::User { text } => text.as_str(),
                    Message::Assistant { text, .. } => text.as_str(),
                    Message::ToolResult { content, .. } => content.as_str(),
                })
                .collect::<Vec<_>>()
                .join("\n")
        );
        let needles = match contains {
            StringOrList::One(one) => std::slice::from_ref(one).to_vec(),
            StringOrList::Many(many) => many.clone(),
        };
        for needle in needles {
            if !haystack_plain.contains(&needle) && !haystack.contains(&needle) {
                return Err(script_error(format!(
                    "script step {step_no}: expected the request to contain {needle:?}"
                )));
            }
        }
    }
    Ok(())
}

#[async_trait]
impl ModelClient for ScriptedModel {
    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "scripted".into(), model: self.name.clone(), context_window: None }
    }

    /// Answers with the step at the request's position.
    ///
    /// # Errors
    ///
    /// [`ModelErrorKind::Script`] when the script has no step for the position or an
    /// expectation fails.
    ///
    /// # Cancel safety
    ///
    /// Stateless: dropping the future loses nothing.
    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        if request.purpose == RequestPurpose::Compaction {
            let text = self.script.compaction.clone().unwrap_or_else(|| {
                format!("Scripted summary of {} messages.", request.messages.len())
            });
            return Ok(ModelResponse {
                text,
                reasoning: Vec::new(),
                tool_calls: Vec::new(),
                usage: Usage::default(),
                raw_usage: None,
                finish_reason: FinishReason::Stop,
            });
        }
        let position = usize::try_from(request.responses_in_session).unwrap_or(usize::MAX);
        let step_no = position.saturating_add(1);
        let task = request.messages.iter().find_map(|message| match message {
            Message::User { text } => Some(text.as_str()),
            Message::Assistant { .. } | Message::ToolResult { .. } => None,
        });
        let (script, whose) = match task.and_then(|task| self.script.agents.get(task)) {
            Some(agent) => (agent, format!("agent script {:?}", task.unwrap_or_default())),
            None => (&self.script, "script".to_owned()),
        };
        let Some(step) = script.steps.get(position) else {
            return Err(script_error(format!(
                "{whose} exhausted: request {step_no} but it has {} steps",
                script.steps.len()
            )));
        };
        if let Some(expect) = &step.expect {
            check_expect(step_no, expect, request)?;
        }
        for (retry_idx, retry) in step.retries.iter().enumerate() {
            if !retry.partial.is_empty() {
                on_delta(StreamDelta::Text(retry.partial.clone()));
            }
            on_delta(StreamDelta::Retrying(RetryNotice {
                attempt: u32::try_from(retry_idx).unwrap_or(u32::MAX).saturating_add(2),
                status: retry.status,
                error: retry.error.clone(),
                message: format!("scripted failure ({})", retry.error),
                wait: std::time::Duration::from_millis(retry.wait_ms),
            }));
        }
        if !step.text.is_empty() {
            on_delta(StreamDelta::Text(step.text.clone()));
        }
        let tool_calls: Vec<ToolCall> = step
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                on_delta(StreamDelta::ToolCallStarted { name: call.name.clone() });
                ToolCall {
                    call_id: ToolCallId(
                        call.id.clone().unwrap_or_else(|| format!("call_{step_no}_{}", index + 1)),
                    ),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    arguments_error: None,
                }
            })
            .collect();
        let usage = step.usage.map_or(Usage::default(), |usage| Usage {
            input_tokens: Some(usage.input_tokens),
            output_tokens: Some(usage.output_tokens),
            cached_input_tokens: None,
            reasoning_tokens: None,
        });
        let finish_reason =
            if tool_calls.is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
        Ok(ModelResponse {
            text: step.text.clone(),
            reasoning: Vec::new(),
            tool_calls,
            usage,
            raw_usage: None,
            finish_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Built through serde so that fields this test does not care about keep their
    /// defaults.
    fn request(responses_in_session: u64, messages: Vec<Message>) -> ModelRequest {
        serde_json::from_value(serde_json::json!({
            "model": "m",
            "system": "sys",
            "messages": messages,
            "tools": [],
            "responses_in_session": responses_in_session,
        }))
        .unwrap()
    }

    fn model(json: &str) -> ScriptedModel {
        ScriptedModel::new(serde_json::from_str(json).unwrap(), "test")
    }

    #[tokio::test]
    async fn position_comes_from_the_ledger_count() {
        let model = model(r#"{"steps":[{"text":"one"},{"text":"two"}]}"#);
        let reply = model.complete(&request(1, vec![]), &|_| {}).await.unwrap();
        assert_eq!(reply.text, "two");
        assert_eq!(reply.finish_reason, FinishReason::Stop);
        let err = model.complete(&request(2, vec![]), &|_| {}).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Script);
        assert_eq!(err.message, "script exhausted: request 3 but it has 2 steps");
    }

    #[tokio::test]
    async fn calls_get_deterministic_ids_and_usage() {
        let model = model(
            r#"{"steps":[{"tool_calls":[{"name":"read_file","arguments":{"path":"a"}},{"id":"x","name":"bash","arguments":{"command":"true"}}],"usage":{"input_tokens":10,"output_tokens":2}}]}"#,
        );
        let reply = model.complete(&request(0, vec![]), &|_| {}).await.unwrap();
        assert_eq!(reply.tool_calls[0].call_id.as_str(), "call_1_1");
        assert_eq!(reply.tool_calls[1].call_id.as_str(), "x");
        assert_eq!(reply.finish_reason, FinishReason::ToolCalls);
        assert_eq!(reply.usage.input_tokens, Some(10));
    }

    #[tokio::test]
    async fn expectations_are_checked() {
        let model = model(
            r#"{"steps":[{"text":"done","expect":{"last_outcomes":["ok","refused"],"contains":"the task"}}]}"#,
        );
        let result = |outcome| Message::ToolResult {
            call_id: "c".into(),
            tool: "t".into(),
            outcome,
            content: String::new(),
        };
        let good = request(
            0,
            vec![
                Message::User { text: "the task".into() },
                result(Outcome::Ok),
                result(Outcome::Refused),
            ],
        );
        assert!(model.complete(&good, &|_| {}).await.is_ok());
        let bad = request(0, vec![Message::User { text: "the task".into() }, result(Outcome::Ok)]);
        let err = model.complete(&bad, &|_| {}).await.unwrap_err();
        assert!(err.message.contains("expected last outcomes [ok, refused], got [ok]"), "{err}");
        let missing = request(0, vec![result(Outcome::Ok), result(Outcome::Refused)]);
        let err = model.complete(&missing, &|_| {}).await.unwrap_err();
        assert!(err.message.contains("contain \"the task\""), "{err}");
    }

    #[tokio::test]
    async fn last_outcomes_see_results_before_a_trailing_user_notice() {
        // The budget's last-step notice is a user message after the tool results: the
        // results are still the ones "just sent" since the last assistant message.
        let model = model(r#"{"steps":[{"text":"report","expect":{"last_outcomes":["ok"]}}]}"#);
        let result = |outcome| Message::ToolResult {
            call_id: "c".into(),
            tool: "t".into(),
            outcome,
            content: String::new(),
        };
        let assistant = |text: &str| Message::Assistant {
            text: text.into(),
            reasoning: vec![],
            tool_calls: vec![],
        };
        let with_notice = request(
            0,
            vec![
                Message::User { text: "the task".into() },
                result(Outcome::Refused),
                assistant("calling"),
                result(Outcome::Ok),
                Message::User { text: "Tools are off: write your report.".into() },
            ],
        );
        assert!(model.complete(&with_notice, &|_| {}).await.is_ok());
        // Results before the last assistant message are not the last ones.
        let answered = request(
            0,
            vec![
                Message::User { text: "the task".into() },
                result(Outcome::Ok),
                assistant("done"),
                Message::User { text: "next turn".into() },
            ],
        );
        let err = model.complete(&answered, &|_| {}).await.unwrap_err();
        assert!(err.message.contains("expected last outcomes [ok], got []"), "{err}");
    }

    #[tokio::test]
    async fn a_child_session_follows_its_own_script() {
        let model = model(
            r#"{"steps":[{"text":"parent"}],"agents":{"look around":{"steps":[{"text":"child one"},{"text":"child two"}]}}}"#,
        );
        let child = |n| request(n, vec![Message::User { text: "look around".into() }]);
        assert_eq!(model.complete(&child(1), &|_| {}).await.unwrap().text, "child two");
        let parent = request(0, vec![Message::User { text: "the task".into() }]);
        assert_eq!(model.complete(&parent, &|_| {}).await.unwrap().text, "parent");
        let err = model.complete(&child(2), &|_| {}).await.unwrap_err();
        assert_eq!(
            err.message,
            "agent script \"look around\" exhausted: request 3 but it has 2 steps"
        );
    }

    #[test]
    fn unknown_fields_are_errors() {
        let err = serde_json::from_str::<Script>(r#"{"steps":[{"txt":"typo"}]}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
