//! The eval ledger: `DIR/eval.sqlite`, the experiment's immutable records.
//!
//! - `experiment`: one row, the [`ExperimentSpec`](crate::ExperimentSpec) as JSON.
//! - `cells`: one row per cell (task, subject, repetition), written when a run of the
//!   experiment first lists it.
//! - `attempts`: one row per attempt of a cell (task, subject, repetition), with its
//!   ordinal (1, 2, ... per cell), inserted *before* the attempt runs.
//! - `results`: one row per finished attempt, its [`AttemptRecord`] as JSON.
//!
//! Triggers refuse every `UPDATE` and `DELETE`: a record, once written, stays as it was.
//! An attempt without a result was interrupted (keel was killed); it stays in the ledger
//! as such, and the cell gets a new attempt with the next ordinal.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use crate::attempt::AttemptRecord;
use crate::error::{Error, Result};

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = FULL;
PRAGMA foreign_keys = ON;
CREATE TABLE IF NOT EXISTS experiment (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    experiment_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS cells (
    task TEXT NOT NULL,
    subject TEXT NOT NULL,
    repetition INTEGER NOT NULL,
    PRIMARY KEY (task, subject, repetition)
);
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    subject TEXT NOT NULL,
    repetition INTEGER NOT NULL,
    ordinal INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    UNIQUE (task, subject, repetition, ordinal),
    FOREIGN KEY (task, subject, repetition) REFERENCES cells (task, subject, repetition)
);
CREATE TABLE IF NOT EXISTS results (
    attempt_id TEXT PRIMARY KEY REFERENCES attempts (attempt_id),
    finished_at TEXT NOT NULL,
    class TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS experiment_immutable_u BEFORE UPDATE ON experiment
    BEGIN SELECT RAISE(ABORT, 'eval records are immutable'); END;
CREATE TRIGGER IF NOT EXISTS experiment_immutable_d BEFORE DELETE ON experiment
    BEGIN SELECT RAISE(ABORT, 'eval records are immutable'); END;
CREATE TRIGGER IF NOT EXISTS cells_immutable_u BEFORE UPDATE ON cells
    BEGIN SELECT RAISE(ABORT, 'eval records are immutable'); END;
CREATE TRIGGER IF NOT EXISTS cells_immutable_d BEFORE DELETE ON cells
    BEGIN SELECT RAISE(ABORT, 'eval records are immutable'); END;
CREATE TRIGGER IF NOT EXISTS attempts_immutable_u BEFORE UPDATE ON attempts
    BEGIN SELECT RAISE(ABORT, 'eval records are immutable'); END;
CREATE TRIGGER IF NOT EXISTS attempts_immutable_d BEFORE DELETE ON attempts
    BEGIN SELECT RAISE(ABORT, 'eval records are immutable'); END;
CREATE TRIGGER IF NOT EXISTS results_immutable_u BEFORE UPDATE ON results
    BEGIN SELECT RAISE(ABORT, 'eval records are immutable'); END;
CREATE TRIGGER IF NOT EXISTS results_immutable_d BEFORE DELETE ON results
    BEGIN SELECT RAISE(ABORT, 'eval records are immutable'); END;
";

/// A cell of the experiment: one task, one subject, one repetition (from 1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cell {
    /// The task's name (its folder's name).
    pub task: String,
    /// The subject as given (`oracle`, `scripted:PATH`, `openai:MODEL`).
    pub subject: String,
    /// The repetition, from 1.
    pub repetition: u32,
}

/// One attempt row, and its result when it finished.
#[derive(Debug, Clone)]
pub struct StoredAttempt {
    /// The attempt's id (UUIDv7).
    pub attempt_id: String,
    /// Its cell.
    pub cell: Cell,
    /// 1 for the cell's first attempt.
    pub ordinal: u32,
    /// Its result; `None` when it was interrupted.
    pub result: Option<AttemptRecord>,
}

/// The eval ledger of one output folder.
#[derive(Debug)]
pub struct EvalLedger {
    path: PathBuf,
    connection: Mutex<Connection>,
}

impl EvalLedger {
    /// Opens (or creates) `DIR/eval.sqlite`.
    ///
    /// # Errors
    ///
    /// [`Error::Ledger`] when it cannot be opened or its schema created.
    pub fn open(dir: &Path) -> Result<EvalLedger> {
        let path = dir.join("eval.sqlite");
        let fail = |source| Error::Ledger { path: path.clone(), source };
        let connection = Connection::open(&path).map_err(fail)?;
        connection.busy_timeout(std::time::Duration::from_secs(10)).map_err(fail)?;
        connection.execute_batch(SCHEMA).map_err(fail)?;
        Ok(EvalLedger { path, connection: Mutex::new(connection) })
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T>(&self, body: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let connection = match self.connection.lock() {
            Ok(connection) => connection,
            Err(poisoned) => poisoned.into_inner(),
        };
        body(&connection).map_err(|source| Error::Ledger { path: self.path.clone(), source })
    }

    /// The stored experiment spec (JSON), when there is one.
    ///
    /// # Errors
    ///
    /// [`Error::Ledger`] when it cannot be read.
    pub fn spec(&self) -> Result<Option<String>> {
        self.with(|c| {
            c.query_row("SELECT spec FROM experiment WHERE id = 1", [], |row| row.get(0)).optional()
        })
    }

    /// Records the experiment (once).
    ///
    /// # Errors
    ///
    /// [`Error::Ledger`] when it cannot be written (or one is recorded already).
    pub fn record_experiment(&self, experiment_id: &str, spec: &str) -> Result<()> {
        let now = chrono::Utc::now().to_rfc3339();
        self.with(|c| {
            c.execute(
                "INSERT INTO experiment (id, experiment_id, created_at, spec) VALUES (1, ?1, ?2, ?3)",
                params![experiment_id, now, spec],
            )
            .map(drop)
        })
    }

    /// Records the experiment's cells (those already recorded are left as they are).
    ///
    /// # Errors
    ///
    /// [`Error::Ledger`] when they cannot be written.
    pub fn record_cells(&self, cells: &[Cell]) -> Result<()> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            for cell in cells {
                tx.execute(
                    "INSERT OR IGNORE INTO cells (task, subject, repetition) VALUES (?1, ?2, ?3)",
                    params![cell.task, cell.subject, cell.repetition],
                )?;
            }
            tx.commit()
        })
    }

    /// Records that an attempt of `cell` starts, with the next ordinal of the cell.
    /// Returns the ordinal.
    ///
    /// # Errors
    ///
    /// [`Error::Ledger`] when it cannot be written.
    pub fn start_attempt(&self, attempt_id: &str, cell: &Cell) -> Result<u32> {
        let now = chrono::Utc::now().to_rfc3339();
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let last: Option<u32> = tx.query_row(
                "SELECT MAX(ordinal) FROM attempts WHERE task = ?1 AND subject = ?2 AND repetition = ?3",
                params![cell.task, cell.subject, cell.repetition],
                |row| row.get(0),
            )?;
            let ordinal = last.unwrap_or(0) + 1;
            tx.execute(
                "INSERT INTO attempts (attempt_id, task, subject, repetition, ordinal, started_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![attempt_id, cell.task, cell.subject, cell.repetition, ordinal, now],
            )?;
            tx.commit()?;
            Ok(ordinal)
        })
    }

    /// Records an attempt's result (once).
    ///
    /// # Errors
    ///
    /// [`Error::Ledger`] when it cannot be written (or a result is recorded already).
    pub fn finish_attempt(&self, record: &AttemptRecord) -> Result<()> {
        let now = chrono::Utc::now().to_rfc3339();
        let json = serde_json::to_string(record).map_err(|error| Error::Record {
            path: self.path.clone(),
            what: record.attempt_id.clone(),
            reason: error.to_string(),
        })?;
        self.with(|c| {
            c.execute(
                "INSERT INTO results (attempt_id, finished_at, class, record) VALUES (?1, ?2, ?3, ?4)",
                params![record.attempt_id, now, record.class.as_str(), json],
            )
            .map(drop)
        })
    }

    /// Every attempt, in cell and ordinal order, with its result when it has one.
    ///
    /// # Errors
    ///
    /// [`Error::Ledger`] when it cannot be read; [`Error::Record`] for a result that does
    /// not parse.
    pub fn attempts(&self) -> Result<Vec<StoredAttempt>> {
        let rows: Vec<(String, String, String, u32, u32, Option<String>)> = self.with(|c| {
            let mut statement = c.prepare(
                "SELECT a.attempt_id, a.task, a.subject, a.repetition, a.ordinal, r.record \
                 FROM attempts a LEFT JOIN results r ON r.attempt_id = a.attempt_id \
                 ORDER BY a.task, a.subject, a.repetition, a.ordinal",
            )?;
            let rows = statement
                .query_map([], |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                        row.get(5)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })?;
        rows.into_iter()
            .map(|(attempt_id, task, subject, repetition, ordinal, record)| {
                let result = match record {
                    Some(json) => {
                        Some(serde_json::from_str(&json).map_err(|error| Error::Record {
                            path: self.path.clone(),
                            what: attempt_id.clone(),
                            reason: error.to_string(),
                        })?)
                    }
                    None => None,
                };
                Ok(StoredAttempt {
                    attempt_id,
                    cell: Cell { task, subject, repetition },
                    ordinal,
                    result,
                })
            })
            .collect()
    }
}

/// The attempt that counts for each finished cell: the earliest (lowest ordinal) attempt
/// with a result. Cells without one are absent.
pub fn winners(attempts: &[StoredAttempt]) -> std::collections::BTreeMap<Cell, &AttemptRecord> {
    let mut winners = std::collections::BTreeMap::new();
    for attempt in attempts {
        if let Some(result) = &attempt.result {
            winners.entry(attempt.cell.clone()).or_insert(result);
        }
    }
    winners
}
