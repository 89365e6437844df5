//! Usage and cost summed over model responses, as a run's terminal events and the session
//! listing carry them.

use serde::{Deserialize, Serialize};

use crate::Usage;

/// Usage summed over responses. Responses that reported no usage are counted, so a total
/// is never silently understated.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Sum of reported input tokens.
    pub input_tokens: u64,
    /// Sum of reported output tokens.
    pub output_tokens: u64,
    /// Sum of reported cached input tokens.
    pub cached_input_tokens: u64,
    /// Sum of reported reasoning tokens.
    pub reasoning_tokens: u64,
    /// Model responses counted.
    pub responses: u64,
    /// Of those, responses whose usage was not (fully) reported: their missing figures are
    /// keel's own estimates.
    pub responses_without_usage: u64,
    /// Of `input_tokens + output_tokens`, the tokens keel estimated because the provider did
    /// not report them (0 when every figure was reported).
    #[serde(default)]
    pub estimated_tokens: u64,
    /// Total cost in USD; `None` (unknown) as soon as one response's cost is unknown.
    #[serde(default)]
    pub cost_usd: Option<f64>,
}

impl UsageTotals {
    /// The totals of a session whose responses could not be read: one response, its usage
    /// not reported and its cost unknown, so a listing shows "unknown", never zero.
    pub fn unknown() -> UsageTotals {
        UsageTotals { responses: 1, responses_without_usage: 1, ..UsageTotals::default() }
    }

    /// Adds another total (a child's spend to its parent's).
    pub fn absorb(&mut self, other: &UsageTotals) {
        if other.responses == 0 {
            return;
        }
        self.cost_usd = match (self.responses, self.cost_usd, other.cost_usd) {
            (0, _, cost) => cost,
            (_, Some(total), Some(cost)) => Some(total + cost),
            _ => None,
        };
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.responses += other.responses;
        self.responses_without_usage += other.responses_without_usage;
        self.estimated_tokens += other.estimated_tokens;
    }

    /// Tokens these totals count against a token ceiling: input, output and reasoning
    /// (the sum [`crate::usage_tokens`] takes per response).
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.reasoning_tokens
    }

    /// Adds one response's usage and cost (`None`: unknown). `estimated` is keel's own count
    /// for what the provider did not report (`model_response.estimated_usage`): a missing
    /// input or output figure is taken from it and the response is counted in
    /// `responses_without_usage` and `estimated_tokens`, so an unreported figure is never
    /// counted as 0 (DESIGN.md §4).
    pub fn add(&mut self, usage: &Usage, estimated: Option<&Usage>, cost_usd: Option<f64>) {
        self.cost_usd = match (self.responses, self.cost_usd, cost_usd) {
            (0, _, cost) => cost,
            (_, Some(total), Some(cost)) => Some(total + cost),
            _ => None,
        };
        self.responses += 1;
        let guess = |figure: Option<u64>| figure.unwrap_or(0);
        let input =
            usage.input_tokens.unwrap_or_else(|| guess(estimated.and_then(|e| e.input_tokens)));
        let output =
            usage.output_tokens.unwrap_or_else(|| guess(estimated.and_then(|e| e.output_tokens)));
        if usage.input_tokens.is_none() || usage.output_tokens.is_none() {
            self.responses_without_usage += 1;
            self.estimated_tokens +=
                usage.input_tokens.map_or(input, |_| 0) + usage.output_tokens.map_or(output, |_| 0);
        }
        self.input_tokens += input;
        self.output_tokens += output;
        self.cached_input_tokens += usage.cached_input_tokens.unwrap_or(0);
        self.reasoning_tokens += usage.reasoning_tokens.unwrap_or(0);
    }
}
