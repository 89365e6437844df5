//! keel-kernel's integration suite: every test drives the kernel through its public API
//! with a scripted model and renders the ledger as text.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
