//! Capped output capture: keeps the head and the tail of a stream, counts what it drops.

use std::collections::VecDeque;

/// One captured output stream, made safe for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedText {
    /// The text: lossily decoded UTF-8; when bytes were omitted, the head, a marker line
    /// stating the cap and the omitted byte count, then the tail.
    pub text: String,
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

    /// The last non-empty line seen, lossily decoded and trimmed.
    pub(crate) fn last_line(&self) -> Option<String> {
        let bytes: Vec<u8> = if self.tail.is_empty() {
            self.head.clone()
        } else {
            self.tail.iter().copied().collect()
        };
        let text = String::from_utf8_lossy(&bytes);
        let line = text.lines().map(str::trim).rfind(|line| !line.is_empty())?;
        Some(line.to_owned())
    }

    pub(crate) fn finish(self) -> CapturedText {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let omitted_bytes = self.total_bytes - kept;
        let tail: Vec<u8> = self.tail.into_iter().collect();
        let text = if omitted_bytes == 0 {
            let mut all = self.head;
            all.extend_from_slice(&tail);
            String::from_utf8_lossy(&all).into_owned()
        } else {
            let mut text = String::from_utf8_lossy(&self.head).into_owned();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "[... {omitted_bytes} bytes omitted: output is capped at {} bytes per stream, \
                 showing the first {} and the last {} ...]\n",
                self.cap,
                self.head.len(),
                tail.len()
            ));
            text.push_str(&String::from_utf8_lossy(&tail));
            text
        };
        CapturedText { text, total_bytes: self.total_bytes, omitted_bytes }
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
    fn invalid_utf8_is_replaced() {
        let mut buffer = CappedBuffer::new(100);
        buffer.push(&[b'a', 0xff, 0xfe, b'b']);
        assert_eq!(buffer.finish().text, "a\u{fffd}\u{fffd}b");
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
