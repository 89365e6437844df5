//! A run's budgets: the check before each step, and what each model response is charged
//! (reported usage, and keel's own count of what the provider did not report).

use keel_contracts::{
    Budget, BudgetVerdict, EventKind, Price, RunId, Spent, TurnId, check_budget, cost_usd,
    effective_usage, usage_tokens,
};

use crate::Result;
use crate::ledger::Ledger;

/// What the budget check before a step says.
pub(super) enum StepBudget {
    /// Go on.
    Go,
    /// This is the last step: tools off, the model writes its report.
    LastStep(String),
    /// The run stops early, suspended.
    Exhausted(String),
}

/// Checks the run's budgets before a step; a budget that ran out is recorded as
/// `budget_exhausted` (with `report_requested` when one last, tool-free step follows).
pub(super) async fn check_step(
    ledger: &mut Ledger,
    (turn, run): (Option<TurnId>, Option<RunId>),
    budget: &Budget,
    spent: &Spent,
) -> Result<StepBudget> {
    let (reason, report_requested) = match check_budget(budget, spent) {
        BudgetVerdict::Continue => return Ok(StepBudget::Go),
        BudgetVerdict::Exhausted { reason } => (reason, false),
        BudgetVerdict::LastStep { reason } => (reason, true),
    };
    ledger
        .append(turn, run, EventKind::BudgetExhausted { reason: reason.clone(), report_requested })
        .await?;
    Ok(if report_requested { StepBudget::LastStep(reason) } else { StepBudget::Exhausted(reason) })
}

/// Corrects later estimates by what the provider reports for a request keel estimated at
/// `estimated_tokens` (only ever upwards, at most four times).
pub(super) fn rescale(token_scale: &mut f64, reported: Option<u64>, estimated_tokens: u64) {
    if let Some(reported) = reported
        && estimated_tokens > 0
    {
        let ratio = reported as f64 / estimated_tokens as f64;
        if ratio > *token_scale {
            *token_scale = ratio.min(4.0);
        }
    }
}

/// What a response is charged.
pub(super) struct Charged {
    /// keel's own count of what the provider did not report.
    pub(super) estimated_usage: Option<keel_contracts::Usage>,
    /// The tokens the step is charged.
    pub(super) tokens: u64,
    /// Its cost, when the price is known.
    pub(super) cost: Option<f64>,
}

/// What `response` is charged: unknown is not zero (DESIGN.md §4), so what the provider did
/// not report is counted with keel's own tokenizer, recorded as such, and charged like
/// reported usage.
pub(super) fn charge(
    response: &keel_contracts::ModelResponse,
    estimated_tokens: u64,
    price: Option<&Price>,
    counter: &dyn keel_contracts::TokenCounter,
) -> Charged {
    let estimated_usage = estimate_unreported(response, estimated_tokens, counter);
    let charged = effective_usage(&response.usage, estimated_usage.as_ref());
    let cost = price.and_then(|price| cost_usd(&charged, price));
    Charged { estimated_usage, tokens: usage_tokens(&charged), cost }
}

/// keel's own count of the figures a response's usage lacks: the request's estimated size
/// for input, the response's text, reasoning and tool calls for output. `None` when the
/// provider reported both.
pub(crate) fn estimate_unreported(
    response: &keel_contracts::ModelResponse,
    request_tokens: u64,
    counter: &dyn keel_contracts::TokenCounter,
) -> Option<keel_contracts::Usage> {
    let reported = &response.usage;
    if reported.input_tokens.is_some() && reported.output_tokens.is_some() {
        return None;
    }
    let output = || {
        let calls: u64 = response
            .tool_calls
            .iter()
            .map(|call| counter.count(&call.name) + counter.count(&call.arguments.to_string()))
            .sum();
        let reasoning: u64 = response.reasoning.iter().map(|part| counter.count(&part.text)).sum();
        counter.count(&response.text) + calls + reasoning
    };
    Some(keel_contracts::Usage {
        input_tokens: reported.input_tokens.is_none().then_some(request_tokens),
        output_tokens: reported.output_tokens.is_none().then(output),
        cached_input_tokens: None,
        reasoning_tokens: None,
    })
}
