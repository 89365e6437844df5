//! The SQLite schema and its migrations.
//!
//! `schema_version` holds one row: the number of migrations applied. Migration `i`
//! (0-based) takes the file from version `i` to `i + 1`. Migrations only ever append to
//! [`MIGRATIONS`]; an applied one is never edited, because files in the field already ran
//! it.

use keel_contracts::{EventKind, Seq, UsageTotals};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::record::{self, parse_session_id};

/// Each migration's SQL, in order.
const MIGRATIONS: &[&str] = &[
    // 1: the ledger, the session listing, cancel requests.
    "
    CREATE TABLE events (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        turn_id TEXT,
        run_id TEXT,
        ts TEXT NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        workspace TEXT NOT NULL,
        model TEXT NOT NULL,
        title TEXT NOT NULL,
        last_seq INTEGER NOT NULL,
        status TEXT NOT NULL,
        parent TEXT
    );
    CREATE INDEX sessions_newest_first ON sessions (created_at DESC, id DESC);
    CREATE TABLE cancel_requests (
        session_id TEXT PRIMARY KEY NOT NULL,
        requested_at TEXT NOT NULL
    );
    ",
    // 2: run leases with fencing tokens (the newest lease per session).
    "
    CREATE TABLE leases (
        session_id TEXT PRIMARY KEY NOT NULL,
        holder TEXT NOT NULL,
        token INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL
    );
    ",
    // 3: usage totals in the session listing (backfilled once from the ledger by
    // `backfill_usage`, so `sessions` never reads events), and events by kind, so a resume
    // finds the latest compaction and the session's facts without reading every event.
    "
    ALTER TABLE sessions ADD COLUMN usage TEXT;
    CREATE INDEX events_by_kind ON events (session_id, kind, seq);
    ",
    // 4: schedules, their fires (one row per claimed slot, unique) and delivered wakes.
    "
    CREATE TABLE schedules (
        id TEXT PRIMARY KEY NOT NULL,
        created_at_ms INTEGER NOT NULL,
        paused INTEGER NOT NULL,
        spec TEXT NOT NULL
    );
    CREATE TABLE schedule_fires (
        schedule_id TEXT NOT NULL,
        scheduled_at_ms INTEGER NOT NULL,
        holder TEXT NOT NULL,
        claimed_at_ms INTEGER NOT NULL,
        state TEXT NOT NULL,
        session_id TEXT,
        detail TEXT NOT NULL,
        PRIMARY KEY (schedule_id, scheduled_at_ms)
    );
    CREATE INDEX schedule_fires_by_state ON schedule_fires (state, claimed_at_ms);
    CREATE TABLE wakes (
        wake_id TEXT PRIMARY KEY NOT NULL,
        session_id TEXT NOT NULL,
        payload TEXT,
        delivered_by TEXT NOT NULL,
        received_at_ms INTEGER NOT NULL
    );
    ",
    // 5: events by kind for the kinds read by kind only (issue #13): the index on every
    // event cost each commit one more WAL page per kind per session, and a kernel step
    // writes five kinds. See `INDEXED_KINDS`.
    "
    DROP INDEX events_by_kind;
    CREATE INDEX events_by_fact_kind ON events (session_id, kind, seq) WHERE kind IN (
        'session_created', 'session_sealed', 'plan_approved', 'turn_started', 'run_started',
        'run_completed', 'run_failed', 'run_suspended', 'run_cancelled', 'run_denied',
        'permission_settled', 'boundary_revised', 'compaction'
    );
    ",
    // 6: tool results by call id (issue #13), so the kernel's check that a new call's id
    // is not taken is one indexed lookup, not a set of every id of the run in memory.
    // Computed by SQLite from the body on insert (the append path is unchanged); only
    // `tool_result` rows are in it. See `RESULT_CALL_ID`.
    "
    CREATE INDEX events_by_result_call ON events (session_id, json_extract(body, '$.call_id'))
        WHERE kind = 'tool_result';
    ",
];

/// The indexed expression of `events_by_result_call` (migration 6), spelled as there: SQLite
/// uses an index on an expression only for a query with the same expression.
pub(crate) const RESULT_CALL_ID: &str = "json_extract(body, '$.call_id')";

/// The kinds the partial index `events_by_fact_kind` holds (migration 5): the session's
/// facts and compactions, which a resume reads by kind. Reads of other kinds are answered
/// without an index on kind (a scan of the session's events).
pub(crate) const INDEXED_KINDS: &[&str] = &[
    "session_created",
    "session_sealed",
    "plan_approved",
    "turn_started",
    "run_started",
    "run_completed",
    "run_failed",
    "run_suspended",
    "run_cancelled",
    "run_denied",
    "permission_settled",
    "boundary_revised",
    "compaction",
];

/// The partial index's `WHERE` term, spelled exactly as in migration 5: SQLite uses a
/// partial index only for a query whose `WHERE` contains that same term.
pub(crate) const INDEXED_KINDS_TERM: &str = "kind IN (
        'session_created', 'session_sealed', 'plan_approved', 'turn_started', 'run_started',
        'run_completed', 'run_failed', 'run_suspended', 'run_cancelled', 'run_denied',
        'permission_settled', 'boundary_revised', 'compaction'
    )";

/// The version whose migration added `sessions.usage`, which [`backfill_usage`] fills.
const USAGE_VERSION: usize = 3;

/// The schema version this build writes: the number of migrations.
pub(crate) const LATEST: i64 = MIGRATIONS.len() as i64;

/// What [`migrate`] found.
#[derive(Debug)]
pub(crate) enum Migration {
    /// The file is at [`LATEST`] (possibly after applying migrations).
    Current,
    /// The file is newer than this build.
    Newer(i64),
}

/// Brings the file to [`LATEST`] in one immediate transaction, so two processes opening
/// a new file at once cannot both migrate it.
pub(crate) fn migrate(connection: &mut Connection) -> rusqlite::Result<Migration> {
    let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let found: Option<i64> =
        tx.query_row("SELECT version FROM schema_version", [], |row| row.get(0)).optional()?;
    let found = found.unwrap_or(0);
    if found > LATEST {
        return Ok(Migration::Newer(found));
    }
    if found == LATEST {
        // Nothing to do; dropping `tx` rolls back, so an up-to-date open writes nothing.
        return Ok(Migration::Current);
    }
    let applied = usize::try_from(found).unwrap_or(0);
    for sql in MIGRATIONS.iter().skip(applied) {
        tx.execute_batch(sql)?;
    }
    if applied < USAGE_VERSION {
        backfill_usage(&tx)?;
    }
    tx.execute("DELETE FROM schema_version", [])?;
    tx.execute("INSERT INTO schema_version (version) VALUES (?1)", [LATEST])?;
    tx.commit()?;
    Ok(Migration::Current)
}

/// Fills `sessions.usage` for sessions written before it existed: their `model_response`
/// events (found by the kind index) folded in seq order, as an append would have. A
/// session with an undecodable response gets [`UsageTotals::unknown`]: its listing shows
/// the cost as unknown, never as zero, and the ledger itself is left as it is.
fn backfill_usage(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    let ids: Vec<String> = tx
        .prepare("SELECT id FROM sessions WHERE usage IS NULL")?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut responses = tx.prepare(
        "SELECT seq, body FROM events WHERE session_id = ?1 AND kind = 'model_response'
         ORDER BY seq",
    )?;
    let mut update = tx.prepare("UPDATE sessions SET usage = ?2 WHERE id = ?1")?;
    for id in ids {
        let usage = match parse_session_id(&id) {
            Ok(session_id) => {
                let mut usage = UsageTotals::default();
                let mut rows = responses.query([&id])?;
                while let Some(row) = rows.next()? {
                    let seq = Seq(u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0));
                    let decoded = match row.get_ref(1)? {
                        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
                            record::decode(session_id, seq, bytes).ok()
                        }
                        ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) => None,
                    };
                    match decoded.map(|event| event.kind) {
                        Some(EventKind::ModelResponse {
                            usage: reported,
                            estimated_usage,
                            cost_usd,
                            ..
                        }) => usage.add(&reported, estimated_usage.as_ref(), cost_usd),
                        _ => {
                            usage = UsageTotals::unknown();
                            break;
                        }
                    }
                }
                usage
            }
            Err(_) => UsageTotals::unknown(),
        };
        update.execute(params![id, record::usage_column(&usage)])?;
    }
    Ok(())
}
