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

use std::panic::{AssertUnwindSafe, catch_unwind};

use brush_parser::ast::{self, Command, CompoundCommand, CompoundList, IoRedirect};
use brush_parser::word::{self, WordPiece, WordPieceWithSource};
use brush_parser::{Parser, ParserOptions};
use keel_contracts::{CommandLine, SimpleCommand};

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

/// A word after quote removal: its text, and whether that text is what the shell will
/// pass (no expansion left).
struct Value {
    text: String,
    fixed: bool,
    /// An unquoted glob character (`*`, `?`, `[`) is in it.
    glob: bool,
    /// Its literal text holds `$(` or a backtick: code bash could run later (an
    /// arithmetic subscript, `trap`, `printf -v`), not a substitution now.
    code: bool,
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

    /// Records the command `words` run, seen through wrappers, shells and `find -exec`.
    fn run(&mut self, mut words: Vec<Value>, depth: usize) {
        loop {
            let Some(name) = words.first() else { return };
            if !name.fixed || name.glob {
                self.record(&words);
                return self.unresolved(format!(
                    "the command name `{}` is only known at run time",
                    name.text
                ));
            }
            let base = basename(&name.text).to_owned();
            let skip = match base.as_str() {
                "eval" => {
                    self.record(&words);
                    return self.unresolved("`eval` runs a string built at run time");
                }
                "trap" | "alias" if words.len() > 1 => {
                    self.record(&words);
                    return self
                        .unresolved(format!("`{base}` stores a command string to run later"));
                }
                "env" => env_operands(&words),
                "command" => match words.get(1).map(|word| word.text.as_str()) {
                    Some("-v" | "-V") => Some(0),
                    Some("-p") => Some(2),
                    _ => Some(1),
                },
                "builtin" | "nohup" | "setsid" | "busybox" => Some(1),
                "sudo" | "doas" => match words.get(1) {
                    Some(word) if word.text.starts_with('-') => None,
                    _ => Some(1),
                },
                "exec" => exec_operands(&words),
                "time" => {
                    Some(if words.get(1).is_some_and(|word| word.text == "-p") { 2 } else { 1 })
                }
                "nice" => nice_operands(&words),
                "timeout" => timeout_operands(&words),
                "xargs" => xargs_operands(&words),
                _ => Some(0),
            };
            match skip {
                None => {
                    self.record(&words);
                    return self.unresolved(format!(
                        "`{base}` with options keel does not know how to read"
                    ));
                }
                Some(0) => break,
                Some(n) if n >= words.len() => {
                    // A wrapper with nothing to wrap runs itself (`xargs` alone: `echo`).
                    if base == "xargs" {
                        words = vec![Value {
                            text: "echo".into(),
                            fixed: true,
                            glob: false,
                            code: false,
                        }];
                    }
                    break;
                }
                Some(n) => {
                    if base == "env" && n > 1 {
                        // `env X=1 cmd`: like a prefix assignment, the rule must cover it.
                        self.record(&words);
                    }
                    words.drain(..n);
                }
            }
        }
        let Some(name) = words.first() else { return };
        let base = basename(&name.text).to_owned();
        if SHELLS.contains(&base.as_str()) && self.shell(&words, depth) {
            return;
        }
        self.record(&words);
        if name.text.contains('/') {
            // `/bin/rm` is also `rm` for deny rules (and must be allowed as both).
            let mut alias: Vec<Value> = Vec::with_capacity(words.len());
            alias.push(Value { text: base.clone(), fixed: true, glob: false, code: false });
            alias.extend(words.iter().skip(1).map(Value::copy));
            self.record(&alias);
        }
        if base == "find" {
            self.find_exec(&words, depth);
        }
    }

    /// `sh -c STRING …`: parses STRING. Returns false when the shell runs no `-c` string
    /// (a script or stdin), so the shell command itself is recorded.
    fn shell(&mut self, words: &[Value], depth: usize) -> bool {
        let mut command_flag = false;
        let mut index = 1;
        while let Some(word) = words.get(index) {
            let text = word.text.as_str();
            if !word.fixed {
                self.record(words);
                self.unresolved("a shell option or script only known at run time");
                return true;
            }
            if text == "--" {
                index += 1;
                break;
            }
            if matches!(text, "-o" | "+o" | "-O" | "+O" | "--rcfile" | "--init-file") {
                index += 2;
                continue;
            }
            if (text.starts_with('-') || text.starts_with('+')) && text.len() > 1 {
                if !text.starts_with("--") && text[1..].contains('c') {
                    command_flag = true;
                }
                index += 1;
                continue;
            }
            break;
        }
        if !command_flag {
            return false;
        }
        match words.get(index) {
            Some(script) if script.fixed => {
                let script = script.text.clone();
                self.line(&script, depth + 1);
            }
            Some(_) => {
                self.record(words);
                self.unresolved("a `sh -c` string only known at run time");
            }
            None => self.record(words),
        }
        true
    }

    /// The commands `find … -exec CMD … ;` runs.
    fn find_exec(&mut self, words: &[Value], depth: usize) {
        let mut index = 1;
        while index < words.len() {
            if matches!(words[index].text.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
                let start = index + 1;
                let mut end = start;
                while end < words.len() && !matches!(words[end].text.as_str(), ";" | "+") {
                    end += 1;
                }
                let inner: Vec<Value> = words[start..end].iter().map(Value::copy).collect();
                self.run(inner, depth);
                index = end;
            }
            index += 1;
        }
    }

    fn record(&mut self, words: &[Value]) {
        if words.is_empty() {
            return;
        }
        if words.iter().any(|word| word.code) {
            self.unresolved(
                "a quoted string holds a command substitution, which bash could run later",
            );
        }
        let name = basename(&words[0].text);
        let arguments = &words[1..];
        let after = |flag: &str| {
            arguments.iter().position(|word| word.text == flag).and_then(|at| arguments.get(at + 1))
        };
        let risky = match name {
            "let" => true,
            "declare" | "typeset" | "local" | "export" | "readonly" => {
                arguments.iter().any(|word| {
                    word.text.starts_with('-') && word.text.contains('i') || risky_name(word)
                })
            }
            "read" | "mapfile" | "readarray" | "unset" | "getopts" | "wait" => {
                arguments.iter().any(|word| !word.text.starts_with('-') && risky_name(word))
            }
            "printf" => after("-v").is_some_and(risky_name),
            "test" | "[" => after("-v").is_some_and(risky_name),
            _ => false,
        };
        if risky {
            self.unresolved(format!(
                "`{name}` evaluates a variable name, subscript or integer only known at run time"
            ));
        }
        if self.found.len() >= MAX_COMMANDS {
            return self.unresolved(format!("more than {MAX_COMMANDS} commands"));
        }
        self.found
            .push(SimpleCommand { words: words.iter().map(|word| word.text.clone()).collect() });
    }

    /// Quote removal and the commands a word's substitutions run.
    fn word(&mut self, raw: &str, depth: usize) -> Value {
        let options = self.options.clone();
        let owned = raw.to_owned();
        match catch_unwind(|| word::parse(&owned, &options)) {
            Ok(Ok(pieces)) => self.pieces(raw, &pieces, depth, true),
            _ => {
                self.unresolved(format!("the word `{raw}` could not be parsed"));
                Value { text: raw.to_owned(), fixed: false, glob: false, code: false }
            }
        }
    }

    fn pieces(
        &mut self,
        raw: &str,
        pieces: &[WordPieceWithSource],
        depth: usize,
        unquoted: bool,
    ) -> Value {
        let mut value = Value { text: String::new(), fixed: true, glob: false, code: false };
        // The literal text only, with a NUL where something is expanded.
        let mut literal = String::new();
        for piece in pieces {
            let source = raw.get(piece.start_index..piece.end_index).unwrap_or(raw);
            match &piece.piece {
                WordPiece::Text(text) => {
                    // Globs and brace expansion (`{rm,-rf,x}`) change the words at run time.
                    if unquoted && text.contains(['*', '?', '[', '{']) {
                        value.glob = true;
                    }
                    value.text.push_str(text);
                    literal.push_str(text);
                }
                WordPiece::SingleQuotedText(text) => {
                    value.text.push_str(text);
                    literal.push_str(text);
                }
                WordPiece::AnsiCQuotedText(text) => {
                    if text.contains('\\') {
                        value.fixed = false;
                        value.text.push_str(source);
                        literal.push('\0');
                    } else {
                        value.text.push_str(text);
                        literal.push_str(text);
                    }
                }
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    let inner = self.pieces(raw, inner, depth, false);
                    value.fixed &= inner.fixed;
                    value.code |= inner.code;
                    value.text.push_str(&inner.text);
                    literal.push('\0');
                }
                WordPiece::TildeExpansion(_) => {
                    value.text.push_str(source);
                    literal.push('\0');
                }
                WordPiece::ParameterExpansion(_) => {
                    self.parameter(source);
                    value.fixed = false;
                    value.text.push_str(source);
                    literal.push('\0');
                }
                WordPiece::CommandSubstitution(inner)
                | WordPiece::BackquotedCommandSubstitution(inner) => {
                    self.line(inner, depth + 1);
                    value.fixed = false;
                    value.text.push_str(source);
                    literal.push('\0');
                }
                WordPiece::EscapeSequence(escaped) => {
                    let escaped = escaped.strip_prefix('\\').unwrap_or(escaped);
                    value.text.push_str(escaped);
                    literal.push_str(escaped);
                }
                WordPiece::ArithmeticExpression(expr) => {
                    self.arithmetic(&expr.value);
                    value.fixed = false;
                    value.text.push_str(source);
                    literal.push('\0');
                }
            }
        }
        value.code |= literal.contains("$(") || literal.contains('`');
        value
    }
}

impl Value {
    fn copy(&self) -> Value {
        Value { text: self.text.clone(), fixed: self.fixed, glob: self.glob, code: self.code }
    }
}

enum Item<'a> {
    Prefix(&'a ast::CommandPrefixOrSuffixItem),
    Name(&'a ast::Word),
    Suffix(&'a ast::CommandPrefixOrSuffixItem),
}

/// Whether a word naming a variable (`NAME`, `NAME=value`, `NAME[index]`) is only known at
/// run time or has a subscript bash evaluates as arithmetic over variables.
fn risky_name(word: &Value) -> bool {
    let name = word.text.split('=').next().unwrap_or_default();
    name.contains(['$', '`'])
        || name.split_once('[').is_some_and(|(_, index)| {
            index.contains(|c: char| c.is_ascii_alphabetic() || matches!(c, '$' | '`' | '_'))
        })
}

fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// How many words `env` and its options and assignments take, or `None` for an option
/// that changes what runs in a way not read here (`-S`, `-C`, ...).
fn env_operands(words: &[Value]) -> Option<usize> {
    let mut index = 1;
    while let Some(word) = words.get(index) {
        let text = word.text.as_str();
        if !word.fixed {
            return None;
        }
        match text {
            "-i" | "--ignore-environment" | "-0" | "--null" | "-" => index += 1,
            "-u" | "--unset" => index += 2,
            "--" => return Some(index + 1),
            _ if text.starts_with("--unset=") => index += 1,
            _ if text.starts_with('-') => return None,
            _ if text.contains('=') => index += 1,
            _ => return Some(index),
        }
    }
    Some(index)
}

fn exec_operands(words: &[Value]) -> Option<usize> {
    let mut index = 1;
    while let Some(word) = words.get(index) {
        match word.text.as_str() {
            "-c" | "-l" | "-cl" | "-lc" => index += 1,
            "-a" => index += 2,
            "--" => return Some(index + 1),
            text if text.starts_with('-') => return None,
            _ => return Some(index),
        }
    }
    Some(index)
}

fn nice_operands(words: &[Value]) -> Option<usize> {
    match words.get(1).map(|word| word.text.as_str()) {
        Some("-n") => Some(3),
        Some(text) if text.starts_with("-n") || text.starts_with("--adjustment=") => Some(2),
        Some(text) if text.starts_with('-') && text[1..].chars().all(|c| c.is_ascii_digit()) => {
            Some(2)
        }
        Some(text) if text.starts_with('-') => None,
        _ => Some(1),
    }
}

fn timeout_operands(words: &[Value]) -> Option<usize> {
    let mut index = 1;
    while let Some(word) = words.get(index) {
        match word.text.as_str() {
            "-s" | "--signal" | "-k" | "--kill-after" => index += 2,
            "--preserve-status" | "--foreground" | "-v" | "--verbose" => index += 1,
            text if text.starts_with("--signal=") || text.starts_with("--kill-after=") => {
                index += 1;
            }
            text if text.starts_with('-') => return None,
            // The duration, then the command.
            _ => return Some(index + 1),
        }
    }
    Some(index)
}

fn xargs_operands(words: &[Value]) -> Option<usize> {
    let mut index = 1;
    while let Some(word) = words.get(index) {
        match word.text.as_str() {
            "-0" | "--null" | "-r" | "--no-run-if-empty" | "-t" | "--verbose" | "-x" => index += 1,
            "-I" | "-n" | "-P" | "-d" | "-L" | "-s" | "-E" => index += 2,
            "--" => return Some(index + 1),
            text if text.starts_with('-') => return None,
            _ => return Some(index),
        }
    }
    Some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &CommandLine) -> Vec<String> {
        line.commands().iter().map(SimpleCommand::text).collect()
    }

    #[track_caller]
    fn simple(text: &str) -> Vec<String> {
        match parse(text) {
            CommandLine::Simple(commands) => commands.iter().map(SimpleCommand::text).collect(),
            other @ CommandLine::Unresolved { .. } => panic!("{text}: {other:?}"),
        }
    }

    #[track_caller]
    fn unresolved(text: &str) -> Vec<String> {
        match parse(text) {
            line @ CommandLine::Unresolved { .. } => texts(&line),
            other @ CommandLine::Simple(_) => panic!("{text} should be unresolved: {other:?}"),
        }
    }

    #[test]
    fn simple_commands_are_found_everywhere() {
        let cases: &[(&str, &[&str])] = &[
            ("git status", &["git status"]),
            ("git status --short", &["git status --short"]),
            ("'git' \"status\"", &["git status"]),
            ("g\\it status", &["git status"]),
            ("git status; rm -rf x", &["git status", "rm -rf x"]),
            ("git status && curl http://x", &["git status", "curl http://x"]),
            ("git status || rm x", &["git status", "rm x"]),
            ("git status | tee out", &["git status", "tee out"]),
            ("git status & rm x", &["git status", "rm x"]),
            ("git status $(curl x)", &["curl x", "git status $(curl x)"]),
            ("git status `rm x`", &["rm x", "git status `rm x`"]),
            ("(git status; rm x)", &["git status", "rm x"]),
            ("{ git status; rm x; }", &["git status", "rm x"]),
            ("git status > .git/config", &["git status"]),
            ("git status > \"$(rm x)\"", &["rm x", "git status"]),
            ("diff <(rm x) y", &["rm x", "diff <(…) y"]),
            ("bash -c \"git status; rm x\"", &["git status", "rm x"]),
            ("sh -ec 'git status && rm x'", &["git status", "rm x"]),
            ("env X=1 git status", &["env X=1 git status", "git status"]),
            ("X=1 git status", &["X=1 git status", "git status"]),
            ("env git status", &["git status"]),
            ("command git status", &["git status"]),
            ("timeout 5 nice -n 2 command git status", &["git status"]),
            (
                "env -i PATH=/bin timeout 5 git status",
                &["env -i PATH=/bin timeout 5 git status", "git status"],
            ),
            ("find . -name x -exec rm {} \\;", &["find . -name x -exec rm {} ;", "rm {}"]),
            ("/bin/rm -rf x", &["/bin/rm -rf x", "rm -rf x"]),
            ("for f in $(ls); do rm $f; done", &["ls", "rm $f"]),
            ("if git status; then rm x; fi", &["git status", "rm x"]),
            ("f() { rm x; }; f", &["rm x", "f"]),
            ("cat <<EOF\n$(rm x)\nEOF", &["rm x", "cat"]),
            ("X=$(rm x)", &["rm x"]),
            ("xargs rm < list", &["rm"]),
            ("bash script.sh", &["bash script.sh"]),
            ("bash --rcfile x -O extglob -c 'rm y'", &["rm y"]),
            ("sudo rm -rf x; busybox rm y", &["rm -rf x", "rm y"]),
            ("git status {a,b}", &["git status {a,b}"]),
            (
                "git status ${X:-default} ${a[@]} $((1 + 2))",
                &["git status ${X:-default} ${a[@]} $((1 + 2))"],
            ),
            ("[[ -f x ]] && git status", &["git status"]),
            ("bash -c 'echo $(date)'", &["date", "echo $(date)"]),
            ("export LC_ALL=C; git status", &["export LC_ALL=C", "git status"]),
            (
                "export PATH=\"$PATH:/x\"; printf '%s\\n' \"$HOME\"",
                &["export PATH=$PATH:/x", "printf %s\\n $HOME"],
            ),
            ("read -r line < f; test -f \"$F\"", &["read -r line", "test -f $F"]),
        ];
        for (line, want) in cases {
            assert_eq!(simple(line), *want, "{line}");
        }
    }

    #[test]
    fn what_cannot_be_resolved_is_unresolved() {
        assert_eq!(unresolved("eval git status"), ["eval git status"]);
        assert_eq!(unresolved("$X status"), ["$X status"]);
        assert_eq!(unresolved("$(echo rm) -rf x"), ["echo rm", "$(echo rm) -rf x"]);
        unresolved("git status; eval \"$Y\"");
        unresolved("git status (");
        unresolved("git 'status");
        unresolved("bash -c \"$CMD\"");
        unresolved("env -S 'rm x' true");
        unresolved("trap 'rm x' EXIT");
        unresolved("r? -rf x");
        unresolved("{rm,-rf,x}");
        unresolved("echo $(( $(rm x) + 1 ))");
        unresolved("$'\\x72m' -rf x");
        // Code hidden in values that bash evaluates later.
        for line in [
            "X='a[$(touch p)]'; git status $((X))",
            "git status \"$(( X + 1 ))\"",
            "X=$(cat f); [[ $X -eq 1 ]] && git status",
            "git status ${X@P}",
            "git status ${a[X]}",
            "git status ${s:X}",
            "git status ${Z:-$(touch p)}",
            "a[X]=1 git status",
            "let X; git status",
            "declare -i N; git status",
            "printf -v \"$X\" %s v; git status",
            "read \"a[$X]\" < f; git status",
            "[[ -v $X ]] && git status",
            "declare \"a[$X]=1\"; git status",
            "echo 'run $(touch p) later' > f",
        ] {
            unresolved(line);
        }
        unresolved("cat <<EOF\n$(rm x)");
        let deep = format!("{}git status{}", "$(".repeat(12), ")".repeat(12));
        unresolved(&deep);
        unresolved(&"x".repeat(MAX_LINE_BYTES + 1));
    }

    #[test]
    fn hostile_input_never_panics() {
        for line in [
            "", "((", "$((", "<<", "<<EOF", "`", "$(", "'\"", "\0", "case", "a\\", "{", "}", "]]",
            "[[ -f",
        ] {
            let _ = parse(line);
        }
    }
}
