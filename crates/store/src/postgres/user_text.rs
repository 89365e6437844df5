//! The stored spelling of text that comes from users (workspace, model, title): NUL, which
//! PostgreSQL's `text` cannot hold, escaped reversibly, everything else kept.

use std::borrow::Cow;

/// The escape character of [`to_column`]: a Unicode noncharacter, which no real text
/// carries, so almost every string is stored exactly as it is.
const ESCAPE: char = '\u{FFFF}';

/// The stored spelling of user text: NUL (which `text` cannot hold) becomes `ESCAPE 0`
/// and `ESCAPE` itself becomes `ESCAPE ESCAPE`; everything else is kept. Reversed by
/// [`from_column`].
pub(super) fn to_column(text: &str) -> Cow<'_, str> {
    if !text.contains(['\0', ESCAPE]) {
        return Cow::Borrowed(text);
    }
    let mut stored = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\0' => stored.extend([ESCAPE, '0']),
            ESCAPE => stored.extend([ESCAPE, ESCAPE]),
            other => stored.push(other),
        }
    }
    Cow::Owned(stored)
}

/// Reverses [`to_column`]; `None` for a dangling or unknown escape.
pub(super) fn from_column(stored: String) -> Option<String> {
    if !stored.contains(ESCAPE) {
        return Some(stored);
    }
    let mut text = String::with_capacity(stored.len());
    let mut chars = stored.chars();
    while let Some(c) = chars.next() {
        if c != ESCAPE {
            text.push(c);
            continue;
        }
        match chars.next()? {
            '0' => text.push('\0'),
            ESCAPE => text.push(ESCAPE),
            _ => return None,
        }
    }
    Some(text)
}
