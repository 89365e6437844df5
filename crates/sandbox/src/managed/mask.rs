//! Masks for paths denied by deny rules ([`CommandSpec::deny_paths`],
//! [`CommandSpec::deny_writes`]): inside the command's private mount namespace each path
//! denied for reading is covered by an empty read-only directory or file, and each path
//! denied for writing is bind-mounted onto itself read-only, after the protected paths.
//! Nothing the command runs — `cat`, `sh -c`, redirections, globs, `cp -r`, `tar`,
//! `find -exec` — can read a hidden path or change a masked one, by any path that leads
//! there (links are resolved to the masked target), and a mask point cannot be removed or
//! renamed (`EBUSY`).
//!
//! The empty sources live in a private directory of the parent outside every path the
//! command may open, so the command cannot fill them. Fail closed: a denied path that is
//! missing or not absolute, more than [`MAX_MASKS`] of them, or a source that cannot be
//! made is [`SandboxError::Unenforceable`].
//!
//! [`CommandSpec::deny_paths`]: crate::CommandSpec::deny_paths
//! [`CommandSpec::deny_writes`]: crate::CommandSpec::deny_writes

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Result, SandboxError};
use crate::spec::Denial;
use crate::sys::{self, BindMount};

use super::c_path;

/// Masks applied at most for one command.
pub(crate) const MAX_MASKS: usize = 512;

/// One mask point: canonical path, how it is denied, whether it is a directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Point {
    denial: Denial,
    path: PathBuf,
    is_dir: bool,
}

/// The mask points of one run and the empty sources they are bound from.
#[derive(Debug)]
pub(crate) struct Masks {
    /// Read-only points first, then hidden ones, each in path order; none under a hidden
    /// directory (or, for read-only ones, under a read-only directory).
    points: Vec<Point>,
    /// Holds `empty-dir` and `empty-file`; removed on drop.
    sources: Option<tempfile::TempDir>,
}

impl Masks {
    /// Resolves and checks `denied` (absolute, existing paths) and makes the empty
    /// sources when there is anything to hide.
    pub(crate) fn prepare(denied: &[(PathBuf, Denial)]) -> Result<Masks> {
        if denied.is_empty() {
            return Ok(Masks { points: Vec::new(), sources: None });
        }
        if denied.len() > MAX_MASKS {
            return Err(refuse(&format!(
                "masks for {} denied paths (at most {MAX_MASKS})",
                denied.len()
            )));
        }
        let mut points: Vec<Point> = Vec::new();
        for (path, denial) in denied {
            if !path.is_absolute() {
                return Err(refuse(&format!("an absolute denied path, not {}", path.display())));
            }
            let missing = |error: std::io::Error| {
                refuse(&format!("the denied path {} to mask: {error}", path.display()))
            };
            let canonical = path.canonicalize().map_err(missing)?;
            let meta = canonical.metadata().map_err(missing)?;
            if canonical == Path::new("/") {
                return Err(refuse("a mask over / (a deny rule covers the root)"));
            }
            points.push(Point { denial: *denial, path: canonical, is_dir: meta.is_dir() });
        }
        points.sort();
        points.dedup();
        let hidden_dirs: Vec<PathBuf> = points
            .iter()
            .filter(|point| point.denial == Denial::Hide && point.is_dir)
            .map(|point| point.path.clone())
            .collect();
        let mut kept: Vec<Point> = Vec::with_capacity(points.len());
        for point in points {
            // Under a hidden directory it is hidden already (and a read-only bind there
            // would fail once the directory is masked).
            let hidden =
                hidden_dirs.iter().any(|dir| point.path.starts_with(dir) && *dir != point.path);
            let covered = kept.iter().any(|other| {
                other.denial == point.denial && other.is_dir && point.path.starts_with(&other.path)
            });
            let also_hidden = point.denial == Denial::ReadOnly && hidden_dirs.contains(&point.path);
            if !(hidden || covered || also_hidden) {
                kept.push(point);
            }
        }
        let hides = kept.iter().any(|point| point.denial == Denial::Hide);
        let sources = if hides { Some(empty_sources()?) } else { None };
        Ok(Masks { points: kept, sources })
    }

    /// The bind mounts, in order: read-only points onto themselves, then each hidden point
    /// with its empty source, read-only.
    pub(crate) fn mounts(&self) -> Result<Vec<BindMount>> {
        let mut mounts = Vec::with_capacity(self.points.len());
        for point in &self.points {
            let source = match (&self.sources, point.denial) {
                (_, Denial::ReadOnly) => None,
                (Some(sources), Denial::Hide) => {
                    Some(c_path(&sources.path().join(if point.is_dir {
                        "empty-dir"
                    } else {
                        "empty-file"
                    }))?)
                }
                (None, Denial::Hide) => return Err(refuse("the empty mask sources")),
            };
            let path = c_path(&point.path)?;
            let flags_of = source.as_ref().unwrap_or(&path);
            let locked = sys::locked_mount_flags(flags_of).map_err(|error| {
                refuse(&format!("the mount flags of {}: {error}", flags_of.to_string_lossy()))
            })?;
            mounts.push(BindMount { path, source, read_only_flags: Some(locked) });
        }
        Ok(mounts)
    }
}

/// A private directory with an empty read-only directory and file.
fn empty_sources() -> Result<tempfile::TempDir> {
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
    Ok(sources)
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
        std::fs::create_dir_all(root.join("gen/sub")).unwrap();
        std::fs::write(root.join("secrets/deep/key"), "x").unwrap();
        std::fs::write(root.join(".env"), "x").unwrap();
        std::fs::write(root.join("gen/sub/a"), "x").unwrap();
        let hide = |path: &str| (root.join(path), Denial::Hide);
        let read_only = |path: &str| (root.join(path), Denial::ReadOnly);
        let masks = Masks::prepare(&[
            hide("secrets/deep/key"),
            hide("secrets"),
            hide(".env"),
            read_only("secrets/deep"),
            read_only("gen"),
            read_only("gen/sub/a"),
        ])
        .unwrap();
        let got: Vec<(PathBuf, Denial)> =
            masks.points.iter().map(|point| (point.path.clone(), point.denial)).collect();
        assert_eq!(got, vec![read_only("gen"), hide(".env"), hide("secrets")]);
        assert_eq!(masks.mounts().unwrap().len(), 3);
        for bad in [PathBuf::from("relative"), root.join("missing"), PathBuf::from("/")] {
            assert!(Masks::prepare(&[(bad.clone(), Denial::Hide)]).is_err(), "{}", bad.display());
        }
        assert!(Masks::prepare(&[]).unwrap().mounts().unwrap().is_empty());
    }
}
