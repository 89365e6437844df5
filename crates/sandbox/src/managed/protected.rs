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
//! prevented by a mount; the run removes it afterwards ([`ProtectedPaths::absent`]).
//!
//! Every directory between the root and a protected path is pinned too: a mount point
//! cannot be renamed, so `mv vendor elsewhere` cannot move a protected repository away and
//! leave room for a planted one at its old path.
//!
//! An extra writable path of a widened boundary gets the same treatment for the
//! repositories under it (and an existing `.keel/` directly in it); one inside a git
//! directory protects that git directory's hooks and config.
//!
//! Config-named files are protected too: every `core.hooksPath` and every file named by
//! `include.path` or `includeIf.*.path` (module `gitconfig`, every spelling git accepts),
//! followed through includes, when it lies in a writable root. A named file that does not
//! exist yet is a *plant candidate*: if a command creates it, the run removes it.
//!
//! Aliases and links:
//! - A protected path that is itself a symbolic link is recorded ([`ProtectedPaths::links`]):
//!   its target is mounted read-only (a mount follows the link) and, because the link's own
//!   directory entry stays replaceable, the run puts the link back if it was changed.
//! - A protected regular file with more than one hard link (or such a file directly in a
//!   protected directory) gets a private copy in place before the run, so no other name in
//!   the workspace reaches its inode.
//! - A `.git/worktrees` or `.git/modules` (or any protected path) that is a symbolic link is
//!   never entered or created through: keel does not write outside the writable roots
//!   while protecting them.
//!
//! Plants the mounts cannot prevent ([`ProtectedPaths::absent`],
//! [`ProtectedPaths::watched`]) are removed after the run by module `plants`, which also
//! keeps a durable note so that a crash is repaired at the next start.
//!
//! [`protection`] answers, for one path, whether and why it is protected: the file tools
//! use it so that tools and commands share one list.
//!
//! Not covered (see SECURITY.md): a repository the sandboxed command creates itself, and
//! bare repositories not named `.git`.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::gitconfig;
use super::gitscan::{self, GitEntry};

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
    /// Paths that did not exist before the run and must not exist after it (a planted
    /// `commondir`, a file a config includes, a `KEEL_HOME` inside the workspace).
    pub(crate) absent: Vec<PathBuf>,
    /// Directories whose new entries are plants (`.git/worktrees`), with the entries they
    /// had before the run; `None` when the directory itself did not exist.
    pub(crate) watched: Vec<(PathBuf, Option<Vec<OsString>>)>,
    /// Protected paths that are symbolic links, with their targets, to put back.
    pub(crate) links: Vec<(PathBuf, PathBuf)>,
    /// Canonical targets of protected symbolic links (for [`protection`]).
    pub(crate) link_targets: Vec<PathBuf>,
    /// What was skipped or repaired while finding them (FIFO configs, broken hard links).
    pub(crate) notes: Vec<String>,
}

/// Whether [`find`] may create and repair (before a managed run) or only look (a file
/// tool's check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Prepare,
    Inspect,
}

/// Finds (and in [`Mode::Prepare`] creates where needed) the protected paths under the
/// canonical `workspace` and under each canonical extra writable path of a widened
/// boundary.
///
/// For an extra writable path: the repositories under it are protected like the
/// workspace's, an existing `.keel/` directly in it is read-only (none is created there),
/// and when it lies inside a git directory that git directory is protected too.
///
/// # Errors
///
/// A message when something that must be created cannot be, or the tree is too large.
pub(crate) fn find(
    workspace: &Path,
    extra_write: &[PathBuf],
    home: Option<&Path>,
    mode: Mode,
) -> Result<ProtectedPaths, String> {
    let writable: Vec<&Path> =
        std::iter::once(workspace).chain(extra_write.iter().map(PathBuf::as_path)).collect();
    let mut finder =
        Finder { writable: &writable, home, mode, protected: ProtectedPaths::default() };
    let keel_dir = workspace.join(".keel");
    finder.protect(&keel_dir, Kind::Dir, Missing::Create)?;
    for keel_home in keel_homes(home) {
        if finder.inside_writable(&keel_home) {
            finder.protect(&keel_home, Kind::Dir, Missing::Plant)?;
        }
    }

    let mut n_scanned = 0_usize;
    finder.scan(workspace, &mut n_scanned)?;
    for root in extra_write {
        if let Some(git_dir) = root
            .ancestors()
            .find(|dir| dir.file_name() == Some(std::ffi::OsStr::new(".git")) && dir.is_dir())
        {
            finder.protect_git_dir(git_dir)?;
        }
        if root.is_dir() {
            let keel_dir = root.join(".keel");
            if keel_dir.symlink_metadata().is_ok() {
                finder.protect(&keel_dir, Kind::Dir, Missing::Ignore)?;
            }
            finder.scan(root, &mut n_scanned)?;
        }
    }
    let mut protected = finder.protected;

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
    for list in [
        &mut protected.pinned,
        &mut protected.read_only,
        &mut protected.absent,
        &mut protected.link_targets,
    ] {
        list.sort();
        list.dedup();
    }
    protected.links.sort();
    protected.links.dedup();
    protected.watched.sort();
    protected.watched.dedup();
    if mode == Mode::Prepare {
        let read_only = protected.read_only.clone();
        for path in &read_only {
            break_hard_links(path, &mut protected.notes);
        }
    }
    Ok(protected)
}

/// Whether `path` (absolute; checked as given and as resolved) is protected in `workspace`
/// (canonical), and why: the same list managed commands get read-only, used by the file
/// tools before they write. `None` when it may be written.
pub(crate) fn protection(workspace: &Path, path: &Path, home: Option<&Path>) -> Option<String> {
    let protected = match find(workspace, &[], home, Mode::Inspect) {
        Ok(protected) => protected,
        Err(reason) => return Some(format!("the protected paths cannot be determined: {reason}")),
    };
    let mut candidates = vec![gitconfig::normalize(path)];
    if let Some(resolved) = resolve_existing(path) {
        candidates.push(resolved);
    }
    for candidate in &candidates {
        let under =
            |list: &[PathBuf]| list.iter().find(|entry| candidate.starts_with(entry)).cloned();
        if let Some(entry) = under(&protected.read_only).or_else(|| under(&protected.link_targets))
        {
            return Some(format!("{} is protected (read-only for the agent)", entry.display()));
        }
        if let Some((link, _)) =
            protected.links.iter().find(|(link, _)| candidate.starts_with(link))
        {
            return Some(format!("{} is a protected symbolic link", link.display()));
        }
        if protected.absent.contains(candidate) {
            return Some(format!(
                "{} is a protected name (git or keel would read it as configuration)",
                candidate.display()
            ));
        }
        if let Some((dir, _)) = protected.watched.iter().find(|(dir, _)| candidate.starts_with(dir))
        {
            return Some(format!("{} is protected git state", dir.display()));
        }
    }
    None
}

/// Where a `KEEL_HOME` may be: `$KEEL_HOME`, `$XDG_DATA_HOME/keel`, `~/.local/share/keel`
/// (the CLI's order). All are protected when inside a writable root.
pub(crate) fn keel_homes(home: Option<&Path>) -> Vec<PathBuf> {
    let mut homes = Vec::new();
    if let Some(path) = std::env::var_os("KEEL_HOME").filter(|value| !value.is_empty()) {
        homes.push(PathBuf::from(path));
    }
    if let Some(path) = std::env::var_os("XDG_DATA_HOME").filter(|value| !value.is_empty()) {
        homes.push(PathBuf::from(path).join("keel"));
    }
    if let Some(home) = home {
        homes.push(home.join(".local/share/keel"));
    }
    homes
        .into_iter()
        .filter(|path| path.is_absolute())
        .map(|path| gitconfig::normalize(&path))
        .collect()
}

/// The kind of a protected path, for what to create when it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

/// What to do when a protected path does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// Create it empty (in [`Mode::Prepare`]) and mount it read-only.
    Create,
    /// Leave it missing and remove it after the run if a command created it.
    Plant,
    /// Nothing to protect.
    Ignore,
}

struct Finder<'a> {
    writable: &'a [&'a Path],
    home: Option<&'a Path>,
    mode: Mode,
    protected: ProtectedPaths,
}

impl Finder<'_> {
    /// Protects the entries of every repository found under `root` (`.git` directories,
    /// files and links). The walk that finds them is cached per root and invalidated by
    /// any change to a directory it read (module `gitscan`); what is protected for each
    /// entry is worked out afresh every time.
    fn scan(&mut self, root: &Path, n_scanned: &mut usize) -> Result<(), String> {
        let too_many = || {
            format!(
                "the workspace and extra writable paths have more than \
                 {MAX_SCANNED_ENTRIES} entries to scan for nested git repositories"
            )
        };
        let limit = MAX_SCANNED_ENTRIES.saturating_sub(*n_scanned);
        let (walk, _) = gitscan::walk(root, limit).map_err(|_| too_many())?;
        *n_scanned += walk.n_entries;
        if *n_scanned > MAX_SCANNED_ENTRIES {
            return Err(too_many());
        }
        for (path, kind) in walk.found {
            match kind {
                GitEntry::Dir => self.protect_git_dir(&path)?,
                GitEntry::File => self.protected.read_only.push(path),
                GitEntry::Symlink => {
                    // Protect the link itself; its target is a repository of its own when
                    // it lies in a writable root.
                    self.record_link(&path);
                    if let Ok(target) = path.canonicalize()
                        && target.is_dir()
                        && self.writable.iter().any(|root| target.starts_with(root))
                    {
                        self.protect_git_dir(&target)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn protect_git_dir(&mut self, git_dir: &Path) -> Result<(), String> {
        self.protected.pinned.push(git_dir.to_owned());
        let work_tree = git_dir.parent().unwrap_or(git_dir).to_owned();
        self.protect(&git_dir.join("hooks"), Kind::Dir, Missing::Create)?;
        let config = git_dir.join("config");
        self.protect(&config, Kind::File, Missing::Create)?;
        // `config.worktree` (read when extensions.worktreeConfig is on, which
        // sparse-checkout turns on) can set core.fsmonitor or core.hooksPath: keep it
        // read-only, creating an empty one where there is none, so none can be planted.
        let worktree_config = git_dir.join("config.worktree");
        self.protect(&worktree_config, Kind::File, Missing::Create)?;
        self.protect_named_files(&config, &work_tree)?;
        self.protect_named_files(&worktree_config, &work_tree)?;
        self.protect(&git_dir.join("commondir"), Kind::File, Missing::Plant)?;

        let worktrees = git_dir.join("worktrees");
        match worktrees.symlink_metadata() {
            Err(_) => self.protected.watched.push((worktrees, None)),
            Ok(meta) if meta.file_type().is_symlink() => {
                self.record_link(&worktrees);
                self.protected.notes.push(format!(
                    "keel sandbox: {} is a symbolic link; it was not entered",
                    worktrees.display()
                ));
            }
            Ok(meta) if meta.is_dir() => {
                let mut names = Vec::new();
                for entry in std::fs::read_dir(&worktrees).into_iter().flatten().flatten() {
                    names.push(entry.file_name());
                    if !entry.file_type().is_ok_and(|file_type| file_type.is_dir()) {
                        continue;
                    }
                    // Each linked worktree has a commondir and its own config.worktree.
                    let linked = entry.path();
                    self.protect(&linked.join("commondir"), Kind::File, Missing::Plant)?;
                    let config = linked.join("config.worktree");
                    self.protect(&config, Kind::File, Missing::Create)?;
                    self.protect_named_files(&config, &work_tree)?;
                }
                names.sort();
                self.protected.watched.push((worktrees, Some(names)));
            }
            Ok(_) => self.protected.read_only.push(worktrees),
        }

        // Submodule git directories: `modules/<name>/` (nested arbitrarily deep), each a
        // git directory with its own hooks and config. Symbolic links are never entered.
        let modules = git_dir.join("modules");
        if modules.symlink_metadata().is_ok_and(|meta| meta.file_type().is_symlink()) {
            self.record_link(&modules);
            self.protected.notes.push(format!(
                "keel sandbox: {} is a symbolic link; it was not entered",
                modules.display()
            ));
            return Ok(());
        }
        let mut stack = vec![modules];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|file_type| file_type.is_dir()) {
                    continue;
                }
                let path = entry.path();
                if path.join("HEAD").is_file() && path.join("objects").is_dir() {
                    self.protect_git_dir(&path)?;
                } else {
                    stack.push(path);
                }
            }
        }
        Ok(())
    }

    /// Protects the hooks path and included files a config names, when they lie in a
    /// writable root.
    fn protect_named_files(&mut self, config: &Path, work_tree: &Path) -> Result<(), String> {
        let named = gitconfig::named_files(config, work_tree, self.home);
        self.protected
            .notes
            .extend(named.notes.into_iter().map(|note| format!("keel sandbox: {note}")));
        for hooks_path in named.hooks_paths {
            if self.inside_writable(&hooks_path) {
                self.protect(&hooks_path, Kind::Dir, Missing::Create)?;
            }
        }
        for include in named.includes {
            if self.inside_writable(&include) {
                self.protect(&include, Kind::File, Missing::Plant)?;
            }
        }
        Ok(())
    }

    /// Protects one path: read-only when it exists (and its link recorded when it is a
    /// symbolic link), else created, recorded as a plant candidate, or ignored.
    fn protect(&mut self, path: &Path, kind: Kind, missing: Missing) -> Result<(), String> {
        match path.symlink_metadata() {
            Ok(meta) => {
                if meta.file_type().is_symlink() {
                    self.record_link(path);
                    // A dangling link has nothing to mount; putting it back is enough.
                    if path.metadata().is_err() {
                        return Ok(());
                    }
                }
                self.protected.read_only.push(path.to_owned());
                Ok(())
            }
            Err(_) => match missing {
                Missing::Ignore => Ok(()),
                Missing::Plant => {
                    self.protected.absent.push(path.to_owned());
                    Ok(())
                }
                Missing::Create if self.mode == Mode::Inspect => {
                    self.protected.read_only.push(path.to_owned());
                    Ok(())
                }
                Missing::Create => {
                    if !self.inside_writable(path) {
                        // Never create outside the writable roots; an outside path is
                        // read-only for commands anyway.
                        return Ok(());
                    }
                    let created = match kind {
                        Kind::Dir => std::fs::create_dir_all(path),
                        Kind::File => std::fs::write(path, ""),
                    };
                    created
                        .map_err(|error| format!("cannot create {}: {error}", path.display()))?;
                    self.protected.read_only.push(path.to_owned());
                    Ok(())
                }
            },
        }
    }

    fn record_link(&mut self, path: &Path) {
        if let Ok(target) = std::fs::read_link(path) {
            self.protected.links.push((path.to_owned(), target));
        }
        if let Ok(canonical) = path.canonicalize() {
            self.protected.link_targets.push(canonical);
        }
    }

    /// Whether `path` (which may not exist) resolves inside a writable root: its nearest
    /// existing ancestor is canonicalized and the rest appended.
    fn inside_writable(&self, path: &Path) -> bool {
        resolve_existing(path)
            .is_some_and(|resolved| self.writable.iter().any(|root| resolved.starts_with(root)))
    }
}

/// `path` with its nearest existing ancestor canonicalized and the missing rest appended.
fn resolve_existing(path: &Path) -> Option<PathBuf> {
    let path = gitconfig::normalize(path);
    let mut missing = Vec::new();
    let mut existing = path.as_path();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            let mut resolved = canonical;
            for name in missing.iter().rev() {
                resolved.push(name);
            }
            return Some(resolved);
        }
        missing.push(existing.file_name()?.to_owned());
        existing = existing.parent()?;
    }
}

/// Gives a protected regular file (or each regular file directly in a protected
/// directory) with more than one hard link a private copy, so that no other name reaches
/// its inode. Notes each repair.
fn break_hard_links(path: &Path, notes: &mut Vec<String>) {
    let Ok(meta) = path.symlink_metadata() else { return };
    let mut files = Vec::new();
    if meta.is_file() {
        files.push((path.to_owned(), meta));
    } else if meta.is_dir() {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            if let Ok(meta) = entry.path().symlink_metadata()
                && meta.is_file()
            {
                files.push((entry.path(), meta));
            }
        }
    }
    for (file, meta) in files {
        if meta.nlink() <= 1 {
            continue;
        }
        let outcome = copy_in_place(&file, &meta);
        notes.push(format!(
            "keel sandbox: {} had {} hard links; {}",
            file.display(),
            meta.nlink(),
            match outcome {
                Ok(()) => "gave it a private copy".to_owned(),
                Err(error) => format!("could not give it a private copy: {error}"),
            }
        ));
    }
}

fn copy_in_place(file: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    let parent = file.parent().ok_or_else(|| std::io::Error::other("no parent directory"))?;
    let temp = tempfile::Builder::new().prefix(".keel-unlink-").tempfile_in(parent)?;
    std::fs::copy(file, temp.path())?;
    std::fs::set_permissions(temp.path(), meta.permissions())?;
    temp.persist(file).map_err(|error| error.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

        let protected = find(&root, &[], None, Mode::Prepare).unwrap();
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
        let protected = find(&root, &[], None, Mode::Prepare).unwrap();
        assert!(!protected.read_only.iter().any(|path| path.ends_with("elsewhere")));
    }
}
