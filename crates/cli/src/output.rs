//! What a run prints: the terminal view ([`crate::view`]) on stderr, with a spinner while
//! the model or a tool runs when stderr is a terminal; or `--json` event lines on stdout;
//! and at the end the answer (or, for `--output-format json`, one result object) on stdout.
//! `keel log` renders with the same view, so a live run and its log read alike.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_contracts::{EventKind, RuntimeEvent, StreamDelta};
use keel_kernel::{Observer, RunReport, TurnOutcome};

use crate::args::OutputFormat;
use crate::terminal::{Paint, neutralize};
use crate::view::{LineKind, Verbosity, View, ViewOptions};

/// Whether keel may colour what it writes to a terminal (`NO_COLOR` turns it off).
pub(crate) fn paint_for(is_terminal: bool) -> Paint {
    Paint { enabled: is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) }
}

/// Prints events as they become durable.
#[derive(Debug)]
pub(crate) struct Printer {
    format: OutputFormat,
    options: ViewOptions,
    views: Mutex<Views>,
    /// The live status line; only when stderr is a terminal and progress is shown.
    spinner: Option<ProgressBar>,
}

/// One view per session: the run's own (the first session seen) and its sub-agents',
/// each a projection of its own ledger, so `keel log` of any of them reads the same.
#[derive(Debug, Default)]
struct Views {
    root: Option<keel_contracts::SessionId>,
    by_session: std::collections::BTreeMap<keel_contracts::SessionId, View>,
}

impl Printer {
    pub(crate) fn new(format: OutputFormat, verbosity: Verbosity) -> Printer {
        let terminal = std::io::stderr().is_terminal();
        let options = ViewOptions { verbosity, paint: paint_for(terminal) };
        let spinner = (terminal && format == OutputFormat::Text && verbosity != Verbosity::Quiet)
            .then(new_spinner)
            .flatten();
        Printer { format, options, views: Mutex::new(Views::default()), spinner }
    }

    /// Shows a continued session's `session_created` as a new session's run shows it: the
    /// header line (`keel session ID · MODEL · WORKSPACE`) before the run's own lines.
    pub(crate) fn header(&self, created: &RuntimeEvent) {
        if self.format == OutputFormat::Text
            && matches!(created.kind, EventKind::SessionCreated { .. })
        {
            self.show(created);
        }
    }

    fn show(&self, event: &RuntimeEvent) {
        let Ok(mut views) = self.views.lock() else { return };
        let root = *views.root.get_or_insert(event.session_id);
        let is_root = event.session_id == root;
        let view =
            views.by_session.entry(event.session_id).or_insert_with(|| View::new(self.options));
        let lines = view.lines(event);
        let spinner = self.spinner.as_ref().filter(|s| !s.is_finished());
        for line in lines {
            let text = match (line.kind, is_root) {
                // The run's answer is printed once, on stdout, when the run ends.
                (LineKind::Answer, true) => continue,
                (LineKind::Progress, true) => line.text,
                // A sub-agent's lines, its answer included, sit under the call that
                // started it.
                (LineKind::Progress | LineKind::Answer, false) => {
                    line.text.lines().map(|l| format!("    ┊ {l}")).collect::<Vec<_>>().join("\n")
                }
            };
            match spinner {
                Some(spinner) => spinner.println(&text),
                None => {
                    let _ = writeln!(std::io::stderr().lock(), "{text}");
                }
            }
        }
        if !is_root && event.kind.is_run_terminal() {
            // The parent goes on; its status line stays.
            return;
        }
        let Some(spinner) = spinner else { return };
        match view.status() {
            Some(status) if spinner.message() != status => {
                spinner.reset_elapsed();
                spinner.set_message(status);
            }
            Some(_) => {}
            None if event.kind.is_run_terminal() => spinner.finish_and_clear(),
            None => {}
        }
        match &event.kind {
            // The prompt owns the terminal until it is answered: the status line is left
            // saying what waits, and is not redrawn over the question.
            EventKind::PermissionRequested { .. } | EventKind::ElicitationRequested { .. } => {
                spinner.tick();
                spinner.set_draw_target(ProgressDrawTarget::hidden());
            }
            EventKind::PermissionSettled { .. } | EventKind::ElicitationAnswered { .. } => {
                spinner.set_draw_target(ProgressDrawTarget::stderr());
            }
            _ => {}
        }
    }
}

fn new_spinner() -> Option<ProgressBar> {
    let style = ProgressStyle::with_template("{spinner} {msg} · {elapsed}").ok()?;
    let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    spinner.set_style(style.tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ "));
    spinner.set_message("starting");
    spinner.enable_steady_tick(Duration::from_millis(120));
    Some(spinner)
}

impl Drop for Printer {
    fn drop(&mut self) {
        if let Some(spinner) = &self.spinner {
            spinner.finish_and_clear();
        }
    }
}

impl Observer for Printer {
    fn on_event(&self, event: &RuntimeEvent) {
        match self.format {
            OutputFormat::StreamJson => print_json(event),
            OutputFormat::Json => {}
            OutputFormat::Text => self.show(event),
        }
    }

    fn on_delta(&self, delta: &StreamDelta) {
        // Streamed text is not echoed: the answer is printed once, on stdout, at the end,
        // and text between tool calls is part of the view. The spinner shows progress.
        if let (StreamDelta::Text(_), Some(spinner)) = (delta, &self.spinner) {
            spinner.tick();
        }
    }
}

/// Prints how the run ended and returns its exit status: the answer on stdout (text), or
/// one JSON object (`--output-format json`); reasons on stderr. `started_at` is when the
/// command began, for `duration_ms`.
///
/// When the view was shown (`view_shown`), its closing line already said how the run
/// ended, so only what to do next is added. With an output schema (`structured`), the JSON
/// object also carries the answer parsed, as `structured_output`.
pub(crate) fn finish(
    report: &RunReport,
    format: OutputFormat,
    view_shown: bool,
    started_at: DateTime<Utc>,
    structured: bool,
) -> u8 {
    use crate::exit;
    let (status, result, reason) = match &report.outcome {
        TurnOutcome::Completed { text } => (exit::COMPLETED, text.as_str(), None),
        TurnOutcome::Failed { reason } => (exit::FAILED, "", Some(reason.as_str())),
        TurnOutcome::Suspended { reason, report: text } => {
            (exit::SUSPENDED, text.as_str(), Some(reason.as_str()))
        }
        TurnOutcome::Cancelled { reason } => (exit::CANCELLED, "", Some(reason.as_str())),
        TurnOutcome::Denied { reason } => (exit::DENIED, "", Some(reason.as_str())),
    };
    let outcome = match &report.outcome {
        TurnOutcome::Completed { .. } => "completed",
        TurnOutcome::Failed { .. } => "failed",
        TurnOutcome::Suspended { .. } => "suspended",
        TurnOutcome::Cancelled { .. } => "cancelled",
        TurnOutcome::Denied { .. } => "denied",
    };
    match format {
        OutputFormat::Json => {
            let duration_ms = (keel_contracts::Clock::now(&keel_contracts::SystemClock)
                - started_at)
                .num_milliseconds()
                .max(0);
            let object = serde_json::json!({
                "result": result,
                "session_id": report.session_id,
                "exit": status,
                "outcome": outcome,
                "reason": reason,
                "usage": {
                    "input_tokens": report.usage.input_tokens,
                    "output_tokens": report.usage.output_tokens,
                    "cached_input_tokens": report.usage.cached_input_tokens,
                    "reasoning_tokens": report.usage.reasoning_tokens,
                    "responses": report.usage.responses,
                },
                "cost_usd": report.usage.cost_usd,
                "duration_ms": duration_ms,
            });
            let mut object = object;
            if structured && let TurnOutcome::Completed { text } = &report.outcome {
                object["structured_output"] =
                    serde_json::from_str(text).unwrap_or(serde_json::Value::Null);
            }
            outln!("{object}");
            return status;
        }
        OutputFormat::Text if !result.is_empty() => {
            // At a terminal the answer is neutralised like everything else shown there;
            // piped, it is the model's text exactly.
            if std::io::stdout().is_terminal() {
                outln!("{}", neutralize(result));
            } else {
                outln!("{result}");
            }
        }
        OutputFormat::Text | OutputFormat::StreamJson => {}
    }
    let reason = reason.map(crate::view::short_reason).unwrap_or_default();
    match &report.outcome {
        TurnOutcome::Completed { .. } => {}
        TurnOutcome::Failed { .. } if !view_shown => eprintln!("keel: run failed: {reason}"),
        TurnOutcome::Suspended { reason: why, .. } if why == keel_kernel::WAITING_REASON => {
            // Only its wake resumes a waiting run; `keel resume` refuses it.
            eprintln!(
                "keel: run waiting on `wait`; `keel wake WAKE_ID [PAYLOAD]` resumes it (the wake \
                 id is in `keel log {}`)",
                report.session_id
            );
        }
        TurnOutcome::Suspended { .. } => {
            if !view_shown {
                eprintln!("keel: run suspended ({reason}); a checkpoint was recorded");
            }
            eprintln!("keel: continue with `keel resume {}`", report.session_id);
        }
        TurnOutcome::Cancelled { .. } if !view_shown => {
            eprintln!("keel: run cancelled: {reason}");
        }
        TurnOutcome::Denied { .. } if !view_shown => {
            eprintln!("keel: run denied: {reason}; the turn ended without a wider retry");
        }
        TurnOutcome::Failed { .. } | TurnOutcome::Cancelled { .. } | TurnOutcome::Denied { .. } => {
        }
    }
    status
}

/// One event as one JSON line on stdout (the format of DESIGN.md §9).
pub(crate) fn print_json(event: &RuntimeEvent) {
    let mut stdout = std::io::stdout().lock();
    match serde_json::to_string(event) {
        Ok(line) => {
            let _ = writeln!(stdout, "{line}");
        }
        Err(error) => {
            let _ =
                writeln!(std::io::stderr(), "keel: cannot serialize event {}: {error}", event.seq);
        }
    }
    let _ = stdout.flush();
}
