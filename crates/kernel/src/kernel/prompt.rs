//! A run's system prompt: keel's base prompt, the workspace instructions, the skills
//! catalog, the final-answer section of a run with an output schema, plan mode's section.

use keel_contracts::TOOL_OUTPUT_POLICY;

use super::{Kernel, RunConfig};

const BASE_PROMPT: &str = "You are keel, a coding agent working in a repository. \
Use the tools to inspect files, change them and run commands. Work step by step, check your \
changes (for example by running the project's tests), and when the task is done answer \
without tool calls, saying briefly what you did.";

/// Added to the system prompt of a run in plan mode.
pub(super) const PLAN_MODE_PROMPT: &str = "\n\n# Plan mode\n\nThis session is planning: nothing may be \
changed yet. Inspect what you need with read tools, record your plan with the `plan` tool (ordered \
steps), and end with an answer that states the plan. Calls that change anything are refused until \
the user approves the plan; then you will be asked to carry it out.";

impl Kernel {
    pub(super) fn system_prompt(
        &self,
        workspace: &str,
        config: &RunConfig,
        catalog: Option<&crate::skills::Catalog>,
    ) -> String {
        let mut prompt =
            format!("{BASE_PROMPT} {TOOL_OUTPUT_POLICY}\n\nWorkspace root: {workspace}");
        for instruction in &config.instructions {
            prompt.push_str(&format!(
                "\n\n# Instructions from {}\n\n{}",
                instruction.source,
                instruction.text.trim_end()
            ));
        }
        if let Some(catalog) = catalog {
            prompt.push_str("\n\n");
            prompt.push_str(catalog.text.trim_end());
        }
        if config.output_schema.is_some() {
            prompt.push_str(
                "\n\n# Final answer\n\nThis run needs its answer in a fixed shape: when the task \
                 is done, call `submit` with the answer as its arguments (they must match its \
                 schema). The run ends with the first valid submission; if it is invalid you are \
                 told what is wrong, so fix it and submit again.",
            );
        }
        prompt
    }
}
