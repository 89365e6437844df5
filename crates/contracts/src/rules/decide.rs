//! Deciding a call: the answer allow and deny rules give (`PermissionRules::decide` and
//! friends), with the facts the caller resolved about it.

use serde::{Deserialize, Serialize};

use super::command::CommandLine;
use super::grammar::{PATH_RULE, READ_DENYING_TOOLS, Rule, WRITE_DENYING_TOOLS, tool_name_covers};
use super::pattern::{covers, normalize_path, wildcard_match};
use crate::PermissionAnswer;

/// What the caller resolved about a call with I/O or a parser, for
/// [`PermissionRules::decide_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CallFacts<'a> {
    /// The path a `path` argument really reaches (symlinks resolved, workspace-relative,
    /// or absolute when it leads outside).
    pub resolved_path: Option<&'a str>,
    /// The parsed `command` argument; without it [`CommandLine::lexical`] is used.
    pub command: Option<&'a CommandLine>,
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
        self.decide_with(tool, arguments, workspace, CallFacts { resolved_path, command: None })
    }

    /// The full decision: [`PermissionRules::decide_resolved`] plus, for a call with a
    /// `command` argument (and no `path`), the command line split into simple commands by
    /// the caller's shell parser (`facts.command`; [`CommandLine::lexical`] without it).
    ///
    /// - Deny: a `path(P)` rule, or a rule denying reading `P` for another tool
    ///   (`read_file(P)`, `grep(P)`, ...), refuses any call whose `path` (as written or
    ///   resolved) `P` covers; a command rule refuses when its pattern matches the whole command text or
    ///   any one simple command; other rules as in [`PermissionRules::decide_resolved`].
    /// - Allow: a command line is allowed only when it resolved, has at least one simple
    ///   command, and every simple command is matched by an allow rule of the tool (a bare
    ///   `TOOL` rule matches every resolved command). The first rule used is returned.
    ///
    /// # Examples
    ///
    /// ```
    /// use keel_contracts::{CallFacts, CommandLine, PermissionAnswer, PermissionRules, Rule, SimpleCommand};
    /// let rules = PermissionRules {
    ///     allow: vec![Rule::parse("bash(git status*)").unwrap()],
    ///     deny: vec![Rule::parse("bash(rm *)").unwrap()],
    /// };
    /// let simple = |words: &[&str]| SimpleCommand { words: words.iter().map(|w| w.to_string()).collect() };
    /// let call = serde_json::json!({"command": "git status; rm -rf x"});
    /// let line = CommandLine::Simple(vec![simple(&["git", "status"]), simple(&["rm", "-rf", "x"])]);
    /// let facts = CallFacts { resolved_path: None, command: Some(&line) };
    /// let answer = rules.decide_with("bash", &call, "/ws", facts).map(|(a, _)| a);
    /// assert_eq!(answer, Some(PermissionAnswer::Deny));
    /// let call = serde_json::json!({"command": "git status"});
    /// let line = CommandLine::Simple(vec![simple(&["git", "status"])]);
    /// let facts = CallFacts { resolved_path: None, command: Some(&line) };
    /// let answer = rules.decide_with("bash", &call, "/ws", facts).map(|(a, _)| a);
    /// assert_eq!(answer, Some(PermissionAnswer::AllowOnce));
    /// ```
    pub fn decide_with(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
        workspace: &str,
        facts: CallFacts<'_>,
    ) -> Option<(PermissionAnswer, &Rule)> {
        let resolved_path = facts.resolved_path;
        let primary = primary_argument(arguments, workspace);
        let primary = primary.as_deref();
        let path_argument = arguments.get("path").and_then(serde_json::Value::as_str);
        let command_text = arguments
            .get("command")
            .and_then(serde_json::Value::as_str)
            .filter(|_| path_argument.is_none());
        let lexical;
        let line = match (command_text, facts.command) {
            (None, _) => None,
            (Some(_), Some(line)) => Some(line),
            (Some(text), None) => {
                lexical = CommandLine::lexical(text);
                Some(&lexical)
            }
        };
        let path_call = arguments.get("path").is_some()
            || arguments.get("command").is_none() && arguments.get("url").is_none();
        let textual_path =
            path_argument.map_or_else(String::new, |path| normalize_path(path, workspace));
        let denied = self.deny.iter().find(|rule| {
            // A rule denying reading a path holds for every tool's call on it (MCP tools
            // included); `path(P)` is only that.
            if rule.tool == PATH_RULE
                || rule.tool != tool && READ_DENYING_TOOLS.contains(&rule.tool.as_str())
            {
                let Some(pattern) = &rule.pattern else { return false };
                // The pattern is normalized as the path is: `./secrets/**`, `/ws/secrets/**`
                // and `secrets/**` deny the same files, and `.` denies the whole workspace.
                let pattern = normalize_path(pattern, workspace);
                return path_argument.is_some()
                    && (covers(&pattern, &textual_path)
                        || resolved_path.is_some_and(|resolved| covers(&pattern, resolved)));
            }
            // A deny on one file-writing tool holds for the other (`write_file(P)` also
            // refuses `edit_file` on P, and the reverse), as a read deny holds for every
            // read: both change the file.
            let tool = if WRITE_DENYING_TOOLS.contains(&rule.tool.as_str())
                && WRITE_DENYING_TOOLS.contains(&tool)
            {
                rule.tool.as_str()
            } else {
                tool
            };
            if let (Some(text), Some(line)) = (command_text, line) {
                return rule.matches(tool, Some(text))
                    || line
                        .commands()
                        .iter()
                        .any(|command| rule.matches(tool, Some(&command.text())));
            }
            if path_call && rule.pattern.is_some() {
                rule.touches(tool, &textual_path, workspace)
                    || resolved_path.is_some_and(|resolved| rule.touches(tool, resolved, workspace))
            } else {
                rule.matches(tool, primary)
            }
        });
        if let Some(rule) = denied {
            return Some((PermissionAnswer::Deny, rule));
        }
        if let Some(line) = line {
            let CommandLine::Simple(commands) = line else { return None };
            let mut first = None;
            for command in commands {
                let text = command.text();
                let rule = self.allow.iter().find(|rule| rule.matches(tool, Some(&text)))?;
                first.get_or_insert(rule);
            }
            return first.map(|rule| (PermissionAnswer::AllowOnce, rule));
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

impl Rule {
    fn matches(&self, tool: &str, primary: Option<&str>) -> bool {
        if !tool_name_covers(&self.tool, tool) {
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
    fn touches(&self, tool: &str, path: &str, workspace: &str) -> bool {
        if !tool_name_covers(&self.tool, tool) {
            return false;
        }
        let Some(pattern) = &self.pattern else { return true };
        let pattern = normalize_path(pattern, workspace);
        if covers(&pattern, path) {
            return true;
        }
        let fixed: &str = pattern.split(['*', '?']).next().unwrap_or_default();
        let fixed = fixed.trim_end_matches('/');
        let path = path.trim_end_matches('/');
        // A search of exactly the denied folder (`grep` in `docs/private` against
        // `docs/private/**`) reaches only what the rule covers.
        path.is_empty() || path == "." || fixed == path || fixed.starts_with(&format!("{path}/"))
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
