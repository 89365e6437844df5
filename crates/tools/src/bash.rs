//! `bash`: run a shell command in the workspace through keel-sandbox.
//!
//! The command runs as `bash -c COMMAND` in the workspace root, with stdin at end-of-file,
//! no controlling terminal and non-interactive defaults; its process group is killed when
//! the call ends (see keel-sandbox). In managed mode it runs contained (the workspace and a
//! private temporary directory writable, no network, protected git and keel paths
//! read-only), or not at all when containment cannot be enforced. Paths the session's deny
//! rules deny for reading are masked (empty, read-only) for the command, paths denied for
//! writing only are read-only; a denial that cannot be resolved or enforced refuses the
//! command.
//!
//! A command that ran is `ok` whatever its exit status, which the result states; bad
//! arguments, a sandbox refusal, a spawn failure or a timeout are `error`.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{ExactText, Outcome, Tool, ToolContext, ToolOutput, ToolSpec};
use keel_sandbox::{CommandOutput, CommandSpec, SandboxError, Termination};
use serde::Deserialize;
use serde_json::json;

use crate::spec::{parse_arguments, workspace, write_spec};

/// The timeout when the call gives no `timeout_ms`.
pub const DEFAULT_BASH_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest `timeout_ms` accepted.
pub const MAX_BASH_TIMEOUT: Duration = Duration::from_secs(600);
/// Bytes kept per output stream (head and tail). Large: the kernel shows the model a
/// preview and keeps the whole result in the ledger for `read_tool_result`.
const OUTPUT_CAP_BYTES: usize = 8 * 1024 * 1024;

/// The `bash` tool: `command`, `timeout_ms`?.
#[derive(Debug)]
pub struct Bash {
    spec: ToolSpec,
    /// Names of keel's environment variables a managed command inherits beyond the
    /// sandbox's allow-list (the user's `[shell] env`).
    inherit_env: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    command: String,
    timeout_ms: Option<u64>,
}

impl Bash {
    /// The tool with its declared spec.
    pub fn new() -> Bash {
        Bash {
            spec: write_spec(
                "bash",
                "Run a bash command in the workspace root and return its output and exit \
                 status. There is no stdin and no terminal: interactive prompts read end of \
                 file, so pass flags such as --yes. Background processes are killed when the \
                 command finishes. Output is capped (head and tail kept). Default timeout \
                 120000 ms, at most 600000 ms; on timeout the command is killed.",
                json!({
                    "type": "object",
                    "properties": {
                        "command": {
                            "type": "string",
                            "description": "The command line, run as `bash -c COMMAND`."
                        },
                        "timeout_ms": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 600_000,
                            "description": "Timeout in milliseconds (default 120000)."
                        }
                    },
                    "required": ["command"],
                    "additionalProperties": false
                }),
            ),
            inherit_env: Vec::new(),
        }
    }

    /// The tool, letting managed commands inherit the variables `names` (exact names, e.g.
    /// from the user's `[shell] env`) besides the sandbox's allow-list
    /// ([`keel_sandbox::INHERITED_ENV`], `LC_*`).
    pub fn with_inherited_env(names: Vec<String>) -> Bash {
        Bash { inherit_env: names, ..Bash::new() }
    }
}

impl Default for Bash {
    fn default() -> Self {
        Bash::new()
    }
}

#[async_trait]
impl Tool for Bash {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let arguments: Arguments = match parse_arguments("bash", arguments) {
            Ok(arguments) => arguments,
            Err(output) => return output,
        };
        if arguments.command.trim().is_empty() {
            return ToolOutput::error("command is empty");
        }
        let timeout = match arguments.timeout_ms {
            None => DEFAULT_BASH_TIMEOUT,
            Some(0) => return ToolOutput::error("timeout_ms must be at least 1"),
            Some(ms) if Duration::from_millis(ms) > MAX_BASH_TIMEOUT => {
                return ToolOutput::error(format!(
                    "timeout_ms {ms} is above the maximum of {}",
                    MAX_BASH_TIMEOUT.as_millis()
                ));
            }
            Some(ms) => Duration::from_millis(ms),
        };
        let workspace = match workspace(context) {
            Ok(workspace) => workspace,
            Err(output) => return output,
        };
        // The room the user granted this session through `request_boundary`.
        let boundary = keel_sandbox::Boundary {
            read: context.boundary.read.iter().map(PathBuf::from).collect(),
            write: context.boundary.write.iter().map(PathBuf::from).collect(),
            network: context.boundary.network,
        };
        // Paths denied for reading are masked inside the sandbox, resolved to what exists
        // now; a denial that cannot be resolved refuses the command.
        // Paths denied for writing only are read-only.
        let mut masks = Vec::new();
        for denied in [&context.denied_paths, &context.write_denied_paths] {
            if denied.is_empty() {
                masks.push(Vec::new());
                continue;
            }
            let root = workspace.root().to_owned();
            let denied = denied.clone();
            match tokio::task::spawn_blocking(move || crate::deny::resolve(&root, &denied)).await {
                Ok(Ok(paths)) => masks.push(paths),
                Ok(Err(reason)) => {
                    return ToolOutput::error(format!("sandbox refused: deny rules: {reason}"));
                }
                Err(error) => return ToolOutput::error(format!("sandbox refused: {error}")),
            }
        }
        let read_only = masks.pop().unwrap_or_default();
        let hidden = masks.pop().unwrap_or_default();
        let mut spec = CommandSpec::new("bash", workspace.root(), timeout);
        for name in &self.inherit_env {
            spec = spec.inherit_env(name);
        }
        let spec = spec
            .workspace(workspace.root())
            .boundary(&boundary)
            .deny_paths(hidden)
            .deny_writes(read_only)
            .arg("-c")
            .arg(&arguments.command)
            .output_cap_bytes(OUTPUT_CAP_BYTES);
        match keel_sandbox::run(&spec, context.sandbox).await {
            Ok(output) => render(&output),
            Err(
                error @ (SandboxError::Unenforceable { .. } | SandboxError::BoundaryPath { .. }),
            ) => ToolOutput::error(format!("sandbox refused: {error}")),
            Err(error) => ToolOutput::error(format!("could not run the command: {error}")),
        }
    }
}

fn render(output: &CommandOutput) -> ToolOutput {
    let mut text = ExactText::new();
    if let Termination::TimedOut { after } = output.termination {
        text.push_str(&format!(
            "command timed out after {} ms and was killed with its process group",
            after.as_millis()
        ));
        match &output.last_line {
            Some(line) => text.push_str(&format!("; last output line: {line}\n")),
            None => text.push_str("; it printed nothing\n"),
        }
    }
    push_stream(&mut text, None, &output.stdout.exact);
    push_stream(&mut text, Some("[stderr]"), &output.stderr.exact);
    for note in &output.notes {
        text.push_str(&format!("[{note}]\n"));
    }
    match output.termination {
        Termination::Exited { code } => text.push_str(&format!("[exit code {code}]")),
        Termination::Signaled { signal } => text.push_str(&format!("[killed by signal {signal}]")),
        Termination::TimedOut { .. } => {
            let output = ToolOutput::exact(Outcome::Error, text);
            return ToolOutput { content: output.content.trim_end().to_owned(), ..output };
        }
    }
    ToolOutput::exact(Outcome::Ok, text)
}

/// Appends one stream's captured text (its escapes and exact bytes) under its header.
fn push_stream(text: &mut ExactText, header: Option<&str>, stream: &ExactText) {
    if stream.is_empty() {
        return;
    }
    if let Some(header) = header {
        text.push_str(header);
        text.push_str("\n");
    }
    text.append(stream);
    if !stream.text().ends_with('\n') {
        text.push_str("\n");
    }
}
