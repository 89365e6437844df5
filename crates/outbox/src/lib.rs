//! keel-outbox: mirrors ledger events to outside sinks (DESIGN.md §6).
//!
//! The ledger is the local write: every event is durable in the [`Store`] before anyone
//! mirrors it. A [`Mirror`] reads events back from the store and delivers them to each
//! configured [`Sink`] in the background, with redrive after failure. Enforcement
//! (budgets, admission, cancellation) never goes through it: it only reads the ledger.
//!
//! Entry points: [`SinkConfig`] (one `[[outbox]]` table of the user's config, validated by
//! [`Mirror::from_config`]), [`Mirror::start`] (any [`Sink`]s, e.g. a test's),
//! [`Mirror::notify`] (an event became durable: wake the background task),
//! [`Mirror::flush`] (what a kernel's outbox hook calls before a terminal event) and
//! [`Mirror::flush_known`] (what a process calls before it exits).
//!
//! Sinks: [`JsonlSink`] appends each event's JSON (exactly the [`RuntimeEvent`]
//! serialization, one event per line) to a file and fsyncs once per batch;
//! [`WebhookSink`] POSTs a JSON array of up to `max_batch` events and counts only a 2xx
//! answer as delivered; [`OtlpSink`] exports the OpenTelemetry GenAI spans and metrics
//! (semantic conventions [`SEMCONV_VERSION`]) each batch closes, over OTLP/HTTP protobuf,
//! with span ids derived from ledger identities so that a redelivered batch yields the
//! same spans.
//!
//! Invariants:
//! - **At least once, in seq order per session.** Each sink keeps a durable cursor per
//!   session (the last seq it delivered); delivery starts right after it, in seq order,
//!   and the cursor moves only after the sink acknowledged the batch. A failed batch is
//!   sent again whole, so a receiver may see an event twice (after a failure, or a crash
//!   between delivery and cursor write), never a gap. Every event carries `session_id`
//!   and `seq`: receivers dedupe on that pair, and keeping the first copy of each yields
//!   the session's events gap-free in seq order.
//! - **Never skipped.** An event that cannot be read or delivered stops its session's
//!   delivery on that sink until it goes through; the sink is retried with exponential
//!   backoff ([`RetryPolicy`]).
//! - **Bounded flush.** [`Mirror::flush`] returns once everything recorded for the session
//!   so far is delivered, or after [`MirrorConfig::flush_attempts`] failed attempts per
//!   sink (one attempt when a sink was already failing): a sink that is down delays a
//!   terminal event by a bounded time, and the kernel bounds the call again.
//! - **Redrive across processes.** Cursors live in `<cursor_dir>/<sink>.json` (in keel,
//!   `KEEL_HOME/outbox`), replaced atomically. On start the mirror catches up sessions
//!   that are not running and are behind: those with a cursor short of their last seq,
//!   and those without a cursor updated since the sink was set up. A session a sink
//!   delivers any of is mirrored whole, from seq 1.
//!
//! Cursor file (a durable format; fields are added, never renamed):
//!
//! ```json
//! {"version":1,"target":"jsonl:/var/log/keel.jsonl","since":"2026-01-01T00:00:00Z",
//!  "sessions":{"0198…":12}}
//! ```
//!
//! `target` names the sink's destination; when the configuration points the sink
//! elsewhere, the old cursors are dropped and `since` starts again.
//!
//! [`Store`]: keel_contracts::Store
//! [`RuntimeEvent`]: keel_contracts::RuntimeEvent
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod config;
mod cursor;
mod error;
mod mirror;
mod sink;

pub use config::{
    BuildContext, DEFAULT_MAX_BATCH, DEFAULT_WEBHOOK_TIMEOUT, MirrorConfig, RetryPolicy,
    SinkConfig, SinkKind, SinkName,
};
pub use error::{ConfigError, DeliveryError, OpenError};
pub use mirror::{Mirror, SinkLag};
pub use sink::{
    JsonlSink, OtlpEnv, OtlpHeaders, OtlpOptions, OtlpSink, SEMCONV_VERSION, Sink, WebhookSink,
};
