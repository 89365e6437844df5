//! Managed containment on Linux: Landlock, seccomp, a private mount namespace for the
//! protected paths, no capabilities, `no_new_privs`. Fail closed: anything that cannot be
//! enforced is a [`SandboxError::Unenforceable`] and nothing runs.
//!
//! The parent prepares everything (the Landlock ruleset, the seccomp programs, the mount
//! list, a private temporary directory) and the child applies it between `fork` and
//! `exec` with raw system calls only (see [`crate::sys`]). No helper binary is needed.

mod filesystem;
mod mask;
mod protected;
mod seccomp;

pub(crate) use mask::Denial;

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::command::CommandSpec;
use crate::error::{Result, SandboxError};
use crate::sys::{self, BindMount, ChildContainment};

pub(crate) use filesystem::MIN_LANDLOCK_ABI;

/// Environment variables removed in managed mode: names that look like credentials.
const SECRET_ENV_WORDS: &[&str] = &[
    "API_KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "ACCESS_KEY",
    "PRIVATE_KEY",
];

/// What managed mode enforces on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagedSupport {
    /// The Landlock ABI in use (at least 3).
    pub landlock_abi: u8,
    /// Landlock denies TCP bind and connect (ABI 4 or newer), on top of the seccomp filter
    /// that refuses every socket.
    pub landlock_tcp: bool,
    /// Landlock scopes signals and abstract UNIX sockets to the sandbox (ABI 6 or newer).
    pub landlock_scopes: bool,
}

/// Checks that managed containment can be enforced here, and what it enforces.
///
/// `landlock_abi_ceiling` treats the kernel as supporting at most that Landlock ABI (for
/// testing the refusal path; `None` in production).
///
/// # Errors
///
/// [`SandboxError::Unenforceable`] naming what is missing: Linux, Landlock ABI 3 or
/// newer, seccomp, or seccomp filters for this architecture.
pub fn managed_support(landlock_abi_ceiling: Option<u8>) -> Result<ManagedSupport> {
    if !cfg!(target_os = "linux") {
        return Err(unenforceable("linux (landlock and seccomp)"));
    }
    let kernel_abi = sys::landlock_abi();
    let abi = landlock_abi_ceiling.map_or(kernel_abi, |ceiling| kernel_abi.min(ceiling.into()));
    let abi = u8::try_from(abi.clamp(0, 255)).unwrap_or(0);
    if abi < MIN_LANDLOCK_ABI {
        return Err(unenforceable(&format!(
            "landlock abi {MIN_LANDLOCK_ABI} or newer (linux 6.2+), the kernel offers {}",
            if abi == 0 {
                "none (landlock missing or disabled)".to_owned()
            } else {
                abi.to_string()
            }
        )));
    }
    if !sys::seccomp_available() {
        return Err(unenforceable("seccomp filters"));
    }
    seccomp::filters(false).map_err(|reason| unenforceable(&reason))?;
    seccomp::filters(true).map_err(|reason| unenforceable(&reason))?;
    let enforced = filesystem::Enforced::for_abi(abi);
    Ok(ManagedSupport {
        landlock_abi: abi,
        landlock_tcp: enforced.tcp,
        landlock_scopes: enforced.scopes,
    })
}

/// A run prepared for managed containment.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) plan: Arc<ChildContainment>,
    /// Read end of the child's status pipe.
    pub(crate) status: OwnedFd,
    /// The per-run temporary directory, held so that it is removed when the run ends.
    _temp_dir: tempfile::TempDir,
    pub(crate) env_set: Vec<(OsString, OsString)>,
    pub(crate) env_remove: Vec<OsString>,
    /// Git directories that had no `commondir` before the run.
    missing_commondir: Vec<PathBuf>,
    /// The empty sources of the deny-rule masks, removed when the run ends.
    _masks: mask::Masks,
}

/// Prepares containment for `spec`.
pub(crate) fn prepare(spec: &CommandSpec) -> Result<Prepared> {
    let support = managed_support(spec.landlock_abi_ceiling_value())?;
    let workspace = spec.writable_root().canonicalize().map_err(|error| {
        unenforceable(&format!("a usable workspace {}: {error}", spec.writable_root().display()))
    })?;
    let temp_dir = tempfile::Builder::new()
        .prefix("keel-sandbox-")
        .tempdir()
        .map_err(|error| unenforceable(&format!("a private temporary directory: {error}")))?;
    let temp_path = temp_dir
        .path()
        .canonicalize()
        .map_err(|error| unenforceable(&format!("a private temporary directory: {error}")))?;

    let extra = spec.extra_boundary();
    let extra_read =
        extra.read.iter().map(|path| canonical_extra(path)).collect::<Result<Vec<_>>>()?;
    let extra_write =
        extra.write.iter().map(|path| canonical_extra(path)).collect::<Result<Vec<_>>>()?;
    for (given, path) in extra.write.iter().zip(&extra_write) {
        if path.components().any(|component| component.as_os_str() == ".keel") {
            return Err(SandboxError::BoundaryPath {
                path: given.clone(),
                reason: format!("{} lies inside a protected .keel directory", path.display()),
            });
        }
    }

    let home = env_value(spec, "HOME").map(PathBuf::from);
    let path_var = env_value(spec, "PATH");
    let mut policy =
        filesystem::policy(&workspace, &temp_path, home.as_deref(), path_var.as_deref());
    policy.extra_read = extra_read;
    policy.extra_write = extra_write;
    let ruleset = filesystem::ruleset(
        &policy,
        filesystem::Enforced::for_abi(support.landlock_abi),
        extra.network,
    )
    .map_err(|reason| unenforceable(&reason))?;
    let seccomp_filters =
        seccomp::filters(extra.network).map_err(|reason| unenforceable(&reason))?;

    let protected = protected::find(&workspace, &policy.extra_write)
        .map_err(|reason| unenforceable(&reason))?;
    let mut mounts = Vec::new();
    for path in &protected.pinned {
        mounts.push(BindMount { path: c_path(path)?, source: None, read_only_flags: None });
    }
    for path in &protected.read_only {
        let path = c_path(path)?;
        let locked = sys::locked_mount_flags(&path).map_err(|error| {
            unenforceable(&format!("the mount flags of {}: {error}", path.to_string_lossy()))
        })?;
        mounts.push(BindMount { path, source: None, read_only_flags: Some(locked) });
    }
    let masks = mask::Masks::prepare(spec.denied_paths())?;
    mounts.extend(masks.mounts()?);

    let (uid, gid) = sys::user_and_group();
    let id_maps = (uid != 0).then(|| {
        (format!("{uid} {uid} 1\n").into_bytes(), format!("{gid} {gid} 1\n").into_bytes())
    });
    let (status_read, status_write) =
        sys::status_pipe().map_err(|error| unenforceable(&format!("a status pipe: {error}")))?;
    let plan = Arc::new(ChildContainment {
        id_maps,
        mounts,
        landlock_ruleset: ruleset,
        seccomp_filters,
        status: status_write,
    });

    let mut env_set = Vec::new();
    for key in ["TMPDIR", "TMP", "TEMP"] {
        env_set.push((OsString::from(key), temp_path.clone().into_os_string()));
    }
    env_set.push((OsString::from("XDG_CACHE_HOME"), temp_path.join(".cache").into_os_string()));
    // Git's automatic maintenance detaches with setsid, which the filter refuses; run it in
    // the foreground instead of printing an error after every commit.
    if env_value(spec, "GIT_CONFIG_COUNT").is_none() {
        for (key, value) in [
            ("GIT_CONFIG_COUNT", "2"),
            ("GIT_CONFIG_KEY_0", "gc.autoDetach"),
            ("GIT_CONFIG_VALUE_0", "false"),
            ("GIT_CONFIG_KEY_1", "maintenance.autoDetach"),
            ("GIT_CONFIG_VALUE_1", "false"),
        ] {
            env_set.push((OsString::from(key), OsString::from(value)));
        }
    }
    let env_remove = std::env::vars_os()
        .map(|(key, _)| key)
        .filter(|key| is_secret_name(key) && !spec.env_overrides().contains_key(key))
        .collect();
    Ok(Prepared {
        plan,
        status: status_read,
        _temp_dir: temp_dir,
        env_set,
        env_remove,
        missing_commondir: protected.missing_commondir,
        _masks: masks,
    })
}

/// Repairs what the mounts cannot prevent, once the command's process group is dead:
/// removes a `commondir` file planted in a git directory that had none. Returns a note
/// for each repair.
pub(crate) fn after_run(prepared: &Prepared) -> Vec<String> {
    let mut notes = Vec::new();
    for git_dir in &prepared.missing_commondir {
        let planted = git_dir.join("commondir");
        if planted.symlink_metadata().is_ok() {
            let outcome = match std::fs::remove_file(&planted) {
                Ok(()) => "removed it".to_owned(),
                Err(error) => format!("could not remove it: {error}"),
            };
            notes.push(format!(
                "keel sandbox: the command created {}, which would redirect git to another \
                 config; {outcome}",
                planted.display()
            ));
        }
    }
    notes
}

/// Turns a failed spawn of a contained child into a refusal when containment itself
/// failed (the child reported a step), or `None` when the spawn failed for another reason.
pub(crate) fn child_failure(prepared: &Prepared) -> Option<SandboxError> {
    let (step, errno) = sys::read_child_failure(&prepared.status)?;
    Some(unenforceable(&format!(
        "{} in the child: {}",
        sys::ChildStep::describe(step),
        std::io::Error::from_raw_os_error(errno)
    )))
}

fn env_value(spec: &CommandSpec, key: &str) -> Option<OsString> {
    spec.env_overrides().get(OsStr::new(key)).cloned().or_else(|| std::env::var_os(key))
}

fn is_secret_name(key: &OsStr) -> bool {
    let key = key.to_string_lossy().to_ascii_uppercase();
    SECRET_ENV_WORDS.iter().any(|word| key.contains(word)) || key == "SSH_AUTH_SOCK"
}

/// The canonical form of an extra boundary path, which must exist.
fn canonical_extra(path: &Path) -> Result<PathBuf> {
    let refuse = |reason: String| SandboxError::BoundaryPath { path: path.to_owned(), reason };
    if !path.is_absolute() {
        return Err(refuse("not an absolute path".to_owned()));
    }
    path.canonicalize().map_err(|error| refuse(error.to_string()))
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| unenforceable(&format!("a mountable path (NUL byte in {})", path.display())))
}

fn unenforceable(missing: &str) -> SandboxError {
    SandboxError::Unenforceable { missing: missing.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_looking_variables_are_recognised() {
        for key in ["OPENAI_API_KEY", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK"] {
            assert!(is_secret_name(OsStr::new(key)), "{key}");
        }
        for key in ["PATH", "HOME", "CARGO_HOME", "KEYBOARD"] {
            assert!(!is_secret_name(OsStr::new(key)), "{key}");
        }
    }

    #[test]
    fn an_abi_ceiling_below_the_minimum_refuses() {
        let error = managed_support(Some(2)).unwrap_err();
        assert!(error.to_string().contains("landlock abi 3 or newer"), "{error}");
    }
}
