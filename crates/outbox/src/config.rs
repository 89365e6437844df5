//! Configuration: one `[[outbox]]` table per sink ([`SinkConfig`]), and how a mirror
//! paces its work ([`MirrorConfig`]).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_contracts::{Clock, Store};
use serde::Deserialize;

use crate::error::ConfigError;
use crate::sink::{JsonlSink, OtlpEnv, OtlpHeaders, OtlpOptions, OtlpSink, Sink, WebhookSink};

/// Events per webhook request when `max_batch` is not set.
pub const DEFAULT_MAX_BATCH: usize = 100;

/// How long one webhook request may take when `timeout_ms` is not set. It matches the
/// kernel's bound on a flush, so one hung request does not outlast it.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// A sink's name: it names the sink's cursor file, so it is a plain file-name word.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SinkName(String);

impl SinkName {
    /// Validates `name`: 1 to 64 ASCII letters, digits, `-` or `_`, starting with a letter
    /// or digit.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidName`] otherwise.
    pub fn new(name: &str) -> Result<SinkName, ConfigError> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(ConfigError::InvalidName { name: name.to_owned() });
        }
        Ok(SinkName(name.to_owned()))
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SinkName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a sink is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// A JSON-lines file ([`JsonlSink`]).
    Jsonl,
    /// An HTTP webhook ([`WebhookSink`]).
    Webhook,
    /// An OpenTelemetry collector over OTLP/HTTP ([`OtlpSink`]).
    Otlp,
}

impl SinkKind {
    /// The spelling in config.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkKind::Jsonl => "jsonl",
            SinkKind::Webhook => "webhook",
            SinkKind::Otlp => "otlp",
        }
    }
}

/// One `[[outbox]]` table:
///
/// ```toml
/// [[outbox]]
/// name = "audit"
/// kind = "jsonl"
/// path = "/var/log/keel.jsonl"
///
/// [[outbox]]
/// name = "hook"
/// kind = "webhook"
/// url = "https://example.invalid/keel-events"
/// max_batch = 50        # optional, events per request (default 100)
/// timeout_ms = 5000     # optional, per request (default 5000)
///
/// [[outbox]]
/// name = "traces"
/// kind = "otlp"
/// endpoint = "http://127.0.0.1:4318"   # else OTEL_EXPORTER_OTLP_ENDPOINT
/// headers = { "x-api-key" = "…" }      # optional, over OTEL_EXPORTER_OTLP_HEADERS
/// capture_content = false              # optional: messages, tool arguments and results
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    /// Names the sink and its cursor file.
    pub name: String,
    /// `jsonl` or `webhook`.
    pub kind: SinkKind,
    /// The file (`jsonl`; absolute).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// The endpoint (`webhook`; http or https).
    #[serde(default)]
    pub url: Option<String>,
    /// Events per request (`webhook`).
    #[serde(default)]
    pub max_batch: Option<usize>,
    /// Per-request timeout in milliseconds (`webhook`, `otlp`).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The collector's base URL (`otlp`; http or https, no credentials in it). Absent:
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Request headers (`otlp`), over those of `OTEL_EXPORTER_OTLP_HEADERS`.
    #[serde(default)]
    pub headers: Option<OtlpHeaders>,
    /// Whether message text, tool arguments and tool results are exported (`otlp`; off
    /// unless `true`).
    #[serde(default)]
    pub capture_content: Option<bool>,
}

/// What building a sink needs besides its table.
#[derive(Debug, Clone)]
pub struct BuildContext {
    /// The ledger the mirror reads (an `otlp` sink reads back the start of a session).
    pub store: Arc<dyn Store>,
    /// The standard exporter variables an `otlp` sink falls back on.
    pub otlp_env: OtlpEnv,
}

impl SinkConfig {
    /// The validated name and the sink this table describes.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the sink and what is wrong: a bad name, a missing `path` or
    /// `url` (or `endpoint` for `otlp`, from the table or `OTEL_EXPORTER_OTLP_ENDPOINT`), a
    /// key of another kind, a relative path, a URL that is not http(s) or carries
    /// credentials, a zero `max_batch` or `timeout_ms`, an invalid header (named, never its
    /// value), or an HTTP client that cannot be built.
    pub fn build(&self, context: &BuildContext) -> Result<(SinkName, Arc<dyn Sink>), ConfigError> {
        let name = SinkName::new(&self.name)?;
        let kind = self.kind.as_str();
        let unexpected = |key| ConfigError::UnexpectedKey { sink: self.name.clone(), kind, key };
        let missing = |key| ConfigError::MissingKey { sink: self.name.clone(), kind, key };
        if self.kind != SinkKind::Otlp {
            for (key, set) in [
                ("endpoint", self.endpoint.is_some()),
                ("headers", self.headers.is_some()),
                ("capture_content", self.capture_content.is_some()),
            ] {
                if set {
                    return Err(unexpected(key));
                }
            }
        }
        let sink: Arc<dyn Sink> = match self.kind {
            SinkKind::Jsonl => {
                if self.url.is_some() {
                    return Err(unexpected("url"));
                }
                if self.max_batch.is_some() {
                    return Err(unexpected("max_batch"));
                }
                if self.timeout_ms.is_some() {
                    return Err(unexpected("timeout_ms"));
                }
                let path = self.path.clone().ok_or_else(|| missing("path"))?;
                if !path.is_absolute() {
                    return Err(ConfigError::RelativePath { sink: self.name.clone(), path });
                }
                Arc::new(JsonlSink::new(path))
            }
            SinkKind::Webhook => {
                if self.path.is_some() {
                    return Err(unexpected("path"));
                }
                let url = self.url.as_deref().ok_or_else(|| missing("url"))?;
                let url = reqwest::Url::parse(url).map_err(|error| ConfigError::InvalidUrl {
                    sink: self.name.clone(),
                    reason: error.to_string(),
                })?;
                if !matches!(url.scheme(), "http" | "https") {
                    return Err(ConfigError::InvalidUrl {
                        sink: self.name.clone(),
                        reason: format!("scheme '{}' is not http or https", url.scheme()),
                    });
                }
                let max_batch = self.max_batch.unwrap_or(DEFAULT_MAX_BATCH);
                if max_batch == 0 {
                    return Err(ConfigError::NotPositive {
                        sink: self.name.clone(),
                        key: "max_batch",
                    });
                }
                let timeout = match self.timeout_ms {
                    Some(0) => {
                        return Err(ConfigError::NotPositive {
                            sink: self.name.clone(),
                            key: "timeout_ms",
                        });
                    }
                    Some(ms) => Duration::from_millis(ms),
                    None => DEFAULT_WEBHOOK_TIMEOUT,
                };
                let sink = WebhookSink::new(url, max_batch, timeout).map_err(|error| {
                    ConfigError::HttpClient { sink: self.name.clone(), message: error.to_string() }
                })?;
                Arc::new(sink)
            }
            SinkKind::Otlp => {
                if self.path.is_some() {
                    return Err(unexpected("path"));
                }
                if self.url.is_some() {
                    return Err(unexpected("url"));
                }
                let endpoint = self
                    .endpoint
                    .as_deref()
                    .or(context.otlp_env.endpoint.as_deref())
                    .ok_or_else(|| missing("endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT)"))?;
                let endpoint = self.http_url(endpoint)?;
                if !endpoint.username().is_empty() || endpoint.password().is_some() {
                    return Err(ConfigError::InvalidUrl {
                        sink: self.name.clone(),
                        reason: "credentials in the endpoint are refused; send them in `headers` \
                                 or OTEL_EXPORTER_OTLP_HEADERS"
                            .into(),
                    });
                }
                let mut headers = match &context.otlp_env.headers {
                    Some(text) => {
                        OtlpHeaders::parse(text).map_err(|reason| ConfigError::InvalidHeaders {
                            sink: self.name.clone(),
                            reason: format!("OTEL_EXPORTER_OTLP_HEADERS: {reason}"),
                        })?
                    }
                    None => OtlpHeaders::default(),
                };
                if let Some(own) = &self.headers {
                    headers.0.extend(own.0.clone());
                }
                let options = OtlpOptions {
                    endpoint,
                    headers,
                    capture_content: self.capture_content.unwrap_or(false),
                    max_batch: self.positive_batch()?,
                    timeout: self.timeout()?,
                };
                let sink = OtlpSink::new(options, context.store.clone()).map_err(|reason| {
                    ConfigError::InvalidHeaders { sink: self.name.clone(), reason }
                })?;
                Arc::new(sink)
            }
        };
        Ok((name, sink))
    }
}

impl SinkConfig {
    fn http_url(&self, text: &str) -> Result<reqwest::Url, ConfigError> {
        let url = reqwest::Url::parse(text).map_err(|error| ConfigError::InvalidUrl {
            sink: self.name.clone(),
            reason: error.to_string(),
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ConfigError::InvalidUrl {
                sink: self.name.clone(),
                reason: format!("scheme '{}' is not http or https", url.scheme()),
            });
        }
        Ok(url)
    }

    fn positive_batch(&self) -> Result<usize, ConfigError> {
        match self.max_batch.unwrap_or(DEFAULT_MAX_BATCH) {
            0 => Err(ConfigError::NotPositive { sink: self.name.clone(), key: "max_batch" }),
            n => Ok(n),
        }
    }

    fn timeout(&self) -> Result<Duration, ConfigError> {
        match self.timeout_ms {
            Some(0) => Err(ConfigError::NotPositive { sink: self.name.clone(), key: "timeout_ms" }),
            Some(ms) => Ok(Duration::from_millis(ms)),
            None => Ok(DEFAULT_WEBHOOK_TIMEOUT),
        }
    }
}

/// Exponential backoff between delivery attempts of one sink: `first`, then doubling,
/// never more than `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl RetryPolicy {
    /// The wait after `failures` consecutive failures (1 or more).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        self.first.saturating_mul(1_u32 << doublings).min(self.max)
    }
}

/// How a [`Mirror`](crate::Mirror) paces its work and where it keeps cursors.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// The folder of cursor files (`KEEL_HOME/outbox`), created when missing.
    pub cursor_dir: PathBuf,
    /// Stamps `since` in a new cursor file; compared with the ledger's timestamps.
    pub clock: Arc<dyn Clock>,
    /// How often the background task looks for work without being woken.
    pub poll_interval: Duration,
    /// Backoff between attempts of a failing sink.
    pub retry: RetryPolicy,
    /// Attempts per sink within one flush (at least 1).
    pub flush_attempts: u32,
    /// The standard exporter variables `otlp` sinks fall back on (none unless set; keel
    /// passes [`OtlpEnv::from_process`]).
    pub otlp_env: OtlpEnv,
}

impl MirrorConfig {
    /// Cursors in `cursor_dir`, `since` from `clock`; polls every 2 s, retries after
    /// 250 ms doubling up to 30 s, and a flush tries each sink 3 times.
    pub fn new(cursor_dir: PathBuf, clock: Arc<dyn Clock>) -> MirrorConfig {
        MirrorConfig {
            cursor_dir,
            clock,
            poll_interval: Duration::from_secs(2),
            retry: RetryPolicy { first: Duration::from_millis(250), max: Duration::from_secs(30) },
            flush_attempts: 3,
            otlp_env: OtlpEnv::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_ceiling() {
        let retry = RetryPolicy { first: Duration::from_millis(250), max: Duration::from_secs(2) };
        let delays: Vec<u128> = (1..=6).map(|n| retry.delay(n).as_millis()).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 2000, 2000]);
        assert_eq!(retry.delay(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn names_are_file_name_words() {
        for good in ["audit", "a", "hook-2", "A_b", &"x".repeat(64)] {
            assert!(SinkName::new(good).is_ok(), "{good}");
        }
        for bad in ["", "-x", "_x", "a/b", "..", "a.json", "a b", &"x".repeat(65)] {
            assert!(SinkName::new(bad).is_err(), "{bad}");
        }
    }
}
