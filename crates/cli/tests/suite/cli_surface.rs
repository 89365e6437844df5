//! The CLI contract of DESIGN.md §9: exit statuses, usage errors, resume, log, sessions,
//! stop, Ctrl-C, shadow mode and approval answers, end to end through the real binary.

mod harness;

mod cancel;
mod consent;
mod interrupted;
mod ledger;
mod usage;
