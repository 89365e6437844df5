//! `read_file`: a text file's lines, numbered like `cat -n`.
//!
//! Bytes that are not UTF-8 text are shown escaped and kept exact in the result's raw
//! bytes (see [`keel_contracts::ExactText`]); lines are read whole, so a page boundary never
//! splits a character. A last line notes CRLF endings and look-alike characters.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use async_trait::async_trait;
use keel_contracts::{ExactText, Outcome, Tool, ToolContext, ToolOutput, ToolSpec, prefix_chars};
use serde::Deserialize;
use serde_json::json;

use crate::deny::Denied;
use crate::spec::{blocking, parse_arguments, read_spec, workspace};
use crate::visible::{LineEndings, file_note, lookalikes_in_line};

/// Lines shown when the call gives no `limit`.
const DEFAULT_LIMIT: u64 = 2000;
/// Characters kept of one line.
const MAX_LINE_CHARS: usize = 2000;
/// Output size at which reading stops, with a note saying where to continue.
const MAX_OUTPUT_BYTES: usize = 256 * 1024;
/// Look-alike characters located by line and column in one result; the rest are counted.
const MAX_LOOKALIKES_KEPT: usize = 64;
/// Bytes inspected for a NUL byte to tell a binary file.
const BINARY_SNIFF_BYTES: usize = 8 * 1024;

/// The `read_file` tool: `path`, `offset`? (1-based first line), `limit`? (lines).
#[derive(Debug)]
pub struct ReadFile {
    spec: ToolSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    path: String,
    offset: Option<u64>,
    limit: Option<u64>,
}

impl ReadFile {
    /// The tool with its declared spec.
    pub fn new() -> ReadFile {
        ReadFile {
            spec: read_spec(
                "read_file",
                "Read a text file in the workspace. Returns its lines numbered like `cat -n` \
                 (number, tab, text). Use offset (1-based line number) and limit (number of \
                 lines, default 2000) to page through long files. Binary files are refused. Bytes \
                 that are not UTF-8 text are shown as \\xNN escapes; a last line notes CRLF \
                 line endings and look-alike characters (such as U+00A0 NO-BREAK SPACE).",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {
                            "type": "string",
                            "description": "File path, relative to the workspace root or absolute inside it."
                        },
                        "offset": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "1-based line number to start at (default 1)."
                        },
                        "limit": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Maximum number of lines to return (default 2000)."
                        }
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
            ),
        }
    }
}

impl Default for ReadFile {
    fn default() -> Self {
        ReadFile::new()
    }
}

#[async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let arguments: Arguments = match parse_arguments("read_file", arguments) {
            Ok(arguments) => arguments,
            Err(output) => return output,
        };
        let workspace = match workspace(context) {
            Ok(workspace) => workspace,
            Err(output) => return output,
        };
        let offset = arguments.offset.unwrap_or(1);
        let limit = arguments.limit.unwrap_or(DEFAULT_LIMIT);
        if offset == 0 || limit == 0 {
            return ToolOutput::error("offset and limit must be at least 1");
        }
        let denied = Denied::new(workspace.root(), context);
        blocking(move || {
            let path = match workspace.resolve(&arguments.path) {
                Ok(path) => path,
                Err(error) => return ToolOutput::error(error.to_string()),
            };
            if let Some(refusal) = denied.refusal(&path, &arguments.path) {
                return refusal;
            }
            read_lines(&path, &arguments.path, offset, limit)
        })
        .await
    }
}

fn read_lines(path: &Path, shown: &str, offset: u64, limit: u64) -> ToolOutput {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) => return ToolOutput::error(format!("cannot read `{shown}`: {error}")),
    };
    if metadata.is_dir() {
        return ToolOutput::error(format!("`{shown}` is a directory; use list_dir"));
    }
    if !metadata.is_file() {
        return ToolOutput::error(format!("`{shown}` is not a regular file"));
    }
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) => return ToolOutput::error(format!("cannot read `{shown}`: {error}")),
    };
    let mut reader = BufReader::new(file);

    let mut sniff = Vec::with_capacity(BINARY_SNIFF_BYTES);
    if let Err(error) = reader.by_ref().take(BINARY_SNIFF_BYTES as u64).read_to_end(&mut sniff) {
        return ToolOutput::error(format!("cannot read `{shown}`: {error}"));
    }
    if sniff.contains(&0) {
        return ToolOutput::error(format!(
            "`{shown}` is a binary file (it has a NUL byte in its first {BINARY_SNIFF_BYTES} \
             bytes); read_file shows text files only"
        ));
    }
    let mut reader = BufReader::new(sniff.as_slice().chain(reader));

    let mut output = ExactText::new();
    let mut line = Vec::new();
    let mut line_number: u64 = 0;
    let mut endings = LineEndings::default();
    let mut lookalikes = Vec::new();
    let mut n_more_lookalikes: u64 = 0;
    let mut trailer = None;
    let last_wanted = offset.saturating_add(limit - 1);
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => return ToolOutput::error(format!("cannot read `{shown}`: {error}")),
        }
        line_number += 1;
        if line_number < offset {
            continue;
        }
        if line_number > last_wanted {
            trailer = Some(format!("[more lines follow; continue with offset={line_number}]\n"));
            break;
        }
        if output.len() >= MAX_OUTPUT_BYTES {
            trailer = Some(format!(
                "[output capped at {MAX_OUTPUT_BYTES} bytes; continue with offset={line_number}]\n"
            ));
            break;
        }
        endings.count_line(&line);
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let kept = prefix_chars(text, MAX_LINE_CHARS);
        if let Ok(valid) = std::str::from_utf8(kept) {
            for found in lookalikes_in_line(valid, line_number) {
                if lookalikes.len() < MAX_LOOKALIKES_KEPT {
                    lookalikes.push(found);
                } else {
                    n_more_lookalikes += 1;
                }
            }
        }
        output.push_str(&format!("{line_number:>6}\t"));
        output.push_bytes(kept);
        if kept.len() < text.len() {
            output.push_str("… [line truncated]");
        }
        output.push_str("\n");
    }
    if line_number == 0 {
        return ToolOutput::ok(format!("(`{shown}` is empty)"));
    }
    if line_number < offset {
        return ToolOutput::error(format!(
            "offset {offset} is past the end of `{shown}`, which has {line_number} lines"
        ));
    }
    if let Some(trailer) = trailer {
        output.push_str(&trailer);
    }
    if let Some(note) = file_note(endings, &lookalikes, n_more_lookalikes) {
        output.push_str(&note);
    }
    ToolOutput::exact(Outcome::Ok, output)
}
