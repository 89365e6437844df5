//! Compaction as the kernel runs it ([`crate::compaction`]): within a run when a request
//! does not fit, and `keel compact` outside any run. Every summary request is a recorded,
//! charged model call.

use keel_contracts::{
    CarriedContext, EventKind, FinishReason, Message, ModelRequest, RequestPurpose, Seq,
    ToolChoice, UsageTotals,
};

use super::Kernel;
use crate::compaction::{
    Compacted, SUMMARY_ATTEMPTS, SUMMARY_REQUEST, SUMMARY_SYSTEM, SummaryCall, shrink_for_summary,
    turn_failures,
};
use crate::context::{self, Window};
use crate::ledger::Ledger;
use crate::{Cancellation, Result};

impl Kernel {
    /// Compacts the session's projection: everything before the most recent exchanges that
    /// fit in `room` tokens is summarised. Every summary request is recorded as
    /// `model_requested`/`model_response` with purpose `compaction`, costed with `price`
    /// (DESIGN.md §4: every model call keel makes is a ledger fact and is charged). Returns
    /// what the summary requests spent.
    pub(crate) async fn compact(
        &self,
        ledger: &mut Ledger,
        call: SummaryCall<'_>,
        window: &Window<'_>,
        room: u64,
        cancel: &Cancellation,
    ) -> Result<(Compacted, UsageTotals)> {
        let ids = call.ids;
        let mut spent = UsageTotals::default();
        let mut verified = ledger.checks().clone();
        let inline = window.policy.inline_limit_bytes;
        let entries = context::retained_entries(ledger.events(), inline, &mut verified);
        let (pruned, fitted) = context::prune(entries.clone(), window);
        let before = fitted.tokens;
        // Keep the most recent exchanges that fit in `room` once pruned, and at least the
        // latest one; fold everything before into the summary.
        let mut cut = context::cut_for(&pruned, window, room);
        if cut >= entries.len() {
            cut = entries
                .iter()
                .rposition(|entry| matches!(entry.message, Message::Assistant { .. }))
                .unwrap_or(0);
        }
        if cut == 0 {
            return Ok((Compacted::Not, spent));
        }
        let covers_to = Seq(entries[cut].seq.0.saturating_sub(1));
        let previous = context::active_compaction(ledger.events(), &mut verified).cloned();

        // Summarise the prefix in pieces that fit.
        let piece_room = window.policy.budget().unwrap_or(u64::MAX).saturating_sub(
            window.counter.count(SUMMARY_SYSTEM) + window.counter.count(SUMMARY_REQUEST) + 64,
        );
        let prefix = shrink_for_summary(&entries[..cut]);
        let mut summary = String::new();
        let mut attempts = 0;
        let mut start = 0;
        while start < prefix.len() {
            let summary_tokens = window.counter.count(&summary);
            let room_for_piece = piece_room.saturating_sub(summary_tokens) / 2;
            let mut end = start;
            let mut used = 0;
            while end < prefix.len() {
                let size = window
                    .counter
                    .count(&serde_json::to_string(&prefix[end].message).unwrap_or_default());
                if used + size > room_for_piece
                    && end > start
                    && matches!(prefix[end].message, Message::Assistant { .. })
                {
                    break;
                }
                used += size;
                end += 1;
            }
            let mut messages = Vec::new();
            let opening = if summary.is_empty() {
                "[keel] The conversation to summarise follows.".to_owned()
            } else {
                format!("[keel] Summary so far:\n{summary}\n\nThe conversation continues:")
            };
            messages.push(Message::User { text: opening });
            for entry in &prefix[start..end] {
                match (messages.last_mut(), &entry.message) {
                    (Some(Message::User { text }), Message::User { text: more }) => {
                        text.push_str("\n\n");
                        text.push_str(more);
                    }
                    _ => messages.push(entry.message.clone()),
                }
            }
            match messages.last_mut() {
                Some(Message::User { text }) => {
                    text.push_str("\n\n");
                    text.push_str(SUMMARY_REQUEST);
                }
                _ => messages.push(Message::User { text: SUMMARY_REQUEST.to_owned() }),
            }
            let request = ModelRequest {
                model: self.deps.model.info().model,
                system: SUMMARY_SYSTEM.to_owned(),
                messages,
                // Tools off. The covered history may hold tool calls; the adapters define
                // the tools such a history needs (keel-providers' tools-off rule).
                tools: Vec::new(),
                tool_choice: ToolChoice::None,
                responses_in_session: ledger.responses(),
                purpose: RequestPurpose::Compaction,
            };
            let mut piece_summary = None;
            let mut last_problem = String::new();
            for _ in 0..SUMMARY_ATTEMPTS {
                if cancel.is_cancelled() {
                    return Ok((Compacted::Not, spent));
                }
                attempts += 1;
                let request_tokens = window.counter.count(SUMMARY_SYSTEM)
                    + keel_contracts::estimate_messages_tokens(&request.messages, window.counter);
                ledger
                    .append(
                        ids.0,
                        ids.1,
                        EventKind::ModelRequested {
                            step: call.step,
                            messages: request.messages.len() as u64,
                            request_sha256: crate::digest::request_digest(&request),
                            tokens: Some(request_tokens),
                            tokens_before_pruning: None,
                            pruned_results: 0,
                            purpose: RequestPurpose::Compaction,
                        },
                    )
                    .await?;
                let site = crate::model_call::CallSite {
                    ids,
                    step: call.step,
                    purpose: RequestPurpose::Compaction,
                };
                let answer = crate::model_call::call_model(
                    self.deps.model.as_ref(),
                    ledger,
                    &site,
                    &request,
                    &|_| {},
                    cancel,
                )
                .await?;
                let Some(response) = answer else {
                    return Ok((Compacted::Not, spent));
                };
                match response {
                    Ok(response) => {
                        let estimated_usage = super::budget::estimate_unreported(
                            &response,
                            request_tokens,
                            window.counter,
                        );
                        let charged = keel_contracts::effective_usage(
                            &response.usage,
                            estimated_usage.as_ref(),
                        );
                        let cost =
                            call.price.and_then(|price| keel_contracts::cost_usd(&charged, price));
                        spent.add(&response.usage, estimated_usage.as_ref(), cost);
                        ledger
                            .append(
                                ids.0,
                                ids.1,
                                EventKind::ModelResponse {
                                    text: response.text.clone(),
                                    reasoning: response.reasoning.clone(),
                                    tool_calls: response.tool_calls.clone(),
                                    usage: response.usage,
                                    raw_usage: response.raw_usage.clone(),
                                    finish_reason: response.finish_reason.clone(),
                                    cost_usd: cost,
                                    estimated_usage,
                                    purpose: RequestPurpose::Compaction,
                                },
                            )
                            .await?;
                        if response.text.trim().is_empty() {
                            last_problem = "the summary was empty".into();
                        } else if !response.tool_calls.is_empty() {
                            last_problem = "the summary request answered with tool calls".into();
                        } else if response.finish_reason == FinishReason::Length {
                            last_problem = "the summary was cut off by the output limit".into();
                        } else {
                            piece_summary = Some(response.text);
                            break;
                        }
                    }
                    Err(error) => last_problem = format!("model error: {}", error.message),
                }
            }
            let Some(piece_summary) = piece_summary else {
                ledger
                    .append(
                        ids.0,
                        ids.1,
                        EventKind::CompactionFailed { reason: last_problem, attempts },
                    )
                    .await?;
                return Ok((Compacted::Not, spent));
            };
            summary = piece_summary;
            start = end;
        }

        // The digest is chained on the compaction this one extends (issue #13): only the
        // events covered since then are hashed, so a compaction costs the same at event
        // 1 000 and 100 000.
        let (carried, chain) = match previous.as_ref().map(|event| (event.seq, &event.kind)) {
            Some((seq, EventKind::Compaction { carried, covers_to, digest, .. })) => (
                carried.clone(),
                Some(keel_contracts::DigestChain {
                    compaction: seq,
                    covers_to: *covers_to,
                    digest: digest.clone(),
                }),
            ),
            _ => (CarriedContext::default(), None),
        };
        let scan_from = chain.as_ref().map_or(Seq(1), |chain| chain.covers_to.next());
        let Some(segment) = context::covered(ledger.events(), scan_from, covers_to) else {
            return Ok((Compacted::Not, spent));
        };
        let carried = context::carry(carried, segment);
        let digest = match &chain {
            Some(chain) => context::chained_digest(&chain.digest, segment),
            None => context::digest_of(segment),
        };
        let failures = turn_failures(ledger.events(), previous.as_ref(), segment, covers_to);
        let note = context::carried_note(&carried, Some(&summary), Seq(1), covers_to);
        let after = window.fixed_tokens
            + window.counter.count(&note)
            + pruned[cut..]
                .iter()
                .map(|entry| {
                    keel_contracts::estimate_message_tokens(&entry.message, window.counter)
                })
                .sum::<u64>();
        ledger
            .append(
                ids.0,
                ids.1,
                EventKind::Compaction {
                    covers_from: Seq(1),
                    covers_to,
                    digest,
                    chain,
                    responses_before: Some(ledger.responses()),
                    failures,
                    summary,
                    carried,
                    tokens_before: before,
                    tokens_after: after,
                },
            )
            .await?;
        Ok((Compacted::Done, spent))
    }
}

impl Kernel {
    /// Compacts a session now (`keel compact`): everything before the most recent exchanges
    /// holding about half of the current context is summarised. Outside any run.
    ///
    /// # Errors
    ///
    /// [`crate::KernelError`] when the ledger cannot be read or written, or the session is
    /// sealed or malformed. A summary that fails is not an error: it is recorded as
    /// `compaction_failed` and `Ok(None)` is returned.
    ///
    /// # Cancel safety
    ///
    /// Cancel through `cancel`; a dropped future leaves the ledger as it was or with the
    /// compaction event complete.
    pub async fn compact_session(
        &self,
        session_id: keel_contracts::SessionId,
        config: &crate::RunConfig,
        cancel: &Cancellation,
    ) -> Result<Option<(u64, u64)>> {
        let mut ledger = self.load_session(session_id).await?;
        self.take_lease(&mut ledger).await?;
        let fixed_tokens = self
            .deps
            .counter
            .count(&serde_json::to_string(&self.registry.definitions()).unwrap_or_default());
        let mut verified = ledger.checks().clone();
        let entries = context::retained_entries(
            ledger.events(),
            config.context.inline_limit_bytes,
            &mut verified,
        );
        let current = fixed_tokens
            + keel_contracts::estimate_messages_tokens(
                &entries.iter().map(|e| e.message.clone()).collect::<Vec<_>>(),
                self.deps.counter.as_ref(),
            );
        // Without a known window, compact as if the current context filled it.
        let policy = match config.context.window {
            Some(_) => config.context,
            None => keel_contracts::ContextPolicy {
                window: Some(current.max(1)),
                reserve: 0,
                ..config.context
            },
        };
        let window = Window {
            policy: &policy,
            counter: self.deps.counter.as_ref(),
            fixed_tokens,
            scale: 1.0,
        };
        let room = current.saturating_sub(fixed_tokens) / 2;
        let call = SummaryCall { ids: (None, None), step: 0, price: config.price.as_ref() };
        let (compacted, _) = self.compact(&mut ledger, call, &window, room, cancel).await?;
        self.drop_lease(&mut ledger).await;
        Ok(match compacted {
            Compacted::Done => ledger.events().last().and_then(|event| match &event.kind {
                EventKind::Compaction { tokens_before, tokens_after, .. } => {
                    Some((*tokens_before, *tokens_after))
                }
                _ => None,
            }),
            Compacted::Not => None,
        })
    }
}
