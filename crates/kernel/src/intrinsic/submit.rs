//! `submit(...)`: a run with an output schema offers it; the first valid submission ends
//! the run with its answer. Also how such a run ends on a tool-free answer
//! ([`text_answer`]).

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Access, Effects, Tool, ToolContext, ToolOutput, ToolSpec};

use super::{Carried, Intrinsic, IntrinsicCall};
use crate::RunConfig;

/// The run's `submit`, when its config has an output schema.
pub(crate) fn submit(config: &RunConfig) -> Option<Arc<dyn Intrinsic>> {
    config.output_schema.as_ref().map(submit_for)
}

/// `submit`.
const SUBMIT: &str = "submit";

/// `submit(...)`: hands in the final answer; its parameters are the run's output schema
/// (wrapped as `{"answer": ...}` when the schema is not an object's, since tool parameters
/// are objects on every provider). Carried out by the kernel; [`Tool::invoke`] is never
/// reached.
fn submit_for(schema: &serde_json::Value) -> Arc<dyn Intrinsic> {
    Arc::new(Submit {
        spec: ToolSpec {
            name: SUBMIT.to_owned(),
            description: "Hand in the final answer: the arguments must match the required \
                          output schema. The run ends with the first valid submission; an \
                          invalid one is answered with what is wrong, so fix it and submit again."
                .to_owned(),
            parameters: submit_parameters(schema),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: true,
            first_party: true,
        },
    })
}

/// Whether `schema` describes an object, so it can be `submit`'s parameters as it is.
fn is_object_schema(schema: &serde_json::Value) -> bool {
    schema.get("type").and_then(serde_json::Value::as_str) == Some("object")
}

fn submit_parameters(schema: &serde_json::Value) -> serde_json::Value {
    if is_object_schema(schema) {
        schema.clone()
    } else {
        serde_json::json!({
            "type": "object",
            "properties": {"answer": schema},
            "required": ["answer"],
            "additionalProperties": false
        })
    }
}

/// The answer a valid `submit` call hands in: its arguments, or their `answer` when the
/// schema was wrapped.
fn submitted_answer(
    schema: &serde_json::Value,
    arguments: &serde_json::Value,
) -> serde_json::Value {
    if is_object_schema(schema) {
        arguments.clone()
    } else {
        arguments.get("answer").cloned().unwrap_or(serde_json::Value::Null)
    }
}

/// How a run with an output schema ends on a tool-free answer: completed when the text is
/// JSON that matches the schema (the model answered in the shape asked), else failed with
/// what is wrong (the answer was not submitted).
pub(crate) fn text_answer(schema: &serde_json::Value, text: &str) -> crate::TurnOutcome {
    let problems = match serde_json::from_str::<serde_json::Value>(text.trim()) {
        Err(error) => format!("it is not JSON ({error})"),
        Ok(value) => match jsonschema::validator_for(schema) {
            Err(error) => format!("the output schema does not compile ({error})"),
            Ok(validator) => {
                let problems: Vec<String> =
                    validator.iter_errors(&value).map(|error| error.to_string()).collect();
                if problems.is_empty() {
                    return crate::TurnOutcome::Completed {
                        text: serde_json::to_string(&value).unwrap_or_default(),
                    };
                }
                problems.join("; ")
            }
        },
    };
    crate::TurnOutcome::Failed {
        reason: format!(
            "the model answered without calling submit, and its text does not match the \
             output schema: {problems}"
        ),
    }
}

/// The `submit` tool.
#[derive(Debug)]
struct Submit {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for Submit {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error(format!("error: {} is carried out by the kernel", self.spec.name))
    }
}

#[async_trait]
impl Intrinsic for Submit {
    async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> crate::Result<Carried> {
        // The arguments matched the schema (validated like every call's): the answer.
        let already = call.settlement.submitted();
        let schema = call.run_config().output_schema.clone();
        let output = match (&schema, already) {
            (Some(_), true) => ToolOutput::error(
                "error: an answer was already submitted in this response; only the first counts",
            ),
            (Some(schema), false) => {
                let answer = submitted_answer(schema, call.arguments());
                call.settlement.submit(serde_json::to_string(&answer).unwrap_or_default());
                ToolOutput::ok("submitted: the answer matches the schema; the run ends")
            }
            (None, _) => ToolOutput::error("error: this run takes no submission"),
        };
        Ok(Carried::output(output))
    }
}
