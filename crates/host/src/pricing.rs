//! The price table: `prices.toml` shipped with keel, overridden by
//! `$KEEL_HOME/prices.toml`. Keys are `provider:model`; a dated model name
//! (`claude-haiku-4-5-20251001`) falls back to its undated key.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use keel_contracts::Price;

/// The built-in table (see the file's header for its sources).
const BUILT_IN: &str = include_str!("../prices.toml");

/// Prices by `provider:model`.
#[derive(Debug, Clone, Default)]
pub struct PriceTable(BTreeMap<String, Price>);

impl PriceTable {
    /// The built-in table with the user's file (if any) laid over it.
    pub fn load(keel_home: &Path) -> anyhow::Result<PriceTable> {
        let mut table: BTreeMap<String, Price> =
            toml::from_str(BUILT_IN).context("the built-in price table is invalid")?;
        let user = keel_home.join("prices.toml");
        match std::fs::read_to_string(&user) {
            Ok(text) => {
                let overrides: BTreeMap<String, Price> =
                    toml::from_str(&text).with_context(|| format!("invalid {}", user.display()))?;
                table.extend(overrides);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(error).with_context(|| format!("cannot read {}", user.display()));
            }
        }
        Ok(PriceTable(table))
    }

    /// The price of `provider:model`, trying the name without a `-YYYYMMDD` suffix too.
    pub fn get(&self, provider: &str, model: &str) -> Option<Price> {
        let exact = format!("{provider}:{model}");
        if let Some(price) = self.0.get(&exact) {
            return Some(*price);
        }
        let (stem, suffix) = model.rsplit_once('-')?;
        if suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_digit()) {
            return self.0.get(&format!("{provider}:{stem}")).copied();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_contracts::{Usage, cost_usd};

    /// Usage figures are the `expected.usage` of the recordings in ../shared/cases/provider;
    /// the costs were computed by hand from the table.
    #[test]
    fn costs_of_recorded_traffic_match_hand_computed_values() {
        let table = PriceTable::load(Path::new("/nonexistent")).unwrap();
        let usage = |input, output, cached: Option<u64>, reasoning: Option<u64>| Usage {
            input_tokens: Some(input),
            output_tokens: Some(output),
            cached_input_tokens: cached,
            reasoning_tokens: reasoning,
        };
        let cases = [
            // 01: gpt-4o-mini, 78 in / 9 out: 78 × 0.15 + 9 × 0.60 = 17.1 µ$.
            ("openai", "gpt-4o-mini", usage(78, 9, None, None), 0.000_017_1),
            // 03: gpt-4o, 417 in / 44 out: 417 × 2.50 + 44 × 10 = 1482.5 µ$.
            ("openai", "gpt-4o", usage(417, 44, None, None), 0.001_482_5),
            // 04: gpt-4o, 482 in / 68 out: 1205 + 680 = 1885 µ$.
            ("openai", "gpt-4o", usage(482, 68, None, None), 0.001_885),
            // 08: grok-3-mini, 307 in of which 306 cached, 26 out + 227 reasoning:
            // 1 × 0.30 + 306 × 0.075 + 253 × 0.50 = 149.75 µ$.
            ("openai", "grok-3-mini", usage(307, 26, Some(306), Some(227)), 0.000_149_75),
            // 14: claude-sonnet-4-5, 17 in / 10 out: 51 + 150 = 201 µ$.
            ("anthropic", "claude-sonnet-4-5", usage(17, 10, None, None), 0.000_201),
            // 17: claude-haiku-4-5-20251001 (dated name), 598 in / 92 out (thinking included
            // in Anthropic's output count): 598 + 460 = 1058 µ$.
            ("anthropic", "claude-haiku-4-5-20251001", usage(598, 92, None, None), 0.001_058),
        ];
        for (provider, model, usage, want) in cases {
            let price =
                table.get(provider, model).unwrap_or_else(|| panic!("no price for {model}"));
            let got = cost_usd(&usage, &price).unwrap();
            assert!((got - want).abs() < 1e-12, "{model}: got {got}, want {want}");
        }
        // 05: gemini via an OpenAI-compatible endpoint is not in the table: unknown, not zero.
        assert_eq!(table.get("openai", "gemini-2.5-pro-preview-05-06"), None);
        // Usage the provider did not report gives an unknown cost.
        let price = table.get("openai", "gpt-4o").unwrap();
        assert_eq!(cost_usd(&Usage::default(), &price), None);
    }
}
