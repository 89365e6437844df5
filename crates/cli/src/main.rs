//! The `keel` command: runs agent turns headless, lists and inspects sessions.
//!
//! Exit status (DESIGN.md §9): `0` completed, `1` failed, `2` usage or configuration
//! error, `3` suspended, `4` denied, `130` cancelled.

/// `println!` that never panics: a closed stdout (`keel sessions | head -1`) is not an
/// error worth a backtrace, and the exit status must stay the run's.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod app;
mod args;
mod config_show;
mod eval;
mod exit;
mod habits;
mod mcp;
mod output;
mod schedule;
mod seal;
mod trace;
mod trust;
mod view;

// The composition root's modules, under the names the commands use.
use keel_host::{config, safe_read, terminal};

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("keel: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let status = runtime.block_on(app::main(cli));
    // Tools are aborted with their run; do not wait for stray blocking work on exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    ExitCode::from(status)
}
