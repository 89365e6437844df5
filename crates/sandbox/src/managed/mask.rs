//! Masks for paths denied by deny rules ([`CommandSpec::deny_paths`]): inside the
//! command's private mount namespace each denied directory is covered by an empty
//! read-only directory and each denied file by an empty read-only file, bind-mounted
//! after the protected paths. Nothing the command runs — `cat`, `sh -c`, redirections,
//! globs, `cp -r`, `tar`, `find -exec` — can read or change what is under a mask, by any
//! path that leads there (links are resolved to the masked target), and a mask point
//! cannot be removed or renamed (`EBUSY`).
//!
//! The empty sources live in a private directory of the parent outside every path the
//! command may open, so the command cannot fill them. Fail closed: a denied path that is
//! missing, not absolute, or not a file or directory, more than [`MAX_MASKS`] of them, or
//! a source that cannot be made is [`SandboxError::Unenforceable`].
//!
//! [`CommandSpec::deny_paths`]: crate::CommandSpec::deny_paths

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Result, SandboxError};
use crate::sys::{self, BindMount};

use super::c_path;

/// Masks applied at most for one command.
pub(crate) const MAX_MASKS: usize = 512;

/// The mask points of one run and the empty sources they are bound from.
#[derive(Debug)]
pub(crate) struct Masks {
    /// Canonical mask points, directories first in path order, none under another.
    points: Vec<(PathBuf, bool)>,
    /// Holds `empty-dir` and `empty-file`; removed on drop.
    sources: Option<tempfile::TempDir>,
}

impl Masks {
    /// Resolves and checks `denied` (absolute, existing paths) and makes the empty
    /// sources when there is anything to mask.
    pub(crate) fn prepare(denied: &[PathBuf]) -> Result<Masks> {
        if denied.is_empty() {
            return Ok(Masks { points: Vec::new(), sources: None });
        }
        if denied.len() > MAX_MASKS {
            return Err(refuse(&format!(
                "masks for {} denied paths (at most {MAX_MASKS})",
                denied.len()
            )));
        }
        let mut points: Vec<(PathBuf, bool)> = Vec::new();
        for path in denied {
            if !path.is_absolute() {
                return Err(refuse(&format!("an absolute denied path, not {}", path.display())));
            }
            let canonical = path.canonicalize().map_err(|error| {
                refuse(&format!("the denied path {} to mask: {error}", path.display()))
            })?;
            let meta = canonical.metadata().map_err(|error| {
                refuse(&format!("the denied path {} to mask: {error}", path.display()))
            })?;
            if canonical == Path::new("/") {
                return Err(refuse("a mask over / (a deny rule covers the root)"));
            }
            points.push((canonical, meta.is_dir()));
        }
        points.sort();
        points.dedup();
        // A point under a masked directory is hidden already.
        let mut kept: Vec<(PathBuf, bool)> = Vec::with_capacity(points.len());
        for (path, is_dir) in points {
            if kept.iter().any(|(dir, dir_is_dir)| *dir_is_dir && path.starts_with(dir)) {
                continue;
            }
            kept.push((path, is_dir));
        }
        let sources = tempfile::Builder::new()
            .prefix("keel-mask-")
            .tempdir()
            .map_err(|error| refuse(&format!("a directory for the mask sources: {error}")))?;
        let make = || -> std::io::Result<()> {
            let dir = sources.path().join("empty-dir");
            std::fs::create_dir(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555))?;
            let file = sources.path().join("empty-file");
            std::fs::write(&file, b"")?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444))?;
            Ok(())
        };
        make().map_err(|error| refuse(&format!("the empty mask sources: {error}")))?;
        Ok(Masks { points: kept, sources: Some(sources) })
    }

    /// The bind mounts, in order: each mask point gets its empty source, read-only.
    pub(crate) fn mounts(&self) -> Result<Vec<BindMount>> {
        let Some(sources) = &self.sources else { return Ok(Vec::new()) };
        let mut mounts = Vec::with_capacity(self.points.len());
        for (path, is_dir) in &self.points {
            let source = sources.path().join(if *is_dir { "empty-dir" } else { "empty-file" });
            let source = c_path(&source)?;
            let locked = sys::locked_mount_flags(&source).map_err(|error| {
                refuse(&format!("the mount flags of {}: {error}", source.to_string_lossy()))
            })?;
            mounts.push(BindMount {
                path: c_path(path)?,
                source: Some(source),
                read_only_flags: Some(locked),
            });
        }
        Ok(mounts)
    }
}

fn refuse(missing: &str) -> SandboxError {
    SandboxError::Unenforceable { missing: missing.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_under_a_masked_directory_are_dropped_and_bad_paths_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("secrets/deep")).unwrap();
        std::fs::write(root.join("secrets/deep/key"), "x").unwrap();
        std::fs::write(root.join(".env"), "x").unwrap();
        let masks = Masks::prepare(&[
            root.join("secrets/deep/key"),
            root.join("secrets"),
            root.join(".env"),
        ])
        .unwrap();
        assert_eq!(masks.points, vec![(root.join(".env"), false), (root.join("secrets"), true)]);
        assert_eq!(masks.mounts().unwrap().len(), 2);
        for bad in [PathBuf::from("relative"), root.join("missing"), PathBuf::from("/")] {
            assert!(Masks::prepare(std::slice::from_ref(&bad)).is_err(), "{}", bad.display());
        }
        assert!(Masks::prepare(&[]).unwrap().mounts().unwrap().is_empty());
    }
}
