//! keel-kernel's integration suite: every test drives the kernel through its public API
//! with a scripted model and renders the ledger as text.

mod suite;
