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

    /// Whether [`PermissionHook::decide`] answers `request` at once, without waiting on
    /// anyone (a fixed policy). Then the kernel does not commit `permission_requested` on its own
    /// before asking: request and answer become durable together with the prepare that
    /// follows (one commit fewer per step). The default, `false`, is right for every hook
    /// that may wait (a prompt, a remote answer): the pending request is durable first.
    fn answers_at_once(&self, _request: &PermissionRequest<'_>) -> bool {
        false
    }
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

    fn answers_at_once(&self, _request: &PermissionRequest<'_>) -> bool {
        true
    }
}
