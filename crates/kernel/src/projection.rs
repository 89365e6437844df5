//! Projection: the next model request, built from durable ledger events only.
//!
//! Invariant: every projected request keeps tool calls and tool results paired. Each
//! assistant message's calls are answered, in order, by the tool results that follow it;
//! a result whose call is not in the preceding assistant message is dropped (an orphan),
//! and a call without a recorded result is answered with a synthetic `cancelled` result
//! (the ledger itself is repaired by recovery before a run continues; this is the last
//! line of defence, so the provider never sees an unanswered call).
//!
//! Every projected tool result starts with its source line
//! ([`keel_contracts::source_line`]: the tool and the path, command or server), added in
//! one place, when results are paired with their calls.

use std::collections::BTreeMap;

use keel_contracts::{
    EventKind, Message, Outcome, RequestPurpose, RuntimeEvent, Seq, ToolCall, ToolCallId,
    source_line,
};

/// Text of a synthetic result for a call that has no recorded result.
pub const UNANSWERED_CALL_TEXT: &str =
    "cancelled: this call was interrupted before it produced a result";

/// Prefix of the note keel adds when the last permitted step of a budget begins.
pub const STOPPED_EARLY_PREFIX: &str = "[keel] ";
/// What keel asks of the model in the tools-off last step.
pub const REPORT_REQUEST: &str = "Tools are off for this last step. Write a short report for \
whoever resumes this task: what you did (with evidence), what you believe, and what is next.";

/// The note keel adds when a run resumes after the model's report.
pub const RESUME_NOTE: &str =
    "[keel] The run was resumed with a fresh budget. Continue the task from where you stopped.";

/// One projected message and the seq of the event it comes from (for a synthetic result,
/// the seq of the response whose call it answers).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The message.
    pub message: Message,
    /// Its source event.
    pub seq: Seq,
    /// For a tool result, the size of the whole recorded content in bytes (the message may
    /// hold a preview or a stub); 0 otherwise.
    pub full_bytes: usize,
}

/// Projects the conversation of a session from its events, in full.
pub fn messages(events: &[RuntimeEvent]) -> Vec<Message> {
    entries(events, None).into_iter().map(|entry| entry.message).collect()
}

/// Projects the conversation of a session from its events. Tool results larger than
/// `inline_limit` bytes become a head/tail preview with their handle (see [`preview`]).
pub fn entries(events: &[RuntimeEvent], inline_limit: Option<usize>) -> Vec<Entry> {
    let mut projector = Projector::new(inline_limit);
    for event in events {
        projector.feed(event);
    }
    projector.finish()
}

/// The projection as a fold over events, so it can be extended event by event (issue #13:
/// a step projects only what the step added). Feeding events `e_1..e_n` one by one and
/// calling [`Projector::finish`] gives exactly [`entries`] of `e_1..e_n`; at any point,
/// [`Projector::committed`] followed by [`Projector::provisional`] is that too.
///
/// The fold does not look at seqs: it may start at any event of a session.
#[derive(Debug, Clone)]
pub struct Projector {
    inline_limit: Option<usize>,
    out: Vec<Entry>,
    /// Results recorded for the calls of the most recent assistant message, by call id.
    pending: Option<Pending>,
    /// The smallest index of `out` pushed or changed since [`Projector::take_changed`].
    changed_from: usize,
}

impl Projector {
    /// An empty fold; tool results larger than `inline_limit` bytes become previews.
    pub fn new(inline_limit: Option<usize>) -> Projector {
        Projector { inline_limit, out: Vec::new(), pending: None, changed_from: 0 }
    }

    /// The entries that later events can no longer change, except that the last one, a
    /// user message, may still be extended by a later input (see `push_user`).
    pub fn committed(&self) -> &[Entry] {
        &self.out
    }

    /// The entries that follow [`Projector::committed`] while the latest assistant message's
    /// calls are open: its results so far, and a synthetic result for each call without one.
    pub fn provisional(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        flush(&mut out, &mut self.pending.clone());
        out
    }

    /// The smallest index of [`Projector::committed`] that was pushed or changed since the
    /// previous call (its length when nothing was).
    pub fn take_changed(&mut self) -> usize {
        std::mem::replace(&mut self.changed_from, self.out.len())
    }

    /// All entries, the open calls answered.
    pub fn finish(mut self) -> Vec<Entry> {
        self.flush();
        self.out
    }

    fn flush(&mut self) {
        if self.pending.is_some() {
            self.changed_from = self.changed_from.min(self.out.len());
            flush(&mut self.out, &mut self.pending);
        }
    }

    fn push_user(&mut self, input: &str, seq: Seq) {
        let index = match self.out.last() {
            Some(Entry { message: Message::User { .. }, .. }) => self.out.len() - 1,
            _ => self.out.len(),
        };
        self.changed_from = self.changed_from.min(index);
        push_user(&mut self.out, input, seq);
    }

    /// Folds one event in.
    pub fn feed(&mut self, event: &RuntimeEvent) {
        match &event.kind {
            EventKind::TurnStarted { input } | EventKind::InputJoined { input } => {
                self.flush();
                self.push_user(input, event.seq);
            }
            EventKind::ModelResponse {
                text,
                reasoning,
                tool_calls,
                purpose: RequestPurpose::Conversation,
                ..
            } => {
                self.flush();
                self.changed_from = self.changed_from.min(self.out.len());
                self.out.push(Entry {
                    message: Message::Assistant {
                        text: text.clone(),
                        reasoning: reasoning.clone(),
                        tool_calls: tool_calls.clone(),
                    },
                    seq: event.seq,
                    full_bytes: 0,
                });
                if !tool_calls.is_empty() {
                    self.pending = Some(Pending {
                        calls: tool_calls.clone(),
                        seq: event.seq,
                        results: BTreeMap::new(),
                    });
                }
            }
            EventKind::ToolResult { call_id, tool, outcome, content, .. } => {
                let inline_limit = self.inline_limit;
                if let Some(pending) = &mut self.pending
                    && pending.calls.iter().any(|call| &call.call_id == call_id)
                {
                    pending.results.entry(call_id.clone()).or_insert_with(|| {
                        let content = match inline_limit {
                            Some(limit) if content.len() > limit => {
                                preview(content, call_id, limit)
                            }
                            _ => content.clone(),
                        };
                        (tool.clone(), *outcome, content, event.seq, event_bytes(event))
                    });
                }
            }
            EventKind::BudgetExhausted { reason, report_requested: true } => {
                self.flush();
                self.push_user(&format!("{STOPPED_EARLY_PREFIX}{reason}. {REPORT_REQUEST}"), event.seq);
            }
            EventKind::RunStarted { resumes: Some(_), .. } if matches!(self.out.last(), Some(Entry { message: Message::Assistant { tool_calls, .. }, .. }) if tool_calls.is_empty()) =>
            {
                // A resumed run after a tool-free answer (a report): the model needs a user
                // turn to continue from.
                self.push_user(RESUME_NOTE, event.seq);
            }
            EventKind::BudgetExhausted { report_requested: false, .. }
            // keel's own calls (compaction summaries) are recorded, never part of history.
            | EventKind::ModelResponse { purpose: RequestPurpose::Compaction, .. }
            | EventKind::Checkpoint { .. }
            | EventKind::Compaction { .. }
            | EventKind::CompactionFailed { .. }
            | EventKind::SessionCreated { .. }
            | EventKind::SessionSealed { .. }
            | EventKind::PlanApproved { .. }
            | EventKind::RunStarted { .. }
            | EventKind::RunComposition { .. }
            | EventKind::ModelRequested { .. }
            | EventKind::ModelRetry { .. }
            | EventKind::GateDecision { .. }
            | EventKind::PermissionRequested { .. }
            | EventKind::PermissionSettled { .. }
            // A server's question and the user's answer are between them: the model sees
            // the answer only if the server puts it in its result.
            | EventKind::ElicitationRequested { .. }
            | EventKind::ElicitationAnswered { .. }
            // The request's tool list is the change itself.
            | EventKind::ToolsChanged { .. }
            | EventKind::ToolAttemptPrepared { .. }
            // A program's own calls: its parent's result is what the model reads.
            | EventKind::ToolCall { .. }
            | EventKind::ShadowIntent { .. }
            | EventKind::RunCompleted { .. }
            | EventKind::RunFailed { .. }
            | EventKind::RunSuspended { .. }
            | EventKind::RunCancelled { .. }
            | EventKind::RunDenied { .. }
            | EventKind::SkillCatalog { .. }
            | EventKind::SkillActivated { .. }
            | EventKind::ScheduleFired { .. }
            | EventKind::WaitStarted { .. }
            | EventKind::BoundaryRevised { .. } => {}
        }
    }
}

/// A head/tail preview of a large result, with its size and the handle to page it with
/// `read_tool_result`. `limit` bounds the preview's length in bytes (plus the notes).
pub fn preview(content: &str, call_id: &ToolCallId, limit: usize) -> String {
    let half = limit / 2;
    let head_end = floor_char_boundary(content, half);
    let tail_start = ceil_char_boundary(content, content.len().saturating_sub(half).max(head_end));
    let omitted = tail_start - head_end;
    format!(
        "[keel] This result is {} bytes; showing the first {head_end} and the last {} bytes. \
         Page through it with read_tool_result {{\"handle\": \"{call_id}\", \"offset\": {head_end}}}.\n\
         {}\n[… {omitted} bytes omitted …]\n{}",
        content.len(),
        content.len() - tail_start,
        &content[..head_end],
        &content[tail_start..],
    )
}

/// The stub that replaces an old tool result pruned from the projection.
pub fn stub(content_bytes: usize, outcome: Outcome, call_id: &ToolCallId) -> String {
    format!(
        "[keel] pruned from the context: a {} result of {content_bytes} bytes. Read it again with \
         read_tool_result {{\"handle\": \"{call_id}\"}} if you need it.",
        outcome.as_str()
    )
}

/// The largest char boundary at or below `index`.
pub(crate) fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// The smallest char boundary at or above `index`.
pub(crate) fn ceil_char_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

fn event_bytes(event: &RuntimeEvent) -> usize {
    match &event.kind {
        EventKind::ToolResult { content, .. } => content.len(),
        _ => 0,
    }
}

/// Two user messages in a row (a turn whose run failed before the model answered, or a
/// budget note after a new input) are merged, so roles alternate.
fn push_user(out: &mut Vec<Entry>, input: &str, seq: Seq) {
    match out.last_mut() {
        Some(Entry { message: Message::User { text }, .. }) => {
            text.push_str("\n\n");
            text.push_str(input);
        }
        _ => out.push(Entry {
            message: Message::User { text: input.to_owned() },
            seq,
            full_bytes: 0,
        }),
    }
}

/// The calls of the latest assistant message and the results recorded for them so far.
#[derive(Debug, Clone)]
struct Pending {
    calls: Vec<ToolCall>,
    seq: Seq,
    results: BTreeMap<ToolCallId, (String, Outcome, String, Seq, usize)>,
}

fn flush(out: &mut Vec<Entry>, pending: &mut Option<Pending>) {
    let Some(Pending { calls, seq, mut results }) = pending.take() else { return };
    for call in calls {
        let (tool, outcome, content, result_seq, full_bytes) =
            results.remove(&call.call_id).unwrap_or_else(|| {
                let text = UNANSWERED_CALL_TEXT.to_owned();
                let bytes = text.len();
                (call.name.clone(), Outcome::Cancelled, text, seq, bytes)
            });
        // The one place a result is marked with its source (DESIGN.md §5: tool output is
        // data); the system prompt says what the line means.
        let content = format!("{}\n{content}", source_line(&tool, &call.arguments));
        out.push(Entry {
            message: Message::ToolResult { call_id: call.call_id, tool, outcome, content },
            seq: result_seq,
            full_bytes,
        });
    }
}

/// Checks the pairing invariant on a projected conversation: every call of an assistant
/// message is answered exactly once by the results that follow it, and no result answers
/// a call that is not there.
///
/// # Errors
///
/// A description of the first violation.
pub fn check_pairing(messages: &[Message]) -> Result<(), String> {
    let mut open: Vec<ToolCallId> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        match message {
            Message::ToolResult { call_id, .. } => {
                if open.first() == Some(call_id) {
                    open.remove(0);
                } else {
                    return Err(format!(
                        "message {index}: result for {call_id} answers no open call"
                    ));
                }
            }
            Message::User { .. } | Message::Assistant { .. } if !open.is_empty() => {
                return Err(format!("message {index}: calls left unanswered: {open:?}"));
            }
            Message::Assistant { tool_calls, .. } => {
                open = tool_calls.iter().map(|call| call.call_id.clone()).collect();
            }
            Message::User { .. } => {}
        }
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!("calls left unanswered at the end: {open:?}"))
    }
}

/// The number of conversation responses recorded in a session (keel's own calls, such as
/// compaction summaries, are not counted): the scripted model's position.
pub fn responses_in_session(events: &[RuntimeEvent]) -> u64 {
    events.iter().filter(|event| event.kind.is_conversation_response()).count() as u64
}
