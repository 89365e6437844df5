//! Exact bytes beside model-safe text: how tool output that is not clean UTF-8 text reaches
//! the model escaped while the ledger keeps every byte.
//!
//! The model sees text: bytes that are not valid UTF-8 become `\xNN`, and so do control
//! bytes other than `\n`, `\t` and the `\r` of a CRLF (NUL, ESC, DEL, a lone `\r`); C1
//! control characters (U+0080..U+009F) become `\u{NN}`. Nothing is ever replaced by U+FFFD,
//! so a U+FFFD in the text was in the data. When anything was escaped, the tool result also
//! carries the exact bytes ([`RawBytes`], base64 on the wire) and the model text ends with a
//! one-line note saying how many bytes were escaped.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Exact bytes recorded in the ledger, serialized as standard base64 (with padding).
///
/// Carried by a `tool_result` only when its model-visible `content` shows some bytes as
/// escapes: the same layout as `content` (keel's own headers and markers included, the
/// escape note left out), with each escape replaced by the bytes it stands for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawBytes(pub Vec<u8>);

impl Serialize for RawBytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for RawBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RawBytes, D::Error> {
        use base64::Engine as _;
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(RawBytes)
            .map_err(serde::de::Error::custom)
    }
}

/// Model-safe text built beside the exact bytes it shows.
///
/// Keel's own words go in with [`push_str`](Self::push_str) (verbatim in both); data read
/// from files or commands goes in with [`push_bytes`](Self::push_bytes) (escaped in the
/// text, exact in the bytes).
///
/// # Examples
///
/// ```
/// use keel_contracts::ExactText;
///
/// let mut text = ExactText::new();
/// text.push_str("out: ");
/// text.push_bytes(b"caf\xe9\x00\n");
/// assert_eq!(text.text(), "out: caf\\xe9\\x00\n");
/// assert_eq!(text.n_escaped(), 2);
/// let (content, raw) = text.finish();
/// assert!(content.ends_with("[keel: 2 bytes shown as \\xNN escapes (not UTF-8 text or control bytes); the ledger keeps the exact bytes]\n"));
/// assert_eq!(raw.unwrap().0, b"out: caf\xe9\x00\n");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExactText {
    text: String,
    raw: Vec<u8>,
    n_escaped: u64,
}

impl ExactText {
    /// Empty text.
    pub fn new() -> ExactText {
        ExactText::default()
    }

    /// Appends keel's own text, the same in the model text and the exact bytes.
    pub fn push_str(&mut self, text: &str) {
        self.text.push_str(text);
        self.raw.extend_from_slice(text.as_bytes());
    }

    /// Appends data: escaped for the model (see the module doc), exact in the bytes.
    ///
    /// A `\r` is kept only when the next byte of this same slice is `\n`; push a CRLF line
    /// in one call.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        self.raw.extend_from_slice(bytes);
        self.n_escaped += escape_into(&mut self.text, bytes);
    }

    /// Appends another [`ExactText`]: its text, exact bytes and escape count.
    pub fn append(&mut self, other: &ExactText) {
        self.text.push_str(&other.text);
        self.raw.extend_from_slice(&other.raw);
        self.n_escaped += other.n_escaped;
    }

    /// The model text so far (without the escape note).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Bytes of data shown as escapes so far.
    pub fn n_escaped(&self) -> u64 {
        self.n_escaped
    }

    /// Length of the model text so far, in bytes.
    pub fn len(&self) -> usize {
        self.text.len()
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.raw.is_empty()
    }

    /// The model text, with the escape note as its last line when anything was escaped,
    /// and the exact bytes when (and only when) they differ from the text.
    pub fn finish(self) -> (String, Option<RawBytes>) {
        if self.n_escaped == 0 {
            return (self.text, None);
        }
        let mut text = self.text;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&escape_note(self.n_escaped));
        (text, Some(RawBytes(self.raw)))
    }
}

/// The one-line note appended to model text in which `n_escaped` bytes are escapes.
pub fn escape_note(n_escaped: u64) -> String {
    let unit = if n_escaped == 1 { "byte" } else { "bytes" };
    format!(
        "[keel: {n_escaped} {unit} shown as \\xNN escapes (not UTF-8 text or control bytes); \
         the ledger keeps the exact bytes]\n"
    )
}

/// Appends `bytes` to `text` escaped for the model; returns how many bytes were escaped.
///
/// Valid UTF-8 is copied as it is (U+FFFD included, when the data has it); invalid bytes
/// and control bytes become `\xNN`, C1 controls `\u{NN}`.
pub fn escape_into(text: &mut String, bytes: &[u8]) -> u64 {
    let mut n_escaped = 0;
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        for (index, character) in valid.char_indices() {
            match character {
                '\n' | '\t' => text.push(character),
                '\r' => {
                    // The `\r` of a CRLF is a line ending; a lone one rewrites the line.
                    if valid.as_bytes().get(index + 1) == Some(&b'\n') {
                        text.push('\r');
                    } else {
                        text.push_str("\\x0d");
                        n_escaped += 1;
                    }
                }
                '\u{0}'..='\u{1f}' | '\u{7f}' => {
                    text.push_str(&format!("\\x{:02x}", u32::from(character)));
                    n_escaped += 1;
                }
                '\u{80}'..='\u{9f}' => {
                    text.push_str(&format!("\\u{{{:02x}}}", u32::from(character)));
                    n_escaped += 2;
                }
                _ => text.push(character),
            }
        }
        for byte in chunk.invalid() {
            text.push_str(&format!("\\x{byte:02x}"));
            n_escaped += 1;
        }
    }
    n_escaped
}

/// The longest prefix of `bytes` that holds at most `max_chars` characters, counting each
/// invalid byte as one; it never ends inside a valid multi-byte character.
pub fn prefix_chars(bytes: &[u8], max_chars: usize) -> &[u8] {
    let mut n_chars = 0;
    let mut end = 0;
    for chunk in bytes.utf8_chunks() {
        for character in chunk.valid().chars() {
            if n_chars == max_chars {
                return &bytes[..end];
            }
            n_chars += 1;
            end += character.len_utf8();
        }
        for _ in chunk.invalid() {
            if n_chars == max_chars {
                return &bytes[..end];
            }
            n_chars += 1;
            end += 1;
        }
    }
    bytes
}

/// How many bytes at the end of `bytes` are the start of a valid UTF-8 character that the
/// slice cuts off (0 to 3). Cutting them keeps a character split across reads whole.
pub fn incomplete_suffix_len(bytes: &[u8]) -> usize {
    let start = bytes.len().saturating_sub(3);
    for cut in start..bytes.len() {
        let lead = bytes[cut];
        let width = match lead {
            0xc2..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf4 => 4,
            _ => continue,
        };
        let tail = &bytes[cut..];
        if tail.len() < width
            && std::str::from_utf8(tail).err().is_some_and(|e| e.error_len().is_none())
        {
            return tail.len();
        }
    }
    0
}

/// How many bytes at the start of `bytes` are continuation bytes of a character whose start
/// was cut off (0 to 3).
pub fn orphan_prefix_len(bytes: &[u8]) -> usize {
    bytes.iter().take(3).take_while(|byte| (0x80..=0xbf).contains(*byte)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(bytes: &[u8]) -> (String, u64) {
        let mut text = String::new();
        let n = escape_into(&mut text, bytes);
        (text, n)
    }

    #[test]
    fn escapes_follow_the_rules() {
        let table: &[(&[u8], &str, u64)] = &[
            (b"plain\ttext\n", "plain\ttext\n", 0),
            (b"\xe9\xff", "\\xe9\\xff", 2),
            (b"a\x00b", "a\\x00b", 1),
            (b"crlf\r\n", "crlf\r\n", 0),
            (b"bar\rbaz", "bar\\x0dbaz", 1),
            (b"\x1b[31mred", "\\x1b[31mred", 1),
            (b"\x7f", "\\x7f", 1),
            ("\u{9b}".as_bytes(), "\\u{9b}", 2),
            ("caf\u{e9} \u{fffd} \u{2019}".as_bytes(), "caf\u{e9} \u{fffd} \u{2019}", 0),
            (b"\xe2\x82", "\\xe2\\x82", 2),
            (b"\\xe9 literal", "\\xe9 literal", 0),
        ];
        for (bytes, text, n) in table {
            assert_eq!(escaped(bytes), ((*text).to_owned(), *n), "{bytes:?}");
        }
    }

    #[test]
    fn clean_text_has_no_raw_and_no_note() {
        let mut text = ExactText::new();
        text.push_bytes("r\u{e9}sum\u{e9}\n".as_bytes());
        assert_eq!(text.finish(), ("r\u{e9}sum\u{e9}\n".to_owned(), None));
    }

    #[test]
    fn raw_bytes_round_trip_as_base64() {
        let raw = RawBytes(vec![0xe9, 0xff, 0, b'a']);
        let json = serde_json::to_value(&raw).unwrap();
        assert_eq!(json, "6f8AYQ==");
        assert_eq!(serde_json::from_value::<RawBytes>(json).unwrap(), raw);
        assert!(serde_json::from_value::<RawBytes>("not base64!".into()).is_err());
    }

    #[test]
    fn prefix_never_splits_a_character() {
        let bytes = "a\u{e9}\u{20ac}b".as_bytes();
        assert_eq!(prefix_chars(bytes, 0), b"");
        assert_eq!(prefix_chars(bytes, 2), "a\u{e9}".as_bytes());
        assert_eq!(prefix_chars(bytes, 3), "a\u{e9}\u{20ac}".as_bytes());
        assert_eq!(prefix_chars(bytes, 9), bytes);
        assert_eq!(prefix_chars(b"\xff\xfeab", 3), b"\xff\xfea");
    }

    #[test]
    fn split_characters_are_measured_at_both_ends() {
        let euro = "\u{20ac}".as_bytes();
        assert_eq!(incomplete_suffix_len(&[b'a', euro[0], euro[1]]), 2);
        assert_eq!(incomplete_suffix_len(&[b'a', euro[0]]), 1);
        assert_eq!(incomplete_suffix_len(euro), 0);
        assert_eq!(incomplete_suffix_len(b"ab\xff"), 0);
        assert_eq!(orphan_prefix_len(&[euro[1], euro[2], b'a']), 2);
        assert_eq!(orphan_prefix_len(b"abc"), 0);
    }
}
