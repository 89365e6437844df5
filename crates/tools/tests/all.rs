//! keel-tools integration tests: one binary, behaviours in `suite/`.
// Test helpers outside #[test] functions unwrap too: a failed setup is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite {
    mod b07_symlinks;
    mod b10_background;
    mod b11_stdin;
    mod bash;
    mod deny_rules;
    mod edit_file;
    mod exact_bytes;
    mod exact_edits;
    mod glob;
    mod grep;
    mod list_dir;
    mod managed_escape;
    mod managed_work;
    mod read_file;
    mod redteam_protected;
    mod specs;
    mod support;
    mod write_file;
}
