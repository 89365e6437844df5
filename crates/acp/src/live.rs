//! The sessions open on a connection ([`Live`]): each one's kernel, the turn it runs and
//! how prompts sent meanwhile join it, and the observer that sends its durable events,
//! rendered, to the client ([`LiveUpdates`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    McpServer, PromptResponse, SessionNotification, SessionUpdate, StopReason,
};
use keel_contracts::{EventKind, FinishReason, RuntimeEvent, Seq, SessionId, Store, StreamDelta};
use keel_host::root::Assembly;
use keel_kernel::{Cancellation, Joined, Observer, Steering, TurnOutcome};

use crate::error::{internal, one_line};
use crate::render;

/// A session this connection created or loaded: its kernel and whether a turn runs.
pub(crate) struct Live {
    pub(crate) id: SessionId,
    pub(crate) assembly: Assembly,
    pub(crate) workspace: PathBuf,
    pub(crate) mcp_servers: Vec<McpServer>,
    pub(crate) running: Mutex<Option<Running>>,
    pub(crate) store: Arc<dyn Store>,
}

/// A prompt turn's answer, once it ended.
pub(crate) type Answer = Option<Result<PromptResponse, agent_client_protocol::Error>>;

/// The turn a session runs: how to cancel it, where prompts sent meanwhile go, and its
/// answer once it ends (for the prompts that joined it).
pub(crate) struct Running {
    pub(crate) cancel: Cancellation,
    pub(crate) steering: Steering,
    pub(crate) answer: tokio::sync::watch::Receiver<Answer>,
}

/// What a `session/prompt` starts.
pub(crate) enum Claim {
    /// A new turn on an idle session.
    Turn {
        session: Arc<Live>,
        input: String,
        cancel: Cancellation,
        steering: Steering,
        answer: tokio::sync::watch::Sender<Answer>,
    },
    /// Input queued into the running turn; answered with that turn's answer.
    Queued { joined: Joined, answer: tokio::sync::watch::Receiver<Answer> },
}

/// The mutex's value, even when a panic elsewhere poisoned it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Live {
    /// Runs one turn and answers with its stop reason.
    pub(crate) async fn run(
        &self,
        input: &str,
        cancel: &Cancellation,
        steering: &Steering,
    ) -> Result<PromptResponse, agent_client_protocol::Error> {
        let kernel = &self.assembly.kernel;
        let report = kernel
            .run_turn_steered(self.id, input, &self.assembly.resolved.run, cancel, steering)
            .await
            .map_err(|error| internal(one_line(&error.to_string())))?;
        let last_finish = match self.store.read(self.id, Seq(0)).await {
            Ok(events) => events.iter().rev().find_map(|event| match &event.kind {
                kind @ EventKind::ModelResponse { finish_reason, .. }
                    if kind.is_conversation_response() =>
                {
                    Some(finish_reason.clone())
                }
                _ => None,
            }),
            Err(_) => None,
        };
        let stop = match report.outcome {
            TurnOutcome::Completed { .. } => match last_finish {
                Some(FinishReason::Refusal | FinishReason::ContentFilter) => StopReason::Refusal,
                _ => StopReason::EndTurn,
            },
            TurnOutcome::Cancelled { .. } => StopReason::Cancelled,
            TurnOutcome::Suspended { reason, .. } => {
                if reason.contains("step budget") {
                    StopReason::MaxTurnRequests
                } else if reason.contains("token budget") {
                    StopReason::MaxTokens
                } else {
                    StopReason::EndTurn
                }
            }
            TurnOutcome::Denied { .. } => StopReason::EndTurn,
            TurnOutcome::Failed { reason } => match last_finish {
                Some(FinishReason::Length) => StopReason::MaxTokens,
                Some(FinishReason::Refusal | FinishReason::ContentFilter) => StopReason::Refusal,
                _ => return Err(internal(format!("the run failed: {}", one_line(&reason)))),
            },
        };
        Ok(PromptResponse::new(stop))
    }
}

/// The observer of a session's runs: each durable event, rendered, to the client.
pub(crate) struct LiveUpdates {
    pub(crate) cx: ConnectionTo<Client>,
    pub(crate) session: Arc<OnceLock<SessionId>>,
    pub(crate) renderer: Mutex<render::Renderer>,
}

impl std::fmt::Debug for LiveUpdates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveUpdates").field("session", &self.session.get()).finish()
    }
}

impl Observer for LiveUpdates {
    fn on_event(&self, event: &RuntimeEvent) {
        // Child sessions and the session's own creation are not the client's to see.
        if self.session.get() != Some(&event.session_id) {
            return;
        }
        let updates = lock(&self.renderer).render(event);
        for update in updates {
            // The client sent the prompt itself; it is replayed only by session/load.
            if matches!(update, SessionUpdate::UserMessageChunk(_)) {
                continue;
            }
            let _ = self
                .cx
                .send_notification(SessionNotification::new(event.session_id.to_string(), update));
        }
    }

    fn on_delta(&self, _delta: &StreamDelta) {}
}
