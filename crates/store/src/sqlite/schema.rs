//! The SQLite schema and its migrations.
//!
//! `schema_version` holds one row: the number of migrations applied. Migration `i`
//! (0-based) takes the file from version `i` to `i + 1`. Migrations only ever append to
//! [`MIGRATIONS`]; an applied one is never edited, because files in the field already ran
//! it.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

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
];

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
    tx.execute("DELETE FROM schema_version", [])?;
    tx.execute("INSERT INTO schema_version (version) VALUES (?1)", [LATEST])?;
    tx.commit()?;
    Ok(Migration::Current)
}
