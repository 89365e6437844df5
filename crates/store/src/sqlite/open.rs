//! Opening a ledger: the file and its folder made private, refused when it is not a regular
//! file, switched to WAL with `synchronous=FULL` and migrated; or opened read-only for
//! listings, which writes nothing (the `-wal`, `-shm` and `-journal` files beside the
//! ledger decide whether it can be).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};

use super::{BUSY_TIMEOUT, SCHEMA_VERSION, SqliteStore, schema};
use crate::error::OpenError;

impl SqliteStore {
    /// Opens (creating if needed) the ledger at `path`: creates missing parent
    /// directories, switches to WAL with `synchronous=FULL`, sets [`BUSY_TIMEOUT`] and
    /// migrates the schema to [`SCHEMA_VERSION`].
    ///
    /// This blocks on disk; call it at startup or from a blocking task.
    ///
    /// # Errors
    ///
    /// [`OpenError::NotADirectory`] when the parent exists and is not a directory;
    /// [`OpenError::CreateDir`] when a parent directory cannot be created (new ones are
    /// made 0700); [`OpenError::CreateFile`] when a new ledger file cannot be made (0600);
    /// [`OpenError::Sqlite`] when SQLite fails; [`OpenError::NoWal`] when the file system
    /// refuses WAL; [`OpenError::NewerSchema`] when a newer keel wrote the file.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, OpenError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            let not_a_directory = match std::fs::metadata(parent) {
                Ok(meta) if meta.is_dir() => None,
                Ok(meta) => Some(kind_name(meta.file_type()).unwrap_or("a file")),
                // A link whose target is missing (or a loop of links): creating the folder
                // would only say "File exists".
                Err(_) => parent
                    .symlink_metadata()
                    .is_ok_and(|meta| meta.file_type().is_symlink())
                    .then_some("a symbolic link to nothing (its target is missing, or a loop)"),
            };
            if let Some(kind) = not_a_directory {
                return Err(OpenError::NotADirectory { path: parent.to_path_buf(), kind });
            }
            create_private_dir(parent)
                .map_err(|source| OpenError::CreateDir { path: parent.to_path_buf(), source })?;
        }
        refuse_non_regular(&path)?;
        create_private_file(&path)
            .map_err(|source| OpenError::CreateFile { path: path.clone(), source })?;
        let mut connection = Connection::open(&path).map_err(sqlite_error(&path))?;
        // SQLite answers "database is locked" without waiting while another connection is
        // switching a new file to WAL, so a second process opening a fresh ledger at the
        // same moment retries here instead of failing.
        let mut n_attempts: u32 = 0;
        loop {
            match configure_file(&mut connection, &path) {
                Err(OpenError::Sqlite { source, .. })
                    if is_busy(&*source) && n_attempts < OPEN_BUSY_RETRIES =>
                {
                    n_attempts += 1;
                    std::thread::sleep(OPEN_BUSY_RETRY_DELAY);
                }
                result => break result?,
            }
        }
        Ok(SqliteStore::with_connection(connection, Some(path)))
    }

    /// Opens an existing ledger at `path` for reading only, for listings and logs: nothing
    /// is created, configured, migrated or checkpointed, so no ledger page is written and
    /// nothing is fsynced (SQLite still maps its `-shm` index, as any reader does). Reads
    /// run on this one connection; a write through the handle fails (SQLite refuses it).
    ///
    /// `Ok(None)` when the file cannot be read as it is: it does not exist, it is not in WAL
    /// mode, its schema is older than [`SCHEMA_VERSION`] (migrating it is a write), or a
    /// process killed while writing it left a repair to do first (a hot rollback journal, a
    /// WAL index to rebuild). [`SqliteStore::open`] it then. In a folder it cannot write
    /// (a read-only `KEEL_HOME`), where SQLite cannot create the `-shm` index, a ledger
    /// with no `-wal` and no `-journal` beside it is read `immutable=1` (the file alone is
    /// the whole ledger).
    ///
    /// This blocks on disk; call it at startup or from a blocking task.
    ///
    /// # Errors
    ///
    /// [`OpenError::Sqlite`] when SQLite fails; [`OpenError::NewerSchema`] when a newer
    /// keel wrote the file; [`OpenError::NotRegular`] for a FIFO, device or folder there;
    /// [`OpenError::ReadOnlyHome`] when the folder cannot be written and the ledger has a
    /// `-wal` or `-journal` that reading it would need to write beside.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Option<SqliteStore>, OpenError> {
        let path = path.as_ref().to_path_buf();
        refuse_non_regular(&path)?;
        if !path.try_exists().unwrap_or(false) {
            return Ok(None);
        }
        let (connection, found) = match read_only_connection(&path, false) {
            Ok(Some(opened)) => opened,
            Ok(None) => return Ok(None),
            // In a folder it cannot write, SQLite cannot create the `-shm` index a WAL
            // reader needs (and the writer's open could not write either).
            Err(source) if cannot_create_shm(&path, &source) => read_in_read_only_folder(&path)?,
            // A process killed mid-write left the file needing a write before it can be
            // read (a hot rollback journal from its first moments, or a WAL index to
            // rebuild): the writer's open does that repair.
            Err(source) if needs_repair(&source) => return Ok(None),
            Err(source) => return Err(sqlite_error(&path)(source)),
        };
        match found {
            Some(found) if found > SCHEMA_VERSION => {
                Err(OpenError::NewerSchema { path, found, supported: SCHEMA_VERSION })
            }
            Some(found) if found == SCHEMA_VERSION => {
                let mut store = SqliteStore::with_connection(connection, Some(path));
                // Reads use the one read-only connection: a reader connection is opened
                // read-write, and the last one to close would checkpoint the WAL.
                store.readers = None;
                Ok(Some(store))
            }
            Some(_) | None => Ok(None),
        }
    }

    /// A private, empty ledger in memory, gone when the handle is dropped. For tests.
    ///
    /// # Errors
    ///
    /// [`OpenError::Sqlite`] when SQLite fails.
    pub fn open_in_memory() -> Result<SqliteStore, OpenError> {
        let path = PathBuf::from(":memory:");
        let mut connection = Connection::open_in_memory().map_err(sqlite_error(&path))?;
        stable_plans(&connection).map_err(sqlite_error(&path))?;
        migrate(&mut connection, &path)?;
        Ok(SqliteStore::with_connection(connection, None))
    }
}

/// Pause between attempts of [`configure_file`] that found the file busy.
const OPEN_BUSY_RETRY_DELAY: Duration = Duration::from_millis(10);

/// Attempts of [`configure_file`] after the first, together about [`BUSY_TIMEOUT`].
const OPEN_BUSY_RETRIES: u32 = 500;

/// Sets the file's pragmas and migrates it. Every step is idempotent, so a busy attempt can
/// simply be repeated.
fn configure_file(connection: &mut Connection, path: &Path) -> Result<(), OpenError> {
    let sqlite = sqlite_error(path);
    connection.busy_timeout(BUSY_TIMEOUT).map_err(&sqlite)?;
    let journal_mode: String = connection
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(&sqlite)?;
    if !journal_mode.eq_ignore_ascii_case("wal") {
        return Err(OpenError::NoWal { path: path.to_path_buf(), journal_mode });
    }
    // FULL, not NORMAL: NORMAL in WAL mode may lose the last commits on power loss.
    connection.pragma_update(None, "synchronous", "FULL").map_err(&sqlite)?;
    stable_plans(connection).map_err(&sqlite)?;
    migrate(connection, path)
}

/// Turns on SQLite's query planner stability guarantee (`SQLITE_DBCONFIG_ENABLE_QPSG`): a
/// cached statement keeps its plan whatever values are bound. Without it, SQLite marks a
/// statement for re-preparing when a bound parameter *might* change the plan (the
/// `events` table's partial index makes every `session_id = ?` such a parameter), so every
/// cached read of the events re-parsed and re-planned its SQL (~8% of `keel serve`'s CPU
/// under load, BENCHMARKS.md #15). keel's queries are planned by their indexes, never by
/// the values bound.
pub(super) fn stable_plans(connection: &Connection) -> rusqlite::Result<()> {
    connection.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

fn is_busy(error: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    error.downcast_ref::<rusqlite::Error>().and_then(rusqlite::Error::sqlite_error_code)
        == Some(rusqlite::ErrorCode::DatabaseBusy)
}

fn migrate(connection: &mut Connection, path: &Path) -> Result<(), OpenError> {
    match schema::migrate(connection).map_err(sqlite_error(path))? {
        schema::Migration::Current => Ok(()),
        schema::Migration::Newer(found) => Err(OpenError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: schema::LATEST,
        }),
    }
}

fn sqlite_error(path: &Path) -> impl Fn(rusqlite::Error) -> OpenError + use<> {
    let path = path.to_path_buf();
    move |source| OpenError::Sqlite { path: path.clone(), source: Box::new(source) }
}

/// Creates `dir` and its missing parents with mode 0700: the ledger holds every prompt,
/// tool result and diff of every session. An existing folder is left as it is.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Refuses a ledger whose file, or one of SQLite's files beside it, exists and is not a
/// regular file: SQLite opens them blocking, so a FIFO there would hang keel forever. It
/// is a `stat` (following symlinks), never an open, so the check itself cannot block.
/// What does not exist (yet) passes; what cannot be inspected is left to SQLite's error.
fn refuse_non_regular(path: &Path) -> Result<(), OpenError> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let name = beside(path, suffix);
        let Ok(metadata) = std::fs::metadata(&name) else { continue };
        let Some(kind) = kind_name(metadata.file_type()) else { continue };
        return Err(OpenError::NotRegular { path: name, kind });
    }
    Ok(())
}

/// One of SQLite's files beside the ledger at `path`: `path` with `suffix` (`-wal`, `-shm`,
/// `-journal`) appended to its name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// What a file of `kind` is, for an error; `None` for a regular file.
fn kind_name(kind: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    Some(if kind.is_file() {
        return None;
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else {
        "not a file"
    })
}

/// Creates the ledger file with mode 0600 when it does not exist, so SQLite (which gives
/// its `-wal` and `-shm` files the mode of the database file) never makes a readable one.
/// An existing file keeps its mode: the user may have chosen it.
fn create_private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

/// Opens `path` read-only (`immutable=1` when `immutable`) and reads its schema version:
/// `None` when it is not a WAL ledger with a `schema_version` table,
/// `Some((connection, None))` when that table is empty.
fn read_only_connection(
    path: &Path,
    immutable: bool,
) -> rusqlite::Result<Option<(Connection, Option<i64>)>> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
        | rusqlite::OpenFlags::SQLITE_OPEN_URI;
    let connection = if immutable {
        Connection::open_with_flags(file_uri(path, "immutable=1"), flags)?
    } else {
        Connection::open_with_flags(path, flags)?
    };
    connection.busy_timeout(BUSY_TIMEOUT)?;
    // An immutable open reports journal mode `delete` whatever the file's header says.
    let journal_mode: String =
        connection.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
    if !immutable && !journal_mode.eq_ignore_ascii_case("wal") {
        return Ok(None);
    }
    let has_version: bool = connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version')",
        [],
        |row| row.get(0),
    )?;
    if !has_version {
        return Ok(None);
    }
    let found: Option<i64> = connection
        .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
        .optional()?;
    Ok(Some((connection, found)))
}

/// `path` as an SQLite `file:` URI: every byte but unreserved ones percent-encoded.
fn file_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let mut uri = String::from("file:");
    for byte in path.as_os_str().as_bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' => {
                uri.push(char::from(*byte));
            }
            _ => uri.push_str(&format!("%{byte:02X}")),
        }
    }
    uri.push('?');
    uri.push_str(query);
    uri
}

/// Whether a read-only open failed because SQLite could not create the ledger's `-shm`
/// index: `SQLITE_CANTOPEN` while no `-shm` exists (a read-only connection creates one
/// wherever it can, so the folder cannot be written).
fn cannot_create_shm(path: &Path, error: &rusqlite::Error) -> bool {
    error.sqlite_error().map(|error| error.code) == Some(rusqlite::ErrorCode::CannotOpen)
        && beside(path, "-shm").symlink_metadata().is_err()
}

/// The read-only open of a ledger in a read-only folder: with no `-wal` and no
/// `-journal` beside it, the file alone is the whole ledger, and SQLite reads it
/// `immutable=1` (no `-shm`, no locks: nothing can be written there). A `-wal` or a
/// `-journal` would need a write to read correctly, so that is a clear error, never a
/// read that skips committed events.
fn read_in_read_only_folder(path: &Path) -> Result<(Connection, Option<i64>), OpenError> {
    for (suffix, why) in [
        ("-wal", "its write-ahead log (-wal) needs an index (-shm) created beside it"),
        ("-journal", "its rollback journal (-journal) must be rolled back first"),
    ] {
        if beside(path, suffix).symlink_metadata().is_ok() {
            return Err(OpenError::ReadOnlyHome {
                path: path.to_path_buf(),
                why: format!(
                    "{why}; make the folder writable (or copy it somewhere writable and point \
                     KEEL_HOME there)"
                ),
            });
        }
    }
    match read_only_connection(path, true) {
        Ok(Some(opened)) => Ok(opened),
        Ok(None) => Err(OpenError::ReadOnlyHome {
            path: path.to_path_buf(),
            why: "the file is not a keel ledger this version reads without migrating it".into(),
        }),
        Err(source) => Err(sqlite_error(path)(source)),
    }
}

/// Whether a read-only connection failed because the file needs a write first: SQLite's
/// `SQLITE_READONLY_ROLLBACK` (a hot journal to roll back), `SQLITE_READONLY_RECOVERY` (a
/// WAL index to rebuild), `SQLITE_READONLY_CANTINIT` and `SQLITE_READONLY_CANTLOCK` (the
/// shared-memory index cannot be set up read-only). Source: <https://sqlite.org/rescode.html>.
pub(super) fn needs_repair(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error().map(|error| error.extended_code),
        Some(
            rusqlite::ffi::SQLITE_READONLY_ROLLBACK
                | rusqlite::ffi::SQLITE_READONLY_RECOVERY
                | rusqlite::ffi::SQLITE_READONLY_CANTINIT
                | rusqlite::ffi::SQLITE_READONLY_CANTLOCK
        )
    )
}
