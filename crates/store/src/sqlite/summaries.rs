//! The `sessions` listing rows: loaded and stored inside an append's transaction, read for
//! `keel sessions`, and searched by id prefix.

use keel_contracts::{AppendError, ReadError, Seq, SessionId, SessionSummary};
use rusqlite::{Connection, OptionalExtension, params};

use super::{append_backend, read_backend_sqlite};
use crate::record::{self, parse_session_id, parse_timestamp, timestamp};
use crate::summary;

/// A `sessions` row as SQLite holds it, before decoding.
#[derive(Debug)]
struct SummaryColumns {
    id: String,
    created_at: String,
    updated_at: String,
    workspace: String,
    model: String,
    title: String,
    last_seq: i64,
    status: String,
    parent: Option<String>,
    usage: Option<String>,
}

/// The `sessions` columns, in the order [`SummaryColumns::from_row`] reads them.
const SUMMARY_COLUMNS: &str =
    "id, created_at, updated_at, workspace, model, title, last_seq, status, parent, usage";

impl SummaryColumns {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SummaryColumns> {
        Ok(SummaryColumns {
            id: row.get(0)?,
            created_at: row.get(1)?,
            updated_at: row.get(2)?,
            workspace: row.get(3)?,
            model: row.get(4)?,
            title: row.get(5)?,
            last_seq: row.get(6)?,
            status: row.get(7)?,
            parent: row.get(8)?,
            usage: row.get(9)?,
        })
    }

    fn decode(self) -> Result<SessionSummary, String> {
        let id = parse_session_id(&self.id)?;
        let context = |what: &str| format!("sessions row {id}: bad {what}");
        Ok(SessionSummary {
            id,
            created_at: parse_timestamp(&self.created_at).ok_or_else(|| context("created_at"))?,
            updated_at: parse_timestamp(&self.updated_at).ok_or_else(|| context("updated_at"))?,
            workspace: self.workspace,
            model: self.model,
            title: self.title,
            last_seq: Seq(u64::try_from(self.last_seq).map_err(|_| context("last_seq"))?),
            status: summary::parse_status(&self.status).ok_or_else(|| context("status"))?,
            parent: self
                .parent
                .as_deref()
                .map(parse_session_id)
                .transpose()
                .map_err(|_| context("parent"))?,
            usage: self
                .usage
                .as_deref()
                .and_then(record::parse_usage)
                .ok_or_else(|| context("usage"))?,
        })
    }
}

/// The session's listing row, inside an append's transaction (`None` for a new session).
pub(super) fn load_summary(
    tx: &Connection,
    session_key: &str,
) -> Result<Option<SessionSummary>, AppendError> {
    let columns = tx
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE id = ?1"))
        .and_then(|mut select| select.query_row([session_key], SummaryColumns::from_row).optional())
        .map_err(append_backend)?;
    columns
        .map(|columns| columns.decode().map_err(|message| AppendError::Backend { message }))
        .transpose()
}

/// Writes the session's listing row, inside the append's transaction.
pub(super) fn store_summary(tx: &Connection, summary: &SessionSummary) -> Result<(), AppendError> {
    let mut upsert = tx
        .prepare_cached(&format!(
            "INSERT INTO sessions ({SUMMARY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
             ON CONFLICT (id) DO UPDATE SET
                 created_at = excluded.created_at, updated_at = excluded.updated_at,
                 workspace = excluded.workspace, model = excluded.model,
                 title = excluded.title, last_seq = excluded.last_seq,
                 status = excluded.status, parent = excluded.parent,
                 usage = excluded.usage"
        ))
        .map_err(append_backend)?;
    let last_seq = i64::try_from(summary.last_seq.0).map_err(|_| AppendError::InvalidBatch {
        reason: format!("seq {} is out of range", summary.last_seq),
    })?;
    upsert
        .execute(params![
            summary.id.to_string(),
            timestamp(summary.created_at),
            timestamp(summary.updated_at),
            summary.workspace,
            summary.model,
            summary.title,
            last_seq,
            summary.status.as_str(),
            summary.parent.map(|parent| parent.to_string()),
            record::usage_column(&summary.usage),
        ])
        .map(drop)
        .map_err(append_backend)
}

/// Every listing row, newest `created_at` first (ties: larger id first).
pub(super) fn list_sessions(connection: &mut Connection) -> Result<Vec<SessionSummary>, ReadError> {
    let mut select = connection
        .prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM sessions ORDER BY created_at DESC, id DESC"
        ))
        .map_err(read_backend_sqlite)?;
    let rows = select.query_map([], SummaryColumns::from_row).map_err(read_backend_sqlite)?;
    rows.map(|columns| {
        columns
            .map_err(read_backend_sqlite)?
            .decode()
            .map_err(|message| ReadError::Backend { message })
    })
    .collect()
}

/// One session's listing row, by its primary key.
pub(super) fn one_session(
    connection: &mut Connection,
    session_key: &str,
) -> Result<Option<SessionSummary>, ReadError> {
    let columns = connection
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE id = ?1"))
        .and_then(|mut select| select.query_row([session_key], SummaryColumns::from_row).optional())
        .map_err(read_backend_sqlite)?;
    columns
        .map(|columns| columns.decode().map_err(|message| ReadError::Backend { message }))
        .transpose()
}

/// The sessions whose id, without dashes, starts with `wanted` (normalized lowercase hex).
pub(super) fn sessions_with_prefix(
    connection: &mut Connection,
    wanted: &str,
) -> Result<Vec<SessionId>, ReadError> {
    let mut select = connection
        .prepare_cached(
            "SELECT id FROM sessions WHERE substr(replace(id, '-', ''), 1, ?1) = ?2 ORDER BY id",
        )
        .map_err(read_backend_sqlite)?;
    let length = i64::try_from(wanted.len()).unwrap_or(i64::MAX);
    let ids = select
        .query_map(params![length, wanted], |row| row.get::<_, String>(0))
        .map_err(read_backend_sqlite)?;
    ids.map(|id| {
        parse_session_id(&id.map_err(read_backend_sqlite)?)
            .map_err(|message| ReadError::Backend { message })
    })
    .collect()
}
