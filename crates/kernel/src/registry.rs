//! The active tool map: resolves a call's name to a tool and validates its arguments
//! against the tool's JSON Schema (DESIGN.md §3 step 3).

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_contracts::{Tool, ToolDefinition, ToolSpec, sha256_hex};

/// A tool could not be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two tools share a name.
    #[error("duplicate tool name '{0}'")]
    Duplicate(String),
    /// A workspace or MCP tool claims to be intrinsic; only keel's own tools are.
    #[error("tool '{0}' claims to be intrinsic; only keel's own tools are")]
    ClaimsIntrinsic(String),
    /// A tool's parameter schema does not compile.
    #[error("tool '{tool}' has an invalid parameter schema: {message}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// The schema compiler's message.
        message: String,
    },
}

/// Whether the sub-agent tools are offered (withheld past the depth limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentTools {
    /// `spawn_agent` and friends are registered.
    Offered,
    /// They are not (a child at the depth limit).
    Withheld,
}

#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
    /// What the model sees, made once: every request of a run clones it (cheaply: the
    /// schema is shared and already serialized, see [`keel_contracts::ToolSchema`]).
    definition: ToolDefinition,
}

impl Entry {
    fn new(tool: Arc<dyn Tool>, validator: jsonschema::Validator) -> Entry {
        let spec = tool.spec();
        let definition = ToolDefinition {
            name: spec.name.clone(),
            description: spec.description.clone(),
            parameters: spec.parameters.clone().into(),
        };
        Entry { tool, validator, definition }
    }
}

/// The tools a run offers, in a fixed order, with compiled argument validators.
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
        if let Some(claimant) = tools.iter().find(|tool| tool.spec().intrinsic) {
            return Err(RegistryError::ClaimsIntrinsic(claimant.spec().name.clone()));
        }
        let agent_tools = match agents {
            AgentTools::Offered => crate::children::tools(),
            AgentTools::Withheld => Vec::new(),
        };
        let all = tools.into_iter().chain(crate::intrinsic::tools()).chain(agent_tools);
        let mut entries = Vec::new();
        let mut by_name = BTreeMap::new();
        for tool in all {
            let spec = tool.spec();
            if by_name.insert(spec.name.clone(), entries.len()).is_some() {
                return Err(RegistryError::Duplicate(spec.name.clone()));
            }
            let validator = jsonschema::validator_for(&spec.parameters).map_err(|error| {
                RegistryError::InvalidSchema { tool: spec.name.clone(), message: error.to_string() }
            })?;
            entries.push(Entry::new(tool, validator));
        }
        Ok(Registry { entries, by_name })
    }

    /// This registry without the tool called `name` (keel's own intrinsic tools that a
    /// session may not have, such as `request_boundary` for sub-agents).
    pub(crate) fn without(mut self, name: &str) -> Registry {
        if let Some(index) = self.by_name.remove(name) {
            self.entries.remove(index);
            for position in self.by_name.values_mut() {
                if *position > index {
                    *position -= 1;
                }
            }
        }
        self
    }

    /// This registry with keel's per-run intrinsic tools appended (`activate_skill` and
    /// the like, whose schemas depend on the run). Only the kernel's intrinsic module makes
    /// them.
    ///
    /// # Errors
    ///
    /// As [`Registry::new`]: a repeated name or a schema that does not compile.
    pub(crate) fn with_run_tools(
        &self,
        tools: Vec<Arc<dyn Tool>>,
    ) -> Result<Registry, RegistryError> {
        let mut registry =
            Registry { entries: self.entries.clone(), by_name: self.by_name.clone() };
        for tool in tools {
            let spec = tool.spec();
            if registry.by_name.insert(spec.name.clone(), registry.entries.len()).is_some() {
                return Err(RegistryError::Duplicate(spec.name.clone()));
            }
            let validator = jsonschema::validator_for(&spec.parameters).map_err(|error| {
                RegistryError::InvalidSchema { tool: spec.name.clone(), message: error.to_string() }
            })?;
            registry.entries.push(Entry::new(tool, validator));
        }
        Ok(registry)
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
                Ok(validator) => added.push(Entry::new(tool, validator)),
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

    /// This registry with keel's own intrinsic `tool` appended (see `Kernel::with_wait`).
    pub(crate) fn with_tool(self, tool: Arc<dyn Tool>) -> Result<Registry, RegistryError> {
        self.with_run_tools(vec![tool])
    }

    /// The tool called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name).map(|&index| &self.entries[index].tool)
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
