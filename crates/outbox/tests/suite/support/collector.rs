//! A loopback OTLP/HTTP collector ([`Collector`]) that decodes the protobuf the `otlp`
//! sink sends, the sink's config, and reading what it received: span attributes as text,
//! ids as hex, and [`deliver_all`], which mirrors a whole ledger to a fresh collector.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use keel_outbox::{Mirror, SinkConfig};
use keel_testkit::{FakeClock, MemStore};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use super::ledger::Ledger;
use super::{fast_config, store_arc};

/// A loopback OTLP/HTTP receiver: `/v1/traces` and `/v1/metrics`, protobuf bodies. While
/// `down`, it answers 503 and keeps nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Collector {
    pub(crate) down: Arc<AtomicBool>,
    pub(crate) traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    pub(crate) metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    /// Every accepted body, raw, and the headers of every request.
    pub(crate) raw: Arc<Mutex<Vec<Vec<u8>>>>,
    pub(crate) headers: Arc<Mutex<Vec<HeaderMap>>>,
    pub(crate) refused: Arc<Mutex<usize>>,
}

impl Collector {
    pub(crate) async fn start() -> (Collector, SocketAddr) {
        let collector = Collector::default();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive_traces))
            .route("/v1/metrics", axum::routing::post(receive_metrics))
            .with_state(collector.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (collector, address)
    }

    /// Every accepted span, in arrival order.
    pub(crate) fn spans(&self) -> Vec<Span> {
        self.traces
            .lock()
            .unwrap()
            .iter()
            .flat_map(|request| &request.resource_spans)
            .flat_map(|resource| &resource.scope_spans)
            .flat_map(|scope| scope.spans.clone())
            .collect()
    }

    pub(crate) fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Keeps `body` as an `R` in `into` (and raw), unless the collector is down (503) or the
    /// body is not an `R` (400); the headers are kept either way.
    fn accept<R: Message + Default>(
        &self,
        headers: HeaderMap,
        body: Bytes,
        into: &Mutex<Vec<R>>,
    ) -> StatusCode {
        self.headers.lock().unwrap().push(headers);
        if self.down.load(Ordering::SeqCst) {
            *self.refused.lock().unwrap() += 1;
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        let Ok(request) = R::decode(body.clone()) else {
            return StatusCode::BAD_REQUEST;
        };
        self.raw.lock().unwrap().push(body.to_vec());
        into.lock().unwrap().push(request);
        StatusCode::OK
    }
}

async fn receive_traces(
    State(collector): State<Collector>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    collector.accept(headers, body, &collector.traces)
}

async fn receive_metrics(
    State(collector): State<Collector>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    collector.accept(headers, body, &collector.metrics)
}

pub(crate) fn otlp_sink(address: SocketAddr, max_batch: usize, extra: &str) -> SinkConfig {
    toml::from_str(&format!(
        "name = \"traces\"\nkind = \"otlp\"\nendpoint = \"http://{address}\"\n\
         max_batch = {max_batch}\ntimeout_ms = 5000\n{extra}"
    ))
    .unwrap()
}

pub(crate) fn value_text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|value| value.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::ArrayValue(array)) => {
            let items: Vec<String> =
                array.values.iter().map(|item| value_text(&Some(item.clone()))).collect();
            format!("[{}]", items.join(","))
        }
        other => format!("{other:?}"),
    }
}

pub(crate) fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter().map(|kv| (kv.key.clone(), value_text(&kv.value))).collect()
}

pub(crate) fn expected(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

pub(crate) fn names(spans: &[Span]) -> Vec<String> {
    spans.iter().map(|span| span.name.clone()).collect()
}

/// Delivers `ledger` whole through a fresh mirror and sink; returns the collector.
pub(crate) async fn deliver_all(ledger: &Ledger, max_batch: usize, extra: &str) -> Collector {
    let (collector, address) = Collector::start().await;
    let store = MemStore::new();
    ledger.store(&store, 1..=ledger.seq).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(FakeClock::new());
    let mirror = Mirror::from_config(
        store_arc(&store),
        &[otlp_sink(address, max_batch, extra)],
        fast_config(&dir.path().join("outbox"), clock),
    )
    .unwrap();
    let lags = mirror.flush(ledger.session_id).await;
    assert!(lags.is_empty(), "{lags:?}");
    collector
}
