//! The OTLP/HTTP sink: each batch of ledger events becomes the OpenTelemetry GenAI spans and
//! metric points it closes ([`genai`]), POSTed as protobuf to `{endpoint}/v1/traces` and
//! `{endpoint}/v1/metrics`.
//!
//! A span needs facts from before the batch (its start, the run's model), so the sink keeps
//! each session's fold in memory after a delivered batch, and rebuilds it from the ledger
//! when it has none that ends right before the batch (a new process, a redelivery after a
//! failure, eviction). The fold moves only when both requests were accepted, so a batch
//! sent again yields the same spans with the same ids.

pub(crate) mod genai;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{RuntimeEvent, Seq, SessionId, Store};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Histogram, HistogramDataPoint, Metric, ResourceMetrics, ScopeMetrics,
    metric,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::error::DeliveryError;
use crate::sink::Sink;
use crate::sink::webhook::describe;
use genai::{Fold, MetricKind, Observation, Output, SEMCONV_VERSION, kv};

/// Sessions whose fold is kept between batches; past it the cache starts afresh (a fold is
/// rebuilt from the ledger when needed).
const CACHED_SESSIONS: usize = 256;

/// `gen_ai.client.token.usage` bucket boundaries (the conventions' advice).
const TOKEN_BOUNDS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// `gen_ai.client.operation.duration` bucket boundaries in seconds (the conventions' advice).
const DURATION_BOUNDS: [f64; 14] =
    [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];

/// HTTP headers sent with every request (`authorization`, `x-honeycomb-team`, …). Their
/// values are secrets: `Debug` shows the names only, and reqwest marks them sensitive.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct OtlpHeaders(pub BTreeMap<String, String>);

impl fmt::Debug for OtlpHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.keys().map(|name| (name, "<redacted>"))).finish()
    }
}

impl OtlpHeaders {
    /// Parses `OTEL_EXPORTER_OTLP_HEADERS`: `name=value` pairs separated by commas, values
    /// percent-decoded (the OpenTelemetry exporter format).
    ///
    /// # Errors
    ///
    /// The offending entry's position (1-based) when it has no `=`, an empty name, or a
    /// value that is not UTF-8 once decoded; the message never holds the value.
    pub fn parse(text: &str) -> Result<OtlpHeaders, String> {
        let mut headers = BTreeMap::new();
        for (index, entry) in text.split(',').enumerate() {
            if entry.trim().is_empty() {
                continue;
            }
            let Some((name, value)) = entry.split_once('=') else {
                return Err(format!("entry {} has no `=`", index + 1));
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("entry {} has an empty name", index + 1));
            }
            let value = percent_decode(value.trim())
                .ok_or_else(|| format!("entry {} ('{name}') does not decode", index + 1))?;
            headers.insert(name.to_owned(), value);
        }
        Ok(OtlpHeaders(headers))
    }
}

/// The standard exporter variables an `otlp` sink falls back on: they fill in what its
/// `[[outbox]]` table leaves out, never create a sink of their own.
#[derive(Clone, Default)]
pub struct OtlpEnv {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: the base URL (`/v1/traces` is appended).
    pub endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_HEADERS`, unparsed (a secret: never shown).
    pub headers: Option<String>,
}

impl fmt::Debug for OtlpEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpEnv")
            .field("endpoint", &self.endpoint)
            .field("headers", &self.headers.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl OtlpEnv {
    /// Reads the two variables from this process's environment (unset or not UTF-8:
    /// absent).
    pub fn from_process() -> OtlpEnv {
        let read = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
        OtlpEnv {
            endpoint: read("OTEL_EXPORTER_OTLP_ENDPOINT"),
            headers: read("OTEL_EXPORTER_OTLP_HEADERS"),
        }
    }
}

/// Sends the OpenTelemetry GenAI spans and metrics derived from each batch (see the module
/// docs) with `Content-Type: application/x-protobuf`. Only 2xx answers to both requests
/// count as delivered; redirects are not followed.
pub struct OtlpSink {
    endpoint: reqwest::Url,
    traces: reqwest::Url,
    metrics: reqwest::Url,
    headers: HeaderMap,
    capture_content: bool,
    max_batch: usize,
    client: reqwest::Client,
    store: Arc<dyn Store>,
    folds: tokio::sync::Mutex<HashMap<SessionId, Fold>>,
}

impl fmt::Debug for OtlpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("OtlpSink")
            .field("endpoint", &self.endpoint.as_str())
            .field("header_names", &names)
            .field("capture_content", &self.capture_content)
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

/// How to build an [`OtlpSink`].
#[derive(Debug, Clone)]
pub struct OtlpOptions {
    /// The base URL: http(s), without credentials; spans go to `v1/traces` under it.
    pub endpoint: reqwest::Url,
    /// Sent with every request.
    pub headers: OtlpHeaders,
    /// Whether messages, tool arguments and results are exported (off by default).
    pub capture_content: bool,
    /// Events per delivery (at least 1).
    pub max_batch: usize,
    /// Per request.
    pub timeout: Duration,
}

impl OtlpSink {
    /// A sink exporting what `store` records, as `options` say.
    ///
    /// # Errors
    ///
    /// A message (naming a header, never its value) when a header name or value is not
    /// valid HTTP, or the HTTP client cannot be built.
    pub fn new(options: OtlpOptions, store: Arc<dyn Store>) -> Result<OtlpSink, String> {
        let mut headers = HeaderMap::new();
        for (name, value) in &options.headers.0 {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header name '{name}' is not a valid HTTP header name"))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| format!("header '{name}' has a value that is not valid in HTTP"))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let mut base = options.endpoint.clone();
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let join = |path: &str| base.join(path).map_err(|error| error.to_string());
        let client = reqwest::Client::builder()
            .timeout(options.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(describe)?;
        Ok(OtlpSink {
            traces: join("v1/traces")?,
            metrics: join("v1/metrics")?,
            endpoint: options.endpoint,
            headers,
            capture_content: options.capture_content,
            max_batch: options.max_batch.max(1),
            client,
            store,
            folds: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The fold of `session_id` right before `first`: the cached one when it ends there,
    /// else rebuilt from the ledger.
    async fn fold_before(&self, session_id: SessionId, first: Seq) -> Result<Fold, DeliveryError> {
        if let Some(fold) = self.folds.lock().await.get(&session_id)
            && fold.last.0 + 1 == first.0
        {
            return Ok(fold.clone());
        }
        let mut fold = Fold::new(self.capture_content);
        if first.0 <= 1 {
            return Ok(fold);
        }
        let read_error = |message: String| DeliveryError::Read { session_id, message };
        let events = self
            .store
            .read(session_id, Seq(0))
            .await
            .map_err(|error| read_error(error.to_string()))?;
        let mut ignored = Output::default();
        for event in events.iter().take_while(|event| event.seq < first) {
            fold.apply(event, &mut ignored);
        }
        if fold.last.0 + 1 != first.0 {
            return Err(read_error(format!(
                "the ledger holds up to {} only, before event #{first}",
                fold.last
            )));
        }
        Ok(fold)
    }

    async fn post(&self, url: &reqwest::Url, body: Vec<u8>) -> Result<(), DeliveryError> {
        let response = self
            .client
            .post(url.clone())
            .headers(self.headers.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|error| DeliveryError::Transport { message: describe(error) })?;
        let status = response.status();
        if !status.is_success() {
            return Err(DeliveryError::Status { status: status.as_u16() });
        }
        // Accepted (a partial success names data the collector will never take: sending
        // it again would not help). Reading the rest only lets the connection be reused.
        let _ = response.bytes().await;
        Ok(())
    }
}

#[async_trait]
impl Sink for OtlpSink {
    fn target(&self) -> String {
        super::http_target("otlp", &self.endpoint)
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    async fn deliver(&self, events: &[RuntimeEvent]) -> Result<(), DeliveryError> {
        let Some(first) = events.first() else { return Ok(()) };
        let session_id = first.session_id;
        let mut fold = self.fold_before(session_id, first.seq).await?;
        let mut output = Output::default();
        for event in events {
            fold.apply(event, &mut output);
        }
        if !output.observations.is_empty() {
            let request = metrics_request(&output.observations);
            self.post(&self.metrics, request.encode_to_vec()).await?;
        }
        if !output.spans.is_empty() {
            let request = ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(resource()),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(scope()),
                        spans: output.spans,
                        schema_url: schema_url(),
                    }],
                    schema_url: schema_url(),
                }],
            };
            self.post(&self.traces, request.encode_to_vec()).await?;
        }
        let mut folds = self.folds.lock().await;
        if folds.len() >= CACHED_SESSIONS && !folds.contains_key(&session_id) {
            folds.clear();
        }
        folds.insert(session_id, fold);
        Ok(())
    }
}

fn schema_url() -> String {
    format!("https://opentelemetry.io/schemas/{SEMCONV_VERSION}")
}

fn resource() -> Resource {
    Resource {
        attributes: vec![
            kv("service.name", "keel"),
            kv("service.version", env!("CARGO_PKG_VERSION")),
        ],
        ..Default::default()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "keel-outbox".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

/// One delta histogram point per metric and series, over the batch's observations.
fn metrics_request(observations: &[Observation]) -> ExportMetricsServiceRequest {
    type Series = (MetricKind, Vec<(String, String)>);
    let mut series: BTreeMap<Series, Vec<&Observation>> = BTreeMap::new();
    for observation in observations {
        series
            .entry((observation.metric, observation.attributes.clone()))
            .or_default()
            .push(observation);
    }
    let mut metrics: BTreeMap<MetricKind, Vec<HistogramDataPoint>> = BTreeMap::new();
    for ((kind, attributes), points) in series {
        let bounds: &[f64] = match kind {
            MetricKind::TokenUsage => &TOKEN_BOUNDS,
            MetricKind::OperationDuration => &DURATION_BOUNDS,
        };
        let mut buckets = vec![0u64; bounds.len() + 1];
        for point in &points {
            let index =
                bounds.iter().position(|bound| point.value <= *bound).unwrap_or(bounds.len());
            buckets[index] += 1;
        }
        let values = points.iter().map(|point| point.value);
        let point = HistogramDataPoint {
            attributes: attributes
                .iter()
                .map(|(key, value)| kv(key, value.clone()))
                .collect::<Vec<KeyValue>>(),
            start_time_unix_nano: points.iter().map(|point| point.start_unix_ns).min().unwrap_or(0),
            time_unix_nano: points.iter().map(|point| point.end_unix_ns).max().unwrap_or(0),
            count: points.len() as u64,
            sum: Some(values.clone().sum()),
            bucket_counts: buckets,
            explicit_bounds: bounds.to_vec(),
            min: values.clone().reduce(f64::min),
            max: values.reduce(f64::max),
            ..Default::default()
        };
        metrics.entry(kind).or_default().push(point);
    }
    let metrics = metrics
        .into_iter()
        .map(|(kind, data_points)| {
            let (name, description, unit) = match kind {
                MetricKind::TokenUsage => (
                    "gen_ai.client.token.usage",
                    "Number of input and output tokens used.",
                    "{token}",
                ),
                MetricKind::OperationDuration => {
                    ("gen_ai.client.operation.duration", "GenAI operation duration.", "s")
                }
            };
            Metric {
                name: name.into(),
                description: description.into(),
                unit: unit.into(),
                data: Some(metric::Data::Histogram(Histogram {
                    data_points,
                    aggregation_temporality: AggregationTemporality::Delta as i32,
                })),
                ..Default::default()
            }
        })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics,
                schema_url: schema_url(),
            }],
            schema_url: schema_url(),
        }],
    }
}

/// Percent-decodes `text` (`%20` → space); `None` when an escape is malformed or the result
/// is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3)?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_variable_parses_and_never_shows_values() {
        let headers = OtlpHeaders::parse("api-key=s3cr%3Dt, x-team = blue ,").unwrap();
        assert_eq!(headers.0["api-key"], "s3cr=t");
        assert_eq!(headers.0["x-team"], "blue");
        let shown = format!("{headers:?}");
        assert!(!shown.contains("s3cr") && shown.contains("api-key"), "{shown}");
        for bad in ["novalue", "=x", "a=%zz", "a=%e2%82"] {
            let error = OtlpHeaders::parse(bad).unwrap_err();
            assert!(!error.contains("zz") && !error.contains("e2"), "{error}");
        }
        let env = OtlpEnv { endpoint: None, headers: Some("k=topsecret".into()) };
        assert!(!format!("{env:?}").contains("topsecret"));
    }

    #[test]
    fn histogram_points_count_each_bucket() {
        let observation = |value: f64| Observation {
            metric: MetricKind::TokenUsage,
            value,
            attributes: vec![("gen_ai.token.type".into(), "input".into())],
            start_unix_ns: 10,
            end_unix_ns: 20,
        };
        let request = metrics_request(&[observation(3.0), observation(4.0), observation(1e9)]);
        let metric = &request.resource_metrics[0].scope_metrics[0].metrics[0];
        assert_eq!(metric.name, "gen_ai.client.token.usage");
        let Some(metric::Data::Histogram(histogram)) = &metric.data else { panic!("{metric:?}") };
        let point = &histogram.data_points[0];
        assert_eq!(point.count, 3);
        assert_eq!(point.bucket_counts[1], 2, "3 and 4 are in (1, 4]");
        assert_eq!(point.bucket_counts[14], 1, "past the last bound");
        assert_eq!((point.min, point.max), (Some(3.0), Some(1e9)));
    }
}
