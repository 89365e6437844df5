//! `edit_file`: replace an exact text in a file; it must match once unless `replace_all`.

use async_trait::async_trait;
use keel_contracts::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::json;

use crate::deny::Denied;
use crate::spec::{blocking, parse_arguments, workspace, write_spec};
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
                 is true; include enough surrounding lines to make it unique. The write is \
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
            let n_matches = content.matches(arguments.old.as_str()).count();
            let edited = match (n_matches, arguments.replace_all) {
                (0, _) => {
                    return ToolOutput::error(format!(
                        "`old` was not found in `{shown}`; it must match the file's text \
                         exactly, including whitespace and indentation (read the file again)"
                    ));
                }
                (1, _) => content.replacen(arguments.old.as_str(), &arguments.new, 1),
                (n, false) => {
                    return ToolOutput::error(format!(
                        "`old` matches {n} times in `{shown}`; include more surrounding text \
                         so it matches once, or set replace_all to replace every occurrence"
                    ));
                }
                (_, true) => content.replace(arguments.old.as_str(), &arguments.new),
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
