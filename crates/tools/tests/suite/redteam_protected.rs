//! Red-team attempts at planting git and keel configuration through the file tools
//! (issue #11, item 3): every protected path is refused by `write_file` and `edit_file`,
//! decided on the path as given and as resolved, with the same list that managed commands
//! get read-only. Each attempt also checks that the legitimate neighbour (an ordinary
//! write or edit in the workspace) still works.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use keel_contracts::{Outcome, SandboxMode};
use keel_tools::PROTECTED_PATH;
use serde_json::json;

use super::support::Fixture;

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git").args(args).current_dir(dir).status().unwrap();
    assert!(status.success(), "git {args:?}");
}

/// A fixture whose workspace is a git repository with one commit.
fn repo() -> Fixture {
    let fixture = Fixture::new();
    git(&fixture.root, &["init", "-q", "."]);
    fixture.write("src/main.rs", "fn main() {}\n");
    git(&fixture.root, &["add", "."]);
    git(
        &fixture.root,
        &["-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init"],
    );
    fixture
}

/// What is at `path`: its kind and, for a regular file, its content (a FIFO is never
/// opened).
fn snapshot(path: &Path) -> Option<(String, Vec<u8>)> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let content = if meta.is_file() { std::fs::read(path).unwrap() } else { Vec::new() };
    Some((format!("{:?}", meta.file_type()), content))
}

async fn assert_write_refused(fixture: &Fixture, path: &str) {
    let before = snapshot(&fixture.root.join(path));
    let output = fixture
        .call(
            "write_file",
            json!({"path": path, "content": "[core]\n\tfsmonitor = touch /tmp/p\n"}),
        )
        .await;
    assert_eq!(output.outcome, Outcome::Error, "{path}: {}", output.content);
    assert!(output.content.contains(PROTECTED_PATH), "{path}: {}", output.content);
    let after = snapshot(&fixture.root.join(path));
    assert_eq!(before, after, "{path} changed");
}

async fn assert_edit_refused(fixture: &Fixture, path: &str, old: &str) {
    let before = fixture.read(path);
    let output = fixture
        .call("edit_file", json!({"path": path, "old": old, "new": "fsmonitor = touch /tmp/p"}))
        .await;
    assert_eq!(output.outcome, Outcome::Error, "{path}: {}", output.content);
    assert!(output.content.contains(PROTECTED_PATH), "{path}: {}", output.content);
    assert_eq!(fixture.read(path), before);
}

/// The legitimate neighbour: ordinary writes and edits in the workspace work.
async fn assert_ordinary_work(fixture: &Fixture) {
    let output =
        fixture.call("write_file", json!({"path": "notes/todo.md", "content": "x\n"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    let output = fixture
        .call(
            "edit_file",
            json!({"path": "src/main.rs", "old": "fn main() {}", "new": "fn main() { }"}),
        )
        .await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    let output =
        fixture.call("write_file", json!({"path": ".gitignore", "content": "target/\n"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
}

#[tokio::test]
async fn redteam_tool_write_git_config() {
    let fixture = repo();
    assert_write_refused(&fixture, ".git/config").await;
    assert_write_refused(&fixture, "src/../.git/config").await;
    assert_write_refused(&fixture, &fixture.root.join(".git/config").display().to_string()).await;
    assert_edit_refused(&fixture, ".git/config", "[core]").await;
    assert_ordinary_work(&fixture).await;
}

#[tokio::test]
async fn redteam_tool_write_hooks_of_root_and_nested_repositories() {
    let fixture = repo();
    git(&fixture.root, &["init", "-q", "vendor/lib"]);
    assert_write_refused(&fixture, ".git/hooks/pre-commit").await;
    assert_write_refused(&fixture, ".git/hooks/sub/dir/hook").await;
    assert_write_refused(&fixture, "vendor/lib/.git/hooks/post-checkout").await;
    assert_write_refused(&fixture, "vendor/lib/.git/config").await;
    assert_ordinary_work(&fixture).await;
}

#[tokio::test]
async fn redteam_tool_write_worktree_config_and_commondir() {
    let fixture = repo();
    assert_write_refused(&fixture, ".git/config.worktree").await;
    assert_write_refused(&fixture, ".git/commondir").await;
    git(&fixture.root, &["worktree", "add", "-q", "-b", "side", "../side"]);
    assert_write_refused(&fixture, ".git/worktrees/side/commondir").await;
    assert_write_refused(&fixture, ".git/worktrees/side/config.worktree").await;
    assert_write_refused(&fixture, ".git/worktrees/planted/commondir").await;
    assert_ordinary_work(&fixture).await;
}

#[tokio::test]
async fn redteam_tool_write_configured_hooks_path_every_spelling() {
    for (config, hook) in [
        ("[core] hooksPath = .hooks\n", ".hooks/pre-commit"),
        ("[CORE]\n\tHooksPath = \"ci/hooks\" # shared\n", "ci/hooks/pre-push"),
        ("[core]\n\thooksPath = tools/gi\\\nthooks\n", "tools/githooks/post-merge"),
    ] {
        let fixture = repo();
        let text = format!("{}{config}", fixture.read(".git/config"));
        std::fs::write(fixture.root.join(".git/config"), text).unwrap();
        assert_write_refused(&fixture, hook).await;
        assert_ordinary_work(&fixture).await;
    }
}

#[tokio::test]
async fn redteam_tool_write_included_configs() {
    let fixture = repo();
    fixture.write("tools/git.inc", "[alias]\n\tst = status\n");
    let text = format!(
        "{}[include]\n\tpath = ../tools/git.inc\n[includeIf \"gitdir:/\"]\n\tpath = ../not-yet.inc\n",
        fixture.read(".git/config")
    );
    std::fs::write(fixture.root.join(".git/config"), text).unwrap();
    assert_write_refused(&fixture, "tools/git.inc").await;
    assert_edit_refused(&fixture, "tools/git.inc", "st = status").await;
    assert_write_refused(&fixture, "not-yet.inc").await;
    assert!(!fixture.root.join("not-yet.inc").exists());
    let output =
        fixture.call("write_file", json!({"path": "tools/other.txt", "content": "ok"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_ordinary_work(&fixture).await;
}

#[tokio::test]
async fn redteam_tool_write_keel_config() {
    let fixture = repo();
    assert_write_refused(&fixture, ".keel/config.toml").await;
    assert_write_refused(&fixture, "./.keel/skills/evil.md").await;
    assert!(!fixture.root.join(".keel").exists(), "a check creates nothing");
    assert_ordinary_work(&fixture).await;
}

#[tokio::test]
async fn redteam_tool_write_through_a_symlink_to_git_config() {
    let fixture = repo();
    symlink(".git/config", fixture.root.join("innocent.cfg")).unwrap();
    symlink(".git/hooks", fixture.root.join("scripts")).unwrap();
    symlink(".git", fixture.root.join("dotgit")).unwrap();
    assert_write_refused(&fixture, "innocent.cfg").await;
    assert_write_refused(&fixture, "scripts/pre-commit").await;
    assert_write_refused(&fixture, "dotgit/config").await;
    assert_ordinary_work(&fixture).await;
}

#[tokio::test]
async fn redteam_tool_write_a_protected_path_that_is_a_symlink() {
    let fixture = repo();
    std::fs::rename(fixture.root.join(".git/config"), fixture.root.join("shared.gitconfig"))
        .unwrap();
    symlink("../shared.gitconfig", fixture.root.join(".git/config")).unwrap();
    // The link itself (replacing it would plant a new config) and its target.
    assert_write_refused(&fixture, ".git/config").await;
    assert_write_refused(&fixture, "shared.gitconfig").await;
    assert_eq!(
        std::fs::read_link(fixture.root.join(".git/config")).unwrap(),
        Path::new("../shared.gitconfig")
    );
    assert_ordinary_work(&fixture).await;
}

#[tokio::test]
async fn redteam_tool_write_submodule_git_file() {
    let fixture = repo();
    fixture.write("sub/.git", "gitdir: ../.git/modules/sub\n");
    assert_write_refused(&fixture, "sub/.git").await;
    assert_ordinary_work(&fixture).await;
}

#[tokio::test]
async fn redteam_tool_fifo_where_a_config_should_be_never_hangs() {
    let fixture = repo();
    std::fs::remove_file(fixture.root.join(".git/config")).unwrap();
    let status = Command::new("mkfifo").arg(fixture.root.join(".git/config")).status().unwrap();
    assert!(status.success());
    let started = Instant::now();
    let output = fixture.call("write_file", json!({"path": "notes.md", "content": "x"})).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_write_refused(&fixture, ".git/config").await;
}

/// One list: what the file tools refuse, a managed command cannot write either, and what
/// the file tools may write, a managed command may write too.
#[tokio::test]
async fn redteam_tool_and_command_share_one_list() {
    let mut fixture = repo();
    fixture.write("tools/git.inc", "[core]\n\thooksPath = .hooks\n");
    let text = format!("{}[include]\n\tpath = ../tools/git.inc\n", fixture.read(".git/config"));
    std::fs::write(fixture.root.join(".git/config"), text).unwrap();
    let protected = [
        ".git/config",
        ".git/hooks/pre-commit",
        ".keel/config.toml",
        ".hooks/pre-push",
        "tools/git.inc",
    ];
    for path in protected {
        assert_write_refused(&fixture, path).await;
    }
    fixture.sandbox = SandboxMode::Managed;
    let script: String = protected
        .iter()
        .map(|path| format!("{{ echo planted >> {path}; }} 2>/dev/null; "))
        .collect::<String>()
        + "echo ok >> notes.md; cat notes.md";
    let output = fixture.call("bash", json!({"command": script})).await;
    assert!(output.content.starts_with("ok\n"), "{}", output.content);
    for path in protected {
        let content = std::fs::read_to_string(fixture.root.join(path)).unwrap_or_default();
        assert!(!content.contains("planted"), "{path}: {content}");
    }
    let output = fixture
        .call("bash", json!({"command": "git -c user.name=t -c user.email=t@e commit -qam two --allow-empty && echo committed"}))
        .await;
    assert!(output.content.contains("committed"), "{}", output.content);
}
