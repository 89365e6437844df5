//! The secret that authenticates the sandbox's durable plant notes
//! (`keel_sandbox::set_plant_note_key`): 32 random bytes in `KEEL_HOME/sandbox/plant-note.key`
//! (folder 0700, file 0600), made on first use. A note in a workspace is trusted only when
//! its tag verifies with this key, so a note that came with a cloned repository is never
//! acted upon.
//!
//! When the key cannot be read or made, or `KEEL_HOME` lies inside the workspace (where a
//! command or the repository could read or plant it), no key is set: plants are still
//! repaired when each run ends, but no durable note is written or trusted.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

const KEY_BYTES: usize = 32;

/// Loads (or makes) the key under `home` and hands it to keel-sandbox, unless `home` is
/// inside `workspace` (both canonical when they exist). Errors leave the key unset.
pub fn install(home: &Path, workspace: &Path) {
    let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
    if home.starts_with(workspace) {
        return;
    }
    if let Some(key) = load_or_make(&home.join("sandbox")) {
        keel_sandbox::set_plant_note_key(key);
    }
}

fn load_or_make(dir: &Path) -> Option<[u8; KEY_BYTES]> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).ok()?;
    let path = dir.join("plant-note.key");
    let read = |path: &Path| -> Option<[u8; KEY_BYTES]> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() != KEY_BYTES as u64 {
            return None;
        }
        let mut key = [0_u8; KEY_BYTES];
        file.read_exact(&mut key).ok()?;
        Some(key)
    };
    if let Some(key) = read(&path) {
        return Some(key);
    }
    let mut key = [0_u8; KEY_BYTES];
    std::fs::File::open("/dev/urandom").ok()?.read_exact(&mut key).ok()?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .ok();
    match &mut file {
        Some(file) => {
            file.write_all(&key).ok()?;
            file.sync_all().ok()?;
            Some(key)
        }
        // Another keel made it meanwhile: use that one.
        None => read(&path),
    }
}
