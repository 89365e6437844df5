//! A tool's questions while it runs (an MCP server's elicitation): recorded, asked through
//! the permission hook, checked against their form, answered in order.

use keel_contracts::EventKind;

use super::{Call, CallState, until};
use crate::ledger::Ledger;
use crate::{Cancellation, Result};

impl CallState<'_> {
    /// Records a tool's question (`elicitation_requested`), asks it through the permission
    /// hook (unless keel refuses the form), checks the answer against the form, records it
    /// (`elicitation_answered`, durable before the server gets it) and hands it back. A
    /// cancelled run, a server that stops waiting or the run's deadline end it as `cancel`.
    pub(super) async fn answer_question(
        &self,
        ledger: &mut Ledger,
        call: &Call<'_>,
        number: u32,
        asked: crate::elicit::Asked,
        cancel: &Cancellation,
    ) -> Result<()> {
        use keel_contracts::{ElicitationAction, ElicitationAnswer, FormSchema};
        let crate::elicit::Asked { request, mut reply, .. } = asked;
        let tool_call = call.call;
        let question = crate::elicit::question_id(&tool_call.call_id, number);
        ledger.stage(
            call.turn,
            call.run,
            EventKind::ElicitationRequested {
                call_id: tool_call.call_id.clone(),
                tool: tool_call.name.clone(),
                question: question.clone(),
                server: request.server.clone(),
                message: request.message.clone(),
                schema: request.schema.clone(),
            },
        );
        let answer = match FormSchema::parse(&request.schema) {
            Err(why) => {
                ElicitationAnswer::decline("keel", format!("keel refuses this form: {why}"))
            }
            Ok(form) => {
                let asking = crate::permission::ElicitationQuestion {
                    session_id: ledger.session_id,
                    call_id: &tool_call.call_id,
                    tool: &tool_call.name,
                    question: &question,
                    request: &request,
                    form: &form,
                };
                // A question someone may take time to answer is a ledger fact first.
                if !self.deps.permissions.elicits_at_once() {
                    ledger.commit().await?;
                }
                let answer = tokio::select! {
                    answer = self.deps.permissions.elicit(&asking) => answer,
                    () = cancel.cancelled() => {
                        ElicitationAnswer::cancel("keel", "the run was cancelled")
                    }
                    () = reply.closed() => ElicitationAnswer::cancel(
                        "keel",
                        "the server stopped waiting for the answer (its request timed out or \
                         was cancelled)",
                    ),
                    () = until(self.deadline) => {
                        ElicitationAnswer::cancel("keel", "the run's time budget ran out")
                    }
                };
                match answer.action {
                    ElicitationAction::Accept => {
                        let content = answer
                            .content
                            .clone()
                            .unwrap_or_else(|| serde_json::Value::Object(Default::default()));
                        match form.validate(&content) {
                            Ok(()) => ElicitationAnswer { content: Some(content), ..answer },
                            Err(why) => ElicitationAnswer::decline(
                                "keel",
                                format!(
                                    "the answer ({}) does not match the form: {why}; nothing of \
                                     it was sent",
                                    answer.by
                                ),
                            ),
                        }
                    }
                    ElicitationAction::Decline | ElicitationAction::Cancel => {
                        ElicitationAnswer { content: None, ..answer }
                    }
                }
            }
        };
        ledger.stage(
            call.turn,
            call.run,
            EventKind::ElicitationAnswered {
                call_id: tool_call.call_id.clone(),
                tool: tool_call.name.clone(),
                question,
                action: answer.action,
                content: answer.content.clone(),
                by: answer.by.clone(),
                reason: answer.reason.clone(),
            },
        );
        // The answer leaves the process: it is durable first.
        ledger.commit().await?;
        let _ = reply.send(answer);
        Ok(())
    }
}
