//! Tool specifications, the [`Tool`] trait and tool outcomes.

use std::fmt::Debug;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{SandboxMode, SessionId, ToolCallId};

/// Whether a tool reads or changes the world. Declared by the tool, never inferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Observes state without changing it.
    Read,
    /// May change files, processes or anything outside keel.
    Write,
}

impl Access {
    /// The wire spelling: `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// How far a tool's traffic may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Egress {
    /// No network traffic.
    None,
    /// Traffic to the user's own or loopback services.
    Internal,
    /// Traffic to the outside world: exfiltration-shaped, so consent is required.
    External,
}

/// The declared effects of a tool, beside its [`Access`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Effects {
    /// Network reach.
    pub egress: Egress,
    /// Whether running it twice with the same arguments has the effect of running it once.
    pub idempotent: bool,
    /// Whether its effect can be undone.
    pub reversible: bool,
}

impl Effects {
    /// No network, idempotent, reversible: what a plain local read has.
    pub const LOCAL_READ: Effects =
        Effects { egress: Egress::None, idempotent: true, reversible: true };
    /// No network, not idempotent, not reversible: the cautious default for a write.
    pub const LOCAL_WRITE: Effects =
        Effects { egress: Egress::None, idempotent: false, reversible: false };
}

/// What a tool is, as the registry and the gates see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by (`read_file`, `mcp__server__tool`).
    pub name: String,
    /// The description shown to the model.
    pub description: String,
    /// A JSON Schema (2020-12) for the arguments object.
    pub parameters: serde_json::Value,
    /// Declared access kind.
    pub access: Access,
    /// Declared effects.
    pub effects: Effects,
    /// Intrinsic tools are how the agent thinks (todo, plan, spawn_agent, read_tool_result):
    /// exempt from reads/writes scope, still refusable through `forbidden`. Set only by the
    /// registry merge for keel's own intrinsic tools; a workspace or MCP tool never is.
    pub intrinsic: bool,
    /// Attested by the host as a first-party read (keel's own built-in file readers); only
    /// these and intrinsic tools execute in shadow mode.
    pub first_party: bool,
}

/// How a tool call ended, as recorded in every `tool_result`.
///
/// A withheld call is never a successful one: consumers match this value, never the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The tool ran and did what was asked (a command that exited non-zero is still `ok`).
    Ok,
    /// The call could not be carried out: unknown tool, invalid arguments, tool failure.
    Error,
    /// A gate refused the call: envelope scope, `forbidden`, or a permission denial.
    Refused,
    /// Shadow mode withheld the call; its intent is in a `shadow_intent` event.
    ShadowDenied,
    /// The run was cancelled before the call finished.
    Cancelled,
    /// The call was prepared but no result was recorded (a crash): its effect is unknown.
    Indeterminate,
}

impl Outcome {
    /// The wire spelling (`ok`, `error`, `refused`, `shadow_denied`, `cancelled`,
    /// `indeterminate`).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Refused => "refused",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::Cancelled => "cancelled",
            Outcome::Indeterminate => "indeterminate",
        }
    }
}

/// What a tool returns to the kernel. Never an `Err`: failures are data for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// `Ok` or `Error`; gates produce the other outcomes, not tools.
    pub outcome: Outcome,
    /// The text the model sees (UTF-8; tools make binary output safe before returning).
    pub content: String,
    /// The exact bytes `content` shows, when it shows some of them as escapes
    /// (see [`crate::ExactText`]); recorded in the `tool_result` beside `content`.
    pub raw: Option<crate::RawBytes>,
}

impl ToolOutput {
    /// A successful result.
    pub fn ok(content: impl Into<String>) -> ToolOutput {
        ToolOutput { outcome: Outcome::Ok, content: content.into(), raw: None }
    }

    /// A failed result with a model-readable reason.
    pub fn error(content: impl Into<String>) -> ToolOutput {
        ToolOutput { outcome: Outcome::Error, content: content.into(), raw: None }
    }

    /// A result built from [`crate::ExactText`]: its text (with the escape note when
    /// anything was escaped) and its exact bytes when they differ from the text.
    pub fn exact(outcome: Outcome, text: crate::ExactText) -> ToolOutput {
        let (content, raw) = text.finish();
        ToolOutput { outcome, content, raw }
    }
}

/// What a tool knows about the call it serves.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The session's workspace root (canonical path).
    pub workspace: PathBuf,
    /// The session the call belongs to.
    pub session_id: SessionId,
    /// The call being served.
    pub call_id: ToolCallId,
    /// The boundary commands and file access must run inside.
    pub sandbox: SandboxMode,
    /// Extra room the user granted the session (`request_boundary`), beyond the workspace.
    pub boundary: crate::Boundary,
    /// Paths the session's deny rules deny for reading: commands run with them masked,
    /// searches and listings skip them ([`crate::PermissionRules::denied_paths`]).
    pub denied_paths: crate::DeniedPaths,
    /// Paths the session's deny rules deny for writing only: commands run with them
    /// read-only ([`crate::PermissionRules::write_denied_paths`]).
    pub write_denied_paths: crate::DeniedPaths,
    /// How the tool asks the user a question during this call (an MCP server's
    /// elicitation), recorded in the ledger; `None` when no one can be asked (keel's own
    /// tools, tests, `keel mcp` commands).
    pub elicitor: Option<std::sync::Arc<dyn crate::Elicitor>>,
}

/// A tool the kernel can invoke.
#[async_trait]
pub trait Tool: Send + Sync + Debug {
    /// The tool's declared specification.
    fn spec(&self) -> &ToolSpec;

    /// Runs the tool with arguments already validated against [`ToolSpec::parameters`].
    ///
    /// # Cancel safety
    ///
    /// The kernel drops this future when a run is cancelled; an implementation must leave
    /// nothing running when dropped (child processes are killed with their process group).
    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput;
}

/// Tools that may change while a session runs (an MCP server's
/// `notifications/tools/list_changed`): the kernel compares [`ToolSource::generation`]
/// at each step boundary and, when it moved, offers [`ToolSource::tools`] instead of the
/// source's earlier tools from the next model request on.
pub trait ToolSource: Send + Sync + Debug {
    /// How many times the list changed since the source was made (0: unchanged).
    fn generation(&self) -> u64;

    /// Every tool the source offers now, in order.
    fn tools(&self) -> Vec<std::sync::Arc<dyn Tool>>;
}

/// The lowercase hex SHA-256 of `bytes`, as recorded in `arguments_sha256` and the
/// composition hashes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The lowercase hex SHA-256 of a tool call's `arguments` as canonical JSON: object keys
/// sorted (by their UTF-8 bytes) at every depth, no whitespace, scalars as serde_json
/// writes them. The same arguments give the same digest whatever order the model wrote
/// the keys in, and whether or not serde_json keeps insertion order in this build (its
/// `preserve_order` feature, which a dependency may switch on). Execution grants and the
/// repeated-failure guard key on it.
///
/// # Examples
///
/// ```
/// use keel_contracts::arguments_sha256;
/// let a = serde_json::json!({"path": "a", "extra": {"y": 1, "x": [true, null]}});
/// let b: serde_json::Value =
///     serde_json::from_str(r#"{"extra":{"x":[true,null],"y":1},"path":"a"}"#).unwrap();
/// assert_eq!(arguments_sha256(&a), arguments_sha256(&b));
/// assert_ne!(arguments_sha256(&a), arguments_sha256(&serde_json::json!({"path": "b"})));
/// ```
pub fn arguments_sha256(arguments: &serde_json::Value) -> String {
    let mut text = String::new();
    write_canonical(arguments, &mut text);
    sha256_hex(text.as_bytes())
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (index, (key, value)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}
