//! Issue 4, legitimate work in managed mode: building, testing, committing, temporary
//! files, pipelines and background jobs all succeed inside the sandbox.

use keel_contracts::{Outcome, SandboxMode, ToolOutput};
use serde_json::json;

use super::support::{Fixture, call, context};

async fn managed(fixture: &Fixture, command: &str) -> ToolOutput {
    let context = context(&fixture.root, SandboxMode::Managed);
    let output = call(&context, "bash", json!({"command": command, "timeout_ms": 120_000})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{command}: {}", output.content);
    output
}

#[tokio::test]
async fn git_add_and_commit_in_the_root_and_a_nested_repository() {
    let fixture = Fixture::new();
    managed(&fixture, "git init -q . && mkdir -p vendor/lib && git -C vendor/lib init -q .").await;
    let output = managed(
        &fixture,
        "export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e; \
         echo one > a.txt && git add a.txt && git commit -q -m one && \
         echo two >> a.txt && git commit -q -am two && git log --format=%s | tr '\\n' ' '; \
         cd vendor/lib && echo x > x && git add x && git commit -q -m nested && git log --format=%s",
    )
    .await;
    assert!(output.content.starts_with("two one nested\n"), "{}", output.content);
    assert!(output.content.ends_with("[exit code 0]"), "{}", output.content);
    assert!(!output.content.contains("setsid"), "{}", output.content);
}

#[tokio::test]
async fn build_and_test_a_rust_crate() {
    let fixture = Fixture::new();
    fixture.write(
        "Cargo.toml",
        "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    );
    fixture.write(
        "src/lib.rs",
        "pub fn add(a: u32, b: u32) -> u32 { a + b }\n#[test]\nfn adds() { assert_eq!(add(2, 2), 4); }\n",
    );
    // The build goes to the workspace's own `target/`, whatever CARGO_TARGET_DIR the test
    // process has (CI points it outside, where the sandbox rightly refuses writes).
    let output = managed(
        &fixture,
        "CARGO_TARGET_DIR=target cargo test --offline 2>&1 | grep -E '^test (adds|result)'",
    )
    .await;
    assert!(output.content.contains("test adds ... ok"), "{}", output.content);
    assert!(output.content.contains("test result: ok. 1 passed"), "{}", output.content);
    assert!(fixture.root.join("target").is_dir());
}

#[tokio::test]
async fn build_and_run_a_c_program() {
    let fixture = Fixture::new();
    fixture.write(
        "hello.c",
        "#include <stdio.h>\nint main(void) { puts(\"hello from c\"); return 0; }\n",
    );
    let output = managed(&fixture, "cc -o hello hello.c && ./hello").await;
    assert_eq!(output.content, "hello from c\n[exit code 0]");
}

#[tokio::test]
async fn temporary_files_pipelines_and_background_jobs() {
    let fixture = Fixture::new();
    let output = managed(
        &fixture,
        "t=$(mktemp) && echo tmp-ok > $t && cat $t; \
         python3 -c \"import tempfile; f = tempfile.NamedTemporaryFile(); f.write(b'x'); f.flush(); print('py-tmp-ok')\"; \
         seq 1 100 | sort -rn | head -2 | tr '\\n' ' '; echo; \
         (sleep 0.1; echo bg-done) & wait; echo to-stderr > /dev/stderr",
    )
    .await;
    assert_eq!(
        output.content,
        "tmp-ok\npy-tmp-ok\n100 99 \nbg-done\n[stderr]\nto-stderr\n[exit code 0]"
    );
}
