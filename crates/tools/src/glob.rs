//! `glob`: files whose path matches a pattern, respecting `.gitignore`.

use async_trait::async_trait;
use keel_contracts::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::json;

use crate::deny::Denied;
use crate::spec::{blocking, parse_arguments, read_spec, workspace};
use crate::walk::{compile_glob, walk};

/// Matches listed at most; the rest are counted.
const MAX_RESULTS: usize = 1000;

/// The `glob` tool: `pattern`, `path`? (the folder to search, default the root).
#[derive(Debug)]
pub struct Glob {
    spec: ToolSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    pattern: String,
    path: Option<String>,
}

impl Glob {
    /// The tool with its declared spec.
    pub fn new() -> Glob {
        Glob {
            spec: read_spec(
                "glob",
                "Find files by path pattern, e.g. `**/*.rs` or `src/*.toml`. `*` and `?` stay \
                 within one folder, `**` spans folders. Files ignored by .gitignore are left \
                 out and symbolic links are not followed. Returns workspace-relative paths, \
                 sorted, at most 1000.",
                json!({
                    "type": "object",
                    "properties": {
                        "pattern": {
                            "type": "string",
                            "description": "Glob pattern relative to `path`."
                        },
                        "path": {
                            "type": "string",
                            "description": "Folder to search in (default: the workspace root)."
                        }
                    },
                    "required": ["pattern"],
                    "additionalProperties": false
                }),
            ),
        }
    }
}

impl Default for Glob {
    fn default() -> Self {
        Glob::new()
    }
}

#[async_trait]
impl Tool for Glob {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let arguments: Arguments = match parse_arguments("glob", arguments) {
            Ok(arguments) => arguments,
            Err(output) => return output,
        };
        let workspace = match workspace(context) {
            Ok(workspace) => workspace,
            Err(output) => return output,
        };
        let matcher = match compile_glob(&arguments.pattern) {
            Ok(matcher) => matcher,
            Err(reason) => return ToolOutput::error(reason),
        };
        let denied = Denied::new(workspace.root(), context);
        blocking(move || {
            let raw_root = arguments.path.as_deref().unwrap_or(".");
            let root = match workspace.resolve(raw_root) {
                Ok(root) => root,
                Err(error) => return ToolOutput::error(error.to_string()),
            };
            if let Some(refusal) = denied.refusal(&root, raw_root) {
                return refusal;
            }
            if !root.is_dir() {
                return ToolOutput::error(format!("`{raw_root}` is not a folder"));
            }
            let mut matches = Vec::new();
            let mut n_more = 0_usize;
            let mut n_unreadable = 0_usize;
            for entry in walk(&root, &denied) {
                let Ok(entry) = entry else {
                    n_unreadable += 1;
                    continue;
                };
                if entry.file_type().is_none_or(|file_type| file_type.is_dir()) {
                    continue;
                }
                let Ok(relative) = entry.path().strip_prefix(&root) else { continue };
                if !matcher.is_match(relative) {
                    continue;
                }
                if matches.len() < MAX_RESULTS {
                    matches.push(workspace.display(entry.path()));
                } else {
                    n_more += 1;
                }
            }
            if matches.is_empty() {
                return ToolOutput::ok(format!("no files match `{}`", arguments.pattern));
            }
            let mut output = matches.join("\n");
            output.push('\n');
            if n_more > 0 {
                output
                    .push_str(&format!("[{n_more} more matches not shown; narrow the pattern]\n"));
            }
            if n_unreadable > 0 {
                output.push_str(&format!("[{n_unreadable} entries could not be read]\n"));
            }
            ToolOutput::ok(output)
        })
        .await
    }
}
