//! The workspace a run works in: canonical, and repaired of what a killed managed command
//! may have planted in it.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config;
use crate::error::usage;

/// `dir` (else the current directory) made canonical, after repairing what a killed
/// managed command may have planted in it.
///
/// # Errors
///
/// A [`usage`] error when it does not exist or is not a directory.
pub fn canonical_workspace(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match dir {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let canonical = dir
        .canonicalize()
        .map_err(|error| usage(format!("workspace {}: {error}", dir.display())))?;
    if !canonical.is_dir() {
        return Err(usage(format!("workspace {} is not a directory", canonical.display())));
    }
    // A keel killed during a managed command may have left plants (a git `commondir`, a
    // linked worktree entry) behind: repair them before anything reads the workspace. Only
    // notes authenticated with the user's key are trusted (never one from the repository).
    if let Ok(home) = config::keel_home() {
        crate::plant_key::install(&home, &canonical);
    }
    for note in keel_sandbox::recover_plants(&canonical) {
        eprintln!("keel: {note}");
    }
    Ok(canonical)
}
