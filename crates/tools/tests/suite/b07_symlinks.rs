//! B07: file search must not follow a symbolic link out of the workspace.
//!
//! Layout exactly as in cases/bugs/B07: `T/ws/project` is the root, `vendor-link` points to
//! `../other-project` (holding `.env` and `notes.txt`), `etc-link` points to `/etc`.

use std::os::unix::fs::symlink;
use std::path::PathBuf;

use keel_contracts::{Outcome, SandboxMode, ToolContext};
use serde_json::json;

use super::support::{call, context};

struct B07 {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl B07 {
    fn new() -> B07 {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(t.join("ws/project/src")).unwrap();
        std::fs::create_dir_all(t.join("ws/other-project")).unwrap();
        std::fs::write(t.join("ws/project/src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::write(t.join("ws/other-project/.env"), "API_TOKEN=not-a-real-token\n").unwrap();
        std::fs::write(t.join("ws/other-project/notes.txt"), "secret notes\n").unwrap();
        symlink("../other-project", t.join("ws/project/vendor-link")).unwrap();
        symlink("/etc", t.join("ws/project/etc-link")).unwrap();
        B07 { _dir: dir, root: t.join("ws/project") }
    }

    fn context(&self) -> ToolContext {
        context(&self.root, SandboxMode::Managed)
    }
}

fn assert_nothing_through_links(content: &str) {
    for leaked in ["vendor-link/", "etc-link/", "notes.txt", ".env", "API_TOKEN", "passwd"] {
        assert!(!content.contains(leaked), "leaked {leaked}: {content}");
    }
}

#[tokio::test]
async fn glob_all_lists_only_the_workspace() {
    let b07 = B07::new();
    let output = call(&b07.context(), "glob", json!({"pattern": "**/*"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("src/main.rs"), "{}", output.content);
    assert_nothing_through_links(&output.content);
}

#[tokio::test]
async fn glob_txt_finds_nothing_through_the_link() {
    let b07 = B07::new();
    let output = call(&b07.context(), "glob", json!({"pattern": "**/*.txt"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "no files match `**/*.txt`");
}

#[tokio::test]
async fn grep_does_not_search_through_links() {
    let b07 = B07::new();
    let output = call(&b07.context(), "grep", json!({"pattern": "API_TOKEN"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "no matches for `API_TOKEN`");
    let output = call(&b07.context(), "grep", json!({"pattern": "root"})).await;
    assert_nothing_through_links(&output.content);
}

#[tokio::test]
async fn read_through_an_escaping_link_is_refused() {
    let b07 = B07::new();
    for path in
        ["vendor-link/notes.txt", "vendor-link/.env", "etc-link/passwd", "etc-link/hostname"]
    {
        let output = call(&b07.context(), "read_file", json!({"path": path})).await;
        assert_eq!(output.outcome, Outcome::Error, "{path}");
        assert!(output.content.contains("outside the workspace"), "{path}: {}", output.content);
        assert!(!output.content.contains("secret notes"), "{}", output.content);
        assert!(!output.content.contains("not-a-real-token"), "{}", output.content);
    }
}

#[tokio::test]
async fn naming_an_escaping_link_as_the_search_root_is_refused() {
    let b07 = B07::new();
    for (tool, arguments) in [
        ("glob", json!({"pattern": "*", "path": "vendor-link"})),
        ("grep", json!({"pattern": "API", "path": "vendor-link"})),
        ("grep", json!({"pattern": "API", "path": "vendor-link/.env"})),
        ("list_dir", json!({"path": "etc-link"})),
        ("write_file", json!({"path": "vendor-link/planted.txt", "content": "x"})),
        ("edit_file", json!({"path": "vendor-link/notes.txt", "old": "secret", "new": "x"})),
    ] {
        let output = call(&b07.context(), tool, arguments.clone()).await;
        assert_eq!(output.outcome, Outcome::Error, "{tool} {arguments}");
        assert!(output.content.contains("outside the workspace"), "{tool}: {}", output.content);
    }
    assert!(!b07.root.join("../other-project/planted.txt").exists());
    assert_eq!(
        std::fs::read_to_string(b07.root.join("../other-project/notes.txt")).unwrap(),
        "secret notes\n"
    );
}

#[tokio::test]
async fn a_link_inside_the_root_still_works() {
    let b07 = B07::new();
    symlink("src", b07.root.join("src-alias")).unwrap();
    let output = call(&b07.context(), "read_file", json!({"path": "src-alias/main.rs"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "     1\tfn main() {}\n");
    let output =
        call(&b07.context(), "glob", json!({"pattern": "*.rs", "path": "src-alias"})).await;
    assert_eq!(output.content, "src/main.rs\n");
    let output =
        call(&b07.context(), "grep", json!({"pattern": "main", "path": "src-alias"})).await;
    assert_eq!(output.content, "src/main.rs:1:fn main() {}\n");
}

#[tokio::test]
async fn a_link_loop_does_not_hang_the_walkers() {
    let b07 = B07::new();
    symlink(".", b07.root.join("loop")).unwrap();
    // `call` fails the test when a tool takes over 20 s.
    let output = call(&b07.context(), "glob", json!({"pattern": "**/*"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("src/main.rs"));
    assert!(!output.content.contains("loop/"), "{}", output.content);
    let output = call(&b07.context(), "grep", json!({"pattern": "main"})).await;
    assert_eq!(output.content, "src/main.rs:1:fn main() {}\n");
    let output = call(&b07.context(), "list_dir", json!({"path": "loop/loop/loop"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("loop -> ."));
    let output = call(&b07.context(), "read_file", json!({"path": "loop/loop/src/main.rs"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
}
