//! `keel seal`: make a session inert (DESIGN.md §6). A sealed session never runs agent code
//! again; `keel log` and `keel sessions` still show it, and `keel resume` refuses it.

use std::sync::Arc;

use keel_contracts::{EventKind, RuntimeEvent, SessionId, Store};
use keel_host::error::usage;
use keel_kernel::KernelError;

use crate::exit;
use crate::output::Printer;

/// The reason recorded when the user gives none.
const DEFAULT_REASON: &str = "sealed by the user";

/// `keel seal SESSION [--reason TEXT]`.
///
/// # Errors
///
/// A usage error when no session matches or it is sealed already; the store's error when
/// the ledger cannot be read or written.
pub(crate) async fn seal(
    store: Arc<dyn Store>,
    session: &str,
    reason: Option<String>,
) -> anyhow::Result<u8> {
    let session_id =
        store.resolve_session(session).await.map_err(|error| usage(error.to_string()))?;
    let reason = reason
        .map(|reason| reason.trim().to_owned())
        .filter(|reason| !reason.is_empty())
        .unwrap_or_else(|| DEFAULT_REASON.to_owned());
    // Sealing runs no agent code: the kernel gets no tools and a model that is never asked.
    let kernel = keel_host::root::inert_kernel(
        store,
        Arc::new(Printer::new(crate::args::OutputFormat::Text, crate::view::Verbosity::Normal)),
    )?;
    match kernel.seal_session(session_id, &reason).await {
        Ok(_) => {
            eprintln!(
                "keel: sealed session {session_id}: it never runs agent code again \
                 (`keel log {session_id}` still shows its ledger)"
            );
            Ok(exit::COMPLETED)
        }
        Err(KernelError::Sealed(_)) => {
            Err(usage(format!("session {session_id} is sealed already; nothing to do")))
        }
        Err(error @ (KernelError::SessionNotFound(_) | KernelError::MalformedSession { .. })) => {
            Err(usage(error.to_string()))
        }
        Err(error) => Err(error.into()),
    }
}

/// Refuses to continue a sealed session, before anything is started for it (model client,
/// MCP servers). The kernel refuses too; this gives the user the reason and exit 2 early.
///
/// # Errors
///
/// A usage error naming the session and the recorded reason when `events` hold
/// `session_sealed`.
pub(crate) fn refuse_sealed(session_id: SessionId, events: &[RuntimeEvent]) -> anyhow::Result<()> {
    let reason = events.iter().find_map(|event| match &event.kind {
        EventKind::SessionSealed { reason } => Some(reason.as_str()),
        _ => None,
    });
    match reason {
        Some(reason) => Err(usage(format!(
            "session {session_id} is sealed ({reason}): it never runs agent code again; \
             `keel log {session_id}` still shows its ledger"
        ))),
        None => Ok(()),
    }
}
