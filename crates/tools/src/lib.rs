//! keel-tools: the built-in workspace tools (DESIGN.md §9, "Built-in tools").
//!
//! [`builtin_tools`] returns them in registry order: `read_file`, `list_dir`, `glob`,
//! `grep`, `write_file`, `edit_file`, `bash`. Each is a [`Tool`] with a declared
//! [`ToolSpec`](keel_contracts::ToolSpec): reads declare `Access::Read`,
//! `Effects::LOCAL_READ` and `first_party: true`; writes and `bash` declare `Access::Write`
//! and `Effects::LOCAL_WRITE`. None is intrinsic.
//!
//! Invariants:
//! - A tool never returns `Err`: bad arguments, refusals and failures are
//!   `Outcome::Error` results the model can read.
//! - Paths resolve against the session's workspace, and containment is decided on the
//!   canonical (symlink-resolved) path; for a path that does not exist yet, on its nearest
//!   existing ancestor (module `workspace`). A path leaving the workspace is refused with
//!   [`OUTSIDE_WORKSPACE`] in the text, in every sandbox mode. `write_file` and `edit_file`
//!   refuse a protected path ([`PROTECTED_PATH`] in the text: git hooks and config,
//!   `commondir`, config-named hooks paths and includes, `.keel/`, a `KEEL_HOME` inside the
//!   workspace), checked on the path as given and as resolved, with the same list that
//!   managed commands get read-only (`keel_sandbox::protected_path`). A credential store of
//!   the home folder (`~/.ssh`, `~/.aws`, ...) is refused by every tool, and the walkers
//!   skip it.
//! - Walkers (`list_dir`, `glob`, `grep`) never follow symbolic links, so they neither
//!   leave the workspace through one nor loop on a link cycle.
//! - Every command runs through keel-sandbox ([`keel_sandbox::run`]); there is no other
//!   process spawn in this crate.
//!
//! `bash` declares `egress: none`: in managed mode the sandbox blocks the network, and
//! bypass mode is the user's explicit choice to run without containment.
#![forbid(unsafe_code)]

mod bash;
mod deny;
mod edit_file;
mod glob;
mod grep;
mod list_dir;
mod read_file;
mod spec;
mod visible;
mod walk;
mod workspace;
mod write_file;

use std::sync::Arc;

use keel_contracts::Tool;

pub use bash::{Bash, DEFAULT_BASH_TIMEOUT, MAX_BASH_TIMEOUT};
pub use deny::{MAX_DENIED_PATHS, MAX_RESOLVE_ENTRIES};
pub use edit_file::EditFile;
pub use glob::Glob;
pub use grep::Grep;
pub use list_dir::ListDir;
pub use read_file::ReadFile;
pub use workspace::{OUTSIDE_WORKSPACE, PROTECTED_PATH};
pub use write_file::WriteFile;

/// The built-in tools in registry order: `read_file`, `list_dir`, `glob`, `grep`,
/// `write_file`, `edit_file`, `bash`.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    builtin_tools_with(&BuiltinOptions::default())
}

/// What the user configured for the built-in tools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuiltinOptions {
    /// Environment variable names `bash` commands inherit in managed mode beyond the
    /// sandbox's allow-list (the CLI's `[shell] env`).
    pub shell_env: Vec<String>,
}

/// The built-in tools in registry order, configured by `options`.
pub fn builtin_tools_with(options: &BuiltinOptions) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ReadFile::new()),
        Arc::new(ListDir::new()),
        Arc::new(Glob::new()),
        Arc::new(Grep::new()),
        Arc::new(WriteFile::new()),
        Arc::new(EditFile::new()),
        Arc::new(Bash::with_inherited_env(options.shell_env.clone())),
    ]
}
