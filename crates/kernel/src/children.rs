//! Sub-agents (DESIGN.md §4): how the kernel carries out `spawn_agent`, `wait_agent`,
//! `list_agents` and `read_agent_output` (the tools themselves are intrinsics, see
//! `intrinsic/agents.rs`). Children shrink, never escape.
//!
//! - A child's tools are [`child_allowance`]: the parent's read tools its own scope allows
//!   (a request for anything else is refused); the parent's envelope and execution mode
//!   bind the child verbatim; its budgets count from zero but never exceed what the parent
//!   has left; it is a durable session with lineage; it gets no memory or instructions of
//!   the parent's, only its task text; cancelling the parent cancels it.
//! - Children run to completion inside `spawn_agent`, whose result is the child's final
//!   text; `wait_agent` and `read_agent_output` read a child's recorded outcome from its
//!   ledger (so a resumed parent can still read it). Concurrent children are future work.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use keel_contracts::{
    Budget, EventKind, Lineage, Outcome, REFUSAL_CHILD_TOOLS, RequestPurpose, Seq, SessionId, Tool,
    ToolOutput, ToolSpec, child_allowance,
};
use serde::Deserialize;

use crate::intrinsic::{
    AgentAnswer, AgentCall, Children, LIST_AGENTS, READ_AGENT_OUTPUT, SPAWN_AGENT, WAIT_AGENT,
};

#[derive(Deserialize)]
struct SpawnArguments {
    task: String,
    #[serde(default)]
    tools: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct AgentIdArgument {
    agent_id: String,
}

impl crate::Kernel {
    pub(crate) async fn carry_out_agent_call(
        &self,
        call: AgentCall<'_>,
    ) -> crate::Result<AgentAnswer> {
        match call.tool {
            SPAWN_AGENT => self.spawn_agent(call).await,
            WAIT_AGENT | READ_AGENT_OUTPUT => {
                let Ok(argument) =
                    serde_json::from_value::<AgentIdArgument>(call.arguments.clone())
                else {
                    return Ok(AgentAnswer::text(
                        Outcome::Error,
                        "error: agent_id is required".into(),
                    ));
                };
                self.read_child(call.session_id, &argument.agent_id, call.tool == WAIT_AGENT).await
            }
            LIST_AGENTS => self.list_children(call.session_id).await,
            other => Ok(AgentAnswer::text(
                Outcome::Error,
                format!("error: unknown agent tool '{other}'"),
            )),
        }
    }

    async fn spawn_agent(&self, call: AgentCall<'_>) -> crate::Result<AgentAnswer> {
        let Ok(arguments) = serde_json::from_value::<SpawnArguments>(call.arguments.clone()) else {
            return Ok(AgentAnswer::text(
                Outcome::Error,
                "error: spawn_agent needs a `task`".into(),
            ));
        };
        let parent_events = self.deps.store.read(call.session_id, Seq(0)).await?;
        let Some(EventKind::SessionCreated { workspace, model, envelope, mode, base_url, .. }) =
            parent_events.first().map(|event| &event.kind)
        else {
            return Err(crate::KernelError::SessionNotFound(call.session_id));
        };
        let parent_tools: Vec<ToolSpec> = self.registry.specs().cloned().collect();
        let allowance = child_allowance(&parent_tools, envelope);
        let wanted = arguments.tools.unwrap_or_else(|| allowance.clone());
        let outside: Vec<&String> =
            wanted.iter().filter(|name| !allowance.contains(name)).collect();
        if !outside.is_empty() {
            let names: Vec<&str> = outside.iter().map(|name| name.as_str()).collect();
            return Ok(AgentAnswer::text(
                Outcome::Refused,
                format!("{REFUSAL_CHILD_TOOLS}; not allowed: {}", names.join(", ")),
            ));
        }
        let tools: Vec<Arc<dyn Tool>> = self
            .deps
            .tools
            .iter()
            .filter(|tool| wanted.contains(&tool.spec().name))
            .cloned()
            .collect();
        let child = match self.child_kernel(tools) {
            Ok(child) => child,
            Err(error) => return Ok(AgentAnswer::text(Outcome::Error, format!("error: {error}"))),
        };
        let child_config = crate::SessionConfig {
            workspace: workspace.into(),
            model_spec: model.clone(),
            envelope: envelope.clone(),
            mode: *mode,
            base_url: base_url.clone(),
        };
        let lineage = Lineage {
            parent_session_id: call.session_id,
            parent_run_id: call.run_id,
            parent_turn_id: call.turn_id,
            parent_call_id: call.call_id.clone(),
        };
        let child_session = child.create_session_with(&child_config, Some(lineage)).await?;
        let mut run_config = call.run_config.clone();
        run_config.instructions.clear();
        run_config.budget = child_budget(call.remaining);
        let cancel = call.cancel.child();
        let report =
            Box::pin(child.run_turn(child_session, &arguments.task, &run_config, &cancel)).await?;
        let (outcome, text) = match &report.outcome {
            crate::TurnOutcome::Completed { text } => (Outcome::Ok, format!("completed: {text}")),
            crate::TurnOutcome::Failed { reason } => (Outcome::Error, format!("failed: {reason}")),
            crate::TurnOutcome::Suspended { reason, report } => {
                (Outcome::Ok, format!("suspended ({reason}): {report}"))
            }
            crate::TurnOutcome::Cancelled { reason } => {
                (Outcome::Cancelled, format!("cancelled: {reason}"))
            }
            crate::TurnOutcome::Denied { reason } => {
                (Outcome::Refused, format!("denied: {reason}"))
            }
        };
        Ok(AgentAnswer {
            output: ToolOutput {
                outcome,
                content: format!("agent {child_session} {text}"),
                raw: None,
            },
            spent: report.usage,
        })
    }

    async fn child_of(&self, parent: SessionId, agent_id: &str) -> Result<SessionId, String> {
        let child =
            self.deps.store.resolve_session(agent_id).await.map_err(|e| format!("error: {e}"))?;
        let events =
            self.deps.store.read(child, Seq(0)).await.map_err(|e| format!("error: {e}"))?;
        match events.first().map(|event| &event.kind) {
            Some(EventKind::SessionCreated { lineage: Some(lineage), .. })
                if lineage.parent_session_id == parent =>
            {
                Ok(child)
            }
            _ => Err(format!("error: {agent_id} is not a child agent of this session")),
        }
    }

    async fn read_child(
        &self,
        parent: SessionId,
        agent_id: &str,
        with_outcome: bool,
    ) -> crate::Result<AgentAnswer> {
        let child = match self.child_of(parent, agent_id).await {
            Ok(child) => child,
            Err(message) => return Ok(AgentAnswer::text(Outcome::Error, message)),
        };
        let events = self.deps.store.read(child, Seq(0)).await?;
        let last_text =
            events.iter().rev().find_map(|event| match &event.kind {
                EventKind::ModelResponse {
                    text, purpose: RequestPurpose::Conversation, ..
                } if !text.is_empty() => Some(text.clone()),
                _ => None,
            });
        let terminal =
            events.iter().rev().find(|event| event.kind.is_run_terminal()).map(|e| e.kind.name());
        let text = last_text.unwrap_or_default();
        let content = if with_outcome {
            format!("agent {child} {}: {text}", terminal.unwrap_or("running"))
        } else {
            text
        };
        Ok(AgentAnswer::text(Outcome::Ok, content))
    }

    async fn list_children(&self, parent: SessionId) -> crate::Result<AgentAnswer> {
        let sessions = self.deps.store.sessions().await?;
        let lines: Vec<String> = sessions
            .iter()
            .filter(|session| session.parent == Some(parent))
            .map(|session| format!("{} {} {}", session.id, session.status.as_str(), session.title))
            .collect();
        let content =
            if lines.is_empty() { "no child agents".to_owned() } else { lines.join("\n") };
        Ok(AgentAnswer::text(Outcome::Ok, content))
    }
}

impl Children for crate::Kernel {
    fn carry_out<'a>(
        &'a self,
        call: AgentCall<'a>,
    ) -> Pin<Box<dyn Future<Output = crate::Result<AgentAnswer>> + Send + 'a>> {
        Box::pin(self.carry_out_agent_call(call))
    }
}

/// Remaining budget of the parent as the child's ceiling.
pub(crate) fn child_budget(remaining: Budget) -> Budget {
    Budget::default().min(&remaining)
}
