//! Plants: what a command may create or change that the read-only mounts cannot prevent
//! (a new `commondir`, a file a config includes, a new `.git/worktrees/<name>`, a
//! protected symbolic link replaced), removed or put back on every exit path.
//!
//! Before a managed command starts, [`PlantGuard::arm`] writes a durable note of what to
//! check to `<workspace>/.keel/sandbox/` (read-only for the command, so it cannot erase the
//! note). When the run ends (normal end, timeout, or the future dropped) the guard waits
//! for the command's process namespace to be gone, repairs and deletes the note. After a
//! crash of keel the note stays; [`recover`] (called before every managed command, and by
//! the CLI at start) repairs what a note names once the keel process that wrote it is
//! gone.
//!
//! Repairs never follow a symbolic link and never touch a path outside the writable roots
//! recorded in the note; a note read back by [`recover`] touches nothing outside the
//! workspace it was found in.
//!
//! A note is authenticated: it carries an HMAC-SHA256 over the workspace path and its
//! content, keyed by a secret the embedding program sets once ([`set_plant_note_key`];
//! keel-cli keeps it in `KEEL_HOME`). [`recover`] repairs only what a note with a valid tag
//! names, so a note that came with a cloned repository, or one an injected command forged
//! through a symlinked `.keel`, is removed unread: it could otherwise name any path to
//! delete or replace. Without a key, no durable note is written and none is trusted.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::protected::ProtectedPaths;
use crate::sys;

/// How long the repair waits for the killed namespace's processes to be gone.
const NAMESPACE_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Where the durable notes live, under the workspace.
const NOTE_DIR: &str = ".keel/sandbox";

/// A path or file name as raw bytes (any name survives JSON).
type Bytes = Vec<u8>;

/// The key durable notes are authenticated with (see the module doc).
static NOTE_KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();

/// Sets the secret that authenticates durable plant notes, once per process (later calls
/// are ignored). Until it is set, plants are still repaired when a run ends, but no durable
/// note is written and none found in a workspace is trusted.
pub fn set_plant_note_key(key: [u8; 32]) {
    let _ = NOTE_KEY.set(key);
}

/// The note's MAC: HMAC-SHA256 over the canonical workspace path, a NUL, and the note's JSON
/// with an empty tag.
fn mac_of(key: &[u8; 32], workspace: &Path, note: &Note) -> Option<hmac::Hmac<sha2::Sha256>> {
    use hmac::Mac;
    let mut untagged = note.clone();
    untagged.mac = String::new();
    let body = serde_json::to_vec(&untagged).ok()?;
    let workspace = workspace.canonicalize().unwrap_or_else(|_| workspace.to_path_buf());
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).ok()?;
    mac.update(workspace.as_os_str().as_bytes());
    mac.update(&[0]);
    mac.update(&body);
    Some(mac)
}

/// The note's tag, hex.
fn tag(key: &[u8; 32], workspace: &Path, note: &Note) -> Option<String> {
    use hmac::Mac;
    Some(hex::encode(mac_of(key, workspace, note)?.finalize().into_bytes()))
}

/// Whether `note` was written by a keel holding the key, for `workspace` (constant-time).
fn authentic(workspace: &Path, note: &Note) -> bool {
    use hmac::Mac;
    let (Some(key), Ok(claimed)) = (NOTE_KEY.get(), hex::decode(&note.mac)) else {
        return false;
    };
    mac_of(key, workspace, note).is_some_and(|mac| mac.verify_slice(&claimed).is_ok())
}

/// The durable note: paths as raw bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Note {
    /// The keel process that wrote the note and its start time (clock ticks since boot),
    /// so that a live run's note is not repaired under it.
    keel_pid: u32,
    keel_started: u64,
    writable: Vec<Bytes>,
    absent: Vec<Bytes>,
    watched: Vec<(Bytes, Option<Vec<Bytes>>)>,
    links: Vec<(Bytes, Bytes)>,
    /// The tag ([`tag`]), hex.
    #[serde(default)]
    mac: String,
}

/// Repairs plants when dropped (or when [`PlantGuard::finish`] is called) and deletes the
/// durable note.
#[derive(Debug)]
pub(crate) struct PlantGuard {
    note: Note,
    note_path: Option<PathBuf>,
    /// Read end of the pipe the shim reports the namespace init's pid on: before repairing,
    /// the guard waits until that init (and with it every process of the command) is gone.
    init_report: Option<OwnedFd>,
    done: bool,
}

impl PlantGuard {
    /// Records what to repair for a run over `writable` roots (the first is the
    /// workspace). Returns the guard and, when no durable note could be written, a note
    /// saying so (the repairs after the run still happen).
    pub(crate) fn arm(
        writable: &[PathBuf],
        protected: &ProtectedPaths,
    ) -> (PlantGuard, Option<String>) {
        let bytes = |path: &Path| path.as_os_str().as_bytes().to_vec();
        let note = Note {
            keel_pid: std::process::id(),
            keel_started: process_started(std::process::id()).unwrap_or(0),
            writable: writable.iter().map(|path| bytes(path)).collect(),
            absent: protected.absent.iter().map(|path| bytes(path)).collect(),
            watched: protected
                .watched
                .iter()
                .map(|(dir, names)| {
                    (
                        bytes(dir),
                        names.as_ref().map(|names| {
                            names.iter().map(|name| name.as_bytes().to_vec()).collect()
                        }),
                    )
                })
                .collect(),
            links: protected
                .links
                .iter()
                .map(|(link, target)| (bytes(link), bytes(target)))
                .collect(),
            mac: String::new(),
        };
        let mut guard = PlantGuard { note, note_path: None, init_report: None, done: false };
        // Without a key (an embedding that never set one) nothing durable is written: the
        // repairs after the run still happen, and no unauthenticated note is left to trust.
        let (Some(workspace), Some(_)) = (writable.first(), NOTE_KEY.get()) else {
            return (guard, None);
        };
        match write_note(workspace, &guard.note) {
            Ok(path) => {
                guard.note_path = Some(path);
                (guard, None)
            }
            Err(error) => (
                guard,
                Some(format!(
                    "keel sandbox: no durable plant note in {}: {error}; plants are still \
                     removed when this run ends",
                    workspace.join(NOTE_DIR).display()
                )),
            ),
        }
    }

    /// Makes the repair wait for the command's process namespace to be gone first.
    pub(crate) fn wait_for_namespace(&mut self, init_report: OwnedFd) {
        self.init_report = Some(init_report);
    }

    /// Repairs now and returns a note per repair.
    pub(crate) fn finish(mut self) -> Vec<String> {
        self.repair()
    }

    fn repair(&mut self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        if let Some(init_report) = self.init_report.take() {
            sys::wait_for_namespace(&init_report, NAMESPACE_EXIT_WAIT);
        }
        let notes = repair(&self.note, None);
        if let Some(path) = &self.note_path {
            let _ = std::fs::remove_file(path);
            // The notes folder goes when it is empty (another run's note keeps it).
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
        notes
    }
}

impl Drop for PlantGuard {
    fn drop(&mut self) {
        self.repair();
    }
}

/// Repairs what the durable notes in `workspace` name whose keel process is gone (a crash
/// during a managed command), then deletes them. Returns a note per repair. A note that
/// cannot be read is left in place and reported.
pub(crate) fn recover(workspace: &Path) -> Vec<String> {
    // The sweep below removes files and the folder: only in a real `.keel/sandbox`.
    let dir = workspace.join(NOTE_DIR);
    if !real_dir(&workspace.join(".keel")).unwrap_or(false) || !real_dir(&dir).unwrap_or(false) {
        return Vec::new();
    }
    let mut notes = Vec::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|file_type| file_type.is_file()) {
            continue;
        }
        // Only keel's own names (`plants-*.json`, as `write_note` makes them): anything
        // else in the folder is not a note and is left as it is.
        let name = entry.file_name();
        let name = name.as_bytes();
        if !(name.starts_with(b"plants-") && name.ends_with(b".json")) {
            continue;
        }
        let note: Note = match std::fs::read(&path)
            .map_err(|error| error.to_string())
            .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|error| error.to_string()))
        {
            Ok(note) => note,
            Err(error) => {
                notes.push(format!(
                    "keel sandbox: cannot read the plant note {}: {error}",
                    path.display()
                ));
                continue;
            }
        };
        // The keel process the note names is still running its command (its own guard
        // repairs), whether or not this keel can verify the note.
        let writer_alive = note.keel_pid != 0
            && process_started(note.keel_pid).is_some_and(|started| started == note.keel_started);
        if !authentic(workspace, &note) {
            // Not written by a keel holding this key: a note that came with the repository,
            // a forged one, or one of a keel with another KEEL_HOME (another key) working
            // in the same workspace. Never acted upon. Removed (when keel can verify notes
            // at all) only once the process it names is gone: removing a live run's note
            // would cost that run its crash recovery, and leaving a forged one that names a
            // live process does nothing.
            if NOTE_KEY.get().is_some() && !writer_alive {
                let _ = std::fs::remove_file(&path);
                notes.push(format!(
                    "keel sandbox: ignored and removed {}: a plant note this keel cannot verify \
                     (not written by it: from the repository, forged, or of a keel with \
                     another KEEL_HOME that is gone)",
                    path.display()
                ));
            }
            continue;
        }
        if note.keel_pid == 0 || writer_alive {
            continue;
        }
        notes.extend(repair(&note, Some(workspace)));
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir(&dir);
    notes
}

/// Whether `path` is a directory itself, not a symbolic link to one. Neither `.keel` nor
/// `.keel/sandbox` may be a link: a cloned repository (or a command, in a folder a later
/// run is started in) could point either outside the workspace, where the sweep would
/// remove files and a note would be written. `Err` when `path` cannot be inspected (it does
/// not exist).
fn real_dir(path: &Path) -> std::io::Result<bool> {
    let meta = path.symlink_metadata()?;
    Ok(meta.is_dir() && !meta.file_type().is_symlink())
}

fn write_note(workspace: &Path, note: &Note) -> std::io::Result<PathBuf> {
    let Some(key) = NOTE_KEY.get() else {
        return Err(std::io::Error::other("no key to authenticate it (set_plant_note_key)"));
    };
    let mut note = note.clone();
    note.mac = tag(key, workspace, &note)
        .ok_or_else(|| std::io::Error::other("the note could not be authenticated"))?;
    let note = &note;
    if !real_dir(&workspace.join(".keel"))? {
        return Err(std::io::Error::other(".keel is not a directory"));
    }
    let dir = workspace.join(NOTE_DIR);
    match dir.symlink_metadata() {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(std::io::Error::other("it is not a directory")),
        Err(_) => std::fs::create_dir(&dir)?,
    }
    let json = serde_json::to_vec(note).map_err(std::io::Error::other)?;
    // Written whole under a name the sweep skips, then renamed to `plants-*.json`: another
    // keel's sweep never reads a note half written (and reports it unreadable).
    let mut file =
        tempfile::Builder::new().prefix(".writing-plants-").suffix(".json").tempfile_in(&dir)?;
    std::io::Write::write_all(&mut file, &json)?;
    let written = file.path().file_name().and_then(|name| name.to_str()).unwrap_or_default();
    let name = written.strip_prefix(".writing-").unwrap_or("plants-note.json").to_owned();
    let path = dir.join(name);
    file.persist_noclobber(&path).map_err(|error| error.error)?;
    Ok(path)
}

fn path_of(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(bytes.to_vec()))
}

/// Repairs one note's plants. A note read back from disk (`within` = the workspace it was
/// found in) reaches only paths inside that workspace, whatever writable roots it names:
/// even an authentic-looking note (its key leaked) can then remove or re-link nothing a
/// command in that workspace could not already write. The guard's own in-memory note
/// (`within` = `None`) covers every writable root of its command.
fn repair(note: &Note, within: Option<&Path>) -> Vec<String> {
    let writable: Vec<PathBuf> = note.writable.iter().map(|bytes| path_of(bytes)).collect();
    let within = within.map(|workspace| workspace.canonicalize().ok());
    let inside = |path: &Path| -> bool {
        // The parent is resolved (it exists when something is there to remove); the last
        // component is never followed.
        path.parent().and_then(|parent| parent.canonicalize().ok()).is_some_and(|parent| {
            writable.iter().any(|root| parent.starts_with(root))
                && match &within {
                    None => true,
                    Some(Some(workspace)) => parent.starts_with(workspace),
                    Some(None) => false,
                }
        })
    };
    let mut notes = Vec::new();
    for bytes in &note.absent {
        let path = path_of(bytes);
        if path.symlink_metadata().is_ok() && inside(&path) {
            let effect = if path.file_name() == Some(std::ffi::OsStr::new("commondir")) {
                "would redirect git to another config"
            } else {
                "git or keel would read as configuration"
            };
            notes.push(format!(
                "keel sandbox: the command created {}, which {effect}; {}",
                path.display(),
                outcome(remove_entry(&path))
            ));
        }
    }
    for (dir_bytes, before) in &note.watched {
        let dir = path_of(dir_bytes);
        let Ok(meta) = dir.symlink_metadata() else { continue };
        if meta.file_type().is_symlink() || !inside(&dir) {
            continue;
        }
        match before {
            None => notes.push(format!(
                "keel sandbox: the command created {}; {}",
                dir.display(),
                outcome(remove_entry(&dir))
            )),
            Some(names) => {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let name = entry.file_name();
                    if names.iter().any(|known| known.as_slice() == name.as_bytes()) {
                        continue;
                    }
                    let path = entry.path();
                    notes.push(format!(
                        "keel sandbox: the command created {}; {}",
                        path.display(),
                        outcome(remove_entry(&path))
                    ));
                }
            }
        }
    }
    for (link_bytes, target_bytes) in &note.links {
        let link = path_of(link_bytes);
        let target = path_of(target_bytes);
        if std::fs::read_link(&link).is_ok_and(|current| current == target) || !inside(&link) {
            continue;
        }
        let restored = match link.symlink_metadata() {
            Ok(_) => remove_entry(&link),
            Err(_) => Ok(()),
        }
        .and_then(|()| std::os::unix::fs::symlink(&target, &link));
        notes.push(format!(
            "keel sandbox: the command changed the protected link {}; {}",
            link.display(),
            match restored {
                Ok(()) => format!("put it back (-> {})", target.display()),
                Err(error) => format!("could not put it back: {error}"),
            }
        ));
    }
    notes
}

fn outcome(result: std::io::Result<()>) -> String {
    match result {
        Ok(()) => "removed it".to_owned(),
        Err(error) => format!("could not remove it: {error}"),
    }
}

/// Removes a file, link or directory tree without following links.
fn remove_entry(path: &Path) -> std::io::Result<()> {
    let meta = path.symlink_metadata()?;
    if meta.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) }
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22), `None`
/// when it is gone.
fn process_started(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X") {
        return None;
    }
    // Field 3 was the state; the start time is field 22.
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A note read back from a workspace reaches nothing outside it, even when it names
    /// `/` as writable (a note forged with a leaked key); inside, it still repairs.
    #[test]
    fn redteam_plant_note_from_disk_repairs_only_inside_its_workspace() {
        let bytes = |path: &Path| path.as_os_str().as_bytes().to_vec();
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let victim = outside.join("important.txt");
        let planted = workspace.join("planted");
        std::fs::write(&victim, "keep").unwrap();
        std::fs::write(&planted, "x").unwrap();
        let link = outside.join("bashrc");
        let note = Note {
            keel_pid: 0,
            keel_started: 0,
            writable: vec![b"/".to_vec()],
            absent: vec![bytes(&victim), bytes(&planted)],
            watched: Vec::new(),
            links: vec![(bytes(&link), bytes(&workspace.join("payload.sh")))],
            mac: String::new(),
        };
        let notes = repair(&note, Some(&workspace));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep", "{notes:?}");
        assert!(link.symlink_metadata().is_err(), "no link planted outside: {notes:?}");
        assert!(!planted.exists(), "inside the workspace it still repairs: {notes:?}");
        // The guard's own note (never read from disk) covers its writable roots.
        std::fs::write(&planted, "x").unwrap();
        let own = Note { writable: vec![bytes(&workspace.canonicalize().unwrap())], ..note };
        repair(&own, None);
        assert!(!planted.exists() && victim.exists());
    }

    #[test]
    fn own_start_time_is_known() {
        assert!(process_started(std::process::id()).is_some_and(|ticks| ticks > 0));
    }
}
