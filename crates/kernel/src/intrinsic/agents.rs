//! The sub-agent tools (DESIGN.md §4): `spawn_agent`, `wait_agent`, `list_agents`,
//! `read_agent_output`. Their calls are handed to what carries out sub-agent calls
//! ([`Children`], the kernel: see [`crate::children`]), and what a child spent counts
//! against the run.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{
    Access, Budget, Effects, Outcome, RunId, SessionId, Tool, ToolCallId, ToolContext, ToolOutput,
    ToolSpec, TurnId, UsageTotals,
};

use super::{Carried, Intrinsic, IntrinsicCall};
use crate::Cancellation;

/// `spawn_agent`.
pub(crate) const SPAWN_AGENT: &str = "spawn_agent";
/// `wait_agent`.
pub(crate) const WAIT_AGENT: &str = "wait_agent";
/// `list_agents`.
pub(crate) const LIST_AGENTS: &str = "list_agents";
/// `read_agent_output`.
pub(crate) const READ_AGENT_OUTPUT: &str = "read_agent_output";

/// The sub-agent tools (carried out by the kernel through [`Children`], not by
/// [`Tool::invoke`]).
pub(crate) fn agent_tools() -> Vec<Arc<dyn Intrinsic>> {
    let agent_id = serde_json::json!({
        "type": "object",
        "properties": {"agent_id": {"type": "string", "minLength": 1}},
        "required": ["agent_id"],
        "additionalProperties": false
    });
    vec![
        AgentTool::shared(
            SPAWN_AGENT,
            "Delegate a bounded, read-only sub-task to a child agent and get its final answer. \
             The child starts with no memory: put everything it needs in `task`. It can use \
             only read tools (optionally a subset named in `tools`).",
            serde_json::json!({
                "type": "object",
                "properties": {
                    "task": {"type": "string", "minLength": 1},
                    "tools": {"type": "array", "items": {"type": "string"}}
                },
                "required": ["task"],
                "additionalProperties": false
            }),
        ),
        AgentTool::shared(
            WAIT_AGENT,
            "Wait for a child agent and return its outcome and final answer.",
            agent_id.clone(),
        ),
        AgentTool::shared(
            LIST_AGENTS,
            "List this session's child agents with their status.",
            serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false}),
        ),
        AgentTool::shared(READ_AGENT_OUTPUT, "Read a child agent's final answer.", agent_id),
    ]
}

#[derive(Debug)]
struct AgentTool {
    spec: ToolSpec,
}

impl AgentTool {
    fn shared(name: &str, description: &str, parameters: serde_json::Value) -> Arc<dyn Intrinsic> {
        Arc::new(AgentTool {
            spec: ToolSpec {
                name: name.to_owned(),
                description: description.to_owned(),
                parameters,
                access: Access::Read,
                effects: Effects::LOCAL_READ,
                intrinsic: true,
                first_party: true,
            },
        })
    }
}

#[async_trait]
impl Tool for AgentTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error("error: sub-agent tools are carried out by the kernel")
    }
}

#[async_trait]
impl Intrinsic for AgentTool {
    async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> crate::Result<Carried> {
        let agent_call = AgentCall {
            tool: &self.spec.name,
            arguments: &call.tool_call.arguments,
            session_id: call.ledger.session_id,
            turn_id: call.turn_id,
            run_id: call.run_id,
            call_id: &call.tool_call.call_id,
            cancel: call.cancel,
            remaining: call.settlement.remaining(),
            run_config: call.settlement.run_config(),
        };
        let answer = call.settlement.children().carry_out(agent_call).await?;
        call.settlement.absorb_child_spent(&answer.spent);
        Ok(Carried::output(answer.output))
    }
}

/// One sub-agent tool call, with what the kernel needs to carry it out.
pub(crate) struct AgentCall<'a> {
    pub(crate) tool: &'a str,
    pub(crate) arguments: &'a serde_json::Value,
    pub(crate) session_id: SessionId,
    pub(crate) turn_id: TurnId,
    pub(crate) run_id: RunId,
    pub(crate) call_id: &'a ToolCallId,
    pub(crate) cancel: &'a Cancellation,
    /// What the parent run has left; the child's budget never exceeds it.
    pub(crate) remaining: Budget,
    /// The parent run's configuration (boundary, approval, rules, price) for the child.
    pub(crate) run_config: &'a crate::RunConfig,
}

/// The answer to a sub-agent call, and what the child spent (counted against the parent).
pub(crate) struct AgentAnswer {
    pub(crate) output: ToolOutput,
    pub(crate) spent: UsageTotals,
}

impl AgentAnswer {
    /// An answer with `outcome` and `content`, nothing spent.
    pub(crate) fn text(outcome: Outcome, content: String) -> AgentAnswer {
        AgentAnswer {
            output: ToolOutput { outcome, content, raw: None },
            spent: UsageTotals::default(),
        }
    }
}

/// Carries out sub-agent calls; implemented by the kernel. Boxed so a child's run, which
/// may itself spawn, does not make the run future infinitely large.
pub(crate) trait Children: Send + Sync {
    fn carry_out<'a>(
        &'a self,
        call: AgentCall<'a>,
    ) -> Pin<Box<dyn Future<Output = crate::Result<AgentAnswer>> + Send + 'a>>;
}
