//! The digest recorded as `request_sha256` in `model_requested`: a digest of per-message
//! digests in blocks, so a step hashes what changed since the previous request instead of
//! the whole request.
//!
//! Definition (docs/decisions.md, issue #13), over hex SHA-256 strings:
//! - `head = sha256(JSON of the request with an empty messages list)`;
//! - `h_i = sha256(JSON of message i)`, for messages `0..n`;
//! - `b_j = sha256(h_{64j} ++ "\n" ++ h_{64j+1} ++ "\n" ++ … )`, one per block of
//!   [`BLOCK`] messages (the last block may be shorter), each `h` followed by `"\n"`;
//! - `request_sha256 = sha256(head ++ "\n" ++ b_0 ++ "\n" ++ b_1 …)`, each `b` preceded
//!   by `"\n"` (no blocks: `sha256(head)`).
//!
//! It depends on the request alone ([`request_digest`] computes it from scratch);
//! [`MessageDigests`] gives the same value while hashing only the messages that changed
//! (a pruned result in the middle of the window re-hashes its message and its block, not
//! every message after it).

use keel_contracts::{
    Message, ModelRequest, RequestPurpose, ToolChoice, ToolDefinition, sha256_hex,
};
use sha2::{Digest, Sha256};

/// Messages per block.
pub const BLOCK: usize = 64;

fn message_digest(message: &Message) -> String {
    // Serializing a `Message` cannot fail (string keys, no maps with non-string keys).
    sha256_hex(&serde_json::to_vec(message).unwrap_or_default())
}

fn block_digest<'a>(hashes: impl Iterator<Item = &'a str>) -> String {
    let mut bytes = Vec::with_capacity(BLOCK * 65);
    for hash in hashes {
        bytes.extend_from_slice(hash.as_bytes());
        bytes.push(b'\n');
    }
    sha256_hex(&bytes)
}

/// The request with an empty messages list, borrowed: serializes to the same bytes as
/// such a [`ModelRequest`] (same fields, order and attributes; a test holds it) without
/// cloning the system prompt and the tool definitions every step.
#[derive(serde::Serialize)]
struct Head<'a> {
    model: &'a str,
    system: &'a str,
    messages: &'a [Message],
    tools: &'a [ToolDefinition],
    #[serde(skip_serializing_if = "ToolChoice::is_auto")]
    tool_choice: ToolChoice,
    responses_in_session: u64,
    purpose: RequestPurpose,
}

fn head_digest(request: &ModelRequest) -> String {
    let head = Head {
        model: &request.model,
        system: &request.system,
        messages: &[],
        tools: &request.tools,
        tool_choice: request.tool_choice,
        responses_in_session: request.responses_in_session,
        purpose: request.purpose,
    };
    sha256_hex(&serde_json::to_vec(&head).unwrap_or_default())
}

/// The part of [`Head`] that stays the same from step to step of a run: its JSON up to
/// and including the tools, without the closing brace.
#[derive(serde::Serialize)]
struct HeadPrefix<'a> {
    model: &'a str,
    system: &'a str,
    messages: &'a [Message],
    tools: &'a [ToolDefinition],
}

/// The rest of [`Head`]: serialized, its `{` becomes the `,` after the prefix.
#[derive(serde::Serialize)]
struct HeadSuffix {
    #[serde(skip_serializing_if = "ToolChoice::is_auto")]
    tool_choice: ToolChoice,
    responses_in_session: u64,
    purpose: RequestPurpose,
}

/// [`head_digest`] for the steps of one run: the SHA-256 state after the prefix (the
/// system prompt and the tool definitions, the bulk of the head) is kept while the model,
/// the system prompt and the tools stay the same, so a step hashes only the few bytes
/// after them.
#[derive(Clone)]
struct HeadCache {
    model: String,
    system: String,
    tools: Vec<ToolDefinition>,
    after_prefix: Sha256,
}

impl std::fmt::Debug for HeadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadCache").field("model", &self.model).finish_non_exhaustive()
    }
}

impl HeadCache {
    fn new(request: &ModelRequest) -> HeadCache {
        let prefix = HeadPrefix {
            model: &request.model,
            system: &request.system,
            messages: &[],
            tools: &request.tools,
        };
        let mut bytes = serde_json::to_vec(&prefix).unwrap_or_default();
        bytes.pop(); // the closing brace
        HeadCache {
            model: request.model.clone(),
            system: request.system.clone(),
            tools: request.tools.clone(),
            after_prefix: Sha256::new_with_prefix(&bytes),
        }
    }

    fn fits(&self, request: &ModelRequest) -> bool {
        // Tool schemas compare by their shared allocation first (see `ToolSchema`).
        self.model == request.model && self.system == request.system && self.tools == request.tools
    }

    /// [`head_digest`] of `request`, which [`HeadCache::fits`].
    fn digest(&self, request: &ModelRequest) -> String {
        let suffix = HeadSuffix {
            tool_choice: request.tool_choice,
            responses_in_session: request.responses_in_session,
            purpose: request.purpose,
        };
        let mut bytes = serde_json::to_vec(&suffix).unwrap_or_default();
        if let Some(first) = bytes.first_mut() {
            *first = b',';
        }
        let mut hasher = self.after_prefix.clone();
        hasher.update(&bytes);
        hex::encode(hasher.finalize())
    }
}

fn combine<'a>(head: &str, blocks: impl Iterator<Item = &'a str>) -> String {
    let mut bytes = head.as_bytes().to_vec();
    for block in blocks {
        bytes.push(b'\n');
        bytes.extend_from_slice(block.as_bytes());
    }
    sha256_hex(&bytes)
}

/// The request's digest, computed from scratch (see the module docs).
pub fn request_digest(request: &ModelRequest) -> String {
    let hashes: Vec<String> = request.messages.iter().map(message_digest).collect();
    let blocks: Vec<String> =
        hashes.chunks(BLOCK).map(|block| block_digest(block.iter().map(String::as_str))).collect();
    combine(&head_digest(request), blocks.iter().map(String::as_str))
}

/// The digests of a request's messages and blocks, kept between requests by a caller that
/// says which messages changed (the incremental projection,
/// [`crate::context::IncrementalContext`]).
#[derive(Debug, Default, Clone)]
pub struct MessageDigests {
    /// `h_i`, or `None` when message `i` changed since it was hashed.
    hashes: Vec<Option<String>>,
    /// `b_j`, or `None` when a message of block `j` changed.
    blocks: Vec<Option<String>>,
    /// The head's hashing state, for the next request with the same head prefix.
    head: Option<HeadCache>,
}

impl MessageDigests {
    /// Forgets the digests of the messages at index `len` and after (they were removed or
    /// replaced).
    pub fn truncate(&mut self, len: usize) {
        self.hashes.truncate(len);
        self.blocks.truncate(len.div_ceil(BLOCK));
        if !len.is_multiple_of(BLOCK)
            && let Some(block) = self.blocks.last_mut()
        {
            *block = None;
        }
    }

    /// Forgets the digest of message `index` (it changed in place).
    pub fn changed(&mut self, index: usize) {
        if let Some(hash) = self.hashes.get_mut(index) {
            *hash = None;
        }
        if let Some(block) = self.blocks.get_mut(index / BLOCK) {
            *block = None;
        }
    }

    /// The digest of `request`, equal to [`request_digest`]'s provided every message the
    /// kept digests were made from is unchanged in `request` unless reported through
    /// [`MessageDigests::changed`] or [`MessageDigests::truncate`] (the caller's promise).
    /// Hashes only the messages and blocks not kept.
    pub fn digest(&mut self, request: &ModelRequest) -> String {
        let messages = &request.messages;
        let kept = self.hashes.len();
        if messages.len() < kept {
            self.truncate(messages.len());
        } else if messages.len() > kept && !kept.is_multiple_of(BLOCK) {
            // The last block was short and grows.
            if let Some(block) = self.blocks.get_mut(kept / BLOCK) {
                *block = None;
            }
        }
        self.hashes.resize(messages.len(), None);
        self.blocks.resize(messages.len().div_ceil(BLOCK), None);
        for (index, block) in self.blocks.iter_mut().enumerate() {
            if block.is_some() {
                continue;
            }
            let range = index * BLOCK..((index + 1) * BLOCK).min(messages.len());
            for at in range.clone() {
                if self.hashes[at].is_none() {
                    self.hashes[at] = Some(message_digest(&messages[at]));
                }
            }
            *block = Some(block_digest(self.hashes[range].iter().flatten().map(String::as_str)));
        }
        if !self.head.as_ref().is_some_and(|head| head.fits(request)) {
            self.head = Some(HeadCache::new(request));
        }
        let head = match &self.head {
            Some(head) => head.digest(request),
            None => head_digest(request),
        };
        combine(&head, self.blocks.iter().flatten().map(String::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(texts: &[String]) -> ModelRequest {
        ModelRequest {
            model: "m".into(),
            system: "s".into(),
            messages: texts.iter().map(|text| Message::User { text: text.clone() }).collect(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            responses_in_session: 0,
            purpose: RequestPurpose::Conversation,
        }
    }

    #[test]
    fn the_borrowed_head_serializes_as_the_request_without_messages() {
        let tool = ToolDefinition {
            name: "read_file".into(),
            description: "Read a \"file\".".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"path": {}}}).into(),
        };
        for (choice, purpose) in [
            (ToolChoice::Auto, RequestPurpose::Conversation),
            (ToolChoice::None, RequestPurpose::Compaction),
        ] {
            let mut request = request(&["a".to_owned()]);
            request.system = "line\nbreak".into();
            request.tools = vec![tool.clone()];
            request.tool_choice = choice;
            request.responses_in_session = 7;
            request.purpose = purpose;
            let whole = ModelRequest { messages: Vec::new(), ..request.clone() };
            assert_eq!(
                head_digest(&request),
                sha256_hex(serde_json::to_string(&whole).unwrap().as_bytes())
            );
        }
    }

    #[test]
    fn the_kept_head_state_gives_the_digest_from_scratch() {
        let tool = ToolDefinition {
            name: "todo".into(),
            description: "Track \"work\".".into(),
            parameters: serde_json::json!({"type": "object"}).into(),
        };
        let mut digests = MessageDigests::default();
        let mut request = request(&["a".to_owned()]);
        request.tools = vec![tool.clone()];
        for step in 0..4u64 {
            // The suffix changes every step; the prefix only at steps 2 and 3.
            request.responses_in_session = step;
            request.tool_choice = if step == 1 { ToolChoice::None } else { ToolChoice::Auto };
            if step == 2 {
                request.system = "a new \"system\" prompt".into();
            }
            if step == 3 {
                request.tools.push(ToolDefinition { name: "other".into(), ..tool.clone() });
            }
            assert_eq!(digests.digest(&request), request_digest(&request), "step {step}");
        }
    }

    #[test]
    fn kept_digests_equal_the_digest_from_scratch() {
        let mut digests = MessageDigests::default();
        let mut texts: Vec<String> = Vec::new();
        let check = |digests: &mut MessageDigests, texts: &[String]| {
            let request = request(texts);
            assert_eq!(digests.digest(&request), request_digest(&request), "{}", texts.len());
        };
        check(&mut digests, &texts);
        // Growing across block boundaries, one message at a time.
        for n in 0..(3 * BLOCK + 5) {
            texts.push(format!("m{n}"));
            check(&mut digests, &texts);
        }
        // Changes in place, in the first and a middle block, reported.
        for at in [0, BLOCK + 3, 2 * BLOCK] {
            texts[at] = format!("changed {at}");
            digests.changed(at);
            check(&mut digests, &texts);
        }
        // A shorter request (a compaction), then one replaced from index 10 on.
        texts.truncate(BLOCK + 1);
        digests.truncate(BLOCK + 1);
        check(&mut digests, &texts);
        texts.truncate(10);
        digests.truncate(10);
        texts.extend((0..BLOCK).map(|n| format!("new {n}")));
        check(&mut digests, &texts);
        texts.clear();
        digests.truncate(0);
        check(&mut digests, &texts);
    }

    #[test]
    fn digest_changes_with_any_part_of_the_request() {
        let two = ["a".to_owned(), "b".to_owned()];
        let base = request(&two);
        let mut other_system = base.clone();
        other_system.system = "t".into();
        let mut other_message = base.clone();
        other_message.messages[0] = Message::User { text: "x".into() };
        let many: Vec<String> = (0..=BLOCK).map(|n| n.to_string()).collect();
        let mut swapped = many.clone();
        swapped.swap(0, BLOCK);
        let digests = [
            &base,
            &other_system,
            &other_message,
            &request(&two[..1]),
            &request(&many),
            &request(&swapped),
        ]
        .map(request_digest);
        for (i, a) in digests.iter().enumerate() {
            for b in &digests[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
