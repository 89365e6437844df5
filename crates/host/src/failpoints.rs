//! `KEEL_FAILPOINT`: a testing aid that stops the process at a named failpoint, so a crash
//! harness can `kill -9` it exactly there (DESIGN.md §6, `keel_kernel::Failpoint`).
//!
//! Unset (the normal case), the kernel keeps its `NoFailpoints`. Set to `NAME` or
//! `NAME:N` (`after_prepare`, `mid_tool:3`, …; `N` counts hits from 1 and defaults to 1),
//! the `N`th time the loop reaches `NAME` the process prints one line
//! `keel-failpoint-reached NAME` to stderr, flushes it, and then waits forever: the run
//! never finishes, and only a kill ends the process. Earlier hits pass through.
//!
//! Every point but `mid_tool` is awaited inline by the loop, which therefore stops right
//! there. `mid_tool` is reached in a task beside the tool, so the tool goes on; but once
//! the failpoint was reached, every later hit of any failpoint waits too, so the loop
//! stops at its next failpoint (normally that tool's `before_result`: the tool may finish,
//! its result is not recorded).
//!
//! The variable is read once per process, where the kernel is assembled. An unknown name
//! or a bad count is a usage error (exit 2), so a typo never runs a harness case unnoticed.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use keel_kernel::{Failpoint, Failpoints, Kernel};

use crate::error::usage;

/// The environment variable that names the failpoint.
const VARIABLE: &str = "KEEL_FAILPOINT";
/// The first word of the line printed when the failpoint is reached.
const MARKER: &str = "keel-failpoint-reached";

/// `kernel`, stopping at the failpoint `KEEL_FAILPOINT` names, if any.
///
/// # Errors
///
/// A usage error when the variable is set but is not `NAME` or `NAME:N` with `N >= 1`.
pub fn install(kernel: Kernel) -> anyhow::Result<Kernel> {
    let text = match std::env::var(VARIABLE) {
        Ok(text) if !text.trim().is_empty() => text,
        Ok(_) | Err(std::env::VarError::NotPresent) => return Ok(kernel),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(usage(format!("{VARIABLE} is not valid UTF-8")));
        }
    };
    if HOST_POINTS.contains(&text.trim()) {
        return Ok(kernel);
    }
    let stop =
        StopAt::parse(text.trim()).map_err(|reason| usage(format!("{VARIABLE}: {reason}")))?;
    Ok(kernel.with_failpoints(Arc::new(stop)))
}

/// Failpoints of the host itself, outside the kernel's loop: `wake_claimed` (a wake is
/// durable in the store, its run not yet resumed).
pub const HOST_POINTS: &[&str] = &["wake_claimed"];

/// Stops here (prints the marker, then waits forever) when `KEEL_FAILPOINT` names the host
/// point `name`; returns at once otherwise.
///
/// # Cancel safety
///
/// Waiting forever is the point; dropping it is harmless.
pub async fn host_point(name: &str) {
    let named = std::env::var(VARIABLE).is_ok_and(|text| text.trim() == name);
    if !named {
        return;
    }
    {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "{MARKER} {name}");
        let _ = stderr.flush();
    }
    std::future::pending::<()>().await;
}

/// Waits forever at the `nth` hit of `point`, and at every hit after that.
#[derive(Debug)]
struct StopAt {
    point: Failpoint,
    nth: u64,
    hits: AtomicU64,
    reached: AtomicBool,
}

impl StopAt {
    fn parse(text: &str) -> Result<StopAt, String> {
        let (name, nth) = match text.split_once(':') {
            Some((name, count)) => {
                let nth = count
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|nth| *nth >= 1)
                    .ok_or_else(|| format!("'{count}' is not a hit count (1, 2, …)"))?;
                (name.trim(), nth)
            }
            None => (text, 1),
        };
        let point = Failpoint::from_name(name).ok_or_else(|| {
            let known: Vec<&str> = Failpoint::ALL.iter().map(|point| point.name()).collect();
            format!("unknown failpoint '{name}' (known: {})", known.join(", "))
        })?;
        Ok(StopAt { point, nth, hits: AtomicU64::new(0), reached: AtomicBool::new(false) })
    }
}

#[async_trait]
impl Failpoints for StopAt {
    async fn hit(&self, point: Failpoint) {
        if self.reached.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if point != self.point || self.hits.fetch_add(1, Ordering::SeqCst) + 1 != self.nth {
            return;
        }
        self.reached.store(true, Ordering::SeqCst);
        {
            let mut stderr = std::io::stderr().lock();
            let _ = writeln!(stderr, "{MARKER} {}", point.name());
            let _ = stderr.flush();
        }
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn names_and_hit_counts_parse() {
        let stop = StopAt::parse("after_prepare").unwrap();
        assert_eq!((stop.point, stop.nth), (Failpoint::AfterPrepare, 1));
        let stop = StopAt::parse("mid_tool:3").unwrap();
        assert_eq!((stop.point, stop.nth), (Failpoint::MidTool, 3));
        for bad in ["after_prepar", "after_prepare:0", "after_prepare:x", "after_prepare:"] {
            assert!(StopAt::parse(bad).is_err(), "{bad}");
        }
        let error = StopAt::parse("nowhere").err().unwrap();
        assert!(error.contains("before_prepare") && error.contains("after_terminal"), "{error}");
    }

    #[tokio::test]
    async fn only_the_nth_hit_of_the_named_point_stops() {
        let stop = StopAt::parse("before_result:2").unwrap();
        let quick = Duration::from_millis(50);
        stop.hit(Failpoint::AfterResult).await;
        stop.hit(Failpoint::BeforeResult).await;
        assert!(tokio::time::timeout(quick, stop.hit(Failpoint::BeforeResult)).await.is_err());
    }

    #[tokio::test]
    async fn once_reached_every_later_hit_waits_so_a_concurrent_point_stops_the_loop() {
        let stop = StopAt::parse("mid_tool").unwrap();
        let quick = Duration::from_millis(50);
        stop.hit(Failpoint::AfterPrepare).await;
        assert!(tokio::time::timeout(quick, stop.hit(Failpoint::MidTool)).await.is_err());
        // The loop, still running beside the waiting mid_tool task, stops at its next point.
        assert!(tokio::time::timeout(quick, stop.hit(Failpoint::BeforeResult)).await.is_err());
    }
}
