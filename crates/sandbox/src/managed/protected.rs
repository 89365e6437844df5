//! Protected paths inside the writable workspace (B08): what keel makes read-only so that
//! code which later runs outside the sandbox (git hooks, git config, keel's own config)
//! cannot be planted from inside it.
//!
//! Landlock only grants, it cannot carve a read-only hole out of a writable tree, so these
//! paths are bind-mounted read-only in the child's private mount namespace. For every git
//! directory under the root (the root's `.git`, nested repositories, submodule git dirs
//! under `.git/modules`):
//! - `hooks/` and `config` (and `config.worktree` when present) are read-only, as is the
//!   `core.hooksPath` directory when the config names one inside the workspace;
//! - the git directory itself is pinned (bind-mounted onto itself, still writable), so it
//!   cannot be renamed away and replaced by a planted one. `objects`, `refs`, `index`,
//!   `HEAD`, `logs` and the rest stay writable: `git add` and `git commit` work.
//!
//! A `.git` file (worktree or submodule pointer) is read-only, and so is the `commondir`
//! pointer of each linked worktree under `.git/worktrees/`. `.keel/` at the root is
//! read-only; it is created empty when missing so that it cannot be planted. A missing
//! `hooks/` directory is created empty for the same reason. A `commondir` file planted in a
//! git directory that had none (it would redirect git to a planted config) cannot be
//! prevented by a mount; the run removes it afterwards ([`ProtectedPaths::missing_commondir`]).
//!
//! Every directory between the root and a protected path is pinned too: a mount point
//! cannot be renamed, so `mv vendor elsewhere` cannot move a protected repository away and
//! leave room for a planted one at its old path.
//!
//! An extra writable path of a widened boundary gets the same treatment for the
//! repositories under it (and an existing `.keel/` directly in it); one inside a git
//! directory protects that git directory's hooks and config.
//!
//! Not covered (see SECURITY.md): a repository the sandboxed command creates itself, and
//! bare repositories not named `.git`.

use std::path::{Path, PathBuf};

/// Entries scanned at most looking for repositories; a larger workspace is refused rather
/// than half-protected.
const MAX_SCANNED_ENTRIES: usize = 2_000_000;

/// What to protect, in mount order: pins first, then read-only paths.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ProtectedPaths {
    /// Git directories pinned in place (writable, not renamable).
    pub(crate) pinned: Vec<PathBuf>,
    /// Paths made read-only.
    pub(crate) read_only: Vec<PathBuf>,
    /// Git directories without a `commondir` file before the run.
    pub(crate) missing_commondir: Vec<PathBuf>,
}

/// Finds (and where needed creates) the protected paths under the canonical `workspace`
/// and under each canonical extra writable path of a widened boundary.
///
/// For an extra writable path: the repositories under it are protected like the
/// workspace's, an existing `.keel/` directly in it is read-only (none is created there),
/// and when it lies inside a git directory that git directory is protected too.
pub(crate) fn find(workspace: &Path, extra_write: &[PathBuf]) -> Result<ProtectedPaths, String> {
    let mut protected = ProtectedPaths::default();
    let keel_dir = workspace.join(".keel");
    if keel_dir.symlink_metadata().is_err() {
        std::fs::create_dir(&keel_dir)
            .map_err(|error| format!("cannot create {}: {error}", keel_dir.display()))?;
    }
    protected.read_only.push(keel_dir);

    let writable: Vec<&Path> =
        std::iter::once(workspace).chain(extra_write.iter().map(PathBuf::as_path)).collect();
    let mut n_scanned = 0_usize;
    scan(workspace, &writable, &mut protected, &mut n_scanned)?;
    for root in extra_write {
        if let Some(git_dir) = root
            .ancestors()
            .find(|dir| dir.file_name() == Some(std::ffi::OsStr::new(".git")) && dir.is_dir())
        {
            protect_git_dir(&writable, git_dir, &mut protected)?;
        }
        if root.is_dir() {
            let keel_dir = root.join(".keel");
            if keel_dir.symlink_metadata().is_ok() {
                protected.read_only.push(keel_dir);
            }
            scan(root, &writable, &mut protected, &mut n_scanned)?;
        }
    }

    let mut ancestors = Vec::new();
    for path in protected.pinned.iter().chain(&protected.read_only) {
        for root in &writable {
            let mut ancestor = path.parent();
            while let Some(dir) = ancestor
                && dir != *root
                && dir.starts_with(root)
            {
                ancestors.push(dir.to_owned());
                ancestor = dir.parent();
            }
        }
    }
    // Read-only directories need no pin of their own.
    ancestors.retain(|dir| !protected.read_only.contains(dir));
    protected.pinned.extend(ancestors);
    protected.pinned.sort();
    protected.pinned.dedup();
    protected.read_only.sort();
    protected.read_only.dedup();
    protected.missing_commondir.sort();
    protected.missing_commondir.dedup();
    Ok(protected)
}

/// Protects every repository found under `root` (`.git` directories and files).
fn scan(
    root: &Path,
    writable: &[&Path],
    protected: &mut ProtectedPaths,
    n_scanned: &mut usize,
) -> Result<(), String> {
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            *n_scanned += 1;
            if *n_scanned > MAX_SCANNED_ENTRIES {
                return Err(format!(
                    "the workspace and extra writable paths have more than \
                     {MAX_SCANNED_ENTRIES} entries to scan for nested git repositories"
                ));
            }
            let Ok(file_type) = entry.file_type() else { continue };
            let path = entry.path();
            if entry.file_name() == ".git" {
                if file_type.is_dir() {
                    protect_git_dir(writable, &path, protected)?;
                } else if file_type.is_file() {
                    protected.read_only.push(path);
                }
                // A `.git` symbolic link is not followed (see SECURITY.md).
                continue;
            }
            if file_type.is_dir() {
                stack.push(path);
            }
        }
    }
    Ok(())
}

fn protect_git_dir(
    writable: &[&Path],
    git_dir: &Path,
    protected: &mut ProtectedPaths,
) -> Result<(), String> {
    protected.pinned.push(git_dir.to_owned());
    let hooks = git_dir.join("hooks");
    if hooks.symlink_metadata().is_err() {
        std::fs::create_dir(&hooks)
            .map_err(|error| format!("cannot create {}: {error}", hooks.display()))?;
    }
    protected.read_only.push(hooks);
    let config = git_dir.join("config");
    if config.symlink_metadata().is_err() {
        std::fs::write(&config, "")
            .map_err(|error| format!("cannot create {}: {error}", config.display()))?;
    }
    if let Some(hooks_path) = configured_hooks_path(&config, git_dir)
        && writable.iter().any(|root| hooks_path.starts_with(root))
    {
        if hooks_path.symlink_metadata().is_err() {
            std::fs::create_dir_all(&hooks_path)
                .map_err(|error| format!("cannot create {}: {error}", hooks_path.display()))?;
        }
        protected.read_only.push(hooks_path);
    }
    protected.read_only.push(config);
    // `config.worktree` (read when extensions.worktreeConfig is on, which sparse-checkout
    // turns on) can set core.fsmonitor or core.hooksPath: keep it read-only, creating an
    // empty one where there is none, so none can be planted.
    let worktree_config = git_dir.join("config.worktree");
    if worktree_config.symlink_metadata().is_err() {
        std::fs::write(&worktree_config, "")
            .map_err(|error| format!("cannot create {}: {error}", worktree_config.display()))?;
    }
    protected.read_only.push(worktree_config);
    if git_dir.join("commondir").symlink_metadata().is_err() {
        protected.missing_commondir.push(git_dir.to_owned());
    }
    if let Ok(entries) = std::fs::read_dir(git_dir.join("worktrees")) {
        for entry in entries.flatten() {
            let commondir = entry.path().join("commondir");
            if commondir.is_file() {
                protected.read_only.push(commondir);
            }
            // Each linked worktree has its own config.worktree, with the same powers.
            if entry.file_type().is_ok_and(|file_type| file_type.is_dir()) {
                let config = entry.path().join("config.worktree");
                if config.symlink_metadata().is_err() {
                    std::fs::write(&config, "")
                        .map_err(|error| format!("cannot create {}: {error}", config.display()))?;
                }
                protected.read_only.push(config);
            }
        }
    }
    // Submodule git directories: `modules/<name>/` (nested arbitrarily deep), each a git
    // directory with its own hooks and config.
    let mut stack = vec![git_dir.join("modules")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|file_type| file_type.is_dir()) {
                continue;
            }
            let path = entry.path();
            if path.join("HEAD").is_file() && path.join("objects").is_dir() {
                protect_git_dir(writable, &path, protected)?;
            } else {
                stack.push(path);
            }
        }
    }
    Ok(())
}

/// The `core.hooksPath` a git config names, resolved against the repository's work tree
/// (the git directory's parent). A simple line scan: keys are case-insensitive and the
/// value may be quoted.
fn configured_hooks_path(config: &Path, git_dir: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(config).ok()?;
    let value = text.lines().rev().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        key.trim().eq_ignore_ascii_case("hookspath").then(|| config_value(value))
    })?;
    if value.is_empty() {
        return None;
    }
    // git expands `~/` in path values (core.hooksPath is one).
    let expanded = match value.strip_prefix("~/") {
        Some(rest) => PathBuf::from(std::env::var_os("HOME")?).join(rest),
        None => PathBuf::from(&value),
    };
    let resolved = if expanded.is_absolute() { expanded } else { git_dir.parent()?.join(expanded) };
    Some(normalize(&resolved))
}

/// A git config value as git reads it: an inline `;` or `#` comment outside double quotes
/// ends it, the quotes themselves are dropped, surrounding blanks are trimmed.
fn config_value(raw: &str) -> String {
    let mut value = String::new();
    let mut quoted = false;
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => {
                if let Some(next) = chars.next() {
                    value.push(next);
                }
            }
            ';' | '#' if !quoted => break,
            other => value.push(other),
        }
    }
    value.trim().to_owned()
}

/// Folds `.` and `..` lexically (the path may not exist yet).
fn normalize(path: &Path) -> PathBuf {
    let mut normalized = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                normalized.pop();
            }
            std::path::Component::CurDir => {}
            other => normalized.push(other),
        }
    }
    normalized
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_values_lose_inline_comments_and_quotes() {
        assert_eq!(config_value(" .hooks ; shared hooks"), ".hooks");
        assert_eq!(config_value(" .hooks # shared"), ".hooks");
        assert_eq!(config_value(" \".ho;oks\" ; c"), ".ho;oks");
        assert_eq!(config_value(" plain"), "plain");
    }

    fn git_dir(path: &Path) {
        std::fs::create_dir_all(path.join("objects")).unwrap();
        std::fs::create_dir_all(path.join("hooks")).unwrap();
        std::fs::write(path.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(path.join("config"), "[core]\n").unwrap();
    }

    #[test]
    fn finds_root_nested_and_submodule_repositories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        git_dir(&root.join(".git"));
        git_dir(&root.join("vendor/lib/.git"));
        git_dir(&root.join(".git/modules/sub"));
        std::fs::remove_dir(root.join(".git/modules/sub/hooks")).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
        std::fs::write(root.join("vendor/lib/.git/config"), "[core]\n\thooksPath = \"../hooks\"\n")
            .unwrap();

        let protected = find(&root, &[]).unwrap();
        assert_eq!(
            protected.pinned,
            [
                root.join(".git"),
                root.join(".git/modules"),
                root.join(".git/modules/sub"),
                root.join("sub"),
                root.join("vendor"),
                root.join("vendor/lib"),
                root.join("vendor/lib/.git"),
            ]
        );
        assert_eq!(
            protected.read_only,
            [
                root.join(".git/config"),
                root.join(".git/config.worktree"),
                root.join(".git/hooks"),
                root.join(".git/modules/sub/config"),
                root.join(".git/modules/sub/config.worktree"),
                root.join(".git/modules/sub/hooks"),
                root.join(".keel"),
                root.join("sub/.git"),
                root.join("vendor/hooks"),
                root.join("vendor/lib/.git/config"),
                root.join("vendor/lib/.git/config.worktree"),
                root.join("vendor/lib/.git/hooks"),
            ]
        );
        assert!(root.join(".keel").is_dir(), "created so it cannot be planted");
        assert!(root.join(".git/modules/sub/hooks").is_dir(), "created so it cannot be planted");
        assert!(root.join("vendor/hooks").is_dir(), "hooksPath target created");
    }

    #[test]
    fn hooks_path_outside_the_workspace_is_not_mounted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap().join("ws");
        git_dir(&root.join(".git"));
        std::fs::write(root.join(".git/config"), "[core]\nhooksPath = /tmp/elsewhere\n").unwrap();
        let protected = find(&root, &[]).unwrap();
        assert!(!protected.read_only.iter().any(|path| path.ends_with("elsewhere")));
    }
}
