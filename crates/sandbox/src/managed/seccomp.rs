//! The seccomp filters: what Landlock cannot express.
//!
//! Every `socket(2)` is refused (no network, and no UNIX socket: Landlock before ABI 9
//! cannot restrict `connect` to a pathname socket such as the Docker or D-Bus socket;
//! `socketpair(2)` stays allowed). When the user allowed the network, `socket(2)` is
//! allowed for `AF_INET` and `AF_INET6` only; UNIX, netlink, packet and every other family
//! stay refused. Also refused: tracing other processes, mounting and
//! namespaces, the kernel keyring, BPF, perf, kernel modules and kexec, io_uring (it can
//! bypass these syscall checks), opening files by handle (bypasses path checks),
//! leaving the process group (`setsid`, `setpgid`: the group is how keel cleans up),
//! terminal injection ioctls, and raw I/O ports. A mode with a set-uid or set-gid bit is
//! refused for `chmod`, `fchmod`, `fchmodat`, `fchmodat2`, `mknod`, `mknodat`, `creat`,
//! and `open`/`openat` when they create; `openat2` returns `ENOSYS`. Refusals return `EPERM`; `clone3` returns
//! `ENOSYS` so C libraries fall back to `clone`, whose namespace flags can be inspected.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

/// System calls refused unconditionally.
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_userfaultfd,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_fanotify_init,
    libc::SYS_setsid,
    libc::SYS_setpgid,
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_syslog,
    libc::SYS_quotactl,
    libc::SYS_vhangup,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// `clone` flags that create namespaces.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
];

/// `fchmodat2(2)` (Linux 6.6), not yet named by every libc.
const SYS_FCHMODAT2: libc::c_long = 452;

/// The set-id mode bits a command may not set on a file.
const SET_ID_BITS: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];

/// Calls that set a file mode, with the index of their mode argument and, for calls that
/// take a mode only when creating, the index of their flags argument.
#[cfg(target_arch = "x86_64")]
const MODE_CALLS: &[(libc::c_long, u8, Option<u8>)] = &[
    (libc::SYS_chmod, 1, None),
    (libc::SYS_fchmod, 1, None),
    (libc::SYS_fchmodat, 2, None),
    (SYS_FCHMODAT2, 2, None),
    (libc::SYS_creat, 1, None),
    (libc::SYS_mknod, 1, None),
    (libc::SYS_mknodat, 2, None),
    (libc::SYS_open, 2, Some(1)),
    (libc::SYS_openat, 3, Some(2)),
];
#[cfg(not(target_arch = "x86_64"))]
const MODE_CALLS: &[(libc::c_long, u8, Option<u8>)] = &[
    (libc::SYS_fchmod, 1, None),
    (libc::SYS_fchmodat, 2, None),
    (SYS_FCHMODAT2, 2, None),
    (libc::SYS_mknodat, 2, None),
    (libc::SYS_openat, 3, Some(2)),
];

/// Terminal ioctls that inject input into, or control, another program's terminal.
const DENIED_IOCTLS: &[libc::c_ulong] = &[libc::TIOCSTI, libc::TIOCLINUX];

/// The filters to install, in order; `network` allows IPv4 and IPv6 sockets. Fails when
/// this architecture is not supported or a rule does not compile: managed mode then
/// refuses.
pub(crate) fn filters(network: bool) -> Result<Vec<BpfProgram>, String> {
    let arch = target_arch()?;
    let deny = deny_filter(arch, network).map_err(|error| format!("seccomp filter: {error}"))?;
    // `openat2` takes its mode in a struct the filter cannot read: ENOSYS makes callers
    // fall back to `openat`, whose mode is checked.
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![]), (libc::SYS_openat2, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(errno(libc::ENOSYS)),
        arch,
    )
    .and_then(BpfProgram::try_from)
    .map_err(|error| format!("seccomp clone3 filter: {error}"))?;
    Ok(vec![deny, clone3])
}

fn deny_filter(arch: TargetArch, network: bool) -> Result<BpfProgram, seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for syscall in DENIED {
        rules.insert(*syscall, vec![]);
    }
    let socket_rules = if network {
        // Refused when the domain is neither AF_INET nor AF_INET6.
        let not_family = |family: libc::c_int| {
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                u64::from(family.unsigned_abs()),
            )
        };
        vec![SeccompRule::new(vec![not_family(libc::AF_INET)?, not_family(libc::AF_INET6)?])?]
    } else {
        vec![]
    };
    rules.insert(libc::SYS_socket, socket_rules);
    let mut clone_rules = Vec::new();
    for flag in NAMESPACE_FLAGS {
        let flag = u64::from(flag.unsigned_abs());
        clone_rules.push(SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(flag),
            flag,
        )?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    let mut ioctl_rules = Vec::new();
    for request in DENIED_IOCTLS {
        ioctl_rules.push(SeccompRule::new(vec![SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            *request,
        )?])?);
    }
    rules.insert(libc::SYS_ioctl, ioctl_rules);
    // No set-uid or set-gid bit on any file: refused when the mode argument carries one
    // (for open and openat only when they create, O_CREAT or O_TMPFILE).
    for (syscall, mode_arg, flags_arg) in MODE_CALLS {
        let mut mode_rules = Vec::new();
        for bit in SET_ID_BITS {
            let mode = SeccompCondition::new(
                *mode_arg,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(bit),
                bit,
            )?;
            match flags_arg {
                None => mode_rules.push(SeccompRule::new(vec![mode])?),
                Some(flags_arg) => {
                    for create in [libc::O_CREAT, libc::O_TMPFILE & !libc::O_DIRECTORY] {
                        let create = u64::from(create.unsigned_abs());
                        let flags = SeccompCondition::new(
                            *flags_arg,
                            SeccompCmpArgLen::Dword,
                            SeccompCmpOp::MaskedEq(create),
                            create,
                        )?;
                        mode_rules.push(SeccompRule::new(vec![flags, mode.clone()])?);
                    }
                }
            }
        }
        rules.insert(*syscall, mode_rules);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno(libc::EPERM)),
        arch,
    )?;
    let program = BpfProgram::try_from(filter)?;
    Ok(with_x32_guard(program))
}

#[cfg(target_arch = "x86_64")]
fn target_arch() -> Result<TargetArch, String> {
    Ok(TargetArch::x86_64)
}

#[cfg(target_arch = "aarch64")]
fn target_arch() -> Result<TargetArch, String> {
    Ok(TargetArch::aarch64)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn target_arch() -> Result<TargetArch, String> {
    Err(format!("seccomp filters for {}", std::env::consts::ARCH))
}

/// On x86_64, x32 system calls share the architecture value but set bit 30 of the number,
/// so the rules above would not see them: refuse every such call first.
#[cfg(target_arch = "x86_64")]
fn with_x32_guard(program: BpfProgram) -> BpfProgram {
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const LD_W_ABS: u16 = 0x20;
    const JMP_JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    let mut guarded = vec![
        // Load the syscall number (offset 0 of struct seccomp_data).
        sock_filter { code: LD_W_ABS, jt: 0, jf: 0, k: 0 },
        sock_filter { code: JMP_JGE_K, jt: 0, jf: 1, k: X32_SYSCALL_BIT },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: u32::from(SeccompAction::Errno(errno(libc::EPERM))),
        },
    ];
    guarded.extend(program);
    guarded
}

#[cfg(not(target_arch = "x86_64"))]
fn with_x32_guard(program: BpfProgram) -> BpfProgram {
    program
}

fn errno(value: libc::c_int) -> u32 {
    value.unsigned_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        for network in [false, true] {
            let filters = filters(network).unwrap();
            assert_eq!(filters.len(), 2);
            assert!(
                filters.iter().all(|filter| !filter.is_empty() && filter.len() < u16::MAX.into())
            );
        }
    }
}
