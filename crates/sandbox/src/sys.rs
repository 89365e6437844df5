//! Raw system calls: the only `unsafe` code in keel.
//!
//! Each function wraps one small, documented use of libc. Code that runs between `fork`
//! and `exec` (the `pre_exec` hooks) calls async-signal-safe system calls only: it neither
//! allocates nor takes locks, because the parent is multi-threaded. Everything such a hook
//! needs (paths, maps, the Landlock ruleset, the seccomp programs) is prepared by the
//! parent beforehand in a [`ChildContainment`].
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// Makes the child call `setsid(2)` before `exec`: a new session without a controlling
/// terminal, whose process group id equals the child's pid.
pub(crate) fn start_new_session(command: &mut tokio::process::Command) {
    // SAFETY: the hook runs in the forked child before exec. It calls setsid(2) only,
    // which is async-signal-safe, and builds an io::Error from errno, which does not
    // allocate. It touches no memory shared with other threads of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            close_inherited_on_exec();
            Ok(())
        });
    }
}

/// Sends `SIGKILL` to every process in process group `pgid`.
///
/// Refuses group ids 0 and 1 (`killpg(0)` would signal keel's own group). A group that no
/// longer exists is not an error.
pub(crate) fn kill_process_group(pgid: u32) -> io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "process group id too large"))?;
    if pgid <= 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "refusing to signal group 0 or 1"));
    }
    // SAFETY: killpg(2) only sends a signal; it reads and writes no memory of ours. The
    // group id is one keel created with setsid for a child it spawned, and is above 1.
    let rc = unsafe { libc::killpg(pgid, libc::SIGKILL) };
    if rc == -1 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ESRCH) {
            return Ok(());
        }
        return Err(error);
    }
    Ok(())
}

/// The Landlock ABI version the kernel supports; 0 or negative when Landlock is missing or
/// disabled.
pub(crate) fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag, the call only
    // returns the ABI version; it reads no memory.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0_usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    }
}

/// Whether the kernel supports seccomp filters.
pub(crate) fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointers; it returns the calling thread's mode, or
    // fails with EINVAL when the kernel has no seccomp.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// The real user and group id of this process.
pub(crate) fn user_and_group() -> (u32, u32) {
    // SAFETY: getuid(2) and getgid(2) cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// The mount flags of the mount holding `path` that a read-only bind remount must keep
/// (nosuid, nodev, noexec and the atime flags; a user namespace may not clear them).
pub(crate) fn locked_mount_flags(path: &CStr) -> io::Result<libc::c_ulong> {
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `stat` a valid, writable statvfs.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &raw mut stat) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    let keep = libc::ST_NOSUID
        | libc::ST_NODEV
        | libc::ST_NOEXEC
        | libc::ST_NOATIME
        | libc::ST_NODIRATIME
        | libc::ST_RELATIME;
    // The ST_* values equal the MS_* values for these flags.
    Ok(stat.f_flag & keep)
}

/// Waits (at most `timeout`) until the init whose pid the shim reported on `init_report`
/// has exited: then no process of its namespace is left. Returns at once when no pid was
/// reported (the command never started) or the init is already gone.
pub(crate) fn wait_for_namespace(init_report: &OwnedFd, timeout: std::time::Duration) {
    let mut bytes = [0_u8; 4];
    // SAFETY: `bytes` is valid for 4 bytes; the descriptor is an open, non-blocking pipe.
    let n = unsafe { libc::read(init_report.as_raw_fd(), bytes.as_mut_ptr().cast(), bytes.len()) };
    if n != 4 {
        return;
    }
    let init = libc::pid_t::from_le_bytes(bytes);
    if init <= 1 {
        return;
    }
    // SAFETY: pidfd_open takes integers only.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, init, 0) };
    let Ok(pidfd) = libc::c_int::try_from(pidfd) else { return };
    if pidfd < 0 {
        return;
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let timeout_ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    let mut poll = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: `poll` is a valid pollfd for the duration of the call. A pidfd becomes
    // readable when the process exits, which for a namespace's init happens only after
    // every other process of the namespace is gone.
    unsafe {
        libc::poll(&raw mut poll, 1, timeout_ms);
    }
}

/// A pipe whose ends close on exec; the read end does not block.
pub(crate) fn status_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    unsafe { Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))) }
}

/// Reads the failure a contained child reported before exec, if any: which step failed and
/// its errno.
pub(crate) fn read_child_failure(read_end: &OwnedFd) -> Option<(u8, i32)> {
    let mut buffer = [0_u8; 5];
    // SAFETY: `buffer` is valid for 5 bytes; the descriptor is an open pipe we own.
    let n = unsafe { libc::read(read_end.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if n != 5 {
        return None;
    }
    let errno = i32::from_le_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]);
    Some((buffer[0], errno))
}

/// One step of setting up containment in the child, as reported through the status pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ChildStep {
    Setsid = 1,
    Unshare = 2,
    IdMaps = 3,
    PrivateMounts = 4,
    BindMount = 5,
    ReadOnlyRemount = 6,
    DropCapabilities = 7,
    NoNewPrivs = 8,
    Landlock = 9,
    Seccomp = 10,
    WritableRemount = 11,
    Chdir = 12,
    Fork = 13,
    DeathSignal = 14,
    AliasMount = 15,
    PrivateRoot = 16,
}

impl ChildStep {
    pub(crate) fn describe(code: u8) -> &'static str {
        match code {
            1 => "setsid",
            2 => "creating the mount namespace (unshare)",
            3 => "writing the user namespace id maps",
            4 => "making mounts private",
            5 => "bind-mounting a protected or deny-masked path",
            6 => "remounting a protected or deny-masked path read-only",
            7 => "dropping capabilities",
            8 => "setting no_new_privs",
            9 => "landlock_restrict_self",
            10 => "installing the seccomp filter",
            11 => "remounting a writable root nosuid",
            12 => "entering the working directory again",
            13 => "forking into the process namespace",
            14 => "setting the parent-death signal",
            15 => "covering another mount of the workspace",
            16 => "building the private root for mapped directories (bind mount, chroot)",
            _ => "an unknown step",
        }
    }
}

/// A bind mount the child makes in its private mount namespace, on a path onto itself.
#[derive(Debug)]
pub(crate) struct BindMount {
    pub(crate) path: CString,
    /// What to bind onto `path`; `None` binds `path` onto itself.
    pub(crate) source: Option<CString>,
    /// Remount read-only (with these locked flags kept); `None` only pins the path (a mount
    /// point cannot be renamed or removed).
    pub(crate) read_only_flags: Option<libc::c_ulong>,
}

/// A writable root (workspace, temporary directory, extra writable path) the child
/// bind-mounts onto itself, recursively, and remounts `nosuid,nodev` keeping these locked
/// flags: set-id bits and device files mean nothing there.
#[derive(Debug)]
pub(crate) struct WritableRoot {
    pub(crate) path: CString,
    pub(crate) locked_flags: libc::c_ulong,
}

/// A bind mount of `source` over another path, made after the protected paths:
/// - another mount point that shows (part of) the workspace gets the workspace's own view
///   (recursively, with its read-only protected paths);
/// - a credential store gets an empty placeholder (read-only), so it reads as empty.
#[derive(Debug)]
pub(crate) struct AliasMount {
    pub(crate) source: CString,
    pub(crate) target: CString,
    /// Remount read-only with these locked flags kept; `None` keeps the source's flags.
    pub(crate) read_only_flags: Option<libc::c_ulong>,
}

/// A private root for a command with mapped directories: an empty directory the parent
/// filled with mount points (and copies of the host root's symbolic links), and the bind
/// mounts that fill it.
#[derive(Debug)]
pub(crate) struct PrivateRoot {
    pub(crate) new_root: CString,
    pub(crate) binds: Vec<(CString, CString)>,
}

/// Everything the child needs to contain itself, prepared by the parent.
#[derive(Debug)]
pub(crate) struct ChildContainment {
    /// `Some((uid_map, gid_map))`: also create a user namespace (unprivileged callers) with
    /// these map lines, so the mount namespace can be set up.
    pub(crate) id_maps: Option<(Vec<u8>, Vec<u8>)>,
    /// Mounted first, before the protected paths under them.
    pub(crate) writable_roots: Vec<WritableRoot>,
    pub(crate) mounts: Vec<BindMount>,
    /// Mounted last, once the protected paths are in place.
    pub(crate) aliases: Vec<AliasMount>,
    /// `Some`: after the other mounts, bind-mount each `(source, target)` recursively (the
    /// targets lie in `new_root`, prepared by the parent) and `chroot` into `new_root`;
    /// `cwd` is then a path inside it.
    pub(crate) private_root: Option<PrivateRoot>,
    /// The working directory, entered again after the mounts so that it is looked up
    /// through them (a directory entered before would still show the unprotected tree).
    pub(crate) cwd: CString,
    /// Read end of the pipe whose only write end keel holds for the run: when it reports
    /// end-of-file, keel is gone (even after `kill -9`) and the command's process namespace
    /// is killed.
    pub(crate) keel_alive: OwnedFd,
    /// Write end of the pipe the shim reports the init's pid on (4 bytes, little endian).
    pub(crate) init_report: OwnedFd,
    pub(crate) landlock_ruleset: OwnedFd,
    pub(crate) seccomp_filters: Vec<Vec<seccompiler::sock_filter>>,
    /// Write end of the status pipe: the child writes `[step, errno (4 bytes LE)]` there
    /// when a step fails.
    pub(crate) status: OwnedFd,
}

/// Makes the child start a new session and then contain itself: private mount (and, when
/// unprivileged, user) namespace with the writable roots remounted `nosuid,nodev`, the
/// protected bind mounts and the aliases of the workspace covered; then a new PID
/// namespace, no capabilities, `no_new_privs`, the Landlock ruleset and the seccomp
/// filters, in that order.
///
/// Three processes result, and the spawned pid keel sees is the first:
/// - the *shim* (the spawned process, outside the new PID namespace) waits for the
///   namespace's init and exits with the command's own status; when keel's end of
///   [`ChildContainment::keel_alive`] closes (keel exited or was killed with `SIGKILL`) it
///   kills the init;
/// - the *init* (pid 1 of the namespace, parent-death signal `SIGKILL` from the shim) reaps
///   every process of the namespace and reports the command's wait status to the shim;
/// - the *command* (pid 2) is contained and executed.
///
/// When the init dies the kernel kills every process of the namespace, so nothing the
/// command started (double forks and new sessions included) outlives the shim, and the
/// shim does not outlive keel.
pub(crate) fn start_contained_session(
    command: &mut tokio::process::Command,
    plan: Arc<ChildContainment>,
) {
    // SAFETY: the hook runs in the forked child before exec. It only reads `plan`, which
    // the parent built before the fork and does not change, and makes async-signal-safe
    // system calls (setsid, unshare, open, write, close, mount, chdir, pipe2, clone without
    // atfork handlers, poll, waitpid, kill, prctl, capset, syscall, _exit) with pointers
    // into that memory or the stack. It does not allocate.
    unsafe {
        command.pre_exec(move || contain_child(&plan));
    }
}

fn contain_child(plan: &ChildContainment) -> io::Result<()> {
    let status = plan.status.as_raw_fd();
    let fail = |step: ChildStep| -> io::Error {
        let error = io::Error::last_os_error();
        let errno = error.raw_os_error().unwrap_or(0);
        let bytes = errno.to_le_bytes();
        let record = [step as u8, bytes[0], bytes[1], bytes[2], bytes[3]];
        // SAFETY: `record` is a valid 5-byte buffer; the descriptor is the open status pipe.
        unsafe {
            libc::write(status, record.as_ptr().cast(), record.len());
        }
        error
    };

    // SAFETY: each call below is a plain system call on valid arguments: NUL-terminated
    // strings owned by `plan`, stack buffers, or integers.
    unsafe {
        if libc::setsid() == -1 {
            return Err(fail(ChildStep::Setsid));
        }
        let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID;
        if plan.id_maps.is_some() {
            flags |= libc::CLONE_NEWUSER;
        }
        if libc::unshare(flags) == -1 {
            return Err(fail(ChildStep::Unshare));
        }
        if let Some((uid_map, gid_map)) = &plan.id_maps
            && !(write_proc_file(c"/proc/self/setgroups", b"deny")
                && write_proc_file(c"/proc/self/uid_map", uid_map)
                && write_proc_file(c"/proc/self/gid_map", gid_map))
        {
            return Err(fail(ChildStep::IdMaps));
        }
        let null = std::ptr::null::<libc::c_char>();
        if libc::mount(null, c"/".as_ptr(), null, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null())
            == -1
        {
            return Err(fail(ChildStep::PrivateMounts));
        }
        for root in &plan.writable_roots {
            let path = root.path.as_ptr();
            if libc::mount(path, path, null, libc::MS_BIND | libc::MS_REC, std::ptr::null()) == -1 {
                return Err(fail(ChildStep::WritableRemount));
            }
            let flags = libc::MS_REMOUNT
                | libc::MS_BIND
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | root.locked_flags;
            if libc::mount(null, path, null, flags, std::ptr::null()) == -1 {
                return Err(fail(ChildStep::WritableRemount));
            }
        }
        for mount in &plan.mounts {
            let path = mount.path.as_ptr();
            let source = mount.source.as_ref().map_or(path, |source| source.as_ptr());
            if libc::mount(source, path, null, libc::MS_BIND, std::ptr::null()) == -1 {
                return Err(fail(ChildStep::BindMount));
            }
            if let Some(locked) = mount.read_only_flags {
                let flags = libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | locked;
                if libc::mount(null, path, null, flags, std::ptr::null()) == -1 {
                    return Err(fail(ChildStep::ReadOnlyRemount));
                }
            }
        }
        for alias in &plan.aliases {
            if libc::mount(
                alias.source.as_ptr(),
                alias.target.as_ptr(),
                null,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) == -1
            {
                return Err(fail(ChildStep::AliasMount));
            }
            if let Some(locked) = alias.read_only_flags {
                let flags = libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | locked;
                if libc::mount(null, alias.target.as_ptr(), null, flags, std::ptr::null()) == -1 {
                    return Err(fail(ChildStep::AliasMount));
                }
            }
        }
        if let Some(private_root) = &plan.private_root {
            for (source, target) in &private_root.binds {
                if libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) == -1
                {
                    return Err(fail(ChildStep::PrivateRoot));
                }
            }
            if libc::chroot(private_root.new_root.as_ptr()) == -1 {
                return Err(fail(ChildStep::PrivateRoot));
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) == -1 {
            return Err(fail(ChildStep::Chdir));
        }
    }
    enter_pid_namespace(plan.keel_alive.as_raw_fd(), plan.init_report.as_raw_fd()).map_err(fail)?;

    // SAFETY: as above; this runs in the command process (pid 2 of the namespace).
    unsafe {
        if !drop_capabilities() {
            return Err(fail(ChildStep::DropCapabilities));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1 {
            return Err(fail(ChildStep::NoNewPrivs));
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, plan.landlock_ruleset.as_raw_fd(), 0)
            == -1
        {
            return Err(fail(ChildStep::Landlock));
        }
        for filter in &plan.seccomp_filters {
            let Ok(len) = libc::c_ushort::try_from(filter.len()) else {
                return Err(fail(ChildStep::Seccomp));
            };
            let program = libc::sock_fprog { len, filter: filter.as_ptr().cast_mut().cast() };
            if libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &raw const program,
            ) == -1
            {
                return Err(fail(ChildStep::Seccomp));
            }
        }
    }
    close_inherited_on_exec();
    Ok(())
}

/// Marks every descriptor above stderr close-on-exec, so the command inherits only its
/// standard streams: a descriptor keel got from its own parent (a CI runner's socket, a
/// make jobserver pipe, a file opened outside the workspace) never reaches a command.
/// Descriptors the standard library needs until `exec` (its exec-status pipe) keep working,
/// since they are closed by `exec` itself. Async-signal-safe.
fn close_inherited_on_exec() {
    // SAFETY: close_range and fcntl take integers only; marking a descriptor close-on-exec
    // affects this (forked) process alone.
    unsafe {
        let marked =
            libc::syscall(libc::SYS_close_range, 3_u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
        if marked == -1 {
            // A kernel without CLOSE_RANGE_CLOEXEC: mark them one by one up to a bound.
            for fd in 3..4096 {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
    }
}

/// After `unshare(CLONE_NEWPID)`: forks the namespace's init and, from it, the command.
/// Returns (`Ok`) only in the command process; the shim and the init never return (they
/// `_exit`). Async-signal-safe.
fn enter_pid_namespace(keel_alive: libc::c_int, init_report: libc::c_int) -> Result<(), ChildStep> {
    let mut shim_alive = [0 as libc::c_int; 2];
    let mut report = [0 as libc::c_int; 2];
    // SAFETY: plain system calls on stack arrays of two ints.
    unsafe {
        if libc::pipe2(shim_alive.as_mut_ptr(), libc::O_CLOEXEC) == -1 {
            return Err(ChildStep::Fork);
        }
        if libc::pipe2(report.as_mut_ptr(), libc::O_CLOEXEC) == -1 {
            return Err(ChildStep::Fork);
        }
    }
    let [shim_alive_read, shim_alive_write] = shim_alive;
    let [report_read, report_write] = report;
    // The shim and the init never exec, so keel's signal handlers (tokio's SIGCHLD
    // handler among them) would otherwise run in them.
    reset_signal_handlers();
    let init = raw_fork().ok_or(ChildStep::Fork)?;
    if init > 0 {
        // SAFETY: closing descriptors this process owns; `bytes` is a valid 4-byte buffer.
        unsafe {
            libc::close(shim_alive_read);
            libc::close(report_write);
            let bytes = init.to_le_bytes();
            libc::write(init_report, bytes.as_ptr().cast(), bytes.len());
        }
        run_shim(init, keel_alive, report_read, shim_alive_write);
    }
    // The init: pid 1 of the new namespace.
    // SAFETY: integer arguments and descriptors this process owns.
    unsafe {
        libc::close(shim_alive_write);
        libc::close(report_read);
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == -1 {
            return Err(ChildStep::DeathSignal);
        }
        // The shim may have died before the death signal was set: then nothing would kill
        // this namespace, so stop here.
        let mut poll = libc::pollfd { fd: shim_alive_read, events: libc::POLLIN, revents: 0 };
        if libc::poll(&raw mut poll, 1, 0) != 0 {
            libc::_exit(1);
        }
        libc::close(shim_alive_read);
    }
    let command = raw_fork().ok_or(ChildStep::Fork)?;
    if command > 0 {
        run_init(command, report_write);
    }
    // SAFETY: closing a descriptor this process owns.
    unsafe {
        libc::close(report_write);
    }
    Ok(())
}

/// Resets every signal's disposition to the default. Async-signal-safe.
fn reset_signal_handlers() {
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: signal(2) with SIG_DFL installs no handler; an invalid number fails
        // harmlessly with EINVAL.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
        }
    }
}

/// `fork` as a raw `clone(SIGCHLD)`: no atfork handlers run, so no lock inherited from the
/// multi-threaded parent is taken. `Some(0)` in the child, `Some(pid)` in the parent.
fn raw_fork() -> Option<libc::pid_t> {
    // SAFETY: clone with SIGCHLD only and no new stack behaves as fork: the child continues
    // on a copy of this stack. No pointer arguments are passed.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_ulong::from(libc::SIGCHLD.unsigned_abs()),
            0,
            0,
            0,
            0,
        )
    };
    if pid < 0 { None } else { libc::pid_t::try_from(pid).ok() }
}

/// The shim: waits for the namespace's init and exits like the command did; kills the init
/// when keel is gone. Never returns.
fn run_shim(
    init: libc::pid_t,
    keel_alive: libc::c_int,
    report_read: libc::c_int,
    shim_alive_write: libc::c_int,
) -> ! {
    // SAFETY: system calls on integers and stack buffers; `_exit` ends the process without
    // running any handler of the parent.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, init, 0);
        let pidfd = libc::c_int::try_from(pidfd).unwrap_or(-1);
        // Drop every other descriptor: the output pipes (so end-of-file comes from the
        // command alone), the standard library's exec-status pipe (so the spawn in keel
        // completes when the command executes), and whatever keel had open at the fork.
        close_all_except(&[keel_alive, report_read, shim_alive_write, pidfd]);
        loop {
            let mut fds = [
                libc::pollfd { fd: keel_alive, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 },
            ];
            // Without a pidfd (not expected on a kernel with Landlock ABI 3) poll keel's
            // pipe with a timeout and check the init in between.
            let (n_fds, timeout) = if pidfd >= 0 { (2, -1) } else { (1, 50) };
            let ready = libc::poll(fds.as_mut_ptr(), n_fds, timeout);
            if ready == -1 {
                continue;
            }
            if fds[0].revents != 0 {
                libc::kill(init, libc::SIGKILL);
                let mut ignored = 0;
                libc::waitpid(init, &raw mut ignored, 0);
                libc::_exit(137);
            }
            let mut init_status = 0;
            let waited = libc::waitpid(init, &raw mut init_status, libc::WNOHANG);
            if waited == init {
                let mut reported = [0_u8; 4];
                let n = libc::read(report_read, reported.as_mut_ptr().cast(), reported.len());
                let command_status =
                    if n == 4 { libc::c_int::from_le_bytes(reported) } else { init_status };
                exit_like(command_status);
            }
            if waited == -1 {
                libc::_exit(1);
            }
        }
    }
}

/// The namespace's init: reaps every process until the command exits, reports its wait
/// status to the shim and exits, which kills what is left in the namespace. Never returns.
fn run_init(command: libc::pid_t, report_write: libc::c_int) -> ! {
    // SAFETY: system calls on integers and stack buffers.
    unsafe {
        close_all_except(&[report_write]);
        loop {
            let mut status = 0;
            let reaped = libc::waitpid(-1, &raw mut status, 0);
            if reaped == command {
                let bytes = status.to_le_bytes();
                libc::write(report_write, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0);
            }
            if reaped == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(1);
            }
        }
    }
}

/// Exits with the same status as a process that ended with wait status `status`: its exit
/// code, or death by the same signal (without a core dump). Never returns.
fn exit_like(status: libc::c_int) -> ! {
    // SAFETY: integer system calls; `_exit` runs no handler.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &raw const no_core);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

/// Closes every descriptor except those in `keep` (negative entries ignored).
/// Async-signal-safe.
fn close_all_except(keep: &[libc::c_int]) {
    let mut sorted = [-1 as libc::c_int; 8];
    let mut n_kept = 0;
    for fd in keep.iter().copied().filter(|fd| *fd >= 0).take(sorted.len()) {
        sorted[n_kept] = fd;
        n_kept += 1;
    }
    sorted[..n_kept].sort_unstable();
    let mut next: libc::c_uint = 0;
    for fd in &sorted[..n_kept] {
        let fd = fd.unsigned_abs();
        if fd > next {
            close_range(next, fd - 1);
        }
        next = fd + 1;
    }
    close_range(next, libc::c_uint::MAX);
}

fn close_range(first: libc::c_uint, last: libc::c_uint) {
    // SAFETY: close_range takes integers only.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    if rc == -1 {
        // A kernel without close_range: close one by one up to a generous bound.
        for fd in first..=last.min(4096) {
            // SAFETY: closing a descriptor number; a closed one fails harmlessly.
            unsafe { libc::close(fd.cast_signed()) };
        }
    }
}

/// Writes `content` to a /proc file in one `write`. Async-signal-safe.
///
/// # Safety
///
/// Call only with a NUL-terminated path; it performs raw open/write/close.
unsafe fn write_proc_file(path: &CStr, content: &[u8]) -> bool {
    // SAFETY: `path` is NUL-terminated; the flags open for writing only.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd == -1 {
        return false;
    }
    // SAFETY: `content` is valid for its length; `fd` was just opened.
    let written = unsafe { libc::write(fd, content.as_ptr().cast(), content.len()) };
    // SAFETY: `fd` is open and ours.
    unsafe { libc::close(fd) };
    usize::try_from(written).is_ok_and(|written| written == content.len())
}

/// Empties the bounding, ambient, inheritable, permitted and effective capability sets, so
/// neither this process nor anything it executes holds a capability (root included).
/// Async-signal-safe.
fn drop_capabilities() -> bool {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

    for capability in 0..64 {
        // SAFETY: PR_CAPBSET_DROP takes an integer; EINVAL means no such capability, which
        // ends the list.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0) } == -1 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return false;
        }
    }
    // SAFETY: integer arguments only. Failure (a kernel without ambient capabilities) leaves
    // nothing ambient to clear.
    unsafe {
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    }
    let header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: version 3 capset reads one header and two data structs, which live on the
    // stack for the duration of the call.
    unsafe { libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) == 0 }
}
