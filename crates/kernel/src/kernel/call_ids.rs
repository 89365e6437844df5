//! Call ids unique in the session: a provider that repeats an id would make two calls share
//! one result.

use super::Ledger;
use crate::Result;

/// Gives each call of a response that repeats an id already taken a fresh one (`ID-2`,
/// `ID-3`, …): a provider that repeats an id (within a response or across turns) would
/// make two calls share one result, and results are paired and paged
/// (`read_tool_result`) by id.
///
/// An id is taken by an earlier call of the same response or by a call the session
/// answered: the store's indexed lookup ([`keel_contracts::Store::last_tool_result`]).
/// Every call of an earlier response has its result durable before the next model request
/// leaves (the request's append commits what the step staged; calls a dead run left open
/// are answered before the first request of the run that resumes it), so that covers
/// every earlier call of the session, and nothing of the run is kept in memory for it
/// (issue #13: the set of the run's ids grew by one a step).
///
/// # Errors
///
/// [`KernelError`](crate::KernelError) when the store cannot be read.
pub(super) async fn unique_call_ids(
    store: &dyn keel_contracts::Store,
    ledger: &Ledger,
    calls: &mut [keel_contracts::ToolCall],
) -> Result<()> {
    if calls.is_empty() {
        return Ok(());
    }
    let mut taken = std::collections::BTreeSet::new();
    for call in calls.iter_mut() {
        let mut candidate = call.call_id.clone();
        let mut n = 1u64;
        while is_taken(store, ledger, &taken, &candidate).await? {
            n += 1;
            candidate = keel_contracts::ToolCallId(format!("{}-{n}", call.call_id.as_str()));
        }
        call.call_id = candidate.clone();
        taken.insert(candidate);
    }
    Ok(())
}

/// Whether `id` is taken (see [`unique_call_ids`]).
async fn is_taken(
    store: &dyn keel_contracts::Store,
    ledger: &Ledger,
    earlier: &std::collections::BTreeSet<keel_contracts::ToolCallId>,
    id: &keel_contracts::ToolCallId,
) -> Result<bool> {
    if earlier.contains(id) {
        return Ok(true);
    }
    Ok(store.last_tool_result(ledger.session_id, id).await?.is_some())
}
