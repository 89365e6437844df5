//! The digest recorded as `request_sha256` in `model_requested`: a chained digest, so a
//! step hashes what changed since the previous request instead of the whole request.
//!
//! Definition (docs/decisions.md, issue #13), over hex SHA-256 strings:
//! - `head = sha256(JSON of the request with an empty messages list)`;
//! - `m_0 = sha256("")`, `m_i = sha256(m_{i-1} ++ "\n" ++ JSON of message i)`;
//! - `request_sha256 = sha256(head ++ "\n" ++ m_n)`.
//!
//! It depends on the request alone ([`request_digest`] recomputes it from scratch);
//! [`RequestDigests`] gives the same value while hashing only the messages after the
//! longest prefix shared with the previous request.

use keel_contracts::{Message, ModelRequest, sha256_hex};

/// `sha256("")`, the chain's start.
fn chain_start() -> String {
    sha256_hex(b"")
}

fn link(previous: &str, message: &Message) -> String {
    let mut bytes = Vec::with_capacity(previous.len() + 256);
    bytes.extend_from_slice(previous.as_bytes());
    bytes.push(b'\n');
    // Serializing a `Message` cannot fail (string keys, no maps with non-string keys).
    let _ = serde_json::to_writer(&mut bytes, message);
    sha256_hex(&bytes)
}

fn head_digest(request: &ModelRequest) -> String {
    let head = ModelRequest {
        model: request.model.clone(),
        system: request.system.clone(),
        messages: Vec::new(),
        tools: request.tools.clone(),
        tool_choice: request.tool_choice,
        responses_in_session: request.responses_in_session,
        purpose: request.purpose,
    };
    sha256_hex(serde_json::to_string(&head).unwrap_or_default().as_bytes())
}

fn combine(head: &str, messages: &str) -> String {
    sha256_hex(format!("{head}\n{messages}").as_bytes())
}

/// The request's digest, computed from scratch (see the module docs).
pub fn request_digest(request: &ModelRequest) -> String {
    let mut chain = chain_start();
    for message in &request.messages {
        chain = link(&chain, message);
    }
    combine(&head_digest(request), &chain)
}

/// The links of a request's messages, kept between requests by a caller that knows which
/// messages changed (the incremental projection, [`crate::context::IncrementalContext`]):
/// `link(i)` is `m_{i+1}` of the module docs.
#[derive(Debug, Default, Clone)]
pub struct MessageChain {
    links: Vec<String>,
}

impl MessageChain {
    /// Messages whose links are kept.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether no link is kept.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Forgets the links of the messages at index `len` and after (they changed).
    pub fn truncate(&mut self, len: usize) {
        self.links.truncate(len);
    }

    /// The digest of `request`, equal to [`request_digest`]'s provided the request's first
    /// [`MessageChain::len`] messages are those the kept links were made from (the caller's
    /// promise: it truncates the chain at every message it changes). Hashes only the
    /// messages after those.
    pub fn digest(&mut self, request: &ModelRequest) -> String {
        self.links.truncate(request.messages.len());
        for message in &request.messages[self.links.len()..] {
            let next = match self.links.last() {
                Some(previous) => link(previous, message),
                None => link(&chain_start(), message),
            };
            self.links.push(next);
        }
        let chain = self.links.last().cloned().unwrap_or_else(chain_start);
        combine(&head_digest(request), &chain)
    }
}

/// The previous request's messages and their chain, to digest the next request
/// incrementally. The value is always equal to [`request_digest`]'s.
#[derive(Debug, Default)]
pub struct RequestDigests {
    messages: Vec<Message>,
    chain: MessageChain,
}

impl RequestDigests {
    /// The digest of `request`; hashes only the messages after the prefix it shares with
    /// the previous request given here (comparing the shared prefix is a memory compare).
    pub fn digest(&mut self, request: &ModelRequest) -> String {
        let shared = self
            .messages
            .iter()
            .zip(&request.messages)
            .take_while(|(before, now)| before == now)
            .count();
        self.messages.truncate(shared);
        self.chain.truncate(shared);
        self.messages.extend_from_slice(&request.messages[shared..]);
        self.chain.digest(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_contracts::{RequestPurpose, ToolChoice};

    fn request(texts: &[&str]) -> ModelRequest {
        ModelRequest {
            model: "m".into(),
            system: "s".into(),
            messages: texts.iter().map(|text| Message::User { text: (*text).into() }).collect(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            responses_in_session: 0,
            purpose: RequestPurpose::Conversation,
        }
    }

    #[test]
    fn incremental_digest_equals_the_digest_from_scratch() {
        let mut digests = RequestDigests::default();
        for texts in [
            vec!["a"],
            vec!["a", "b"],
            vec!["a", "b", "c"],
            // A pruned (changed) earlier message, then a shorter request (a compaction).
            vec!["a", "B", "c", "d"],
            vec!["z"],
            vec![],
        ] {
            let request = request(&texts);
            assert_eq!(digests.digest(&request), request_digest(&request), "{texts:?}");
        }
    }

    #[test]
    fn digest_changes_with_any_part_of_the_request() {
        let base = request(&["a", "b"]);
        let mut other_system = base.clone();
        other_system.system = "t".into();
        let mut other_message = base.clone();
        other_message.messages[0] = Message::User { text: "x".into() };
        let digests = [&base, &other_system, &other_message, &request(&["a"])].map(request_digest);
        for (i, a) in digests.iter().enumerate() {
            for b in &digests[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
