//! `edit_file`: replace an exact text in a file; it must match once unless `replace_all`.
//!
//! Matching is exact except for line endings: `old` written with `\n` matches a CRLF
//! file, and `new` is written with the endings of the text it replaces, so a CRLF file
//! stays CRLF (and a mixed one keeps each region's ending). Tabs, look-alike characters and
//! every other byte are matched and written as they are. When `old` is not found, the error
//! shows the file's closest lines with their invisible bytes made visible.

use async_trait::async_trait;
use keel_contracts::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::json;

use crate::deny::Denied;
use crate::spec::{blocking, parse_arguments, workspace, write_spec};
use crate::visible::{LineEndings, closest_line, lookalikes_in_line, make_visible};
use crate::write_file::write_atomically;

/// The `edit_file` tool: `path`, `old`, `new`, `replace_all`?.
#[derive(Debug)]
pub struct EditFile {
    spec: ToolSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    path: String,
    old: String,
    new: String,
    #[serde(default)]
    replace_all: bool,
}

impl EditFile {
    /// The tool with its declared spec.
    pub fn new() -> EditFile {
        EditFile {
            spec: write_spec(
                "edit_file",
                "Replace text in an existing file. `old` must match the file's text exactly \
                 (whitespace and indentation included) and exactly once, unless replace_all \
                 is true; include enough surrounding lines to make it unique. Line endings \
                 may be written as \\n: a CRLF file keeps its CRLF endings. The write is \
                 atomic.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {
                            "type": "string",
                            "description": "File path, relative to the workspace root or absolute inside it."
                        },
                        "old": {
                            "type": "string",
                            "description": "The exact text to replace (not empty)."
                        },
                        "new": {
                            "type": "string",
                            "description": "The replacement text."
                        },
                        "replace_all": {
                            "type": "boolean",
                            "description": "Replace every occurrence instead of exactly one (default false)."
                        }
                    },
                    "required": ["path", "old", "new"],
                    "additionalProperties": false
                }),
            ),
        }
    }
}

impl Default for EditFile {
    fn default() -> Self {
        EditFile::new()
    }
}

#[async_trait]
impl Tool for EditFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let arguments: Arguments = match parse_arguments("edit_file", arguments) {
            Ok(arguments) => arguments,
            Err(output) => return output,
        };
        let workspace = match workspace(context) {
            Ok(workspace) => workspace,
            Err(output) => return output,
        };
        if arguments.old.is_empty() {
            return ToolOutput::error(
                "`old` is empty; use write_file to create or replace a whole file",
            );
        }
        if arguments.old == arguments.new {
            return ToolOutput::error("`old` and `new` are the same; nothing to change");
        }
        let denied = Denied::new(workspace.root(), context);
        blocking(move || {
            let shown = &arguments.path;
            let path = match workspace.resolve_writable(shown) {
                Ok(path) => path,
                Err(error) => return ToolOutput::error(error.to_string()),
            };
            if let Some(refusal) = denied.refusal(&path, shown) {
                return refusal;
            }
            if !path.is_file() {
                return ToolOutput::error(format!("`{shown}` is not an existing file"));
            }
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(error) => return ToolOutput::error(format!("cannot read `{shown}`: {error}")),
            };
            let Ok(content) = String::from_utf8(bytes) else {
                return ToolOutput::error(format!(
                    "`{shown}` is not UTF-8 text; edit_file edits text only"
                ));
            };
            let edit = Edit::new(&content, &arguments.old, &arguments.new);
            let n_matches = edit.n_matches();
            let edited = match (n_matches, arguments.replace_all) {
                (0, _) => return ToolOutput::error(not_found(shown, &content, &arguments.old)),
                (1, _) => edit.apply(1),
                (n, false) => {
                    return ToolOutput::error(format!(
                        "`old` matches {n} times in `{shown}`; include more surrounding text \
                         so it matches once, or set replace_all to replace every occurrence"
                    ));
                }
                (n, true) => edit.apply(n),
            };
            match write_atomically(&path, edited.as_bytes()) {
                Ok(()) => ToolOutput::ok(format!(
                    "replaced {n_matches} occurrence{} in `{shown}`",
                    if n_matches == 1 { "" } else { "s" }
                )),
                Err(error) => ToolOutput::error(format!("cannot write `{shown}`: {error}")),
            }
        })
        .await
    }
}

/// An edit planned over the file's text with its CRLF endings seen as `\n`.
struct Edit<'a> {
    content: &'a str,
    /// For each byte offset of `normalized` (and its end), the offset in `content`; the
    /// `\n` of a CRLF maps to its `\r`, so a match that takes the ending takes both bytes.
    offsets: Vec<usize>,
    /// Where `old` matches in `normalized`, as (start, end) byte offsets.
    matches: Vec<(usize, usize)>,
    /// `new` with its `\r\n` as `\n`.
    new: String,
    /// The file's own endings, for a match that has none.
    endings: LineEndings,
}

impl<'a> Edit<'a> {
    fn new(content: &'a str, old: &str, new: &str) -> Edit<'a> {
        let bytes = content.as_bytes();
        let mut normalized = String::with_capacity(content.len());
        let mut offsets = Vec::with_capacity(content.len() + 1);
        let mut start = 0;
        for (index, character) in content.char_indices() {
            if character == '\r' && bytes.get(index + 1) == Some(&b'\n') {
                start = index;
                continue;
            }
            let origin = if character == '\n' && index > 0 && bytes[index - 1] == b'\r' {
                start
            } else {
                index
            };
            for _ in 0..character.len_utf8() {
                offsets.push(origin);
            }
            // Matches never start or end inside a character, so the entries of a
            // character's continuation bytes are never read.
            normalized.push(character);
        }
        offsets.push(content.len());
        let old = old.replace("\r\n", "\n");
        let matches = normalized
            .match_indices(old.as_str())
            .map(|(start, matched)| (start, start + matched.len()))
            .collect();
        Edit {
            content,
            offsets,
            matches,
            new: new.replace("\r\n", "\n"),
            endings: LineEndings::of(content.as_bytes()),
        }
    }

    fn n_matches(&self) -> usize {
        self.matches.len()
    }

    /// The content with the first `n` matches replaced.
    fn apply(&self, n: usize) -> String {
        let mut edited = String::with_capacity(self.content.len() + self.new.len());
        let mut copied = 0;
        for (start, end) in self.matches.iter().take(n) {
            let (start, end) = (self.offsets[*start], self.offsets[*end]);
            edited.push_str(&self.content[copied..start]);
            let region = LineEndings::of(&self.content.as_bytes()[start..end]);
            let crlf = match (region.crlf, region.lf) {
                (0, 0) => self.endings.crlf > self.endings.lf,
                (crlf, lf) => crlf >= lf,
            };
            if crlf {
                edited.push_str(&self.new.replace('\n', "\r\n"));
            } else {
                edited.push_str(&self.new);
            }
            copied = end;
        }
        edited.push_str(&self.content[copied..]);
        edited
    }
}

/// Lines of the file shown at most when `old` is not found.
const MAX_CLOSEST_LINES: usize = 3;

/// The error for an `old` that is not in the file: the closest lines, their bytes visible.
fn not_found(shown: &str, content: &str, old: &str) -> String {
    let mut message = format!(
        "`old` was not found in `{shown}`; it must match the file's text exactly, including \
         whitespace, indentation and look-alike characters (line endings may be plain \\n)"
    );
    let old = old.replace("\r\n", "\n");
    let old_lines: Vec<&str> = old.split('\n').collect();
    let Some((first_index, first_line)) =
        old_lines.iter().enumerate().find(|(_, line)| !line.trim().is_empty())
    else {
        return message;
    };
    // Each file line keeps its `\r`, so a CRLF shows as `\r` at the line's end.
    let lines: Vec<&str> = content.split('\n').collect();
    let Some((closest, _)) = closest_line(&lines, first_line) else {
        message.push_str("; no line of the file is close to it (read the file again)");
        return message;
    };
    let start = closest.saturating_sub(first_index);
    let n_lines = old_lines.len().clamp(1, MAX_CLOSEST_LINES);
    message.push_str(
        ".\nThe closest lines in the file (tabs as \\t, CR as \\r, look-alikes as \\u{XXXX}):\n",
    );
    let mut lookalikes = Vec::new();
    for (index, line) in lines.iter().enumerate().skip(start).take(n_lines) {
        let line_number = index as u64 + 1;
        message.push_str(&format!("{line_number:>6}\t{}\n", make_visible(line)));
        lookalikes.extend(lookalikes_in_line(line, line_number));
    }
    message.push_str(&format!(
        "`old` line {} is:\n      \t{}",
        first_index + 1,
        make_visible(first_line)
    ));
    if !lookalikes.is_empty() {
        let described: Vec<String> = lookalikes.iter().map(|found| found.describe()).collect();
        message.push_str(&format!("\nThe file has {}", described.join(", ")));
    }
    let old_lookalikes = lookalikes_in_line(first_line, first_index as u64 + 1);
    if !old_lookalikes.is_empty() {
        let described: Vec<String> = old_lookalikes
            .iter()
            .map(|found| found.describe().replacen("at line", "at `old` line", 1))
            .collect();
        message.push_str(&format!("\n`old` has {}", described.join(", ")));
    }
    message
}
