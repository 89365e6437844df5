//! The `keel.sessions` listing rows: loaded and stored inside an append's transaction, read
//! for `keel sessions`, and found by id prefix.

use deadpool_postgres::{Pool, Transaction};
use keel_contracts::{AppendError, ReadError, ResolveError, Seq, SessionId, SessionSummary};
use tokio_postgres::Row;
use uuid::Uuid;

use super::user_text::{from_column, to_column};
use super::{append_backend, describe, read_backend};
use crate::record::{self, normalize_prefix, parse_timestamp, timestamp};
use crate::summary;

/// The `keel.sessions` columns, in the order [`decode_summary`] reads them.
const SUMMARY_COLUMNS: &str =
    "id, created_at, updated_at, workspace, model, title, last_seq, status, parent, usage";

/// The session's listing row, if it has one.
pub(super) async fn load_summary(
    tx: &Transaction<'_>,
    session: Uuid,
) -> Result<Option<SessionSummary>, AppendError> {
    let select = tx
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM keel.sessions WHERE id = $1"))
        .await
        .map_err(append_backend)?;
    let row = tx.query_opt(&select, &[&session]).await.map_err(append_backend)?;
    row.map(|row| decode_summary(&row).map_err(|message| AppendError::Backend { message }))
        .transpose()
}

/// Writes the session's listing row, inside the append's transaction.
pub(super) async fn store_summary(
    tx: &Transaction<'_>,
    summary: &SessionSummary,
) -> Result<(), AppendError> {
    let upsert = tx
        .prepare_cached(&format!(
            "INSERT INTO keel.sessions ({SUMMARY_COLUMNS})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (id) DO UPDATE SET
                 created_at = excluded.created_at, updated_at = excluded.updated_at,
                 workspace = excluded.workspace, model = excluded.model,
                 title = excluded.title, last_seq = excluded.last_seq,
                 status = excluded.status, parent = excluded.parent,
                 usage = excluded.usage"
        ))
        .await
        .map_err(append_backend)?;
    let last_seq = i64::try_from(summary.last_seq.0).map_err(|_| AppendError::InvalidBatch {
        reason: format!("seq {} is out of range", summary.last_seq),
    })?;
    tx.execute(
        &upsert,
        &[
            &summary.id.0,
            &timestamp(summary.created_at),
            &timestamp(summary.updated_at),
            &to_column(&summary.workspace),
            &to_column(&summary.model),
            &to_column(&summary.title),
            &last_seq,
            &summary.status.as_str(),
            &summary.parent.map(|parent| parent.0),
            &record::usage_column(&summary.usage),
        ],
    )
    .await
    .map(drop)
    .map_err(append_backend)
}

/// Every listing row, newest `created_at` first (ties: larger id first).
pub(super) async fn list(pool: &Pool) -> Result<Vec<SessionSummary>, ReadError> {
    let client = pool.get().await.map_err(read_backend)?;
    let select = client
        .prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM keel.sessions ORDER BY created_at DESC, id DESC"
        ))
        .await
        .map_err(read_backend)?;
    let rows = client.query(&select, &[]).await.map_err(read_backend)?;
    rows.iter()
        .map(|row| decode_summary(row).map_err(|message| ReadError::Backend { message }))
        .collect()
}

/// One session's listing row, by its primary key.
pub(super) async fn one(
    pool: &Pool,
    session_id: SessionId,
) -> Result<Option<SessionSummary>, ReadError> {
    let client = pool.get().await.map_err(read_backend)?;
    let select = client
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM keel.sessions WHERE id = $1"))
        .await
        .map_err(read_backend)?;
    let row = client.query_opt(&select, &[&session_id.0]).await.map_err(read_backend)?;
    row.map(|row| decode_summary(&row).map_err(|message| ReadError::Backend { message }))
        .transpose()
}

/// The one session whose id starts with `prefix` (see
/// [`keel_contracts::Store::resolve_session`]): the first id between the prefix filled with
/// `0` and with `f`, and how many there are.
pub(super) async fn resolve(pool: &Pool, prefix: &str) -> Result<SessionId, ResolveError> {
    let not_found = || ResolveError::NotFound { prefix: prefix.to_owned() };
    let Some(wanted) = normalize_prefix(prefix) else { return Err(not_found()) };
    let bound = |fill: &str| {
        Uuid::parse_str(&format!("{wanted}{}", fill.repeat(32 - wanted.len())))
            .map_err(|error| ReadError::Backend { message: error.to_string() })
    };
    let (lowest, highest) = (bound("0")?, bound("f")?);
    let client = pool.get().await.map_err(read_backend)?;
    let select = client
        .prepare_cached(
            "SELECT id, count(*) OVER () FROM keel.sessions
             WHERE id BETWEEN $1 AND $2 ORDER BY id LIMIT 1",
        )
        .await
        .map_err(read_backend)?;
    let found = client.query_opt(&select, &[&lowest, &highest]).await.map_err(read_backend)?;
    let Some(row) = found else { return Err(not_found()) };
    let id: Uuid = row.try_get(0).map_err(read_backend)?;
    let count: i64 = row.try_get(1).map_err(read_backend)?;
    match count {
        1 => Ok(SessionId(id)),
        more => Err(ResolveError::Ambiguous {
            prefix: prefix.to_owned(),
            count: usize::try_from(more).unwrap_or(usize::MAX),
        }),
    }
}

/// Decodes a `keel.sessions` row selected as [`SUMMARY_COLUMNS`].
fn decode_summary(row: &Row) -> Result<SessionSummary, String> {
    let id: Uuid = row.try_get(0).map_err(|error| describe(&error))?;
    let context = |what: &str| format!("sessions row {id}: bad {what}");
    let text = |index: usize, what: &str| {
        row.try_get::<_, String>(index)
            .map_err(|error| format!("{}: {}", context(what), describe(&error)))
    };
    let user_text = |index: usize, what: &str| {
        text(index, what).and_then(|stored| from_column(stored).ok_or_else(|| context(what)))
    };
    let last_seq: i64 = row.try_get(6).map_err(|error| describe(&error))?;
    let parent: Option<Uuid> = row.try_get(8).map_err(|error| describe(&error))?;
    Ok(SessionSummary {
        id: SessionId(id),
        created_at: parse_timestamp(&text(1, "created_at")?)
            .ok_or_else(|| context("created_at"))?,
        updated_at: parse_timestamp(&text(2, "updated_at")?)
            .ok_or_else(|| context("updated_at"))?,
        workspace: user_text(3, "workspace")?,
        model: user_text(4, "model")?,
        title: user_text(5, "title")?,
        last_seq: Seq(u64::try_from(last_seq).map_err(|_| context("last_seq"))?),
        status: summary::parse_status(&text(7, "status")?).ok_or_else(|| context("status"))?,
        parent: parent.map(SessionId),
        usage: row
            .try_get::<_, Option<String>>(9)
            .map_err(|error| describe(&error))?
            .as_deref()
            .and_then(record::parse_usage)
            .ok_or_else(|| context("usage"))?,
    })
}
