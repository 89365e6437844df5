//! A private root for commands with mapped directories ([`CommandSpec::map_dir`]): the
//! paths a task expects (`/app`, `/tests`, `/logs`) exist only inside the command's mount
//! namespace, never on the host.
//!
//! The parent makes an empty directory with one mount point per entry of the host's `/`
//! (directories and files; symbolic links are copied as links) and per mapped target whose
//! top-level entry the host lacks. The child bind-mounts each host entry recursively onto
//! its mount point, after the protected paths, masks and aliases are in place (a recursive
//! bind carries them, read-only flags included), then each mapping, then `chroot`s there.
//! Landlock rules are attached to inodes, so the private root changes nothing about what
//! may be read or written.
//!
//! [`CommandSpec::map_dir`]: crate::CommandSpec::map_dir

use std::path::{Component, Path, PathBuf};

/// The prepared root: its directory (removed when dropped), the bind mounts to make in the
/// child in order, and the working directory inside it.
#[derive(Debug)]
pub(crate) struct PrivateRoot {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) binds: Vec<(PathBuf, PathBuf)>,
    pub(crate) cwd: PathBuf,
}

/// Prepares the private root for `mapped` (`(source, target)` pairs) with the canonical
/// working directory `cwd`. Returns what is missing when it cannot be made.
pub(crate) fn prepare(mapped: &[(PathBuf, PathBuf)], cwd: &Path) -> Result<PrivateRoot, String> {
    let mut mappings: Vec<(PathBuf, PathBuf)> = Vec::new();
    for (source, target) in mapped {
        let source = source
            .canonicalize()
            .map_err(|error| format!("a mapped directory {}: {error}", source.display()))?;
        if !source.is_dir() {
            return Err(format!("a mapped directory ({} is not a directory)", source.display()));
        }
        let relative = checked_target(target)?;
        for (_, other) in &mappings {
            if other.starts_with(&relative) || relative.starts_with(other) {
                return Err(format!(
                    "separate mount points for /{} and /{} (one lies inside the other)",
                    relative.display(),
                    other.display()
                ));
            }
        }
        mappings.push((source, relative));
    }

    let dir = tempfile::Builder::new()
        .prefix("keel-root-")
        .tempdir()
        .map_err(|error| format!("a private root directory: {error}"))?;
    let root = dir.path().to_path_buf();
    let fail = |what: &Path, error: std::io::Error| {
        format!("a mount point {} in the private root: {error}", what.display())
    };
    set_mode(&root, 0o755).map_err(|error| fail(&root, error))?;

    let mut binds = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir("/")
        .map_err(|error| format!("a readable host root: {error}"))?
        .filter_map(std::result::Result::ok)
        .map(|entry| entry.file_name())
        .collect();
    entries.sort();
    for name in entries {
        let host = Path::new("/").join(&name);
        let point = root.join(&name);
        let Ok(metadata) = host.symlink_metadata() else { continue };
        if metadata.file_type().is_symlink() {
            let link = std::fs::read_link(&host).map_err(|error| fail(&host, error))?;
            std::os::unix::fs::symlink(link, &point).map_err(|error| fail(&point, error))?;
        } else if metadata.is_dir() {
            std::fs::create_dir(&point).map_err(|error| fail(&point, error))?;
            binds.push((host, point));
        } else if metadata.is_file() {
            std::fs::write(&point, b"").map_err(|error| fail(&point, error))?;
            binds.push((host, point));
        }
    }
    mappings.sort_by_key(|(_, relative)| relative.components().count());
    for (source, relative) in &mappings {
        let top = Path::new("/")
            .join(relative.components().next().map_or(Path::new(""), |c| Path::new(c.as_os_str())));
        match top.symlink_metadata() {
            Ok(metadata) if metadata.file_type().is_symlink() => {
                return Err(format!(
                    "a mount point for /{} (the host's {} is a symbolic link)",
                    relative.display(),
                    top.display()
                ));
            }
            Ok(_) => {
                // The target is reached through the host's own directory, bound into the
                // root: it must exist there already (nothing is created on the host).
                let host_target = Path::new("/").join(relative);
                if host_target.canonicalize().ok().as_deref() != Some(host_target.as_path())
                    || !host_target.is_dir()
                {
                    return Err(format!(
                        "a mount point for {} (no such directory on the host, and its parent \
                         is the host's)",
                        host_target.display()
                    ));
                }
            }
            Err(_) => {
                let point = root.join(relative);
                std::fs::create_dir_all(&point).map_err(|error| fail(&point, error))?;
            }
        }
        binds.push((source.clone(), root.join(relative)));
    }

    let inside = mappings
        .iter()
        .filter_map(|(source, relative)| {
            cwd.strip_prefix(source)
                .ok()
                .map(|rest| (source, Path::new("/").join(relative).join(rest)))
        })
        .max_by_key(|(source, _)| source.components().count())
        .map(|(_, inside)| inside);
    let cwd = inside.unwrap_or_else(|| cwd.to_path_buf());
    Ok(PrivateRoot { dir, binds, cwd })
}

/// The target relative to `/`: absolute, plain components only, not `/` itself.
fn checked_target(target: &Path) -> Result<PathBuf, String> {
    let refuse = |why: &str| format!("a usable mapped target {} ({why})", target.display());
    if !target.is_absolute() {
        return Err(refuse("not an absolute path"));
    }
    let mut relative = PathBuf::new();
    for component in target.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(part) => relative.push(part),
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(refuse("only plain names may follow the root"));
            }
        }
    }
    if relative.as_os_str().is_empty() {
        return Err(refuse("the root itself cannot be mapped"));
    }
    Ok(relative)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_must_be_plain_absolute_paths() {
        for bad in ["relative", "/", "/app/../etc", "/./x"] {
            let error = checked_target(Path::new(bad));
            // `Path::components` drops interior `.`, so `/./x` is the plain `/x`.
            if bad == "/./x" {
                assert_eq!(error.unwrap(), PathBuf::from("x"));
            } else {
                assert!(error.is_err(), "{bad} must be refused");
            }
        }
        assert_eq!(checked_target(Path::new("/app/src")).unwrap(), PathBuf::from("app/src"));
    }
}
