//! Consent: a call that requires it is asked through the rules, then the permission
//! hook, unless a grant covers it; the request and its answer are ledger facts
//! (DESIGN.md §6).

use keel_contracts::{EventKind, Outcome, PermissionAnswer};

use super::{CANCELLED_BEFORE_RUN, Call, CallState};
use crate::ledger::Ledger;
use crate::permission::PermissionRequest;
use crate::{Cancellation, Result};

impl CallState<'_> {
    /// Asks for consent (rules first, then the permission hook) and records the request
    /// and its answer. `None` when the run was cancelled meanwhile (a `cancelled` result is
    /// recorded then).
    pub(super) async fn ask(
        &self,
        ledger: &mut Ledger,
        call: &Call<'_>,
        access: keel_contracts::Access,
        ruled: Option<(PermissionAnswer, String)>,
        arguments_sha256: &str,
        cancel: &Cancellation,
    ) -> Result<Option<PermissionAnswer>> {
        let tool_call = call.call;
        ledger.stage(
            call.turn,
            call.run,
            EventKind::PermissionRequested {
                call_id: tool_call.call_id.clone(),
                tool: tool_call.name.clone(),
                access,
                arguments: tool_call.arguments.clone(),
            },
        );
        // A request someone may take time to answer is a ledger fact before it is asked
        // (DESIGN.md §6: it survives a crash and is asked again). A rule's or a fixed
        // policy's answer comes at once: request and answer are committed with the prepare.
        let request = PermissionRequest {
            session_id: ledger.session_id,
            call_id: &tool_call.call_id,
            tool: &tool_call.name,
            access,
            arguments: &tool_call.arguments,
        };
        if ruled.is_none() && !self.deps.permissions.answers_at_once(&request) {
            ledger.commit().await?;
        }
        let (answer, by) = tokio::select! {
            answer = async {
                match ruled {
                    Some(ruled) => ruled,
                    None => self.deps.permissions.decide(&request).await,
                }
            } => answer,
            () = cancel.cancelled() => {
                call.result(ledger, None, Outcome::Cancelled, CANCELLED_BEFORE_RUN.into()).await?;
                return Ok(None);
            }
        };
        // An execution grant always carries an expiry and the exact arguments it covers.
        let (grant_sha256, expires_at) = match answer {
            PermissionAnswer::AllowExact => (
                Some(arguments_sha256.to_owned()),
                chrono::TimeDelta::from_std(self.run.grant_ttl)
                    .ok()
                    .and_then(|ttl| self.deps.clock.now().checked_add_signed(ttl)),
            ),
            PermissionAnswer::AllowOnce
            | PermissionAnswer::AllowSession
            | PermissionAnswer::Deny => (None, None),
        };
        ledger.stage(
            call.turn,
            call.run,
            EventKind::PermissionSettled {
                call_id: tool_call.call_id.clone(),
                tool: tool_call.name.clone(),
                access,
                answer,
                by,
                arguments_sha256: grant_sha256,
                expires_at,
            },
        );
        Ok(Some(answer))
    }
}

/// The seq and expiry of a valid execution grant for exactly this call: same tool, same
/// arguments digest, not expired. A grant without an expiry or digest is never used (fail
/// closed: the user is asked again).
pub(super) fn exact_grant(
    ledger: &Ledger,
    tool: &str,
    arguments_sha256: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<(u64, chrono::DateTime<chrono::Utc>)> {
    // Permission answers are facts: held in memory whatever was dropped.
    ledger.events().iter().rev().find_map(|event| match &event.kind {
        EventKind::PermissionSettled {
            tool: granted,
            answer: PermissionAnswer::AllowExact,
            arguments_sha256: Some(digest),
            expires_at: Some(until),
            ..
        } if granted == tool && digest == arguments_sha256 && *until > now => {
            Some((event.seq.0, *until))
        }
        _ => None,
    })
}

/// The seq of an "allow for this session" answer for `tool` in this session, if any.
pub(super) fn session_grant(ledger: &Ledger, tool: &str) -> Option<u64> {
    ledger.events().iter().find_map(|event| match &event.kind {
        EventKind::PermissionSettled {
            tool: granted,
            answer: PermissionAnswer::AllowSession,
            ..
        } if granted == tool => Some(event.seq.0),
        _ => None,
    })
}
