//! Opening the ledger: PostgreSQL when `KEEL_DATABASE_URL` names one, else the embedded
//! SQLite file under KEEL_HOME; read-only for commands that only read.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use keel_contracts::Store;
use keel_store::SqliteStore;

use crate::config;
use crate::error::usage;

/// The ledger: PostgreSQL when `KEEL_DATABASE_URL` is set (a `postgres://` URL), else the
/// embedded SQLite file under KEEL_HOME.
pub async fn open_store() -> anyhow::Result<(PathBuf, Arc<dyn Store>)> {
    let (home, store, _) = open_stores().await?;
    Ok((home, store))
}

/// [`open_store`], with the same database's schedules, fires and wakes.
///
/// # Errors
///
/// As [`open_store`].
pub async fn open_stores()
-> anyhow::Result<(PathBuf, Arc<dyn Store>, Arc<dyn keel_store::Schedules>)> {
    let home = config::keel_home()?;
    if let Some(url) = database_url()? {
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(usage(
                "KEEL_DATABASE_URL must be a postgres:// URL (unset it for the embedded ledger)",
            ));
        }
        let store = Arc::new(
            keel_store::PgStore::connect(&url)
                .await
                .context("cannot open the PostgreSQL ledger named by KEEL_DATABASE_URL")?,
        );
        return Ok((home, store.clone(), store));
    }
    let path = keel_store::default_path(&home);
    // OpenError names the file: "cannot open ledger PATH: why".
    let store = Arc::new(SqliteStore::open(&path)?);
    Ok((home, store.clone(), store))
}

/// [`open_store`] for commands that only read (`keel sessions`, `keel log`): an existing,
/// current embedded ledger is opened read-only, so the command writes and fsyncs nothing;
/// with no ledger file at all, an empty in-memory ledger stands in (no sessions, and
/// nothing is created on disk); otherwise (an older schema, PostgreSQL) it is opened as
/// [`open_store`] opens it.
///
/// # Errors
///
/// As [`open_store`].
pub async fn open_store_for_reading() -> anyhow::Result<(PathBuf, Arc<dyn Store>)> {
    if database_url()?.is_none() {
        let home = config::keel_home()?;
        let path = keel_store::default_path(&home);
        if !path.try_exists().unwrap_or(true) {
            let empty = SqliteStore::open_in_memory().context("cannot open an empty ledger")?;
            return Ok((home, Arc::new(empty)));
        }
        let store = SqliteStore::open_read_only(&path)?;
        if let Some(store) = store {
            return Ok((home, Arc::new(store)));
        }
    }
    open_store().await
}

/// `KEEL_DATABASE_URL`, trimmed; `None` when unset or blank.
fn database_url() -> anyhow::Result<Option<String>> {
    match std::env::var("KEEL_DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => Ok(Some(url.trim().to_owned())),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(usage("KEEL_DATABASE_URL is not valid UTF-8"))
        }
    }
}
