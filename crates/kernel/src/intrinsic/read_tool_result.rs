//! `read_tool_result(handle, offset?, limit?)`: pages a recorded tool result by byte offset,
//! from the ledger (the full result is stored there).

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Access, Effects, Tool, ToolContext, ToolOutput, ToolSpec};

use super::{Carried, Intrinsic, IntrinsicCall};

/// `read_tool_result(handle, offset?, limit?)`.
pub(crate) fn read_tool_result() -> Arc<dyn Intrinsic> {
    Arc::new(ReadToolResult::new())
}

/// `read_tool_result`.
const READ_TOOL_RESULT: &str = "read_tool_result";
/// Default page size of `read_tool_result`, in bytes.
const DEFAULT_PAGE_BYTES: u64 = 8 * 1024;
/// Largest page of `read_tool_result`, in bytes.
const MAX_PAGE_BYTES: u64 = 16 * 1024;

/// `read_tool_result(handle, offset?, limit?)`: pages a recorded tool result by byte
/// offset. Carried out by the kernel from the ledger (the full result is stored there);
/// [`Tool::invoke`] is never reached.
#[derive(Debug)]
struct ReadToolResult {
    spec: ToolSpec,
}

impl ReadToolResult {
    fn new() -> ReadToolResult {
        ReadToolResult {
            spec: ToolSpec {
                name: READ_TOOL_RESULT.to_owned(),
                description: "Read part of an earlier tool result that was shown as a preview or \
                              pruned from the context, by byte offset. `handle` is the call id \
                              named in the preview."
                    .to_owned(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "handle": {"type": "string", "minLength": 1},
                        "offset": {"type": "integer", "minimum": 0},
                        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_BYTES}
                    },
                    "required": ["handle"],
                    "additionalProperties": false
                }),
                access: Access::Read,
                effects: Effects::LOCAL_READ,
                intrinsic: true,
                first_party: true,
            },
        }
    }
}

#[async_trait]
impl Tool for ReadToolResult {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error("error: read_tool_result is carried out by the kernel")
    }
}

#[async_trait]
impl Intrinsic for ReadToolResult {
    async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> crate::Result<Carried> {
        // Results covered by a compaction before the events held in memory are paged
        // from the store.
        let arguments = call.arguments();
        let handle = arguments.get("handle").and_then(|h| h.as_str());
        let output = match handle {
            Some(handle) if !holds_result(call.ledger.events(), handle) => {
                let found = call.ledger.last_tool_result(handle, READ_TOOL_RESULT).await?;
                page(found.as_deref().unwrap_or_default(), arguments)
            }
            _ => page(call.ledger.events(), arguments),
        };
        Ok(Carried::output(output))
    }
}

/// Whether `events` hold the recorded result of `handle` that [`page`] pages.
fn holds_result(events: &[keel_contracts::RuntimeEvent], handle: &str) -> bool {
    events.iter().rev().any(|event| {
        matches!(&event.kind, keel_contracts::EventKind::ToolResult { call_id, tool, .. }
            if call_id.as_str() == handle && tool != READ_TOOL_RESULT)
    })
}

/// Pages the recorded result of `handle` (a call id) out of `events`.
fn page(events: &[keel_contracts::RuntimeEvent], arguments: &serde_json::Value) -> ToolOutput {
    let handle = arguments.get("handle").and_then(|h| h.as_str()).unwrap_or_default();
    let offset = arguments.get("offset").and_then(serde_json::Value::as_u64).unwrap_or(0);
    let limit = arguments
        .get("limit")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(DEFAULT_PAGE_BYTES)
        .min(MAX_PAGE_BYTES);
    let found = events.iter().rev().find_map(|event| match &event.kind {
        keel_contracts::EventKind::ToolResult { call_id, content, tool, .. }
            if call_id.as_str() == handle && tool != READ_TOOL_RESULT =>
        {
            Some(content)
        }
        _ => None,
    });
    let Some(content) = found else {
        return ToolOutput::error(format!(
            "error: no recorded tool result has the handle '{handle}'"
        ));
    };
    let total = content.len();
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    if start >= total && total > 0 {
        return ToolOutput::error(format!(
            "error: offset {offset} is past the end ({total} bytes)"
        ));
    }
    let start = crate::projection::floor_char_boundary(content, start);
    let end = crate::projection::floor_char_boundary(
        content,
        start.saturating_add(usize::try_from(limit).unwrap_or(usize::MAX)),
    );
    let end =
        if end <= start { crate::projection::ceil_char_boundary(content, start + 1) } else { end };
    let more = if end < total {
        format!(" Next: read_tool_result {{\"handle\": \"{handle}\", \"offset\": {end}}}.")
    } else {
        " This is the end.".to_owned()
    };
    ToolOutput::ok(format!("[bytes {start}..{end} of {total}.{more}]\n{}", &content[start..end]))
}
