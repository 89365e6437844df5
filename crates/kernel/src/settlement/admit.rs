//! Admitting a call: resolve its tool, validate its arguments, gate it (envelope, shadow
//! and plan modes, rules, consent and grants), ask an intrinsic whether it parks, then make
//! its `tool_attempt_prepared` durable (DESIGN.md §3 step 3).

use keel_contracts::{
    Authorization, CallFacts, CommandLine, Decision, EventKind, ExecutionMode, Outcome,
    PermissionAnswer, REFUSAL_PERMISSION_DENIED, REFUSAL_SHADOW, RunId, ToolCall, ToolContext,
    TurnId, authorize_tool_invocation, executes_in_shadow, requires_consent,
};

use super::consent::{exact_grant, session_grant};
use super::{Admission, Call, CallState, Ready};
use crate::failpoint::Failpoint;
use crate::intrinsic::{Admitted, IntrinsicCall};
use crate::ledger::Ledger;
use crate::repeats::{REPEATED_FAILURE_LIMIT, failure_key};
use crate::{Cancellation, Result};

impl CallState<'_> {
    /// Resolves, validates and gates a call, then makes its `tool_attempt_prepared`
    /// durable; `admission.ready` is then what carrying it out needs. Without it, the call's
    /// `tool_result` is recorded (an error, a refusal, a cancel).
    pub(super) async fn admit(
        &mut self,
        ledger: &mut Ledger,
        turn_id: TurnId,
        run_id: RunId,
        tool_call: &ToolCall,
        cancel: &Cancellation,
        admission: &mut Admission<'_>,
    ) -> Result<()> {
        let hold = admission.hold;
        let call = Call { turn: Some(turn_id), run: Some(run_id), call: tool_call, hold };
        let name = tool_call.name.as_str();

        // Identical failing calls are blocked whatever made them fail: an unknown tool and
        // invalid arguments count like a tool's own error, in every run of the turn.
        let (failure_key, arguments_sha256) = failure_key(tool_call);
        let failed_before = self.failures.get(&failure_key).copied().unwrap_or(0);
        if failed_before >= REPEATED_FAILURE_LIMIT {
            let text = format!(
                "error: blocked: this exact call already failed {failed_before} times in this \
                 turn; change the arguments or the approach"
            );
            return call.result(ledger, None, Outcome::Error, text).await;
        }
        let Some(tool) = self.registry.get(name).cloned() else {
            let available = self.registry.names().join(", ");
            let removed = ledger.events().iter().rev().any(|event| {
                matches!(&event.kind, EventKind::ToolsChanged { removed, .. }
                    if removed.iter().any(|gone| gone == name))
            });
            let text = if removed {
                format!(
                    "error: tool '{name}' was removed by its server (tools/list_changed); it \
                     is no longer offered. Available tools: {available}"
                )
            } else {
                format!("error: unknown tool '{name}'. Available tools: {available}")
            };
            *self.failures.entry(failure_key).or_insert(0) += 1;
            return call.result(ledger, None, Outcome::Error, text).await;
        };
        if let Some(problem) = &tool_call.arguments_error {
            let text = format!(
                "error: the arguments of this call are not valid JSON ({problem}); it was not \
                 executed. Send the call again with one complete JSON object."
            );
            *self.failures.entry(failure_key).or_insert(0) += 1;
            return call.result(ledger, None, Outcome::Error, text).await;
        }
        if let Err(problems) = self.registry.validate(name, &tool_call.arguments) {
            let text = format!("error: invalid arguments for {name}: {problems}");
            *self.failures.entry(failure_key).or_insert(0) += 1;
            return call.result(ledger, None, Outcome::Error, text).await;
        }

        let spec = tool.spec();
        let allow_reason = match authorize_tool_invocation(spec, &self.envelope) {
            Authorization::Allow { reason } => reason,
            Authorization::Refuse { reason } => {
                call.gate(ledger, Decision::Refuse, reason).await?;
                return call.result(ledger, None, Outcome::Refused, reason.to_owned()).await;
            }
        };
        if self.mode == ExecutionMode::Shadow && !executes_in_shadow(spec) {
            call.gate(ledger, Decision::Shadow, REFUSAL_SHADOW).await?;
            ledger
                .append(
                    call.turn,
                    call.run,
                    EventKind::ShadowIntent {
                        call_id: tool_call.call_id.clone(),
                        tool: name.to_owned(),
                        arguments: tool_call.arguments.clone(),
                    },
                )
                .await?;
            return call.result(ledger, None, Outcome::ShadowDenied, REFUSAL_SHADOW.into()).await;
        }
        if self.mode == ExecutionMode::Plan && !keel_contracts::executes_in_plan(spec) {
            call.gate(ledger, Decision::Refuse, keel_contracts::REFUSAL_PLAN).await?;
            return call
                .result(ledger, None, Outcome::Refused, keel_contracts::REFUSAL_PLAN.into())
                .await;
        }
        // Rules are decided on the path as written and on the path it really reaches, so a
        // link or /proc/self/cwd cannot dodge a deny rule nor earn an allow rule.
        let workspace = self.workspace.display().to_string();
        // Command rules are decided per simple command of the parsed line (the shell parser
        // lives here because keel-contracts parses nothing).
        let resolved = resolved_path(&self.workspace, &tool_call.arguments);
        let line = (name == "bash")
            .then(|| tool_call.arguments.get("command").and_then(serde_json::Value::as_str))
            .flatten()
            .map(crate::command_line::parse);
        let facts = CallFacts { resolved_path: resolved.as_deref(), command: line.as_ref() };
        let ruled = self
            .rules
            .decide_with(name, &tool_call.arguments, &workspace, facts)
            .map(|(answer, rule)| (answer, format!("rule:{}", rule.text)));
        if let Some((PermissionAnswer::Deny, by)) = &ruled
            && !requires_consent(spec)
        {
            // Plain reads are not asked, but a deny rule still refuses them (B09).
            call.gate(ledger, Decision::Refuse, by).await?;
            return call
                .result(ledger, None, Outcome::Refused, REFUSAL_PERMISSION_DENIED.into())
                .await;
        }
        if requires_consent(spec) {
            let denied_by_rule = matches!(ruled, Some((PermissionAnswer::Deny, _)));
            let now = self.deps.clock.now();
            let exact =
                exact_grant(ledger, name, &arguments_sha256, now).filter(|_| !denied_by_rule);
            if let Some((seq, until)) = exact {
                let reason = format!(
                    "grant: this exact call is allowed until {until} (permission_settled #{seq})"
                );
                call.gate(ledger, Decision::Allow, &reason).await?;
            } else if let Some(seq) = session_grant(ledger, name).filter(|_| !denied_by_rule) {
                let reason = format!("grant: allowed for this session (permission_settled #{seq})");
                call.gate(ledger, Decision::Allow, &reason).await?;
            } else {
                let reason = match &line {
                    Some(CommandLine::Unresolved { reason, .. }) => format!(
                        "consent required: {} access; rules cannot allow this command line \
                         ({reason})",
                        spec.access.as_str()
                    ),
                    _ => format!("consent required: {} access", spec.access.as_str()),
                };
                call.gate(ledger, Decision::Ask, &reason).await?;
                match self.ask(ledger, &call, spec.access, ruled, &arguments_sha256, cancel).await?
                {
                    None => return Ok(()),
                    Some(PermissionAnswer::Deny) => {
                        return call
                            .result(
                                ledger,
                                None,
                                Outcome::Refused,
                                REFUSAL_PERMISSION_DENIED.into(),
                            )
                            .await;
                    }
                    Some(
                        PermissionAnswer::AllowOnce
                        | PermissionAnswer::AllowSession
                        | PermissionAnswer::AllowExact,
                    ) => {}
                }
            }
        } else {
            call.gate(ledger, Decision::Allow, allow_reason).await?;
        }

        let intrinsic = self.registry.intrinsic(name).cloned();
        if let Some(hook) = &intrinsic {
            let admitted = hook.admit(&IntrinsicCall {
                settlement: self,
                ledger,
                turn_id,
                run_id,
                tool_call,
                arguments_sha256: &arguments_sha256,
                cancel,
            });
            match admitted {
                Admitted::Attempt => {}
                Admitted::Park(parked) => {
                    self.parked = Some(parked);
                    return Ok(());
                }
                Admitted::Invalid(text) => {
                    *self.failures.entry(failure_key).or_insert(0) += 1;
                    return call.result(ledger, None, Outcome::Error, text).await;
                }
            }
        }
        let attempt_id = self.deps.ids.attempt_id();
        self.failpoints.hit(Failpoint::BeforePrepare).await;
        // The one event that must be durable before the effect: committed now, together
        // with everything staged since the model request (response, gate, consent).
        ledger
            .append(
                call.turn,
                call.run,
                EventKind::ToolAttemptPrepared {
                    call_id: tool_call.call_id.clone(),
                    attempt_id,
                    tool: name.to_owned(),
                    arguments_sha256: arguments_sha256.clone(),
                },
            )
            .await?;
        self.failpoints.hit(Failpoint::AfterPrepare).await;
        let context = ToolContext {
            workspace: self.workspace.clone(),
            session_id: ledger.session_id,
            call_id: tool_call.call_id.clone(),
            sandbox: self.sandbox,
            boundary: self.boundary.clone(),
            denied_paths: self.denied_paths.clone(),
            write_denied_paths: self.write_denied_paths.clone(),
            elicitor: None,
        };
        admission.ready =
            Some(Ready { attempt_id, tool, intrinsic, context, failure_key, arguments_sha256 });
        Ok(())
    }
}

/// The workspace-relative path a call's `path` argument really reaches (symlinks and
/// `..` resolved through the longest existing prefix), or the absolute path when it leads
/// outside; `None` without a `path` argument.
fn resolved_path(workspace: &std::path::Path, arguments: &serde_json::Value) -> Option<String> {
    let raw = arguments.get("path")?.as_str()?;
    let joined = workspace.join(raw);
    let mut existing = joined.as_path();
    let mut rest = Vec::new();
    let canonical = loop {
        match std::fs::canonicalize(existing) {
            Ok(canonical) => break canonical,
            Err(_) => {
                rest.push(existing.file_name()?.to_owned());
                existing = existing.parent()?;
            }
        }
    };
    let full = rest.iter().rev().fold(canonical, |path, part| path.join(part));
    let root = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_owned());
    Some(match full.strip_prefix(&root) {
        Ok(relative) => relative.display().to_string(),
        Err(_) => full.display().to_string(),
    })
}
