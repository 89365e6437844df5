//! Splitting a `bash` command line into the simple commands it can run, with brush-parser,
//! for the per-simple-command rule decision in keel-contracts
//! ([`keel_contracts::PermissionRules::decide_with`]).
//!
//! Every simple command is collected: those of pipelines, lists (`;` `&&` `||` `&`),
//! subshells, brace groups, compound commands, function bodies, command substitutions
//! (`$(…)` and backticks, in words, assignments, redirection targets and here-documents),
//! process substitutions, the string of `sh -c` / `bash -c` (parsed again), and the command
//! `find -exec` runs. Wrappers that run their arguments as a command — `env X=1 cmd`,
//! `command cmd`, `builtin`, `exec`, `nohup`, `nice`, `timeout`, `time`, `xargs`, `sudo`,
//! `busybox` — are
//! stripped so the rule sees `cmd`; a command given an environment (`X=1 cmd`, `env X=1
//! cmd`) is recorded both with it and without it, so an allow rule must cover the
//! assignments too and a deny rule sees the bare command. Words are taken after quote removal; a word only known
//! at run time keeps its source text (`$HOME`).
//!
//! What cannot be resolved from the text makes the line [`CommandLine::Unresolved`], which
//! rules never allow: a parse error, `eval`, `trap` and `alias` with a command string, a
//! command name built at run time (`$X`, `$(…)`, an unquoted glob or brace), an `env` or `xargs`
//! option this module does not know, too deep nesting or too many commands — and code bash
//! would evaluate later from a value: arithmetic over variables (`$((X))`, `[[ $X -eq 1 ]]`,
//! subscripts, substring offsets, `let`, `declare -i`), `${X@P}`, quoted text holding `$(`
//! or a backtick (outside a `sh -c` string, which is parsed), and builtins that take a
//! variable name given one only known at run time.
//!
//! This file walks brush-parser's syntax tree; `words` takes a word apart (quote removal,
//! what bash would expand), `commands` says what a simple command runs (the wrappers,
//! `sh -c`, `find -exec`, builtins that evaluate text later).

mod commands;
#[cfg(test)]
mod tests;
mod words;

use std::panic::{AssertUnwindSafe, catch_unwind};

use brush_parser::ast::{self, Command, CompoundCommand, CompoundList, IoRedirect};
use brush_parser::word;
use brush_parser::{Parser, ParserOptions};
use keel_contracts::{CommandLine, SimpleCommand};

use commands::risky_name;
use words::Value;

/// How deep `sh -c` strings and substitutions may nest before the line is unresolved.
const MAX_DEPTH: usize = 8;
/// Simple commands collected at most.
const MAX_COMMANDS: usize = 256;
/// The longest command line parsed (bytes); a longer one is unresolved.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// Shells whose `-c STRING` is parsed as a command line of its own.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "rbash"];

/// Splits `text` into the simple commands it can run. Never panics.
pub(crate) fn parse(text: &str) -> CommandLine {
    let mut walker = Walker { options: ParserOptions::default(), found: Vec::new(), problem: None };
    walker.line(text, 0);
    match walker.problem {
        None => CommandLine::Simple(walker.found),
        Some(reason) => CommandLine::Unresolved { reason, found: walker.found },
    }
}

struct Walker {
    options: ParserOptions,
    found: Vec<SimpleCommand>,
    problem: Option<String>,
}

impl Walker {
    fn unresolved(&mut self, reason: impl Into<String>) {
        if self.problem.is_none() {
            self.problem = Some(reason.into());
        }
    }

    fn line(&mut self, text: &str, depth: usize) {
        if depth > MAX_DEPTH {
            return self.unresolved("command substitutions or `sh -c` strings nest too deeply");
        }
        if text.len() > MAX_LINE_BYTES {
            return self.unresolved(format!("the command line is over {MAX_LINE_BYTES} bytes"));
        }
        let options = self.options.clone();
        let parsed = catch_unwind(AssertUnwindSafe(|| {
            Parser::new(std::io::BufReader::new(text.as_bytes()), &options).parse_program()
        }));
        match parsed {
            Ok(Ok(program)) => {
                for list in &program.complete_commands {
                    self.list(list, depth);
                }
            }
            Ok(Err(error)) => self.unresolved(format!("the shell parser failed: {error}")),
            Err(_) => self.unresolved("the shell parser failed on this line"),
        }
    }

    fn list(&mut self, list: &CompoundList, depth: usize) {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first, depth);
            for next in &and_or.additional {
                let (ast::AndOr::And(pipeline) | ast::AndOr::Or(pipeline)) = next;
                self.pipeline(pipeline, depth);
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline, depth: usize) {
        for command in &pipeline.seq {
            self.command(command, depth);
        }
    }

    fn command(&mut self, command: &Command, depth: usize) {
        match command {
            Command::Simple(simple) => self.simple(simple, depth),
            Command::Compound(compound, redirects) => {
                self.compound(compound, depth);
                self.redirects(redirects.as_ref(), depth);
            }
            Command::Function(definition) => {
                let ast::FunctionBody(body, redirects) = &definition.body;
                self.compound(body, depth);
                self.redirects(redirects.as_ref(), depth);
            }
            Command::ExtendedTest(test, redirects) => {
                self.test(&test.expr, depth);
                self.redirects(redirects.as_ref(), depth);
            }
        }
    }

    fn compound(&mut self, compound: &CompoundCommand, depth: usize) {
        match compound {
            CompoundCommand::Arithmetic(arithmetic) => self.arithmetic(&arithmetic.expr.value),
            CompoundCommand::ArithmeticForClause(clause) => {
                for expr in
                    [&clause.initializer, &clause.condition, &clause.updater].into_iter().flatten()
                {
                    self.arithmetic(&expr.value);
                }
                self.list(&clause.body.list, depth);
            }
            CompoundCommand::BraceGroup(group) => self.list(&group.list, depth),
            CompoundCommand::Subshell(subshell) => self.list(&subshell.list, depth),
            CompoundCommand::ForClause(clause) => {
                for value in clause.values.iter().flatten() {
                    self.word(&value.value, depth);
                }
                self.list(&clause.body.list, depth);
            }
            CompoundCommand::CaseClause(clause) => {
                self.word(&clause.value.value, depth);
                for item in &clause.cases {
                    for pattern in &item.patterns {
                        self.word(&pattern.value, depth);
                    }
                    if let Some(list) = &item.cmd {
                        self.list(list, depth);
                    }
                }
            }
            CompoundCommand::IfClause(clause) => {
                self.list(&clause.condition, depth);
                self.list(&clause.then, depth);
                for other in clause.elses.iter().flatten() {
                    if let Some(condition) = &other.condition {
                        self.list(condition, depth);
                    }
                    self.list(&other.body, depth);
                }
            }
            CompoundCommand::WhileClause(clause) | CompoundCommand::UntilClause(clause) => {
                self.list(&clause.0, depth);
                self.list(&clause.1.list, depth);
            }
            CompoundCommand::Coprocess(coprocess) => self.command(&coprocess.body, depth),
        }
    }

    fn test(&mut self, expr: &ast::ExtendedTestExpr, depth: usize) {
        match expr {
            ast::ExtendedTestExpr::And(left, right) | ast::ExtendedTestExpr::Or(left, right) => {
                self.test(left, depth);
                self.test(right, depth);
            }
            ast::ExtendedTestExpr::Not(inner) | ast::ExtendedTestExpr::Parenthesized(inner) => {
                self.test(inner, depth);
            }
            ast::ExtendedTestExpr::UnaryTest(predicate, word) => {
                let value = self.word(&word.value, depth);
                let names_variable = matches!(
                    predicate,
                    ast::UnaryPredicate::ShellVariableIsSetAndAssigned
                        | ast::UnaryPredicate::ShellVariableIsSetAndNameRef
                );
                if names_variable && (value.code || risky_name(&value)) {
                    self.unresolved("`[[ -v ]]` over a name only known at run time");
                }
            }
            ast::ExtendedTestExpr::BinaryTest(predicate, left, right) => {
                let left = self.word(&left.value, depth);
                let right = self.word(&right.value, depth);
                let arithmetic = matches!(
                    predicate,
                    ast::BinaryPredicate::ArithmeticEqualTo
                        | ast::BinaryPredicate::ArithmeticNotEqualTo
                        | ast::BinaryPredicate::ArithmeticLessThan
                        | ast::BinaryPredicate::ArithmeticLessThanOrEqualTo
                        | ast::BinaryPredicate::ArithmeticGreaterThan
                        | ast::BinaryPredicate::ArithmeticGreaterThanOrEqualTo
                );
                if arithmetic {
                    self.arithmetic(&left.text);
                    self.arithmetic(&right.text);
                }
            }
        }
    }

    /// Arithmetic runs what a variable's value spells (`a[$(…)]`), so only literal
    /// numbers and operators are resolved.
    fn arithmetic(&mut self, expr: &str) {
        if expr.contains(|c: char| c.is_ascii_alphabetic() || matches!(c, '$' | '`' | '_')) {
            self.unresolved("arithmetic over variables, which can run what their values hold");
        }
    }

    /// A parameter expansion that runs code or arithmetic: a substitution inside it,
    /// a transformation (`${X@P}`), a subscript or a substring offset with a variable.
    fn parameter(&mut self, source: &str) {
        if source.contains("$(") || source.contains('`') || source.contains("<(") {
            return self.unresolved("a command substitution inside a parameter expansion");
        }
        let Some(inner) = source.strip_prefix("${").and_then(|rest| rest.strip_suffix('}')) else {
            return;
        };
        let inner = inner.trim_start_matches(['!', '#']);
        let name_end =
            inner.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(inner.len());
        let rest = &inner[name_end..];
        let variable = |text: &str| text.contains(|c: char| c.is_ascii_alphabetic() || c == '$');
        let risky = if let Some(subscript) = rest.strip_prefix('[') {
            let index = subscript.split(']').next().unwrap_or_default();
            !matches!(index, "@" | "*") && variable(index)
        } else if let Some(after) = rest.strip_prefix(':') {
            !after.starts_with(['-', '=', '+', '?']) && variable(after)
        } else if let Some(after) = rest.strip_prefix('@') {
            after.starts_with(|c: char| c.is_ascii_alphabetic())
        } else {
            false
        };
        if risky {
            self.unresolved(format!(
                "the parameter expansion `{source}` can run code (a transformation, a \
                 subscript or an offset)"
            ));
        }
    }

    fn redirects(&mut self, redirects: Option<&ast::RedirectList>, depth: usize) {
        for redirect in redirects.iter().flat_map(|list| &list.0) {
            self.redirect(redirect, depth);
        }
    }

    /// A redirection is not a word of its command; its target may still run commands.
    fn redirect(&mut self, redirect: &IoRedirect, depth: usize) {
        match redirect {
            IoRedirect::File(_, _, target) => match target {
                ast::IoFileRedirectTarget::Filename(word)
                | ast::IoFileRedirectTarget::Duplicate(word) => {
                    self.word(&word.value, depth);
                }
                ast::IoFileRedirectTarget::ProcessSubstitution(_, subshell) => {
                    self.list(&subshell.list, depth);
                }
                ast::IoFileRedirectTarget::Fd(_) => {}
            },
            IoRedirect::HereDocument(_, here) => {
                if here.requires_expansion {
                    let options = self.options.clone();
                    let body = here.doc.value.clone();
                    match catch_unwind(|| word::parse_heredoc(&body, &options)) {
                        Ok(Ok(pieces)) => {
                            self.pieces(&here.doc.value, &pieces, depth, false);
                        }
                        _ => self.unresolved("a here-document the parser cannot expand"),
                    }
                }
            }
            IoRedirect::HereString(_, word) | IoRedirect::OutputAndError(word, _) => {
                self.word(&word.value, depth);
            }
        }
    }

    fn simple(&mut self, simple: &ast::SimpleCommand, depth: usize) {
        let mut words: Vec<Value> = Vec::new();
        // Assignments before the name: the command's environment (`PATH=. git status`).
        let mut environment: Vec<Value> = Vec::new();
        let items = simple
            .prefix
            .iter()
            .flat_map(|prefix| &prefix.0)
            .map(Item::Prefix)
            .chain(simple.word_or_name.iter().map(Item::Name))
            .chain(simple.suffix.iter().flat_map(|suffix| &suffix.0).map(Item::Suffix));
        for item in items {
            match item {
                Item::Name(word) => words.push(self.word(&word.value, depth)),
                Item::Prefix(entry) | Item::Suffix(entry) => match entry {
                    ast::CommandPrefixOrSuffixItem::IoRedirect(redirect) => {
                        self.redirect(redirect, depth);
                    }
                    ast::CommandPrefixOrSuffixItem::Word(word) => {
                        words.push(self.word(&word.value, depth));
                    }
                    ast::CommandPrefixOrSuffixItem::AssignmentWord(assignment, word) => {
                        // Before the name it only sets the environment; after it, it is an
                        // argument (`env X=1`, `make CC=cc`).
                        if matches!(item, Item::Suffix(_)) {
                            words.push(self.word(&word.value, depth));
                        } else {
                            self.assignment(assignment, depth);
                            environment.push(Value {
                                text: word.value.clone(),
                                fixed: true,
                                glob: false,
                                code: false,
                            });
                        }
                    }
                    ast::CommandPrefixOrSuffixItem::ProcessSubstitution(_, subshell) => {
                        self.list(&subshell.list, depth);
                        words.push(Value {
                            text: "<(…)".into(),
                            fixed: false,
                            glob: false,
                            code: false,
                        });
                    }
                },
            }
        }
        if !environment.is_empty() && !words.is_empty() {
            // The environment changes what runs (`PATH`, `GIT_CONFIG_*`), so a rule must
            // also cover the command with it; deny rules see the bare command too.
            let full: Vec<Value> = environment.iter().chain(&words).map(Value::copy).collect();
            self.record(&full);
        }
        self.run(words, depth);
    }

    fn assignment(&mut self, assignment: &ast::Assignment, depth: usize) {
        if let ast::AssignmentName::ArrayElementName(_, index) = &assignment.name {
            self.arithmetic(index);
        }
        let mut values = Vec::new();
        match &assignment.value {
            ast::AssignmentValue::Scalar(word) => values.push(self.word(&word.value, depth)),
            ast::AssignmentValue::Array(elements) => {
                for (key, value) in elements {
                    if let Some(key) = key {
                        self.arithmetic(&key.value);
                    }
                    values.push(self.word(&value.value, depth));
                }
            }
        }
        if values.iter().any(|value| value.code) {
            self.unresolved("an assignment of text that holds a command substitution");
        }
    }
}

enum Item<'a> {
    Prefix(&'a ast::CommandPrefixOrSuffixItem),
    Name(&'a ast::Word),
    Suffix(&'a ast::CommandPrefixOrSuffixItem),
}
