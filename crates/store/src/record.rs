//! How a ledger record is spelled in a database, the same for every backend: the batch
//! checks done before touching storage, the event body (the serialized JSON, compared
//! byte for byte on retry), timestamps, and session id prefixes.

use chrono::{DateTime, SecondsFormat, Utc};
use keel_contracts::{AppendError, ReadError, RunId, RuntimeEvent, Seq, SessionId, TurnId};
use uuid::Uuid;

/// An append, checked and serialized before it reaches the database.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) session_id: SessionId,
    pub(crate) rows: Vec<EventRow>,
}

/// One event as stored.
#[derive(Debug)]
pub(crate) struct EventRow {
    /// What the columns and the listing need of the event (the body holds the rest), so
    /// the queued append does not keep a second copy of every event.
    pub(crate) event: EventHead,
    pub(crate) seq: i64,
    /// The full event as JSON: what is stored, compared on retry, and decoded on read.
    pub(crate) body: String,
}

impl Batch {
    /// Checks what needs no stored state (one session, contiguous seqs from at least 1) and
    /// serializes each event. `None` for an empty batch.
    pub(crate) fn prepare(events: &[RuntimeEvent]) -> Result<Option<Batch>, AppendError> {
        let Some(first) = events.first() else { return Ok(None) };
        let invalid = |reason: String| AppendError::InvalidBatch { reason };
        if first.seq == Seq(0) {
            return Err(invalid("seq starts at 1, got 0".to_owned()));
        }
        for pair in events.windows(2) {
            if pair[1].session_id != first.session_id {
                return Err(invalid(format!(
                    "batch mixes sessions {} and {}",
                    first.session_id, pair[1].session_id
                )));
            }
            if pair[1].seq != pair[0].seq.next() {
                return Err(invalid(format!(
                    "seq {} follows {} in one batch",
                    pair[1].seq, pair[0].seq
                )));
            }
        }
        let rows = events
            .iter()
            .map(|event| {
                let seq = i64::try_from(event.seq.0)
                    .map_err(|_| invalid(format!("seq {} is out of range", event.seq)))?;
                let body = serde_json::to_string(event)
                    .map_err(|error| AppendError::Backend { message: error.to_string() })?;
                Ok(EventRow { event: EventHead::of(event), seq, body })
            })
            .collect::<Result<Vec<_>, AppendError>>()?;
        Ok(Some(Batch { session_id: first.session_id, rows }))
    }
}

/// The columns of one event besides its body, and what it changes in its session's
/// listing row.
#[derive(Debug)]
pub(crate) struct EventHead {
    pub(crate) seq: Seq,
    pub(crate) session_id: SessionId,
    pub(crate) turn_id: Option<TurnId>,
    pub(crate) run_id: Option<RunId>,
    pub(crate) ts: DateTime<Utc>,
    /// [`keel_contracts::EventKind::name`].
    pub(crate) kind: &'static str,
    pub(crate) fold: crate::summary::Fold,
    /// A `tool_result`'s call id as JSON text ([`result_call_key`]), `None` for other kinds.
    pub(crate) result_call_key: Option<String>,
}

impl EventHead {
    pub(crate) fn of(event: &RuntimeEvent) -> EventHead {
        EventHead {
            seq: event.seq,
            session_id: event.session_id,
            turn_id: event.turn_id,
            run_id: event.run_id,
            ts: event.ts,
            kind: event.kind.name(),
            fold: crate::summary::Fold::of(&event.kind),
            result_call_key: match &event.kind {
                keel_contracts::EventKind::ToolResult { call_id, .. } => {
                    Some(result_call_key(call_id))
                }
                _ => None,
            },
        }
    }
}

/// How a database keys a `tool_result` by its call id: the id as JSON text (serde_json's
/// string, quotes and escapes included), so an id with a NUL is still plain text.
pub(crate) fn result_call_key(call_id: &keel_contracts::ToolCallId) -> String {
    // Serializing a string cannot fail.
    serde_json::to_string(call_id.as_str()).unwrap_or_default()
}

/// Decodes the stored body of `session_id`'s event at `seq`.
///
/// # Errors
///
/// [`ReadError::Corrupt`] when the body is not an event, or is the event of another seq or
/// session.
pub(crate) fn decode(
    session_id: SessionId,
    seq: Seq,
    body: &[u8],
) -> Result<RuntimeEvent, ReadError> {
    let corrupt = |message: String| ReadError::Corrupt { session_id, seq, message };
    let event: RuntimeEvent =
        serde_json::from_slice(body).map_err(|error| corrupt(error.to_string()))?;
    if event.seq != seq || event.session_id != session_id {
        return Err(corrupt(format!("body says session {} seq {}", event.session_id, event.seq)));
    }
    Ok(event)
}

/// Lowercase hex without dashes, or `None` when `prefix` cannot prefix any session id.
pub(crate) fn normalize_prefix(prefix: &str) -> Option<String> {
    let wanted: String =
        prefix.trim().chars().filter(|c| *c != '-').map(|c| c.to_ascii_lowercase()).collect();
    let valid =
        !wanted.is_empty() && wanted.len() <= 32 && wanted.chars().all(|c| c.is_ascii_hexdigit());
    valid.then_some(wanted)
}

/// The stored spelling of a timestamp: RFC 3339, UTC, nanoseconds, fixed width, so text
/// order (bytewise) is time order and it reads back exactly.
pub(crate) fn timestamp(ts: DateTime<Utc>) -> String {
    ts.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

pub(crate) fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text).ok().map(|ts| ts.with_timezone(&Utc))
}

#[cfg_attr(not(feature = "sqlite"), allow(dead_code, reason = "only SQLite stores ids as text"))]
pub(crate) fn parse_session_id(text: &str) -> Result<SessionId, String> {
    Uuid::parse_str(text)
        .map(SessionId)
        .map_err(|error| format!("bad session id {text:?}: {error}"))
}

/// A session's usage totals as stored in the listing: their JSON.
pub(crate) fn usage_column(usage: &keel_contracts::UsageTotals) -> String {
    // Serializing plain numbers cannot fail; an empty string would read back as bad.
    serde_json::to_string(usage).unwrap_or_default()
}

/// Stored usage totals back; `None` when the column does not decode.
pub(crate) fn parse_usage(text: &str) -> Option<keel_contracts::UsageTotals> {
    serde_json::from_str(text).ok()
}

/// A lease expiry as stored: milliseconds since the Unix epoch.
pub(crate) fn lease_millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

/// A stored lease expiry back as a time (the earliest time for out-of-range values, so a
/// damaged row reads as lapsed rather than held forever).
pub(crate) fn lease_time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `now + ttl`, saturating.
pub(crate) fn lease_expiry(now: DateTime<Utc>, ttl: std::time::Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(ttl)
        .ok()
        .and_then(|ttl| now.checked_add_signed(ttl))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A fencing token as stored (tokens stay far below `i64::MAX`).
pub(crate) fn token_column(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(i64::MAX)
}

/// A stored fencing token back.
pub(crate) fn token_of(value: i64) -> u64 {
    value.max(0).unsigned_abs()
}
