//! Assembly: the outbox, the MCP servers, the model client, built-in and MCP tools, the
//! lease holder and its liveness and the failpoint, made into a run's kernel; and the checks
//! that every tool a rule or the envelope names exists.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use keel_contracts::{
    ApprovalMode, Envelope, PermissionRules, Scope, Store, SystemClock, UuidV7Ids,
};
use keel_kernel::{Kernel, KernelDeps, Observer};

use super::lease::{LocalProcesses, lease_holder};
use super::settings::{Prepared, Resolved};
use crate::error::{config_error, usage};
use crate::mcp;
use crate::provider::model_client;

/// The kernel for one run: the model client, built-in and MCP tools, the lease holder and
/// its liveness, the outbox and the failpoint named by `KEEL_FAILPOINT`.
///
/// # Errors
///
/// A [`usage`] error for an invalid model spec, a missing API key or failpoint; an error
/// when the tool registry cannot be assembled.
pub fn build_kernel(
    store: Arc<dyn Store>,
    resolved: &Resolved,
    observer: Arc<dyn Observer>,
    mcp: &mcp::Started,
    outbox: &crate::outbox::Outbox,
) -> anyhow::Result<Kernel> {
    let model =
        model_client(&resolved.model_spec, resolved.base_url.as_deref(), resolved.context_window)?;
    let deps = KernelDeps {
        store,
        model,
        tools: keel_tools::builtin_tools_with(&keel_tools::BuiltinOptions {
            shell_env: resolved.shell_env.clone(),
        })
        .into_iter()
        .chain(mcp.tools())
        .collect(),
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        permissions: resolved.permissions.clone(),
        observer: outbox.observer(observer),
        counter: resolved.counter.clone(),
    };
    let kernel = Kernel::with_max_agent_depth(deps, resolved.max_agent_depth)
        .context("cannot assemble the tool registry")?
        .with_wait()
        .context("cannot assemble the tool registry")?
        .with_lease_holder(lease_holder())
        .with_holder_liveness(Arc::new(LocalProcesses))
        .with_tool_source(mcp.tool_source());
    check_deny_rule_tools(&kernel, &resolved.run.rules)?;
    crate::failpoints::install(outbox.install(kernel))
}

/// Every deny rule must name a tool keel has: `Bash(rm *)` (another runtime's spelling)
/// or a typo would deny nothing while the user believes it holds. MCP tools (`mcp__…`)
/// are exempt, since a server that did not start has no tools to deny.
///
/// # Errors
///
/// A [`usage`] error naming the first deny rule whose tool is unknown.
fn check_deny_rule_tools(kernel: &Kernel, rules: &PermissionRules) -> anyhow::Result<()> {
    let known = kernel.registry().names();
    let unknown = rules.deny.iter().find(|rule| {
        let tool = rule.tool();
        tool != keel_contracts::PATH_RULE
            && !tool.starts_with("mcp__")
            && !known.iter().any(|name| name == tool)
    });
    match unknown {
        Some(rule) => Err(config_error(format!(
            "deny rule '{}' names no tool keel has, so it would deny nothing; \
             known tools: path, {}",
            rule.text,
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

/// Every tool the envelope names must exist: a typo in `--forbid bsh` would otherwise
/// forbid nothing, and one in `--reads` would quietly narrow the scope.
///
/// # Errors
///
/// A [`usage`] error naming the first unknown tool.
pub fn check_tool_names(kernel: &Kernel, envelope: &Envelope) -> anyhow::Result<()> {
    let known = kernel.registry().names();
    let mut unknown: Vec<(&str, &String)> = Vec::new();
    for (flag, scope) in [("--reads", &envelope.reads), ("--writes", &envelope.writes)] {
        if let Scope::Tools(names) = scope {
            unknown
                .extend(names.iter().filter(|name| !known.contains(name)).map(|name| (flag, name)));
        }
    }
    for name in &envelope.forbidden {
        if let Err(reason) = keel_contracts::check_tool_name_pattern(name) {
            return Err(usage(crate::safe_read::visible(
                &format!(
                    "invalid tool name '{name}' in --forbid (or the [envelope] config): {reason}"
                ),
                false,
            )));
        }
    }
    // `mcp__SERVER__*` covers tools the server may list later: known or not, it stands.
    unknown.extend(
        envelope
            .forbidden
            .iter()
            .filter(|name| !known.contains(name) && !is_server_wide(name))
            .map(|name| ("--forbid", name)),
    );
    if let Some((flag, name)) = unknown.first() {
        return Err(usage(crate::safe_read::visible(
            &format!(
                "unknown tool '{name}' in {flag} (or the [envelope] config); known tools: {}",
                known.join(", ")
            ),
            false,
        )));
    }
    Ok(())
}

/// Whether `name` is `mcp__SERVER__*` (checked with `check_tool_name_pattern` already).
fn is_server_wide(name: &str) -> bool {
    name.starts_with("mcp__") && name.ends_with("__*")
}

/// A run ready to go: its kernel, its settings, and the outbox and MCP servers it uses
/// (kept alive as long as the run; call [`crate::outbox::Outbox::finish`] at the end).
#[derive(Debug)]
pub struct Assembly {
    /// The kernel.
    pub kernel: Kernel,
    /// The resolved settings (the run config is `resolved.run`).
    pub resolved: Resolved,
    /// The outbox mirror.
    pub outbox: crate::outbox::Outbox,
    /// The MCP servers.
    pub mcp: mcp::Started,
}

/// Starts the outbox and the MCP servers of `prepared` and builds the kernel.
///
/// # Errors
///
/// As [`build_kernel`], plus an invalid `[[outbox]]` or `[mcp_servers]` table.
///
/// # Cancel safety
///
/// Dropping it stops the MCP servers started so far; nothing is recorded.
pub async fn assemble(
    prepared: Prepared,
    home: &Path,
    workspace: &Path,
    store: Arc<dyn Store>,
    observer: Arc<dyn Observer>,
) -> anyhow::Result<Assembly> {
    let Prepared { config, mut resolved } = prepared;
    let outbox = crate::outbox::start(&config, home, store.clone())?;
    // With no one to ask, `--approval auto` answers a server's form with its defaults.
    let elicitation = match resolved.run.approval {
        ApprovalMode::Auto => keel_mcp::ElicitationPolicy::AcceptDefaults,
        _ => keel_mcp::ElicitationPolicy::Decline,
    };
    let mcp = mcp::start(&config, home, workspace, true, elicitation).await?;
    resolved.run.instructions.splice(0..0, mcp.policy_instruction());
    let kernel = build_kernel(store, &resolved, observer, &mcp, &outbox)?;
    Ok(Assembly { kernel, resolved, outbox, mcp })
}
