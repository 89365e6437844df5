//! An agent session's ledger as Harbor's ATIF trajectory (`trajectory.json`).
//!
//! A pure projection ([`from_events`]): the same events always give the same document.
//! Steps count from 1: the user's input (`source: user`), each conversation response of
//! the model (`source: agent`, with its text, tool calls, the results of those calls as
//! its observation, and its usage and cost as metrics), and how a run ended when it did
//! not complete (`source: system`). `final_metrics` sums the session's responses. The
//! schema is Harbor's (`crates/eval/schema/atif-trajectory.schema.json`).

use keel_contracts::{EventKind, RequestPurpose, RuntimeEvent};
use serde_json::{Value, json};

/// The ATIF version written.
pub const SCHEMA_VERSION: &str = "ATIF-v1.6";

/// The trajectory of the session whose ledger is `events` (in seq order).
pub fn from_events(events: &[RuntimeEvent]) -> Value {
    let mut steps: Vec<Value> = Vec::new();
    let mut model_name: Option<String> = None;
    let mut session_id: Option<String> = None;
    let mut totals = Totals::default();
    // The index in `steps` of the agent step whose calls await results.
    let mut open_step: Option<usize> = None;
    for event in events {
        session_id.get_or_insert_with(|| event.session_id.to_string());
        let timestamp = event.ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        match &event.kind {
            EventKind::SessionCreated { model, .. } => {
                model_name = Some(model.clone());
            }
            EventKind::TurnStarted { input } => {
                open_step = None;
                steps.push(json!({
                    "source": "user",
                    "timestamp": timestamp,
                    "message": input,
                }));
            }
            EventKind::ModelResponse {
                text,
                tool_calls,
                usage,
                cost_usd,
                estimated_usage,
                purpose,
                ..
            } => {
                let prompt =
                    usage.input_tokens.or(estimated_usage.as_ref().and_then(|u| u.input_tokens));
                let completion =
                    usage.output_tokens.or(estimated_usage.as_ref().and_then(|u| u.output_tokens));
                totals.add(prompt, completion, usage.cached_input_tokens, *cost_usd);
                if !matches!(purpose, RequestPurpose::Conversation) {
                    continue;
                }
                let calls: Vec<Value> = tool_calls
                    .iter()
                    .map(|call| {
                        let arguments = match &call.arguments {
                            Value::Object(_) => call.arguments.clone(),
                            other => json!({ "value": other }),
                        };
                        json!({
                            "tool_call_id": call.call_id.to_string(),
                            "function_name": call.name,
                            "arguments": arguments,
                        })
                    })
                    .collect();
                let mut step = json!({
                    "source": "agent",
                    "timestamp": timestamp,
                    "message": text,
                    "metrics": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "cached_tokens": usage.cached_input_tokens,
                        "cost_usd": cost_usd,
                    },
                });
                if let Some(model) = &model_name {
                    step["model_name"] = json!(model);
                }
                if !calls.is_empty() {
                    step["tool_calls"] = Value::Array(calls);
                    step["observation"] = json!({ "results": [] });
                    open_step = Some(steps.len());
                } else {
                    open_step = None;
                }
                steps.push(step);
            }
            EventKind::ToolResult { call_id, outcome, content, tool, .. } => {
                let result = json!({
                    "source_call_id": call_id.to_string(),
                    "content": content,
                    "extra": { "tool": tool, "outcome": outcome.as_str() },
                });
                match open_step.and_then(|index| steps.get_mut(index)) {
                    Some(step) => {
                        if let Some(results) = step["observation"]["results"].as_array_mut() {
                            results.push(result);
                        }
                    }
                    None => steps.push(json!({
                        "source": "system",
                        "timestamp": timestamp,
                        "message": format!("result of {tool} (call {call_id})"),
                        "observation": { "results": [result] },
                    })),
                }
            }
            EventKind::RunFailed { reason, .. } => {
                steps.push(system_step(&timestamp, &format!("run failed: {reason}")));
            }
            EventKind::RunSuspended { reason, .. } => {
                steps.push(system_step(&timestamp, &format!("run suspended: {reason}")));
            }
            EventKind::RunCancelled { reason, .. } => {
                steps.push(system_step(&timestamp, &format!("run cancelled: {reason}")));
            }
            EventKind::RunDenied { reason, .. } => {
                steps.push(system_step(&timestamp, &format!("run denied: {reason}")));
            }
            _ => {}
        }
    }
    if steps.is_empty() {
        steps.push(system_step("", "the session recorded no steps"));
    }
    for (index, step) in steps.iter_mut().enumerate() {
        step["step_id"] = json!(index + 1);
        if step["timestamp"] == json!("") {
            step["timestamp"] = Value::Null;
        }
    }
    let total_steps = steps.len();
    json!({
        "schema_version": SCHEMA_VERSION,
        "session_id": session_id,
        "agent": {
            "name": "keel",
            "version": env!("CARGO_PKG_VERSION"),
            "model_name": model_name,
        },
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": totals.prompt,
            "total_completion_tokens": totals.completion,
            "total_cached_tokens": totals.cached,
            "total_cost_usd": totals.cost,
            "total_steps": total_steps,
        },
    })
}

fn system_step(timestamp: &str, message: &str) -> Value {
    json!({ "source": "system", "timestamp": timestamp, "message": message })
}

/// Sums over the session's responses; a cost is known only while every response's is.
#[derive(Debug)]
struct Totals {
    prompt: u64,
    completion: u64,
    cached: u64,
    cost: Option<f64>,
}

impl Default for Totals {
    fn default() -> Totals {
        Totals { prompt: 0, completion: 0, cached: 0, cost: Some(0.0) }
    }
}

impl Totals {
    fn add(
        &mut self,
        prompt: Option<u64>,
        completion: Option<u64>,
        cached: Option<u64>,
        cost: Option<f64>,
    ) {
        self.prompt += prompt.unwrap_or(0);
        self.completion += completion.unwrap_or(0);
        self.cached += cached.unwrap_or(0);
        self.cost = match (self.cost, cost) {
            (Some(total), Some(cost)) => Some(total + cost),
            _ => None,
        };
    }
}
