//! Failpoints: named places in the loop where a crash harness may stop the process, to
//! prove that recovery holds wherever a crash happens (DESIGN.md §6). In production the
//! kernel has [`NoFailpoints`].

use std::fmt::Debug;

use async_trait::async_trait;

/// A named place in the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failpoint {
    /// Before `tool_attempt_prepared` is appended.
    BeforePrepare,
    /// After `tool_attempt_prepared` is durable, before the tool is invoked.
    AfterPrepare,
    /// While the tool runs (reached concurrently with the tool).
    MidTool,
    /// After the tool returned, before its `tool_result` is appended.
    BeforeResult,
    /// After the `tool_result` is recorded. It is staged (group commit): durable with the
    /// next commit (the next model request, prepare, prompt or the terminal event), so a
    /// crash here leaves the attempt `indeterminate`, like a crash at `BeforeResult`.
    AfterResult,
    /// Before the run's terminal event is appended (everything before it is durable).
    BeforeTerminal,
    /// After the run's terminal event is durable.
    AfterTerminal,
}

impl Failpoint {
    /// Every failpoint, in loop order.
    pub const ALL: [Failpoint; 7] = [
        Failpoint::BeforePrepare,
        Failpoint::AfterPrepare,
        Failpoint::MidTool,
        Failpoint::BeforeResult,
        Failpoint::AfterResult,
        Failpoint::BeforeTerminal,
        Failpoint::AfterTerminal,
    ];

    /// The snake_case name (`before_prepare`, …).
    pub fn name(self) -> &'static str {
        match self {
            Failpoint::BeforePrepare => "before_prepare",
            Failpoint::AfterPrepare => "after_prepare",
            Failpoint::MidTool => "mid_tool",
            Failpoint::BeforeResult => "before_result",
            Failpoint::AfterResult => "after_result",
            Failpoint::BeforeTerminal => "before_terminal",
            Failpoint::AfterTerminal => "after_terminal",
        }
    }

    /// The failpoint called `name`.
    pub fn from_name(name: &str) -> Option<Failpoint> {
        Failpoint::ALL.into_iter().find(|point| point.name() == name)
    }
}

/// What happens at a failpoint. A harness implementation may never return (it waits to be
/// killed, or kills the process).
#[async_trait]
pub trait Failpoints: Send + Sync + Debug {
    /// Called each time the loop reaches `point`.
    ///
    /// # Cancel safety
    ///
    /// The loop awaits this inline; dropping it drops the run like any crash would.
    async fn hit(&self, point: Failpoint);
}

/// No failpoints: every hit returns at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFailpoints;

#[async_trait]
impl Failpoints for NoFailpoints {
    async fn hit(&self, _point: Failpoint) {}
}
