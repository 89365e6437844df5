//! Other mounts of the workspace: a bind mount (or a second mount of the same file system)
//! that shows the workspace, or part of it, at another path. Landlock grants by inode, so
//! such an alias would be as writable as the workspace while lacking its read-only
//! protected paths. Each alias found in `/proc/self/mountinfo` gets the workspace's own
//! view mounted over it in the child (recursively, protected paths included).
//!
//! Symbolic links and `/proc/self/cwd`-style paths need nothing here: they resolve to the
//! workspace's own mounts.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One alias: mount `source` (in the workspace) over `target` (elsewhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Alias {
    pub(crate) source: PathBuf,
    pub(crate) target: PathBuf,
}

#[derive(Debug)]
struct MountEntry {
    device: String,
    root: PathBuf,
    mount_point: PathBuf,
}

/// The aliases of the canonical `workspace` visible to this process.
pub(crate) fn of(workspace: &Path) -> Vec<Alias> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mounts: Vec<MountEntry> = text.lines().filter_map(parse_line).collect();
    let Some((ws_index, ws_mount)) = mounts
        .iter()
        .enumerate()
        .filter(|(_, mount)| workspace.starts_with(&mount.mount_point))
        .max_by_key(|(index, mount)| (mount.mount_point.components().count(), *index))
    else {
        return Vec::new();
    };
    let Ok(relative) = workspace.strip_prefix(&ws_mount.mount_point) else { return Vec::new() };
    let fs_path = ws_mount.root.join(relative);
    let mut aliases = Vec::new();
    for (index, mount) in mounts.iter().enumerate() {
        if index == ws_index || mount.device != ws_mount.device {
            continue;
        }
        let alias = if let Ok(rest) = fs_path.strip_prefix(&mount.root) {
            Alias { source: workspace.to_owned(), target: mount.mount_point.join(rest) }
        } else if let Ok(rest) = mount.root.strip_prefix(&fs_path) {
            Alias { source: workspace.join(rest), target: mount.mount_point.clone() }
        } else {
            continue;
        };
        if alias.target.starts_with(workspace) || workspace.starts_with(&alias.target) {
            continue;
        }
        if same_inode(&alias.source, &alias.target) && !aliases.contains(&alias) {
            aliases.push(alias);
        }
    }
    aliases
}

fn same_inode(a: &Path, b: &Path) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// One line of `/proc/self/mountinfo`: id, parent, major:minor, root, mount point, ...
fn parse_line(line: &str) -> Option<MountEntry> {
    let mut fields = line.split(' ');
    let _id = fields.next()?;
    let _parent = fields.next()?;
    let device = fields.next()?.to_owned();
    let root = PathBuf::from(unescape(fields.next()?));
    let mount_point = PathBuf::from(unescape(fields.next()?));
    Some(MountEntry { device, root, mount_point })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'\\'
            && at + 3 < bytes.len()
            && let Some(value) = std::str::from_utf8(&bytes[at + 1..at + 4])
                .ok()
                .and_then(|digits| u8::from_str_radix(digits, 8).ok())
        {
            out.push(value);
            at += 4;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes() {
        let entry =
            parse_line("36 35 98:0 /mnt/a\\040b /srv/x rw,noatime master:1 - ext3 /dev/root rw")
                .unwrap();
        assert_eq!(entry.device, "98:0");
        assert_eq!(entry.root, PathBuf::from("/mnt/a b"));
        assert_eq!(entry.mount_point, PathBuf::from("/srv/x"));
    }
}
