//! Helpers: a tool context over a temp workspace, and calling a built-in tool by name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_contracts::{IdGen, SandboxMode, Tool, ToolCallId, ToolContext, ToolOutput, UuidV7Ids};
use keel_tools::builtin_tools;

/// A temp dir whose `ws` folder is the workspace root (so tests can put things outside).
pub(crate) struct Fixture {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) root: PathBuf,
    pub(crate) sandbox: SandboxMode,
}

impl Fixture {
    pub(crate) fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap().join("ws");
        std::fs::create_dir_all(&root).unwrap();
        Fixture { dir, root, sandbox: SandboxMode::Bypass }
    }

    pub(crate) fn outside(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    pub(crate) fn write(&self, relative: &str, content: &str) {
        let path = self.root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    pub(crate) fn read(&self, relative: &str) -> String {
        std::fs::read_to_string(self.root.join(relative)).unwrap()
    }

    pub(crate) fn context(&self) -> ToolContext {
        context(&self.root, self.sandbox)
    }

    pub(crate) async fn call(&self, name: &str, arguments: serde_json::Value) -> ToolOutput {
        call(&self.context(), name, arguments).await
    }
}

pub(crate) fn context(root: &Path, sandbox: SandboxMode) -> ToolContext {
    ToolContext {
        workspace: root.to_owned(),
        session_id: UuidV7Ids.session_id(),
        call_id: ToolCallId("c1".to_owned()),
        sandbox,
        boundary: Default::default(),
        denied_paths: Default::default(),
        write_denied_paths: Default::default(),
        elicitor: None,
    }
}

pub(crate) fn tool(name: &str) -> Arc<dyn Tool> {
    builtin_tools().into_iter().find(|tool| tool.spec().name == name).unwrap()
}

/// Calls a built-in tool; a call taking over 20 s fails the test (a hang, not a result).
pub(crate) async fn call(
    context: &ToolContext,
    name: &str,
    arguments: serde_json::Value,
) -> ToolOutput {
    let tool = tool(name);
    tokio::time::timeout(Duration::from_secs(20), tool.invoke(context, &arguments))
        .await
        .unwrap_or_else(|_| panic!("{name} did not return within 20 s"))
}

/// Whether `pid` is a live process (absent and zombie count as dead).
pub(crate) fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

pub(crate) async fn wait_dead(pid: u32) -> bool {
    for _ in 0..50 {
        if !is_alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    false
}
