//! An incremental parser for `text/event-stream` bodies (server-sent events).
//!
//! It follows the WHATWG HTML standard, "Server-sent events", section "Parsing an event
//! stream" (<https://html.spec.whatwg.org/multipage/server-sent-events.html#parsing-an-event-stream>):
//! lines end with CRLF, LF or CR; a leading byte-order mark is dropped; `event`, `data`
//! (several lines joined with `\n`) and `id` fields are kept; lines starting with `:` are
//! comments; a blank line dispatches the event.
//!
//! Invariants:
//! - Bytes may arrive split at any position, including inside a CRLF pair or a multi-byte
//!   UTF-8 sequence: the events are the same however the body is chunked.
//! - Memory is bounded: an incomplete line or an event's data larger than the limit is a
//!   typed [`SseError`], never an unbounded buffer.
//! - No input makes the parser panic; invalid UTF-8 is replaced with U+FFFD as the standard
//!   says.
//! - The `retry` field is ignored: keel never reconnects an event stream, it retries the
//!   whole request.

use std::mem;

/// The default limit for one line and for one event's data: 16 MiB.
pub(crate) const DEFAULT_MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// One dispatched server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The event type: the last `event:` field, or `message` when none was given.
    pub(crate) event: String,
    /// The `data:` lines of the event, joined with `\n`.
    pub(crate) data: String,
    /// The last event id seen on the stream so far, when one was set.
    pub(crate) id: Option<String>,
}

/// Why an event stream could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SseError {
    /// A line, or the data of one event, grew past the limit.
    #[error("event stream line or event exceeds {limit_bytes} bytes")]
    TooLarge {
        /// The limit that was exceeded.
        limit_bytes: usize,
    },
}

/// The parser's state between chunks.
///
/// Feed body chunks to [`SseParser::push`] in order; each call returns the events that
/// were completed by that chunk. Once it has returned an error the parser stays failed.
#[derive(Debug)]
pub(crate) struct SseParser {
    max_event_bytes: usize,
    /// The bytes of the line being read (no terminator yet).
    line: Vec<u8>,
    /// The previous chunk ended with CR: an LF at the start of the next one belongs to it.
    pending_cr: bool,
    /// No line has been processed yet, so a byte-order mark may still be dropped.
    at_stream_start: bool,
    event_type: String,
    data: String,
    last_event_id: Option<String>,
    /// Set once a limit was exceeded.
    failed: Option<SseError>,
}

impl SseParser {
    /// A parser with the default 16 MiB limit.
    pub(crate) fn new() -> Self {
        SseParser::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A parser that fails when one line or one event's data exceeds `max_event_bytes`.
    pub(crate) fn with_max_event_bytes(max_event_bytes: usize) -> Self {
        SseParser {
            max_event_bytes,
            line: Vec::new(),
            pending_cr: false,
            at_stream_start: true,
            event_type: String::new(),
            data: String::new(),
            last_event_id: None,
            failed: None,
        }
    }

    /// Feeds the next chunk of the body and returns the events it completed, in order.
    ///
    /// # Errors
    ///
    /// [`SseError::TooLarge`] when a line or an event's data exceeds the limit; every later
    /// call returns the same error.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let result = self.push_inner(chunk);
        if let Err(error) = &result {
            self.failed = Some(error.clone());
            self.line = Vec::new();
            self.data = String::new();
        }
        result
    }

    /// Ends the stream and returns the event that was still being collected, if its lines
    /// were complete.
    ///
    /// The standard discards an event that is not followed by a blank line; it is returned
    /// here so the caller can decide (some servers omit the blank line after the last
    /// event). A trailing line without its terminator is discarded.
    pub(crate) fn finish(&mut self) -> Option<SseEvent> {
        if self.failed.is_some() {
            return None;
        }
        self.line.clear();
        self.pending_cr = false;
        self.take_event()
    }

    fn push_inner(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        let mut rest = chunk;
        // An empty chunk says nothing about whether an LF follows a CR.
        if self.pending_cr && !rest.is_empty() {
            self.pending_cr = false;
            if let Some((b'\n', after)) = rest.split_first() {
                rest = after;
            }
        }
        while let Some(end) = rest.iter().position(|byte| *byte == b'\n' || *byte == b'\r') {
            let (line_part, terminator_and_after) = rest.split_at(end);
            self.extend_line(line_part)?;
            rest = match terminator_and_after.split_first() {
                Some((b'\r', after)) => match after.split_first() {
                    Some((b'\n', after_lf)) => after_lf,
                    Some(_) => after,
                    None => {
                        self.pending_cr = true;
                        after
                    }
                },
                Some((_, after)) => after,
                None => terminator_and_after,
            };
            let line = mem::take(&mut self.line);
            if let Some(event) = self.process_line(&line)? {
                events.push(event);
            }
        }
        self.extend_line(rest)?;
        Ok(events)
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len().saturating_add(bytes.len()) > self.max_event_bytes {
            return Err(SseError::TooLarge { limit_bytes: self.max_event_bytes });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn process_line(&mut self, line: &[u8]) -> Result<Option<SseEvent>, SseError> {
        let decoded = String::from_utf8_lossy(line);
        let mut line: &str = &decoded;
        if self.at_stream_start {
            self.at_stream_start = false;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            return Ok(self.take_event());
        }
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event_type),
            "data" => {
                let new_len = self.data.len().saturating_add(value.len()).saturating_add(1);
                if new_len > self.max_event_bytes {
                    return Err(SseError::TooLarge { limit_bytes: self.max_event_bytes });
                }
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => self.last_event_id = Some(value.to_owned()),
            // An `id` with NUL is ignored, as the standard says; `retry` only matters to a
            // reconnecting client; other fields are ignored.
            _ => {}
        }
        Ok(None)
    }

    /// Dispatches the collected event, as the standard's "dispatch the event" steps say.
    fn take_event(&mut self) -> Option<SseEvent> {
        let event_type = mem::take(&mut self.event_type);
        if self.data.is_empty() {
            return None;
        }
        let mut data = mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        let event = if event_type.is_empty() { "message".to_owned() } else { event_type };
        Some(SseEvent { event, data, id: self.last_event_id.clone() })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse_whole(input: &[u8]) -> (Vec<SseEvent>, Option<SseEvent>) {
        let mut parser = SseParser::new();
        let events = parser.push(input).unwrap();
        let pending = parser.finish();
        (events, pending)
    }

    fn parse_split(input: &[u8], at: &[usize]) -> (Vec<SseEvent>, Option<SseEvent>) {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut start = 0;
        for &split in at {
            events.extend(parser.push(&input[start..split]).unwrap());
            start = split;
        }
        events.extend(parser.push(&input[start..]).unwrap());
        let pending = parser.finish();
        (events, pending)
    }

    fn message(data: &str) -> SseEvent {
        SseEvent { event: "message".to_owned(), data: data.to_owned(), id: None }
    }

    const MIXED: &[u8] = b"\xEF\xBB\xBF: a comment\r\n\
        data: first\r\n\r\n\
        event: error\rdata: {\"a\":1}\rdata:second line\r\r\
        id: 7\n\
        data:  two spaces\n\
        retry: 10\n\
        unknown: x\n\
        data\n\n\
        data: caf\xC3\xA9 \xE2\x9C\x93\n\n\
        event: ping\n\n\
        data: tail without blank line\n";

    #[test]
    fn parses_fields_comments_line_endings_and_bom() {
        let (events, pending) = parse_whole(MIXED);
        assert_eq!(
            events,
            vec![
                message("first"),
                SseEvent {
                    event: "error".to_owned(),
                    data: "{\"a\":1}\nsecond line".to_owned(),
                    id: None
                },
                SseEvent {
                    event: "message".to_owned(),
                    data: " two spaces\n".to_owned(),
                    id: Some("7".to_owned())
                },
                SseEvent {
                    event: "message".to_owned(),
                    data: "café ✓".to_owned(),
                    id: Some("7".to_owned())
                },
            ]
        );
        assert_eq!(
            pending,
            Some(SseEvent {
                event: "message".to_owned(),
                data: "tail without blank line".to_owned(),
                id: Some("7".to_owned())
            })
        );
    }

    #[test]
    fn every_split_position_gives_the_same_events() {
        let whole = parse_whole(MIXED);
        for split in 0..=MIXED.len() {
            assert_eq!(parse_split(MIXED, &[split]), whole, "split at {split}");
        }
        for first in 0..=MIXED.len() {
            for second in first..=MIXED.len() {
                assert_eq!(
                    parse_split(MIXED, &[first, second]),
                    whole,
                    "split at {first},{second}"
                );
            }
        }
    }

    #[test]
    fn byte_at_a_time_gives_the_same_events() {
        let whole = parse_whole(MIXED);
        let every: Vec<usize> = (1..MIXED.len()).collect();
        assert_eq!(parse_split(MIXED, &every), whole);
    }

    #[test]
    fn bom_is_dropped_only_at_the_start() {
        let (events, _) = parse_whole(b"\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\n");
        // The second BOM starts a line whose field name is "\u{feff}data": ignored.
        assert_eq!(events, vec![message("a")]);
    }

    #[test]
    fn cr_split_from_its_lf_makes_one_line_ending() {
        let mut parser = SseParser::new();
        assert_eq!(parser.push(b"data: a\r").unwrap(), vec![]);
        // The LF completes the CRLF; the following CR is the blank line.
        assert_eq!(parser.push(b"\n\r").unwrap(), vec![message("a")]);
        assert_eq!(parser.push(b"\n").unwrap(), vec![]);
        assert_eq!(parser.finish(), None);
    }

    #[test]
    fn empty_chunk_between_cr_and_lf_keeps_them_one_line_ending() {
        // Found by `any_chunking_gives_the_same_events` (proptest-regressions/sse.txt).
        let mut parser = SseParser::new();
        assert_eq!(parser.push(b"data: \r").unwrap(), vec![]);
        assert_eq!(parser.push(b"").unwrap(), vec![]);
        assert_eq!(parser.push(b"\n").unwrap(), vec![]);
        assert_eq!(parser.push(b"\n").unwrap(), vec![message("")]);
    }

    #[test]
    fn empty_data_field_dispatches_an_empty_message() {
        let (events, _) = parse_whole(b"data\n\ndata:\n\n");
        assert_eq!(events, vec![message(""), message("")]);
    }

    #[test]
    fn event_without_data_is_not_dispatched_and_resets_the_type() {
        let (events, _) = parse_whole(b"event: x\n\ndata: y\n\n");
        assert_eq!(events, vec![message("y")]);
    }

    #[test]
    fn id_with_nul_is_ignored() {
        let (events, _) = parse_whole(b"id: 1\ndata: a\n\nid: 2\0\ndata: b\n\nid\ndata: c\n\n");
        let ids: Vec<_> = events.iter().map(|event| event.id.clone()).collect();
        assert_eq!(ids, vec![Some("1".to_owned()), Some("1".to_owned()), Some(String::new())]);
    }

    #[test]
    fn invalid_utf8_is_replaced_not_rejected() {
        let (events, _) = parse_whole(b"data: \xFF\xFEok\n\n");
        assert_eq!(events, vec![message("\u{fffd}\u{fffd}ok")]);
    }

    #[test]
    fn unterminated_line_is_discarded_at_finish() {
        let mut parser = SseParser::new();
        assert_eq!(
            parser.push(b"data: complete\n\ndata: partial").unwrap(),
            vec![message("complete")]
        );
        assert_eq!(parser.finish(), None);
    }

    #[test]
    fn overlong_line_is_a_typed_error_and_the_parser_stays_failed() {
        let mut parser = SseParser::with_max_event_bytes(16);
        assert_eq!(parser.push(b"data: 0123456789").unwrap(), vec![]);
        assert_eq!(parser.push(b"abc"), Err(SseError::TooLarge { limit_bytes: 16 }));
        assert_eq!(parser.push(b"\n\n"), Err(SseError::TooLarge { limit_bytes: 16 }));
        assert_eq!(parser.finish(), None);
    }

    #[test]
    fn overlong_event_data_is_a_typed_error() {
        let mut parser = SseParser::with_max_event_bytes(16);
        let result = parser.push(b"data: 01234567\ndata: 01234567\n\n");
        assert_eq!(result, Err(SseError::TooLarge { limit_bytes: 16 }));
    }

    #[test]
    fn lines_within_the_limit_pass() {
        let mut parser = SseParser::with_max_event_bytes(16);
        assert_eq!(parser.push(b"data: 0123456789\n\n").unwrap(), vec![message("0123456789")]);
    }

    /// Bytes drawn mostly from the characters that matter to the grammar.
    fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
        let interesting = prop_oneof![
            Just(b'\n'),
            Just(b'\r'),
            Just(b':'),
            Just(b' '),
            Just(0xEF),
            Just(0xBB),
            Just(0xBF),
            Just(0xC3),
            Just(0xA9),
            Just(0),
            Just(b'd'),
            Just(b'a'),
            Just(b't'),
            Just(b'e'),
            Just(b'i'),
            any::<u8>(),
        ];
        let fragment = prop_oneof![
            Just(b"data: ".to_vec()),
            Just(b"event: ".to_vec()),
            Just(b"id: ".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"\n\n".to_vec()),
            Just(b": c\n".to_vec()),
            Just(b"\xEF\xBB\xBF".to_vec()),
            prop::collection::vec(interesting, 0..8),
        ];
        prop::collection::vec(fragment, 0..24).prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_same_events(
            input in sse_bytes(),
            splits in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let mut at: Vec<usize> = splits.iter().map(|index| index.index(input.len() + 1)).collect();
            at.sort_unstable();
            prop_assert_eq!(parse_split(&input, &at), parse_whole(&input));
        }

        #[test]
        fn every_single_split_of_random_input_agrees(input in sse_bytes()) {
            let whole = parse_whole(&input);
            for split in 0..=input.len() {
                prop_assert_eq!(parse_split(&input, &[split]), whole.clone());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_respect_the_limit(
            input in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut parser = SseParser::with_max_event_bytes(64);
            if let Ok(events) = parser.push(&input) {
                for event in events {
                    prop_assert!(event.data.len() <= 64);
                }
            }
            let _ = parser.finish();
        }
    }
}
