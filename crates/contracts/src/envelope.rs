//! The envelope (what a session may touch) and the pure gate decisions over it
//! (DESIGN.md §2). The kernel records these answers verbatim; nothing re-derives them.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{Access, Egress, ToolSpec};

/// Refusal text for a tool named in `forbidden`.
pub const REFUSAL_FORBIDDEN: &str =
    "refused: this tool is forbidden for this session; do not call it again, choose another way";
/// Refusal text for a read tool outside `scope.reads`.
pub const REFUSAL_NOT_IN_READS: &str =
    "refused: this read tool is outside the session's read scope; do not retry it";
/// Refusal text for a write tool outside `scope.writes`.
pub const REFUSAL_NOT_IN_WRITES: &str =
    "refused: this write tool is outside the session's write scope; do not retry it";
/// Refusal text for a call the user (or an approval rule) denied.
pub const REFUSAL_PERMISSION_DENIED: &str = "refused: permission was denied for this call; do not retry it, report what you would have done";
/// Refusal text for a `request_boundary` the user denied; the turn ends there.
pub const REFUSAL_BOUNDARY_DENIED: &str = "refused: widening the boundary was denied; the turn ends here. Do not retry with a wider request";
/// Result text for a write refused because the session is planning.
pub const REFUSAL_PLAN: &str = "refused: plan mode: nothing is changed until the user approves the plan. Read what you need, record the plan with the `plan` tool, and answer with it";
/// Result text for a call withheld by shadow mode.
pub const REFUSAL_SHADOW: &str = "shadow_denied: this session runs in shadow mode; the call was recorded as an intent and not executed";

/// A set of tools, or all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Scope {
    /// Every tool of the matching access kind (spelled `"all"`).
    #[serde(with = "all_marker")]
    All,
    /// Exactly these tool names.
    Tools(BTreeSet<String>),
}

impl Scope {
    /// Whether `tool` is in this scope.
    pub fn contains(&self, tool: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Tools(names) => names.contains(tool),
        }
    }

    /// Parses the CLI spelling: `all`, or a comma-separated list of tool names.
    pub fn parse(text: &str) -> Scope {
        if text.trim() == "all" {
            Scope::All
        } else {
            Scope::Tools(
                text.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            )
        }
    }

    /// The intersection of two scopes.
    pub fn intersect(&self, other: &Scope) -> Scope {
        match (self, other) {
            (Scope::All, other) | (other, Scope::All) => other.clone(),
            (Scope::Tools(a), Scope::Tools(b)) => {
                Scope::Tools(a.intersection(b).cloned().collect())
            }
        }
    }
}

mod all_marker {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("all")
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == "all" { Ok(()) } else { Err(D::Error::custom("expected \"all\"")) }
    }
}

/// What a session may touch: `forbidden` beats both scopes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Read tools the session may call.
    pub reads: Scope,
    /// Write tools the session may call.
    pub writes: Scope,
    /// Tools never to run, intrinsic ones included.
    pub forbidden: BTreeSet<String>,
}

impl Envelope {
    /// The executor posture: reads all, writes all, nothing forbidden (consent still
    /// governs writes).
    pub fn executor() -> Envelope {
        Envelope { reads: Scope::All, writes: Scope::All, forbidden: BTreeSet::new() }
    }
}

/// Whether a session executes effects (`live`) or only records intents (`shadow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    /// Calls that pass the gates execute.
    #[default]
    Live,
    /// Only first-party reads and intrinsic tools execute; every other call is recorded as
    /// a `shadow_intent` and answered `shadow_denied`.
    Shadow,
    /// Planning: reads and keel's own tools (`plan`, `todo`, …) run, writes are refused
    /// ([`REFUSAL_PLAN`]); the run ends with the plan as its answer. Once the user approves
    /// it (a `plan_approved` event), the session's runs are live.
    Plan,
}

/// The answer of [`authorize_tool_invocation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authorization {
    /// In scope; `reason` names the rule (`scope.reads`, `scope.writes`, `intrinsic`).
    Allow {
        /// The rule that allowed the call.
        reason: &'static str,
    },
    /// Out of scope; `reason` is one of the `REFUSAL_*` constants.
    Refuse {
        /// The refusal text the model sees.
        reason: &'static str,
    },
}

/// Decides whether `tool` may be invoked under `envelope`.
///
/// `forbidden` beats everything; intrinsic tools are exempt from the reads/writes scope; a
/// read needs `reads`, a write needs `writes`.
///
/// # Examples
///
/// ```
/// use keel_contracts::{authorize_tool_invocation, Authorization, Envelope, Access, Effects, ToolSpec};
/// let spec = ToolSpec { name: "bash".into(), description: String::new(),
///     parameters: serde_json::json!({}), access: Access::Write,
///     effects: Effects::LOCAL_WRITE, intrinsic: false, first_party: true };
/// let mut envelope = Envelope::executor();
/// assert!(matches!(authorize_tool_invocation(&spec, &envelope), Authorization::Allow { .. }));
/// envelope.forbidden.insert("bash".into());
/// assert!(matches!(authorize_tool_invocation(&spec, &envelope), Authorization::Refuse { .. }));
/// ```
pub fn authorize_tool_invocation(tool: &ToolSpec, envelope: &Envelope) -> Authorization {
    // `mcp__SERVER__*` forbids every tool of that server (see `tool_name_covers`).
    if envelope.forbidden.iter().any(|name| crate::tool_name_covers(name, &tool.name)) {
        return Authorization::Refuse { reason: REFUSAL_FORBIDDEN };
    }
    if tool.intrinsic {
        return Authorization::Allow { reason: "intrinsic" };
    }
    match tool.access {
        Access::Read if envelope.reads.contains(&tool.name) => {
            Authorization::Allow { reason: "scope.reads" }
        }
        Access::Read => Authorization::Refuse { reason: REFUSAL_NOT_IN_READS },
        Access::Write if envelope.writes.contains(&tool.name) => {
            Authorization::Allow { reason: "scope.writes" }
        }
        Access::Write => Authorization::Refuse { reason: REFUSAL_NOT_IN_WRITES },
    }
}

/// Whether a tool's declared effects require consent even for a read: external egress is
/// exfiltration-shaped.
pub fn effects_require_consent(tool: &ToolSpec) -> bool {
    tool.effects.egress == Egress::External
}

/// Whether the permission hook must be asked before `tool` runs: every write, and every
/// read whose effects require consent. Intrinsic tools never ask.
pub fn requires_consent(tool: &ToolSpec) -> bool {
    if tool.intrinsic {
        return false;
    }
    tool.access == Access::Write || effects_require_consent(tool)
}

/// Whether `tool` executes in shadow mode: intrinsic tools, and reads the host attests as
/// first-party with no egress. Everything else is recorded as an intent.
pub fn executes_in_shadow(tool: &ToolSpec) -> bool {
    tool.intrinsic
        || (tool.first_party && tool.access == Access::Read && tool.effects.egress == Egress::None)
}

/// Whether `tool` runs while a session plans ([`ExecutionMode::Plan`]): keel's own tools
/// and reads (consent still applies to them as usual). Writes are refused.
pub fn executes_in_plan(tool: &ToolSpec) -> bool {
    tool.intrinsic || tool.access == Access::Read
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Effects;

    fn spec(
        name: &str,
        access: Access,
        egress: Egress,
        intrinsic: bool,
        first_party: bool,
    ) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
            access,
            effects: Effects { egress, idempotent: false, reversible: false },
            intrinsic,
            first_party,
        }
    }

    fn envelope(reads: &str, writes: &str, forbidden: &[&str]) -> Envelope {
        Envelope {
            reads: Scope::parse(reads),
            writes: Scope::parse(writes),
            forbidden: forbidden.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Plan mode runs keel's own tools and reads; a write, whatever else it is, waits for
    /// the approved plan.
    #[test]
    fn plan_mode_runs_intrinsic_tools_and_reads_only() {
        let cases = [
            (Access::Read, false, true),
            (Access::Write, false, false),
            (Access::Write, true, true),
            (Access::Read, true, true),
        ];
        for (access, intrinsic, runs) in cases {
            let tool = spec("t", access, Egress::None, intrinsic, false);
            assert_eq!(executes_in_plan(&tool), runs, "{access:?} intrinsic={intrinsic}");
        }
    }

    /// (tool, access, intrinsic, reads, writes, forbidden, expected answer)
    type Case<'a> = (&'a str, Access, bool, &'a str, &'a str, &'a [&'a str], Authorization);

    #[test]
    fn authorize_table() {
        use Access::{Read, Write};
        let cases: &[Case<'_>] = &[
            (
                "read_file",
                Read,
                false,
                "all",
                "",
                &[],
                Authorization::Allow { reason: "scope.reads" },
            ),
            (
                "read_file",
                Read,
                false,
                "grep",
                "all",
                &[],
                Authorization::Refuse { reason: REFUSAL_NOT_IN_READS },
            ),
            (
                "grep",
                Read,
                false,
                "grep,glob",
                "",
                &[],
                Authorization::Allow { reason: "scope.reads" },
            ),
            (
                "bash",
                Write,
                false,
                "all",
                "",
                &[],
                Authorization::Refuse { reason: REFUSAL_NOT_IN_WRITES },
            ),
            (
                "bash",
                Write,
                false,
                "",
                "bash",
                &[],
                Authorization::Allow { reason: "scope.writes" },
            ),
            (
                "bash",
                Write,
                false,
                "all",
                "all",
                &["bash"],
                Authorization::Refuse { reason: REFUSAL_FORBIDDEN },
            ),
            (
                "read_file",
                Read,
                false,
                "all",
                "all",
                &["read_file"],
                Authorization::Refuse { reason: REFUSAL_FORBIDDEN },
            ),
            // `mcp__SERVER__*` forbids every tool of that server, and no other server's.
            (
                "mcp__evil__new_tool",
                Read,
                false,
                "all",
                "all",
                &["mcp__evil__*"],
                Authorization::Refuse { reason: REFUSAL_FORBIDDEN },
            ),
            (
                "mcp__good__read",
                Read,
                false,
                "all",
                "all",
                &["mcp__evil__*"],
                Authorization::Allow { reason: "scope.reads" },
            ),
            // Intrinsic tools are exempt from scope but refusable through forbidden.
            ("todo", Write, true, "", "", &[], Authorization::Allow { reason: "intrinsic" }),
            (
                "todo",
                Write,
                true,
                "all",
                "all",
                &["todo"],
                Authorization::Refuse { reason: REFUSAL_FORBIDDEN },
            ),
            // A write never rides on the read scope, a read never on the write scope.
            (
                "write_file",
                Write,
                false,
                "write_file",
                "",
                &[],
                Authorization::Refuse { reason: REFUSAL_NOT_IN_WRITES },
            ),
            (
                "list_dir",
                Read,
                false,
                "",
                "list_dir",
                &[],
                Authorization::Refuse { reason: REFUSAL_NOT_IN_READS },
            ),
        ];
        for (name, access, intrinsic, reads, writes, forbidden, want) in cases {
            let got = authorize_tool_invocation(
                &spec(name, *access, Egress::None, *intrinsic, true),
                &envelope(reads, writes, forbidden),
            );
            assert_eq!(got, *want, "{name} reads={reads} writes={writes} forbidden={forbidden:?}");
        }
    }

    #[test]
    fn consent_table() {
        let cases = [
            (Access::Read, Egress::None, false, false),
            (Access::Read, Egress::Internal, false, false),
            (Access::Read, Egress::External, false, true),
            (Access::Write, Egress::None, false, true),
            (Access::Write, Egress::External, true, false),
        ];
        for (access, egress, intrinsic, want) in cases {
            let tool = spec("t", access, egress, intrinsic, false);
            assert_eq!(
                requires_consent(&tool),
                want,
                "{access:?} {egress:?} intrinsic={intrinsic}"
            );
        }
        assert!(effects_require_consent(&spec("t", Access::Read, Egress::External, false, false)));
        assert!(!effects_require_consent(&spec("t", Access::Write, Egress::None, false, false)));
    }

    #[test]
    fn shadow_table() {
        let cases = [
            (Access::Read, Egress::None, false, true, true),
            (Access::Read, Egress::None, false, false, false),
            (Access::Read, Egress::External, false, true, false),
            (Access::Write, Egress::None, false, true, false),
            (Access::Write, Egress::None, true, false, true),
        ];
        for (access, egress, intrinsic, first_party, want) in cases {
            let tool = spec("t", access, egress, intrinsic, first_party);
            assert_eq!(executes_in_shadow(&tool), want);
        }
    }

    #[test]
    fn scope_serde_spelling() {
        assert_eq!(serde_json::to_string(&Scope::All).unwrap(), "\"all\"");
        let parsed: Scope = serde_json::from_str("[\"a\",\"b\"]").unwrap();
        assert_eq!(parsed, Scope::parse("a,b"));
        let parsed: Scope = serde_json::from_str("\"all\"").unwrap();
        assert_eq!(parsed, Scope::All);
    }

    proptest::proptest! {
        #[test]
        fn forbidden_always_refuses(name in "[a-z_]{1,8}", intrinsic: bool, write: bool) {
            let access = if write { Access::Write } else { Access::Read };
            let tool = spec(&name, access, Egress::None, intrinsic, true);
            let envelope = Envelope { reads: Scope::All, writes: Scope::All, forbidden: [name.clone()].into() };
            proptest::prop_assert_eq!(
                authorize_tool_invocation(&tool, &envelope),
                Authorization::Refuse { reason: REFUSAL_FORBIDDEN }
            );
        }
    }
}
