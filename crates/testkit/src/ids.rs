//! [`SeqIds`]: deterministic, readable ids for tests.

use std::sync::atomic::{AtomicU64, Ordering};

use keel_contracts::IdGen;
use uuid::Uuid;

/// Hands out `00000000-0000-7000-8000-000000000001`, `…-000000000002`, … in order.
///
/// The counter is printed in decimal into the last group, so the tenth id ends in
/// `000000000010`; every id still parses as a version-7, RFC 4122 variant UUID, so code
/// that checks the version accepts them.
#[derive(Debug)]
pub struct SeqIds {
    next: AtomicU64,
}

/// Ids past this count would not fit the 12-digit group.
const LIMIT: u64 = 1_000_000_000_000;

impl SeqIds {
    /// Ids counting up from 1.
    pub fn new() -> SeqIds {
        SeqIds::starting_at(1)
    }

    /// Ids counting up from `first` (handy for a second, disjoint generator).
    pub fn starting_at(first: u64) -> SeqIds {
        SeqIds { next: AtomicU64::new(first) }
    }

    /// The `n`th id: `00000000-0000-7000-8000-{n:012}`.
    ///
    /// # Panics
    ///
    /// When `n` has more than 12 decimal digits.
    pub fn nth(n: u64) -> Uuid {
        assert!(n < LIMIT, "SeqIds only spell ids below 10^12, got {n}");
        // Each decimal digit becomes one hex nibble, so the hex spelling reads as `n`.
        let mut digits = n;
        let mut nibbles: u128 = 0;
        let mut shift = 0;
        while digits > 0 {
            nibbles |= u128::from(digits % 10) << shift;
            digits /= 10;
            shift += 4;
        }
        Uuid::from_u128(0x0000_0000_0000_7000_8000_0000_0000_0000 | nibbles)
    }
}

impl Default for SeqIds {
    fn default() -> Self {
        SeqIds::new()
    }
}

impl IdGen for SeqIds {
    fn new_uuid(&self) -> Uuid {
        SeqIds::nth(self.next.fetch_add(1, Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_up_in_decimal_inside_a_v7_uuid() {
        let ids = SeqIds::new();
        assert_eq!(ids.new_uuid().to_string(), "00000000-0000-7000-8000-000000000001");
        assert_eq!(ids.session_id().to_string(), "00000000-0000-7000-8000-000000000002");
        let tenth = SeqIds::nth(10);
        assert_eq!(tenth.to_string(), "00000000-0000-7000-8000-000000000010");
        assert_eq!(tenth.get_version_num(), 7);
        assert_eq!(tenth.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(
            SeqIds::nth(999_999_999_999).to_string(),
            "00000000-0000-7000-8000-999999999999"
        );
    }
}
