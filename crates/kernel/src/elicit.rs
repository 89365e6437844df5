//! A tool's questions to the user during a call (MCP elicitation): the [`Elicitor`] the
//! kernel hands each call it carries out. A question travels back to the settlement that
//! awaits the call, which records `elicitation_requested`, asks through the run's
//! [`crate::PermissionHook`], checks the answer against the form, records
//! `elicitation_answered` and only then hands the answer to the tool. The ledger keeps one
//! writer: the tool never touches it.

use async_trait::async_trait;
use keel_contracts::{ElicitationAnswer, ElicitationRequest, Elicitor};
use tokio::sync::{mpsc, oneshot};

/// One question on its way to the settlement: which of the calls being awaited asks
/// (its index among them), what, and where the answer goes.
pub(crate) struct Asked {
    pub(crate) index: usize,
    pub(crate) request: ElicitationRequest,
    pub(crate) reply: oneshot::Sender<ElicitationAnswer>,
}

/// The elicitor of one call.
#[derive(Debug)]
pub(crate) struct CallElicitor {
    index: usize,
    sender: mpsc::UnboundedSender<Asked>,
}

/// The receiving end the settlement polls while it awaits its calls, and a way to make
/// one elicitor per call.
pub(crate) fn channel() -> (mpsc::UnboundedSender<Asked>, mpsc::UnboundedReceiver<Asked>) {
    mpsc::unbounded_channel()
}

impl CallElicitor {
    pub(crate) fn new(index: usize, sender: mpsc::UnboundedSender<Asked>) -> CallElicitor {
        CallElicitor { index, sender }
    }
}

#[async_trait]
impl Elicitor for CallElicitor {
    async fn elicit(&self, request: ElicitationRequest) -> ElicitationAnswer {
        let (reply, answer) = oneshot::channel();
        if self.sender.send(Asked { index: self.index, request, reply }).is_err() {
            return ElicitationAnswer::cancel("keel", "the call is no longer awaited");
        }
        answer.await.unwrap_or_else(|_| {
            ElicitationAnswer::cancel("keel", "the call ended before the question was answered")
        })
    }
}

/// The id of the `number`th question (from 1) asked during the call `call_id`:
/// `CALL.qN`, e.g. `call_1_1.q1`. It goes into a URL path as it is (`POST
/// /v1/sessions/ID/questions/QUESTION`): the call id comes from the provider and may hold
/// any character, so every byte of it outside `A-Z a-z 0-9 _ -` is written `~HH` (two
/// upper-case hex digits; a program's nested call `call_1_4/1` is `call_1_4~2F1`). The
/// mapping is one-to-one, so two calls never share a question id, and the result holds
/// only URL-unreserved characters (no `#`, `/`, `%` or `?`).
pub fn question_id(call_id: &keel_contracts::ToolCallId, number: u32) -> String {
    use std::fmt::Write as _;
    let mut id = String::with_capacity(call_id.0.len() + 4);
    for byte in call_id.0.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            id.push(char::from(byte));
        } else {
            let _ = write!(id, "~{byte:02X}");
        }
    }
    let _ = write!(id, ".q{number}");
    id
}
