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

mod command;
mod decide;
mod denied;
mod grammar;
mod pattern;
#[cfg(test)]
mod tests;

pub use command::{CommandLine, SimpleCommand};
pub use decide::{CallFacts, PermissionRules};
pub use denied::DeniedPaths;
pub use grammar::{
    PATH_RULE, Rule, RuleError, TOOL_WILDCARD_REFUSAL, check_tool_name_pattern, tool_name_covers,
};
