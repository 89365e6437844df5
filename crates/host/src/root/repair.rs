//! Startup repair, and the inert kernel it (and sealing) runs on: no tools, no model, every
//! consent denied.

use std::sync::Arc;

use anyhow::Context;
use keel_contracts::{Store, SystemClock, UuidV7Ids};
use keel_kernel::{Kernel, KernelDeps, Observer};

use super::lease::{LocalProcesses, lease_holder};

/// Startup repair: runs left open by processes that died are closed now, by an
/// [`inert_kernel`] on `store` that reports to no observer: the closed runs belong to other
/// sessions, so their events never reach this run's printer, `--json` writer or ACP
/// client. The one note per closed run goes to stderr.
///
/// # Cancel safety
///
/// As [`Kernel::repair_interrupted`].
pub async fn repair(store: Arc<dyn Store>) {
    let kernel = match inert_kernel(store, Arc::new(keel_kernel::NoopObserver)) {
        Ok(kernel) => kernel,
        Err(error) => {
            eprintln!("keel: could not check for interrupted runs: {error:#}");
            return;
        }
    };
    match kernel.repair_interrupted().await {
        Ok(repaired) if !repaired.is_empty() => {
            for session in repaired {
                eprintln!(
                    "keel: closed the interrupted run of session {session} (its process stopped)"
                );
            }
        }
        Ok(_) => {}
        Err(error) => eprintln!("keel: could not check for interrupted runs: {error}"),
    }
}

/// A kernel that runs no agent code: no tools, a model that is never asked, every consent
/// denied. For what needs the kernel but no run: sealing, repair. Its lease holder is
/// this process's with ` (inert)`, so it leaves this process's own live runs alone.
///
/// # Errors
///
/// None in practice (an empty registry always assembles); the registry's error otherwise.
pub fn inert_kernel(store: Arc<dyn Store>, observer: Arc<dyn Observer>) -> anyhow::Result<Kernel> {
    let kernel = Kernel::new(KernelDeps {
        store,
        model: Arc::new(NoModel),
        tools: Vec::new(),
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        permissions: Arc::new(keel_kernel::StaticPermissions(
            keel_contracts::PermissionAnswer::Deny,
        )),
        observer,
        counter: Arc::new(keel_contracts::ApproxCounter),
    })
    .context("cannot assemble an empty tool registry")?;
    // A holder of its own: this process's runs hold `lease_holder()`, which this kernel
    // must never re-acquire as its own (it would close a live run as interrupted).
    Ok(kernel
        .with_lease_holder(format!("{} (inert)", lease_holder()))
        .with_holder_liveness(Arc::new(LocalProcesses)))
}

/// The model of an inert kernel: it is never asked anything.
#[derive(Debug)]
struct NoModel;

#[async_trait::async_trait]
impl keel_contracts::ModelClient for NoModel {
    fn info(&self) -> keel_contracts::ModelInfo {
        keel_contracts::ModelInfo {
            provider: "none".into(),
            model: "none".into(),
            context_window: None,
        }
    }

    async fn complete(
        &self,
        _request: &keel_contracts::ModelRequest,
        _on_delta: &(dyn Fn(keel_contracts::StreamDelta) + Send + Sync),
    ) -> Result<keel_contracts::ModelResponse, keel_contracts::ModelError> {
        Err(keel_contracts::ModelError::new(
            keel_contracts::ModelErrorKind::InvalidRequest,
            None,
            "this kernel runs no model".to_owned(),
        ))
    }
}
