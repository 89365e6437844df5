//! The sessions a host shows and makes: which are its own to show ([`visible`], by the
//! workspace roots it admits), what a listing calls their state ([`shown_state`]), and a
//! new hosted session from the one composition root ([`new_session`]).

use keel_contracts::{ApprovalMode, SessionId};
use keel_host::root::{self, RunSettings};
use keel_kernel::SessionConfig;

use crate::error::ApiError;
use crate::state::Host;

/// The session's `state` as every listing names it ([`keel_host::root::shown_state`]): an open
/// run whose process is gone is `interrupted`, not `running`; a run this host drives is
/// what its row says.
///
/// # Cancel safety
///
/// Cancel-safe: it only reads.
pub(crate) async fn shown_state(host: &Host, row: &keel_contracts::SessionSummary) -> &'static str {
    if host.is_active(row.id) {
        row.status.as_str()
    } else {
        keel_host::root::shown_state(host.store.as_ref(), row).await
    }
}

/// Whether the host shows a session at all: its workspace (canonical now) is one the host
/// admits. A session of another workspace in the same `KEEL_HOME` (a `keel run` elsewhere,
/// another host's roots) is not this host's to read, stream, answer or cancel: it answers
/// 404, as if absent, and is left out of the list.
pub(crate) fn visible(host: &Host, row: &keel_contracts::SessionSummary) -> bool {
    std::path::Path::new(&row.workspace)
        .canonicalize()
        .is_ok_and(|workspace| host.admits(&workspace))
}

/// [`visible`] for one session: its summary row, or 404.
pub(crate) async fn visible_row(
    host: &Host,
    session_id: keel_contracts::SessionId,
) -> Result<keel_contracts::SessionSummary, ApiError> {
    let row = host.store.session(session_id).await.map_err(ApiError::internal)?;
    row.filter(|row| visible(host, row))
        .ok_or_else(|| ApiError::not_found(format!("no session {session_id}")))
}

/// Creates a hosted session in `workspace` (canonical, already admitted) with `settings`:
/// the one composition root assembles it (config, trust, tools), the envelope's tool names
/// are checked, and the session's approval mode is remembered for its runs. Used by
/// `POST /v1/sessions` and by schedules that start a new session per fire.
///
/// # Errors
///
/// An [`ApiError`] for an invalid setting or config (400), a kernel or store failure.
pub(crate) async fn new_session(
    host: &Host,
    workspace: &std::path::Path,
    settings: &RunSettings,
    approval: ApprovalMode,
) -> Result<SessionId, ApiError> {
    let prepared =
        root::prepare(&host.home, workspace, settings, None, &host.store, Some(host.person()))
            .map_err(ApiError::from_root)?;
    let assembly =
        root::assemble(prepared, &host.home, workspace, host.store.clone(), host.observer())
            .await
            .map_err(ApiError::from_root)?;
    root::check_tool_names(&assembly.kernel, &assembly.resolved.envelope)
        .map_err(ApiError::from_root)?;
    let resolved = &assembly.resolved;
    let session_id = assembly
        .kernel
        .create_session(&SessionConfig {
            workspace: workspace.to_path_buf(),
            model_spec: resolved.model_spec.clone(),
            envelope: resolved.envelope.clone(),
            mode: resolved.mode,
            base_url: resolved.recorded_base_url.clone(),
        })
        .await
        .map_err(ApiError::from_kernel)?;
    host.remember_approval(session_id, approval).map_err(ApiError::internal)?;
    Ok(session_id)
}
