//! Managed mode at the sandbox level: fail closed, containment basics, cleanup. The full
//! escape suite runs end to end through the bash tool in keel-tools.

use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_sandbox::{CommandSpec, SandboxError, SandboxMode, Termination, managed_support, run};

struct Dirs {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    outside: PathBuf,
}

fn dirs() -> Dirs {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let workspace = base.join("ws");
    let outside = base.join("outside");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    Dirs { _dir: dir, workspace, outside }
}

fn bash(workspace: &Path, script: &str) -> CommandSpec {
    CommandSpec::new("bash", workspace, Duration::from_secs(30)).arg("-c").arg(script)
}

#[test]
fn this_machine_supports_managed_mode() {
    let support = managed_support(None).unwrap();
    assert!(support.landlock_abi >= 3);
}

#[tokio::test]
async fn fail_closed_when_landlock_is_too_old() {
    let dirs = dirs();
    let marker = dirs.workspace.join("ran");
    for ceiling in [0, 1, 2] {
        let spec = bash(&dirs.workspace, &format!("touch {}", marker.display()))
            .landlock_abi_ceiling(ceiling);
        let error = run(&spec, SandboxMode::Managed).await.unwrap_err();
        let SandboxError::Unenforceable { missing } = &error else {
            panic!("expected a refusal, got {error:?}");
        };
        assert!(missing.contains("landlock abi 3 or newer"), "{missing}");
        assert!(error.to_string().contains("the command was not run"));
        assert!(!marker.exists(), "nothing ran on the host");
    }
    let error = managed_support(Some(0)).unwrap_err();
    assert!(error.to_string().contains("none (landlock missing or disabled)"), "{error}");
}

#[tokio::test]
async fn the_minimum_abi_is_enough() {
    let dirs = dirs();
    let spec =
        bash(&dirs.workspace, &format!("echo ok > f; echo no > {}/f", dirs.outside.display()))
            .landlock_abi_ceiling(3);
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert!(out.termination == Termination::Exited { code: 1 }, "{out:?}");
    assert!(dirs.workspace.join("f").exists());
    assert!(!dirs.outside.join("f").exists());
}

#[tokio::test]
async fn writes_inside_and_refuses_outside() {
    let dirs = dirs();
    let script = format!(
        "echo in > inside.txt && cat inside.txt; echo out > {}/outside.txt; echo $?",
        dirs.outside.display()
    );
    let out = run(&bash(&dirs.workspace, &script), SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text, "in\n1\n");
    assert!(out.stderr.text.contains("Permission denied"), "{}", out.stderr.text);
    assert!(!dirs.outside.join("outside.txt").exists());
}

#[tokio::test]
async fn private_temporary_directory_is_used_and_removed() {
    let dirs = dirs();
    let out = run(
        &bash(&dirs.workspace, "echo $TMPDIR; echo x > $TMPDIR/x && echo wrote"),
        SandboxMode::Managed,
    )
    .await
    .unwrap();
    let mut lines = out.stdout.text.lines();
    let temp_dir = PathBuf::from(lines.next().unwrap());
    assert_eq!(lines.next(), Some("wrote"));
    assert!(temp_dir.file_name().unwrap().to_string_lossy().starts_with("keel-sandbox-"));
    assert!(!temp_dir.exists(), "removed after the run");
}

#[tokio::test]
async fn secret_looking_environment_is_not_passed() {
    let dirs = dirs();
    let spec =
        bash(&dirs.workspace, "env | cut -d= -f1 | grep -ci -e token -e api_key -e secret || true")
            .env("VISIBLE", "1");
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text.trim(), "0");
}

#[tokio::test]
async fn timeout_and_cleanup_work_when_contained() {
    let dirs = dirs();
    let spec = CommandSpec::new("bash", &dirs.workspace, Duration::from_millis(500))
        .arg("-c")
        // The command runs in its own PID namespace, so `$!` is a namespace pid; the host
        // pid is what the host's /proc shows as `self`.
        .arg("sh -c 'readlink /proc/self > bg.pid; exec sleep 1000' & echo waiting; sleep 1000");
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.termination, Termination::TimedOut { after: Duration::from_millis(500) });
    assert_eq!(out.last_line.as_deref(), Some("waiting"));
    let pid = std::fs::read_to_string(dirs.workspace.join("bg.pid")).unwrap();
    let stat = format!("/proc/{}/stat", pid.trim());
    for _ in 0..50 {
        if std::fs::read_to_string(&stat).map_or(true, |s| s.contains(") Z")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    panic!("the background child survived the timeout");
}

#[tokio::test]
async fn missing_program_in_managed_mode_is_a_spawn_error_not_a_refusal() {
    let dirs = dirs();
    let spec = CommandSpec::new("keel-no-such-program", &dirs.workspace, Duration::from_secs(5));
    let error = run(&spec, SandboxMode::Managed).await.unwrap_err();
    assert!(matches!(error, SandboxError::Spawn { .. }), "{error:?}");
}

#[tokio::test]
async fn mapped_dirs_appear_at_their_targets_inside_the_namespace_only() {
    let dirs = dirs();
    let tests = dirs.outside.join("tests");
    let logs = dirs.outside.join("logs");
    std::fs::create_dir_all(&tests).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(tests.join("t.txt"), "from tests\n").unwrap();
    std::fs::write(dirs.workspace.join("w.txt"), "from workspace\n").unwrap();
    let spec = bash(
        &dirs.workspace,
        "pwd; cat w.txt /keel-map-tests/t.txt; echo 0.5 > /keel-map-logs/reward.txt; \
         echo changed > /keel-map-app/w.txt; (echo no > /keel-map-tests/t.txt) 2>/dev/null \
         || echo tests-read-only",
    )
    .workspace(&dirs.workspace)
    .allow_read(&tests)
    .allow_write(&logs)
    .map_dir(&dirs.workspace, "/keel-map-app")
    .map_dir(&tests, "/keel-map-tests")
    .map_dir(&logs, "/keel-map-logs");
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert!(out.termination.success(), "{out:?}");
    assert_eq!(
        out.stdout.text, "/keel-map-app\nfrom workspace\nfrom tests\ntests-read-only\n",
        "{out:?}"
    );
    assert_eq!(std::fs::read_to_string(logs.join("reward.txt")).unwrap(), "0.5\n");
    assert_eq!(std::fs::read_to_string(dirs.workspace.join("w.txt")).unwrap(), "changed\n");
    assert_eq!(std::fs::read_to_string(tests.join("t.txt")).unwrap(), "from tests\n");
    for target in ["/keel-map-app", "/keel-map-tests", "/keel-map-logs"] {
        assert!(!Path::new(target).exists(), "{target} was created on the host");
    }
}

#[tokio::test]
async fn mapped_dirs_refuse_bypass_and_unusable_targets() {
    let dirs = dirs();
    let marker = dirs.workspace.join("ran");
    let script = format!("touch {}", marker.display());
    let bypass = bash(&dirs.workspace, &script).map_dir(&dirs.outside, "/keel-map-x");
    let error = run(&bypass, SandboxMode::Bypass).await.unwrap_err();
    assert!(matches!(error, SandboxError::Unenforceable { .. }), "{error:?}");
    for target in ["relative", "/", "/keel-map-x/../etc", "/etc/keel-no-such-dir"] {
        let spec = bash(&dirs.workspace, &script).map_dir(&dirs.outside, target);
        let error = run(&spec, SandboxMode::Managed).await.unwrap_err();
        assert!(matches!(error, SandboxError::Unenforceable { .. }), "{target}: {error:?}");
    }
    assert!(!marker.exists(), "nothing ran");
    // The legitimate neighbour: the same command without a bad mapping runs.
    let spec = bash(&dirs.workspace, &script).map_dir(&dirs.outside, "/keel-map-x");
    assert!(run(&spec, SandboxMode::Managed).await.unwrap().termination.success());
    assert!(marker.exists());
}
