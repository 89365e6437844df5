//! Budgets (DESIGN.md §4): when a run must stop early, decided as a pure function.
//!
//! Exhaustion suspends a run (never completes it). Before that, the last permitted step
//! runs with tools off so the model can write its report. Token, cost and time ceilings
//! predict a step's spend from the previous step's: when even one more step would reach a
//! ceiling the run stops now (no report, so the ceiling holds); when one more fits but not
//! two, the next step is the last and runs tools-off. A step ceiling is exact: of N steps,
//! the Nth is the tools-off report.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Usage;

/// Ceilings for one run. `None` means no ceiling of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Budget {
    /// Model requests.
    pub max_steps: Option<u32>,
    /// Tokens (input + output + reasoning) over the run's responses.
    pub max_tokens: Option<u64>,
    /// Cost in USD over the run's responses.
    pub max_cost_usd: Option<f64>,
    /// Wall-clock time since the run started.
    #[serde(with = "optional_millis")]
    pub max_time: Option<Duration>,
}

mod optional_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => {
                s.serialize_some(&u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
            }
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

impl Budget {
    /// Whether any ceiling is set.
    pub fn is_limited(&self) -> bool {
        self.max_steps.is_some()
            || self.max_tokens.is_some()
            || self.max_cost_usd.is_some()
            || self.max_time.is_some()
    }

    /// What is left of this budget after `spent`, as a budget (for a child, which may never
    /// outspend its parent). Ceilings already passed are left at zero.
    pub fn remaining(&self, spent: &Spent) -> Budget {
        Budget {
            max_steps: self.max_steps.map(|max| max.saturating_sub(spent.steps)),
            max_tokens: self.max_tokens.map(|max| max.saturating_sub(spent.tokens)),
            max_cost_usd: self.max_cost_usd.map(|max| (max - spent.cost_usd).max(0.0)),
            max_time: self.max_time.map(|max| max.saturating_sub(spent.elapsed)),
        }
    }

    /// The tighter of two budgets, ceiling by ceiling.
    pub fn min(&self, other: &Budget) -> Budget {
        fn tighter<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, None) => a,
                (None, b) => b,
            }
        }
        Budget {
            max_steps: tighter(self.max_steps, other.max_steps),
            max_tokens: tighter(self.max_tokens, other.max_tokens),
            max_cost_usd: tighter(self.max_cost_usd, other.max_cost_usd),
            max_time: tighter(self.max_time, other.max_time),
        }
    }
}

/// What a run has spent so far, and what its last step cost on its own.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Spent {
    /// Model requests made.
    pub steps: u32,
    /// Tokens over the responses.
    pub tokens: u64,
    /// Cost in USD over the responses (responses without a known cost count as zero here;
    /// a cost ceiling is only accepted when the price is known).
    pub cost_usd: f64,
    /// Time since the run started.
    pub elapsed: Duration,
    /// Tokens of the last step alone.
    pub last_step_tokens: u64,
    /// Cost of the last step alone, in USD.
    pub last_step_cost_usd: f64,
    /// Duration of the last step alone.
    pub last_step_elapsed: Duration,
}

/// The usage a budget and a total count for one response: what the provider reported, with
/// keel's estimate standing in for each figure it did not report.
pub fn effective_usage(reported: &Usage, estimated: Option<&Usage>) -> Usage {
    Usage {
        input_tokens: reported.input_tokens.or_else(|| estimated.and_then(|e| e.input_tokens)),
        output_tokens: reported.output_tokens.or_else(|| estimated.and_then(|e| e.output_tokens)),
        ..*reported
    }
}

/// Tokens a response counts against a token ceiling: input, output and reasoning.
pub fn usage_tokens(usage: &Usage) -> u64 {
    usage.input_tokens.unwrap_or(0)
        + usage.output_tokens.unwrap_or(0)
        + usage.reasoning_tokens.unwrap_or(0)
}

/// The answer of [`check_budget`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetVerdict {
    /// Go on normally.
    Continue,
    /// The next step is the last permitted: run it with tools off for a report.
    LastStep {
        /// Which ceiling, with figures; starts with "stopped early".
        reason: String,
    },
    /// No step is left: suspend now.
    Exhausted {
        /// Which ceiling, with figures; starts with "stopped early".
        reason: String,
    },
}

/// Decides, before a step, whether the run may take it and whether it is the last one.
///
/// # Examples
///
/// ```
/// use keel_contracts::{Budget, BudgetVerdict, Spent, check_budget};
/// let budget = Budget { max_steps: Some(3), ..Budget::default() };
/// assert_eq!(check_budget(&budget, &Spent { steps: 1, ..Spent::default() }), BudgetVerdict::Continue);
/// assert!(matches!(check_budget(&budget, &Spent { steps: 2, ..Spent::default() }), BudgetVerdict::LastStep { .. }));
/// assert!(matches!(check_budget(&budget, &Spent { steps: 3, ..Spent::default() }), BudgetVerdict::Exhausted { .. }));
/// ```
pub fn check_budget(budget: &Budget, spent: &Spent) -> BudgetVerdict {
    let mut last_step = None;
    if let Some(max) = budget.max_steps {
        if spent.steps >= max {
            return exhausted(format!("step budget reached ({} of {max} steps)", spent.steps));
        }
        if spent.steps + 1 >= max {
            last_step.get_or_insert(format!(
                "step budget: step {} of {max} is the last",
                spent.steps + 1
            ));
        }
    }
    // Tokens, cost and time: the next step is predicted to cost what the last one did.
    if let Some(max) = budget.max_tokens {
        let (spent_now, step) = (spent.tokens, spent.last_step_tokens);
        if spent_now >= max || (spent.steps > 0 && spent_now + step >= max) {
            return exhausted(format!(
                "token budget exhausted ({spent_now} of {max} tokens; another step would exceed it)"
            ));
        }
        if spent.steps > 0 && spent_now + 2 * step >= max {
            last_step.get_or_insert(format!(
                "token budget: {spent_now} of {max} tokens used, room for one more step"
            ));
        }
    }
    if let Some(max) = budget.max_cost_usd {
        let (spent_now, step) = (spent.cost_usd, spent.last_step_cost_usd);
        if spent_now >= max || (spent.steps > 0 && spent_now + step >= max) {
            return exhausted(format!(
                "cost budget exhausted (${spent_now:.4} of ${max:.4}; another step would exceed it)"
            ));
        }
        if spent.steps > 0 && spent_now + 2.0 * step >= max {
            last_step.get_or_insert(format!(
                "cost budget: ${spent_now:.4} of ${max:.4} used, room for one more step"
            ));
        }
    }
    if let Some(max) = budget.max_time {
        let (spent_now, step) = (spent.elapsed, spent.last_step_elapsed);
        if spent_now >= max || (spent.steps > 0 && spent_now + step >= max) {
            return exhausted(format!(
                "time budget exhausted ({} ms of {} ms; another step would exceed it)",
                spent_now.as_millis(),
                max.as_millis()
            ));
        }
        if spent.steps > 0 && spent_now + 2 * step >= max {
            last_step.get_or_insert(format!(
                "time budget: {} ms of {} ms used, room for one more step",
                spent_now.as_millis(),
                max.as_millis()
            ));
        }
    }
    match last_step {
        Some(reason) => BudgetVerdict::LastStep { reason: format!("stopped early: {reason}") },
        None => BudgetVerdict::Continue,
    }
}

fn exhausted(reason: String) -> BudgetVerdict {
    BudgetVerdict::Exhausted { reason: format!("stopped early: {reason}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Boundary and arithmetic tables (issue #22): each guard and sum below is pinned by a
    // value that one mutant of it would get wrong.

    #[test]
    fn is_limited_by_each_ceiling_alone() {
        assert!(!Budget::default().is_limited());
        let each = [
            Budget { max_steps: Some(1), ..Budget::default() },
            Budget { max_tokens: Some(1), ..Budget::default() },
            Budget { max_cost_usd: Some(1.0), ..Budget::default() },
            Budget { max_time: Some(Duration::from_secs(1)), ..Budget::default() },
        ];
        for budget in each {
            assert!(budget.is_limited(), "{budget:?}");
        }
    }

    #[test]
    fn remaining_subtracts_each_ceiling_and_stops_at_zero() {
        let budget = Budget {
            max_steps: Some(10),
            max_tokens: Some(1000),
            max_cost_usd: Some(0.5),
            max_time: Some(Duration::from_secs(60)),
        };
        let spent = Spent {
            steps: 4,
            tokens: 300,
            cost_usd: 0.2,
            elapsed: Duration::from_secs(15),
            ..Spent::default()
        };
        let left = budget.remaining(&spent);
        assert_eq!(left.max_steps, Some(6));
        assert_eq!(left.max_tokens, Some(700));
        assert!((left.max_cost_usd.unwrap() - 0.3).abs() < 1e-12, "{left:?}");
        assert_eq!(left.max_time, Some(Duration::from_secs(45)));
        let over = Spent {
            steps: 11,
            tokens: 2000,
            cost_usd: 0.9,
            elapsed: Duration::from_secs(90),
            ..Spent::default()
        };
        let left = budget.remaining(&over);
        assert_eq!(
            (left.max_steps, left.max_tokens, left.max_cost_usd, left.max_time),
            (Some(0), Some(0), Some(0.0), Some(Duration::ZERO))
        );
        assert_eq!(Budget::default().remaining(&spent), Budget::default());
    }

    #[test]
    fn min_takes_the_tighter_ceiling_from_either_side() {
        let a = Budget { max_steps: Some(5), max_tokens: Some(100), ..Budget::default() };
        let b = Budget { max_steps: Some(3), max_cost_usd: Some(0.1), ..Budget::default() };
        for (x, y) in [(a, b), (b, a)] {
            let tight = x.min(&y);
            assert_eq!(tight.max_steps, Some(3));
            assert_eq!(tight.max_tokens, Some(100));
            assert_eq!(tight.max_cost_usd, Some(0.1));
            assert_eq!(tight.max_time, None);
        }
    }

    #[test]
    fn usage_tokens_sums_input_output_and_reasoning() {
        let usage = Usage {
            input_tokens: Some(3),
            output_tokens: Some(5),
            reasoning_tokens: Some(7),
            cached_input_tokens: Some(2),
        };
        assert_eq!(usage_tokens(&usage), 15);
        assert_eq!(usage_tokens(&Usage::default()), 0);
    }

    #[test]
    fn effective_usage_fills_only_what_was_not_reported() {
        let estimate =
            Usage { input_tokens: Some(900), output_tokens: Some(40), ..Usage::default() };
        let reported = Usage {
            input_tokens: Some(1000),
            output_tokens: Some(50),
            reasoning_tokens: Some(9),
            ..Usage::default()
        };
        assert_eq!(effective_usage(&reported, Some(&estimate)), reported);
        let input_only = Usage { input_tokens: Some(1000), ..Usage::default() };
        let charged = effective_usage(&input_only, Some(&estimate));
        assert_eq!((charged.input_tokens, charged.output_tokens), (Some(1000), Some(40)));
        let nothing = effective_usage(&Usage::default(), Some(&estimate));
        assert_eq!((nothing.input_tokens, nothing.output_tokens), (Some(900), Some(40)));
        assert_eq!(effective_usage(&Usage::default(), None), Usage::default());
    }

    #[test]
    fn max_time_is_milliseconds_on_the_wire() {
        let budget: Budget = serde_json::from_str(
            r#"{"max_steps":null,"max_tokens":null,"max_cost_usd":null,"max_time":1500}"#,
        )
        .unwrap();
        assert_eq!(budget.max_time, Some(Duration::from_millis(1500)));
        let none: Budget = serde_json::from_str(
            r#"{"max_steps":2,"max_tokens":null,"max_cost_usd":null,"max_time":null}"#,
        )
        .unwrap();
        assert_eq!((none.max_steps, none.max_time), (Some(2), None));
        assert_eq!(serde_json::to_value(budget).unwrap()["max_time"], 1500);
    }

    #[test]
    fn no_prediction_before_a_step_was_measured() {
        // Before the first step nothing was measured: a stale last-step figure never
        // stops or shortens the run; only the spend itself does.
        let tokens = Budget { max_tokens: Some(1000), ..Budget::default() };
        assert_eq!(check_budget(&tokens, &spent(0, 500, 600)), BudgetVerdict::Continue);
        let cost = Budget { max_cost_usd: Some(1.0), ..Budget::default() };
        let paid = Spent { cost_usd: 0.5, last_step_cost_usd: 0.6, ..Spent::default() };
        assert_eq!(check_budget(&cost, &paid), BudgetVerdict::Continue);
        let time = Budget { max_time: Some(Duration::from_secs(10)), ..Budget::default() };
        let waited = Spent {
            elapsed: Duration::from_secs(5),
            last_step_elapsed: Duration::from_secs(6),
            ..Spent::default()
        };
        assert_eq!(check_budget(&time, &waited), BudgetVerdict::Continue);
        // The same figures after one measured step stop the run.
        assert!(matches!(
            check_budget(&tokens, &spent(1, 500, 600)),
            BudgetVerdict::Exhausted { .. }
        ));
        let paid = Spent { steps: 1, ..paid };
        assert!(matches!(check_budget(&cost, &paid), BudgetVerdict::Exhausted { .. }));
        let waited = Spent { steps: 1, ..waited };
        assert!(matches!(check_budget(&time, &waited), BudgetVerdict::Exhausted { .. }));
        // One more fits, two do not: the last step (tools off).
        assert!(matches!(
            check_budget(&tokens, &spent(1, 500, 300)),
            BudgetVerdict::LastStep { .. }
        ));
        assert!(matches!(check_budget(&tokens, &spent(0, 500, 300)), BudgetVerdict::Continue));
    }

    fn spent(steps: u32, tokens: u64, last: u64) -> Spent {
        Spent { steps, tokens, last_step_tokens: last, ..Spent::default() }
    }

    #[test]
    fn verdict_table() {
        let tokens = Budget { max_tokens: Some(1000), ..Budget::default() };
        let time = Budget { max_time: Some(Duration::from_secs(10)), ..Budget::default() };
        let cost = Budget { max_cost_usd: Some(0.5), ..Budget::default() };
        let at = |steps: u32, elapsed: u64, last: u64| Spent {
            steps,
            elapsed: Duration::from_secs(elapsed),
            last_step_elapsed: Duration::from_secs(last),
            ..Spent::default()
        };
        let paid = |steps: u32, cost_usd: f64, last: f64| Spent {
            steps,
            cost_usd,
            last_step_cost_usd: last,
            ..Spent::default()
        };
        let cases: Vec<(Budget, Spent, &str)> = vec![
            (Budget::default(), spent(500, 10_000_000, 10_000), "continue"),
            (tokens, spent(0, 0, 0), "continue"),
            // 300 + 2 × 300 < 1000: two more steps fit.
            (tokens, spent(1, 300, 300), "continue"),
            // 400 + 400 < 1000 but 400 + 2 × 400 ≥ 1000: one more step, tools off.
            (tokens, spent(1, 400, 400), "last"),
            // 800 + 400 ≥ 1000: another step would go past the ceiling; stop now.
            (tokens, spent(2, 800, 400), "exhausted"),
            (tokens, spent(3, 1000, 200), "exhausted"),
            (time, at(1, 3, 3), "continue"),
            (time, at(1, 4, 4), "last"),
            (time, at(2, 8, 4), "exhausted"),
            (time, at(2, 11, 0), "exhausted"),
            (cost, paid(1, 0.1, 0.1), "continue"),
            (cost, paid(1, 0.2, 0.2), "last"),
            (cost, paid(2, 0.4, 0.2), "exhausted"),
            (cost, paid(3, 0.6, 0.0), "exhausted"),
        ];
        for (budget, spent, want) in cases {
            let got = match check_budget(&budget, &spent) {
                BudgetVerdict::Continue => "continue",
                BudgetVerdict::LastStep { reason } => {
                    assert!(reason.starts_with("stopped early: "), "{reason}");
                    "last"
                }
                BudgetVerdict::Exhausted { reason } => {
                    assert!(reason.starts_with("stopped early: "), "{reason}");
                    "exhausted"
                }
            };
            assert_eq!(got, want, "{budget:?} {spent:?}");
        }
    }

    #[test]
    fn a_child_never_gets_more_than_the_parent_has_left() {
        let parent = Budget { max_tokens: Some(1000), max_steps: Some(10), ..Budget::default() };
        let left = parent.remaining(&spent(4, 700, 100));
        assert_eq!(left.max_tokens, Some(300));
        assert_eq!(left.max_steps, Some(6));
        let child_own = Budget {
            max_tokens: Some(5000),
            max_time: Some(Duration::from_secs(60)),
            ..Budget::default()
        };
        let child = child_own.min(&left);
        assert_eq!(child.max_tokens, Some(300));
        assert_eq!(child.max_time, Some(Duration::from_secs(60)));
    }
}
