//! Lease holders: who this process is (`keel pid N on HOST`), whether a holder on this
//! machine still lives, and what a listing therefore calls a session whose run is open.

use std::path::Path;

use keel_contracts::Store;

/// Who this process is, for session leases: `keel pid 4242 on build-7`.
pub fn lease_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "this host".to_owned());
    format!("keel pid {} on {host}", std::process::id())
}

/// Liveness of lease holders on this host: `keel pid N on HOST` is alive while `/proc/N`
/// exists and is not a zombie (a reused pid reads as alive: the safe side); unknown for
/// other hosts.
#[derive(Debug)]
pub struct LocalProcesses;

impl keel_kernel::HolderLiveness for LocalProcesses {
    fn alive(&self, holder: &str) -> Option<bool> {
        holder_alive(holder)
    }
}

/// How every listing names a session's state (`keel sessions`, `keel log`, the HTTP API's
/// `state`): its stored status, except that an open run nobody drives is `interrupted`
/// (see [`gone_holder`]; `keel resume` continues it, and the next start closes it).
/// Reads the lease, never takes it: a listing writes nothing.
///
/// # Cancel safety
///
/// Cancel-safe: it only reads.
pub async fn shown_state(
    store: &dyn Store,
    session: &keel_contracts::SessionSummary,
) -> &'static str {
    match session.status {
        keel_contracts::SessionStatus::Running
            if gone_holder(store, session.id).await.is_some() =>
        {
            "interrupted"
        }
        status => status.as_str(),
    }
}

/// Why nobody drives the session's open run, when that is known: no process holds its
/// lease (never taken, released, or lapsed unrenewed by a holder whose liveness is
/// unknown), or its holder's process is gone (killed, crashed). `None` when a live process
/// (or one on another machine, or a store without leases) may still hold it: a holder
/// named on this machine whose process is alive still drives the run even when its lease
/// lapsed (stopped with SIGSTOP, or starved), so it is running and `keel stop` cancels it.
///
/// Reads the lease row only (`Store::current_lease`): nothing is written. A store error
/// reads as "may still be driven" (`None`): the safe side, never a false `interrupted`.
///
/// # Cancel safety
///
/// Cancel-safe: it only reads.
pub async fn gone_holder(
    store: &dyn Store,
    session_id: keel_contracts::SessionId,
) -> Option<String> {
    let now = keel_contracts::Clock::now(&keel_contracts::SystemClock);
    match store.current_lease(session_id).await {
        Ok(None) => Some("no process holds its lease".to_owned()),
        Ok(Some(lease)) => match holder_alive(&lease.holder) {
            Some(true) => None,
            Some(false) => Some(format!("the process that ran it ({}) is gone", lease.holder)),
            None if lease.expires_at <= now => Some("no process holds its lease".to_owned()),
            None => None,
        },
        Err(_) => None,
    }
}

fn holder_alive(holder: &str) -> Option<bool> {
    let rest = holder.strip_prefix("keel pid ")?;
    let (pid, host) = rest.split_once(" on ")?;
    // A role after the host name (`keel pid 7 on build-7 (inert)`) is the same process.
    let host = host.split_once(" (").map_or(host, |(host, _)| host);
    let pid: u32 = pid.parse().ok()?;
    let this_host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    if host != this_host.trim() {
        return None;
    }
    if pid == std::process::id() {
        return Some(true);
    }
    // Gone, or a zombie (killed, not yet reaped by its parent): it can write nothing more.
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Some(Path::new(&format!("/proc/{pid}")).exists());
    };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    Some(!matches!(state, Some("Z" | "X")))
}
