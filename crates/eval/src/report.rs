//! `results.jsonl`, `report.md` and `report.html`: pure renderings of the winning attempt
//! of every finished cell.
//!
//! Per task × subject: attempts counted, passes, pass@1 (the mean of pass over scored
//! attempts), pass@k (the unbiased estimator `1 - C(n-c, k) / C(n, k)` with n scored
//! attempts, c passes and k the experiment's repetitions, capped at n), mean reward over
//! scored attempts, tokens, time, and cost per pass, shown only when every attempt of the
//! row has a known cost (and something passed). `infra_error` and `verifier_error` are
//! counted apart and never scored.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::attempt::{AttemptRecord, Class};

/// One row of the report: a task and a subject.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The task.
    pub task: String,
    /// The subject.
    pub subject: String,
    /// Finished cells.
    pub attempts: usize,
    /// Scored attempts (passed, failed, agent_timeout).
    pub scored: usize,
    /// Passes.
    pub passes: usize,
    /// Attempts per class.
    pub classes: BTreeMap<Class, usize>,
    /// pass@1; `None` when nothing was scored.
    pub pass_at_1: Option<f64>,
    /// pass@k with `k` = the experiment's repetitions (capped at the scored attempts).
    pub pass_at_k: Option<f64>,
    /// The k used for pass@k.
    pub k: usize,
    /// Mean reward over scored attempts.
    pub mean_reward: Option<f64>,
    /// Input plus output tokens (known ones).
    pub tokens: u64,
    /// Total wall-clock time, in milliseconds.
    pub duration_ms: u64,
    /// Total cost, when every attempt's is known.
    pub cost_usd: Option<f64>,
    /// Cost per pass, when every attempt's cost is known and something passed.
    pub cost_per_pass_usd: Option<f64>,
}

/// The rows for `records` (winning attempts), sorted by task then subject.
pub fn rows(records: &[&AttemptRecord], repetitions: u32) -> Vec<Row> {
    let mut groups: BTreeMap<(String, String), Vec<&AttemptRecord>> = BTreeMap::new();
    for record in records {
        groups.entry((record.task.clone(), record.subject.clone())).or_default().push(record);
    }
    groups
        .into_iter()
        .map(|((task, subject), records)| {
            let mut classes = BTreeMap::new();
            for record in &records {
                *classes.entry(record.class).or_insert(0) += 1;
            }
            let scored: Vec<&&AttemptRecord> =
                records.iter().filter(|record| record.class.is_scored()).collect();
            let passes = scored.iter().filter(|record| record.class == Class::Passed).count();
            let n = scored.len();
            let k = usize::try_from(repetitions).unwrap_or(usize::MAX).min(n).max(1);
            let pass_at_1 = (n > 0).then(|| passes as f64 / n as f64);
            let pass_at_k = (n > 0).then(|| pass_at_k(n, passes, k));
            let rewards: Vec<f64> = scored.iter().filter_map(|record| record.reward).collect();
            let mean_reward =
                (!rewards.is_empty()).then(|| rewards.iter().sum::<f64>() / rewards.len() as f64);
            let tokens = records
                .iter()
                .map(|record| record.input_tokens.unwrap_or(0) + record.output_tokens.unwrap_or(0))
                .sum();
            let duration_ms = records.iter().map(|record| record.duration_ms).sum();
            let cost_usd = records
                .iter()
                .map(|record| match (record.class, record.cost_usd) {
                    (_, Some(cost)) => Some(cost),
                    _ => None,
                })
                .sum::<Option<f64>>();
            let cost_per_pass_usd =
                cost_usd.filter(|_| passes > 0).map(|cost| cost / passes as f64);
            Row {
                task,
                subject,
                attempts: records.len(),
                scored: n,
                passes,
                classes,
                pass_at_1,
                pass_at_k,
                k,
                mean_reward,
                tokens,
                duration_ms,
                cost_usd,
                cost_per_pass_usd,
            }
        })
        .collect()
}

/// The unbiased pass@k estimator over n attempts with c passes.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n < k || n - c < k {
        return if c > 0 { 1.0 } else { 0.0 };
    }
    // 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)
    let mut fail = 1.0;
    for i in (n - c + 1)..=n {
        fail *= 1.0 - k as f64 / i as f64;
    }
    1.0 - fail
}

/// `results.jsonl`: one winning attempt a line.
pub fn results_jsonl(records: &[&AttemptRecord]) -> String {
    let mut out = String::new();
    for record in records {
        if let Ok(line) = serde_json::to_string(record) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |value| format!("{:.1}%", value * 100.0))
}

fn number(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |value| format!("{value:.3}"))
}

fn cost(value: Option<f64>) -> String {
    value.map_or_else(|| "unknown".to_owned(), |value| format!("${value:.4}"))
}

fn classes_text(row: &Row) -> String {
    row.classes
        .iter()
        .map(|(class, count)| format!("{} {count}", class.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `report.md`.
pub fn markdown(rows: &[Row], interrupted: usize, missing: usize) -> String {
    let mut out = String::from("# keel eval report\n\n");
    let _ = writeln!(
        out,
        "| task | subject | attempts | pass@1 | pass@k | mean reward | tokens | time | cost per pass | classes |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} (k={}) | {} | {} | {:.1} s | {} | {} |",
            escape_md(&row.task),
            escape_md(&row.subject),
            row.attempts,
            percent(row.pass_at_1),
            percent(row.pass_at_k),
            row.k,
            number(row.mean_reward),
            row.tokens,
            row.duration_ms as f64 / 1000.0,
            cost(row.cost_per_pass_usd),
            classes_text(row),
        );
    }
    let _ = writeln!(
        out,
        "\npass@1 and mean reward count scored attempts only (passed, failed, agent_timeout); \
         infra_error and verifier_error are never scored as 0. Cost per pass is shown only \
         when every attempt's cost is known."
    );
    if interrupted > 0 || missing > 0 {
        let _ = writeln!(
            out,
            "\n{interrupted} interrupted attempt(s) recorded; {missing} cell(s) not finished \
             (`keel eval resume DIR`)."
        );
    }
    out
}

fn escape_md(text: &str) -> String {
    crate::experiment::shown(text).replace('|', "\\|")
}

fn escape_html(text: &str) -> String {
    crate::experiment::shown(text)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// `report.html`: the table and a bar chart of pass@1 per task × subject, inline SVG,
/// no external assets.
pub fn html(rows: &[Row], interrupted: usize, missing: usize) -> String {
    let bar_height = 22;
    let label_width = 360;
    let chart_width = 400;
    let height = rows.len() * (bar_height + 8) + 30;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" role=\"img\" \
         aria-label=\"pass@1 per task and subject\">",
        label_width + chart_width + 70
    );
    for (index, row) in rows.iter().enumerate() {
        let y = index * (bar_height + 8) + 10;
        let value = row.pass_at_1.unwrap_or(0.0);
        let width = (value * chart_width as f64).round();
        let _ = write!(
            svg,
            "<text x=\"0\" y=\"{}\" font-size=\"12\">{} · {}</text>\
             <rect x=\"{label_width}\" y=\"{y}\" width=\"{chart_width}\" height=\"{bar_height}\" fill=\"#eee\"/>\
             <rect x=\"{label_width}\" y=\"{y}\" width=\"{width}\" height=\"{bar_height}\" fill=\"#2a7\"/>\
             <text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>",
            y + 15,
            escape_html(&row.task),
            escape_html(&row.subject),
            label_width + chart_width + 6,
            y + 15,
            percent(row.pass_at_1),
        );
    }
    svg.push_str("</svg>");
    let mut table = String::from(
        "<table><tr><th>task</th><th>subject</th><th>attempts</th><th>pass@1</th><th>pass@k</th>\
         <th>mean reward</th><th>tokens</th><th>time</th><th>cost per pass</th><th>classes</th></tr>",
    );
    for row in rows {
        let _ = write!(
            table,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} (k={})</td><td>{}</td>\
             <td>{}</td><td>{:.1} s</td><td>{}</td><td>{}</td></tr>",
            escape_html(&row.task),
            escape_html(&row.subject),
            row.attempts,
            percent(row.pass_at_1),
            percent(row.pass_at_k),
            row.k,
            number(row.mean_reward),
            row.tokens,
            row.duration_ms as f64 / 1000.0,
            cost(row.cost_per_pass_usd),
            escape_html(&classes_text(row)),
        );
    }
    table.push_str("</table>");
    let note = if interrupted > 0 || missing > 0 {
        format!(
            "<p>{interrupted} interrupted attempt(s) recorded; {missing} cell(s) not finished.</p>"
        )
    } else {
        String::new()
    };
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>keel eval report</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}</style></head><body>\
         <h1>keel eval report</h1><h2>pass@1</h2>{svg}<h2>Results</h2>{table}\
         <p>pass@1 and mean reward count scored attempts only (passed, failed, agent_timeout); \
         infra_error and verifier_error are never scored as 0. Cost per pass is shown only when \
         every attempt's cost is known.</p>{note}</body></html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_matches_the_estimator() {
        assert_eq!(pass_at_k(4, 0, 1), 0.0);
        assert_eq!(pass_at_k(4, 4, 2), 1.0);
        assert!((pass_at_k(4, 1, 1) - 0.25).abs() < 1e-9);
        // 1 - C(2,2)/C(4,2) = 1 - 1/6
        assert!((pass_at_k(4, 2, 2) - (1.0 - 1.0 / 6.0)).abs() < 1e-9);
    }
}
