//! The PostgreSQL schema and its migrations.
//!
//! Everything lives in the schema `keel`, so the ledger can share a database with other
//! applications. `keel.schema_version` holds one row: the number of migrations applied.
//! Migration `i` (0-based) takes the database from version `i` to `i + 1`. Migrations only
//! ever append to [`MIGRATIONS`]; an applied one is never edited, because databases in the
//! field already ran it.
//!
//! Column choices: ids are native `uuid` (their byte order is the order of their hex text,
//! which prefix resolution relies on); the event body is `text`, not `jsonb`, because it is
//! compared byte for byte on an identical retry and `jsonb` would neither keep the bytes
//! nor accept the `\u0000` escape; timestamps are RFC 3339 text with nanoseconds in the
//! bytewise `"C"` collation, because `timestamptz` keeps only microseconds and the session
//! listing must give back exactly the timestamps of the events.

use keel_contracts::{EventKind, Seq, SessionId, UsageTotals};
use tokio_postgres::{Client, Transaction};

use crate::record;

/// Each migration's SQL, in order.
const MIGRATIONS: &[&str] = &[
    // 1: the ledger, the session listing, cancel requests.
    r#"
    CREATE TABLE keel.events (
        session_id uuid NOT NULL,
        seq bigint NOT NULL CHECK (seq >= 1),
        turn_id uuid,
        run_id uuid,
        ts text COLLATE "C" NOT NULL,
        kind text NOT NULL,
        body text NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE keel.sessions (
        id uuid PRIMARY KEY,
        created_at text COLLATE "C" NOT NULL,
        updated_at text COLLATE "C" NOT NULL,
        workspace text NOT NULL,
        model text NOT NULL,
        title text NOT NULL,
        last_seq bigint NOT NULL,
        status text NOT NULL,
        parent uuid
    );
    CREATE INDEX sessions_newest_first ON keel.sessions (created_at DESC, id DESC);
    CREATE TABLE keel.cancel_requests (
        session_id uuid PRIMARY KEY,
        requested_at timestamptz NOT NULL DEFAULT now()
    );
    "#,
    // 2: run leases with fencing tokens (the newest lease per session).
    r#"
    CREATE TABLE keel.leases (
        session_id uuid PRIMARY KEY,
        holder text NOT NULL,
        token bigint NOT NULL,
        expires_at_ms bigint NOT NULL
    );
    "#,
    // 3: usage totals in the session listing (backfilled once from the ledger by
    // `backfill_usage`), and events by kind, so a resume finds the latest compaction and
    // the session's facts without reading every event.
    r#"
    ALTER TABLE keel.sessions ADD COLUMN usage text;
    CREATE INDEX events_by_kind ON keel.events (session_id, kind, seq);
    "#,
    // 4: schedules, their fires (one row per claimed slot, unique) and delivered wakes.
    r#"
    CREATE TABLE keel.schedules (
        id uuid PRIMARY KEY,
        created_at_ms bigint NOT NULL,
        paused boolean NOT NULL,
        spec text NOT NULL
    );
    CREATE TABLE keel.schedule_fires (
        schedule_id uuid NOT NULL,
        scheduled_at_ms bigint NOT NULL,
        holder text NOT NULL,
        claimed_at_ms bigint NOT NULL,
        state text NOT NULL,
        session_id uuid,
        detail text NOT NULL,
        PRIMARY KEY (schedule_id, scheduled_at_ms)
    );
    CREATE INDEX schedule_fires_by_state ON keel.schedule_fires (state, claimed_at_ms);
    CREATE TABLE keel.wakes (
        wake_id text PRIMARY KEY,
        session_id uuid NOT NULL,
        payload text,
        delivered_by text NOT NULL,
        received_at_ms bigint NOT NULL
    );
    "#,
    // 5: tool results by call id (issue #13), so the kernel's check that a new call's id
    // is not taken, and paging a result memory no longer holds, are one indexed lookup.
    // `call_id` is the id as JSON text (`record::result_call_key`), set by the append for
    // `tool_result` rows only; rows written before are filled by `backfill_call_ids`. (An
    // index on an expression over the body cannot be: `->` on `json` fails on a body with
    // `\u0000`, and `jsonb` refuses it.)
    r#"
    ALTER TABLE keel.events ADD COLUMN call_id text;
    CREATE INDEX events_by_result_call ON keel.events (session_id, call_id)
        WHERE call_id IS NOT NULL;
    "#,
];

/// The version whose migration added `keel.sessions.usage`, which [`backfill_usage`] fills.
const USAGE_VERSION: usize = 3;

/// The version whose migration added `keel.events.call_id`, which [`backfill_call_ids`]
/// fills.
const CALL_ID_VERSION: usize = 5;

/// The schema version this build writes: the number of migrations.
pub(crate) const LATEST: i64 = MIGRATIONS.len() as i64;

/// Key of the transaction-scoped advisory lock that serializes migrations ("keel" and 1).
const MIGRATION_LOCK_KEY: i64 = 0x6b65_656c_0000_0001;

/// What [`migrate`] found.
#[derive(Debug)]
pub(crate) enum Migration {
    /// The database is at [`LATEST`] (possibly after applying migrations).
    Current,
    /// The database is newer than this build.
    Newer(i64),
}

/// Brings the database to [`LATEST`] in one transaction holding an advisory lock, so two
/// processes connecting to a new database at once cannot both migrate it. An up-to-date
/// database is only read (no DDL runs, so a role without `CREATE` can use it).
pub(crate) async fn migrate(client: &mut Client) -> Result<Migration, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
    let exists: bool =
        tx.query_one("SELECT to_regclass('keel.schema_version') IS NOT NULL", &[]).await?.get(0);
    let found: i64 = if exists {
        tx.query_opt("SELECT version FROM keel.schema_version", &[])
            .await?
            .map_or(0, |row| row.get(0))
    } else {
        0
    };
    if found > LATEST {
        return Ok(Migration::Newer(found));
    }
    if found == LATEST {
        tx.rollback().await?;
        return Ok(Migration::Current);
    }
    if !exists {
        tx.batch_execute(
            "CREATE SCHEMA IF NOT EXISTS keel;
             CREATE TABLE keel.schema_version (version bigint NOT NULL);",
        )
        .await?;
    }
    let applied = usize::try_from(found).unwrap_or(0);
    for sql in MIGRATIONS.iter().skip(applied) {
        tx.batch_execute(sql).await?;
    }
    if applied < USAGE_VERSION {
        backfill_usage(&tx).await?;
    }
    if applied < CALL_ID_VERSION {
        backfill_call_ids(&tx).await?;
    }
    tx.execute("DELETE FROM keel.schema_version", &[]).await?;
    tx.execute("INSERT INTO keel.schema_version (version) VALUES ($1)", &[&LATEST]).await?;
    tx.commit().await?;
    Ok(Migration::Current)
}

/// Fills `keel.events.call_id` of the `tool_result` rows written before it existed, from
/// their bodies decoded as an append would have. A body that does not decode keeps `NULL`
/// (its read still fails as corrupt; it is never skipped).
async fn backfill_call_ids(tx: &Transaction<'_>) -> Result<(), tokio_postgres::Error> {
    let rows = tx
        .query("SELECT session_id, seq, body FROM keel.events WHERE kind = 'tool_result'", &[])
        .await?;
    let update = tx
        .prepare("UPDATE keel.events SET call_id = $3 WHERE session_id = $1 AND seq = $2")
        .await?;
    for row in rows {
        let session: uuid::Uuid = row.try_get(0)?;
        let seq: i64 = row.try_get(1)?;
        let body: &str = row.try_get(2)?;
        let decoded = record::decode(
            SessionId(session),
            Seq(u64::try_from(seq).unwrap_or(0)),
            body.as_bytes(),
        );
        if let Ok(EventKind::ToolResult { call_id, .. }) = decoded.map(|event| event.kind) {
            tx.execute(&update, &[&session, &seq, &record::result_call_key(&call_id)]).await?;
        }
    }
    Ok(())
}

/// Fills `keel.sessions.usage` for sessions written before it existed: their
/// `model_response` events folded in seq order, as an append would have. A session with an
/// undecodable response gets [`UsageTotals::unknown`] (its cost shows as unknown, never as
/// zero); the ledger itself is left as it is.
async fn backfill_usage(tx: &Transaction<'_>) -> Result<(), tokio_postgres::Error> {
    let ids: Vec<uuid::Uuid> = tx
        .query("SELECT id FROM keel.sessions WHERE usage IS NULL", &[])
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let responses = tx
        .prepare(
            "SELECT seq, body FROM keel.events WHERE session_id = $1 AND kind = 'model_response'
             ORDER BY seq",
        )
        .await?;
    let update = tx.prepare("UPDATE keel.sessions SET usage = $2 WHERE id = $1").await?;
    for id in ids {
        let mut usage = UsageTotals::default();
        for row in tx.query(&responses, &[&id]).await? {
            let seq: i64 = row.try_get(0)?;
            let body: &str = row.try_get(1)?;
            let seq = Seq(u64::try_from(seq).unwrap_or(0));
            match record::decode(SessionId(id), seq, body.as_bytes()).map(|event| event.kind) {
                Ok(EventKind::ModelResponse {
                    usage: reported, estimated_usage, cost_usd, ..
                }) => {
                    usage.add(&reported, estimated_usage.as_ref(), cost_usd);
                }
                _ => {
                    usage = UsageTotals::unknown();
                    break;
                }
            }
        }
        tx.execute(&update, &[&id, &record::usage_column(&usage)]).await?;
    }
    Ok(())
}
