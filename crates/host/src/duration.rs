//! Durations as people write them (`500ms`, `90s`, `10m`, `2h`) and as keel shows them:
//! one reading for `--max-time`, `max_time`, `--catch-up`, `--every` and timeouts, with one
//! ceiling ([`MAX_DURATION`]).

use std::time::Duration;

use crate::error::usage;

/// The longest duration keel accepts anywhere a person or a file gives one (`--max-time`,
/// `max_time`, `--catch-up`, `--every`, timeouts): 100 years (876000h). Every deadline is
/// then representable as an `Instant`, a `SystemTime` and a chrono time, so adding one to
/// now never overflows; longer values are refused where they are parsed.
pub const MAX_DURATION: Duration = Duration::from_secs(876_000 * 3600);

/// A `--max-time` / `max_time` value, as [`parse_duration`] reads it; `field` names where
/// it came from (`--max-time`, `"max_time"`).
///
/// # Errors
///
/// A [`usage`] error naming the value, its field and the accepted range.
pub fn parse_max_time(field: &str, text: &str) -> anyhow::Result<Duration> {
    parse_duration(text).ok_or_else(|| {
        usage(format!(
            "invalid duration '{text}' ({field}): give a positive time with its unit, such as \
             500ms, 90s, 10m or 2h, at most 876000h (100 years)"
        ))
    })
}

/// `500ms`, `90s`, `10m`, `2h`: a positive number and its unit (a bare number is refused,
/// so `--max-time 10` cannot mean ten seconds to one reader and ten minutes to another),
/// at most [`MAX_DURATION`]; `None` for anything else.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return None,
    };
    // `try_`: a time too long for a `Duration` is refused like any other bad one, never a
    // panic.
    (seconds.is_finite() && seconds > 0.0)
        .then(|| Duration::try_from_secs_f64(seconds).ok())
        .flatten()
        .filter(|duration| *duration <= MAX_DURATION)
}

/// `90s`, `10m`, `1500ms`: a duration as its most natural unit.
pub fn human_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}
