//! Workspace trust: the records `keel trust [DIR]` keeps, and what they say.
//!
//! A workspace's `.keel/config.toml` comes with the repository. Until the user trusts it,
//! keel applies only the keys that narrow (see the `config` module). `keel trust` records the
//! workspace's canonical path and the SHA-256 of the file's bytes in
//! `KEEL_HOME/trusted-workspaces.toml`; an edited file has another hash and is untrusted
//! again (like direnv's `allow`).
//!
//! The records are the user's, so a workspace must not be able to write or plant them:
//! records under a `KEEL_HOME` that lies inside the workspace are never used (and `keel
//! trust` refuses to write them), the file is read without following a symlink, without
//! blocking and with a size cap, and it is replaced atomically (a new file renamed over the
//! old name, so a planted symlink is replaced, not followed).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::error::usage;
use crate::safe_read::{self, Outcome};

/// File name of the records, under KEEL_HOME.
const RECORDS: &str = "trusted-workspaces.toml";
/// Largest records file read, in bytes.
const MAX_RECORDS_BYTES: u64 = 4 * 1024 * 1024;

/// Whether a workspace file with a given hash is trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// The user trusted this exact file.
    Trusted,
    /// Never trusted.
    Untrusted,
    /// Trusted once, but the file changed since.
    Changed,
    /// Trust cannot be decided (the reason says why); treated as untrusted.
    Unavailable(String),
}

impl State {
    /// `trusted`, `untrusted`, `changed since trusted` or `untrusted: REASON`.
    pub fn label(&self) -> String {
        match self {
            State::Trusted => "trusted".into(),
            State::Untrusted => "untrusted".into(),
            State::Changed => "untrusted: changed since it was trusted".into(),
            State::Unavailable(reason) => format!("untrusted: {reason}"),
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Records {
    #[serde(default)]
    workspace: Vec<Record>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    path: PathBuf,
    config_sha256: String,
    trusted_at: String,
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Why records under `home` cannot be used for `workspace`, if they cannot.
fn home_refusal(home: &Path, workspace: &Path) -> Option<String> {
    let canonical = home.canonicalize().unwrap_or_else(|_| absolute(home));
    canonical.starts_with(workspace).then(|| {
        format!(
            "KEEL_HOME ({}) is inside this workspace, so its trust records could come with \
             the repository",
            canonical.display()
        )
    })
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn read_records(home: &Path) -> Result<Records, String> {
    let path = home.join(RECORDS);
    let rules =
        safe_read::Rules { cap: MAX_RECORDS_BYTES, follow_symlink: false, confine_to: None };
    match safe_read::read(&path, rules) {
        Outcome::Missing => Ok(Records::default()),
        Outcome::Skipped(reason) => Err(format!("{} is not used: {reason}", path.display())),
        Outcome::Bytes(bytes) => {
            let text = String::from_utf8(bytes)
                .map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
            toml::from_str(&text).map_err(|error| format!("{} is invalid: {error}", path.display()))
        }
    }
}

/// The trust state of `workspace` (canonical) whose config file hashes to `sha256`.
pub fn state(home: &Path, workspace: &Path, sha256: &str) -> State {
    if let Some(reason) = home_refusal(home, workspace) {
        return State::Unavailable(reason);
    }
    match read_records(home) {
        Err(reason) => State::Unavailable(reason),
        Ok(records) => {
            let mine: Vec<&Record> =
                records.workspace.iter().filter(|record| record.path == workspace).collect();
            if mine.iter().any(|record| record.config_sha256 == sha256) {
                State::Trusted
            } else if mine.is_empty() {
                State::Untrusted
            } else {
                State::Changed
            }
        }
    }
}

/// Records `workspace` (canonical) with its config file's `sha256`, replacing an older
/// record of the same workspace.
pub fn record(home: &Path, workspace: &Path, sha256: &str) -> anyhow::Result<()> {
    if let Some(reason) = home_refusal(home, workspace) {
        return Err(usage(format!("cannot trust {}: {reason}", workspace.display())));
    }
    let mut records = read_records(home).map_err(|reason| {
        usage(format!("cannot record trust: {reason}; fix or remove it, then try again"))
    })?;
    records.workspace.retain(|record| record.path != workspace);
    records.workspace.push(Record {
        path: workspace.to_path_buf(),
        config_sha256: sha256.to_owned(),
        trusted_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    });
    let text = toml::to_string(&records).context("cannot encode the trust records")?;
    std::fs::create_dir_all(home).with_context(|| format!("cannot create {}", home.display()))?;
    let target = home.join(RECORDS);
    let temporary = home.join(format!(".{RECORDS}.{}.tmp", std::process::id()));
    // A leftover from a crashed `keel trust` with the same pid (never followed: unlinked).
    let _ = std::fs::remove_file(&temporary);
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temporary)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, &target)
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error).with_context(|| format!("cannot write {}", target.display()));
    }
    Ok(())
}

/// `keel trust '/path'`, quoted for a POSIX shell, with control characters made visible.
pub fn trust_command(workspace: &Path) -> String {
    let text = workspace.display().to_string();
    let safe = text.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+@%=:,".contains(c));
    if safe {
        return format!("keel trust {text}");
    }
    let escaped: String = text
        .chars()
        .flat_map(|c| match c {
            '\'' => "'\\''".chars().collect::<Vec<_>>(),
            c if c.is_control() => c.escape_default().collect(),
            c => vec![c],
        })
        .collect();
    format!("keel trust '{escaped}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_bind_path_and_hash_and_a_home_inside_the_workspace_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let ws = ws.path().canonicalize().unwrap();
        assert_eq!(state(home.path(), &ws, "aa"), State::Untrusted);
        record(home.path(), &ws, "aa").unwrap();
        assert_eq!(state(home.path(), &ws, "aa"), State::Trusted);
        assert_eq!(state(home.path(), &ws, "bb"), State::Changed);
        assert_eq!(state(home.path(), &ws.join("sub"), "aa"), State::Untrusted);
        let inner = ws.join("home");
        std::fs::create_dir(&inner).unwrap();
        assert!(matches!(state(&inner, &ws, "aa"), State::Unavailable(_)));
        assert!(record(&inner, &ws, "aa").is_err());
        assert!(!inner.join(RECORDS).exists());
    }

    #[test]
    fn the_suggested_command_is_quoted_for_a_shell() {
        assert_eq!(trust_command(Path::new("/w/repo")), "keel trust /w/repo");
        assert_eq!(trust_command(Path::new("/w/it's x")), "keel trust '/w/it'\\''s x'");
        assert_eq!(trust_command(Path::new("/w/a\x1bb")), "keel trust '/w/a\\u{1b}b'");
    }
}
