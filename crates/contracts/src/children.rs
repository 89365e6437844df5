//! Sub-agents shrink, never escape (DESIGN.md §4): what a child may use, decided as a pure
//! function of the parent's tools and envelope.

use crate::{Access, Authorization, Envelope, ToolSpec, authorize_tool_invocation};

/// Refusal text when `spawn_agent` asks for tools outside the child's allowance.
pub const REFUSAL_CHILD_TOOLS: &str =
    "refused: a sub-agent may only use the parent's read tools that the parent's own scope allows";

/// The names of the parent's tools a child may have: read tools (not intrinsic, which the
/// child gets from keel itself) that the parent's envelope allows. Writes never pass.
///
/// # Examples
///
/// ```
/// use keel_contracts::{Access, Effects, Envelope, ToolSpec, child_allowance};
/// let tool = |name: &str, access| ToolSpec { name: name.into(), description: String::new(),
///     parameters: serde_json::json!({}), access, effects: Effects::LOCAL_READ,
///     intrinsic: false, first_party: true };
/// let mut envelope = Envelope::executor();
/// envelope.forbidden.insert("grep".into());
/// let tools = [tool("read_file", Access::Read), tool("grep", Access::Read), tool("bash", Access::Write)];
/// assert_eq!(child_allowance(&tools, &envelope), vec!["read_file".to_string()]);
/// ```
pub fn child_allowance(parent_tools: &[ToolSpec], parent_envelope: &Envelope) -> Vec<String> {
    parent_tools
        .iter()
        .filter(|spec| !spec.intrinsic && spec.access == Access::Read)
        .filter(|spec| {
            matches!(authorize_tool_invocation(spec, parent_envelope), Authorization::Allow { .. })
        })
        .map(|spec| spec.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Effects, Egress, Scope};
    use proptest::prelude::*;

    fn spec(name: String, write: bool, intrinsic: bool) -> ToolSpec {
        ToolSpec {
            name,
            description: String::new(),
            parameters: serde_json::json!({}),
            access: if write { Access::Write } else { Access::Read },
            effects: Effects { egress: Egress::None, idempotent: true, reversible: true },
            intrinsic,
            first_party: true,
        }
    }

    fn scope() -> impl Strategy<Value = Scope> {
        prop_oneof![
            Just(Scope::All),
            proptest::collection::btree_set("t[0-9]", 0..6).prop_map(Scope::Tools),
        ]
    }

    proptest! {
        /// For random envelopes and tools, everything a child may use the parent may use
        /// too, and none of it writes.
        #[test]
        fn child_scope_is_within_parent_scope(
            tools in proptest::collection::vec(("t[0-9]", any::<bool>(), any::<bool>()), 0..10),
            reads in scope(),
            writes in scope(),
            forbidden in proptest::collection::btree_set("t[0-9]", 0..4),
        ) {
            let specs: Vec<ToolSpec> = tools.into_iter().map(|(n, w, i)| spec(n, w, i)).collect();
            let envelope = Envelope { reads, writes, forbidden };
            for name in child_allowance(&specs, &envelope) {
                for spec in specs.iter().filter(|s| s.name == name && !s.intrinsic && s.access == Access::Read) {
                    let allowed = matches!(authorize_tool_invocation(spec, &envelope), Authorization::Allow { .. });
                    prop_assert!(allowed);
                }
                prop_assert!(!envelope.forbidden.contains(&name));
                prop_assert!(specs.iter().any(|s| s.name == name && s.access == Access::Read));
            }
        }
    }
}
