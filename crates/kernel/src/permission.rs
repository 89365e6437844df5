//! The permission hook: how consent is asked for (DESIGN.md §2, "Consent").

use std::fmt::Debug;

use async_trait::async_trait;
use keel_contracts::{Access, PermissionAnswer, SessionId, ToolCallId};

/// One consent request, with the tool's real access kind.
#[derive(Debug, Clone)]
pub struct PermissionRequest<'a> {
    /// The session.
    pub session_id: SessionId,
    /// The call.
    pub call_id: &'a ToolCallId,
    /// The tool.
    pub tool: &'a str,
    /// The tool's declared access.
    pub access: Access,
    /// The call's arguments.
    pub arguments: &'a serde_json::Value,
}

/// Answers consent requests: a terminal prompt, a fixed policy, an HTTP client.
#[async_trait]
pub trait PermissionHook: Send + Sync + Debug {
    /// Answers one request; `by` names who answered (`user`, `approval=auto`).
    ///
    /// # Cancel safety
    ///
    /// The kernel drops this future when the run is cancelled; nothing is recorded then.
    async fn decide(&self, request: &PermissionRequest<'_>) -> (PermissionAnswer, String);
}

/// A fixed answer for every request (`--approval auto` / `--approval deny`).
#[derive(Debug, Clone, Copy)]
pub struct StaticPermissions(pub PermissionAnswer);

#[async_trait]
impl PermissionHook for StaticPermissions {
    async fn decide(&self, _request: &PermissionRequest<'_>) -> (PermissionAnswer, String) {
        let by = match self.0 {
            PermissionAnswer::Deny => "approval=deny",
            PermissionAnswer::AllowOnce
            | PermissionAnswer::AllowSession
            | PermissionAnswer::AllowExact => "approval=auto",
        };
        (self.0, by.to_owned())
    }
}
