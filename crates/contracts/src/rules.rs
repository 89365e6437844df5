//! Permission rules: pre-answers to consent requests by tool and argument pattern, in the
//! style of `bash(git status*)` and `write_file(src/**)`. Deny rules beat allow rules.
//!
//! A rule is `TOOL` (any arguments) or `TOOL(PATTERN)`. The pattern is matched against the
//! call's primary argument, the first of `command`, `path`, `pattern`, `url` that the call
//! has as a string; a call without one matches only a bare `TOOL` rule. In patterns `*`
//! matches any run of characters (including `/`; `**` is the same) and `?` one character.
//! `path` values are normalized lexically first (`./a/../b` is `b`; an absolute path inside
//! the workspace becomes relative), so a deny rule cannot be dodged by spelling.
//!
//! Known limit: command patterns match the command text, so a deny rule such as `bash(rm *)`
//! does not see `cd x && rm y`. Deny rules are a convenience, not a boundary; the sandbox
//! and `forbidden` are.

use serde::{Deserialize, Serialize};

use crate::PermissionAnswer;

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// The rule as written, for display and the ledger (`rule:bash(git status*)`).
    pub text: String,
    tool: String,
    pattern: Option<String>,
}

/// A rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid permission rule '{rule}': {reason}")]
pub struct RuleError {
    /// The rule as written.
    pub rule: String,
    /// What is wrong.
    pub reason: &'static str,
}

impl Rule {
    /// Parses `TOOL` or `TOOL(PATTERN)`.
    ///
    /// # Errors
    ///
    /// [`RuleError`] for an empty tool name, an unclosed parenthesis or an empty pattern.
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let error = |reason| RuleError { rule: text.to_owned(), reason };
        let trimmed = text.trim();
        let (tool, pattern) = match trimmed.split_once('(') {
            None => (trimmed, None),
            Some((tool, rest)) => {
                let Some(pattern) = rest.strip_suffix(')') else {
                    return Err(error("missing ')' at the end"));
                };
                if pattern.is_empty() {
                    return Err(error("empty pattern; write TOOL for any arguments"));
                }
                (tool.trim(), Some(pattern.to_owned()))
            }
        };
        if tool.is_empty() || tool.contains(char::is_whitespace) {
            return Err(error("the tool name is empty or has spaces"));
        }
        Ok(Rule { text: trimmed.to_owned(), tool: tool.to_owned(), pattern })
    }

    fn matches(&self, tool: &str, primary: Option<&str>) -> bool {
        if self.tool != tool {
            return false;
        }
        match (&self.pattern, primary) {
            (None, _) => true,
            (Some(pattern), Some(value)) => wildcard_match(pattern.as_bytes(), value.as_bytes()),
            (Some(_), None) => false,
        }
    }

    /// For deny rules on paths: whether a call on `path` touches what the pattern covers —
    /// the path matches, or it is an ancestor of the pattern's fixed prefix (a recursive
    /// `grep` or `glob` over `.` reaches `docs/private/**`).
    fn touches(&self, tool: &str, path: &str) -> bool {
        if self.tool != tool {
            return false;
        }
        if self.matches(tool, Some(path)) {
            return true;
        }
        let Some(pattern) = &self.pattern else { return false };
        let fixed: &str = pattern.split(['*', '?']).next().unwrap_or_default();
        let fixed = fixed.trim_end_matches('/');
        path.is_empty()
            || path == "."
            || fixed.starts_with(&format!("{}/", path.trim_end_matches('/')))
    }
}

/// Allow and deny rules for a session.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PermissionRules {
    /// Calls these match are allowed without asking.
    pub allow: Vec<Rule>,
    /// Calls these match are refused without asking; they beat allow rules.
    pub deny: Vec<Rule>,
}

impl PermissionRules {
    /// The answer the rules give for a call, with the rule that gave it; `None` means ask.
    ///
    /// # Examples
    ///
    /// ```
    /// use keel_contracts::{PermissionAnswer, PermissionRules, Rule};
    /// let rules = PermissionRules {
    ///     allow: vec![Rule::parse("write_file(src/**)").unwrap()],
    ///     deny: vec![Rule::parse("write_file(src/secret*)").unwrap()],
    /// };
    /// let call = |path: &str| serde_json::json!({"path": path, "content": ""});
    /// let answer = rules.decide("write_file", &call("./src/a.rs"), "/ws");
    /// assert_eq!(answer.map(|(a, _)| a), Some(PermissionAnswer::AllowOnce));
    /// let answer = rules.decide("write_file", &call("/ws/src/../src/secret.key"), "/ws");
    /// assert_eq!(answer.map(|(a, _)| a), Some(PermissionAnswer::Deny));
    /// assert_eq!(rules.decide("write_file", &call("README.md"), "/ws"), None);
    /// ```
    pub fn decide(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
        workspace: &str,
    ) -> Option<(PermissionAnswer, &Rule)> {
        self.decide_resolved(tool, arguments, workspace, None)
    }

    /// [`PermissionRules::decide`], also given the path the call really reaches (symlinks
    /// resolved, made workspace-relative), which the caller resolves because this crate
    /// does no I/O. A deny rule matches if either spelling touches what it covers (the
    /// path, or an ancestor of it, for calls with a `path` argument; a call without one
    /// reaches the whole workspace); an allow rule only if both spellings match.
    ///
    /// # Examples
    ///
    /// ```
    /// use keel_contracts::{PermissionAnswer, PermissionRules, Rule};
    /// let rules = PermissionRules {
    ///     allow: vec![Rule::parse("write_file(**)").unwrap()],
    ///     deny: vec![Rule::parse("grep(docs/private/**)").unwrap(),
    ///                Rule::parse("write_file(docs/private/**)").unwrap()],
    /// };
    /// // A recursive search of an ancestor reaches the denied folder.
    /// let search = serde_json::json!({"pattern": "TOKEN", "path": "."});
    /// assert_eq!(rules.decide("grep", &search, "/ws").map(|(a, _)| a), Some(PermissionAnswer::Deny));
    /// // A link into the denied folder is decided on where it leads.
    /// let write = serde_json::json!({"path": "alias/x", "content": ""});
    /// let answer = rules.decide_resolved("write_file", &write, "/ws", Some("docs/private/x"));
    /// assert_eq!(answer.map(|(a, _)| a), Some(PermissionAnswer::Deny));
    /// ```
    pub fn decide_resolved(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
        workspace: &str,
        resolved_path: Option<&str>,
    ) -> Option<(PermissionAnswer, &Rule)> {
        let primary = primary_argument(arguments, workspace);
        let primary = primary.as_deref();
        let path_call = arguments.get("path").is_some()
            || arguments.get("command").is_none() && arguments.get("url").is_none();
        let textual_path = arguments
            .get("path")
            .and_then(serde_json::Value::as_str)
            .map_or_else(String::new, |path| normalize_path(path, workspace));
        let denied = self.deny.iter().find(|rule| {
            if path_call && rule.pattern.is_some() {
                rule.touches(tool, &textual_path)
                    || resolved_path.is_some_and(|resolved| rule.touches(tool, resolved))
            } else {
                rule.matches(tool, primary)
            }
        });
        if let Some(rule) = denied {
            return Some((PermissionAnswer::Deny, rule));
        }
        self.allow
            .iter()
            .find(|rule| {
                rule.matches(tool, primary)
                    && resolved_path.is_none_or(|resolved| rule.matches(tool, Some(resolved)))
            })
            .map(|rule| (PermissionAnswer::AllowOnce, rule))
    }
}

fn primary_argument(arguments: &serde_json::Value, workspace: &str) -> Option<String> {
    for key in ["command", "path", "pattern", "url"] {
        if let Some(value) = arguments.get(key).and_then(serde_json::Value::as_str) {
            return Some(if key == "path" {
                normalize_path(value, workspace)
            } else {
                value.to_owned()
            });
        }
    }
    None
}

/// Lexical normalization: drops `.` and empty components, resolves `..`, and makes an
/// absolute path inside `workspace` relative to it.
fn normalize_path(path: &str, workspace: &str) -> String {
    let workspace = workspace.trim_end_matches('/');
    let relative = match path.strip_prefix(workspace) {
        Some(rest) if !workspace.is_empty() && (rest.is_empty() || rest.starts_with('/')) => {
            rest.trim_start_matches('/')
        }
        _ => path,
    };
    let absolute = relative.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !absolute {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    if absolute { format!("/{joined}") } else { joined }
}

/// `*` matches any run of bytes, `?` one byte; everything else literally.
fn wildcard_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            while p < pattern.len() && pattern[p] == b'*' {
                p += 1;
            }
            star = Some((p, t));
        } else if let Some((star_p, star_t)) = star {
            p = star_p;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(allow: &[&str], deny: &[&str]) -> PermissionRules {
        PermissionRules {
            allow: allow.iter().map(|r| Rule::parse(r).unwrap()).collect(),
            deny: deny.iter().map(|r| Rule::parse(r).unwrap()).collect(),
        }
    }

    #[test]
    fn decision_table() {
        let set = rules(
            &["bash(git status*)", "write_file(src/**)", "read_file"],
            &["write_file(src/gen/*)", "bash(git push*)"],
        );
        let cases = [
            ("bash", json!({"command": "git status --short"}), Some(PermissionAnswer::AllowOnce)),
            ("bash", json!({"command": "git push origin main"}), Some(PermissionAnswer::Deny)),
            ("bash", json!({"command": "rm -rf /"}), None),
            (
                "write_file",
                json!({"path": "src/lib.rs", "content": "x"}),
                Some(PermissionAnswer::AllowOnce),
            ),
            ("write_file", json!({"path": "src/gen/out.rs"}), Some(PermissionAnswer::Deny)),
            ("write_file", json!({"path": "./src/x/../gen/out.rs"}), Some(PermissionAnswer::Deny)),
            ("write_file", json!({"path": "/ws/src/gen/a"}), Some(PermissionAnswer::Deny)),
            ("write_file", json!({"path": "/wsother/src/a"}), None),
            ("write_file", json!({"path": "docs/a.md", "content": "src/x"}), None),
            // No path: the call could reach anything, so a path deny rule applies.
            ("write_file", json!({"content": "src/x"}), Some(PermissionAnswer::Deny)),
            ("read_file", json!({}), Some(PermissionAnswer::AllowOnce)),
            ("edit_file", json!({"path": "src/lib.rs"}), None),
        ];
        for (tool, arguments, want) in cases {
            let got = set.decide(tool, &arguments, "/ws").map(|(answer, _)| answer);
            assert_eq!(got, want, "{tool} {arguments}");
        }
    }

    #[test]
    fn parse_errors() {
        for bad in ["", "bash(", "bash()", "two words(x)"] {
            assert!(Rule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match(b"*", b""));
        assert!(wildcard_match(b"a*c", b"abbbc"));
        assert!(wildcard_match(b"a?c", b"abc"));
        assert!(!wildcard_match(b"a?c", b"ac"));
        assert!(wildcard_match(b"src/**", b"src/a/b.rs"));
        assert!(!wildcard_match(b"src/**", b"srcx/a"));
    }
}
