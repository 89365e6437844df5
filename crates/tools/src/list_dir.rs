//! `list_dir`: the entries of one folder, without following links.

use async_trait::async_trait;
use keel_contracts::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::json;

use crate::deny::Denied;
use crate::spec::{blocking, parse_arguments, read_spec, workspace};

/// Entries listed at most; the rest are counted.
const MAX_ENTRIES: usize = 1000;

/// The `list_dir` tool: `path`.
#[derive(Debug)]
pub struct ListDir {
    spec: ToolSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    path: String,
}

impl ListDir {
    /// The tool with its declared spec.
    pub fn new() -> ListDir {
        ListDir {
            spec: read_spec(
                "list_dir",
                "List a folder's entries, sorted by name: folders end with `/`, symbolic \
                 links show `name -> target`. Hidden and ignored entries are included. Use \
                 `.` for the workspace root.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {
                            "type": "string",
                            "description": "Folder path, relative to the workspace root or absolute inside it."
                        }
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
            ),
        }
    }
}

impl Default for ListDir {
    fn default() -> Self {
        ListDir::new()
    }
}

#[async_trait]
impl Tool for ListDir {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let arguments: Arguments = match parse_arguments("list_dir", arguments) {
            Ok(arguments) => arguments,
            Err(output) => return output,
        };
        let workspace = match workspace(context) {
            Ok(workspace) => workspace,
            Err(output) => return output,
        };
        let denied = Denied::new(workspace.root(), context);
        blocking(move || {
            let path = match workspace.resolve(&arguments.path) {
                Ok(path) => path,
                Err(error) => return ToolOutput::error(error.to_string()),
            };
            let shown = &arguments.path;
            if let Some(refusal) = denied.refusal(&path, shown) {
                return refusal;
            }
            if !path.is_dir() {
                return ToolOutput::error(format!("`{shown}` is not a folder"));
            }
            let reader = match std::fs::read_dir(&path) {
                Ok(reader) => reader,
                Err(error) => return ToolOutput::error(format!("cannot list `{shown}`: {error}")),
            };
            let mut entries: Vec<(String, String)> = Vec::new();
            for entry in reader {
                let entry = match entry {
                    Ok(entry) => entry,
                    Err(error) => {
                        return ToolOutput::error(format!("cannot list `{shown}`: {error}"));
                    }
                };
                if denied.covers(&entry.path()) {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                // DirEntry::file_type does not follow links.
                let line = match entry.file_type() {
                    Ok(file_type) if file_type.is_dir() => format!("{name}/"),
                    Ok(file_type) if file_type.is_symlink() => {
                        match std::fs::read_link(entry.path()) {
                            Ok(target) => format!("{name} -> {}", target.to_string_lossy()),
                            Err(_) => format!("{name} -> ?"),
                        }
                    }
                    _ => name.clone(),
                };
                entries.push((name, line));
            }
            if entries.is_empty() {
                return ToolOutput::ok(format!("(`{shown}` is empty)"));
            }
            entries.sort();
            let n_total = entries.len();
            let mut output: String =
                entries.into_iter().take(MAX_ENTRIES).map(|(_, line)| line + "\n").collect();
            if n_total > MAX_ENTRIES {
                output.push_str(&format!("[{} more entries not shown]\n", n_total - MAX_ENTRIES));
            }
            ToolOutput::ok(output)
        })
        .await
    }
}
