//! Instruction files (AGENTS.md) for the system prompt.
//!
//! Read in this order, nearest last (as codex does): the user's
//! `$XDG_CONFIG_HOME/keel/AGENTS.md` (else `~/.config/keel/AGENTS.md`), then `AGENTS.md` in
//! the workspace root and in each folder from there down to the current directory (when
//! it is inside the workspace). A workspace file comes with the repository, so it is read
//! only if it is a regular file that resolves inside the workspace (a symlink to a secret
//! elsewhere, `/proc/self/environ`, a FIFO or a device is skipped with a note, never read
//! and never waited on), and at most [`MAX_INSTRUCTIONS_BYTES`]; a larger or non-UTF-8
//! file is skipped, not truncated. The system prompt, and so these files, is recorded in
//! the ledger: what is never read never reaches it.

use std::path::{Path, PathBuf};

use keel_kernel::Instruction;

use crate::safe_read::{self, Outcome};

/// Largest instruction file put into the system prompt, in bytes.
pub const MAX_INSTRUCTIONS_BYTES: u64 = 64 * 1024;

const FILE_NAME: &str = "AGENTS.md";

/// The instruction files for a run in `workspace` (canonical), user's first; skipped files
/// are noted on stderr.
pub fn load(workspace: &Path, denied: &keel_contracts::DeniedPaths) -> Vec<Instruction> {
    let current = std::env::current_dir().ok().and_then(|dir| dir.canonicalize().ok());
    let (instructions, notes) =
        collect(crate::config::user_config_dir().as_deref(), workspace, current.as_deref(), denied);
    for note in notes {
        eprintln!("keel: {}", crate::safe_read::visible(&note, false));
    }
    instructions
}

/// The instructions and notes for `workspace`, with the user's folder and the current
/// directory given (testable without the process environment).
fn collect(
    user_dir: Option<&Path>,
    workspace: &Path,
    current: Option<&Path>,
    denied: &keel_contracts::DeniedPaths,
) -> (Vec<Instruction>, Vec<String>) {
    let mut instructions = Vec::new();
    let mut notes = Vec::new();
    if let Some(dir) = user_dir {
        let path = dir.join(FILE_NAME);
        let rules = safe_read::Rules {
            cap: MAX_INSTRUCTIONS_BYTES,
            follow_symlink: true,
            confine_to: None,
        };
        let source = format!("the user's {}", path.display());
        push(&mut instructions, &mut notes, &path, source, rules);
    }
    for dir in folders(workspace, current) {
        let path = dir.join(FILE_NAME);
        let source = match dir.strip_prefix(workspace) {
            Ok(relative) if relative.as_os_str().is_empty() => FILE_NAME.to_owned(),
            Ok(relative) => relative.join(FILE_NAME).display().to_string(),
            Err(_) => path.display().to_string(),
        };
        let rules = safe_read::Rules {
            cap: MAX_INSTRUCTIONS_BYTES,
            follow_symlink: true,
            confine_to: Some(workspace),
        };
        // The user's read-deny rules hold for instruction files too, on the path as written
        // and where a link leads: a repository's AGENTS.md linked to a denied `.env` puts
        // nothing into the prompt (or the ledger).
        let relative = |path: &Path| {
            path.strip_prefix(workspace).map_or_else(
                |_| path.display().to_string(),
                |relative| relative.display().to_string(),
            )
        };
        let resolved = path.canonicalize().ok();
        if denied.covers(&relative(&path))
            || resolved.as_deref().is_some_and(|real| denied.covers(&relative(real)))
        {
            notes.push(format!("skipped {source}: your deny rules cover it"));
            continue;
        }
        push(&mut instructions, &mut notes, &path, source, rules);
    }
    (instructions, notes)
}

fn push(
    instructions: &mut Vec<Instruction>,
    notes: &mut Vec<String>,
    path: &Path,
    source: String,
    rules: safe_read::Rules<'_>,
) {
    match safe_read::read(path, rules) {
        Outcome::Missing => {}
        Outcome::Skipped(reason) => notes.push(format!("skipped {source}: {reason}")),
        Outcome::Bytes(bytes) => match String::from_utf8(bytes) {
            Ok(text) => instructions.push(Instruction { source, text }),
            Err(_) => notes.push(format!("skipped {source}: it is not UTF-8 text")),
        },
    }
}

/// The workspace root, then each folder down to `current` when it is inside.
fn folders(workspace: &Path, current: Option<&Path>) -> Vec<PathBuf> {
    let mut folders = vec![workspace.to_path_buf()];
    if let Some(relative) = current.and_then(|current| current.strip_prefix(workspace).ok()) {
        let mut dir = workspace.to_path_buf();
        for component in relative.components() {
            dir.push(component);
            folders.push(dir.clone());
        }
    }
    folders
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> keel_contracts::DeniedPaths {
        keel_contracts::DeniedPaths::new(Vec::<String>::new(), "/")
    }

    #[test]
    fn redteam_trust_agents_md_linked_to_a_denied_file_is_not_read() {
        let ws = tempfile::tempdir().unwrap();
        let ws = ws.path().canonicalize().unwrap();
        std::fs::create_dir_all(ws.join("secrets")).unwrap();
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join(".env"), "DB_PASSWORD=hunter2\n").unwrap();
        std::fs::write(ws.join("secrets/key"), "TOKEN=sekrit\n").unwrap();
        std::os::unix::fs::symlink(".env", ws.join("AGENTS.md")).unwrap();
        std::os::unix::fs::symlink("../secrets/key", ws.join("sub/AGENTS.md")).unwrap();
        let workspace = ws.display().to_string();
        let denied = keel_contracts::DeniedPaths::new([".env", "secrets/**"], &workspace);
        let (found, notes) = collect(None, &ws, Some(&ws.join("sub")), &denied);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(notes.iter().filter(|n| n.contains("your deny rules cover it")).count(), 2);
        // The neighbour: an ordinary AGENTS.md next to them is read.
        std::fs::remove_file(ws.join("AGENTS.md")).unwrap();
        std::fs::write(ws.join("AGENTS.md"), "Run the tests.\n").unwrap();
        let (found, _) = collect(None, &ws, Some(&ws.join("sub")), &denied);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].text, "Run the tests.\n");
    }

    #[test]
    fn files_come_user_first_then_root_down_to_the_current_folder() {
        let user = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let ws = ws.path().canonicalize().unwrap();
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(user.path().join(FILE_NAME), "user").unwrap();
        std::fs::write(ws.join(FILE_NAME), "root").unwrap();
        std::fs::write(ws.join("a/b").join(FILE_NAME), "deep").unwrap();
        std::fs::write(ws.join("a").join(FILE_NAME), "x".repeat(70 * 1024)).unwrap();
        let (found, notes) = collect(Some(user.path()), &ws, Some(&ws.join("a/b")), &none());
        let texts: Vec<&str> = found.iter().map(|i| i.text.as_str()).collect();
        assert_eq!(texts, ["user", "root", "deep"]);
        assert_eq!(found[1].source, "AGENTS.md");
        assert_eq!(found[2].source, "a/b/AGENTS.md");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("skipped a/AGENTS.md: it is 71680 bytes"), "{notes:?}");
        // Outside the workspace, only its root is read.
        let (found, _) = collect(None, &ws, Some(user.path()), &none());
        assert_eq!(found.len(), 1);
    }
}
