//! `request_boundary(paths?, network?, justification)`: asks the user to widen the
//! session's boundary by exact paths (read or write) and/or network access, through the
//! permission path. One negotiation a step; approval records a boundary revision, denial
//! finalizes the turn.

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{
    Access, Effects, Outcome, PermissionAnswer, Tool, ToolContext, ToolOutput, ToolSpec,
};

use super::{Carried, Intrinsic, IntrinsicCall};

/// `request_boundary(paths?, network?, justification)`.
pub(crate) fn request_boundary() -> Arc<dyn Intrinsic> {
    Arc::new(RequestBoundary::new())
}

/// `request_boundary`.
const REQUEST_BOUNDARY: &str = "request_boundary";

/// `request_boundary(paths?, network?, justification)`: asks the user to widen the
/// session's boundary by exact paths (read or write) and/or network access. Carried out by
/// the kernel through the permission path; [`Tool::invoke`] is never reached.
#[derive(Debug)]
struct RequestBoundary {
    spec: ToolSpec,
}

impl RequestBoundary {
    fn new() -> RequestBoundary {
        RequestBoundary {
            spec: ToolSpec {
                name: REQUEST_BOUNDARY.to_owned(),
                description: "Ask the user to let commands reach beyond the workspace: exact \
                              paths (read or write) and/or the network, with a justification. \
                              One request at a time. If approved, retry the call that needed \
                              it; if denied, the turn ends: do not ask again wider."
                    .to_owned(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "paths": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "path": {"type": "string", "minLength": 1},
                                    "access": {"enum": ["read", "write"]}
                                },
                                "required": ["path", "access"],
                                "additionalProperties": false
                            }
                        },
                        "network": {"type": "boolean"},
                        "justification": {"type": "string", "minLength": 1}
                    },
                    "required": ["justification"],
                    "additionalProperties": false
                }),
                access: Access::Read,
                effects: Effects::LOCAL_READ,
                intrinsic: true,
                first_party: true,
            },
        }
    }
}

#[async_trait]
impl Tool for RequestBoundary {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error("error: request_boundary is carried out by the kernel")
    }
}

#[async_trait]
impl Intrinsic for RequestBoundary {
    async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> crate::Result<Carried> {
        let request: BoundaryRequest = match serde_json::from_value(call.arguments().clone()) {
            Ok(request) => request,
            Err(error) => {
                return Ok(Carried::output(ToolOutput::error(format!(
                    "error: invalid request: {error}"
                ))));
            }
        };
        if request.justification.trim().is_empty() {
            return Ok(Carried::output(ToolOutput::error(
                "error: a boundary request needs a justification",
            )));
        }
        if request.paths.is_empty() && !request.network {
            return Ok(Carried::output(ToolOutput::error("error: the request asks for nothing")));
        }
        if !call.settlement.begin_negotiation() {
            return Ok(Carried::output(ToolOutput::error(
                "error: one boundary negotiation at a time; wait for the answer to the first",
            )));
        }
        let workspace = call.settlement.workspace().to_owned();
        let ruled = call
            .settlement
            .rules()
            .decide(REQUEST_BOUNDARY, call.arguments(), &workspace.display().to_string())
            .map(|(answer, rule)| (answer, format!("rule:{}", rule.text)));
        let at = (call.turn_id, call.run_id, call.tool_call);
        let answer = call
            .settlement
            .ask(call.ledger, at, Access::Write, ruled, call.arguments_sha256, call.cancel)
            .await?;
        let Some(answer) = answer else {
            return Ok(Carried::answered());
        };
        if answer == PermissionAnswer::Deny {
            call.settlement.deny("widening the boundary was denied".to_owned());
            return Ok(Carried::output(ToolOutput {
                outcome: Outcome::Refused,
                content: keel_contracts::REFUSAL_BOUNDARY_DENIED.to_owned(),
                raw: None,
            }));
        }
        let mut boundary = call.settlement.boundary().0.clone();
        for path in &request.paths {
            let absolute = if path.path.starts_with('/') {
                path.path.clone()
            } else {
                workspace.join(&path.path).display().to_string()
            };
            let list = match path.access {
                Access::Read => &mut boundary.read,
                Access::Write => &mut boundary.write,
            };
            if !list.contains(&absolute) {
                list.push(absolute);
            }
        }
        boundary.network |= request.network;
        let at = (call.turn_id, call.run_id);
        let revision = call
            .settlement
            .widen_boundary(call.ledger, at, boundary, request.justification)
            .await?;
        let (boundary, _) = call.settlement.boundary();
        Ok(Carried::output(ToolOutput::ok(format!(
            "boundary widened (revision {revision}): read {:?}, write {:?}, network {}. Retry the \
             call that needed it.",
            boundary.read,
            boundary.write,
            if boundary.network { "on" } else { "off" }
        ))))
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BoundaryRequest {
    #[serde(default)]
    paths: Vec<BoundaryPath>,
    #[serde(default)]
    network: bool,
    justification: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BoundaryPath {
    path: String,
    access: Access,
}
