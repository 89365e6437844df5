//! The process-spawning primitive: [`CommandSpec`] in, [`CommandOutput`] out.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use keel_contracts::SandboxMode;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::boundary::Boundary;
use crate::capture::{CappedBuffer, CapturedText};
use crate::error::{Result, SandboxError};
use crate::{managed, sys};

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

/// How long output is still read after the spawned process exited, before the process
/// group is killed. Completion never waits for pipe end-of-file beyond this.
pub const DRAIN_GRACE: Duration = Duration::from_millis(200);

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
    deny_paths: Vec<(PathBuf, managed::Denial)>,
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
    #[must_use]
    pub fn deny_paths(mut self, paths: Vec<PathBuf>) -> Self {
        self.deny_paths.extend(paths.into_iter().map(|path| (path, managed::Denial::Hide)));
        self
    }

    /// Makes `paths` (absolute, existing) read-only for the command in managed mode (deny
    /// rules on writing): each is bind-mounted onto itself read-only. Refused like
    /// [`CommandSpec::deny_paths`].
    #[must_use]
    pub fn deny_writes(mut self, paths: Vec<PathBuf>) -> Self {
        self.deny_paths.extend(paths.into_iter().map(|path| (path, managed::Denial::ReadOnly)));
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
    pub(crate) fn denied_paths(&self) -> &[(PathBuf, managed::Denial)] {
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
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// It exited with this code.
    Exited {
        /// The exit code.
        code: i32,
    },
    /// A signal ended it.
    Signaled {
        /// The signal number.
        signal: i32,
    },
    /// It was still running at the timeout; its process group was killed.
    TimedOut {
        /// The timeout that expired.
        after: Duration,
    },
}

impl Termination {
    fn from_status(status: ExitStatus) -> Termination {
        match (status.code(), status.signal()) {
            (Some(code), _) => Termination::Exited { code },
            (None, Some(signal)) => Termination::Signaled { signal },
            // An exit status has either a code or a signal on Unix; report the raw value.
            (None, None) => Termination::Exited { code: status.into_raw() },
        }
    }

    /// Whether it exited with code 0.
    pub fn success(self) -> bool {
        self == Termination::Exited { code: 0 }
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Termination::Exited { code } => write!(f, "exit code {code}"),
            Termination::Signaled { signal } => write!(f, "killed by signal {signal}"),
            Termination::TimedOut { after } => write!(f, "timed out after {after:?}"),
        }
    }
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// How it ended.
    pub termination: Termination,
    /// Its standard output.
    pub stdout: CapturedText,
    /// Its standard error.
    pub stderr: CapturedText,
    /// From spawn to the end of the call.
    pub elapsed: Duration,
    /// The last non-empty output line, from whichever stream wrote last (what a silent
    /// command was waiting on at a timeout, e.g. a prompt).
    pub last_line: Option<String>,
    /// What managed containment skipped or repaired around the command (e.g. a planted git
    /// `commondir` removed, a FIFO where a git config should be skipped, plants of a
    /// crashed earlier run removed); empty in bypass mode.
    pub notes: Vec<String>,
}

/// Runs a command to completion in the given boundary.
///
/// Returns when the spawned process has exited and its output has drained for at most
/// [`DRAIN_GRACE`], or at the timeout. Either way the command's whole process group is
/// killed before this returns.
///
/// # Errors
///
/// - [`SandboxError::Unenforceable`] in [`SandboxMode::Managed`] when containment cannot be
///   enforced (see [`managed_support`](crate::managed_support)); nothing ran.
/// - [`SandboxError::BoundaryPath`] in [`SandboxMode::Managed`] when an extra read or write
///   path does not exist, cannot be canonicalized, or may not be granted; nothing ran.
/// - [`SandboxError::BadWorkingDirectory`], [`SandboxError::Spawn`],
///   [`SandboxError::Wait`] when the process could not be started or awaited.
///
/// A non-zero exit, a signal or a timeout is an `Ok` [`CommandOutput`].
///
/// # Cancel safety
///
/// Dropping the future kills the command's process group with `SIGKILL`; the direct child
/// is reaped in the background by tokio. Output captured so far is lost.
pub async fn run(spec: &CommandSpec, mode: SandboxMode) -> Result<CommandOutput> {
    if !spec.cwd.is_dir() {
        return Err(SandboxError::BadWorkingDirectory { cwd: spec.cwd.clone() });
    }
    // Declared before the process group guard, so that on every exit path (including a
    // dropped future) the group is killed before the private temporary directory goes.
    let prepared = match mode {
        SandboxMode::Bypass if !spec.deny_paths.is_empty() => {
            return Err(SandboxError::Unenforceable {
                missing: "the managed sandbox, to mask paths denied by deny rules (this \
                          command runs in bypass mode)"
                    .to_owned(),
            });
        }
        SandboxMode::Bypass if !spec.mapped_dirs.is_empty() => {
            return Err(SandboxError::Unenforceable {
                missing: "the managed sandbox, to map directories into the command's mount \
                          namespace (this command runs in bypass mode)"
                    .to_owned(),
            });
        }
        SandboxMode::Bypass => None,
        SandboxMode::Managed => Some(managed::prepare(spec)?),
    };
    let program_name = spec.program.to_string_lossy().into_owned();

    let mut command = tokio::process::Command::new(&spec.program);
    command
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    match &prepared {
        None => {
            for (key, value) in NON_INTERACTIVE_ENV {
                command.env(key, value);
            }
            sys::start_new_session(&mut command);
        }
        Some(prepared) => {
            // An allow-listed environment, not keel's minus what looks secret.
            command.env_clear();
            command.envs(prepared.env.iter().map(|(key, value)| (key, value)));
            sys::start_contained_session(&mut command, Arc::clone(&prepared.plan));
        }
    }
    command.envs(&spec.env);

    let started_at = Instant::now();
    let spawned = command.spawn();
    // The hook (and with it the plan's descriptors) is not needed once the child exists.
    drop(command);
    let mut child = match spawned {
        Ok(child) => child,
        Err(source) => {
            if let Some(refusal) = prepared.as_ref().and_then(managed::child_failure) {
                return Err(refusal);
            }
            return Err(SandboxError::Spawn { program: program_name, source });
        }
    };
    let group = ProcessGroupGuard { pgid: child.id() };
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut stdout_buffer = CappedBuffer::new(spec.output_cap_bytes);
    let mut stderr_buffer = CappedBuffer::new(spec.output_cap_bytes);
    let mut stdout_chunk = vec![0_u8; 16 * 1024];
    let mut stderr_chunk = vec![0_u8; 16 * 1024];
    let mut last_stream = LastStream::None;

    let timeout_at = started_at + spec.timeout;
    let mut exit_status: Option<ExitStatus> = None;
    let mut drain_until: Option<Instant> = None;
    let termination = loop {
        if let Some(status) = exit_status
            && stdout.is_none()
            && stderr.is_none()
        {
            break Termination::from_status(status);
        }
        tokio::select! {
            read = read_some(&mut stdout, &mut stdout_chunk), if stdout.is_some() => {
                match read {
                    Ok(n) if n > 0 => {
                        stdout_buffer.push(&stdout_chunk[..n]);
                        last_stream = LastStream::Stdout;
                    }
                    _ => stdout = None,
                }
            }
            read = read_some(&mut stderr, &mut stderr_chunk), if stderr.is_some() => {
                match read {
                    Ok(n) if n > 0 => {
                        stderr_buffer.push(&stderr_chunk[..n]);
                        last_stream = LastStream::Stderr;
                    }
                    _ => stderr = None,
                }
            }
            status = child.wait(), if exit_status.is_none() => {
                let status = status
                    .map_err(|source| SandboxError::Wait { program: program_name.clone(), source })?;
                exit_status = Some(status);
                drain_until = Some(Instant::now() + DRAIN_GRACE);
            }
            () = sleep_until_some(drain_until), if drain_until.is_some() => {
                if let Some(status) = exit_status {
                    break Termination::from_status(status);
                }
            }
            () = tokio::time::sleep_until(timeout_at), if exit_status.is_none() => {
                group.kill();
                // The group leader got SIGKILL; reap it so no zombie is left behind.
                let _ = child.wait().await;
                break Termination::TimedOut { after: spec.timeout };
            }
        }
    };
    // Leftover policy: whatever the command left running in its group dies with the call.
    group.kill();
    drop(group);
    let mut notes: Vec<String> = prepared
        .as_ref()
        .map(|prepared| managed::notes_before(prepared).to_vec())
        .unwrap_or_default();
    notes.extend(prepared.as_ref().map(managed::after_run).unwrap_or_default());

    let last_line = match last_stream {
        LastStream::Stdout => stdout_buffer.last_line(),
        LastStream::Stderr => stderr_buffer.last_line(),
        LastStream::None => None,
    };
    Ok(CommandOutput {
        termination,
        stdout: stdout_buffer.finish(),
        stderr: stderr_buffer.finish(),
        elapsed: started_at.elapsed(),
        last_line,
        notes,
    })
}

/// Which stream received output most recently.
#[derive(Debug, Clone, Copy)]
enum LastStream {
    None,
    Stdout,
    Stderr,
}

/// Kills the command's process group when dropped, so a cancelled call leaves nothing
/// running.
#[derive(Debug)]
struct ProcessGroupGuard {
    /// The group id: the pid of the spawned process, which called `setsid`. `None` when the
    /// process had already been reaped at spawn time (no group left to kill).
    pgid: Option<u32>,
}

impl ProcessGroupGuard {
    fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // Failure here means the group is gone or the id is invalid; neither leaves
            // anything of ours running.
            let _ = sys::kill_process_group(pgid);
        }
    }
}

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn read_some<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    chunk: &mut [u8],
) -> std::io::Result<usize> {
    match pipe {
        Some(pipe) => pipe.read(chunk).await,
        None => Ok(0),
    }
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
