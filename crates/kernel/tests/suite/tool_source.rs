//! A changing tool source (MCP servers whose lists change while a run goes on): its new
//! tools are offered from the next step on, and a call of one of them is carried out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use keel_contracts::{Access, EventKind, Outcome, Tool, ToolContext, ToolOutput, ToolSource};
use keel_kernel::{Cancellation, TurnOutcome};

use super::support::{Behaviour, FakeTool, Harness, InvocationLog, spec};

/// A source whose list is what `tools` holds, its generation counting the changes.
#[derive(Debug, Default)]
struct Changing {
    generation: AtomicU64,
    tools: Mutex<Vec<Arc<dyn Tool>>>,
}

impl Changing {
    fn offer(&self, tool: Arc<dyn Tool>) {
        self.tools.lock().unwrap().push(tool);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

impl ToolSource for Changing {
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.lock().unwrap().clone()
    }
}

/// A read tool that, when called, makes the source offer `remote_b` (as a server that
/// sends `tools/list_changed` during a call).
#[derive(Debug)]
struct Grow {
    spec: keel_contracts::ToolSpec,
    source: Arc<Changing>,
    log: InvocationLog,
}

#[async_trait]
impl Tool for Grow {
    fn spec(&self) -> &keel_contracts::ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        self.source.offer(fake("remote_b", &self.log));
        ToolOutput::ok("grew")
    }
}

fn fake(name: &str, log: &InvocationLog) -> Arc<dyn Tool> {
    Arc::new(FakeTool {
        spec: spec(name, Access::Read, false),
        log: log.clone(),
        behaviour: Behaviour::Reply(format!("{name} answered")),
    })
}

#[tokio::test]
async fn a_tool_the_source_offers_during_a_run_is_called_in_its_next_step() {
    let mut harness = Harness::new();
    let source = Arc::new(Changing::default());
    source.tools.lock().unwrap().push(fake("remote_a", &harness.log));
    harness.extra_tools.push(source.tools()[0].clone());
    harness.extra_tools.push(Arc::new(Grow {
        spec: spec("grow", Access::Read, false),
        source: source.clone(),
        log: harness.log.clone(),
    }));
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "grow", "arguments": {}}]},
        {"tool_calls": [{"name": "remote_b", "arguments": {}}]},
        {"tool_calls": [{"name": "remote_a", "arguments": {}}]},
        {"text": "done"}
    ]})
    .to_string();
    let kernel = harness.kernel(&script).with_tool_source(source.clone());
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let events = harness.events(session).await;
    let changed: Vec<_> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolsChanged { added, removed, .. } => {
                Some((added.clone(), removed.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(changed, vec![(vec!["remote_b".to_owned()], Vec::new())]);
    // The new tool ran (it was settled against the new list), and the old one still does.
    let results: Vec<_> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult { tool, outcome, content, .. } => {
                Some((tool.as_str(), *outcome, content.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        vec![
            ("grow", Outcome::Ok, "grew"),
            ("remote_b", Outcome::Ok, "remote_b answered"),
            ("remote_a", Outcome::Ok, "remote_a answered"),
        ]
    );
    assert_eq!(harness.invocations(), vec!["remote_b {}", "remote_a {}"]);
}
