//! What to run: [`CommandSpec`] (program, arguments, working directory, environment
//! overrides, limits, and in managed mode the workspace, the extra boundary, the denied
//! and the mapped paths), and the environment every command gets.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::boundary::Boundary;

/// Environment every command gets unless its spec overrides a variable: nothing waits for
/// a human (editors, pagers, credential prompts, installers).
pub const NON_INTERACTIVE_ENV: &[(&str, &str)] = &[
    ("GIT_EDITOR", "true"),
    // `git rebase -i` asks the sequence editor, whatever core.editor or GIT_EDITOR say.
    ("GIT_SEQUENCE_EDITOR", "true"),
    ("EDITOR", "true"),
    ("VISUAL", "true"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("CI", "1"),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("DEBIAN_FRONTEND", "noninteractive"),
    ("TERM", "dumb"),
];

/// The output cap per stream when a spec does not set one.
pub const DEFAULT_OUTPUT_CAP_BYTES: usize = 64 * 1024;

/// A command to run: program, arguments, working directory, environment overrides,
/// timeout, output cap, and in managed mode the workspace plus any extra boundary the user
/// approved ([`CommandSpec::allow_read`], [`CommandSpec::allow_write`],
/// [`CommandSpec::allow_network`], [`CommandSpec::boundary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    program: OsString,
    args: Vec<OsString>,
    cwd: PathBuf,
    env: BTreeMap<OsString, OsString>,
    timeout: Duration,
    output_cap_bytes: usize,
    workspace: Option<PathBuf>,
    extra: Boundary,
    inherit_env: Vec<OsString>,
    landlock_abi_ceiling: Option<u8>,
    deny_paths: Vec<(PathBuf, Denial)>,
    mapped_dirs: Vec<(PathBuf, PathBuf)>,
}

impl CommandSpec {
    /// A command running `program` (looked up in `PATH` when it has no slash) in `cwd`,
    /// killed with its process group after `timeout`. No arguments, no environment
    /// overrides, output capped at [`DEFAULT_OUTPUT_CAP_BYTES`] per stream.
    pub fn new(program: impl Into<OsString>, cwd: impl Into<PathBuf>, timeout: Duration) -> Self {
        CommandSpec {
            program: program.into(),
            args: Vec::new(),
            cwd: cwd.into(),
            env: BTreeMap::new(),
            timeout,
            output_cap_bytes: DEFAULT_OUTPUT_CAP_BYTES,
            workspace: None,
            extra: Boundary::default(),
            inherit_env: Vec::new(),
            landlock_abi_ceiling: None,
            deny_paths: Vec::new(),
            mapped_dirs: Vec::new(),
        }
    }

    /// Adds one argument.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable, overriding the inherited value and
    /// [`NON_INTERACTIVE_ENV`].
    #[must_use]
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Lets a managed command inherit keel's value of the variable `name` (exact name),
    /// beyond the allow-list [`INHERITED_ENV`](crate::INHERITED_ENV) and `LC_*`. In managed
    /// mode nothing else of keel's environment reaches the command: list here what the
    /// user named (the CLI's `[shell] env`). No effect in bypass mode, which inherits
    /// everything.
    #[must_use]
    pub fn inherit_env(mut self, name: impl Into<OsString>) -> Self {
        self.inherit_env.push(name.into());
        self
    }

    /// Caps each captured stream at `cap` bytes (half head, half tail).
    #[must_use]
    pub fn output_cap_bytes(mut self, cap: usize) -> Self {
        self.output_cap_bytes = cap;
        self
    }

    /// Sets the workspace: the tree the command may write in managed mode (besides its
    /// private temporary directory). Defaults to the working directory.
    #[must_use]
    pub fn workspace(mut self, root: impl Into<PathBuf>) -> Self {
        self.workspace = Some(root.into());
        self
    }

    /// Widens the managed boundary: `path` (a file or a directory, with everything under
    /// it) becomes readable, read-only. The path must exist: it is resolved to its
    /// canonical form when the command runs, and [`run`] refuses with
    /// [`SandboxError::BoundaryPath`] (nothing runs) when it cannot be. No effect in
    /// bypass mode.
    ///
    /// [`run`]: crate::run
    /// [`SandboxError::BoundaryPath`]: crate::SandboxError::BoundaryPath
    #[must_use]
    pub fn allow_read(mut self, path: impl Into<PathBuf>) -> Self {
        self.extra.read.push(path.into());
        self
    }

    /// Widens the managed boundary: `path` (a file or a directory, with everything under
    /// it) becomes readable and writable. Protected paths (git hooks and config, `.keel/`)
    /// inside it stay read-only, and a path inside a `.keel` directory is refused. The
    /// path must exist, as for [`CommandSpec::allow_read`]. No effect in bypass mode.
    #[must_use]
    pub fn allow_write(mut self, path: impl Into<PathBuf>) -> Self {
        self.extra.write.push(path.into());
        self
    }

    /// Allows (`true`) or forbids (`false`, the default) IPv4 and IPv6 sockets in managed
    /// mode: TCP connect and bind, UDP, DNS. Other socket families (UNIX, netlink, packet)
    /// stay refused. No effect in bypass mode.
    #[must_use]
    pub fn allow_network(mut self, allowed: bool) -> Self {
        self.extra.network = allowed;
        self
    }

    /// Widens the managed boundary by `boundary`: its read and write paths are added (as by
    /// [`CommandSpec::allow_read`] and [`CommandSpec::allow_write`]) and, when it allows
    /// the network, the network is allowed. Never narrows what earlier calls granted.
    #[must_use]
    pub fn boundary(mut self, boundary: &Boundary) -> Self {
        self.extra.read.extend(boundary.read.iter().cloned());
        self.extra.write.extend(boundary.write.iter().cloned());
        self.extra.network |= boundary.network;
        self
    }

    /// Masks `paths` (absolute, existing) for the command in managed mode: a directory is
    /// replaced by an empty read-only one and a file by an empty read-only file inside the
    /// command's mount namespace, so nothing in the command can read or change them (deny
    /// rules). [`run`] refuses with [`SandboxError::Unenforceable`] when a mask cannot be
    /// applied, and in bypass mode when `paths` is not empty.
    ///
    /// [`run`]: crate::run
    /// [`SandboxError::Unenforceable`]: crate::SandboxError::Unenforceable
    #[must_use]
    pub fn deny_paths(mut self, paths: Vec<PathBuf>) -> Self {
        self.deny_paths.extend(paths.into_iter().map(|path| (path, Denial::Hide)));
        self
    }

    /// Makes `paths` (absolute, existing) read-only for the command in managed mode (deny
    /// rules on writing): each is bind-mounted onto itself read-only. Refused like
    /// [`CommandSpec::deny_paths`].
    #[must_use]
    pub fn deny_writes(mut self, paths: Vec<PathBuf>) -> Self {
        self.deny_paths.extend(paths.into_iter().map(|path| (path, Denial::ReadOnly)));
        self
    }

    /// Shows the directory `source` (existing) at the absolute path `target` inside the
    /// command's mount namespace in managed mode, the way a container maps a volume: the
    /// command gets a private root with the host's top-level entries bind-mounted into it
    /// (every protection and mask included) plus each mapping, so `target` need not exist
    /// on the host and nothing is created there. A working directory inside `source` is
    /// entered at its `target` path. Mapping grants nothing: Landlock still decides by
    /// inode, so grant `source` as the workspace or with [`CommandSpec::allow_read`] /
    /// [`CommandSpec::allow_write`]. [`run`] refuses with [`SandboxError::Unenforceable`]
    /// (nothing runs) when `target` is not absolute, is `/`, has `..`, lies under a host
    /// top-level entry where no directory exists to mount on, or `source` is not a
    /// directory, and in bypass mode when any mapping is given.
    ///
    /// [`run`]: crate::run
    /// [`SandboxError::Unenforceable`]: crate::SandboxError::Unenforceable
    #[must_use]
    pub fn map_dir(mut self, source: impl Into<PathBuf>, target: impl Into<PathBuf>) -> Self {
        self.mapped_dirs.push((source.into(), target.into()));
        self
    }

    /// The directories mapped with [`CommandSpec::map_dir`], as `(source, target)`.
    pub fn mapped_dirs(&self) -> &[(PathBuf, PathBuf)] {
        &self.mapped_dirs
    }

    /// The paths hidden or made read-only by deny rules.
    pub(crate) fn denied_paths(&self) -> &[(PathBuf, Denial)] {
        &self.deny_paths
    }

    /// Treats the kernel as supporting at most this Landlock ABI, so managed mode refuses
    /// when the ceiling is below what it needs. For testing the fail-closed path; it can
    /// only make containment refuse, never weaken it.
    #[must_use]
    pub fn landlock_abi_ceiling(mut self, abi: u8) -> Self {
        self.landlock_abi_ceiling = Some(abi);
        self
    }

    /// The program.
    pub fn program(&self) -> &OsStr {
        &self.program
    }

    /// The arguments.
    pub fn arguments(&self) -> &[OsString] {
        &self.args
    }

    /// The working directory.
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// The timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The writable root in managed mode: the workspace, else the working directory.
    pub fn writable_root(&self) -> &Path {
        self.workspace.as_deref().unwrap_or(&self.cwd)
    }

    /// The extra boundary granted beyond the workspace (empty by default).
    pub fn extra_boundary(&self) -> &Boundary {
        &self.extra
    }

    /// The names a managed command inherits beyond the allow-list.
    pub fn inherited_env_names(&self) -> &[OsString] {
        &self.inherit_env
    }

    pub(crate) fn landlock_abi_ceiling_value(&self) -> Option<u8> {
        self.landlock_abi_ceiling
    }

    pub(crate) fn env_overrides(&self) -> &BTreeMap<OsString, OsString> {
        &self.env
    }

    /// The output cap per stream, in bytes.
    pub(crate) fn output_cap(&self) -> usize {
        self.output_cap_bytes
    }
}

/// What a deny rule takes from a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Denial {
    /// Read-only, still readable (a deny on writing).
    ReadOnly,
    /// Hidden: empty and read-only (a deny on reading).
    Hide,
}
