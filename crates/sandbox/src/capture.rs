//! Capped output capture: keeps the head and the tail of a stream, counts what it drops.

use std::collections::VecDeque;

use keel_contracts::{ExactText, escape_into, incomplete_suffix_len, orphan_prefix_len};

/// One captured output stream, made safe for the model.
///
/// Bytes that are not UTF-8 text (and control bytes) are shown as escapes, never replaced;
/// a character the cap cuts through is left out whole, never broken (see
/// [`keel_contracts::ExactText`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedText {
    /// The model text: escaped UTF-8; when bytes were omitted, the head, a marker line
    /// stating the cap and the omitted byte count, then the tail. The same as
    /// `exact.text()`.
    pub text: String,
    /// [`text`](Self::text) built beside the exact bytes it shows, for a tool to compose
    /// into its result.
    pub exact: ExactText,
    /// Bytes the stream produced in total.
    pub total_bytes: u64,
    /// Bytes left out of [`text`](Self::text) because of the cap.
    pub omitted_bytes: u64,
}

/// A byte sink that keeps at most `cap` bytes: the first half and the last half.
#[derive(Debug)]
pub(crate) struct CappedBuffer {
    cap: usize,
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total_bytes: u64,
}

impl CappedBuffer {
    pub(crate) fn new(cap: usize) -> CappedBuffer {
        let head_cap = cap / 2;
        CappedBuffer {
            cap,
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total_bytes: 0,
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.total_bytes += bytes.len() as u64;
        let room = self.head_cap.saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        let rest = &rest[rest.len().saturating_sub(self.tail_cap)..];
        self.tail.extend(rest);
        let excess = self.tail.len().saturating_sub(self.tail_cap);
        self.tail.drain(..excess);
    }

    /// The last non-empty line seen, escaped like the captured text and trimmed.
    pub(crate) fn last_line(&self) -> Option<String> {
        let bytes: Vec<u8> = if self.tail.is_empty() {
            self.head.clone()
        } else {
            let tail: Vec<u8> = self.tail.iter().copied().collect();
            tail[orphan_prefix_len(&tail)..].to_vec()
        };
        let line = bytes
            .split(|byte| *byte == b'\n')
            .map(<[u8]>::trim_ascii)
            .rfind(|line| !line.is_empty())?;
        let mut text = String::new();
        escape_into(&mut text, line);
        Some(text)
    }

    pub(crate) fn finish(self) -> CapturedText {
        let mut head = self.head;
        let mut tail: Vec<u8> = self.tail.into_iter().collect();
        let mut exact = ExactText::new();
        let omitted_bytes = if self.total_bytes == (head.len() + tail.len()) as u64 {
            head.extend_from_slice(&tail);
            exact.push_bytes(&head);
            0
        } else {
            // A character cut by the head's end or the tail's start is omitted whole.
            head.truncate(head.len() - incomplete_suffix_len(&head));
            tail.drain(..orphan_prefix_len(&tail));
            let omitted_bytes = self.total_bytes - (head.len() + tail.len()) as u64;
            exact.push_bytes(&head);
            if !head.is_empty() && !head.ends_with(b"\n") {
                exact.push_str("\n");
            }
            exact.push_str(&format!(
                "[... {omitted_bytes} bytes omitted: output is capped at {} bytes per stream, \
                 showing the first {} and the last {} ...]\n",
                self.cap,
                head.len(),
                tail.len()
            ));
            exact.push_bytes(&tail);
            omitted_bytes
        };
        CapturedText {
            text: exact.text().to_owned(),
            exact,
            total_bytes: self.total_bytes,
            omitted_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_the_cap_everything_is_kept() {
        let mut buffer = CappedBuffer::new(100);
        buffer.push(b"hello ");
        buffer.push(b"world\n");
        let captured = buffer.finish();
        assert_eq!(captured.text, "hello world\n");
        assert_eq!(captured.total_bytes, 12);
        assert_eq!(captured.omitted_bytes, 0);
    }

    #[test]
    fn over_the_cap_head_and_tail_are_kept() {
        let mut buffer = CappedBuffer::new(10);
        for chunk in [&b"0123"[..], b"456789", b"abcdef", b"ghij"] {
            buffer.push(chunk);
        }
        let captured = buffer.finish();
        assert_eq!(captured.total_bytes, 20);
        assert_eq!(captured.omitted_bytes, 10);
        assert!(captured.text.starts_with("01234\n[... 10 bytes omitted"), "{}", captured.text);
        assert!(captured.text.ends_with("...]\nfghij"), "{}", captured.text);
        assert!(captured.text.contains("capped at 10 bytes"));
    }

    #[test]
    fn one_huge_chunk_is_split() {
        let mut buffer = CappedBuffer::new(4);
        buffer.push(b"abcdefghij");
        let captured = buffer.finish();
        assert_eq!(captured.omitted_bytes, 6);
        assert!(captured.text.starts_with("ab\n"));
        assert!(captured.text.ends_with("ij"));
    }

    #[test]
    fn invalid_utf8_is_escaped_and_kept_exact() {
        let mut buffer = CappedBuffer::new(100);
        buffer.push(&[b'a', 0xff, 0xfe, b'b']);
        let captured = buffer.finish();
        assert_eq!(captured.text, "a\\xff\\xfeb");
        assert_eq!(captured.exact.n_escaped(), 2);
        let (_, raw) = captured.exact.finish();
        assert_eq!(raw.map(|raw| raw.0), Some(vec![b'a', 0xff, 0xfe, b'b']));
    }

    #[test]
    fn a_character_split_across_chunks_is_whole() {
        let mut buffer = CappedBuffer::new(100);
        let euro = "\u{20ac}".as_bytes();
        buffer.push(&euro[..1]);
        buffer.push(&euro[1..]);
        let captured = buffer.finish();
        assert_eq!(captured.text, "\u{20ac}");
        assert_eq!(captured.exact.n_escaped(), 0);
    }

    #[test]
    fn a_character_cut_by_the_cap_is_omitted_whole() {
        // Head holds 4 bytes: `ab` and the first two of the three bytes of U+20AC; the tail
        // starts with the last byte of another U+20AC.
        let mut buffer = CappedBuffer::new(8);
        buffer.push("ab\u{20ac}-----\u{20ac}xyz".as_bytes());
        let captured = buffer.finish();
        assert!(captured.text.starts_with("ab\n[... "), "{}", captured.text);
        assert!(captured.text.ends_with("...]\nxyz"), "{}", captured.text);
        assert!(!captured.text.contains('\u{fffd}'));
        assert_eq!(captured.exact.n_escaped(), 0);
        assert_eq!(captured.omitted_bytes, captured.total_bytes - 5);
    }

    #[test]
    fn last_line_skips_blank_lines() {
        let mut buffer = CappedBuffer::new(100);
        buffer.push(b"first\nOk to proceed? (y) \n\n");
        assert_eq!(buffer.last_line().as_deref(), Some("Ok to proceed? (y)"));
    }

    #[test]
    fn zero_cap_keeps_nothing_and_counts() {
        let mut buffer = CappedBuffer::new(0);
        buffer.push(b"abc");
        let captured = buffer.finish();
        assert_eq!(captured.omitted_bytes, 3);
    }
}
