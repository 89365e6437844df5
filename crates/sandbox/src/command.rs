//! The process-spawning primitive: [`CommandSpec`] in, [`CommandOutput`] out.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use keel_contracts::SandboxMode;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::capture::{CappedBuffer, CapturedText};
use crate::error::{Result, SandboxError};
use crate::spec::{CommandSpec, NON_INTERACTIVE_ENV};
use crate::{managed, sys};

/// How long output is still read after the spawned process exited, before the process
/// group is killed. Completion never waits for pipe end-of-file beyond this.
pub const DRAIN_GRACE: Duration = Duration::from_millis(200);

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
    if !spec.cwd().is_dir() {
        return Err(SandboxError::BadWorkingDirectory { cwd: spec.cwd().to_path_buf() });
    }
    // Declared before the process group guard, so that on every exit path (including a
    // dropped future) the group is killed before the private temporary directory goes.
    let prepared = match mode {
        SandboxMode::Bypass if !spec.denied_paths().is_empty() => {
            return Err(SandboxError::Unenforceable {
                missing: "the managed sandbox, to mask paths denied by deny rules (this \
                          command runs in bypass mode)"
                    .to_owned(),
            });
        }
        SandboxMode::Bypass if !spec.mapped_dirs().is_empty() => {
            return Err(SandboxError::Unenforceable {
                missing: "the managed sandbox, to map directories into the command's mount \
                          namespace (this command runs in bypass mode)"
                    .to_owned(),
            });
        }
        SandboxMode::Bypass => None,
        SandboxMode::Managed => Some(managed::prepare(spec)?),
    };
    let program_name = spec.program().to_string_lossy().into_owned();

    let mut command = tokio::process::Command::new(spec.program());
    command
        .args(spec.arguments())
        .current_dir(spec.cwd())
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
    command.envs(spec.env_overrides());

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
    let mut stdout_buffer = CappedBuffer::new(spec.output_cap());
    let mut stderr_buffer = CappedBuffer::new(spec.output_cap());
    let mut stdout_chunk = vec![0_u8; 16 * 1024];
    let mut stderr_chunk = vec![0_u8; 16 * 1024];
    let mut last_stream = LastStream::None;

    let timeout_at = started_at + spec.timeout();
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
                break Termination::TimedOut { after: spec.timeout() };
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
