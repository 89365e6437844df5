//! What the settlement lends keel's own intrinsics ([`Settlement`]): the run's services,
//! and the state of the run their hooks change.

use keel_contracts::{
    Budget, EventKind, PermissionAnswer, PermissionRules, RunId, ToolCall, ToolOutput, TurnId,
    UsageTotals,
};

use super::{Call, CallState};
use crate::intrinsic::{Children, Settlement};
use crate::ledger::Ledger;
use crate::{Cancellation, Result};

#[async_trait::async_trait]
impl Settlement for CallState<'_> {
    fn run_config(&self) -> &crate::RunConfig {
        &self.run
    }

    fn ids(&self) -> &dyn keel_contracts::IdGen {
        self.deps.ids.as_ref()
    }

    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.deps.clock.now()
    }

    fn workspace(&self) -> &std::path::Path {
        &self.workspace
    }

    fn rules(&self) -> &PermissionRules {
        &self.rules
    }

    fn boundary(&self) -> (&keel_contracts::Boundary, u32) {
        (&self.boundary, self.revision)
    }

    fn begin_negotiation(&mut self) -> bool {
        !std::mem::replace(&mut self.negotiated_this_step, true)
    }

    async fn ask(
        &mut self,
        ledger: &mut Ledger,
        (turn_id, run_id, tool_call): (TurnId, RunId, &ToolCall),
        access: keel_contracts::Access,
        ruled: Option<(PermissionAnswer, String)>,
        arguments_sha256: &str,
        cancel: &Cancellation,
    ) -> Result<Option<PermissionAnswer>> {
        let call = Call { turn: Some(turn_id), run: Some(run_id), call: tool_call, hold: None };
        CallState::ask(self, ledger, &call, access, ruled, arguments_sha256, cancel).await
    }

    async fn widen_boundary(
        &mut self,
        ledger: &mut Ledger,
        (turn_id, run_id): (TurnId, RunId),
        boundary: keel_contracts::Boundary,
        justification: String,
    ) -> Result<u32> {
        self.revision += 1;
        ledger
            .append(
                Some(turn_id),
                Some(run_id),
                EventKind::BoundaryRevised {
                    revision: self.revision,
                    boundary: boundary.clone(),
                    justification,
                },
            )
            .await?;
        self.boundary = boundary;
        Ok(self.revision)
    }

    fn deny(&mut self, reason: String) {
        self.denied = Some(reason);
    }

    fn submitted(&self) -> bool {
        self.submitted.is_some()
    }

    fn submit(&mut self, answer: String) {
        self.submitted = Some(answer);
    }

    fn children(&self) -> &dyn Children {
        self.children
    }

    fn remaining(&self) -> Budget {
        self.remaining
    }

    fn absorb_child_spent(&mut self, spent: &UsageTotals) {
        self.child_spent.absorb(spent);
    }

    async fn run_cell(
        &mut self,
        ledger: &mut Ledger,
        (turn_id, run_id, tool_call): (TurnId, RunId, &ToolCall),
        cancel: &Cancellation,
    ) -> Result<ToolOutput> {
        let parent = Call { turn: Some(turn_id), run: Some(run_id), call: tool_call, hold: None };
        CallState::run_cell(self, ledger, &parent, cancel).await
    }
}
