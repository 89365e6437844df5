//! Declared access of MCP tools (DESIGN.md §2: access is declared, never inferred).

use keel_contracts::{Access, Effects, Egress};
use serde::Serialize;

use crate::config::{ToolDeclaration, TransportKind};

/// Who decided a tool's access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessSource {
    /// The user's `[mcp_servers.NAME.tools.TOOL]` table.
    Config,
    /// The server's `readOnlyHint`, honoured because the user marked the server trusted.
    TrustedHint,
    /// keel's cautious default: a write.
    Default,
}

impl AccessSource {
    /// How `keel mcp list` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessSource::Config => "config",
            AccessSource::TrustedHint => "trusted readOnlyHint",
            AccessSource::Default => "default",
        }
    }
}

/// A tool's declared access and effects, and who declared them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeclaredAccess {
    /// Read or write.
    pub access: Access,
    /// Effects; `egress` is what the gates look at.
    pub effects: Effects,
    /// Who decided.
    pub source: AccessSource,
}

/// Declares one MCP tool's access.
///
/// In order: the user's declaration (`access`, and `egress` when given); else, for a server
/// the user marked `trusted`, the server's `readOnlyHint == true` makes a read; else a
/// write. Egress not declared by the user is `none` for a stdio server and `external` for
/// a remote one, so a remote read still asks for consent unless the user declares its
/// egress `none` or `internal`. An untrusted server's `readOnlyHint` never changes anything.
pub fn declare_access(
    transport: TransportKind,
    trusted: bool,
    declaration: Option<&ToolDeclaration>,
    read_only_hint: Option<bool>,
) -> DeclaredAccess {
    let default_egress = match transport {
        TransportKind::Stdio => Egress::None,
        TransportKind::Remote => Egress::External,
    };
    let (access, egress, source) = match declaration {
        Some(declared) => {
            (declared.access, declared.egress.unwrap_or(default_egress), AccessSource::Config)
        }
        None if trusted && read_only_hint == Some(true) => {
            (Access::Read, default_egress, AccessSource::TrustedHint)
        }
        None => (Access::Write, default_egress, AccessSource::Default),
    };
    let effects = match access {
        Access::Read => Effects { egress, ..Effects::LOCAL_READ },
        Access::Write => Effects { egress, ..Effects::LOCAL_WRITE },
    };
    DeclaredAccess { access, effects, source }
}

#[cfg(test)]
mod tests {
    use keel_contracts::requires_consent;

    use super::*;

    #[test]
    fn declared_access_table() {
        use AccessSource::{Config, Default, TrustedHint};
        use TransportKind::{Remote, Stdio};
        let read = |egress| Some(ToolDeclaration { access: Access::Read, egress });
        let write = |egress| Some(ToolDeclaration { access: Access::Write, egress });
        // (transport, trusted, declaration, readOnlyHint) -> (access, egress, source)
        let table = [
            // Nothing declared: writes; egress by transport; hints ignored unless trusted.
            (Stdio, false, None, None, Access::Write, Egress::None, Default),
            (Stdio, false, None, Some(true), Access::Write, Egress::None, Default),
            (Remote, false, None, None, Access::Write, Egress::External, Default),
            (Remote, false, None, Some(true), Access::Write, Egress::External, Default),
            // Trusted servers: readOnlyHint true makes a read, anything else stays a write.
            (Stdio, true, None, Some(true), Access::Read, Egress::None, TrustedHint),
            (Stdio, true, None, Some(false), Access::Write, Egress::None, Default),
            (Stdio, true, None, None, Access::Write, Egress::None, Default),
            (Remote, true, None, Some(true), Access::Read, Egress::External, TrustedHint),
            // The user's declaration wins over hints and trust, both ways.
            (Stdio, false, read(None), Some(false), Access::Read, Egress::None, Config),
            (Stdio, true, write(None), Some(true), Access::Write, Egress::None, Config),
            (Remote, false, read(None), None, Access::Read, Egress::External, Config),
            (
                Remote,
                false,
                read(Some(Egress::Internal)),
                None,
                Access::Read,
                Egress::Internal,
                Config,
            ),
            (
                Stdio,
                false,
                write(Some(Egress::External)),
                None,
                Access::Write,
                Egress::External,
                Config,
            ),
        ];
        for (transport, trusted, declaration, hint, access, egress, source) in table {
            let declared = declare_access(transport, trusted, declaration.as_ref(), hint);
            assert_eq!(
                (declared.access, declared.effects.egress, declared.source),
                (access, egress, source),
                "{transport:?} trusted={trusted} {declaration:?} hint={hint:?}"
            );
        }
    }

    #[test]
    fn a_remote_read_still_needs_consent_unless_its_egress_is_declared() {
        let spec = |declared: DeclaredAccess| keel_contracts::ToolSpec {
            name: "mcp__remote__fetch".into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
            access: declared.access,
            effects: declared.effects,
            intrinsic: false,
            first_party: false,
        };
        let remote_read = ToolDeclaration { access: Access::Read, egress: None };
        let declared = declare_access(TransportKind::Remote, false, Some(&remote_read), None);
        assert!(requires_consent(&spec(declared)));
        let internal = ToolDeclaration { access: Access::Read, egress: Some(Egress::Internal) };
        let declared = declare_access(TransportKind::Remote, false, Some(&internal), None);
        assert!(!requires_consent(&spec(declared)));
        let local = declare_access(TransportKind::Stdio, false, None, Some(true));
        assert!(requires_consent(&spec(local)));
    }
}
