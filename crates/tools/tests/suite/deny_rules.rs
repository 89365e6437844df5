//! Deny rules at the tool level (the kernel refuses covered calls first; these hold on
//! their own): file tools refuse a covered path, searches skip it, `bash` runs with it
//! masked or read-only, and refuses when the denial cannot be enforced.

use keel_contracts::{DeniedPaths, Outcome, SandboxMode};
use serde_json::json;

use super::support::{Fixture, call};

const CANARY: &str = "CANARY-tools-91b";

fn fixture() -> Fixture {
    let mut fixture = Fixture::new();
    fixture.sandbox = SandboxMode::Managed;
    fixture.write("secrets/key", &format!("{CANARY}\n"));
    fixture.write("gen/out.rs", "generated\n");
    fixture.write("src/ok.txt", "neighbour\n");
    fixture
}

fn context(fixture: &Fixture) -> keel_contracts::ToolContext {
    let mut context = fixture.context();
    context.denied_paths = DeniedPaths::new(["secrets/**"], "");
    context.write_denied_paths = DeniedPaths::new(["gen/**"], "");
    context
}

#[tokio::test]
async fn redteam_rules_tools_refuse_and_skip_denied_paths_on_their_own() {
    let fixture = fixture();
    let context = context(&fixture);
    for (tool, arguments) in [
        ("read_file", json!({"path": "secrets/key"})),
        ("grep", json!({"pattern": "CANARY", "path": "secrets/key"})),
        ("edit_file", json!({"path": "secrets/key", "old": CANARY, "new": "x"})),
        ("write_file", json!({"path": "secrets/planted", "content": "x"})),
    ] {
        let output = call(&context, tool, arguments).await;
        assert_eq!(output.outcome, Outcome::Error, "{tool}: {}", output.content);
        assert!(output.content.contains("denied by a deny rule"), "{tool}: {}", output.content);
    }
    let listed = call(&context, "list_dir", json!({"path": "secrets"})).await;
    assert!(!listed.content.contains("key"), "{}", listed.content);
    let grep = call(&context, "grep", json!({"pattern": "CANARY|neighbour"})).await;
    assert!(
        !grep.content.contains(CANARY) && grep.content.contains("src/ok.txt"),
        "{}",
        grep.content
    );
    let glob = call(&context, "glob", json!({"pattern": "**/*"})).await;
    assert!(
        !glob.content.contains("secrets/") && glob.content.contains("gen/out.rs"),
        "{}",
        glob.content
    );
    assert!(!fixture.root.join("secrets/planted").exists());
}

#[tokio::test]
async fn redteam_rules_bash_masks_hidden_and_read_only_paths() {
    let fixture = fixture();
    let context = context(&fixture);
    let command = "cat secrets/key; echo pwned > gen/out.rs; cat gen/out.rs src/ok.txt; \
                   echo fine > src/new.txt && cat src/new.txt";
    let output = call(&context, "bash", json!({"command": command})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert!(!output.content.contains(CANARY), "{}", output.content);
    for shown in ["generated", "neighbour", "fine", "Read-only file system"] {
        assert!(output.content.contains(shown), "{shown}: {}", output.content);
    }
    assert_eq!(fixture.read("gen/out.rs"), "generated\n");

    // Bypass mode cannot mask: the command is refused, and runs once nothing is to mask.
    let mut bypass = context.clone();
    bypass.sandbox = SandboxMode::Bypass;
    let refused = call(&bypass, "bash", json!({"command": "cat src/ok.txt"})).await;
    assert_eq!(refused.outcome, Outcome::Error);
    assert!(refused.content.contains("sandbox refused"), "{}", refused.content);
    bypass.denied_paths = DeniedPaths::new(["nothing/**"], "");
    bypass.write_denied_paths = DeniedPaths::default();
    let ran = call(&bypass, "bash", json!({"command": "cat src/ok.txt"})).await;
    assert!(ran.content.contains("neighbour"), "{}", ran.content);
}
