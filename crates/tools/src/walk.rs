//! The workspace walker shared by `glob` and `grep`.
//!
//! It never follows symbolic links (so it cannot leave the workspace through one, nor loop
//! on a link cycle), skips `.git` directories, honours `.gitignore`, `.ignore` and
//! `.git/info/exclude` (also outside a git repository), shows hidden files otherwise, and
//! yields entries sorted by file name so results are stable. Paths the session's deny rules
//! deny for reading are skipped (with everything under them).

use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use ignore::{Walk, WalkBuilder};

use crate::deny::Denied;

/// A sorted, link-safe walk of `root` and everything below it, without the home folder's
/// credential stores and the paths the deny rules hide.
pub(crate) fn walk(root: &Path, denied: &Denied) -> Walk {
    let denied = denied.clone();
    let home = std::env::var_os("HOME").filter(|home| !home.is_empty()).map(PathBuf::from);
    let xdg_config =
        std::env::var_os("XDG_CONFIG_HOME").filter(|config| !config.is_empty()).map(PathBuf::from);
    let mut builder = WalkBuilder::new(root);
    builder
        .follow_links(false)
        .hidden(false)
        .git_global(false)
        .require_git(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(move |entry| {
            entry.file_name() != ".git"
                && !denied.covers(entry.path())
                && !keel_sandbox::is_credential_store(
                    entry.path(),
                    home.as_deref(),
                    xdg_config.as_deref(),
                )
        });
    builder.build()
}

/// Compiles a glob where `*` and `?` do not cross `/` and `**` spans directories.
pub(crate) fn compile_glob(pattern: &str) -> Result<GlobMatcher, String> {
    if pattern.is_empty() {
        return Err("glob pattern is empty".to_owned());
    }
    if pattern.starts_with('/') {
        return Err(format!(
            "glob pattern `{pattern}` is absolute; patterns are relative to `path` (default: \
             the workspace root)"
        ));
    }
    if pattern.split('/').any(|part| part == "..") {
        return Err(format!(
            "glob pattern `{pattern}` contains `..`; use `path` to pick the folder"
        ));
    }
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|error| format!("invalid glob pattern `{pattern}`: {error}"))
}
