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

/// Everything the child needs to contain itself, prepared by the parent.
#[derive(Debug)]
pub(crate) struct ChildContainment {
    /// `Some((uid_map, gid_map))`: also create a user namespace (unprivileged callers) with
    /// these map lines, so the mount namespace can be set up.
    pub(crate) id_maps: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) mounts: Vec<BindMount>,
    pub(crate) landlock_ruleset: OwnedFd,
    pub(crate) seccomp_filters: Vec<Vec<seccompiler::sock_filter>>,
    /// Write end of the status pipe: the child writes `[step, errno (4 bytes LE)]` there
    /// when a step fails.
    pub(crate) status: OwnedFd,
}

/// Makes the child start a new session and then contain itself: private mount (and, when
/// unprivileged, user) namespace with the protected bind mounts, no capabilities,
/// `no_new_privs`, the Landlock ruleset and the seccomp filters, in that order.
pub(crate) fn start_contained_session(
    command: &mut tokio::process::Command,
    plan: Arc<ChildContainment>,
) {
    // SAFETY: the hook runs in the forked child before exec. It only reads `plan`, which
    // the parent built before the fork and does not change, and makes async-signal-safe
    // system calls (setsid, unshare, open, write, close, mount, prctl, capset, syscall)
    // with pointers into that memory or the stack. It does not allocate.
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
        let mut flags = libc::CLONE_NEWNS;
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
        for mount in &plan.mounts {
            let path = mount.path.as_ptr();
            let source = mount.source.as_ref().map_or(path, |source| source.as_ptr());
            if libc::mount(source, path, null, libc::MS_BIND, std::ptr::null()) == -1 {
                return Err(fail(ChildStep::BindMount));
            }
            if let Some(locked) = mount.read_only_flags {
                let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | locked;
                if libc::mount(null, path, null, flags, std::ptr::null()) == -1 {
                    return Err(fail(ChildStep::ReadOnlyRemount));
                }
            }
        }
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
    Ok(())
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
