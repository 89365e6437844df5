//! Reading git config files the way git does, for the settings that name other files:
//! `core.hooksPath`, `include.path` and `includeIf.<condition>.path`.
//!
//! The parser follows git's syntax: section names and keys are case-insensitive;
//! `[section "subsection"]` and the legacy `[section.subsection]`; a header may share its
//! line with an entry (`[core] hooksPath = x`); values may be quoted, contain `\n`, `\t`,
//! `\b`, `\\` and `\"` escapes and continue on the next line after a trailing `\`; `#` and
//! `;` start a comment outside quotes; a key without `=` is a boolean true. Anything it
//! cannot parse ends the line, never the file.
//!
//! Files are read without blocking and only when they are regular files of at most
//! [`MAX_CONFIG_BYTES`]: a FIFO or a device where a config should be is skipped with a
//! note, never a hang.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The largest config file read; a larger one is skipped with a note.
pub(crate) const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// How deep `include.path` chains are followed (git stops at 10 as well).
const MAX_INCLUDE_DEPTH: usize = 10;

/// One `section.subsection.key = value` entry. Section and key are lowercased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) section: String,
    pub(crate) subsection: Option<String>,
    pub(crate) key: String,
    /// `None` for a key without `=` (boolean true).
    pub(crate) value: Option<String>,
}

/// The files a repository's config names, followed through includes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct NamedFiles {
    /// Every `core.hooksPath` value found (all of them: which one wins depends on the order
    /// git reads the files, and protecting each is the safe side).
    pub(crate) hooks_paths: Vec<PathBuf>,
    /// Every file named by `include.path` or `includeIf.*.path`, followed recursively.
    pub(crate) includes: Vec<PathBuf>,
    /// Files that were skipped (not regular, too large, unreadable), with why.
    pub(crate) notes: Vec<String>,
}

/// Reads `config` (a git dir's `config` or `config.worktree`) and every file it includes.
/// Relative `core.hooksPath` values resolve against `work_tree`; relative include paths
/// against the directory of the file that names them; `~/` against `home`.
pub(crate) fn named_files(config: &Path, work_tree: &Path, home: Option<&Path>) -> NamedFiles {
    let mut named = NamedFiles::default();
    let mut pending = vec![(config.to_owned(), 0_usize)];
    let mut seen: Vec<PathBuf> = Vec::new();
    while let Some((file, depth)) = pending.pop() {
        if seen.contains(&file) {
            continue;
        }
        seen.push(file.clone());
        let text = match read_config(&file) {
            Ok(Some(text)) => text,
            Ok(None) => continue,
            Err(note) => {
                named.notes.push(note);
                continue;
            }
        };
        let base = file.parent().unwrap_or(Path::new("/"));
        for entry in parse(&text) {
            let Some(value) = entry.value.as_deref().filter(|value| !value.is_empty()) else {
                continue;
            };
            let is_include = entry.key == "path"
                && (entry.section == "include"
                    || (entry.section == "includeif" && entry.subsection.is_some()));
            if entry.section == "core" && entry.key == "hookspath" {
                if let Some(path) = resolve(value, work_tree, home) {
                    named.hooks_paths.push(path);
                }
            } else if is_include && let Some(path) = resolve(value, base, home) {
                named.includes.push(path.clone());
                if depth + 1 < MAX_INCLUDE_DEPTH {
                    pending.push((path, depth + 1));
                }
            }
        }
    }
    named.hooks_paths.sort();
    named.hooks_paths.dedup();
    named.includes.sort();
    named.includes.dedup();
    named
}

/// The text of a config file: `Ok(None)` when there is none, `Err(note)` when something
/// other than a readable regular file of at most [`MAX_CONFIG_BYTES`] is there. Opens
/// without blocking (a FIFO does not wait for a writer) and checks the opened file.
pub(crate) fn read_config(path: &Path) -> Result<Option<String>, String> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(format!("skipped git config {}: {error}", path.display()));
        }
    };
    let metadata = file
        .metadata()
        .map_err(|error| format!("skipped git config {}: {error}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!(
            "skipped git config {}: not a regular file (a FIFO, device or socket is never read)",
            path.display()
        ));
    }
    if metadata.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "skipped git config {}: larger than {MAX_CONFIG_BYTES} bytes",
            path.display()
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("skipped git config {}: {error}", path.display()))?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// A path value as git expands it: `~/` is the home folder, a relative path is relative to
/// `base`; `.` and `..` are folded lexically.
fn resolve(value: &str, base: &Path, home: Option<&Path>) -> Option<PathBuf> {
    let expanded = if value == "~" {
        home?.to_owned()
    } else if let Some(rest) = value.strip_prefix("~/") {
        home?.join(rest)
    } else if value.starts_with('~') {
        // `~user/...`: another user's home; not inside a workspace keel protects.
        return None;
    } else {
        PathBuf::from(value)
    };
    let absolute = if expanded.is_absolute() { expanded } else { base.join(expanded) };
    Some(normalize(&absolute))
}

/// Folds `.` and `..` lexically (the path may not exist yet).
pub(crate) fn normalize(path: &Path) -> PathBuf {
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

/// Parses config text into entries, in file order.
pub(crate) fn parse(text: &str) -> Vec<Entry> {
    let chars: Vec<char> = text.chars().collect();
    let mut parser = Parser { chars: &chars, at: 0 };
    let mut entries = Vec::new();
    let mut section = String::new();
    let mut subsection: Option<String> = None;
    while let Some(c) = parser.peek() {
        match c {
            ' ' | '\t' | '\r' | '\n' => parser.at += 1,
            '#' | ';' => parser.skip_line(),
            '[' => match parser.section_header() {
                Some((name, sub)) => {
                    section = name;
                    subsection = sub;
                }
                None => parser.skip_line(),
            },
            c if c.is_ascii_alphabetic() => match parser.entry() {
                Some((key, value)) if !section.is_empty() => entries.push(Entry {
                    section: section.clone(),
                    subsection: subsection.clone(),
                    key,
                    value,
                }),
                Some(_) => {}
                None => parser.skip_line(),
            },
            _ => parser.skip_line(),
        }
    }
    entries
}

struct Parser<'a> {
    chars: &'a [char],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.peek() {
            self.at += 1;
            if c == '\n' {
                break;
            }
        }
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t')) {
            self.at += 1;
        }
    }

    /// `[name]`, `[name "sub"]` or `[name.sub]`, positioned on `[`.
    fn section_header(&mut self) -> Option<(String, Option<String>)> {
        self.at += 1;
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                name.push(c.to_ascii_lowercase());
                self.at += 1;
            } else {
                break;
            }
        }
        if name.is_empty() {
            return None;
        }
        self.skip_blanks();
        match self.peek()? {
            ']' => {
                self.at += 1;
                match name.split_once('.') {
                    Some((section, sub)) => Some((section.to_owned(), Some(sub.to_owned()))),
                    None => Some((name, None)),
                }
            }
            '"' => {
                self.at += 1;
                let mut sub = String::new();
                loop {
                    match self.peek()? {
                        '\n' => return None,
                        '"' => {
                            self.at += 1;
                            break;
                        }
                        '\\' => {
                            self.at += 1;
                            let escaped = self.peek()?;
                            if escaped == '\n' {
                                return None;
                            }
                            sub.push(escaped);
                            self.at += 1;
                        }
                        c => {
                            sub.push(c);
                            self.at += 1;
                        }
                    }
                }
                (self.peek()? == ']').then(|| {
                    self.at += 1;
                    (name, Some(sub))
                })
            }
            _ => None,
        }
    }

    /// `key`, `key = value`, positioned on the key's first letter.
    fn entry(&mut self) -> Option<(String, Option<String>)> {
        let mut key = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '-' {
                key.push(c.to_ascii_lowercase());
                self.at += 1;
            } else {
                break;
            }
        }
        self.skip_blanks();
        match self.peek() {
            None | Some('\n') => return Some((key, None)),
            Some('#' | ';') => {
                self.skip_line();
                return Some((key, None));
            }
            Some('\r') => {
                self.skip_line();
                return Some((key, None));
            }
            Some('=') => self.at += 1,
            Some(_) => return None,
        }
        Some((key, Some(self.value())))
    }

    /// A value after `=`, up to the end of its (possibly continued) line.
    fn value(&mut self) -> String {
        let mut value = String::new();
        // Length of `value` that is certainly kept: trailing blanks after it are dropped.
        let mut kept = 0;
        let mut quoted = false;
        self.skip_blanks();
        while let Some(c) = self.peek() {
            self.at += 1;
            match c {
                // git refuses a newline inside quotes; either way the value ends here.
                '\n' => break,
                '"' => {
                    quoted = !quoted;
                    kept = value.len();
                }
                '#' | ';' if !quoted => {
                    self.skip_line();
                    break;
                }
                '\\' => {
                    let Some(escaped) = self.peek() else { break };
                    self.at += 1;
                    match escaped {
                        '\n' => {}
                        '\r' if self.peek() == Some('\n') => self.at += 1,
                        'n' => value.push('\n'),
                        't' => value.push('\t'),
                        'b' => value.push('\u{8}'),
                        other => value.push(other),
                    }
                    kept = value.len();
                }
                ' ' | '\t' | '\r' if !quoted => value.push(c),
                other => {
                    value.push(other);
                    kept = value.len();
                }
            }
        }
        value.truncate(kept);
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(text: &str) -> Vec<(String, Option<String>, String, Option<String>)> {
        parse(text)
            .into_iter()
            .map(|entry| (entry.section, entry.subsection, entry.key, entry.value))
            .collect()
    }

    fn one(
        section: &str,
        sub: Option<&str>,
        key: &str,
        value: Option<&str>,
    ) -> Vec<(String, Option<String>, String, Option<String>)> {
        vec![(section.to_owned(), sub.map(str::to_owned), key.to_owned(), value.map(str::to_owned))]
    }

    #[test]
    fn every_spelling_of_core_hooks_path() {
        let expected = one("core", None, "hookspath", Some(".hooks"));
        for text in [
            "[core]\n\thooksPath = .hooks\n",
            "[CORE]\nHOOKSPATH=.hooks",
            "[core] hooksPath = .hooks",
            "[Core]\n  hookspath = \".hooks\" ; shared\n",
            "[core]\nhooksPath = .hooks # comment\n",
            "# c\n; c\n[core]\n\thooksPath = .ho\\\noks\n",
            "[core]\r\n\thooksPath = .hooks\r\n",
            "[core]\nhooksPath = \".ho\"oks   \n",
        ] {
            assert_eq!(entries(text), expected, "{text:?}");
        }
        assert_eq!(
            entries("[core]\nhooksPath = \"a;b\" ; c\n"),
            one("core", None, "hookspath", Some("a;b"))
        );
        assert_eq!(entries("[core]\nbare\n"), one("core", None, "bare", None));
    }

    #[test]
    fn subsections_and_includes() {
        assert_eq!(
            entries("[includeIf \"gitdir:~/x/\"]\n\tpath = ../a.inc\n"),
            one("includeif", Some("gitdir:~/x/"), "path", Some("../a.inc"))
        );
        assert_eq!(entries("[include.x]\npath=y"), one("include", Some("x"), "path", Some("y")));
        assert_eq!(
            entries("garbage ]]\n[include]\npath = z\n"),
            one("include", None, "path", Some("z"))
        );
        assert!(entries("[unterminated\npath = z\n").is_empty());
    }

    #[test]
    fn named_files_follow_includes_and_skip_fifos() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(
            root.join(".git/config"),
            "[include]\n\tpath = ../shared.inc\n[includeIf \"onbranch:main\"]\npath = fifo\n",
        )
        .unwrap();
        std::fs::write(
            root.join("shared.inc"),
            "[core] hooksPath = tools/hooks\n[include]\npath = more.inc\n",
        )
        .unwrap();
        let status =
            std::process::Command::new("mkfifo").arg(root.join(".git/fifo")).status().unwrap();
        assert!(status.success());
        let named = named_files(&root.join(".git/config"), &root, None);
        assert_eq!(named.hooks_paths, [root.join("tools/hooks")]);
        assert_eq!(
            named.includes,
            [root.join(".git/fifo"), root.join("more.inc"), root.join("shared.inc")]
        );
        assert_eq!(named.notes.len(), 1, "{:?}", named.notes);
        assert!(named.notes[0].contains("not a regular file"), "{:?}", named.notes);
    }
}
