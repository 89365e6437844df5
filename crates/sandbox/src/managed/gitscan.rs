//! The walk that finds every entry named `.git` under a writable root (module `protected`
//! protects what it finds), cached per root and invalidated by change.
//!
//! A walk reads every directory under the root (not entering `.git` entries or symbolic
//! links). Its result is kept with a stamp of every directory it read: device, inode,
//! `ctime` and `mtime`. Creating, removing or renaming an entry changes its directory's
//! `mtime` and `ctime`, and replacing a directory changes the inode at its path; `ctime`
//! cannot be set back from user space (`touch -d` sets it to now), so a stamp that still
//! matches means the directory holds the same names. A later walk of the same root stats
//! each recorded directory instead of reading it, and walks again when any stamp differs.
//!
//! Timestamps are coarse (a kernel tick, up to seconds on some file systems): a directory
//! changed in the same tick as it was read would keep its stamp. A walk in which any
//! directory changed less than [`RACY_MARGIN`] before the walk began (or claims a time
//! after it) is therefore not cached, like git's "racy" index entries: the next walk reads
//! everything again.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How recent a directory change may be for a walk to be cached.
pub(crate) const RACY_MARGIN: Duration = Duration::from_secs(2);

/// Roots cached at most; past that the cache is emptied (a host with many workspaces
/// rescans, it never grows without bound).
const MAX_CACHED_ROOTS: usize = 64;

/// What an entry named `.git` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GitEntry {
    Dir,
    File,
    Symlink,
}

/// What a walk found: every `.git` entry (path and kind) and how many entries it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Walk {
    pub(crate) found: Vec<(PathBuf, GitEntry)>,
    pub(crate) n_entries: usize,
}

/// One directory as it was when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let meta = path.symlink_metadata().ok()?;
        meta.is_dir().then(|| Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        })
    }

    /// Whether the directory changed at or after `since` (seconds, nanoseconds since the
    /// epoch): its stamp may not show a change made in the same tick.
    fn racy(&self, since: (i64, i64)) -> bool {
        self.ctime >= since || self.mtime >= since
    }
}

/// A cached walk and the directories it read.
#[derive(Debug)]
struct Cached {
    walk: Walk,
    dirs: Vec<(PathBuf, Stamp)>,
}

static CACHE: Mutex<Option<HashMap<PathBuf, Cached>>> = Mutex::new(None);

/// How a [`walk`] was answered (for tests and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Every directory was read.
    Walked,
    /// Every recorded directory was unchanged: the cached walk.
    Cached,
}

/// The `.git` entries under `root`, walking at most `limit` entries.
///
/// # Errors
///
/// The number of entries seen when the walk passed `limit` (nothing is cached then).
pub(crate) fn walk(root: &Path, limit: usize) -> Result<(Walk, Source), usize> {
    if let Some(walk) = cached(root) {
        return Ok((walk, Source::Cached));
    }
    let started = SystemTime::now().checked_sub(RACY_MARGIN).unwrap_or(UNIX_EPOCH);
    let since = match started.duration_since(UNIX_EPOCH) {
        Ok(since) => {
            (i64::try_from(since.as_secs()).unwrap_or(i64::MAX), i64::from(since.subsec_nanos()))
        }
        Err(_) => (0, 0),
    };
    let mut walk = Walk { found: Vec::new(), n_entries: 0 };
    let mut dirs = Vec::new();
    let mut cacheable = true;
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        // Stamped before it is read: a change during the read shows as a different stamp.
        match Stamp::of(&dir) {
            Some(stamp) => {
                cacheable &= !stamp.racy(since);
                dirs.push((dir.clone(), stamp));
            }
            None => cacheable = false,
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            cacheable = false;
            continue;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                cacheable = false;
                continue;
            };
            walk.n_entries += 1;
            if walk.n_entries > limit {
                return Err(walk.n_entries);
            }
            let Ok(file_type) = entry.file_type() else {
                cacheable = false;
                continue;
            };
            let path = entry.path();
            if entry.file_name() == ".git" {
                let kind = if file_type.is_dir() {
                    GitEntry::Dir
                } else if file_type.is_file() {
                    GitEntry::File
                } else if file_type.is_symlink() {
                    GitEntry::Symlink
                } else {
                    continue;
                };
                walk.found.push((path, kind));
                continue;
            }
            if file_type.is_dir() {
                stack.push(path);
            }
        }
    }
    if cacheable {
        let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        let cache = cache.get_or_insert_with(HashMap::new);
        if cache.len() >= MAX_CACHED_ROOTS {
            cache.clear();
        }
        cache.insert(root.to_owned(), Cached { walk: walk.clone(), dirs });
    } else {
        forget(root);
    }
    Ok((walk, Source::Walked))
}

/// The cached walk of `root` when every directory it read is unchanged.
fn cached(root: &Path) -> Option<Walk> {
    let cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    let cached = cache.as_ref()?.get(root)?;
    let unchanged = cached.dirs.iter().all(|(dir, stamp)| Stamp::of(dir) == Some(*stamp));
    unchanged.then(|| cached.walk.clone())
}

fn forget(root: &Path) {
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(cache) = cache.as_mut() {
        cache.remove(root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits out [`RACY_MARGIN`], so the tree's last changes are old enough to cache.
    fn settle() {
        std::thread::sleep(RACY_MARGIN + Duration::from_millis(50));
    }

    #[test]
    fn an_unchanged_tree_is_answered_from_the_cache_and_any_new_entry_invalidates_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::create_dir_all(root.join("repo/.git")).unwrap();
        std::fs::write(root.join("a/file.txt"), "x").unwrap();
        // Just changed: racy, so not cached.
        let (first, source) = walk(&root, 1_000).unwrap();
        assert_eq!(source, Source::Walked);
        assert_eq!(first.found, vec![(root.join("repo/.git"), GitEntry::Dir)]);
        assert_eq!(walk(&root, 1_000).unwrap().1, Source::Walked, "racy walks are not cached");
        settle();
        assert_eq!(walk(&root, 1_000).unwrap().1, Source::Walked);
        let (again, source) = walk(&root, 1_000).unwrap();
        assert_eq!((again, source), (first.clone(), Source::Cached));
        // Editing a file in place changes no directory: still cached.
        std::fs::write(root.join("a/file.txt"), "y").unwrap();
        assert_eq!(walk(&root, 1_000).unwrap().1, Source::Cached);
        // A new nested `.git` deep in the tree is found at once.
        std::fs::write(root.join("a/b/c/.git"), "gitdir: elsewhere\n").unwrap();
        let (found, source) = walk(&root, 1_000).unwrap();
        assert_eq!(source, Source::Walked);
        assert!(found.found.contains(&(root.join("a/b/c/.git"), GitEntry::File)), "{found:?}");
    }

    #[test]
    fn a_directory_swapped_for_another_invalidates_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("x/y")).unwrap();
        std::fs::create_dir_all(root.join("z/.git")).unwrap();
        settle();
        walk(&root, 1_000).unwrap();
        assert_eq!(walk(&root, 1_000).unwrap().1, Source::Cached);
        // `x` replaced by a directory that holds a repository (two renames).
        std::fs::rename(root.join("x"), root.join("old")).unwrap();
        std::fs::rename(root.join("z"), root.join("x")).unwrap();
        let (found, source) = walk(&root, 1_000).unwrap();
        assert_eq!(source, Source::Walked);
        assert_eq!(found.found, vec![(root.join("x/.git"), GitEntry::Dir)]);
    }

    #[test]
    fn a_tree_over_the_limit_is_an_error_and_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for n in 0..5 {
            std::fs::write(root.join(format!("f{n}")), "").unwrap();
        }
        assert_eq!(walk(&root, 3), Err(4));
        assert!(cached(&root).is_none());
    }
}
