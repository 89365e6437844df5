//! Invisible and look-alike characters made visible, and line endings told apart: what
//! `read_file` notes about a file and what `edit_file` shows when `old` is not found.
//!
//! A look-alike is a character a model is likely to type as its ASCII neighbour (U+00A0
//! NO-BREAK SPACE for a space, U+2019 for `'`, U+2014 for `-`) or one that cannot be seen
//! at all (U+200B, a BOM). Each is named with its code point, line and column, so a failed
//! match can be fixed without guessing.

use std::fmt::Write as _;

/// Characters named when a text contains them: (character, Unicode name, ASCII stand-in).
const LOOKALIKES: &[(char, &str, &str)] = &[
    ('\u{00a0}', "NO-BREAK SPACE", " "),
    ('\u{00ad}', "SOFT HYPHEN", ""),
    ('\u{2002}', "EN SPACE", " "),
    ('\u{2003}', "EM SPACE", " "),
    ('\u{2009}', "THIN SPACE", " "),
    ('\u{200b}', "ZERO WIDTH SPACE", ""),
    ('\u{200c}', "ZERO WIDTH NON-JOINER", ""),
    ('\u{200d}', "ZERO WIDTH JOINER", ""),
    ('\u{2010}', "HYPHEN", "-"),
    ('\u{2011}', "NON-BREAKING HYPHEN", "-"),
    ('\u{2012}', "FIGURE DASH", "-"),
    ('\u{2013}', "EN DASH", "-"),
    ('\u{2014}', "EM DASH", "-"),
    ('\u{2018}', "LEFT SINGLE QUOTATION MARK", "'"),
    ('\u{2019}', "RIGHT SINGLE QUOTATION MARK", "'"),
    ('\u{201c}', "LEFT DOUBLE QUOTATION MARK", "\""),
    ('\u{201d}', "RIGHT DOUBLE QUOTATION MARK", "\""),
    ('\u{2026}', "HORIZONTAL ELLIPSIS", "..."),
    ('\u{202f}', "NARROW NO-BREAK SPACE", " "),
    ('\u{2060}', "WORD JOINER", ""),
    ('\u{2212}', "MINUS SIGN", "-"),
    ('\u{3000}', "IDEOGRAPHIC SPACE", " "),
    ('\u{feff}', "ZERO WIDTH NO-BREAK SPACE (BOM)", ""),
];

/// Lines compared when looking for the closest line; the rest of a huge file is skipped.
const MAX_LINES_COMPARED: usize = 20_000;
/// Characters of one line compared.
const MAX_CHARS_COMPARED: usize = 400;
/// Look-alikes listed at most in one note.
const MAX_LOOKALIKES_LISTED: usize = 8;

/// The Unicode name of a look-alike character, when `character` is one.
pub(crate) fn lookalike_name(character: char) -> Option<&'static str> {
    LOOKALIKES.iter().find(|(candidate, _, _)| *candidate == character).map(|(_, name, _)| *name)
}

/// One look-alike character found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lookalike {
    /// The character.
    pub(crate) character: char,
    /// 1-based line number.
    pub(crate) line: u64,
    /// 1-based column, in characters.
    pub(crate) column: u64,
}

impl Lookalike {
    /// `U+00A0 NO-BREAK SPACE at line 3 column 5`.
    pub(crate) fn describe(&self) -> String {
        let name = lookalike_name(self.character).unwrap_or("");
        format!(
            "U+{:04X} {name} at line {} column {}",
            u32::from(self.character),
            self.line,
            self.column
        )
    }
}

/// The look-alikes in one line (`line_number` is 1-based), in order.
pub(crate) fn lookalikes_in_line(line: &str, line_number: u64) -> Vec<Lookalike> {
    line.chars()
        .enumerate()
        .filter(|(_, character)| lookalike_name(*character).is_some())
        .map(|(index, character)| Lookalike {
            character,
            line: line_number,
            column: index as u64 + 1,
        })
        .collect()
}

/// A line with its invisible bytes spelled out: `\t`, `\r`, other controls as `\xNN`,
/// look-alikes as `\u{00A0}`.
pub(crate) fn make_visible(line: &str) -> String {
    let mut shown = String::with_capacity(line.len());
    for character in line.chars() {
        match character {
            '\t' => shown.push_str("\\t"),
            '\r' => shown.push_str("\\r"),
            '\u{0}'..='\u{1f}' | '\u{7f}' => {
                let _ = write!(shown, "\\x{:02x}", u32::from(character));
            }
            _ if lookalike_name(character).is_some() => {
                let _ = write!(shown, "\\u{{{:04X}}}", u32::from(character));
            }
            _ => shown.push(character),
        }
    }
    shown
}

/// How a text ends its lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LineEndings {
    /// `\r\n` endings.
    pub(crate) crlf: u64,
    /// `\n` endings without a `\r` before them.
    pub(crate) lf: u64,
}

impl LineEndings {
    /// Counts the endings in `text`.
    pub(crate) fn of(text: &[u8]) -> LineEndings {
        let mut endings = LineEndings::default();
        for (index, byte) in text.iter().enumerate() {
            if *byte == b'\n' {
                if index > 0 && text[index - 1] == b'\r' {
                    endings.crlf += 1;
                } else {
                    endings.lf += 1;
                }
            }
        }
        endings
    }

    /// Adds the ending of one line (the line including its terminator, if any).
    pub(crate) fn count_line(&mut self, line: &[u8]) {
        if line.ends_with(b"\r\n") {
            self.crlf += 1;
        } else if line.ends_with(b"\n") {
            self.lf += 1;
        }
    }

    /// A sentence about CRLF endings, when there are any.
    pub(crate) fn describe(self) -> Option<String> {
        match (self.crlf, self.lf) {
            (0, _) => None,
            (_, 0) => Some("it uses CRLF line endings (shown without \\r)".to_owned()),
            (crlf, lf) => Some(format!(
                "it has mixed line endings: {crlf} CRLF and {lf} LF (shown without \\r)"
            )),
        }
    }
}

/// The one-line note `read_file` adds about line endings and look-alikes, if any.
pub(crate) fn file_note(
    endings: LineEndings,
    lookalikes: &[Lookalike],
    n_more: u64,
) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(endings) = endings.describe() {
        parts.push(format!(
            "{endings}; edit_file keeps each line's ending, so write `old` and `new` with plain \\n"
        ));
    }
    if !lookalikes.is_empty() {
        let listed: Vec<String> =
            lookalikes.iter().take(MAX_LOOKALIKES_LISTED).map(Lookalike::describe).collect();
        let more = lookalikes.len().saturating_sub(MAX_LOOKALIKES_LISTED) as u64 + n_more;
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        parts.push(format!(
            "it contains look-alike characters, which `old` must repeat exactly: {}{more}",
            listed.join(", ")
        ));
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!("[keel: {}]\n", parts.join("; ")))
}

/// The 0-based index of the line in `lines` most like `wanted`, with its similarity
/// (0.0 to 1.0); `None` when there is nothing comparable. Bounded: at most
/// [`MAX_LINES_COMPARED`] lines of [`MAX_CHARS_COMPARED`] characters are compared.
pub(crate) fn closest_line(lines: &[&str], wanted: &str) -> Option<(usize, f64)> {
    let wanted = fold(wanted);
    if wanted.is_empty() {
        return None;
    }
    let wanted_pairs = bigrams(&wanted);
    let mut best: Option<(usize, f64)> = None;
    for (index, line) in lines.iter().enumerate().take(MAX_LINES_COMPARED) {
        let folded = fold(line);
        if folded.is_empty() {
            continue;
        }
        let score = if folded == wanted { 1.0 } else { dice(&wanted_pairs, &bigrams(&folded)) };
        if best.is_none_or(|(_, best_score)| score > best_score) {
            best = Some((index, score));
        }
    }
    best.filter(|(_, score)| *score > 0.3)
}

/// A line reduced to what a model means by it: look-alikes to their ASCII stand-ins,
/// runs of whitespace to one space, trimmed, at most [`MAX_CHARS_COMPARED`] characters.
fn fold(line: &str) -> Vec<char> {
    let mut folded = Vec::new();
    let mut pending_space = false;
    for character in line.chars() {
        let stand_in: String =
            match LOOKALIKES.iter().find(|(candidate, _, _)| *candidate == character) {
                Some((_, _, ascii)) => (*ascii).to_owned(),
                None => character.to_string(),
            };
        for character in stand_in.chars() {
            if character.is_whitespace() {
                pending_space = !folded.is_empty();
                continue;
            }
            if pending_space {
                folded.push(' ');
                pending_space = false;
            }
            folded.push(character);
        }
        if folded.len() >= MAX_CHARS_COMPARED {
            break;
        }
    }
    folded
}

fn bigrams(chars: &[char]) -> Vec<(char, char)> {
    let mut pairs: Vec<(char, char)> = chars.windows(2).map(|pair| (pair[0], pair[1])).collect();
    if pairs.is_empty()
        && let Some(first) = chars.first()
    {
        pairs.push((*first, '\0'));
    }
    pairs.sort_unstable();
    pairs
}

/// Sørensen–Dice coefficient of two sorted bigram multisets.
fn dice(left: &[(char, char)], right: &[(char, char)]) -> f64 {
    let (mut i, mut j, mut common) = (0, 0, 0_usize);
    while i < left.len() && j < right.len() {
        match left[i].cmp(&right[j]) {
            std::cmp::Ordering::Equal => {
                common += 1;
                i += 1;
                j += 1;
            }
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
        }
    }
    let total = left.len() + right.len();
    if total == 0 { 0.0 } else { (2 * common) as f64 / total as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invisible_bytes_are_spelled_out() {
        assert_eq!(
            make_visible("\tlet\u{a0}x = \u{201c}a\u{201d};\r"),
            "\\tlet\\u{00A0}x = \\u{201C}a\\u{201D};\\r"
        );
        assert_eq!(make_visible("\u{feff}plain"), "\\u{FEFF}plain");
    }

    #[test]
    fn lookalikes_are_named_with_line_and_column() {
        let found = lookalikes_in_line("a\u{a0}b \u{2014}", 3);
        let described: Vec<String> = found.iter().map(Lookalike::describe).collect();
        assert_eq!(
            described,
            ["U+00A0 NO-BREAK SPACE at line 3 column 2", "U+2014 EM DASH at line 3 column 5"]
        );
    }

    #[test]
    fn endings_are_counted() {
        assert_eq!(LineEndings::of(b"a\r\nb\nc\r\n"), LineEndings { crlf: 2, lf: 1 });
        assert_eq!(LineEndings::of(b"a\rb"), LineEndings { crlf: 0, lf: 0 });
    }

    #[test]
    fn the_closest_line_sees_through_lookalikes_and_whitespace() {
        let lines = ["fn main() {", "\tlet\u{a0}name = \u{2018}x\u{2019};", "}"];
        assert_eq!(closest_line(&lines, "    let name = 'x';"), Some((1, 1.0)));
        let (index, score) = closest_line(&lines, "let nme = 'x'").unwrap();
        assert_eq!(index, 1);
        assert!(score > 0.5, "{score}");
        assert_eq!(closest_line(&lines, "qqqqqqqq"), None);
    }
}
