//! How a call is allowed: the run's approval mode, the gate's decision and the answer to a
//! permission request.

use serde::{Deserialize, Serialize};

/// How permission requests are answered for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Ask the user at a terminal.
    Ask,
    /// Allow every request, except a wider boundary (`request_boundary`), which needs a
    /// person or an explicit rule in the user's own config.
    Auto,
    /// Allow the calls the managed sandbox contains (commands, file edits inside the
    /// workspace, the boundary never widened); ask for anything else (refuse headless).
    /// Approves nothing when the sandbox is bypassed.
    Sandboxed,
    /// Deny every request.
    Deny,
}

/// A gate's answer for one tool call, as recorded in `gate_decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The call may run without asking.
    Allow,
    /// The call is refused.
    Refuse,
    /// The call needs consent: a permission request follows.
    Ask,
    /// Shadow mode withholds the call.
    Shadow,
}

/// The answer to a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionAnswer {
    /// Allow this call.
    AllowOnce,
    /// Allow this tool for the rest of the session (a durable grant).
    AllowSession,
    /// Allow this exact call (same tool, same arguments) again without asking, until the
    /// grant's mandatory expiry: an execution grant, keyed to the session and the SHA-256
    /// of the arguments.
    AllowExact,
    /// Deny: the call is refused.
    Deny,
}
