//! The view as a pure function: a scripted run with an edit, a failing command and a
//! refused call, rendered plain (not a terminal), and text from outside keel neutralised.

use chrono::{DateTime, TimeDelta, Utc};
use expect_test::{Expect, expect};
use keel_contracts::{
    Access, ApprovalMode, AttemptId, Budget, Decision, Envelope, EventKind, ExecutionMode,
    FinishReason, Outcome, PermissionAnswer, RunId, RuntimeEvent, SandboxMode, Seq, SessionId,
    ToolCall, ToolCallId, TurnId, Usage, UsageTotals,
};
use uuid::Uuid;

use super::*;

/// Builds a ledger with fixed ids and a clock that advances 100 ms per event.
struct Ledger {
    events: Vec<RuntimeEvent>,
    start: DateTime<Utc>,
}

impl Ledger {
    fn new() -> Ledger {
        let start = DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z").unwrap().to_utc();
        Ledger { events: Vec::new(), start }
    }

    fn push(&mut self, kind: EventKind) -> &mut Ledger {
        self.push_after(100, kind)
    }

    fn push_after(&mut self, millis: i64, kind: EventKind) -> &mut Ledger {
        let seq = self.events.len() as u64 + 1;
        let ts = self.events.last().map_or(self.start, |e| e.ts) + TimeDelta::milliseconds(millis);
        self.events.push(RuntimeEvent {
            seq: Seq(seq),
            session_id: SessionId(Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0001)),
            turn_id: Some(TurnId(Uuid::from_u128(2))),
            run_id: Some(RunId(Uuid::from_u128(3))),
            ts,
            kind,
        });
        self
    }

    fn call(
        &mut self,
        id: &str,
        tool: &str,
        arguments: serde_json::Value,
        text: &str,
    ) -> &mut Ledger {
        self.push(EventKind::ModelResponse {
            text: text.to_owned(),
            reasoning: Vec::new(),
            tool_calls: vec![ToolCall {
                call_id: ToolCallId(id.to_owned()),
                name: tool.to_owned(),
                arguments,
                arguments_error: None,
            }],
            usage: Usage { input_tokens: Some(1200), output_tokens: Some(40), ..Usage::default() },
            finish_reason: FinishReason::ToolCalls,
            cost_usd: Some(0.0031),
            estimated_usage: None,
            raw_usage: None,
            purpose: keel_contracts::RequestPurpose::Conversation,
        })
    }

    /// A call that was allowed, ran for `millis` and ended with `outcome` / `content`.
    fn ran(
        &mut self,
        id: &str,
        tool: &str,
        millis: i64,
        outcome: Outcome,
        content: &str,
    ) -> &mut Ledger {
        self.push(EventKind::ToolAttemptPrepared {
            call_id: ToolCallId(id.to_owned()),
            attempt_id: AttemptId(Uuid::from_u128(9)),
            tool: tool.to_owned(),
            arguments_sha256: "00".to_owned(),
        })
        .push_after(
            millis,
            EventKind::ToolResult {
                call_id: ToolCallId(id.to_owned()),
                attempt_id: Some(AttemptId(Uuid::from_u128(9))),
                tool: tool.to_owned(),
                outcome,
                content: content.to_owned(),
                bytes: content.len() as u64,
                raw: None,
            },
        )
    }

    fn render(&self, verbosity: Verbosity) -> String {
        let mut view = View::new(ViewOptions { verbosity, paint: Paint { enabled: false } });
        let mut out = String::new();
        for event in &self.events {
            for line in view.lines(event) {
                match line.kind {
                    LineKind::Progress => out.push_str(&format!("{}\n", line.text)),
                    LineKind::Answer => {
                        for text in line.text.lines() {
                            out.push_str(&format!("[answer] {text}\n"));
                        }
                    }
                }
            }
        }
        out
    }
}

fn scripted_run() -> Ledger {
    let mut ledger = Ledger::new();
    ledger
        .push(EventKind::SessionCreated {
            workspace: "/work/roman".to_owned(),
            model: "scripted:/work/roman.fix.json".to_owned(),
            envelope: Envelope::executor(),
            mode: ExecutionMode::Live,
            lineage: None,
            base_url: None,
        })
        .push(EventKind::TurnStarted { input: "Fix the failing tests".to_owned() })
        .push(EventKind::RunStarted {
            mode: ExecutionMode::Live,
            sandbox: SandboxMode::Managed,
            approval: ApprovalMode::Sandboxed,
            budget: Budget { max_steps: Some(20), ..Budget::default() },
            resumes: None,
        })
        .push(EventKind::ModelRequested {
            step: 1,
            messages: 2,
            request_sha256: "00".to_owned(),
            tokens: Some(900),
            tokens_before_pruning: None,
            pruned_results: 0,
            purpose: keel_contracts::RequestPurpose::Conversation,
        })
        .call("c1", "read_file", serde_json::json!({"path": "roman.py"}), "")
        .ran("c1", "read_file", 3, Outcome::Ok, "def to_roman(n):\n    ...")
        .call(
            "c2",
            "edit_file",
            serde_json::json!({"path": "roman.py", "old": "    for i in range(n - 1):\n        pass\n", "new": "    for i in range(n):\n        pass\n"}),
            "The loop stops one short; fixing the bound.",
        )
        .push(EventKind::PermissionRequested {
            call_id: ToolCallId("c2".to_owned()),
            tool: "edit_file".to_owned(),
            access: Access::Write,
            arguments: serde_json::json!({}),
        })
        .push(EventKind::PermissionSettled {
            call_id: ToolCallId("c2".to_owned()),
            tool: "edit_file".to_owned(),
            access: Access::Write,
            answer: PermissionAnswer::AllowOnce,
            by: "approval=sandboxed".to_owned(),
            arguments_sha256: None,
            expires_at: None,
        })
        .ran("c2", "edit_file", 12, Outcome::Ok, "edited roman.py")
        .call("c3", "bash", serde_json::json!({"command": "python3 -m unittest -q"}), "")
        .ran(
            "c3",
            "bash",
            2400,
            Outcome::Ok,
            "[stderr]\n.F\n======\nFAIL: test_four\nAssertionError: 'IIII' != 'IV'\n\nRan 2 tests\nFAILED (failures=1)\n[exit code 1]",
        )
        .call(
            "c4",
            "write_file",
            serde_json::json!({"path": "/etc/cron.d/job", "content": "x"}),
            "",
        )
        .push(EventKind::PermissionRequested {
            call_id: ToolCallId("c4".to_owned()),
            tool: "write_file".to_owned(),
            access: Access::Write,
            arguments: serde_json::json!({}),
        })
        .push(EventKind::PermissionSettled {
            call_id: ToolCallId("c4".to_owned()),
            tool: "write_file".to_owned(),
            access: Access::Write,
            answer: PermissionAnswer::Deny,
            by: "approval=sandboxed: write_file writes outside the workspace, and no terminal to ask"
                .to_owned(),
            arguments_sha256: None,
            expires_at: None,
        })
        .push(EventKind::ToolResult {
            call_id: ToolCallId("c4".to_owned()),
            attempt_id: None,
            tool: "write_file".to_owned(),
            outcome: Outcome::Refused,
            content: keel_contracts::REFUSAL_PERMISSION_DENIED.to_owned(),
            bytes: 10,
            raw: None,
        })
        .call("c5", "bash", serde_json::json!({"command": "rm -rf /"}), "")
        .push(EventKind::GateDecision {
            call_id: ToolCallId("c5".to_owned()),
            tool: "bash".to_owned(),
            decision: Decision::Refuse,
            reason: "forbidden".to_owned(),
        })
        .push(EventKind::ToolResult {
            call_id: ToolCallId("c5".to_owned()),
            attempt_id: None,
            tool: "bash".to_owned(),
            outcome: Outcome::Refused,
            content: keel_contracts::REFUSAL_FORBIDDEN.to_owned(),
            bytes: 10,
            raw: None,
        })
        .push(EventKind::ModelResponse {
            text: "Fixed the off-by-one in to_roman.".to_owned(),
            reasoning: Vec::new(),
            tool_calls: Vec::new(),
            usage: Usage { input_tokens: Some(1500), output_tokens: Some(12), ..Usage::default() },
            finish_reason: FinishReason::Stop,
            cost_usd: Some(0.004),
            estimated_usage: None,
            raw_usage: None,
            purpose: keel_contracts::RequestPurpose::Conversation,
        })
        .push(EventKind::RunCompleted {
            reason: "the model answered".to_owned(),
            usage: UsageTotals {
                input_tokens: 7500,
                output_tokens: 212,
                responses: 6,
                cost_usd: Some(0.0195),
                ..UsageTotals::default()
            },
            answer: None,
            duration_ms: None,
        });
    ledger
}

fn check(ledger: &Ledger, verbosity: Verbosity, expected: Expect) {
    expected.assert_eq(&ledger.render(verbosity));
}

#[test]
fn a_scripted_run_reads_as_one_line_per_call() {
    check(
        &scripted_run(),
        Verbosity::Normal,
        expect![[r#"
            keel session 01930000-0000-7000-8000-000000000001 · scripted:/work/roman.fix.json · /work/roman
            ▸ Fix the failing tests
              sandbox managed · approval sandboxed · max 20 steps
              ✓ read_file roman.py · ok · 3ms
              The loop stops one short; fixing the bound.
              ✓ edit_file roman.py · ok · 12ms
                --- a/roman.py
                +++ b/roman.py
                -    for i in range(n - 1):
                +    for i in range(n):
                         pass
              ✗ bash python3 -m unittest -q · exit 1 · 2.4s
                │ [stderr]
                │ .F
                │ ======
                │ FAIL: test_four
                │ AssertionError: 'IIII' != 'IV'
                │ 
                │ Ran 2 tests
                │ FAILED (failures=1)
              ✗ write_file /etc/cron.d/job · refused: approval=sandboxed: write_file writes outside the workspace, and no terminal to ask
              ✗ bash rm -rf / · refused: forbidden
            [answer] Fixed the off-by-one in to_roman.
            ✓ completed · 7,500 in / 212 out tokens · 6 model calls · $0.0195 · 4.2s
        "#]],
    );
}

#[test]
fn quiet_shows_only_the_answer() {
    check(
        &scripted_run(),
        Verbosity::Quiet,
        expect![[r#"
            [answer] Fixed the off-by-one in to_roman.
        "#]],
    );
}

#[test]
fn verbose_is_the_full_trace() {
    let text = scripted_run().render(Verbosity::Verbose);
    // One line (or more, for several calls) per event, in ledger order.
    assert!(text.starts_with("#1 session 01930000-0000-7000-8000-000000000001"), "{text}");
    assert!(text.contains("#5 model (tool_calls, 1200 in / 40 out tokens)"), "{text}");
    assert!(text.contains("permission c2: allow_once by approval=sandboxed"), "{text}");
    assert!(text.contains("[answer] Fixed the off-by-one in to_roman."), "{text}");
    // The answer is not repeated in the trace's own model line.
    assert_eq!(text.matches("Fixed the off-by-one").count(), 1, "{text}");
}

#[test]
fn wait_deadlines_and_schedule_slots_are_shown_to_the_second() {
    let at = |text: &str| DateTime::parse_from_rfc3339(text).unwrap().to_utc();
    let mut ledger = Ledger::new();
    ledger
        .push(EventKind::ScheduleFired {
            schedule_id: Uuid::from_u128(5),
            scheduled_at: at("2026-03-01T09:59:59.999999999Z"),
        })
        .push(EventKind::WaitStarted {
            call_id: ToolCallId("c1".to_owned()),
            wake_id: "wake_x".to_owned(),
            event: "the build".to_owned(),
            deadline: at("2026-03-01T10:05:00.123456789Z"),
        });
    assert_eq!(
        ledger.render(Verbosity::Normal),
        "  schedule 00000000-0000-0000-0000-000000000005 fired for 2026-03-01T09:59:59Z\n\
         \x20 … waiting for the build until 2026-03-01T10:05:00Z — keel wake wake_x [PAYLOAD]\n"
    );
    let verbose = ledger.render(Verbosity::Verbose);
    assert!(verbose.contains("fired for 2026-03-01T09:59:59Z\n"), "{verbose}");
    assert!(verbose.contains("until 2026-03-01T10:05:00Z: keel wake wake_x"), "{verbose}");
}

#[test]
fn the_same_events_give_the_same_lines() {
    // Live and replay feed one fold: a fresh view over the same ledger gives the same text.
    let ledger = scripted_run();
    assert_eq!(ledger.render(Verbosity::Normal), ledger.render(Verbosity::Normal));
    // Split at any point (a log read while the run goes on), the lines add up.
    let options = ViewOptions { verbosity: Verbosity::Normal, paint: Paint { enabled: false } };
    let mut whole = View::new(options);
    let all: Vec<Line> = ledger.events.iter().flat_map(|e| whole.lines(e)).collect();
    let mut live = View::new(options);
    let mut parts: Vec<Line> = Vec::new();
    for event in &ledger.events {
        parts.extend(live.lines(event));
    }
    assert_eq!(all, parts);
}

#[test]
fn colour_only_wraps_keels_own_marks() {
    let ledger = scripted_run();
    let mut view =
        View::new(ViewOptions { verbosity: Verbosity::Normal, paint: Paint { enabled: true } });
    let text: String =
        ledger.events.iter().flat_map(|e| view.lines(e)).map(|l| l.text + "\n").collect();
    assert!(text.contains("\x1b[31m-    for i in range(n - 1):\x1b[0m"), "{text:?}");
    assert!(text.contains("\x1b[32m+    for i in range(n):\x1b[0m"), "{text:?}");
}

fn hostile_run(text: &str, path: &str, output: &str) -> Ledger {
    let mut ledger = Ledger::new();
    ledger
        .call("c1", "write_file", serde_json::json!({"path": path, "content": text}), text)
        .ran("c1", "write_file", 5, Outcome::Ok, "wrote")
        .call("c2", "bash", serde_json::json!({"command": text}), "")
        .ran("c2", "bash", 5, Outcome::Ok, &format!("{output}\n[exit code 2]"))
        .push(EventKind::ModelResponse {
            text: text.to_owned(),
            reasoning: Vec::new(),
            tool_calls: Vec::new(),
            usage: Usage::default(),
            finish_reason: FinishReason::Stop,
            cost_usd: None,
            estimated_usage: None,
            raw_usage: None,
            purpose: keel_contracts::RequestPurpose::Conversation,
        });
    ledger
}

/// No control character from the events reaches the rendered text (keel's colours are
/// off here, so the rendering may hold none at all).
fn assert_no_controls(text: &str) {
    for c in text.chars() {
        let control = (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}');
        assert!(!control, "{c:?} reached the view: {text:?}");
    }
}

#[test]
fn redteam_terminal_escape_sequences_in_model_text_are_neutralised() {
    let ledger = hostile_run("done\x1b[2J\x1b[H\x1b]0;pwned\x07", "a.txt", "ok");
    let text = ledger.render(Verbosity::Normal);
    assert_no_controls(&text);
    assert!(text.contains("[answer] done\\x1b[2J\\x1b[H\\x1b]0;pwned\\x07"), "{text}");
    let trace = ledger.render(Verbosity::Verbose);
    assert_no_controls(&trace);
    // The neighbour: the same run with ordinary text reads as it was written.
    let text = hostile_run("Fertig: café, 日本, 🚀", "docs/é.md", "ok").render(Verbosity::Normal);
    assert!(text.contains("[answer] Fertig: café, 日本, 🚀"), "{text}");
    assert!(text.contains("✓ write_file docs/é.md · ok"), "{text}");
}

#[test]
fn redteam_terminal_escape_sequences_in_tool_output_are_neutralised() {
    let output = "compiling\r\x1b[2K\x1b[32mall tests passed\x1b[0m\n\x1b]52;c;ZXZpbA==\x07";
    let text = hostile_run("x", "a.txt", output).render(Verbosity::Normal);
    assert_no_controls(&text);
    assert!(text.contains("│ compiling\\r\\x1b[2K\\x1b[32mall tests passed"), "{text}");
    assert!(text.contains("│ \\x1b]52;c;ZXZpbA==\\x07"), "{text}");
    assert_no_controls(&hostile_run("x", "a.txt", output).render(Verbosity::Verbose));
}

#[test]
fn redteam_terminal_escape_sequences_in_file_names_are_neutralised() {
    let path = "src/\x1b[8mhidden\u{202e}sr.exe\r.txt";
    let text = hostile_run("x", path, "ok").render(Verbosity::Normal);
    assert_no_controls(&text);
    assert!(text.contains("write_file src/\\x1b[8mhidden\\u{202e}sr.exe\\r.txt · ok"), "{text}");
    assert!(text.contains("+++ b/src/\\x1b[8mhidden"), "{text}");
}

#[test]
fn redteam_terminal_newlines_cannot_fake_a_line_of_keel() {
    // A command whose text holds a newline and a fake closing line stays on its own line.
    let fake = "true\n✓ completed · 0 in / 0 out tokens";
    let text = hostile_run(fake, "a.txt", "ok").render(Verbosity::Normal);
    assert!(text.contains("bash true⏎✓ completed"), "{text}");
    assert!(!text.lines().any(|line| line.starts_with("✓ completed")), "{text}");
}

#[test]
fn failures_say_what_to_do_in_one_line() {
    let refused = "model error: request failed: error sending request for url (http://127.0.0.1:9/v1/chat/completions): client error (Connect): tcp connect error: Connection refused (os error 111)";
    assert_eq!(
        short_reason(refused),
        "model error: cannot reach http://127.0.0.1:9/v1/chat/completions: Connection refused (os error 111); is the server running, and is --base-url (or OPENAI_BASE_URL) right?"
    );
    let html = format!(
        "model error (HTTP 502): <!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>{}</body></html>",
        "<p>nginx</p>".repeat(200)
    );
    assert_eq!(
        short_reason(&html),
        "model error (HTTP 502): an HTML page \"502 Bad Gateway\" (is --base-url an API endpoint, such as …/v1?)"
    );
    assert_eq!(short_reason("the model answered"), "the model answered");
}

fn retry(attempt: u32, status: Option<u16>, error: &str, wait_ms: u64) -> EventKind {
    retry_for(keel_contracts::RequestPurpose::Conversation, attempt, status, error, wait_ms)
}

fn retry_for(
    purpose: keel_contracts::RequestPurpose,
    attempt: u32,
    status: Option<u16>,
    error: &str,
    wait_ms: u64,
) -> EventKind {
    EventKind::ModelRetry {
        step: 1,
        attempt,
        status,
        error: error.to_owned(),
        message: "slow down".to_owned(),
        wait_ms,
        purpose,
    }
}

#[test]
fn a_retry_is_a_line_of_its_own_with_status_or_kind_and_the_wait() {
    let mut ledger = Ledger::new();
    ledger
        .push(retry(2, Some(429), "rate_limited", 4000))
        .push(retry(3, None, "transport", 750))
        .push(retry_for(
            keel_contracts::RequestPurpose::Compaction,
            2,
            Some(529),
            "overloaded",
            1500,
        ));
    // Indented like the other lines of a run (expect! would strip the common indent).
    assert_eq!(
        ledger.render(Verbosity::Normal),
        "  ↻ retry 2 after 429, waiting 4s\n\
         \x20 ↻ retry 3 after transport, waiting 750ms\n\
         \x20 ↻ retry 2 after 529, waiting 1.5s (compaction summary)\n"
    );
    check(
        &ledger,
        Verbosity::Verbose,
        expect![[r#"
            #1 step 1: retry, attempt 2 after HTTP 429, rate_limited: slow down; waiting 4000 ms
            #2 step 1: retry, attempt 3 after transport: slow down; waiting 750 ms
            #3 step 1: retry, attempt 2 after HTTP 529, overloaded: slow down; waiting 1500 ms (compaction summary)
        "#]],
    );
}

#[test]
fn issue_12_an_indeterminate_call_is_reported_with_what_it_means() {
    // Recovery at resume records the unknown outcome; the user reads it before the model
    // continues.
    let mut ledger = Ledger::new();
    ledger.ran("c1", "bash", 5, Outcome::Indeterminate, "indeterminate: keel stopped");
    let text = ledger.render(Verbosity::Normal);
    assert!(text.contains("? bash"), "{text}");
    assert!(text.contains("indeterminate"), "{text}");
    assert!(text.contains("whether it took effect is unknown"), "{text}");
}
