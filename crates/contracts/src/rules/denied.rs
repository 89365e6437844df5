//! The paths deny rules take from commands and searches: masked or made read-only in the
//! sandbox, skipped by grep, glob and list_dir.

use std::collections::BTreeSet;

use super::decide::PermissionRules;
use super::grammar::{READ_DENYING_TOOLS, WRITE_DENYING_TOOLS};
use super::pattern::{covers, normalize_path, normalized, wildcard_match};

/// Path patterns denied for reading (see the `rules` module docs): what commands find
/// masked and what grep, glob and list_dir skip. Patterns are workspace-relative (or
/// absolute for paths outside it), normalized, sorted and unique.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeniedPaths {
    patterns: Vec<String>,
}

impl DeniedPaths {
    /// A set from patterns as written (normalized against `workspace`).
    pub fn new<I, S>(patterns: I, workspace: &str) -> DeniedPaths
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let set: BTreeSet<String> = patterns
            .into_iter()
            .map(|pattern| normalize_path(pattern.as_ref(), workspace))
            .collect();
        DeniedPaths { patterns: set.into_iter().collect() }
    }

    /// The patterns.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether nothing is denied.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `path` (workspace-relative, `/`-separated; normalized here) or one of its
    /// ancestors matches a denied pattern.
    ///
    /// # Examples
    ///
    /// ```
    /// use keel_contracts::DeniedPaths;
    /// let denied = DeniedPaths::new(["secrets/**", "**/.env"], "/ws");
    /// assert!(denied.covers("secrets/key"));
    /// assert!(denied.covers("./app/.env"));
    /// assert!(!denied.covers("src/main.rs"));
    /// assert!(!denied.covers("secrets"));
    /// ```
    pub fn covers(&self, path: &str) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        let path = normalized(path);
        self.patterns.iter().any(|pattern| covers(pattern, &path))
    }
}

impl DeniedPaths {
    /// Whether every path below the directory `dir` (workspace-relative) is covered, so
    /// the directory can be hidden as a whole: a pattern covers `dir` itself, or ends in
    /// `*` and matches `dir/`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keel_contracts::DeniedPaths;
    /// let denied = DeniedPaths::new(["secrets/**", "keys", "**/*.pem"], "/ws");
    /// assert!(denied.hides_everything_under("secrets"));
    /// assert!(denied.hides_everything_under("keys"));
    /// assert!(!denied.hides_everything_under("src"));
    /// ```
    pub fn hides_everything_under(&self, dir: &str) -> bool {
        let dir = normalized(dir);
        let slashed = format!("{dir}/");
        self.patterns.iter().any(|pattern| {
            covers(pattern, &dir)
                || pattern.ends_with('*') && wildcard_match(pattern.as_bytes(), slashed.as_bytes())
        })
    }
}

impl PermissionRules {
    /// The paths denied for writing only, made read-only for commands: the patterns of
    /// deny rules on `write_file` and `edit_file`.
    pub fn write_denied_paths(&self, workspace: &str) -> DeniedPaths {
        DeniedPaths::new(
            self.deny
                .iter()
                .filter(|rule| WRITE_DENYING_TOOLS.contains(&rule.tool.as_str()))
                .filter_map(|rule| rule.pattern.as_deref()),
            workspace,
        )
    }

    /// The paths denied for reading, and so masked for commands and skipped by searches:
    /// the patterns of deny rules on `path`, `read_file`, `grep`, `glob` and `list_dir`.
    /// A bare `TOOL` rule names no path and is not included.
    pub fn denied_paths(&self, workspace: &str) -> DeniedPaths {
        DeniedPaths::new(
            self.deny
                .iter()
                .filter(|rule| READ_DENYING_TOOLS.contains(&rule.tool.as_str()))
                .filter_map(|rule| rule.pattern.as_deref()),
            workspace,
        )
    }
}
