//! `keel trust [DIR]`: trusts a workspace's `.keel/config.toml` as it is now (the records
//! and what they mean live in `keel_host::trust`).

use std::path::Path;

use keel_host::error::usage;
use keel_host::root::canonical_workspace;
use keel_host::safe_read::{self, Outcome};
pub(crate) use keel_host::trust::trust_command;
use keel_host::trust::{record, sha256_hex};

use crate::config;
use crate::exit;

/// `keel trust [DIR]`: trusts DIR's `.keel/config.toml` as it is now.
pub(crate) fn command(dir: Option<&Path>) -> anyhow::Result<u8> {
    let workspace = canonical_workspace(dir)?;
    let home = config::keel_home()?;
    let file = config::read_workspace_file(&workspace);
    let bytes = match file.outcome {
        Outcome::Bytes(bytes) => bytes,
        Outcome::Missing => {
            return Err(usage(format!("nothing to trust: {} does not exist", file.path.display())));
        }
        Outcome::Skipped(reason) => {
            return Err(usage(format!("cannot trust {}: {reason}", file.path.display())));
        }
    };
    // Only a file keel can use is trusted: a parse error now would be one at every run.
    let parsed = config::parse(&bytes, &file.path).map_err(|e| usage(format!("{e:#}")))?;
    let sha256 = sha256_hex(&bytes);
    record(&home, &workspace, &sha256)?;
    let shown = safe_read::visible(&file.path.display().to_string(), false);
    eprintln!("keel: trusted {shown} (sha256 {sha256})");
    let gated = config::gated_keys(&parsed);
    if !gated.is_empty() {
        eprintln!("keel: it may now set: {}", safe_read::visible(&gated.join(", "), false));
    }
    eprintln!("keel: editing the file makes it untrusted again");
    Ok(exit::COMPLETED)
}
