//! Raw system calls: the only `unsafe` code in keel.
//!
//! Each function wraps one small, documented use of libc. Code that runs between `fork`
//! and `exec` (the `pre_exec` hooks) calls async-signal-safe system calls only: it neither
//! allocates nor takes locks, because the parent is multi-threaded.
#![allow(unsafe_code)]

use std::io;

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
