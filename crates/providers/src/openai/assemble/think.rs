//! Splitting an inline `<think>…</think>` block at the start of a message's content
//! from the visible answer ([`ThinkSplitter`]).

/// A piece of content after `<think>` splitting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    Text(String),
    Reasoning(String),
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// Splits reasoning that a model writes inline, as `<think>…</think>` at the very start of
/// its content (DeepSeek-R1 and others served behind plain Chat Completions), from the
/// visible answer. Content that does not start with `<think>` passes through unchanged; an
/// unterminated block is all reasoning.
#[derive(Debug)]
pub(super) enum ThinkSplitter {
    /// Nothing but whitespace, or a prefix of `<think>`, seen so far.
    Start(String),
    /// Inside the block; holds back a possible partial `</think>`.
    Think(String),
    /// After `</think>`: leading whitespace of the answer is dropped.
    AfterThink,
    /// Plain text.
    Text,
}

impl Default for ThinkSplitter {
    fn default() -> Self {
        ThinkSplitter::Start(String::new())
    }
}

impl ThinkSplitter {
    pub(super) fn push(&mut self, content: &str, out: &mut Vec<Piece>) {
        match self {
            ThinkSplitter::Start(buffer) => {
                buffer.push_str(content);
                let trimmed = buffer.trim_start();
                if let Some(rest) = trimmed.strip_prefix(THINK_OPEN) {
                    let rest = rest.to_owned();
                    *self = ThinkSplitter::Think(String::new());
                    self.push(&rest, out);
                } else if trimmed.is_empty() || THINK_OPEN.starts_with(trimmed) {
                    // Not decided yet.
                } else {
                    out.push(Piece::Text(std::mem::take(buffer)));
                    *self = ThinkSplitter::Text;
                }
            }
            ThinkSplitter::Think(pending) => {
                pending.push_str(content);
                if let Some(end) = pending.find(THINK_CLOSE) {
                    let after = pending[end + THINK_CLOSE.len()..].to_owned();
                    pending.truncate(end);
                    out.push(Piece::Reasoning(std::mem::take(pending)));
                    *self = ThinkSplitter::AfterThink;
                    self.push(&after, out);
                } else {
                    // Keep back the longest suffix that may begin `</think>`; it is ASCII,
                    // so the split falls on a character boundary.
                    let keep = (1..THINK_CLOSE.len())
                        .rev()
                        .find(|len| pending.ends_with(&THINK_CLOSE[..*len]))
                        .unwrap_or(0);
                    let held = pending.split_off(pending.len() - keep);
                    out.push(Piece::Reasoning(std::mem::replace(pending, held)));
                }
            }
            ThinkSplitter::AfterThink => {
                let trimmed = content.trim_start();
                if !trimmed.is_empty() {
                    out.push(Piece::Text(trimmed.to_owned()));
                    *self = ThinkSplitter::Text;
                }
            }
            ThinkSplitter::Text => out.push(Piece::Text(content.to_owned())),
        }
    }

    pub(super) fn finish(&mut self, out: &mut Vec<Piece>) {
        match std::mem::replace(self, ThinkSplitter::Text) {
            ThinkSplitter::Start(buffer) => out.push(Piece::Text(buffer)),
            ThinkSplitter::Think(pending) => out.push(Piece::Reasoning(pending)),
            ThinkSplitter::AfterThink | ThinkSplitter::Text => {}
        }
    }
}
