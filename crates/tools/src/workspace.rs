//! Path containment: every path a tool touches resolves inside the session's workspace.
//!
//! The decision is made on the canonical path (all symbolic links resolved), never on the
//! text the model sent. A path that does not exist yet (a file to create) is judged by
//! canonicalizing its nearest existing ancestor and appending the missing components,
//! after folding `..`. A missing component that is itself a dangling symbolic link is
//! refused, because creating through it would land wherever the link points.
//!
//! Known limit: a check and the later use of the path are separate system calls, so a
//! process racing to swap a directory for a link between them is not stopped here. In
//! managed mode the OS sandbox is the boundary for commands; the file tools rely on this
//! check.

use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Text every refusal for a path outside the workspace contains.
pub const OUTSIDE_WORKSPACE: &str = "outside the workspace";

/// Text every refusal to write a protected path contains (git hooks and config, `.keel/`,
/// ...; the list is keel-sandbox's [`keel_sandbox::protected_path`], shared with commands).
pub const PROTECTED_PATH: &str = "protected";

/// The session's workspace root, canonicalized, and the home folder (for `~` in git
/// config values and the credential stores).
#[derive(Debug, Clone)]
pub(crate) struct Workspace {
    root: PathBuf,
    home: Option<PathBuf>,
    xdg_config: Option<PathBuf>,
}

/// Why a path argument cannot be used.
#[derive(Debug)]
pub(crate) enum PathError {
    Empty,
    Outside { raw: String, resolved: PathBuf },
    DanglingLink { raw: String, link: PathBuf },
    Unresolvable { raw: String, source: io::Error },
    BadRoot { root: PathBuf, source: io::Error },
    Protected { raw: String, reason: String },
    Credentials { raw: String, resolved: PathBuf },
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathError::Empty => write!(f, "path is empty"),
            PathError::Outside { raw, resolved } => write!(
                f,
                "path `{raw}` is {OUTSIDE_WORKSPACE}: it resolves to {}",
                resolved.display()
            ),
            PathError::DanglingLink { raw, link } => write!(
                f,
                "path `{raw}` goes through the dangling symbolic link {}; refusing to create \
                 through it",
                link.display()
            ),
            PathError::Unresolvable { raw, source } => {
                write!(f, "cannot resolve path `{raw}`: {source}")
            }
            PathError::BadRoot { root, source } => {
                write!(f, "workspace root {} is unusable: {source}", root.display())
            }
            PathError::Protected { raw, reason } => {
                write!(f, "path `{raw}` is {PROTECTED_PATH}: {reason}")
            }
            PathError::Credentials { raw, resolved } => write!(
                f,
                "path `{raw}` is a credential store of the home folder ({}); the agent cannot \
                 read or change it",
                resolved.display()
            ),
        }
    }
}

impl Workspace {
    pub(crate) fn new(root: &Path) -> Result<Workspace, PathError> {
        let root = root
            .canonicalize()
            .map_err(|source| PathError::BadRoot { root: root.to_owned(), source })?;
        let home = std::env::var_os("HOME").filter(|home| !home.is_empty()).map(PathBuf::from);
        let xdg_config = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|config| !config.is_empty())
            .map(PathBuf::from);
        Ok(Workspace { root, home, xdg_config })
    }

    /// Whether `path` is (inside) a credential store of the home folder.
    pub(crate) fn is_credential_store(&self, path: &Path) -> bool {
        keel_sandbox::is_credential_store(path, self.home.as_deref(), self.xdg_config.as_deref())
    }

    /// The canonical path `raw` names, if it is inside the workspace and may be written:
    /// neither it as given nor what it resolves to is protected (the list commands get
    /// read-only in managed mode, [`keel_sandbox::protected_path`]).
    pub(crate) fn resolve_writable(&self, raw: &str) -> Result<PathBuf, PathError> {
        let resolved = self.resolve(raw)?;
        // Checked as given (lexically) and as resolved in one scan.
        if let Some(reason) =
            keel_sandbox::protected_path(&self.root, &self.root.join(raw), self.home.as_deref())
        {
            return Err(PathError::Protected { raw: raw.to_owned(), reason });
        }
        Ok(resolved)
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The canonical path `raw` names, if it is inside the workspace. `raw` is relative to
    /// the root, or absolute.
    pub(crate) fn resolve(&self, raw: &str) -> Result<PathBuf, PathError> {
        if raw.is_empty() {
            return Err(PathError::Empty);
        }
        let joined = self.root.join(raw);
        let components: Vec<Component<'_>> = joined.components().collect();
        let mut existing_len = components.len();
        let base = loop {
            let prefix: PathBuf = components[..existing_len].iter().collect();
            match prefix.canonicalize() {
                Ok(canonical) => break canonical,
                Err(error) if is_missing(&error) && existing_len > 1 => {
                    if prefix.symlink_metadata().is_ok_and(|meta| meta.file_type().is_symlink()) {
                        return Err(PathError::DanglingLink { raw: raw.to_owned(), link: prefix });
                    }
                    existing_len -= 1;
                }
                Err(source) => {
                    return Err(PathError::Unresolvable { raw: raw.to_owned(), source });
                }
            }
        };
        let mut resolved = base;
        for component in &components[existing_len..] {
            match component {
                Component::ParentDir => {
                    resolved.pop();
                }
                Component::Normal(name) => resolved.push(name),
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
        if !resolved.starts_with(&self.root) {
            return Err(PathError::Outside { raw: raw.to_owned(), resolved });
        }
        if self.is_credential_store(&resolved) {
            return Err(PathError::Credentials { raw: raw.to_owned(), resolved });
        }
        Ok(resolved)
    }

    /// `path` relative to the root, for output (`.` for the root itself).
    pub(crate) fn display(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(relative) if relative.as_os_str().is_empty() => ".".to_owned(),
            Ok(relative) => relative.to_string_lossy().into_owned(),
            Err(_) => path.to_string_lossy().into_owned(),
        }
    }
}

fn is_missing(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn setup() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::create_dir_all(dir.path().join("other")).unwrap();
        std::fs::write(dir.path().join("other/secret"), "s").unwrap();
        let workspace = Workspace::new(&root).unwrap();
        (dir, workspace)
    }

    #[test]
    fn relative_and_absolute_inside() {
        let (_dir, workspace) = setup();
        let main = workspace.root().join("src/main.rs");
        assert_eq!(workspace.resolve("src/main.rs").unwrap(), main);
        assert_eq!(workspace.resolve(main.to_str().unwrap()).unwrap(), main);
        assert_eq!(workspace.resolve("./src/../src/main.rs").unwrap(), main);
        assert_eq!(workspace.resolve(".").unwrap(), workspace.root());
    }

    #[test]
    fn missing_paths_resolve_through_the_nearest_ancestor() {
        let (_dir, workspace) = setup();
        assert_eq!(
            workspace.resolve("new/dir/file").unwrap(),
            workspace.root().join("new/dir/file")
        );
        assert_eq!(workspace.resolve("new/../file").unwrap(), workspace.root().join("file"));
    }

    #[test]
    fn dotdot_escapes_are_refused() {
        let (_dir, workspace) = setup();
        for raw in ["..", "../other/secret", "src/../../other/secret", "new/../../x", "/etc/passwd"]
        {
            let error = workspace.resolve(raw).unwrap_err();
            assert!(error.to_string().contains(OUTSIDE_WORKSPACE), "{raw}: {error}");
        }
    }

    #[test]
    fn links_are_judged_by_their_target() {
        let (dir, workspace) = setup();
        symlink(dir.path().join("other"), workspace.root().join("out")).unwrap();
        symlink("src", workspace.root().join("alias")).unwrap();
        assert!(
            workspace.resolve("out/secret").unwrap_err().to_string().contains(OUTSIDE_WORKSPACE)
        );
        assert!(
            workspace.resolve("out/new-file").unwrap_err().to_string().contains(OUTSIDE_WORKSPACE)
        );
        assert_eq!(
            workspace.resolve("alias/main.rs").unwrap(),
            workspace.root().join("src/main.rs")
        );
    }

    #[test]
    fn dangling_links_are_refused() {
        let (dir, workspace) = setup();
        symlink(dir.path().join("nowhere"), workspace.root().join("dangling")).unwrap();
        assert!(matches!(workspace.resolve("dangling"), Err(PathError::DanglingLink { .. })));
        assert!(matches!(workspace.resolve("dangling/x"), Err(PathError::DanglingLink { .. })));
    }

    #[test]
    fn link_loops_are_an_error_not_a_hang() {
        let (_dir, workspace) = setup();
        symlink("loop-b", workspace.root().join("loop-a")).unwrap();
        symlink("loop-a", workspace.root().join("loop-b")).unwrap();
        assert!(matches!(workspace.resolve("loop-a/x"), Err(PathError::Unresolvable { .. })));
    }

    #[test]
    fn redteam_tool_credential_stores_when_the_workspace_is_home() {
        let (_dir, workspace) = setup();
        let workspace = Workspace { home: Some(workspace.root.clone()), ..workspace };
        std::fs::create_dir_all(workspace.root().join(".ssh")).unwrap();
        std::fs::write(workspace.root().join(".ssh/id_ed25519"), "key").unwrap();
        std::fs::write(workspace.root().join(".netrc"), "machine x password y").unwrap();
        for raw in [".ssh/id_ed25519", ".ssh", ".netrc", ".aws/credentials"] {
            assert!(matches!(workspace.resolve(raw), Err(PathError::Credentials { .. })), "{raw}");
        }
        assert_eq!(
            workspace.resolve("src/main.rs").unwrap(),
            workspace.root().join("src/main.rs"),
            "an ordinary file in the home folder stays reachable"
        );
    }

    #[test]
    fn empty_is_refused() {
        let (_dir, workspace) = setup();
        assert!(matches!(workspace.resolve(""), Err(PathError::Empty)));
    }
}
