//! The permission hook: how consent is asked for (DESIGN.md §2, "Consent").

use std::fmt::Debug;

use async_trait::async_trait;
use keel_contracts::{
    Access, ElicitationAnswer, ElicitationRequest, FormSchema, PermissionAnswer, SessionId,
    ToolCallId,
};

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

/// A question a tool's server asks the user during a call (MCP elicitation), already
/// recorded as `elicitation_requested` and its schema checked.
#[derive(Debug, Clone)]
pub struct ElicitationQuestion<'a> {
    /// The session.
    pub session_id: SessionId,
    /// The call it came during.
    pub call_id: &'a ToolCallId,
    /// The tool.
    pub tool: &'a str,
    /// The question's id (`CALL.qN`, see [`crate::question_id`]), as in the ledger.
    pub question: &'a str,
    /// What the server asked (its message is untrusted text).
    pub request: &'a ElicitationRequest,
    /// The form, as keel read it.
    pub form: &'a FormSchema,
}

/// Why a question is declined when nobody can answer it.
pub const NOBODY_TO_ASK: &str = "no one can answer in this run (with `--approval auto`, a form \
     whose required fields all have defaults is accepted with them)";

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

    /// Answers a server's question (accept with content, decline, cancel). The default
    /// declines: a hook that asks no one has no one to ask. The kernel checks an accepted
    /// answer against the form before it is sent.
    ///
    /// # Cancel safety
    ///
    /// The kernel drops this future when the run is cancelled or the server stops
    /// waiting; it records the question as cancelled then.
    async fn elicit(&self, _question: &ElicitationQuestion<'_>) -> ElicitationAnswer {
        ElicitationAnswer::decline("keel", NOBODY_TO_ASK)
    }

    /// Whether [`PermissionHook::elicit`] answers at once (a fixed policy): then the
    /// question is committed with its answer, not on its own before asking.
    fn elicits_at_once(&self) -> bool {
        false
    }
}

/// The answer of a fixed policy: the form's defaults under `auto` (when every required
/// field has one), else a decline saying why.
pub fn answer_by_policy(allow: bool, form: &FormSchema) -> ElicitationAnswer {
    if !allow {
        return ElicitationAnswer::decline(
            "approval=deny",
            "approval=deny: questions are declined",
        );
    }
    match form.defaults() {
        Ok(content) => ElicitationAnswer::accept(content, "approval=auto"),
        Err(missing) => ElicitationAnswer::decline(
            "approval=auto",
            format!("{missing}, and no one can answer in this run"),
        ),
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

    async fn elicit(&self, question: &ElicitationQuestion<'_>) -> ElicitationAnswer {
        answer_by_policy(self.0 != PermissionAnswer::Deny, question.form)
    }

    fn elicits_at_once(&self) -> bool {
        true
    }
}
