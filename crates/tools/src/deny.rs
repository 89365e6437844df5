//! Paths the session's deny rules deny for reading ([`keel_contracts::DeniedPaths`]): the
//! file tools refuse them, `grep`, `glob` and `list_dir` skip them, and `bash` resolves them
//! to the concrete paths that exist when the command starts, which keel-sandbox masks
//! (empty and read-only) inside the command's mount namespace.
//!
//! Resolution is bounded and fails closed: a pattern whose walk visits more than
//! [`MAX_RESOLVE_ENTRIES`] entries, a directory it cannot read, more than
//! [`MAX_DENIED_PATHS`] paths, or a pattern covering the whole workspace makes the command
//! refuse, with the reason.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use keel_contracts::{DeniedPaths, ToolContext, ToolOutput};

/// Entries one pattern's walk may visit before the command is refused.
pub const MAX_RESOLVE_ENTRIES: usize = 200_000;
/// Concrete paths masked at most for one command.
pub const MAX_DENIED_PATHS: usize = 256;

/// The denied set of a call, against its canonical workspace root.
#[derive(Debug, Clone)]
pub(crate) struct Denied {
    root: PathBuf,
    paths: DeniedPaths,
}

impl Denied {
    pub(crate) fn new(root: &Path, context: &ToolContext) -> Denied {
        Denied { root: root.to_owned(), paths: context.denied_paths.clone() }
    }

    /// Whether the canonical `path` is covered (a path outside the workspace is matched
    /// absolute).
    pub(crate) fn covers(&self, path: &Path) -> bool {
        if self.paths.is_empty() {
            return false;
        }
        let shown = match path.strip_prefix(&self.root) {
            Ok(relative) => relative.to_string_lossy().into_owned(),
            Err(_) => path.to_string_lossy().into_owned(),
        };
        self.paths.covers(&shown)
    }

    /// The refusal for a call on a covered `path`, named as the call wrote it.
    pub(crate) fn refusal(&self, path: &Path, shown: &str) -> Option<ToolOutput> {
        self.covers(path).then(|| {
            ToolOutput::error(format!("`{shown}` is denied by a deny rule of this session"))
        })
    }
}

/// The concrete existing paths (canonical) the denied patterns cover under `root`, for
/// masking; a covered directory is one path.
///
/// # Errors
///
/// The reason the denial cannot be enforced (see the module docs).
pub(crate) fn resolve(root: &Path, denied: &DeniedPaths) -> Result<Vec<PathBuf>, String> {
    let mut found = BTreeSet::new();
    for pattern in denied.patterns() {
        let single = DeniedPaths::new([pattern.as_str()], "");
        if single.hides_everything_under("") || single.covers(".") {
            return Err(format!(
                "the deny rule pattern `{pattern}` covers the whole workspace; commands cannot run"
            ));
        }
        let (base, prefix) = walk_start(root, pattern);
        let mut budget = MAX_RESOLVE_ENTRIES;
        match base.symlink_metadata() {
            Err(_) => continue,
            Ok(meta) if !meta.is_dir() || single.covers(&prefix) => {
                if single.covers(&prefix) {
                    insert(&mut found, &base);
                }
                continue;
            }
            Ok(_) => {}
        }
        if !prefix.is_empty() && single.hides_everything_under(&prefix) {
            insert(&mut found, &base);
            continue;
        }
        visit(&base, &prefix, &single, &mut found, &mut budget)
            .map_err(|reason| format!("the deny rule pattern `{pattern}` {reason}"))?;
        if found.len() > MAX_DENIED_PATHS {
            break;
        }
    }
    if found.len() > MAX_DENIED_PATHS {
        return Err(format!(
            "deny rules cover more than {MAX_DENIED_PATHS} separate paths; deny their folder instead"
        ));
    }
    if let Ok(canonical_root) = root.canonicalize()
        && let Some(path) = found.iter().find(|path| canonical_root.starts_with(path))
    {
        return Err(format!(
            "a deny rule covers {}, which holds the whole workspace; commands cannot run",
            path.display()
        ));
    }
    Ok(found.into_iter().collect())
}

/// Where the walk for `pattern` starts: the directory of its literal prefix, and that
/// directory as the pattern spells it (workspace-relative, or absolute).
fn walk_start(root: &Path, pattern: &str) -> (PathBuf, String) {
    let literal_end = pattern.find(['*', '?']).unwrap_or(pattern.len());
    let prefix = if literal_end == pattern.len() {
        pattern
    } else {
        pattern[..literal_end].rfind('/').map_or("", |slash| &pattern[..slash])
    };
    let base = if prefix.starts_with('/') { PathBuf::from(prefix) } else { root.join(prefix) };
    let prefix = if pattern.starts_with('/') && prefix.is_empty() { "/" } else { prefix };
    (base, prefix.to_owned())
}

fn visit(
    dir: &Path,
    shown: &str,
    pattern: &DeniedPaths,
    found: &mut BTreeSet<PathBuf>,
    budget: &mut usize,
) -> Result<(), String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|error| format!("cannot be resolved: {}: {error}", dir.display()))?;
    for entry in entries {
        let entry =
            entry.map_err(|error| format!("cannot be resolved: {}: {error}", dir.display()))?;
        *budget = budget.checked_sub(1).ok_or_else(|| {
            format!("matches too widely to resolve (over {MAX_RESOLVE_ENTRIES} entries walked)")
        })?;
        if found.len() > MAX_DENIED_PATHS {
            return Ok(());
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let child = if shown.is_empty() || shown == "/" {
            format!("{}{name}", if shown == "/" { "/" } else { "" })
        } else {
            format!("{shown}/{name}")
        };
        let path = entry.path();
        let Ok(file_type) = entry.file_type() else {
            return Err(format!("cannot be resolved: the type of {}", path.display()));
        };
        if file_type.is_dir() {
            if pattern.hides_everything_under(&child) {
                insert(found, &path);
            } else {
                visit(&path, &child, pattern, found, budget)?;
            }
        } else if pattern.covers(&child) {
            insert(found, &path);
        }
    }
    Ok(())
}

/// Adds the canonical form of `path` (a link's target; a dangling link hides nothing).
fn insert(found: &mut BTreeSet<PathBuf>, path: &Path) {
    if let Ok(canonical) = path.canonicalize() {
        found.insert(canonical);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_resolve_to_existing_paths_and_folders_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for path in ["secrets/a", "app/sub", "src"] {
            std::fs::create_dir_all(root.join(path)).unwrap();
        }
        for file in ["secrets/a/key", "app/.env", "app/sub/.env", "src/main.rs", "top.pem"] {
            std::fs::write(root.join(file), "x").unwrap();
        }
        std::os::unix::fs::symlink("secrets", root.join("alias")).unwrap();
        let denied = DeniedPaths::new(["secrets/**", "**/.env", "*.pem", "missing/**"], "");
        let got = resolve(&root, &denied).unwrap();
        let want: Vec<PathBuf> = ["app/.env", "app/sub/.env", "secrets", "top.pem"]
            .iter()
            .map(|p| root.join(p))
            .collect();
        assert_eq!(got, want);
        // `*.pem` crosses `/` like every rule pattern, so it would also reach src/x.pem.
        let too_wide = DeniedPaths::new(["**"], "");
        assert!(resolve(&root, &too_wide).unwrap_err().contains("whole workspace"));
    }
}
