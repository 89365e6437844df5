//! Managed containment on Linux: Landlock, seccomp, a private mount namespace for the
//! protected paths, no capabilities, `no_new_privs`. Fail closed: anything that cannot be
//! enforced is a [`SandboxError::Unenforceable`] and nothing runs.
//!
//! The parent prepares everything (the Landlock ruleset, the seccomp programs, the mount
//! list, a private temporary directory) and the child applies it between `fork` and
//! `exec` with raw system calls only (see [`crate::sys`]). No helper binary is needed.

mod aliases;
mod filesystem;
mod gitconfig;
mod gitscan;
mod mask;
mod plants;
mod private_root;

pub use plants::set_plant_note_key;
mod protected;
mod seccomp;

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Result, SandboxError};
use crate::spec::CommandSpec;
use crate::sys::{self, AliasMount, BindMount, ChildContainment, WritableRoot};

pub(crate) use filesystem::MIN_LANDLOCK_ABI;

/// Variables a managed command inherits from keel's environment (besides the names a spec
/// lists with [`CommandSpec::inherit_env`]); every `LC_*` too. Everything else is dropped:
/// a database URL, a token or a DSN reaches a command only when named.
pub const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG", "TERM", "TMPDIR", "USER", "SHELL"];

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
///
/// Dropping it (after the command's process group was killed) closes keel's end of the
/// liveness pipe (the shim kills the namespace), repairs plants once the namespace is gone,
/// then removes the private temporary directory, in that order.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) plan: Arc<ChildContainment>,
    /// Read end of the child's status pipe.
    pub(crate) status: OwnedFd,
    /// keel's end of the liveness pipe: the only write end.
    _keel_alive: OwnedFd,
    guard: std::sync::Mutex<Option<plants::PlantGuard>>,
    /// The per-run temporary directory, held so that it is removed when the run ends.
    _temp_dir: tempfile::TempDir,
    /// The whole environment of the command before the spec's overrides.
    pub(crate) env: Vec<(OsString, OsString)>,
    /// What was found or repaired before the run (reported with the result).
    notes_before: Vec<String>,
    /// The empty sources of the deny-rule masks, removed when the run ends.
    _masks: mask::Masks,
    /// The private root of a command with mapped directories, removed when the run ends.
    _private_root: Option<tempfile::TempDir>,
}

/// Prepares containment for `spec`.
pub(crate) fn prepare(spec: &CommandSpec) -> Result<Prepared> {
    let support = managed_support(spec.landlock_abi_ceiling_value())?;
    let workspace = spec.writable_root().canonicalize().map_err(|error| {
        unenforceable(&format!("a usable workspace {}: {error}", spec.writable_root().display()))
    })?;
    let cwd = spec.cwd().canonicalize().map_err(|error| {
        unenforceable(&format!("a usable working directory {}: {error}", spec.cwd().display()))
    })?;
    // A crash of an earlier keel during a command here may have left plants behind.
    let mut notes_before = plants::recover(&workspace);
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

    let protected =
        protected::find(&workspace, &policy.extra_write, home.as_deref(), protected::Mode::Prepare)
            .map_err(|reason| unenforceable(&reason))?;
    notes_before.extend(protected.notes.iter().cloned());
    let mut writable_roots = Vec::new();
    for path in std::iter::once(&workspace).chain([&temp_path]).chain(&policy.extra_write) {
        let path = c_path(path)?;
        let locked_flags = locked_flags(&path)?;
        writable_roots.push(WritableRoot { path, locked_flags });
    }
    let mut mounts = Vec::new();
    for path in &protected.pinned {
        mounts.push(BindMount { path: c_path(path)?, source: None, read_only_flags: None });
    }
    for path in &protected.read_only {
        let path = c_path(path)?;
        let locked = locked_flags(&path)?;
        mounts.push(BindMount { path, source: None, read_only_flags: Some(locked) });
    }
    let masks = mask::Masks::prepare(spec.denied_paths())?;
    mounts.extend(masks.mounts()?);
    let mut alias_mounts = Vec::new();
    for alias in aliases::of(&workspace) {
        alias_mounts.push(AliasMount {
            source: c_path(&alias.source)?,
            target: c_path(&alias.target)?,
            read_only_flags: None,
        });
    }
    let xdg_config = env_value(spec, "XDG_CONFIG_HOME").map(PathBuf::from);
    let named: Vec<PathBuf> = extra.read.iter().chain(&extra.write).cloned().collect();
    let masked = filesystem::credential_stores_to_mask(
        &policy,
        home.as_deref(),
        xdg_config.as_deref(),
        &named,
    );
    if !masked.is_empty() {
        let (empty_dir, empty_file) = mask_sources(&temp_path)?;
        for (store, is_dir) in masked {
            let source = c_path(if is_dir { &empty_dir } else { &empty_file })?;
            let locked = locked_flags(&source)?;
            alias_mounts.push(AliasMount {
                source,
                target: c_path(&store)?,
                read_only_flags: Some(locked),
            });
        }
    }

    let (private_root, cwd) = if spec.mapped_dirs().is_empty() {
        (None, cwd)
    } else {
        let prepared = private_root::prepare(spec.mapped_dirs(), &cwd)
            .map_err(|reason| unenforceable(&reason))?;
        let binds = prepared
            .binds
            .iter()
            .map(|(source, target)| Ok((c_path(source)?, c_path(target)?)))
            .collect::<Result<Vec<_>>>()?;
        let plan = sys::PrivateRoot { new_root: c_path(prepared.dir.path())?, binds };
        (Some((prepared.dir, plan)), prepared.cwd)
    };
    let (private_root_dir, private_root_plan) = match private_root {
        Some((dir, plan)) => (Some(dir), Some(plan)),
        None => (None, None),
    };

    let (uid, gid) = sys::user_and_group();
    let id_maps = (uid != 0).then(|| {
        (format!("{uid} {uid} 1\n").into_bytes(), format!("{gid} {gid} 1\n").into_bytes())
    });
    let (status_read, status_write) =
        sys::status_pipe().map_err(|error| unenforceable(&format!("a status pipe: {error}")))?;
    let (keel_alive_read, keel_alive_write) =
        sys::status_pipe().map_err(|error| unenforceable(&format!("a liveness pipe: {error}")))?;
    let (init_report_read, init_report_write) = sys::status_pipe()
        .map_err(|error| unenforceable(&format!("a namespace report pipe: {error}")))?;
    let plan = Arc::new(ChildContainment {
        id_maps,
        writable_roots,
        mounts,
        aliases: alias_mounts,
        private_root: private_root_plan,
        cwd: c_path(&cwd)?,
        keel_alive: keel_alive_read,
        init_report: init_report_write,
        landlock_ruleset: ruleset,
        seccomp_filters,
        status: status_write,
    });

    let writable: Vec<PathBuf> =
        std::iter::once(workspace.clone()).chain(policy.extra_write.iter().cloned()).collect();
    let (mut guard, guard_note) = plants::PlantGuard::arm(&writable, &protected);
    guard.wait_for_namespace(init_report_read);
    notes_before.extend(guard_note);

    Ok(Prepared {
        plan,
        status: status_read,
        _keel_alive: keel_alive_write,
        guard: std::sync::Mutex::new(Some(guard)),
        _temp_dir: temp_dir,
        env: environment(spec, &temp_path),
        notes_before,
        _masks: masks,
        _private_root: private_root_dir,
    })
}

/// The command's environment before the spec's own overrides: the allow-listed variables
/// of keel's environment ([`INHERITED_ENV`], `LC_*`, the spec's
/// [`CommandSpec::inherit_env`] names), the non-interactive defaults, the private
/// temporary directory, and git's foreground maintenance.
fn environment(spec: &CommandSpec, temp_path: &Path) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(key, _)| {
            let name = key.as_bytes();
            INHERITED_ENV.iter().any(|allowed| allowed.as_bytes() == name)
                || name.starts_with(b"LC_")
                || spec.inherited_env_names().iter().any(|named| named == key)
        })
        .collect();
    for (key, value) in crate::spec::NON_INTERACTIVE_ENV {
        env.push((OsString::from(key), OsString::from(value)));
    }
    for key in ["TMPDIR", "TMP", "TEMP"] {
        env.push((OsString::from(key), temp_path.as_os_str().to_owned()));
    }
    env.push((OsString::from("XDG_CACHE_HOME"), temp_path.join(".cache").into_os_string()));
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
            env.push((OsString::from(key), OsString::from(value)));
        }
    }
    env
}

/// An empty directory and file in the private temporary directory, mounted read-only over
/// credential stores.
fn mask_sources(temp_path: &Path) -> Result<(PathBuf, PathBuf)> {
    let dir = temp_path.join(".keel-masks");
    let empty_dir = dir.join("empty-dir");
    let empty_file = dir.join("empty-file");
    std::fs::create_dir_all(&empty_dir)
        .and_then(|()| std::fs::write(&empty_file, ""))
        .map_err(|error| unenforceable(&format!("placeholders for credential stores: {error}")))?;
    Ok((empty_dir, empty_file))
}

fn locked_flags(path: &CString) -> Result<libc::c_ulong> {
    sys::locked_mount_flags(path).map_err(|error| {
        unenforceable(&format!("the mount flags of {}: {error}", path.to_string_lossy()))
    })
}

/// Notes from before the run (recovered plants, skipped configs, repaired links).
pub(crate) fn notes_before(prepared: &Prepared) -> &[String] {
    &prepared.notes_before
}

/// Repairs what the mounts cannot prevent, once the command's process group is dead:
/// waits for its process namespace to be gone, removes plants and puts protected links
/// back. Returns a note for each repair. Dropping [`Prepared`] without calling this
/// repairs too (without notes).
pub(crate) fn after_run(prepared: &Prepared) -> Vec<String> {
    let guard = match prepared.guard.lock() {
        Ok(mut guard) => guard.take(),
        Err(poisoned) => poisoned.into_inner().take(),
    };
    guard.map(plants::PlantGuard::finish).unwrap_or_default()
}

/// Repairs what the durable plant notes in `workspace` name whose keel process is gone:
/// plants a managed command left when keel crashed (or was killed) during it. Returns a
/// note per repair, for the user. Call it once at start, before anything runs git in the
/// workspace; managed runs call it themselves before every command.
pub fn recover_plants(workspace: &Path) -> Vec<String> {
    match workspace.canonicalize() {
        Ok(workspace) => plants::recover(&workspace),
        Err(_) => Vec::new(),
    }
}

/// Why `path` may not be written by an agent in `workspace`, or `None` when it may: the
/// same protected paths managed commands get read-only (git hooks, config,
/// `config.worktree`, `commondir`, config-named hooks paths and includes, `.keel/`, a
/// `KEEL_HOME` inside the workspace, protected symbolic links and their targets, linked
/// worktree state). `path` is absolute; it is checked as given (so a protected link is
/// protected itself) and resolved (so a link to a protected path is too).
pub fn protected_path(workspace: &Path, path: &Path, home: Option<&Path>) -> Option<String> {
    let workspace = match workspace.canonicalize() {
        Ok(workspace) => workspace,
        Err(error) => return Some(format!("the workspace cannot be resolved: {error}")),
    };
    protected::protection(&workspace, path, home)
}

/// Whether `path` (absolute, resolved) is one of the home folder's credential stores
/// (`~/.ssh`, `~/.aws`, `~/.git-credentials`, ... or inside one): managed commands cannot
/// read them, and the file tools refuse them.
pub fn is_credential_store(path: &Path, home: Option<&Path>, xdg_config: Option<&Path>) -> bool {
    filesystem::credential_stores(home, xdg_config).iter().any(|store| path.starts_with(store))
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
    fn an_abi_ceiling_below_the_minimum_refuses() {
        let error = managed_support(Some(2)).unwrap_err();
        assert!(error.to_string().contains("landlock abi 3 or newer"), "{error}");
    }
}
