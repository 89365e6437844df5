//! `activate_skill(name)`: a run with skills offers it; it returns a skill's instructions
//! ([`crate::skills::activate`]) and records `skill_activated`.

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Access, Effects, EventKind, Tool, ToolContext, ToolOutput, ToolSpec};

use super::{Carried, Intrinsic, IntrinsicCall};
use crate::RunConfig;

/// `activate_skill`.
const ACTIVATE_SKILL: &str = "activate_skill";

/// The run's `activate_skill`, when its config has skills.
pub(crate) fn activate_skill(config: &RunConfig) -> Option<Arc<dyn Intrinsic>> {
    if config.skills.skills.is_empty() {
        return None;
    }
    let names: Vec<String> = config.skills.skills.iter().map(|skill| skill.name.clone()).collect();
    Some(activate_skill_for(&names))
}

/// `activate_skill(name)`: returns a skill's instructions. Its `name` is an enum of the
/// run's skills, so the schema itself tells the model every name. Carried out by the
/// kernel from the run's skills; [`Tool::invoke`] is never reached.
fn activate_skill_for(names: &[String]) -> Arc<dyn Intrinsic> {
    Arc::new(ActivateSkill {
        spec: ToolSpec {
            name: ACTIVATE_SKILL.to_owned(),
            description: "Load a skill's instructions (and the list of its files) by name, before a task its description in the system prompt fits."
                .to_owned(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"name": {"enum": names}},
                "required": ["name"],
                "additionalProperties": false
            }),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: true,
            first_party: true,
        },
    })
}

/// The `activate_skill` tool.
#[derive(Debug)]
struct ActivateSkill {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for ActivateSkill {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::error(format!("error: {} is carried out by the kernel", self.spec.name))
    }
}

#[async_trait]
impl Intrinsic for ActivateSkill {
    async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> crate::Result<Carried> {
        let wanted = call.arguments().get("name").and_then(|n| n.as_str()).unwrap_or("");
        let output = match crate::skills::activate(&call.run_config().skills, wanted) {
            Ok((skill, text)) => {
                let activated = EventKind::SkillActivated {
                    call_id: call.tool_call.call_id.clone(),
                    name: skill.name.clone(),
                    location: skill.location.clone(),
                    body_sha256: keel_contracts::sha256_hex(skill.body.as_bytes()),
                    text: text.clone(),
                };
                call.stage(activated);
                ToolOutput::ok(text)
            }
            Err(output) => output,
        };
        Ok(Carried::output(output))
    }
}
