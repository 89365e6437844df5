//! The session modes a client can switch between: keel's approval modes.

use agent_client_protocol::v1::schema::{SessionMode, SessionModeState};
use keel_contracts::ApprovalMode;

/// The session modes: keel's approval modes (`--approval`), with what each means.
pub(crate) const MODES: [(&str, ApprovalMode, &str, &str); 4] = [
    ("ask", ApprovalMode::Ask, "Ask", "Ask before every call that needs consent"),
    (
        "sandboxed",
        ApprovalMode::Sandboxed,
        "Sandboxed",
        "Run commands and workspace edits the managed sandbox contains; ask for the rest",
    ),
    ("auto", ApprovalMode::Auto, "Auto", "Allow every call but a wider boundary"),
    ("deny", ApprovalMode::Deny, "Deny", "Refuse every call that needs consent"),
];

pub(crate) fn modes(current: ApprovalMode) -> SessionModeState {
    let current = MODES.iter().find(|(_, mode, ..)| *mode == current).map_or("ask", |m| m.0);
    SessionModeState::new(
        current,
        MODES
            .iter()
            .map(|(id, _, name, description)| {
                SessionMode::new(*id, *name).description(*description)
            })
            .collect(),
    )
}
