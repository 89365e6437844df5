//! The active tool map: resolves a call's name to a tool and validates its arguments
//! against the tool's JSON Schema (DESIGN.md §3 step 3), and says how settlement carries
//! a call out: by [`Tool::invoke`], or by an intrinsic's hook ([`Intrinsic`]).
//!
//! The set of keel's intrinsic tools is listed here ([`kernel_intrinsics`],
//! [`run_intrinsics`]): adding one touches its own module and these lists, nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_contracts::{Tool, ToolDefinition, ToolSpec, sha256_hex};

use crate::RunConfig;
use crate::error::RegistryError;
use crate::intrinsic::{self, Intrinsic};

/// Whether the sub-agent tools are offered (withheld past the depth limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentTools {
    /// `spawn_agent` and friends are registered.
    Offered,
    /// They are not (a child at the depth limit).
    Withheld,
}

/// Who a kernel's registry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A top-level session.
    Session,
    /// A sub-agent's session: it shrinks, never escapes.
    SubAgent,
}

/// keel's own tools for a kernel, in the order the model sees them (after the workspace
/// tools): the one list of the intrinsics every run of the kernel offers.
fn kernel_intrinsics(holder: Holder, agents: AgentTools) -> Vec<Arc<dyn Intrinsic>> {
    let mut own = vec![intrinsic::todo(), intrinsic::plan(), intrinsic::read_tool_result()];
    match holder {
        Holder::Session => {
            own.push(intrinsic::request_boundary());
            own.push(intrinsic::run_code());
        }
        // A sub-agent never widens a boundary: it shrinks, never escapes. It runs no
        // programs either: its few read tools need no loops (docs/decisions.md, Code Mode).
        Holder::SubAgent => {}
    }
    match agents {
        AgentTools::Offered => own.extend(intrinsic::agent_tools()),
        AgentTools::Withheld => {}
    }
    own
}

/// keel's own tools whose schemas come from the run's config, in the order the model sees
/// them (after the kernel's): `activate_skill` when the run has skills, `submit` when it
/// has an output schema.
fn run_intrinsics(config: &RunConfig) -> Vec<Arc<dyn Intrinsic>> {
    [intrinsic::activate_skill(config), intrinsic::submit(config)].into_iter().flatten().collect()
}

#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    /// How an intrinsic is carried out; `None`: by [`Tool::invoke`].
    intrinsic: Option<Arc<dyn Intrinsic>>,
    validator: jsonschema::Validator,
    /// What the model sees, made once: every request of a run clones it (cheaply: the
    /// schema is shared and already serialized, see [`keel_contracts::ToolSchema`]).
    definition: ToolDefinition,
}

impl Entry {
    fn new(
        tool: Arc<dyn Tool>,
        intrinsic: Option<Arc<dyn Intrinsic>>,
        validator: jsonschema::Validator,
    ) -> Entry {
        let spec = tool.spec();
        let definition = ToolDefinition {
            name: spec.name.clone(),
            description: spec.description.clone(),
            parameters: spec.parameters.clone().into(),
        };
        Entry { tool, intrinsic, validator, definition }
    }
}

/// The tools a run offers, in a fixed order, with compiled argument validators, and how
/// each is carried out.
///
/// Workspace and MCP tools are carried out by their [`Tool::invoke`]. keel's own tools are
/// intrinsics: each is a [`Tool`] that also implements [`Intrinsic`], the hook the
/// settlement carries its calls out through. This registry lists keel's own; a composition
/// root may add one it wrote with [`Registry::with_intrinsic`] (or
/// [`crate::Kernel::with_intrinsic`]).
///
/// # Examples
///
/// An intrinsic that answers with how many events the ledger holds, registered after
/// keel's own tools:
///
/// ```
/// use std::sync::Arc;
///
/// use async_trait::async_trait;
/// use keel_contracts::{Access, Effects, Tool, ToolContext, ToolOutput, ToolSpec};
/// use keel_kernel::{AgentTools, Carried, Intrinsic, IntrinsicCall, Registry};
///
/// #[derive(Debug)]
/// struct CountEvents(ToolSpec);
///
/// #[async_trait]
/// impl Tool for CountEvents {
///     fn spec(&self) -> &ToolSpec {
///         &self.0
///     }
///
///     // Not reached: the hook below carries every call out.
///     async fn invoke(&self, _: &ToolContext, _: &serde_json::Value) -> ToolOutput {
///         ToolOutput::error("error: count_events is carried out by the kernel")
///     }
/// }
///
/// #[async_trait]
/// impl Intrinsic for CountEvents {
///     async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> keel_kernel::Result<Carried> {
///         let held = call.events().len();
///         Ok(Carried::output(ToolOutput::ok(format!("{held} events"))))
///     }
/// }
///
/// let spec = ToolSpec {
///     name: "count_events".into(),
///     description: "Count the session's events.".into(),
///     parameters: serde_json::json!({"type": "object", "additionalProperties": false}),
///     access: Access::Read,
///     effects: Effects::LOCAL_READ,
///     intrinsic: true,
///     first_party: true,
/// };
/// let registry = Registry::new(Vec::new(), AgentTools::Withheld)?
///     .with_intrinsic(Arc::new(CountEvents(spec)))?;
/// assert_eq!(registry.names().last().map(String::as_str), Some("count_events"));
/// assert!(registry.get("count_events").is_some_and(|tool| tool.spec().intrinsic));
/// # Ok::<(), keel_kernel::RegistryError>(())
/// ```
pub struct Registry {
    entries: Vec<Entry>,
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("tools", &self.by_name.keys()).finish()
    }
}

impl Registry {
    /// Builds a registry from workspace tools (built-in and MCP), then appends keel's
    /// intrinsic tools; this merge is the only place a tool becomes intrinsic. The order
    /// is the order the model sees.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Duplicate`] for a repeated name, [`RegistryError::ClaimsIntrinsic`]
    /// for a workspace tool whose spec says intrinsic, [`RegistryError::InvalidSchema`] for a
    /// schema that does not compile.
    pub fn new(tools: Vec<Arc<dyn Tool>>, agents: AgentTools) -> Result<Registry, RegistryError> {
        Registry::for_kernel(tools, Holder::Session, agents)
    }

    /// [`Registry::new`] for a kernel whose sessions are `holder`'s.
    ///
    /// # Errors
    ///
    /// As [`Registry::new`].
    pub(crate) fn for_kernel(
        tools: Vec<Arc<dyn Tool>>,
        holder: Holder,
        agents: AgentTools,
    ) -> Result<Registry, RegistryError> {
        if let Some(claimant) = tools.iter().find(|tool| tool.spec().intrinsic) {
            return Err(RegistryError::ClaimsIntrinsic(claimant.spec().name.clone()));
        }
        let mut registry = Registry { entries: Vec::new(), by_name: BTreeMap::new() };
        for tool in tools {
            registry.push(tool, None)?;
        }
        registry.with_intrinsics(kernel_intrinsics(holder, agents))
    }

    /// This registry with keel's per-run intrinsic tools appended (those whose schemas
    /// come from `config`, see [`run_intrinsics`]).
    ///
    /// # Errors
    ///
    /// As [`Registry::new`]: a repeated name or a schema that does not compile.
    pub(crate) fn for_run(&self, config: &RunConfig) -> Result<Registry, RegistryError> {
        Registry { entries: self.entries.clone(), by_name: self.by_name.clone() }
            .with_intrinsics(run_intrinsics(config))
    }

    /// This registry with the intrinsic `tool` appended, after the tools it holds: a tool
    /// carried out by its [`Intrinsic`] hook, exempt from the reads/writes scope. Only a
    /// tool keel's composition root wrote belongs here, never a workspace or MCP tool.
    ///
    /// # Errors
    ///
    /// [`RegistryError::NotIntrinsic`] when the tool's spec does not say `intrinsic: true`;
    /// otherwise as [`Registry::new`]: a repeated name or a schema that does not compile.
    pub fn with_intrinsic(self, tool: Arc<dyn Intrinsic>) -> Result<Registry, RegistryError> {
        self.with_intrinsics(vec![tool])
    }

    fn with_intrinsics(
        mut self,
        tools: Vec<Arc<dyn Intrinsic>>,
    ) -> Result<Registry, RegistryError> {
        for tool in tools {
            if !tool.spec().intrinsic {
                return Err(RegistryError::NotIntrinsic(tool.spec().name.clone()));
            }
            let hook = tool.clone();
            self.push(tool, Some(hook))?;
        }
        Ok(self)
    }

    /// Appends `tool` (carried out by `intrinsic` when it has one).
    fn push(
        &mut self,
        tool: Arc<dyn Tool>,
        intrinsic: Option<Arc<dyn Intrinsic>>,
    ) -> Result<(), RegistryError> {
        let spec = tool.spec();
        if self.by_name.insert(spec.name.clone(), self.entries.len()).is_some() {
            return Err(RegistryError::Duplicate(spec.name.clone()));
        }
        let validator = jsonschema::validator_for(&spec.parameters).map_err(|error| {
            RegistryError::InvalidSchema { tool: spec.name.clone(), message: error.to_string() }
        })?;
        self.entries.push(Entry::new(tool, intrinsic, validator));
        Ok(())
    }

    /// This registry with the tools named in `remove` replaced by `add` (a changing
    /// source's new list, see [`keel_contracts::ToolSource`]), placed where workspace tools
    /// go (before keel's intrinsic ones). A new tool that claims to be intrinsic, whose name
    /// another tool holds, or whose schema does not compile is left out, named in the
    /// second value.
    pub(crate) fn replaced(
        &self,
        remove: &std::collections::BTreeSet<String>,
        add: Vec<Arc<dyn Tool>>,
    ) -> (Registry, Vec<String>) {
        let kept: Vec<Entry> = self
            .entries
            .iter()
            .filter(|entry| !remove.contains(&entry.tool.spec().name))
            .cloned()
            .collect();
        let at = kept.iter().position(|entry| entry.tool.spec().intrinsic).unwrap_or(kept.len());
        let mut taken: std::collections::BTreeSet<String> =
            kept.iter().map(|entry| entry.tool.spec().name.clone()).collect();
        let mut added = Vec::new();
        let mut left_out = Vec::new();
        for tool in add {
            let spec = tool.spec();
            if spec.intrinsic || !taken.insert(spec.name.clone()) {
                left_out.push(spec.name.clone());
                continue;
            }
            match jsonschema::validator_for(&spec.parameters) {
                Ok(validator) => added.push(Entry::new(tool, None, validator)),
                Err(_) => left_out.push(spec.name.clone()),
            }
        }
        let mut entries = kept;
        let tail = entries.split_off(at);
        entries.extend(added);
        entries.extend(tail);
        let by_name =
            entries.iter().enumerate().map(|(i, e)| (e.tool.spec().name.clone(), i)).collect();
        (Registry { entries, by_name }, left_out)
    }

    /// The tool called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name).map(|&index| &self.entries[index].tool)
    }

    /// The hook the tool called `name` is carried out by, if it is an intrinsic.
    pub(crate) fn intrinsic(&self, name: &str) -> Option<&Arc<dyn Intrinsic>> {
        self.by_name.get(name).and_then(|&index| self.entries[index].intrinsic.as_ref())
    }

    /// Checks `arguments` against the tool's schema; `Err` lists every violation.
    ///
    /// # Errors
    ///
    /// A model-readable list of schema violations.
    pub fn validate(&self, name: &str, arguments: &serde_json::Value) -> Result<(), String> {
        let Some(&index) = self.by_name.get(name) else {
            return Err(format!("unknown tool '{name}'"));
        };
        let problems: Vec<String> = self.entries[index]
            .validator
            .iter_errors(arguments)
            .map(|error| {
                let path = error.instance_path().to_string();
                if path.is_empty() { error.to_string() } else { format!("{path}: {error}") }
            })
            .collect();
        if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
    }

    /// Tool names in order.
    pub fn names(&self) -> Vec<String> {
        self.entries.iter().map(|entry| entry.tool.spec().name.clone()).collect()
    }

    /// Specs in order.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.entries.iter().map(|entry| entry.tool.spec())
    }

    /// The definitions the model sees, in order.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.entries.iter().map(|entry| entry.definition.clone()).collect()
    }

    /// SHA-256 of the serialized definitions, for `run_composition`.
    pub fn definitions_sha256(&self) -> String {
        sha256_hex(serde_json::to_string(&self.definitions()).unwrap_or_default().as_bytes())
    }
}
