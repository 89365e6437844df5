//! One model call with its retries made ledger facts (issue 12, item 9).
//!
//! Provider clients retry retryable failures themselves and tell the caller of each retry
//! through `on_delta` ([`StreamDelta::Retrying`]), a synchronous callback that cannot append
//! to the ledger. So the callback only queues the notice, and the kernel polls the queue
//! ahead of the model future (a biased `select!`): each notice is appended as a
//! `model_retry` event while the client waits before its next attempt, that is before the
//! next attempt's deltas reach the observer, and always before the step's
//! `model_response` (notices still queued when the call ends are appended first).

use keel_contracts::{
    EventKind, ModelClient, ModelError, ModelRequest, ModelResponse, RequestPurpose, RetryNotice,
    RunId, StreamDelta, TurnId,
};

use crate::Cancellation;
use crate::KernelError;
use crate::ledger::Ledger;

/// Where a model call belongs: its turn and run, its step, and what it is for.
pub(crate) struct CallSite {
    pub(crate) ids: (Option<TurnId>, Option<RunId>),
    pub(crate) step: u32,
    pub(crate) purpose: RequestPurpose,
}

/// Sends `request` to `model`, forwarding live deltas to `forward` (all but retry notices,
/// which reach surfaces as `model_retry` events) and appending each retry to `ledger` as it
/// is reported.
///
/// Returns `None` when `cancel` fired first (the request is abandoned), else the model's
/// answer.
///
/// # Errors
///
/// A [`KernelError`] when a `model_retry` cannot be appended; the request is abandoned.
///
/// # Cancel safety
///
/// Dropping the future abandons the request; retries already appended stay recorded.
pub(crate) async fn call_model(
    model: &dyn ModelClient,
    ledger: &mut Ledger,
    site: &CallSite,
    request: &ModelRequest,
    forward: &(dyn Fn(StreamDelta) + Send + Sync),
    cancel: &Cancellation,
) -> Result<Option<Result<ModelResponse, ModelError>>, KernelError> {
    let (retry_tx, mut retry_rx) = tokio::sync::mpsc::unbounded_channel::<RetryNotice>();
    let on_delta = move |delta: StreamDelta| match delta {
        StreamDelta::Retrying(notice) => {
            // The receiver lives until the call ends; a failed send only means it ended.
            let _ = retry_tx.send(notice);
        }
        delta @ (StreamDelta::Text(_)
        | StreamDelta::Reasoning(_)
        | StreamDelta::ToolCallStarted { .. }) => forward(delta),
    };
    let answer = {
        let completion = model.complete(request, &on_delta);
        tokio::pin!(completion);
        loop {
            tokio::select! {
                biased;
                Some(notice) = retry_rx.recv() => record(ledger, site, notice).await?,
                response = &mut completion => break Some(response),
                () = cancel.cancelled() => break None,
            }
        }
    };
    // Notices sent in the very poll that finished the call.
    while let Ok(notice) = retry_rx.try_recv() {
        record(ledger, site, notice).await?;
    }
    Ok(answer)
}

async fn record(
    ledger: &mut Ledger,
    site: &CallSite,
    notice: RetryNotice,
) -> Result<(), KernelError> {
    ledger
        .append(
            site.ids.0,
            site.ids.1,
            EventKind::ModelRetry {
                step: site.step,
                attempt: notice.attempt,
                status: notice.status,
                error: notice.error,
                message: notice.message,
                wait_ms: u64::try_from(notice.wait.as_millis()).unwrap_or(u64::MAX),
                purpose: site.purpose,
            },
        )
        .await?;
    Ok(())
}
