//! `run_code(code)`: runs a JavaScript program whose `await tools.NAME(args)` calls are
//! ordinary tool calls: the engine is [`crate::codemode`], and the settlement settles each
//! of the program's calls through its one path (`settlement/cell.rs`).

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Access, Effects, Tool, ToolContext, ToolOutput, ToolSpec};

use super::{Carried, Intrinsic, IntrinsicCall};

/// `run_code`.
const RUN_CODE: &str = "run_code";

/// `run_code(code)`: runs a JavaScript program whose `await tools.NAME(args)` calls are
/// ordinary tool calls. Carried out by the kernel; [`Tool::invoke`] is never reached.
pub(crate) fn run_code() -> Arc<dyn Intrinsic> {
    Arc::new(RunCode {
        spec: ToolSpec {
            name: RUN_CODE.to_owned(),
            description: "Run a JavaScript program (the body of an async function) that \
                              calls tools: `const text = await tools.read_file({path: \"a.rs\"})` \
                              makes an ordinary tool call (checked and recorded like yours) and \
                              gives its result text; a refusal or an error is that text, not an \
                              exception. `print(...)` output is this call's result. There is no \
                              file system, network, process, timer or module access, only \
                              `tools`; keel's own tools (run_code, plan, todo, spawn_agent, \
                              request_boundary, ...) are refused inside. CPU, memory, wall-time, \
                              output and call-count limits apply. Use it to loop or branch over \
                              many calls in one step."
                .to_owned(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "minLength": 1}
                },
                "required": ["code"],
                "additionalProperties": false
            }),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: true,
            first_party: true,
        },
    })
}

/// The `run_code` tool.
#[derive(Debug)]
struct RunCode {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for RunCode {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error(format!("error: {} is carried out by the kernel", self.spec.name))
    }
}

#[async_trait]
impl Intrinsic for RunCode {
    async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> crate::Result<Carried> {
        let at = (call.turn_id, call.run_id, call.tool_call);
        let output = call.settlement.run_cell(call.ledger, at, call.cancel).await?;
        Ok(Carried::output(output))
    }
}
