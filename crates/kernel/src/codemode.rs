//! Code Mode's engine: one `run_code` cell, a JavaScript program run in an embedded
//! QuickJS (rquickjs) with no ambient I/O (DESIGN.md §2, issue #20).
//!
//! What a cell has: the ECMAScript built-ins (no `std`/`os` modules, no `fetch`, no
//! timers, no module loader), `print(...)` (its output is the cell's result), and
//! `tools.NAME(args)`, which hands the call to the kernel as a [`NestedRequest`] and
//! resolves to the call's result text. The kernel settles it like a call the model
//! proposed (every gate, recorded); this module knows nothing of the ledger.
//!
//! Limits ([`CodeLimits`]): CPU (time spent running JavaScript, checked by QuickJS's
//! interrupt handler; time waiting for a tool does not count), wall time (from the cell's
//! start, tools included: checked by the interrupt handler and before each tool call; a
//! tool already running finishes under its own limits), memory (QuickJS's allocator
//! limit), output (bytes of `print` kept; the rest is counted and dropped) and tool calls
//! per cell.
//!
//! The cell runs on a blocking thread of its own ([`run_cell`]); a tool call blocks that
//! thread until the kernel answers, so a cell's calls run one at a time, in the order the
//! program makes them.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rquickjs::{Context, Ctx, Function, Promise, Runtime, Value};

/// The bounds of one `run_code` cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeLimits {
    /// Time spent running JavaScript (not waiting for tools).
    pub cpu: Duration,
    /// Time from the cell's start to its end, tool calls included.
    pub wall: Duration,
    /// Memory QuickJS may allocate for the cell, in bytes.
    pub memory_bytes: usize,
    /// Bytes of `print` output kept as the cell's result; more is dropped (and counted).
    pub output_bytes: usize,
    /// Tool calls one cell may make; later ones answer with an error text.
    pub max_calls: u32,
}

impl Default for CodeLimits {
    /// 10 s of CPU, 120 s of wall time, 64 MiB of memory, 64 KiB of output, 100 calls.
    fn default() -> CodeLimits {
        CodeLimits {
            cpu: Duration::from_secs(10),
            wall: Duration::from_secs(120),
            memory_bytes: 64 * 1024 * 1024,
            output_bytes: 64 * 1024,
            max_calls: 100,
        }
    }
}

/// The native stack QuickJS may use (deep recursion is a `RangeError`, not a crash).
const MAX_STACK_BYTES: usize = 512 * 1024;

/// One tool call a cell makes: the kernel settles it and sends the result text back.
#[derive(Debug)]
pub(crate) struct NestedRequest {
    /// The tool's name as the program wrote it.
    pub(crate) tool: String,
    /// Its arguments (`JSON.stringify` of what the program passed).
    pub(crate) arguments: serde_json::Value,
    /// Where the result text goes.
    pub(crate) reply: tokio::sync::oneshot::Sender<String>,
}

/// How a cell ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CellEnd {
    /// The program ran to its end (its promise resolved).
    Completed,
    /// It did not compile, or threw (or rejected) without catching: the error's text.
    Threw(String),
    /// It ran JavaScript longer than [`CodeLimits::cpu`].
    CpuLimit,
    /// It ran longer than [`CodeLimits::wall`].
    WallLimit,
    /// It reached [`CodeLimits::memory_bytes`].
    MemoryLimit,
    /// The kernel stopped it (the run was cancelled).
    Stopped,
    /// Its promise can never settle (it awaits something nothing resolves).
    NeverSettled,
}

/// What a cell left: its printed output and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CellReport {
    /// What `print` wrote, up to [`CodeLimits::output_bytes`].
    pub(crate) printed: String,
    /// Bytes of output dropped past the cap.
    pub(crate) dropped_bytes: u64,
    /// The program's return value as JSON, when it returned something.
    pub(crate) returned: Option<String>,
    /// How it ended.
    pub(crate) end: CellEnd,
    /// Tool calls it made.
    pub(crate) calls: u32,
}

impl CellReport {
    /// The cell's result text: what it printed (and returned), then how it ended when that
    /// was not a normal end.
    pub(crate) fn text(&self, limits: &CodeLimits) -> String {
        let mut text = self.printed.clone();
        if self.dropped_bytes > 0 {
            if !text.ends_with('\n') && !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!(
                "[keel] output capped at {} bytes; {} more bytes were dropped\n",
                limits.output_bytes, self.dropped_bytes
            ));
        }
        if let Some(returned) = &self.returned {
            let returned = capped(returned, limits.output_bytes);
            text.push_str(&format!("[returned] {returned}\n"));
        }
        let ending = match &self.end {
            CellEnd::Completed => None,
            CellEnd::Threw(error) => {
                Some(format!("error: the program failed: {}", capped(error, limits.output_bytes)))
            }
            CellEnd::CpuLimit => Some(format!(
                "error: the program ran out of CPU time (limit {} ms) and was stopped",
                limits.cpu.as_millis()
            )),
            CellEnd::WallLimit => Some(format!(
                "error: the program ran out of wall time (limit {} ms) and was stopped",
                limits.wall.as_millis()
            )),
            CellEnd::MemoryLimit => Some(format!(
                "error: the program reached its memory limit ({} bytes) and was stopped",
                limits.memory_bytes
            )),
            CellEnd::Stopped => Some(
                "cancelled: the run was cancelled while this program ran; \
                                      calls it made before are recorded"
                    .to_owned(),
            ),
            CellEnd::NeverSettled => Some(
                "error: the program awaits something that can never settle (there are no \
                 timers or events here; await tools.NAME(...) calls only)"
                    .to_owned(),
            ),
        };
        if let Some(ending) = ending {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&ending);
        } else if text.is_empty() {
            text.push_str("(the program printed nothing)");
        }
        text
    }
}

/// What the interrupt handler and the tool bridge share: the clocks and why the cell was
/// stopped, if it was.
struct Meter {
    started: Instant,
    /// Time spent waiting for the kernel to settle tool calls.
    blocked: Duration,
    limits: CodeLimits,
    stop: Arc<AtomicBool>,
    /// Set when the cell must stop; the handler then interrupts every instruction.
    reason: Option<CellEnd>,
    calls: u32,
}

impl Meter {
    /// Whether the cell must stop now (recording why).
    fn must_stop(&mut self) -> bool {
        if self.reason.is_some() {
            return true;
        }
        let elapsed = self.started.elapsed();
        self.reason = if self.stop.load(Ordering::Relaxed) {
            Some(CellEnd::Stopped)
        } else if elapsed > self.limits.wall {
            Some(CellEnd::WallLimit)
        } else if elapsed.saturating_sub(self.blocked) > self.limits.cpu {
            Some(CellEnd::CpuLimit)
        } else {
            None
        };
        self.reason.is_some()
    }
}

/// `print`'s buffer, capped.
struct Output {
    text: String,
    dropped: u64,
    cap: usize,
}

impl Output {
    fn push_line(&mut self, line: &str) {
        let room = self.cap.saturating_sub(self.text.len());
        let needed = line.len() + 1;
        if needed <= room {
            self.text.push_str(line);
            self.text.push('\n');
            return;
        }
        let keep = crate::projection::floor_char_boundary(line, room);
        self.text.push_str(&line[..keep]);
        self.dropped += (needed - keep) as u64;
    }
}

/// What a cell's program starts with: `print`, `console.log` and `tools` are defined from
/// the two native bridges, which are then removed from the global object.
const PRELUDE: &str = r#"(() => {
  const call = globalThis.__keel_call;
  const write = globalThis.__keel_print;
  delete globalThis.__keel_call;
  delete globalThis.__keel_print;
  const show = (value) => {
    if (typeof value === "string") return value;
    try { const json = JSON.stringify(value); return json === undefined ? String(value) : json; }
    catch (_) { return String(value); }
  };
  const print = (...values) => { write(values.map(show).join(" ")); };
  globalThis.print = print;
  globalThis.console = Object.freeze({ log: print, info: print, warn: print, error: print });
  globalThis.tools = new Proxy(Object.freeze({}), {
    get(_target, name) {
      if (typeof name !== "string" || name === "then") return undefined;
      return async (args) => call(name, args === undefined ? "{}" : JSON.stringify(args));
    },
  });
})();"#;

/// The user's code as the body of an async function, so `await` works at its top level;
/// its lines keep their numbers in error stacks (`run_code:LINE:COLUMN`).
fn wrap(code: &str) -> String {
    format!("(async () => {{{code}\n}})()")
}

/// Evaluates `source` as a script named `run_code` (the name error stacks show).
fn eval<'js, V: rquickjs::FromJs<'js>>(ctx: &Ctx<'js>, source: String) -> rquickjs::Result<V> {
    let mut options = rquickjs::context::EvalOptions::default();
    options.global = true;
    options.filename = Some("run_code".to_owned());
    ctx.eval_with_options(source, options)
}

/// Runs one cell to its end on the calling thread (a blocking thread: tool calls block it
/// while the kernel settles them through `requests`). `stop` is set by the kernel to
/// cancel; the cell then stops at its next instruction or tool call.
pub(crate) fn run_cell(
    code: &str,
    limits: CodeLimits,
    requests: tokio::sync::mpsc::Sender<NestedRequest>,
    stop: Arc<AtomicBool>,
) -> CellReport {
    let meter = Rc::new(RefCell::new(Meter {
        started: Instant::now(),
        blocked: Duration::ZERO,
        limits,
        stop,
        reason: None,
        calls: 0,
    }));
    let output =
        Rc::new(RefCell::new(Output { text: String::new(), dropped: 0, cap: limits.output_bytes }));
    let mut report = CellReport {
        printed: String::new(),
        dropped_bytes: 0,
        returned: None,
        end: CellEnd::Completed,
        calls: 0,
    };
    let runtime = match Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            report.end = CellEnd::Threw(format!("the JavaScript engine did not start: {error}"));
            return report;
        }
    };
    runtime.set_memory_limit(limits.memory_bytes);
    runtime.set_max_stack_size(MAX_STACK_BYTES);
    {
        let meter = meter.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || meter.borrow_mut().must_stop())));
    }
    let context = match Context::full(&runtime) {
        Ok(context) => context,
        Err(error) => {
            report.end = CellEnd::Threw(format!("the JavaScript engine did not start: {error}"));
            return report;
        }
    };
    let (end, returned) = context.with(|ctx| {
        if let Err(error) = install_bridges(&ctx, &meter, &output, requests) {
            return (CellEnd::Threw(format!("the cell could not be set up: {error}")), None);
        }
        if let Err(error) = eval::<()>(&ctx, PRELUDE.to_owned()) {
            return (classify(&ctx, error, &meter), None);
        }
        let promise: Promise<'_> = match eval(&ctx, wrap(code)) {
            Ok(promise) => promise,
            Err(error) => return (classify(&ctx, error, &meter), None),
        };
        match promise.finish::<Value<'_>>() {
            Ok(value) if value.is_undefined() => (CellEnd::Completed, None),
            Ok(value) => {
                let json =
                    ctx.json_stringify(value).ok().flatten().and_then(|s| s.to_string().ok());
                (CellEnd::Completed, json)
            }
            Err(error) => (classify(&ctx, error, &meter), None),
        }
    });
    // A stop found by the handler wins over what the interrupted code made of it.
    let reason = meter.borrow().reason.clone();
    report.end = match (reason, end) {
        (Some(reason), CellEnd::Completed) if reason != CellEnd::Stopped => CellEnd::Completed,
        (Some(reason), _) => reason,
        (None, end) => end,
    };
    report.returned = returned;
    report.calls = meter.borrow().calls;
    let output = output.borrow();
    report.printed = output.text.clone();
    report.dropped_bytes = output.dropped;
    report
}

/// Installs `__keel_call(name, json)` and `__keel_print(text)` on the global object.
fn install_bridges(
    ctx: &Ctx<'_>,
    meter: &Rc<RefCell<Meter>>,
    output: &Rc<RefCell<Output>>,
    requests: tokio::sync::mpsc::Sender<NestedRequest>,
) -> rquickjs::Result<()> {
    let printed = output.clone();
    let print = Function::new(ctx.clone(), move |text: String| {
        printed.borrow_mut().push_line(&text);
    })?;
    let meter = meter.clone();
    let call = Function::new(ctx.clone(), move |tool: String, arguments: String| -> String {
        call_tool(&meter, &requests, tool, &arguments)
    })?;
    let globals = ctx.globals();
    globals.set("__keel_print", print)?;
    globals.set("__keel_call", call)?;
    Ok(())
}

/// The most bytes of JSON arguments one `tools.NAME(args)` may pass (1 MiB): each call's
/// arguments are recorded in the ledger, so a loop must not turn a few lines of program
/// into gigabytes of it.
const MAX_ARGUMENT_BYTES: usize = 1024 * 1024;

/// `text` cut to at most `limit` bytes (on a character boundary), with a note of how much
/// was dropped: a returned value or an error's text is bounded like `print`.
fn capped(text: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= limit {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}… [keel: capped at {limit} bytes; {} more bytes were dropped]",
        &text[..end],
        text.len() - end
    ))
}

/// One `tools.NAME(args)`: handed to the kernel, answered with the result text. Never
/// throws: a refusal, an error or a limit is text the program reads.
fn call_tool(
    meter: &Rc<RefCell<Meter>>,
    requests: &tokio::sync::mpsc::Sender<NestedRequest>,
    tool: String,
    arguments: &str,
) -> String {
    {
        let mut meter = meter.borrow_mut();
        if meter.must_stop() {
            return "cancelled: the program is being stopped; this call was not made".to_owned();
        }
        if meter.calls >= meter.limits.max_calls {
            return format!(
                "error: this program already made {} tool calls, its limit; this call was not made",
                meter.limits.max_calls
            );
        }
        meter.calls += 1;
    }
    if arguments.len() > MAX_ARGUMENT_BYTES {
        return format!(
            "error: the arguments are {} bytes, over the {MAX_ARGUMENT_BYTES}-byte limit of a \
             call from a program; this call was not made",
            arguments.len()
        );
    }
    let arguments = match serde_json::from_str(arguments) {
        Ok(arguments) => arguments,
        Err(error) => return format!("error: the arguments are not JSON ({error})"),
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    let waited = Instant::now();
    let text = match requests.blocking_send(NestedRequest { tool, arguments, reply }) {
        Ok(()) => answer
            .blocking_recv()
            .unwrap_or_else(|_| "cancelled: keel stopped settling this program's calls".to_owned()),
        Err(_) => "cancelled: keel stopped settling this program's calls".to_owned(),
    };
    meter.borrow_mut().blocked += waited.elapsed();
    text
}

/// Why evaluation failed: a limit or stop the meter recorded, the memory limit, or the
/// program's own exception.
fn classify(ctx: &Ctx<'_>, error: rquickjs::Error, meter: &Rc<RefCell<Meter>>) -> CellEnd {
    if let Some(reason) = meter.borrow().reason.clone() {
        return reason;
    }
    match error {
        rquickjs::Error::Exception => {
            let thrown = ctx.catch();
            let text = describe(&thrown);
            if text.contains("out of memory") { CellEnd::MemoryLimit } else { CellEnd::Threw(text) }
        }
        rquickjs::Error::WouldBlock => CellEnd::NeverSettled,
        rquickjs::Error::Allocation => CellEnd::MemoryLimit,
        other => CellEnd::Threw(other.to_string()),
    }
}

/// A thrown value as text: `Name: message` and the stack for errors, else its string form.
fn describe(thrown: &Value<'_>) -> String {
    if let Some(object) = thrown.as_object() {
        let name = object.get::<_, String>("name").ok();
        let message = object.get::<_, String>("message").ok();
        if name.is_some() || message.is_some() {
            let mut text = match (name, message) {
                (Some(name), Some(message)) => format!("{name}: {message}"),
                (Some(name), None) => name,
                (None, Some(message)) => message,
                (None, None) => String::new(),
            };
            if let Ok(stack) = object.get::<_, String>("stack")
                && !stack.trim().is_empty()
            {
                text.push('\n');
                text.push_str(stack.trim_end());
            }
            return text;
        }
    }
    match thrown.get::<rquickjs::Coerced<String>>() {
        Ok(rquickjs::Coerced(text)) => format!("uncaught {text}"),
        Err(_) => format!("uncaught {}", thrown.type_name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(code: &str, limits: CodeLimits) -> CellReport {
        let (requests, mut incoming) = tokio::sync::mpsc::channel::<NestedRequest>(1);
        let answerer = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while let Some(request) = incoming.blocking_recv() {
                seen.push((request.tool.clone(), request.arguments.clone()));
                let _ = request.reply.send(format!("result of {}", request.tool));
            }
            seen
        });
        let report = run_cell(code, limits, requests, Arc::new(AtomicBool::new(false)));
        let seen = answerer.join().unwrap();
        assert_eq!(u32::try_from(seen.len()).unwrap(), report.calls);
        report
    }

    #[test]
    fn prints_and_awaits_tools() {
        let report = run(
            "const a = await tools.read_file({path: 'x'}); print('got', a, {n: 1});",
            CodeLimits::default(),
        );
        assert_eq!(report.end, CellEnd::Completed);
        assert_eq!(report.printed, "got result of read_file {\"n\":1}\n");
        assert_eq!(report.calls, 1);
    }

    #[test]
    fn a_syntax_error_is_an_error_end() {
        let report = run("let = ;", CodeLimits::default());
        assert!(matches!(&report.end, CellEnd::Threw(text) if text.contains("SyntaxError")));
        assert!(report.text(&CodeLimits::default()).starts_with("error: the program failed"));
    }

    #[test]
    fn an_infinite_loop_hits_the_cpu_limit() {
        let limits = CodeLimits { cpu: Duration::from_millis(100), ..CodeLimits::default() };
        let started = Instant::now();
        let report = run("while (true) {}", limits);
        assert_eq!(report.end, CellEnd::CpuLimit);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_huge_allocation_hits_the_memory_limit() {
        let limits = CodeLimits { memory_bytes: 8 * 1024 * 1024, ..CodeLimits::default() };
        let report = run("const a = []; while (true) a.push(new Array(100000).fill(1));", limits);
        assert_eq!(report.end, CellEnd::MemoryLimit, "{report:?}");
    }

    #[test]
    fn output_is_capped_and_counted() {
        let limits = CodeLimits { output_bytes: 100, ..CodeLimits::default() };
        let report = run("for (let i = 0; i < 1000; i++) print('0123456789');", limits);
        assert_eq!(report.end, CellEnd::Completed);
        assert!(report.printed.len() <= 100);
        assert_eq!(report.printed.len() as u64 + report.dropped_bytes, 11_000);
        assert!(report.text(&limits).contains("output capped at 100 bytes"));
    }

    /// A returned value and a thrown error's text are bounded like `print`.
    #[test]
    fn returned_values_and_errors_are_capped_too() {
        let limits = CodeLimits { output_bytes: 100, ..CodeLimits::default() };
        let returned = run("return 'r'.repeat(100000);", limits).text(&limits);
        assert!(returned.len() < 400 && returned.contains("capped at 100 bytes"), "{returned}");
        let thrown = run("throw new Error('y'.repeat(100000));", limits).text(&limits);
        assert!(thrown.len() < 400 && thrown.contains("capped at 100 bytes"), "{thrown}");
        assert_eq!(capped("ééé", 3), "é… [keel: capped at 3 bytes; 4 more bytes were dropped]");
    }

    #[test]
    fn no_ambient_io() {
        let report = run(
            "print(typeof require, typeof process, typeof fetch, typeof setTimeout, \
             typeof std, typeof os, typeof __keel_call, typeof __keel_print);",
            CodeLimits::default(),
        );
        assert_eq!(
            report.printed,
            "undefined undefined undefined undefined undefined undefined undefined undefined\n"
        );
    }
}
