//! What a simple command runs: wrappers that run their arguments as a command (`env`,
//! `command`, `exec`, `nice`, `timeout`, `xargs`, `sudo`, ...) are stripped, `sh -c`
//! strings are parsed again, `find -exec` commands are collected, and builtins that would
//! evaluate text later make the line unresolved.

use keel_contracts::SimpleCommand;

use super::words::Value;
use super::{MAX_COMMANDS, SHELLS, Walker};

impl Walker {
    /// Records the command `words` run, seen through wrappers, shells and `find -exec`.
    pub(super) fn run(&mut self, mut words: Vec<Value>, depth: usize) {
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
    pub(super) fn shell(&mut self, words: &[Value], depth: usize) -> bool {
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
    pub(super) fn find_exec(&mut self, words: &[Value], depth: usize) {
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

    pub(super) fn record(&mut self, words: &[Value]) {
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
}

/// Whether a word naming a variable (`NAME`, `NAME=value`, `NAME[index]`) is only known at
/// run time or has a subscript bash evaluates as arithmetic over variables.
pub(super) fn risky_name(word: &Value) -> bool {
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
