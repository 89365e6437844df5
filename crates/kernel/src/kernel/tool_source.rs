//! A changing tool source (MCP servers whose tools change while a run goes on): what the
//! kernel's registry holds of it, and the registry with its current tools.

use std::sync::Arc;

use crate::registry::Registry;

/// A changing tool source and the generation and names the kernel's registry holds.
#[derive(Debug)]
pub(super) struct DynamicTools {
    pub(super) source: Arc<dyn keel_contracts::ToolSource>,
    pub(super) generation: u64,
    pub(super) names: std::collections::BTreeSet<String>,
}

/// What a run's registry holds of a changing source: its generation and tool names.
pub(super) type Offered = (u64, std::collections::BTreeSet<String>);

/// The registry with the source's current tools when its generation moved past
/// `offered`'s (which is updated), with the names added and removed.
pub(super) fn refresh_tools(
    dynamic: &DynamicTools,
    offered: &mut Offered,
    registry: &Registry,
) -> Option<(Registry, Vec<String>, Vec<String>)> {
    let generation = dynamic.source.generation();
    if generation == offered.0 {
        return None;
    }
    let tools = dynamic.source.tools();
    let mut now: std::collections::BTreeSet<String> =
        tools.iter().map(|tool| tool.spec().name.clone()).collect();
    let (fresh, left_out) = registry.replaced(&offered.1, tools);
    for name in &left_out {
        now.remove(name);
    }
    let added = now.difference(&offered.1).cloned().collect();
    let removed = offered.1.difference(&now).cloned().collect();
    *offered = (generation, now);
    Some((fresh, added, removed))
}
