//! Whether a provider's completion count includes its reasoning tokens, decided from its
//! totals (issue 12 item 3).
//!
//! keel's [`Usage`](keel_contracts::Usage) counts each token once: `output_tokens`
//! excludes reasoning, `reasoning_tokens` carries it. Providers differ: OpenAI counts
//! reasoning inside `completion_tokens` / `output_tokens`; xAI and some OpenAI-compatible
//! servers report it on top; Gemini's OpenAI-compatible endpoint bills thinking inside
//! `total_tokens` without itemising it. A provider's details are not always right about
//! which (corpus and recordings show `reasoning_tokens` larger than the completion it is
//! said to be part of), so the totals decide when they are present:
//!
//! 1. `total == prompt + completion`: reasoning is inside the completion, whatever the
//!    details say; `output = completion - reasoning`. A reasoning count larger than the
//!    completion is cut to it (the total is the bill).
//! 2. `total == prompt + completion + reasoning`: reasoning is on top; `output =
//!    completion`.
//! 3. `total > prompt + completion` without a reasoning count: the difference is billed
//!    reasoning that was not itemised (Gemini); `reasoning = total - prompt - completion`.
//! 4. `total > prompt + completion` otherwise: reasoning is on top, as reported.
//! 5. No total (or a total below prompt + completion, which no rule explains): the wire
//!    API's documented default ([`WithoutTotals`]).
//!
//! The provider's own figures are kept beside the normalised ones
//! (`ModelResponse::raw_usage`), so a wrong guess is visible and recoverable.

/// What a wire API's usage means when its totals cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WithoutTotals {
    /// Reasoning is inside the completion count (OpenAI's documented rule).
    Inside,
    /// Inside, unless the reasoning count exceeds the completion count, which it then
    /// cannot be part of.
    InsideUnlessLarger,
}

/// Splits a completion count into `(output_tokens, reasoning_tokens)` by the module's
/// rule; `None` stays `None` (unreported is never zero).
pub(crate) fn split_reasoning(
    prompt: Option<u64>,
    completion: Option<u64>,
    reasoning: Option<u64>,
    total: Option<u64>,
    without_totals: WithoutTotals,
) -> (Option<u64>, Option<u64>) {
    let Some(completion) = completion else {
        return (None, reasoning);
    };
    let inside = |reasoning: Option<u64>| match reasoning {
        Some(reasoning) => {
            let reasoning = reasoning.min(completion);
            (Some(completion - reasoning), Some(reasoning))
        }
        None => (Some(completion), None),
    };
    if let (Some(prompt), Some(total)) = (prompt, total) {
        let base = prompt.saturating_add(completion);
        if total == base {
            return inside(reasoning);
        }
        if total > base {
            return match reasoning {
                Some(reasoning) => (Some(completion), Some(reasoning)),
                None => (Some(completion), Some(total - base)),
            };
        }
    }
    match (without_totals, reasoning) {
        (WithoutTotals::InsideUnlessLarger, Some(reasoning)) if reasoning > completion => {
            (Some(completion), Some(reasoning))
        }
        _ => inside(reasoning),
    }
}

#[cfg(test)]
mod tests {
    use super::WithoutTotals::{Inside, InsideUnlessLarger};
    use super::*;

    #[test]
    fn totals_decide_inside_or_on_top() {
        // OpenAI o-series: 100 + 500 = 600, reasoning inside.
        assert_eq!(
            split_reasoning(Some(100), Some(500), Some(400), Some(600), Inside),
            (Some(100), Some(400))
        );
        // xAI: 307 + 26 + 227 = 560, reasoning on top.
        assert_eq!(
            split_reasoning(Some(307), Some(26), Some(227), Some(560), Inside),
            (Some(26), Some(227))
        );
        // OpenRouter: 43 + 10 = 53 with reasoning 11: inside, whatever the details say,
        // and never more than the completion.
        assert_eq!(
            split_reasoning(Some(43), Some(10), Some(11), Some(53), InsideUnlessLarger),
            (Some(0), Some(10))
        );
    }

    #[test]
    fn unitemised_reasoning_in_the_total_is_counted() {
        // Gemini's OpenAI-compatible endpoint: 35 + 12 < 109, no reasoning details.
        assert_eq!(
            split_reasoning(Some(35), Some(12), None, Some(109), InsideUnlessLarger),
            (Some(12), Some(62))
        );
    }

    #[test]
    fn without_totals_the_wire_default_applies() {
        assert_eq!(split_reasoning(None, Some(50), Some(20), None, Inside), (Some(30), Some(20)));
        assert_eq!(
            split_reasoning(Some(5), Some(10), Some(30), None, InsideUnlessLarger),
            (Some(10), Some(30))
        );
        assert_eq!(
            split_reasoning(Some(5), Some(50), Some(30), None, InsideUnlessLarger),
            (Some(20), Some(30))
        );
        // A total below prompt + completion explains nothing.
        assert_eq!(
            split_reasoning(Some(5), Some(50), Some(30), Some(7), Inside),
            (Some(20), Some(30))
        );
        assert_eq!(split_reasoning(Some(5), None, Some(3), Some(9), Inside), (None, Some(3)));
        assert_eq!(split_reasoning(Some(5), Some(9), None, None, Inside), (Some(9), None));
    }
}
