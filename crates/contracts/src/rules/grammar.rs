//! The rule grammar: `TOOL` or `TOOL(PATTERN)`, the tool-name wildcard `mcp__SERVER__*`,
//! and the checks that refuse a rule which would deny nothing.

use serde::{Deserialize, Serialize};

/// The pseudo-tool of deny rules on a path itself: `path(secrets/**)`.
pub const PATH_RULE: &str = "path";

/// Tools whose deny rules deny reading a path, and so also mask it for commands.
pub(super) const READ_DENYING_TOOLS: &[&str] =
    &[PATH_RULE, "read_file", "grep", "glob", "list_dir"];
/// Tools whose deny rules deny writing a path, and so make it read-only for commands.
pub(super) const WRITE_DENYING_TOOLS: &[&str] = &["write_file", "edit_file"];

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
pub(super) fn server_wildcard(name: &str) -> Option<&str> {
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
    pub(super) tool: String,
    pub(super) pattern: Option<String>,
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
}
