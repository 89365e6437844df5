//! The JSON-lines file sink.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use keel_contracts::RuntimeEvent;

use crate::error::DeliveryError;
use crate::sink::Sink;

/// Events per append (and fsync).
const MAX_BATCH: usize = 1000;

/// Appends each event as one line of JSON (exactly the [`RuntimeEvent`] serialization, as
/// `keel log --json` prints it) to a file, and fsyncs once per batch.
///
/// A batch is appended under an exclusive lock on the file (several keel processes may
/// share it) and is either wholly in the file or not at all: a failed write or fsync is
/// cut off again. A torn last line left by a process that died mid-write is cut off
/// before the next append, so it is never glued to the next record.
#[derive(Debug, Clone)]
pub struct JsonlSink {
    path: PathBuf,
}

impl JsonlSink {
    /// A sink appending to `path` (created, with its folder, on first delivery).
    pub fn new(path: PathBuf) -> JsonlSink {
        JsonlSink { path }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[async_trait]
impl Sink for JsonlSink {
    fn target(&self) -> String {
        format!("jsonl:{}", self.path.display())
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    async fn deliver(&self, events: &[RuntimeEvent]) -> Result<(), DeliveryError> {
        let mut lines = Vec::new();
        for event in events {
            serde_json::to_writer(&mut lines, event).map_err(|error| DeliveryError::Serialize {
                session_id: event.session_id,
                seq: event.seq,
                message: error.to_string(),
            })?;
            lines.push(b'\n');
        }
        let path = self.path.clone();
        let file_error = |message: String| DeliveryError::File { path: self.path.clone(), message };
        tokio::task::spawn_blocking(move || append(&path, &lines))
            .await
            .map_err(|join| file_error(join.to_string()))?
            .map_err(|io| file_error(io.to_string()))
    }
}

/// Appends `bytes` (whole lines) to `path` durably, or leaves the file as it was.
fn append(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = OpenOptions::new().create(true).read(true).append(true).open(path)?;
    // Released when `file` is closed, also when this process dies.
    file.lock()?;
    let length = cut_torn_tail(&mut file)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_data());
    if let Err(error) = written {
        // Best effort: the batch is delivered again, so a partial copy must not stay.
        let _ = file.set_len(length).and_then(|()| file.sync_data());
        return Err(error);
    }
    Ok(())
}

/// Cuts the file back to its last complete line and returns its length. Only a writer
/// that died mid-append leaves a line without its newline; appends hold the lock.
fn cut_torn_tail(file: &mut File) -> std::io::Result<u64> {
    const CHUNK: u64 = 64 * 1024;
    let length = file.metadata()?.len();
    let mut end = length;
    let mut buffer = Vec::new();
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        buffer.clear();
        file.seek(SeekFrom::Start(start))?;
        Read::take(&mut *file, end - start).read_to_end(&mut buffer)?;
        if let Some(newline) = buffer.iter().rposition(|byte| *byte == b'\n') {
            end = start + newline as u64 + 1;
            break;
        }
        end = start;
    }
    if end != length {
        file.set_len(end)?;
        file.sync_data()?;
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_tail_is_cut_before_the_next_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, "{\"seq\":1}\n{\"seq\":2,\"ki").unwrap();
        append(&path, b"{\"seq\":2}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"seq\":1}\n{\"seq\":2}\n");
        // A file holding only a torn line is emptied first.
        std::fs::write(&path, "{\"seq\":1,\"ki").unwrap();
        append(&path, b"{\"seq\":1}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"seq\":1}\n");
    }

    #[test]
    fn missing_folders_are_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/events.jsonl");
        append(&path, b"{}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
    }
}
