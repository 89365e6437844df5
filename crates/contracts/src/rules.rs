//! Permission rules: pre-answers to consent requests by tool and argument pattern, in the
//! style of `bash(git status*)` and `write_file(src/**)`. Deny rules beat allow rules.
//!
//! A rule is `TOOL` (any arguments) or `TOOL(PATTERN)`. The pattern is matched against the
//! call's primary argument, the first of `command`, `path`, `pattern`, `url` that the call
//! has as a string; a call without one matches only a bare `TOOL` rule. In patterns `*`
//! matches any run of characters (including `/`; `**` is the same) and `?` one character.
//! `path` values are normalized lexically first (`./a/../b` is `b`; an absolute path inside
//! the workspace becomes relative), so a deny rule cannot be dodged by spelling. A path is
//! covered by a path pattern when it, or one of its ancestors, matches.
//!
//! `path(PATTERN)` is a deny-only rule for a path itself: every call with a `path` argument
//! the pattern covers is refused, whatever the tool (built-in or MCP). A rule denying
//! reading a path for one tool (`read_file(P)`, `grep(P)`, `glob(P)`, `list_dir(P)`) does
//! the same for every other tool's call on it.
//!
//! **Paths denied for commands.** A deny rule that denies *reading* a path —
//! `path(P)`, `read_file(P)`, `grep(P)`, `glob(P)` or `list_dir(P)` — also holds for
//! commands: [`PermissionRules::denied_paths`] is the set the bash tool masks inside the
//! sandbox (empty and read-only), and the set grep, glob and list_dir skip. A deny rule on
//! `write_file(P)`/`edit_file(P)` makes `P` read-only for commands
//! ([`PermissionRules::write_denied_paths`]); it stays readable.
//!
//! **Command rules** are decided per simple command: the caller splits the command line
//! with a shell parser into a [`CommandLine`] (this crate parses no shell syntax beyond a
//! conservative lexical fallback, [`CommandLine::lexical`]). A deny rule matches when it
//! matches the whole text or any one simple command; an allow rule set allows a line only
//! when every simple command is matched by an allow rule, and never allows a line the
//! parser could not resolve ([`CommandLine::Unresolved`]): that line is asked.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::PermissionAnswer;

/// The pseudo-tool of deny rules on a path itself: `path(secrets/**)`.
pub const PATH_RULE: &str = "path";

/// Tools whose deny rules deny reading a path, and so also mask it for commands.
const READ_DENYING_TOOLS: &[&str] = &[PATH_RULE, "read_file", "grep", "glob", "list_dir"];
/// Tools whose deny rules deny writing a path, and so make it read-only for commands.
const WRITE_DENYING_TOOLS: &[&str] = &["write_file", "edit_file"];

/// Characters that make a command line more than a plain list of words for the shell.
const SHELL_SPECIAL: &[char] = &[
    ';', '&', '|', '<', '>', '(', ')', '{', '}', '$', '`', '\\', '\'', '"', '\n', '\r', '*', '?',
    '[', ']', '~', '#', '!', '=', '%', '^',
];

/// One simple command of a command line: its words after quote removal, with the command
/// name first (wrappers such as `env X=1` or `command` already stripped by the parser).
/// Redirections are not words. A word whose value is only known at run time (a parameter
/// or a substitution) keeps its source text, e.g. `$HOME`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimpleCommand {
    /// The words, command name first; never empty.
    pub words: Vec<String>,
}

impl SimpleCommand {
    /// The words joined by single spaces: what command rule patterns are matched against.
    pub fn text(&self) -> String {
        self.words.join(" ")
    }
}

/// A command line as the shell would run it, split into simple commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandLine {
    /// Every simple command the line can run — those in pipelines, lists, subshells,
    /// groups, substitutions and `sh -c` strings included — in source order.
    Simple(Vec<SimpleCommand>),
    /// What the line runs cannot be known from its text (a parse error, `eval`, a variable
    /// as a command name, ...). Rules never allow it; deny rules still see `found`.
    Unresolved {
        /// Why, for the gate's reason.
        reason: String,
        /// The simple commands found before giving up.
        found: Vec<SimpleCommand>,
    },
}

impl CommandLine {
    /// The fallback when no parser ran: a line of plain words (no quoting, expansion,
    /// operator or redirection character at all) is one simple command; anything else is
    /// [`CommandLine::Unresolved`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keel_contracts::CommandLine;
    /// assert!(matches!(CommandLine::lexical("git status --short"), CommandLine::Simple(_)));
    /// assert!(matches!(CommandLine::lexical("git status; rm x"), CommandLine::Unresolved { .. }));
    /// ```
    pub fn lexical(text: &str) -> CommandLine {
        if text.contains(SHELL_SPECIAL) {
            return CommandLine::Unresolved {
                reason: "the command line was not parsed and is not a plain list of words"
                    .to_owned(),
                found: Vec::new(),
            };
        }
        let words: Vec<String> = text.split_ascii_whitespace().map(str::to_owned).collect();
        if words.is_empty() {
            CommandLine::Simple(Vec::new())
        } else {
            CommandLine::Simple(vec![SimpleCommand { words }])
        }
    }

    /// The simple commands known, resolved or not.
    pub fn commands(&self) -> &[SimpleCommand] {
        match self {
            CommandLine::Simple(commands) | CommandLine::Unresolved { found: commands, .. } => {
                commands
            }
        }
    }
}

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

/// Path patterns denied for reading (see the module docs): what commands find masked and
/// what grep, glob and list_dir skip. Patterns are workspace-relative (or absolute for
/// paths outside it), normalized, sorted and unique.
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

/// `path` normalized, borrowed when it already is (the common case in a walk).
fn normalized(path: &str) -> std::borrow::Cow<'_, str> {
    // The empty path needs no test of its own: it splits into one empty part and is
    // returned as it is, which is what `normalize_path` makes of it too.
    let clean = !path.ends_with('/')
        && !path.contains("//")
        && path
            .split('/')
            .skip(usize::from(path.starts_with('/')))
            .all(|part| part != "." && part != "..");
    if clean {
        std::borrow::Cow::Borrowed(path)
    } else {
        std::borrow::Cow::Owned(normalize_path(path, ""))
    }
}

/// Whether `pattern` matches `path` or one of its ancestors (both normalized). The empty
/// pattern is the workspace root (`.`, `./`, the workspace's own absolute path): it covers
/// every path in it (relative, not leading out with `..`).
fn covers(pattern: &str, path: &str) -> bool {
    if pattern.is_empty() {
        return !path.starts_with('/') && path != ".." && !path.starts_with("../");
    }
    if wildcard_match(pattern.as_bytes(), path.as_bytes()) {
        return true;
    }
    path.match_indices('/').any(|(index, _)| {
        index > 0 && wildcard_match(pattern.as_bytes(), &path.as_bytes()[..index])
    })
}

/// Why a tool name with a wildcard is refused: only `mcp__SERVER__*` is supported.
pub const TOOL_WILDCARD_REFUSAL: &str = "a '*' or '?' in a tool name is supported only as \
    mcp__SERVER__* (every tool of one MCP server, SERVER of letters, digits, '_' and '-')";

/// Checks a tool name of a deny rule or `--forbid`: a plain name, or `mcp__SERVER__*`, every
/// tool of MCP server SERVER (those it lists later included). Any other `*` or `?` is
/// refused, so a wildcard that would deny nothing fails closed.
///
/// # Errors
///
/// [`TOOL_WILDCARD_REFUSAL`] for any other wildcard.
///
/// # Examples
///
/// ```
/// use keel_contracts::check_tool_name_pattern;
/// assert!(check_tool_name_pattern("bash").is_ok());
/// assert!(check_tool_name_pattern("mcp__evil__*").is_ok());
/// assert!(check_tool_name_pattern("mcp__*").is_err());
/// assert!(check_tool_name_pattern("bash*").is_err());
/// ```
pub fn check_tool_name_pattern(name: &str) -> Result<(), &'static str> {
    if !name.contains(['*', '?']) || server_wildcard(name).is_some() {
        Ok(())
    } else {
        Err(TOOL_WILDCARD_REFUSAL)
    }
}

/// `mcp__SERVER__` for a server-wide name `mcp__SERVER__*`, else `None`.
fn server_wildcard(name: &str) -> Option<&str> {
    let prefix = name.strip_suffix('*')?;
    let server = prefix.strip_prefix("mcp__")?.strip_suffix("__")?;
    let valid = !server.is_empty()
        && server.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    valid.then_some(prefix)
}

/// Whether the tool name of a rule or `--forbid` entry (`name`: a plain name or
/// `mcp__SERVER__*`, see [`check_tool_name_pattern`]) covers the tool called `tool`.
///
/// # Examples
///
/// ```
/// use keel_contracts::tool_name_covers;
/// assert!(tool_name_covers("mcp__evil__*", "mcp__evil__renamed"));
/// assert!(!tool_name_covers("mcp__evil__*", "mcp__good__read"));
/// assert!(tool_name_covers("bash", "bash"));
/// ```
pub fn tool_name_covers(name: &str, tool: &str) -> bool {
    match server_wildcard(name) {
        Some(prefix) => tool.len() > prefix.len() && tool.starts_with(prefix),
        None => name == tool,
    }
}

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
    /// [`RuleError`] for an empty tool name, an unclosed parenthesis, an empty pattern or
    /// a wildcard in the tool name other than `mcp__SERVER__*` ([`check_tool_name_pattern`]).
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let error = |reason| RuleError { rule: text.to_owned(), reason };
        let trimmed = text.trim();
        let (tool, pattern) = match trimmed.split_once('(') {
            None => (trimmed, None),
            Some((tool, rest)) => {
                let Some(pattern) = rest.strip_suffix(')') else {
                    return Err(error("missing ')' at the end"));
                };
                // `bash( rm *)` means `bash(rm *)`: a pattern with stray spaces would match
                // nothing, and a deny that matches nothing fails open.
                let pattern = pattern.trim();
                if pattern.is_empty() {
                    return Err(error("empty pattern; write TOOL for any arguments"));
                }
                (tool.trim(), Some(pattern.to_owned()))
            }
        };
        if tool.is_empty() || tool.contains(char::is_whitespace) {
            return Err(error("the tool name is empty or has spaces"));
        }
        check_tool_name_pattern(tool).map_err(error)?;
        if tool == PATH_RULE && pattern.is_none() {
            return Err(error("path needs a pattern: path(secrets/**)"));
        }
        let path_tool = READ_DENYING_TOOLS.contains(&tool) || WRITE_DENYING_TOOLS.contains(&tool);
        if path_tool && pattern.as_deref().is_some_and(|pattern| pattern.starts_with('~')) {
            // Matched literally, `~/.ssh/**` would name a folder called `~` in the
            // workspace and deny nothing the user meant.
            return Err(error("'~' is not expanded in a path pattern; write the path in full"));
        }
        if path_tool
            && pattern.as_deref().is_some_and(|pattern| pattern.contains(['"', '\'', '$', '\\']))
        {
            // Taken literally, `"secret/**"`, `$PWD/secret/**` or `secret\key` name no
            // file the user meant: a deny that denies nothing.
            return Err(error(
                "quotes, '$' and '\\' are not expanded in a path pattern; write the path as it is",
            ));
        }
        Ok(Rule { text: trimmed.to_owned(), tool: tool.to_owned(), pattern })
    }

    /// The tool the rule names (`bash` for `bash(git status*)`; `path` for a path rule).
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// Whether the rule names a set of tools (`mcp__SERVER__*`) rather than one.
    pub fn is_server_wide(&self) -> bool {
        server_wildcard(&self.tool).is_some()
    }

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
            // The `*` swallows one more byte; matching resumes after it.
            p = star_p;
            t = star_t + 1;
            star = Some((star_p, t));
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

    /// A deny rule's pattern is normalized as the path is: `./secrets/**`, the workspace's
    /// absolute spelling and `secrets/**` deny the same files, and a pattern that names the
    /// workspace root (`.`, `./`, `/ws`) denies every path in it — never nothing.
    #[test]
    fn redteam_rules_deny_patterns_are_normalized_and_the_root_denies_everything() {
        let spelled = [
            "read_file(./secrets/**)",
            "read_file(/ws/secrets/**)",
            "path(./secrets)",
            "write_file(./secrets/*)",
        ];
        for rule in spelled {
            let set = rules(&["read_file", "write_file"], &[rule]);
            let tool = if rule.starts_with("write_file") { "write_file" } else { "read_file" };
            let got = set.decide(tool, &json!({"path": "secrets/key"}), "/ws").map(|(a, _)| a);
            assert_eq!(got, Some(PermissionAnswer::Deny), "{rule} on secrets/key");
            let got = set.decide(tool, &json!({"path": "src/lib.rs"}), "/ws").map(|(a, _)| a);
            assert_eq!(got, Some(PermissionAnswer::AllowOnce), "{rule} on src/lib.rs");
        }
        for root in ["read_file(.)", "read_file(./)", "path(/ws)", "grep(.)"] {
            let set = rules(&["read_file", "grep"], &[root]);
            for path in ["src/lib.rs", ".", "a/b/c"] {
                let got = set.decide("read_file", &json!({"path": path}), "/ws").map(|(a, _)| a);
                assert_eq!(got, Some(PermissionAnswer::Deny), "{root} on {path}");
            }
            // Outside the workspace is not the workspace root.
            let got = set.decide("read_file", &json!({"path": "/etc/hosts"}), "/ws");
            assert_eq!(got.map(|(a, _)| a), Some(PermissionAnswer::AllowOnce), "{root}");
        }
        let root = DeniedPaths::new(["."], "/ws");
        assert!(root.covers("src/lib.rs") && root.covers("a") && root.hides_everything_under(""));
        let narrow = DeniedPaths::new(["./secrets/**"], "/ws");
        assert!(narrow.covers("secrets/key") && !narrow.covers("src/lib.rs"));
    }

    /// A deny on one file-writing tool refuses the other on the same paths.
    #[test]
    fn redteam_rules_a_write_deny_holds_for_both_write_tools() {
        for rule in ["write_file(./secrets/**)", "edit_file(secrets/**)"] {
            let set = rules(&["write_file", "edit_file"], &[rule]);
            for tool in ["write_file", "edit_file"] {
                let got = set.decide(tool, &json!({"path": "secrets/k"}), "/ws").map(|(a, _)| a);
                assert_eq!(got, Some(PermissionAnswer::Deny), "{rule} / {tool}");
                let got = set.decide(tool, &json!({"path": "src/a.rs"}), "/ws").map(|(a, _)| a);
                assert_eq!(got, Some(PermissionAnswer::AllowOnce), "{rule} / {tool} neighbour");
            }
        }
        // Only the two write tools share their denies: a write deny says nothing of bash,
        // and a bash deny nothing of the write tools.
        let set = rules(&["bash", "write_file"], &["write_file", "bash(rm *)"]);
        let got = set.decide("bash", &json!({"command": "ls"}), "/ws").map(|(a, _)| a);
        assert_eq!(got, Some(PermissionAnswer::AllowOnce));
        let set = rules(&["write_file"], &["bash"]);
        let got = set.decide("write_file", &json!({"path": "a"}), "/ws").map(|(a, _)| a);
        assert_eq!(got, Some(PermissionAnswer::AllowOnce));
    }

    fn line(commands: &[&[&str]]) -> CommandLine {
        CommandLine::Simple(
            commands
                .iter()
                .map(|words| SimpleCommand {
                    words: words.iter().map(|w| (*w).to_owned()).collect(),
                })
                .collect(),
        )
    }

    fn decide_line(
        set: &PermissionRules,
        text: &str,
        parsed: &CommandLine,
    ) -> Option<PermissionAnswer> {
        let facts = CallFacts { resolved_path: None, command: Some(parsed) };
        set.decide_with("bash", &json!({"command": text}), "/ws", facts).map(|(answer, _)| answer)
    }

    /// An allow rule covers a line only when it covers every simple command; a deny rule
    /// refuses when it matches any one; an unresolved line is never allowed.
    #[test]
    fn redteam_rules_allow_covers_every_simple_command_or_nothing() {
        let set = rules(&["bash(git status*)", "bash(git diff*)"], &["bash(rm *)", "bash(curl*)"]);
        let unresolved = |found: &[&[&str]]| CommandLine::Unresolved {
            reason: "eval".into(),
            found: line(found).commands().to_vec(),
        };
        let cases: Vec<(&str, CommandLine, Option<PermissionAnswer>)> = vec![
            // The neighbour: the allowed command alone, and two allowed ones together.
            ("git status", line(&[&["git", "status"]]), Some(PermissionAnswer::AllowOnce)),
            (
                "git status && git diff",
                line(&[&["git", "status"], &["git", "diff"]]),
                Some(PermissionAnswer::AllowOnce),
            ),
            // A list smuggles a second command: never allowed, denied when it is denied.
            ("git status; ls", line(&[&["git", "status"], &["ls"]]), None),
            (
                "git status && rm -rf src",
                line(&[&["git", "status"], &["rm", "-rf", "src"]]),
                Some(PermissionAnswer::Deny),
            ),
            (
                "git status $(curl x)",
                line(&[&["git", "status", "$(curl x)"], &["curl", "x"]]),
                Some(PermissionAnswer::Deny),
            ),
            ("git status `id`", line(&[&["git", "status", "`id`"], &["id"]]), None),
            // Unresolved lines ask, even when all that was found is allowed ...
            ("eval git status", unresolved(&[&["git", "status"]]), None),
            // ... and deny rules still see what was found.
            ("eval x; rm y", unresolved(&[&["rm", "y"]]), Some(PermissionAnswer::Deny)),
            // A line with no simple command at all is not allowed by anything.
            ("X=1", line(&[]), None),
        ];
        for (text, parsed, want) in cases {
            assert_eq!(decide_line(&set, text, &parsed), want, "{text}");
        }
    }

    /// Without a parsed line, only a plain list of words can be allowed.
    #[test]
    fn redteam_rules_unparsed_lines_fall_back_to_plain_words_only() {
        let set = rules(&["bash(git status*)"], &[]);
        let decide = |command: &str| {
            set.decide("bash", &json!({"command": command}), "/ws").map(|(answer, _)| answer)
        };
        assert_eq!(decide("git status --short"), Some(PermissionAnswer::AllowOnce));
        for smuggled in [
            "git status; rm x",
            "git status && rm x",
            "git status $(id)",
            "git status `id`",
            "git status > .git/config",
            "git status\nrm x",
            "git status
rm x",
        ] {
            assert_eq!(decide(smuggled), None, "{smuggled}");
        }
    }

    /// `path(P)` refuses every tool's call on a covered path, as written or resolved, and
    /// the read-denying rules are the set masked for commands.
    #[test]
    fn redteam_rules_path_rules_cover_every_tool_and_the_denied_set() {
        let set = rules(
            &["read_file", "mcp__fs__read"],
            &["path(secrets/**)", "read_file(**/.env)", "write_file(gen/**)"],
        );
        let decide = |tool: &str, arguments: serde_json::Value, resolved: Option<&str>| {
            let facts = CallFacts { resolved_path: resolved, command: None };
            set.decide_with(tool, &arguments, "/ws", facts).map(|(answer, _)| answer)
        };
        let deny = Some(PermissionAnswer::Deny);
        assert_eq!(decide("read_file", json!({"path": "secrets/key"}), None), deny);
        assert_eq!(decide("read_file", json!({"path": "./secrets/../secrets/a/b"}), None), deny);
        assert_eq!(decide("edit_file", json!({"path": "/ws/secrets/key"}), None), deny);
        assert_eq!(decide("mcp__fs__read", json!({"path": "secrets/key"}), None), deny);
        assert_eq!(decide("read_file", json!({"path": "alias/key"}), Some("secrets/key")), deny);
        assert_eq!(decide("read_file", json!({"path": "app/.env"}), None), deny);
        assert_eq!(decide("mcp__fs__read", json!({"path": "/ws/app/.env"}), None), deny);
        assert_eq!(decide("write_file", json!({"path": "x/.env", "content": ""}), None), deny);
        // The neighbours: other files read fine; a search of the root is not refused (the
        // search skips the denied paths instead).
        assert_eq!(
            decide("read_file", json!({"path": "src/main.rs"}), None),
            Some(PermissionAnswer::AllowOnce)
        );
        assert_eq!(decide("grep", json!({"pattern": "x", "path": "."}), None), None);
        let denied = set.denied_paths("/ws");
        assert_eq!(denied.patterns(), ["**/.env", "secrets/**"]);
        assert!(denied.covers("secrets/deep/key") && denied.covers("a/b/.env"));
        assert!(!denied.covers("gen/out.rs"), "a write-only deny does not hide a path");
        assert_eq!(set.write_denied_paths("/ws").patterns(), ["gen/**"]);
        assert!(Rule::parse("path").is_err());
    }

    proptest::proptest! {
        /// The borrowed fast path never differs from full normalization.
        #[test]
        fn normalized_agrees_with_normalize_path(path in "[a./]{0,12}") {
            proptest::prop_assert_eq!(normalized(&path).into_owned(), normalize_path(&path, ""));
        }
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "",
            "bash(",
            "bash()",
            "bash(  )",
            "two words(x)",
            "path(~/.ssh/**)",
            "read_file(~)",
            "read_file(\"secret/**\")",
            "path($PWD/x)",
            "read_file(a\\b)",
            "mcp__*",
            "mcp__evil*",
            "mcp__evil__x*",
            "mcp__evil__?",
            "mcp__ev*l__*",
            "mcp____*",
            "mcp__a.b__*",
            "evil__*",
            "bash*",
            "*",
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad:?}");
        }
        let error = Rule::parse("mcp__evil*").unwrap_err();
        assert_eq!(error.reason, TOOL_WILDCARD_REFUSAL);
    }

    /// `mcp__SERVER__*` covers every tool of that server, and only tools: not the server
    /// prefix itself, not another server whose name starts the same.
    #[test]
    fn redteam_rules_a_server_wide_deny_covers_every_tool_of_that_server_only() {
        let set = rules(&["mcp__evil__*", "mcp__good__*"], &["mcp__evil__*"]);
        let decide = |tool: &str, arguments: serde_json::Value| {
            set.decide(tool, &arguments, "/ws").map(|(answer, rule)| (answer, rule.text.clone()))
        };
        let deny = Some((PermissionAnswer::Deny, "mcp__evil__*".to_owned()));
        assert_eq!(decide("mcp__evil__read", json!({})), deny);
        assert_eq!(decide("mcp__evil__renamed_later", json!({"path": "a"})), deny);
        assert_eq!(decide("mcp__evil__run", json!({"command": "ls"})), deny);
        assert_eq!(decide("mcp__evil__fetch", json!({"url": "http://x"})), deny);
        // The neighbours: another server, a server whose name starts the same, the bare
        // prefix, a built-in.
        let allow = Some((PermissionAnswer::AllowOnce, "mcp__good__*".to_owned()));
        assert_eq!(decide("mcp__good__read", json!({"path": "a"})), allow);
        assert_eq!(decide("mcp__evilx__read", json!({})), None);
        assert_eq!(decide("mcp__evil__", json!({})), None);
        assert_eq!(decide("read_file", json!({"path": "a"})), None);
        assert!(Rule::parse("mcp__evil__*").unwrap().is_server_wide());
        assert!(!Rule::parse("mcp__evil__read").unwrap().is_server_wide());
        assert!(!Rule::parse("bash(x*)").unwrap().is_server_wide());
    }

    #[test]
    fn tool_name_patterns_table() {
        for (name, tool, covers) in [
            ("mcp__s__*", "mcp__s__t", true),
            ("mcp__s-1__*", "mcp__s-1__t", true),
            ("mcp__s__*", "mcp__s__", false),
            ("mcp__s__*", "mcp__s_t", false),
            ("mcp__s__*", "mcp__t__x", false),
            ("mcp__s__t", "mcp__s__t", true),
            ("mcp__s__t", "mcp__s__tt", false),
            ("bash", "bash", true),
            ("bash", "bash2", false),
            ("mcp__*", "mcp__s__t", false),
        ] {
            assert_eq!(tool_name_covers(name, tool), covers, "{name} {tool}");
        }
        assert_eq!(check_tool_name_pattern("mcp__s__*"), Ok(()));
        assert_eq!(check_tool_name_pattern("bash"), Ok(()));
        assert_eq!(check_tool_name_pattern("mcp__s__?"), Err(TOOL_WILDCARD_REFUSAL));
        assert_eq!(check_tool_name_pattern("ba?h"), Err(TOOL_WILDCARD_REFUSAL));
    }

    #[test]
    fn a_rule_names_its_tool() {
        for (text, tool) in [
            ("bash(git status*)", "bash"),
            ("path(secrets/**)", "path"),
            ("grep", "grep"),
            ("bash(echo \"$HOME\" ~ a\\b)", "bash"),
        ] {
            assert_eq!(Rule::parse(text).unwrap().tool(), tool, "{text}");
        }
    }

    /// Spaces around a pattern are not part of it: `bash( rm *)` denies `rm -rf x`.
    #[test]
    fn patterns_are_trimmed() {
        let set = rules(&[], &["bash( rm * )"]);
        let call = json!({"command": "rm -rf x"});
        let answer = set.decide("bash", &call, "/ws").map(|(answer, _)| answer);
        assert_eq!(answer, Some(PermissionAnswer::Deny));
    }

    /// A deny rule for a path also refuses a call on a folder that holds what it covers (a
    /// recursive search reaches it), but not a sibling whose name merely shares a prefix.
    #[test]
    fn deny_rules_touch_ancestors_of_what_they_cover_and_nothing_beside() {
        let set = rules(&["fetch"], &["grep(docs/private/**)", "fetch(https://evil.example/*)"]);
        let decide = |tool: &str, arguments: serde_json::Value, resolved: Option<&str>| {
            set.decide_resolved(tool, &arguments, "/ws", resolved).map(|(answer, _)| answer)
        };
        let deny = Some(PermissionAnswer::Deny);
        let grep = |path: &str| json!({"pattern": "TOKEN", "path": path});
        let reaching = [
            ".",
            "",
            "docs",
            "./docs/",
            "/ws/docs",
            "docs/private",
            "docs/private/",
            "docs/private/a",
        ];
        for reaching in reaching {
            assert_eq!(decide("grep", grep(reaching), None), deny, "{reaching:?}");
        }
        for beside in ["doc", "docs/public", "docsprivate", "src", "/elsewhere/docs"] {
            assert_eq!(decide("grep", grep(beside), None), None, "{beside:?}");
        }
        // Decided on where the path really leads too, ancestors included.
        assert_eq!(decide("grep", grep("link"), Some("docs")), deny);
        assert_eq!(decide("grep", grep("link"), Some("docs/public")), None);
        // Another tool's call on the same folder is not a grep.
        assert_eq!(decide("glob", json!({"pattern": "*", "path": "docs"}), None), None);
        // A call with a `url` and no `path` is matched on its url, not treated as a call
        // that could reach any path.
        assert_eq!(decide("fetch", json!({"url": "https://evil.example/x"}), None), deny);
        let allow = Some(PermissionAnswer::AllowOnce);
        assert_eq!(decide("fetch", json!({"url": "https://good.example/x"}), None), allow);
    }

    /// `normalize_path` at its edges: `..` at the top of a relative path is kept (it leads
    /// outside), at the root of an absolute one dropped; `//`, `.` and a trailing slash
    /// vanish; only the workspace itself or a path below it is made relative.
    #[test]
    fn normalize_path_table() {
        let cases = [
            ("a/b", "a/b"),
            ("./a//b/", "a/b"),
            ("a/./b/.", "a/b"),
            ("a/../b", "b"),
            ("a/b/../../c", "c"),
            ("../a", "../a"),
            ("a/../../b", "../b"),
            ("../../a/..", "../.."),
            ("/../a", "/a"),
            ("/a/../../b", "/b"),
            ("/", "/"),
            ("", ""),
            (".", ""),
            ("/ws", ""),
            ("/ws/", ""),
            ("/ws/src/../a", "a"),
            ("/ws//a", "a"),
            ("/wsx/a", "/wsx/a"),
            ("/other/ws/a", "/other/ws/a"),
        ];
        for (path, want) in cases {
            assert_eq!(normalize_path(path, "/ws"), want, "{path:?}");
            assert_eq!(normalize_path(path, "/ws/"), want, "{path:?} against /ws/");
        }
        // Without a workspace nothing is made relative.
        assert_eq!(normalize_path("/ws/a", ""), "/ws/a");
        // The borrowed fast path agrees on the edge cases too.
        for (path, _) in cases {
            assert_eq!(normalized(path), normalize_path(path, ""), "{path:?}");
        }
        for path in ["/..", "/.", "..", "a/..", "/a/..", "//", "a//", "/a/"] {
            assert_eq!(normalized(path), normalize_path(path, ""), "{path:?}");
        }
    }

    /// What a denied set covers: the pattern's matches and everything below them, never a
    /// sibling; nothing when empty.
    #[test]
    fn denied_paths_cover_descendants_of_a_literal_pattern() {
        let denied = DeniedPaths::new(["keys", "**/.env", "/etc/ssl"], "/ws");
        assert!(!denied.is_empty());
        for covered in ["keys", "keys/a", "keys/a/b", "./keys/", "app/.env/x", "/etc/ssl/k"] {
            assert!(denied.covers(covered), "{covered:?}");
        }
        for beside in ["keysx/a", "key", "a/keys", "app/.envrc", "/etc/sslx", "/etc"] {
            assert!(!denied.covers(beside), "{beside:?}");
        }
        let none = DeniedPaths::new(Vec::<String>::new(), "/ws");
        assert!(none.is_empty() && !none.covers("keys") && none.patterns().is_empty());
        // A pattern for the workspace itself (`.`) says nothing about paths outside it.
        let root = DeniedPaths::new(["."], "/ws");
        assert!(!root.covers("/etc/passwd"));
    }

    /// `wildcard_match` against a plain recursive matcher of the same rules.
    fn reference_match(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'*', rest)) => (0..=text.len()).any(|skip| reference_match(rest, &text[skip..])),
            Some((&first, rest)) => text.split_first().is_some_and(|(&c, tail)| {
                (first == b'?' || first == c) && reference_match(rest, tail)
            }),
        }
    }

    proptest::proptest! {
        /// The matcher agrees with the reference on small alphabets, where backtracking
        /// after a `*` is exercised most.
        #[test]
        fn wildcard_match_agrees_with_the_reference(pattern in "[ab*?]{0,8}", text in "[ab]{0,10}") {
            proptest::prop_assert_eq!(
                wildcard_match(pattern.as_bytes(), text.as_bytes()),
                reference_match(pattern.as_bytes(), text.as_bytes())
            );
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
        // Backtracking: the first `b` is not the one the pattern's `b` must match.
        let table: &[(&[u8], &[u8], bool)] = &[
            (b"*ab", b"aab", true),
            (b"*ab", b"abab", true),
            (b"*ab", b"abba", false),
            (b"a*b*c", b"abxbxc", true),
            (b"a*b*c", b"abxbx", false),
            (b"*?", b"", false),
            (b"?*", b"x", true),
            (b"**", b"", true),
            (b"", b"", true),
            (b"", b"a", false),
            (b"a", b"", false),
            (b"a**", b"a", true),
        ];
        for (pattern, text, want) in table {
            assert_eq!(wildcard_match(pattern, text), *want, "{pattern:?} {text:?}");
        }
    }
}
