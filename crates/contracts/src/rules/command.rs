//! The command line a command rule is decided on: simple commands, as the caller's shell
//! parser splits them, or the conservative lexical fallback.

use serde::{Deserialize, Serialize};

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
