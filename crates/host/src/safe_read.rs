//! Reading a file that may be hostile: a config or instruction file that came with a
//! repository.
//!
//! The file is opened without blocking (a FIFO never hangs the read), optionally without
//! following a final symlink, checked with `fstat` to be a regular file no larger than a
//! cap, and, when confined, checked to resolve inside a folder (so a symlink to a secret
//! elsewhere, or to `/proc/self/environ`, is not read). The check is made on the opened
//! descriptor (`/proc/self/fd/N`), not on the name, so swapping the name after the check
//! does not help.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// The outcome of [`read`].
#[derive(Debug)]
pub enum Outcome {
    /// Nothing at that path.
    Missing,
    /// The file's bytes (at most the cap).
    Bytes(Vec<u8>),
    /// Something is there but was not read; the reason is for a note to the user.
    Skipped(String),
}

/// How [`read`] treats the path.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// Largest file read, in bytes; a larger one is skipped, not truncated.
    pub cap: u64,
    /// Whether a symlink as the final component is followed (else it is skipped).
    pub follow_symlink: bool,
    /// A canonical folder the opened file must resolve inside.
    pub confine_to: Option<&'a Path>,
}

/// Reads `path` under `rules`. Never blocks on a FIFO or device and never panics.
pub fn read(path: &Path, rules: Rules<'_>) -> Outcome {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    if !rules.follow_symlink {
        flags |= libc::O_NOFOLLOW;
    }
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(file) => file,
        Err(error) => {
            return match error.raw_os_error() {
                _ if error.kind() == std::io::ErrorKind::NotFound => Outcome::Missing,
                Some(libc::ENOTDIR) => Outcome::Missing,
                Some(libc::ELOOP) => Outcome::Skipped("it is a symbolic link".into()),
                _ => Outcome::Skipped(format!("it cannot be opened: {error}")),
            };
        }
    };
    let metadata = match file.metadata() {
        Ok(metadata) => metadata,
        Err(error) => return Outcome::Skipped(format!("it cannot be inspected: {error}")),
    };
    if !metadata.is_file() {
        return Outcome::Skipped(
            "it is not a regular file (a FIFO, device or folder is never read)".into(),
        );
    }
    let resolved = resolved_path(&file, path);
    if let Some(resolved) = &resolved
        && ["/proc", "/sys"].iter().any(|system| resolved.starts_with(system))
    {
        let resolved = visible(&resolved.display().to_string(), false);
        return Outcome::Skipped(format!("it resolves to {resolved}, a system file"));
    }
    if let Some(root) = rules.confine_to {
        match &resolved {
            Some(resolved) if resolved.starts_with(root) => {}
            Some(resolved) => {
                return Outcome::Skipped(format!(
                    "it resolves to {}, outside {}",
                    visible(&resolved.display().to_string(), false),
                    visible(&root.display().to_string(), false)
                ));
            }
            None => return Outcome::Skipped("its real location cannot be determined".into()),
        }
    }
    if metadata.len() > rules.cap {
        return Outcome::Skipped(format!(
            "it is {} bytes, more than the {} bytes keel reads",
            metadata.len(),
            rules.cap
        ));
    }
    let mut bytes = Vec::new();
    if let Err(error) = file.take(rules.cap.saturating_add(1)).read_to_end(&mut bytes) {
        return Outcome::Skipped(format!("it cannot be read: {error}"));
    }
    if bytes.len() as u64 > rules.cap {
        return Outcome::Skipped(format!("it grew past the {} bytes keel reads", rules.cap));
    }
    Outcome::Bytes(bytes)
}

/// `text` with control characters and BiDi overrides made visible (`\x1b`), so a name or
/// message that came with a repository cannot drive the terminal; newlines are kept only
/// when `keep_newlines` (multi-line error text).
pub fn visible(text: &str, keep_newlines: bool) -> String {
    // One neutraliser for every terminal path (`terminal::neutralize`); on one line, the
    // newlines and tabs it keeps are shown escaped too.
    let shown = crate::terminal::neutralize(text);
    if keep_newlines { shown.into_owned() } else { shown.replace('\n', "\\n").replace('\t', "\\t") }
}

/// Where the opened file really is: `/proc/self/fd/N` names the file the descriptor
/// points at; without `/proc`, the canonical form of the name.
fn resolved_path(file: &std::fs::File, path: &Path) -> Option<PathBuf> {
    use std::os::fd::AsRawFd as _;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
        .filter(|link| link.is_absolute())
        .or_else(|| path.canonicalize().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(root: Option<&Path>) -> Rules<'_> {
        Rules { cap: 16, follow_symlink: true, confine_to: root }
    }

    #[test]
    fn regular_files_inside_are_read_and_everything_else_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(root.join("ok"), "hello").unwrap();
        std::fs::write(root.join("big"), "x".repeat(17)).unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("out")).unwrap();
        std::os::unix::fs::symlink(root.join("ok"), root.join("in")).unwrap();
        std::os::unix::fs::symlink("/proc/self/environ", root.join("env")).unwrap();
        let fifo = root.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());

        assert!(
            matches!(read(&root.join("ok"), rules(Some(&root))), Outcome::Bytes(b) if b == b"hello")
        );
        assert!(
            matches!(read(&root.join("in"), rules(Some(&root))), Outcome::Bytes(b) if b == b"hello")
        );
        assert!(matches!(read(&root.join("none"), rules(Some(&root))), Outcome::Missing));
        for name in ["big", "out", "env", "fifo"] {
            let outcome = read(&root.join(name), rules(Some(&root)));
            assert!(matches!(outcome, Outcome::Skipped(_)), "{name}: {outcome:?}");
        }
        let strict = Rules { follow_symlink: false, ..rules(Some(&root)) };
        assert!(
            matches!(read(&root.join("in"), strict), Outcome::Skipped(r) if r.contains("symbolic"))
        );
        // Unconfined, a symlink elsewhere is followed, but never into /proc.
        assert!(matches!(read(&root.join("out"), rules(None)), Outcome::Bytes(b) if b == b"s"));
        assert!(matches!(read(&root.join("env"), rules(None)), Outcome::Skipped(_)));
    }

    #[test]
    fn visible_escapes_controls_and_bidi_overrides() {
        assert_eq!(visible("a\x1b[2Jb\u{202e}c\nd", false), "a\\x1b[2Jb\\u{202e}c\\nd");
        assert_eq!(visible("x\u{2028}y\u{061c}", false), "x\\u{2028}y\\u{61c}");
        assert_eq!(visible("line\nnext\r", true), "line\nnext\\r");
    }
}
