//! The timeline as HTML: the page's shell, the sessions' summaries, pending approvals with
//! their buttons, and one entry per ledger event.
//!
//! **Ledger text is data.** Everything the ledger holds (model text, tool output, file
//! names, arguments, call ids) was written by a model or a repository and may be hostile:
//! every piece goes through [`text`] (HTML-escaped, its control characters made visible
//! with [`neutralize`]) before it is put in a page.

use std::fmt::Write as _;

use keel_contracts::{RuntimeEvent, Seq, SessionId, SessionSummary};
use keel_host::terminal::neutralize;
use serde_json::Value;

use crate::ledger;

/// Characters of one text shown in the timeline before it is clipped.
const MAX_TEXT: usize = 4000;
/// Lines of one diff shown.
const MAX_DIFF_LINES: usize = 200;

/// The page around `body`: the stylesheet and script from this host, nothing inline.
pub(super) fn shell(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta \
         name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title}</title>\
         <link rel=\"stylesheet\" href=\"/web/app.css\"><script src=\"/web/app.js\" \
         defer></script></head><body><header><h1>keel</h1><span class=\"version\">{version}\
         </span><span id=\"live\" class=\"live\"></span></header>{body}</body></html>",
        title = text(title),
        version = env!("CARGO_PKG_VERSION"),
    )
}

/// Escapes `raw` for HTML text and attribute values, with its control characters made
/// visible first.
pub(crate) fn text(raw: &str) -> String {
    let shown = neutralize(raw);
    let mut out = String::with_capacity(shown.len());
    for c in shown.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A path segment: everything but unreserved characters percent-encoded.
fn segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn clip(raw: &str, max_chars: usize) -> String {
    let mut chars = raw.chars();
    let mut out: String = chars.by_ref().take(max_chars).collect();
    if chars.next().is_some() {
        out.push_str("\n… (clipped)");
    }
    out
}

pub(super) fn one_line_clip(raw: &str, max_chars: usize) -> String {
    keel_host::terminal::one_line(raw, max_chars)
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn summary_html(row: &SessionSummary, shown: &str, events: &[RuntimeEvent]) -> String {
    let usage = ledger::usage(events);
    // Counts that include keel's own estimates (the provider did not report them) are
    // marked so, never shown as exact.
    let estimated = usage.estimated_tokens > 0 || usage.responses_without_usage > 0;
    let (mark, note) = if estimated { ("~", " (estimated in part)") } else { ("", "") };
    let cost = match usage.cost_usd {
        Some(cost) => format!("${cost:.4}"),
        None => "cost unknown".to_owned(),
    };
    format!(
        "<span class=\"state state-{state}\">{state}</span> · <span \
         class=\"workspace\">{workspace}</span> · <span class=\"model\">{model}</span> · \
         <span class=\"usage\">{mark}{input} in / {mark}{output} out tokens{note}</span> · \
         <span class=\"cost\">{cost}</span>",
        state = text(shown),
        workspace = text(&row.workspace),
        model = text(&row.model),
        input = usage.input_tokens,
        output = usage.output_tokens,
    )
}

/// The pending approvals, each with its buttons: a form whose action is the API's answer
/// route; the script posts `{answer}` there with the CSRF header.
pub(super) fn approvals_html(session_id: SessionId, events: &[RuntimeEvent]) -> String {
    let pending = ledger::pending(events);
    if pending.is_empty() {
        return String::new();
    }
    let mut out = String::from("<h3>Pending approvals</h3>");
    for request in &pending {
        let call = &request.call_id.0;
        let action = format!("/v1/sessions/{session_id}/permissions/{}", segment(call));
        let access = serde_json::to_value(request.access).unwrap_or(Value::Null);
        let _ = write!(
            out,
            "<div class=\"approval\" data-call=\"{call}\"><p><b class=\"tool\">{tool}</b> asks \
             for <b>{access}</b> access (call <code>{call}</code>)</p>{detail}<div \
             class=\"buttons\">",
            call = text(call),
            tool = text(&request.tool),
            access = text(access.as_str().unwrap_or("?")),
            detail = call_detail(&request.tool, &request.arguments),
        );
        for (answer, label) in [
            ("allow_once", "Allow once"),
            ("allow_session", "Allow for this session"),
            ("deny", "Deny"),
        ] {
            let _ = write!(
                out,
                "<form class=\"answer\" method=\"post\" action=\"{action}\" \
                 data-answer=\"{answer}\"><button type=\"submit\" class=\"{answer}\" \
                 name=\"answer\" value=\"{answer}\">{label}</button></form>",
                action = text(&action),
            );
        }
        out.push_str("</div></div>");
    }
    out
}

/// A tool call's arguments: a diff for `edit_file` and `write_file`, else the JSON.
fn call_detail(tool: &str, arguments: &Value) -> String {
    let path = str_of(arguments, "path");
    match tool {
        "edit_file" => {
            let mut out =
                format!("<pre class=\"diff\"><span class=\"path\">{}</span>\n", text(path));
            diff_lines(&mut out, str_of(arguments, "old"), "del", '-');
            diff_lines(&mut out, str_of(arguments, "new"), "add", '+');
            out.push_str("</pre>");
            out
        }
        "write_file" => {
            let mut out = format!(
                "<pre class=\"diff\"><span class=\"path\">{} (whole file)</span>\n",
                text(path)
            );
            diff_lines(&mut out, str_of(arguments, "content"), "add", '+');
            out.push_str("</pre>");
            out
        }
        _ => format!(
            "<pre class=\"arguments\">{}</pre>",
            text(&clip(&serde_json::to_string_pretty(arguments).unwrap_or_default(), MAX_TEXT))
        ),
    }
}

fn diff_lines(out: &mut String, body: &str, class: &str, mark: char) {
    let mut lines = body.lines();
    for line in lines.by_ref().take(MAX_DIFF_LINES) {
        let _ = writeln!(out, "<span class=\"{class}\">{mark} {}</span>", text(line));
    }
    let rest = lines.count();
    if rest > 0 {
        let _ = writeln!(out, "<span class=\"more\">… {rest} more lines</span>");
    }
}

/// The timeline entries of events after `after`.
pub(super) fn entries_html(events: &[RuntimeEvent], after: Seq) -> String {
    let mut out = String::new();
    for event in events.iter().filter(|event| event.seq > after) {
        entry_html(&mut out, event);
    }
    out
}

/// A run's usage totals; counts that include keel's estimates are marked `~`.
fn usage_text(usage: &Value) -> String {
    let n = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    if n("estimated_tokens") > 0 || n("responses_without_usage") > 0 {
        format!(
            "~{} in / ~{} out tokens (estimated in part)",
            n("input_tokens"),
            n("output_tokens")
        )
    } else {
        format!("{} in / {} out tokens", n("input_tokens"), n("output_tokens"))
    }
}

fn entry_html(out: &mut String, event: &RuntimeEvent) {
    let kind = event.kind.name();
    let value = serde_json::to_value(event).unwrap_or(Value::Null);
    let mut body = String::new();
    match kind {
        "session_created" => {
            let _ = write!(
                body,
                "workspace <code>{}</code> · model <code>{}</code>",
                text(str_of(&value, "workspace")),
                text(str_of(&value, "model"))
            );
        }
        "turn_started" => {
            let _ = write!(
                body,
                "<p class=\"input\">{}</p>",
                text(&clip(str_of(&value, "input"), MAX_TEXT))
            );
        }
        "model_response" => {
            let said = str_of(&value, "text");
            if !said.is_empty() {
                let _ = write!(body, "<p class=\"text\">{}</p>", text(&clip(said, MAX_TEXT)));
            }
            for call in value.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                let name = str_of(call, "name");
                let arguments = call.get("arguments").cloned().unwrap_or(Value::Null);
                let _ = write!(
                    body,
                    "<div class=\"call\"><span class=\"tool\">→ {}</span>{}</div>",
                    text(name),
                    call_detail(name, &arguments)
                );
            }
            let cost = match value.get("cost_usd").and_then(Value::as_f64) {
                Some(cost) => format!(" · ${cost:.4}"),
                None => String::new(),
            };
            // keel's own count stands in for what the provider did not report.
            let reported = value.get("usage").cloned().unwrap_or(Value::Null);
            let estimated = value.get("estimated_usage").cloned().unwrap_or(Value::Null);
            let n = |key: &str| match reported.get(key).and_then(Value::as_u64) {
                Some(n) => n.to_string(),
                None => match estimated.get(key).and_then(Value::as_u64) {
                    Some(n) => format!("~{n}"),
                    None => "?".to_owned(),
                },
            };
            let _ = write!(
                body,
                "<p class=\"usage\">{} in / {} out tokens{cost}</p>",
                n("input_tokens"),
                n("output_tokens")
            );
        }
        "run_started" => {
            let _ = write!(
                body,
                "mode {} · sandbox {} · approval {}",
                text(str_of(&value, "mode")),
                text(str_of(&value, "sandbox")),
                text(str_of(&value, "approval"))
            );
        }
        "run_composition" => {
            let _ = write!(
                body,
                "{} <code>{}</code>",
                text(str_of(&value, "provider")),
                text(str_of(&value, "model"))
            );
        }
        "model_requested" => {
            let n = |key: &str| value.get(key).and_then(Value::as_u64).unwrap_or(0);
            let _ = write!(body, "step {} · {} messages", n("step"), n("messages"));
        }
        "tool_attempt_prepared" => {
            let _ = write!(body, "<code>{}</code>", text(str_of(&value, "tool")));
        }
        "gate_decision" => {
            let _ = write!(
                body,
                "<code>{}</code>: {} <span class=\"reason\">{}</span>",
                text(str_of(&value, "tool")),
                text(str_of(&value, "decision")),
                text(&clip(str_of(&value, "reason"), MAX_TEXT))
            );
        }
        "permission_requested" => {
            let _ = write!(
                body,
                "<code>{}</code> asks for {} access",
                text(str_of(&value, "tool")),
                text(str_of(&value, "access"))
            );
        }
        "permission_settled" => {
            let _ = write!(
                body,
                "<code>{}</code>: <b class=\"answer\">{}</b> by {}",
                text(str_of(&value, "tool")),
                text(str_of(&value, "answer")),
                text(str_of(&value, "by"))
            );
        }
        "elicitation_requested" => {
            let _ = write!(
                body,
                "MCP server <code>{}</code> asks (its words): <span class=\"reason\">{}</span> \
                 — answer with <code>POST …/questions/{}</code>",
                text(str_of(&value, "server")),
                text(&clip(str_of(&value, "message"), MAX_TEXT)),
                text(str_of(&value, "question"))
            );
        }
        // The answer's values stay in the ledger: the page names the fields only.
        "elicitation_answered" => {
            let fields = value
                .get("content")
                .and_then(Value::as_object)
                .map(|content| content.keys().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            let _ = write!(
                body,
                "<b class=\"answer\">{}</b> by {} <span class=\"reason\">{}{}</span>",
                text(str_of(&value, "action")),
                text(str_of(&value, "by")),
                text(&clip(str_of(&value, "reason"), MAX_TEXT)),
                text(&if fields.is_empty() { String::new() } else { format!(" fields: {fields}") })
            );
        }
        "tools_changed" => {
            let names = |key: &str| {
                value
                    .get(key)
                    .and_then(Value::as_array)
                    .map(|names| {
                        names.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", ")
                    })
                    .unwrap_or_default()
            };
            let _ = write!(
                body,
                "tools added: {} · removed: {}",
                text(&clip(&names("added"), MAX_TEXT)),
                text(&clip(&names("removed"), MAX_TEXT))
            );
        }
        "tool_result" => {
            let outcome = str_of(&value, "outcome");
            let _ = write!(
                body,
                "<code>{}</code> <span class=\"outcome outcome-{o}\">{o}</span><pre \
                 class=\"output\">{}</pre>",
                text(str_of(&value, "tool")),
                text(&clip(str_of(&value, "content"), MAX_TEXT)),
                o = text(outcome),
            );
        }
        "run_completed" | "run_failed" | "run_suspended" | "run_cancelled" | "run_denied" => {
            let usage = value.get("usage").cloned().unwrap_or(Value::Null);
            let _ = write!(
                body,
                "<span class=\"reason\">{}</span> · {}",
                text(&clip(str_of(&value, "reason"), MAX_TEXT)),
                usage_text(&usage)
            );
        }
        _ => {
            let mut rest = value.clone();
            if let Some(map) = rest.as_object_mut() {
                for key in ["seq", "session_id", "turn_id", "run_id", "ts", "kind"] {
                    map.remove(key);
                }
            }
            let _ = write!(
                body,
                "<pre class=\"fields\">{}</pre>",
                text(&clip(&rest.to_string(), 1000))
            );
        }
    }
    let _ = write!(
        out,
        "<li class=\"entry kind-{kind}\" data-seq=\"{seq}\"><span class=\"seq\">#{seq}</span> \
         <span class=\"kind\">{label}</span> <span class=\"ts\">{ts}</span><div \
         class=\"body\">{body}</div></li>",
        seq = event.seq.0,
        label = kind.replace('_', " "),
        ts = event.ts.format("%H:%M:%S"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimated_token_counts_are_marked_and_reported_ones_are_not() {
        let reported = serde_json::json!({"input_tokens": 120, "output_tokens": 8,
                                          "estimated_tokens": 0, "responses_without_usage": 0});
        assert_eq!(usage_text(&reported), "120 in / 8 out tokens");
        let estimated = serde_json::json!({"input_tokens": 120, "output_tokens": 8,
                                           "estimated_tokens": 8, "responses_without_usage": 1});
        assert_eq!(usage_text(&estimated), "~120 in / ~8 out tokens (estimated in part)");
    }

    #[test]
    fn text_escapes_markup_and_shows_terminal_escapes() {
        let shown = text("<script>alert(1)</script>\"onerror='x' & \u{1b}[2K\u{202e}");
        assert_eq!(
            shown,
            "&lt;script&gt;alert(1)&lt;/script&gt;&quot;onerror=&#39;x&#39; &amp; \\x1b[2K\\u{202e}"
        );
        assert_eq!(text("plain é 日本"), "plain é 日本");
    }

    #[test]
    fn a_call_id_becomes_one_encoded_path_segment() {
        assert_eq!(segment("call_1"), "call_1");
        assert_eq!(segment("../x\"<y>"), "..%2Fx%22%3Cy%3E");
    }
}
