//! Building a [`Kernel`]: over its adapters, at a sub-agent depth, and the `with_*`
//! builders a composition root chains (tool source, lease holder, outbox, limits,
//! intrinsics, failpoints).

use std::sync::Arc;

use keel_contracts::Tool;

use super::tool_source::DynamicTools;
use super::{DEFAULT_MAX_AGENT_DEPTH, Kernel, KernelDeps};
use crate::failpoint::{Failpoints, NoFailpoints};
use crate::registry::Registry;

impl Kernel {
    /// A kernel over `deps`.
    ///
    /// # Errors
    ///
    /// [`crate::RegistryError`] when two tools share a name or a schema does not compile.
    pub fn new(deps: KernelDeps) -> std::result::Result<Kernel, crate::RegistryError> {
        Kernel::at_depth(deps, 0, DEFAULT_MAX_AGENT_DEPTH)
    }

    /// A kernel whose sub-agents may nest `max_agent_depth` levels deep (0: no sub-agents).
    ///
    /// # Errors
    ///
    /// As [`Kernel::new`].
    pub fn with_max_agent_depth(
        deps: KernelDeps,
        max_agent_depth: u32,
    ) -> std::result::Result<Kernel, crate::RegistryError> {
        Kernel::at_depth(deps, 0, max_agent_depth)
    }

    fn at_depth(
        deps: KernelDeps,
        depth: u32,
        max_agent_depth: u32,
    ) -> std::result::Result<Kernel, crate::RegistryError> {
        let agents = if depth < max_agent_depth {
            crate::AgentTools::Offered
        } else {
            crate::AgentTools::Withheld
        };
        let holder = if depth == 0 {
            crate::registry::Holder::Session
        } else {
            crate::registry::Holder::SubAgent
        };
        let registry = Registry::for_kernel(deps.tools.clone(), holder, agents)?;
        Ok(Kernel {
            deps,
            registry,
            depth,
            max_agent_depth,
            failpoints: Arc::new(NoFailpoints),
            outbox: Arc::new(crate::NoOutbox),
            holder: default_holder(),
            holder_liveness: Arc::new(crate::lease::UnknownLiveness),
            code_limits: crate::CodeLimits::default(),
            tool_source: None,
        })
    }

    /// This kernel, offering `source`'s current tools at every step: when its generation
    /// moves, the next model request carries its new list (recorded as `tools_changed`),
    /// gated like any tool. The kernel's tools must hold the source's tools as they are
    /// now (the composition root passes both). Sub-agents keep the list they started with.
    pub fn with_tool_source(mut self, source: Arc<dyn keel_contracts::ToolSource>) -> Kernel {
        let generation = source.generation();
        let names = source.tools().iter().map(|tool| tool.spec().name.clone()).collect();
        self.tool_source = Some(DynamicTools { source, generation, names });
        self
    }

    /// This kernel, taking session leases as `holder` (e.g. `keel pid 4242 on build-7`).
    pub fn with_lease_holder(mut self, holder: impl Into<String>) -> Kernel {
        self.holder = holder.into();
        self
    }

    /// This kernel, taking over at once a lease whose holder `liveness` reports dead
    /// (`Some(false)`), instead of waiting for it to lapse.
    pub fn with_holder_liveness(
        mut self,
        liveness: Arc<dyn crate::lease::HolderLiveness>,
    ) -> Kernel {
        self.holder_liveness = liveness;
        self
    }

    /// This kernel, flushing `outbox` before every terminal event. Children inherit it.
    pub fn with_outbox(mut self, outbox: Arc<dyn crate::Outbox>) -> Kernel {
        self.outbox = outbox;
        self
    }

    /// This kernel, running `run_code` cells within `limits` (default: [`crate::CodeLimits`]'s).
    pub fn with_code_limits(mut self, limits: crate::CodeLimits) -> Kernel {
        self.code_limits = limits;
        self
    }

    /// This kernel, offering the intrinsic `tool` after keel's own (see
    /// [`Registry::with_intrinsic`]): its calls are gated like any intrinsic's and carried
    /// out by its [`crate::Intrinsic`] hook. Sub-agents do not get it.
    ///
    /// # Errors
    ///
    /// As [`Registry::with_intrinsic`]: a name the kernel's tools hold already, a spec that
    /// does not say `intrinsic: true`, or a schema that does not compile.
    pub fn with_intrinsic(
        mut self,
        tool: Arc<dyn crate::Intrinsic>,
    ) -> std::result::Result<Kernel, crate::RegistryError> {
        self.registry = self.registry.with_intrinsic(tool)?;
        Ok(self)
    }

    /// This kernel, stopping at `failpoints` (crash tests). Children inherit them.
    pub fn with_failpoints(mut self, failpoints: Arc<dyn Failpoints>) -> Kernel {
        self.failpoints = failpoints;
        self
    }

    /// The kernel a child session runs on: the same adapters, the given tools, one level
    /// deeper.
    pub(crate) fn child_kernel(
        &self,
        tools: Vec<Arc<dyn Tool>>,
    ) -> std::result::Result<Kernel, crate::RegistryError> {
        let deps = KernelDeps { tools, ..self.deps.clone() };
        // A sub-agent's registry has keel's tools a sub-agent may have (see the registry).
        Ok(Kernel::at_depth(deps, self.depth + 1, self.max_agent_depth)?
            .with_failpoints(self.failpoints.clone())
            .with_outbox(self.outbox.clone()))
    }

    /// The tool registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// A label unique to this kernel instance in this process (hosts set their own with
/// [`Kernel::with_lease_holder`]).
fn default_holder() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let instance = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("keel pid {} kernel {instance}", std::process::id())
}
