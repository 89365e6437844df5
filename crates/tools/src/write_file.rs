//! `write_file`: create or replace a file atomically, creating parent folders.

use std::fs::Permissions;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use async_trait::async_trait;
use keel_contracts::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::json;

use crate::deny::Denied;
use crate::spec::{blocking, parse_arguments, workspace, write_spec};

/// The `write_file` tool: `path`, `content`.
#[derive(Debug)]
pub struct WriteFile {
    spec: ToolSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    path: String,
    content: String,
}

impl WriteFile {
    /// The tool with its declared spec.
    pub fn new() -> WriteFile {
        WriteFile {
            spec: write_spec(
                "write_file",
                "Create a file or replace its whole content. Parent folders are created. \
                 The write is atomic: readers see the old or the new content, never a mix. \
                 Prefer edit_file to change part of an existing file.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {
                            "type": "string",
                            "description": "File path, relative to the workspace root or absolute inside it."
                        },
                        "content": {
                            "type": "string",
                            "description": "The complete new content of the file."
                        }
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false
                }),
            ),
        }
    }
}

impl Default for WriteFile {
    fn default() -> Self {
        WriteFile::new()
    }
}

#[async_trait]
impl Tool for WriteFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let arguments: Arguments = match parse_arguments("write_file", arguments) {
            Ok(arguments) => arguments,
            Err(output) => return output,
        };
        let workspace = match workspace(context) {
            Ok(workspace) => workspace,
            Err(output) => return output,
        };
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
            if path.is_dir() {
                return ToolOutput::error(format!("`{shown}` is a folder"));
            }
            let existed = path.exists();
            if let Some(parent) = path.parent()
                && let Err(error) = std::fs::create_dir_all(parent)
            {
                return ToolOutput::error(format!(
                    "cannot create the folders for `{shown}`: {error}"
                ));
            }
            // Creating the folders may have raced with a link swap; check again.
            if let Err(error) = workspace.resolve_writable(shown) {
                return ToolOutput::error(error.to_string());
            }
            match write_atomically(&path, arguments.content.as_bytes()) {
                Ok(()) => ToolOutput::ok(format!(
                    "{} `{shown}` ({} bytes)",
                    if existed { "replaced" } else { "created" },
                    arguments.content.len()
                )),
                Err(error) => ToolOutput::error(format!("cannot write `{shown}`: {error}")),
            }
        })
        .await
    }
}

/// Writes `content` to a temporary file beside `path`, then renames it over `path`.
///
/// An existing file keeps its permissions; a new one gets mode 0644. The rename replaces
/// a symbolic link at `path` rather than writing through it.
pub(crate) fn write_atomically(path: &Path, content: &[u8]) -> io::Result<()> {
    let parent = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent folder"))?;
    let permissions = match std::fs::metadata(path) {
        Ok(metadata) => metadata.permissions(),
        Err(_) => Permissions::from_mode(0o644),
    };
    let mut temp = tempfile::Builder::new()
        .prefix(".keel-write-")
        .permissions(permissions)
        .tempfile_in(parent)?;
    temp.write_all(content)?;
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|error| error.error)?;
    Ok(())
}
