//! Prices and cost: usage times a model's price, in USD. Unknown usage or an unknown price
//! give an unknown cost (`None`), never zero.

use serde::{Deserialize, Serialize};

use crate::Usage;

/// A model's price in USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Uncached input tokens.
    pub input_per_mtok: f64,
    /// Cached input tokens; defaults to the input price when the provider has no discount.
    #[serde(default)]
    pub cached_input_per_mtok: Option<f64>,
    /// Output tokens, and reasoning tokens (billed as output by every provider we know).
    pub output_per_mtok: f64,
}

/// The cost of one response in USD, or `None` when its usage was not reported.
///
/// `usage.input_tokens` includes cached tokens (see [`Usage`]); those are billed at the
/// cached price. Reasoning tokens are counted separately from output tokens and billed at
/// the output price.
///
/// # Examples
///
/// ```
/// use keel_contracts::{Price, Usage, cost_usd};
/// let price = Price { input_per_mtok: 0.15, cached_input_per_mtok: Some(0.075), output_per_mtok: 0.60 };
/// let usage = Usage { input_tokens: Some(78), output_tokens: Some(9), ..Usage::default() };
/// let cost = cost_usd(&usage, &price).unwrap();
/// assert!((cost - 0.0000171).abs() < 1e-12);
/// ```
pub fn cost_usd(usage: &Usage, price: &Price) -> Option<f64> {
    let input = usage.input_tokens?;
    let output = usage.output_tokens?;
    let cached = usage.cached_input_tokens.unwrap_or(0).min(input);
    let reasoning = usage.reasoning_tokens.unwrap_or(0);
    let cached_price = price.cached_input_per_mtok.unwrap_or(price.input_per_mtok);
    let per_token = |tokens: u64, per_mtok: f64| tokens as f64 * per_mtok / 1_000_000.0;
    Some(
        per_token(input - cached, price.input_per_mtok)
            + per_token(cached, cached_price)
            + per_token(output + reasoning, price.output_per_mtok),
    )
}
