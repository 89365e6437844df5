//! Exit statuses (DESIGN.md §9): what `keel` returns, one constant per ending, so every
//! command maps an ending the same way.

/// The run completed (and every other command that succeeded).
pub(crate) const COMPLETED: u8 = 0;
/// The run failed, or keel could not do what was asked.
pub(crate) const FAILED: u8 = 1;
/// A usage or configuration error.
pub(crate) const USAGE: u8 = 2;
/// The run was suspended (a budget, a wait); `keel resume` continues it.
pub(crate) const SUSPENDED: u8 = 3;
/// The run was denied.
pub(crate) const DENIED: u8 = 4;
/// The run was cancelled (Ctrl-C, `keel stop`).
pub(crate) const CANCELLED: u8 = 130;
