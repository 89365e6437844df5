//! A sink's durable cursors: per session, the last seq the sink acknowledged, kept in
//! `<cursor_dir>/<sink>.json` and replaced atomically (temporary file, fsync, rename,
//! fsync of the folder).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use keel_contracts::{Seq, SessionId};
use serde::{Deserialize, Serialize};

use crate::error::OpenError;

/// The cursor file format version this crate writes and reads.
const VERSION: u32 = 1;

/// The cursor file as stored (see the crate docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CursorFile {
    version: u32,
    /// Where the sink delivers (`jsonl:/path`, `webhook:url`).
    target: String,
    /// When the cursor file was started for this target; sessions updated since then are
    /// mirrored even before a cursor exists for them.
    since: DateTime<Utc>,
    /// Per session, the last seq delivered.
    sessions: BTreeMap<SessionId, Seq>,
}

impl CursorFile {
    /// Reads `path`, or starts a new file (written before this returns) when there is none
    /// or it was kept for another target.
    pub(crate) fn open(path: &Path, target: &str, now: DateTime<Utc>) -> Result<Self, OpenError> {
        let error = |message: String| OpenError::Cursor { path: path.to_path_buf(), message };
        let fresh = CursorFile {
            version: VERSION,
            target: target.to_owned(),
            since: now,
            sessions: BTreeMap::new(),
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(io) if io.kind() == std::io::ErrorKind::NotFound => {
                fresh.write(path).map_err(|io| error(io.to_string()))?;
                return Ok(fresh);
            }
            Err(io) => return Err(error(io.to_string())),
        };
        let stored: CursorFile = serde_json::from_str(&text).map_err(|decode| {
            error(format!("does not decode ({decode}); remove it to start the sink afresh"))
        })?;
        if stored.version != VERSION {
            return Err(error(format!("unknown version {}", stored.version)));
        }
        if stored.target != target {
            fresh.write(path).map_err(|io| error(io.to_string()))?;
            return Ok(fresh);
        }
        Ok(stored)
    }

    /// The last seq delivered for `session_id`, if any was.
    pub(crate) fn get(&self, session_id: SessionId) -> Option<Seq> {
        self.sessions.get(&session_id).copied()
    }

    /// Records that everything up to `seq` of `session_id` was delivered (in memory only).
    pub(crate) fn advance(&mut self, session_id: SessionId, seq: Seq) {
        let entry = self.sessions.entry(session_id).or_default();
        *entry = (*entry).max(seq);
    }

    pub(crate) fn since(&self) -> DateTime<Utc> {
        self.since
    }

    /// Replaces the file at `path` with these cursors, merged with what another process
    /// may have written there meanwhile for the same target (the larger seq wins: cursors
    /// only move forward).
    pub(crate) fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut merged = self.clone();
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(other) = serde_json::from_str::<CursorFile>(&text)
            && other.version == VERSION
            && other.target == self.target
        {
            for (session_id, seq) in other.sessions {
                merged.advance(session_id, seq);
            }
        }
        let dir = parent_dir(path);
        let mut file = tempfile::NamedTempFile::new_in(&dir)?;
        serde_json::to_writer(&mut file, &merged)?;
        file.write_all(b"\n")?;
        file.as_file().sync_all()?;
        file.persist(path).map_err(|error| error.error)?;
        std::fs::File::open(&dir)?.sync_all()
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(n: u128) -> SessionId {
        SessionId(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn a_new_file_is_written_at_once_and_reopens_with_its_cursors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.json");
        let now = DateTime::<Utc>::from_timestamp(1_767_225_600, 0).unwrap();
        let mut cursors = CursorFile::open(&path, "jsonl:/x", now).unwrap();
        assert!(path.exists());
        cursors.advance(session(1), Seq(4));
        cursors.advance(session(1), Seq(2));
        cursors.write(&path).unwrap();
        let reopened = CursorFile::open(&path, "jsonl:/x", Utc::now()).unwrap();
        assert_eq!(reopened.get(session(1)), Some(Seq(4)));
        assert_eq!(reopened.since(), now);
        // Another target starts afresh.
        let elsewhere = CursorFile::open(&path, "jsonl:/y", Utc::now()).unwrap();
        assert_eq!(elsewhere.get(session(1)), None);
    }

    #[test]
    fn writes_merge_with_another_process_cursors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.json");
        let mut first = CursorFile::open(&path, "t", Utc::now()).unwrap();
        let mut second = CursorFile::open(&path, "t", Utc::now()).unwrap();
        first.advance(session(1), Seq(5));
        first.write(&path).unwrap();
        second.advance(session(2), Seq(3));
        second.advance(session(1), Seq(2));
        second.write(&path).unwrap();
        let merged = CursorFile::open(&path, "t", Utc::now()).unwrap();
        assert_eq!(merged.get(session(1)), Some(Seq(5)));
        assert_eq!(merged.get(session(2)), Some(Seq(3)));
    }

    #[test]
    fn a_corrupt_file_is_an_error_not_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.json");
        std::fs::write(&path, "{not json").unwrap();
        let error = CursorFile::open(&path, "t", Utc::now()).unwrap_err();
        assert!(error.to_string().contains("remove it to start the sink afresh"), "{error}");
    }
}
