//! A throwaway PostgreSQL server for tests (feature `postgres`).
//!
//! [`PgServer::shared`] gives every test of one test binary the same server: the one named
//! by [`URL_VAR`] when that is set, else a private server started on first use with the
//! machine's PostgreSQL binaries (`initdb`, `pg_ctl`) in a fresh temp folder on a free
//! loopback port, run as the `postgres` user when the tests run as root (initdb refuses
//! root). Each test then takes its own database with [`PgServer::create_database`].
//!
//! The private server is stopped and its folder removed when the test binary exits, however
//! it exits: a small supervisor shell holds the read end of a pipe whose write end only
//! this process holds, and tears the server down when the pipe closes.
//!
//! With no binaries and no [`URL_VAR`], [`PgServer::shared`] panics with a loud message, so
//! a CI machine without PostgreSQL fails instead of passing vacuously; setting
//! [`SKIP_VAR`]`=1` turns that into a loud skip (`None`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// An admin URL (`postgres://user@host:port/dbname`, allowed to create databases) of an
/// existing server to use instead of starting one.
pub const URL_VAR: &str = "KEEL_TEST_POSTGRES_URL";

/// Set to `1` to skip (loudly) the PostgreSQL tests when no server can be had.
pub const SKIP_VAR: &str = "KEEL_SKIP_POSTGRES";

/// Attempts at starting the private server (a free port can be taken by someone else
/// between choosing it and the server binding it).
const START_ATTEMPTS: u32 = 3;

/// A PostgreSQL server the tests may create databases on.
#[derive(Debug)]
pub struct PgServer {
    /// The maintenance database's URL, as a user allowed to create databases.
    admin_url: String,
    /// `Some` for the private server: its supervisor, kept alive (with the write end of
    /// its stdin) until the process exits.
    supervisor: Option<Supervisor>,
}

/// A database of its own for one test.
///
/// On a server named by [`URL_VAR`] it is dropped with this handle; on the private
/// server it lives as long as the server.
#[derive(Debug)]
pub struct PgDatabase {
    name: String,
    url: String,
    /// The admin URL to drop the database through, when it must be dropped.
    drop_through: Option<String>,
}

#[derive(Debug)]
struct Supervisor {
    _child: Child,
    _stdin: ChildStdin,
    folder: PathBuf,
}

impl PgServer {
    /// The server shared by this test binary, started on first use.
    ///
    /// `None` only when no server can be had and [`SKIP_VAR`] is `1` (a banner on stderr
    /// says so).
    ///
    /// # Panics
    ///
    /// When no server can be had and skipping was not asked for, or when the private
    /// server fails to start (the message carries its logs).
    pub fn shared() -> Option<&'static PgServer> {
        static SERVER: OnceLock<Option<PgServer>> = OnceLock::new();
        SERVER.get_or_init(PgServer::find_or_start).as_ref()
    }

    /// The URL of the maintenance database (`postgres`).
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// The private server's folder (data directory, socket and logs), or `None` for a
    /// server named by [`URL_VAR`].
    pub fn folder(&self) -> Option<PathBuf> {
        self.supervisor.as_ref().map(|supervisor| supervisor.folder.clone())
    }

    /// Creates an empty database with a name unique to this process.
    ///
    /// Blocking (it runs on a thread of its own), so it can be called from sync tests
    /// and from inside a tokio runtime alike.
    ///
    /// # Panics
    ///
    /// When the server refuses.
    pub fn create_database(&self) -> PgDatabase {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name =
            format!("keel_test_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        admin_statement(&self.admin_url, &format!("CREATE DATABASE {name}"));
        PgDatabase {
            url: with_database(&self.admin_url, &name),
            drop_through: self.supervisor.is_none().then(|| self.admin_url.clone()),
            name,
        }
    }

    fn find_or_start() -> Option<PgServer> {
        if let Some(url) = std::env::var(URL_VAR).ok().filter(|url| !url.trim().is_empty()) {
            return Some(PgServer { admin_url: url.trim().to_owned(), supervisor: None });
        }
        let Some(bin) = find_binaries() else {
            let skip = std::env::var(SKIP_VAR).is_ok_and(|value| value == "1");
            let banner = "=".repeat(78);
            let what = "keel: POSTGRESQL TESTS CANNOT RUN: no `initdb` and `pg_ctl` on PATH or \
                        in /usr/lib/postgresql/*/bin, and KEEL_TEST_POSTGRES_URL is not set.";
            let fix = "Install PostgreSQL (Debian: apt-get install -y postgresql), or point \
                       KEEL_TEST_POSTGRES_URL at a server, or set KEEL_SKIP_POSTGRES=1 to skip \
                       these tests knowingly.";
            if skip {
                // Straight to the process's stderr, past the test harness's capture, so the
                // skip shows even though the tests pass.
                let _ = writeln!(
                    std::io::stderr(),
                    "{banner}\n{what}\nSKIPPING them because KEEL_SKIP_POSTGRES=1.\n{banner}"
                );
                return None;
            }
            panic!("\n{banner}\n{what}\n{fix}\n{banner}");
        };
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match start(&bin) {
                Ok(server) => return Some(server),
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "keel: cannot start a throwaway PostgreSQL server from {}:\n{}",
            bin.display(),
            failures.join("\n---\n")
        );
    }
}

impl PgDatabase {
    /// The database's URL, for `PgStore::connect` or `KEEL_DATABASE_URL`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        if let Some(admin_url) = self.drop_through.take() {
            let statement = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
            if let Err(error) = run_admin(&admin_url, &statement) {
                eprintln!("keel: could not drop test database {}: {error}", self.name);
            }
        }
    }
}

/// The folder holding both `initdb` and `pg_ctl`: the first on PATH, else Debian's newest
/// `/usr/lib/postgresql/N/bin`.
fn find_binaries() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    if let Some(dir) = on_path.into_iter().find(|dir| has_both(dir)) {
        // Absolute, so the postgres user (whose PATH may differ) runs the same binaries.
        return Some(dir.canonicalize().unwrap_or(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_both(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// The supervisor: starts the server, reports `ready FOLDER`, waits for its stdin to close
/// (this process exiting), then stops the server at once and removes the folder.
const SUPERVISOR: &str = r#"
set -u
bin=$1 port=$2 parent=$3
trap '' INT TERM HUP
dir=$(mktemp -d "$parent/keel-pg.XXXXXX") || { echo "failed: mktemp in $parent"; exit 1; }
if ! "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 -N >"$dir/initdb.log" 2>&1; then
  echo "failed: initdb"; cat "$dir/initdb.log"; rm -rf "$dir"; exit 1
fi
if ! "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1" start >"$dir/pg_ctl.log" 2>&1; then
  echo "failed: pg_ctl start"; cat "$dir/pg_ctl.log" "$dir/server.log"; rm -rf "$dir"; exit 1
fi
echo "ready $dir"
cat >/dev/null
"$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
rm -rf "$dir"
"#;

fn start(bin: &Path) -> Result<PgServer, String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|error| format!("no free port: {error}"))?
        .port();
    let as_root = std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0);
    let parent = if as_root { PathBuf::from("/tmp") } else { std::env::temp_dir() };
    let mut command = if as_root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--", "sh"]);
        command
    } else {
        Command::new("sh")
    };
    command
        .args(["-c", SUPERVISOR, "keel-pg-supervisor"])
        .arg(bin)
        .arg(port.to_string())
        .arg(&parent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child =
        command.spawn().map_err(|error| format!("cannot spawn {command:?}: {error}"))?;
    let stdin = child.stdin.take().ok_or("no stdin pipe")?;
    let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout pipe")?);
    let mut first = String::new();
    stdout.read_line(&mut first).map_err(|error| format!("supervisor: {error}"))?;
    if let Some(folder) = first.trim_end().strip_prefix("ready ") {
        let folder = PathBuf::from(folder);
        return Ok(PgServer {
            admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            supervisor: Some(Supervisor { _child: child, _stdin: stdin, folder }),
        });
    }
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    drop(stdin);
    let _ = child.wait();
    Err(format!("{first}{rest}"))
}

/// `url` with its database (the URL path) replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |at| at + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}

fn admin_statement(admin_url: &str, statement: &str) {
    if let Err(error) = run_admin(admin_url, statement) {
        panic!("keel: `{statement}` failed on the test server: {error}");
    }
}

/// Runs one statement on its own thread and runtime, so callers may be sync or async.
fn run_admin(admin_url: &str, statement: &str) -> Result<(), String> {
    let (admin_url, statement) = (admin_url.to_owned(), statement.to_owned());
    let worker = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| error.to_string())?;
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
                .await
                .map_err(|error| format!("cannot connect: {error}"))?;
            let connection = tokio::spawn(connection);
            let result = client.batch_execute(&statement).await.map_err(|error| {
                error.as_db_error().map_or_else(|| error.to_string(), ToString::to_string)
            });
            drop(client);
            let _ = connection.await;
            result
        })
    });
    worker.join().unwrap_or_else(|_| Err("admin thread panicked".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_is_replaced_in_a_url() {
        let cases = [
            ("postgres://u:p@h:5432/postgres", "postgres://u:p@h:5432/t1"),
            ("postgres://u@h", "postgres://u@h/t1"),
            ("postgresql://h/db?sslmode=disable", "postgresql://h/t1?sslmode=disable"),
            ("postgres://h?x=1", "postgres://h/t1?x=1"),
        ];
        for (url, expected) in cases {
            assert_eq!(with_database(url, "t1"), expected, "{url}");
        }
    }
}
