//! Bounded retries for model requests: exponential backoff with jitter, honouring the
//! server's `Retry-After` up to a cap (DESIGN.md §3).
//!
//! Only failures that [`ModelError::is_retryable`] says may succeed again are retried, and
//! a request is always retried whole: a stream that failed part-way is sent again from the
//! start and its partial content is discarded. Waiting uses `tokio::time`, so tests drive
//! it with paused time.

use std::future::Future;
use std::time::Duration;

use keel_contracts::{ModelError, RetryNotice, StreamDelta};

/// How a client retries a failed model request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; `0` sends each request once.
    pub max_retries: u32,
    /// The backoff before the first retry; it doubles for each further retry.
    pub initial_backoff: Duration,
    /// The longest backoff between two attempts when the server gave no `Retry-After`.
    pub max_backoff: Duration,
    /// The longest wait a server's `Retry-After` may impose; longer values are cut to this.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    /// Three retries, backing off from 500 ms up to 30 s, `Retry-After` capped at 60 s.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry_idx` (0 for the first retry).
    ///
    /// A server's `Retry-After` wins, capped at [`RetryPolicy::max_retry_after`]. Otherwise
    /// the backoff is `initial_backoff * 2^retry_idx`, capped at `max_backoff`, of which a
    /// random half is taken away ("equal jitter"), so that clients that failed together do
    /// not retry together.
    pub(crate) fn delay(
        &self,
        retry_idx: u32,
        retry_after: Option<Duration>,
        jitter: &mut Jitter,
    ) -> Duration {
        if let Some(retry_after) = retry_after {
            return retry_after.min(self.max_retry_after);
        }
        let factor = 2u32.saturating_pow(retry_idx);
        let backoff = self.initial_backoff.saturating_mul(factor).min(self.max_backoff);
        let half = backoff / 2;
        half + jitter.up_to(backoff - half)
    }
}

/// A failed attempt: the error, plus the server's requested delay when it sent one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    pub(crate) error: ModelError,
    pub(crate) retry_after: Option<Duration>,
}

impl From<ModelError> for Failure {
    fn from(error: ModelError) -> Self {
        Failure { error, retry_after: None }
    }
}

/// A small xorshift64* generator for backoff jitter; not for anything secret.
#[derive(Debug, Clone)]
pub(crate) struct Jitter {
    state: u64,
}

impl Jitter {
    /// A generator from a seed (a zero seed is replaced, since xorshift never leaves zero).
    pub(crate) fn new(seed: u64) -> Self {
        Jitter { state: if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed } }
    }

    /// A generator seeded from the random bits of a fresh UUIDv7.
    #[cfg_attr(not(any(feature = "openai", feature = "anthropic")), allow(dead_code))]
    pub(crate) fn from_entropy() -> Self {
        let bits = uuid::Uuid::now_v7().as_u128();
        // The low 62 bits of a v7 UUID are random; fold in the rest for good measure.
        let low = u64::try_from(bits & u128::from(u64::MAX)).unwrap_or(0);
        let high = u64::try_from(bits >> 64).unwrap_or(0);
        Jitter::new(low ^ high.rotate_left(17))
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A duration drawn uniformly from `0..=max` (at nanosecond resolution).
    fn up_to(&mut self, max: Duration) -> Duration {
        let max_nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        let nanos = match max_nanos.checked_add(1) {
            Some(range) => self.next_u64() % range,
            None => self.next_u64(),
        };
        Duration::from_nanos(nanos)
    }
}

/// Runs `attempt` until it succeeds, fails with an error that is not retryable, or has been
/// retried `policy.max_retries` times; sleeps between attempts as [`RetryPolicy::delay`]
/// says. `attempt` receives the number of retries done so far. Before each wait, `on_delta`
/// hears of the retry as a [`StreamDelta::Retrying`] (attempt number, status, error kind and
/// the wait chosen), so the caller can record it and discard what the failed attempt
/// streamed.
///
/// # Errors
///
/// The last attempt's [`ModelError`].
///
/// # Cancel safety
///
/// Dropping the future drops the running attempt or the pending sleep; nothing is recorded.
#[cfg_attr(not(any(feature = "openai", feature = "anthropic")), allow(dead_code))]
pub(crate) async fn with_retries<T, F, Fut>(
    policy: &RetryPolicy,
    jitter: &mut Jitter,
    on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    mut attempt: F,
) -> Result<T, ModelError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut n_retries = 0u32;
    loop {
        match attempt(n_retries).await {
            Ok(value) => return Ok(value),
            Err(failure) => {
                if !failure.error.is_retryable() || n_retries >= policy.max_retries {
                    return Err(failure.error);
                }
                let delay = policy.delay(n_retries, failure.retry_after, jitter);
                tracing::warn!(
                    kind = ?failure.error.kind,
                    status = ?failure.error.status,
                    retry = n_retries + 1,
                    max_retries = policy.max_retries,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "model request failed, retrying"
                );
                on_delta(StreamDelta::Retrying(RetryNotice {
                    attempt: n_retries + 2,
                    status: failure.error.status,
                    error: failure.error.kind.as_str().to_owned(),
                    message: failure.error.message.clone(),
                    wait: delay,
                }));
                tokio::time::sleep(delay).await;
                n_retries += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use keel_contracts::ModelErrorKind;
    use tokio::time::Instant;

    use super::*;

    fn policy(max_retries: u32) -> RetryPolicy {
        RetryPolicy {
            max_retries,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(20),
        }
    }

    fn ignore(_delta: StreamDelta) {}

    fn failure(kind: ModelErrorKind, retry_after: Option<Duration>) -> Failure {
        Failure { error: ModelError::new(kind, None, "x"), retry_after }
    }

    #[test]
    fn backoff_doubles_with_equal_jitter_and_is_capped() {
        let policy = policy(10);
        let mut jitter = Jitter::new(7);
        for (retry_idx, full) in [(0, 1), (1, 2), (2, 4), (3, 8), (4, 8), (30, 8), (200, 8)] {
            let full = Duration::from_secs(full);
            for _ in 0..100 {
                let delay = policy.delay(retry_idx, None, &mut jitter);
                assert!(delay >= full / 2 && delay <= full, "retry {retry_idx}: {delay:?}");
            }
        }
    }

    #[test]
    fn jitter_varies() {
        let policy = policy(3);
        let mut jitter = Jitter::new(42);
        let delays: Vec<_> = (0..20).map(|_| policy.delay(3, None, &mut jitter)).collect();
        assert!(delays.iter().any(|delay| *delay != delays[0]));
    }

    #[test]
    fn retry_after_wins_and_is_capped() {
        let policy = policy(3);
        let mut jitter = Jitter::new(1);
        assert_eq!(
            policy.delay(0, Some(Duration::from_secs(3)), &mut jitter),
            Duration::from_secs(3)
        );
        assert_eq!(
            policy.delay(0, Some(Duration::from_secs(3600)), &mut jitter),
            Duration::from_secs(20)
        );
    }

    #[test]
    fn zero_seed_and_zero_backoff_do_not_misbehave() {
        let mut jitter = Jitter::new(0);
        assert_ne!(jitter.next_u64(), 0);
        let policy = RetryPolicy { initial_backoff: Duration::ZERO, ..policy(3) };
        assert_eq!(policy.delay(5, None, &mut jitter), Duration::ZERO);
        assert!(jitter.up_to(Duration::MAX) <= Duration::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_retryable_failures_then_succeeds() {
        let calls = Cell::new(0u32);
        let start = Instant::now();
        let result = with_retries(&policy(3), &mut Jitter::new(3), &ignore, |n_retries| {
            calls.set(calls.get() + 1);
            async move {
                if n_retries < 2 {
                    Err(failure(ModelErrorKind::Overloaded, None))
                } else {
                    Ok(n_retries)
                }
            }
        })
        .await;
        assert_eq!(result, Ok(2));
        assert_eq!(calls.get(), 3);
        // 1 s then 2 s of backoff, each at least halved by jitter.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(1500) && waited <= Duration::from_secs(3),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn honours_retry_after() {
        let start = Instant::now();
        let calls = Cell::new(0u32);
        let notices = std::sync::Mutex::new(Vec::new());
        let on_delta = |delta: StreamDelta| notices.lock().unwrap().push(delta);
        let result = with_retries(&policy(3), &mut Jitter::new(3), &on_delta, |n_retries| {
            calls.set(calls.get() + 1);
            async move {
                if n_retries == 0 {
                    let retry_after = Some(Duration::from_secs(7));
                    Err(failure(ModelErrorKind::RateLimited { retry_after }, retry_after))
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert_eq!(result, Ok(()));
        assert_eq!(calls.get(), 2);
        assert_eq!(start.elapsed(), Duration::from_secs(7));
        assert_eq!(
            notices.into_inner().unwrap(),
            vec![StreamDelta::Retrying(RetryNotice {
                attempt: 2,
                status: None,
                error: "rate_limited".into(),
                message: "x".into(),
                wait: Duration::from_secs(7),
            })]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stops_after_max_retries_with_the_last_error() {
        let calls = Cell::new(0u32);
        let result: Result<(), _> = with_retries(&policy(2), &mut Jitter::new(3), &ignore, |_| {
            calls.set(calls.get() + 1);
            async { Err(failure(ModelErrorKind::Server, None)) }
        })
        .await;
        assert_eq!(result.map_err(|error| error.kind), Err(ModelErrorKind::Server));
        assert_eq!(calls.get(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn does_not_retry_what_cannot_succeed() {
        for kind in [
            ModelErrorKind::Auth,
            ModelErrorKind::QuotaExhausted,
            ModelErrorKind::ContextTooLong,
            ModelErrorKind::InvalidRequest,
        ] {
            let calls = Cell::new(0u32);
            let start = Instant::now();
            let result: Result<(), _> =
                with_retries(&policy(3), &mut Jitter::new(3), &ignore, |_| {
                    calls.set(calls.get() + 1);
                    let kind = kind.clone();
                    async move { Err(failure(kind, None)) }
                })
                .await;
            assert_eq!(result.map_err(|error| error.kind), Err(kind));
            assert_eq!(calls.get(), 1);
            assert_eq!(start.elapsed(), Duration::ZERO);
        }
    }
}
