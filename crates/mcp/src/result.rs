//! A `tools/call` result as the text the model sees.

use keel_contracts::Outcome;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};

/// The outcome and unfenced text of a result: text blocks as they are, other blocks as a
/// one-line summary (`[image: image/png, 68 bytes]`), joined by newlines; with no content
/// blocks, the structured content as JSON. `isError: true` is [`Outcome::Error`].
pub(crate) fn render(result: &CallToolResult) -> (Outcome, String) {
    let outcome = if result.is_error == Some(true) { Outcome::Error } else { Outcome::Ok };
    let (for_model, user_only): (Vec<&ContentBlock>, Vec<&ContentBlock>) =
        result.content.iter().partition(|block| !for_the_user_only(block));
    let mut parts: Vec<String> = for_model.into_iter().map(render_block).collect();
    if !user_only.is_empty() {
        parts.push(format!(
            "[{} content block(s) marked for the user only (audience: user) left out]",
            user_only.len()
        ));
    }
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    if parts.is_empty() {
        parts.push("(no content)".to_owned());
    }
    (outcome, parts.join("\n"))
}

/// Whether a block's `annotations.audience` names the user and not the assistant: such
/// content is for the person, not the model.
fn for_the_user_only(block: &ContentBlock) -> bool {
    let Ok(value) = serde_json::to_value(block) else { return false };
    let Some(audience) = value["annotations"]["audience"].as_array() else { return false };
    audience.iter().any(|role| role == "user") && !audience.iter().any(|role| role == "assistant")
}

fn render_block(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => {
            format!("[image: {}, {} bytes]", image.mime_type, base64_len(&image.data))
        }
        ContentBlock::Audio(audio) => {
            format!("[audio: {}, {} bytes]", audio.mime_type, base64_len(&audio.data))
        }
        ContentBlock::Resource(embedded) => match &embedded.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                format!("[resource: {uri}]\n{text}")
            }
            ResourceContents::BlobResourceContents { uri, mime_type, blob, .. } => format!(
                "[resource: {uri}, {}, {} bytes]",
                mime_type.as_deref().unwrap_or("application/octet-stream"),
                base64_len(blob)
            ),
            // A variant newer than this code: say so rather than guess.
            #[allow(unreachable_patterns)]
            _ => "[resource]".to_owned(),
        },
        ContentBlock::ResourceLink(link) => {
            format!("[resource link: {} ({})]", link.uri, link.name)
        }
        // `ContentBlock` is non-exhaustive: a newer block kind is summarized by its type.
        #[allow(unreachable_patterns)]
        other => match serde_json::to_value(other) {
            Ok(value) => format!("[{} content]", value["type"].as_str().unwrap_or("unknown")),
            Err(_) => "[unknown content]".to_owned(),
        },
    }
}

/// The decoded size of base64 `data`, without decoding it.
fn base64_len(data: &str) -> usize {
    let digits = data.bytes().filter(|b| !b.is_ascii_whitespace() && *b != b'=').count();
    digits * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(json: serde_json::Value) -> CallToolResult {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn results_table() {
        let cases = [
            (
                serde_json::json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
                Outcome::Ok,
                "a\nb",
            ),
            (
                serde_json::json!({"content": [{"type": "text", "text": "bad"}], "isError": true}),
                Outcome::Error,
                "bad",
            ),
            (
                serde_json::json!({"content": [{"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]}),
                Outcome::Ok,
                "[image: image/png, 8 bytes]",
            ),
            (
                serde_json::json!({"content": [{"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}]}),
                Outcome::Ok,
                "[audio: audio/wav, 3 bytes]",
            ),
            (
                serde_json::json!({"content": [{"type": "resource", "resource": {"uri": "file:///a", "text": "hi"}}]}),
                Outcome::Ok,
                "[resource: file:///a]\nhi",
            ),
            (
                serde_json::json!({"content": [{"type": "resource", "resource": {"uri": "file:///b", "blob": "AAAAAA==", "mimeType": "application/gzip"}}]}),
                Outcome::Ok,
                "[resource: file:///b, application/gzip, 4 bytes]",
            ),
            (
                serde_json::json!({"content": [{"type": "resource_link", "uri": "file:///c", "name": "c"}]}),
                Outcome::Ok,
                "[resource link: file:///c (c)]",
            ),
            (
                serde_json::json!({"content": [], "structuredContent": {"sum": 3}}),
                Outcome::Ok,
                "{\"sum\":3}",
            ),
            (serde_json::json!({"content": []}), Outcome::Ok, "(no content)"),
            (
                serde_json::json!({"content": [
                    {"type": "text", "text": "for both", "annotations": {"audience": ["user", "assistant"]}},
                    {"type": "text", "text": "secret plan", "annotations": {"audience": ["user"]}},
                    {"type": "text", "text": "model", "annotations": {"audience": ["assistant"]}}
                ]}),
                Outcome::Ok,
                "for both\nmodel\n[1 content block(s) marked for the user only (audience: user) left out]",
            ),
        ];
        for (json, outcome, text) in cases {
            assert_eq!(render(&result(json.clone())), (outcome, text.to_owned()), "{json}");
        }
    }
}
