//! `grep`: lines matching a regular expression, as `path:line:text`.

use std::path::Path;

use async_trait::async_trait;
use globset::GlobMatcher;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::Bytes;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use keel_contracts::{ExactText, Outcome, Tool, ToolContext, ToolOutput, ToolSpec, prefix_chars};
use serde::Deserialize;
use serde_json::json;

use crate::deny::Denied;
use crate::spec::{blocking, parse_arguments, read_spec, workspace};
use crate::walk::{compile_glob, walk};
use crate::workspace::Workspace;

/// Matching lines listed at most.
const MAX_MATCHES: usize = 500;
/// Characters kept of one matching line.
const MAX_LINE_CHARS: usize = 500;

/// The `grep` tool: `pattern` (regex), `path`? (file or folder), `glob`? (file filter).
#[derive(Debug)]
pub struct Grep {
    spec: ToolSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
}

impl Grep {
    /// The tool with its declared spec.
    pub fn new() -> Grep {
        Grep {
            spec: read_spec(
                "grep",
                "Search file contents with a regular expression (Rust regex syntax; use (?i) \
                 for case-insensitive). Returns `path:line:text` lines, at most 500. Files \
                 ignored by .gitignore and binary files are skipped; symbolic links are not \
                 followed. `glob` filters files: a pattern without `/` matches file names \
                 (`*.rs`), one with `/` matches paths relative to `path`.",
                json!({
                    "type": "object",
                    "properties": {
                        "pattern": {
                            "type": "string",
                            "description": "Regular expression to search for."
                        },
                        "path": {
                            "type": "string",
                            "description": "File or folder to search (default: the workspace root)."
                        },
                        "glob": {
                            "type": "string",
                            "description": "Only search files matching this glob, e.g. `*.rs`."
                        }
                    },
                    "required": ["pattern"],
                    "additionalProperties": false
                }),
            ),
        }
    }
}

impl Default for Grep {
    fn default() -> Self {
        Grep::new()
    }
}

/// Which files a glob filter selects.
#[derive(Debug)]
struct FileFilter {
    matcher: GlobMatcher,
    on_name: bool,
}

impl FileFilter {
    fn selects(&self, relative: &Path) -> bool {
        if self.on_name {
            relative.file_name().is_some_and(|name| self.matcher.is_match(name))
        } else {
            self.matcher.is_match(relative)
        }
    }
}

#[async_trait]
impl Tool for Grep {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let arguments: Arguments = match parse_arguments("grep", arguments) {
            Ok(arguments) => arguments,
            Err(output) => return output,
        };
        let workspace = match workspace(context) {
            Ok(workspace) => workspace,
            Err(output) => return output,
        };
        let filter = match arguments.glob.as_deref().map(compile_glob).transpose() {
            Ok(matcher) => matcher.map(|matcher| FileFilter {
                matcher,
                on_name: !arguments.glob.as_deref().is_some_and(|glob| glob.contains('/')),
            }),
            Err(reason) => return ToolOutput::error(reason),
        };
        if let Err(error) = RegexMatcherBuilder::new().build(&arguments.pattern) {
            return ToolOutput::error(format!("invalid regex `{}`: {error}", arguments.pattern));
        }
        let denied = Denied::new(workspace.root(), context);
        blocking(move || search(&workspace, &arguments, filter.as_ref(), &denied)).await
    }
}

fn search(
    workspace: &Workspace,
    arguments: &Arguments,
    filter: Option<&FileFilter>,
    denied: &Denied,
) -> ToolOutput {
    let matcher = match RegexMatcherBuilder::new().build(&arguments.pattern) {
        Ok(matcher) => matcher,
        Err(error) => {
            return ToolOutput::error(format!("invalid regex `{}`: {error}", arguments.pattern));
        }
    };
    let raw_root = arguments.path.as_deref().unwrap_or(".");
    let root = match workspace.resolve(raw_root) {
        Ok(root) => root,
        Err(error) => return ToolOutput::error(error.to_string()),
    };
    if let Some(refusal) = denied.refusal(&root, raw_root) {
        return refusal;
    }
    let mut searcher =
        SearcherBuilder::new().binary_detection(BinaryDetection::quit(0)).line_number(true).build();
    let mut lines: Vec<ExactText> = Vec::new();
    let mut capped = false;
    let mut n_unreadable = 0_usize;

    let mut search_file = |path: &Path, lines: &mut Vec<ExactText>| -> bool {
        let shown = workspace.display(path);
        let result = searcher.search_path(
            &matcher,
            path,
            Bytes(|line_number, bytes| {
                if lines.len() >= MAX_MATCHES {
                    capped = true;
                    return Ok(false);
                }
                let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
                let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
                let mut line = ExactText::new();
                line.push_str(&format!("{shown}:{line_number}:"));
                let kept = prefix_chars(bytes, MAX_LINE_CHARS);
                line.push_bytes(kept);
                if kept.len() < bytes.len() {
                    line.push_str("… [line truncated]");
                }
                lines.push(line);
                Ok(true)
            }),
        );
        result.is_ok()
    };

    if root.is_file() {
        if !search_file(&root, &mut lines) {
            n_unreadable += 1;
        }
    } else if root.is_dir() {
        for entry in walk(&root, denied) {
            let Ok(entry) = entry else {
                n_unreadable += 1;
                continue;
            };
            // Only regular files: a symbolic link is never read through, even one that
            // points inside (its target is walked on its own).
            if !entry.file_type().is_some_and(|file_type| file_type.is_file()) {
                continue;
            }
            let Ok(relative) = entry.path().strip_prefix(&root) else { continue };
            if filter.is_some_and(|filter| !filter.selects(relative)) {
                continue;
            }
            if !search_file(entry.path(), &mut lines) {
                n_unreadable += 1;
            }
            if lines.len() >= MAX_MATCHES {
                capped = true;
                break;
            }
        }
    } else {
        return ToolOutput::error(format!("`{raw_root}` is not a file or folder"));
    }

    if lines.is_empty() && n_unreadable == 0 {
        return ToolOutput::ok(format!("no matches for `{}`", arguments.pattern));
    }
    let mut output = ExactText::new();
    for line in &lines {
        output.append(line);
        output.push_str("\n");
    }
    if capped {
        output.push_str(&format!(
            "[stopped at {MAX_MATCHES} matching lines; narrow the pattern, path or glob]\n"
        ));
    }
    if n_unreadable > 0 {
        output.push_str(&format!("[{n_unreadable} files or folders could not be read]\n"));
    }
    ToolOutput::exact(Outcome::Ok, output)
}
