//! A word of the line after quote removal ([`Value`]): its text, whether the shell passes
//! it as it is, and what in it bash would expand or run later; substitutions inside it are
//! walked as command lines of their own.

use std::panic::catch_unwind;

use brush_parser::word::{self, WordPiece, WordPieceWithSource};

use super::Walker;

/// A word after quote removal: its text, and whether that text is what the shell will
/// pass (no expansion left).
pub(super) struct Value {
    pub(super) text: String,
    pub(super) fixed: bool,
    /// An unquoted glob character (`*`, `?`, `[`) is in it.
    pub(super) glob: bool,
    /// Its literal text holds `$(` or a backtick: code bash could run later (an
    /// arithmetic subscript, `trap`, `printf -v`), not a substitution now.
    pub(super) code: bool,
}

impl Value {
    pub(super) fn copy(&self) -> Value {
        Value { text: self.text.clone(), fixed: self.fixed, glob: self.glob, code: self.code }
    }
}

impl Walker {
    /// Quote removal and the commands a word's substitutions run.
    pub(super) fn word(&mut self, raw: &str, depth: usize) -> Value {
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

    pub(super) fn pieces(
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
