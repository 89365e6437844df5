//! Red-team attempts with the real `keel` binary (issue #11, items 3, 5 and 6): `kill -9`
//! of keel while a managed command runs leaves no process of that command alive, and the
//! plants it made are removed at the next start; secrets in keel's environment never reach
//! a command.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::{Env, scripted, stderr, stdout};

/// A scripted model whose one step is a `bash` call with `arguments`, then "done".
fn bash_model(env: &Env, arguments: Value) -> String {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "bash", "arguments": arguments}]},
        {"text": "done"}
    ]});
    scripted(env, &script.to_string())
}

/// `keel run` of `model` in `ws` in managed mode under `--approval auto`, with `home` as
/// its KEEL_HOME and HOME.
fn managed_run(env: &Env, home: &Path, ws: &Path, model: &str) -> Command {
    let mut command = env.keel();
    command
        .env("KEEL_HOME", home)
        .env("HOME", home)
        .args(["run", "-C", ws.to_str().unwrap(), "-m", model, "--approval", "auto"])
        .args(["--sandbox", "managed", "t"]);
    command
}

/// Runs `keel run` in managed mode with one `bash` call, in the background.
fn spawn_run(env: &Env, ws: &Path, command: &str) -> Child {
    let model = bash_model(env, json!({"command": command, "timeout_ms": 600_000}));
    managed_run(env, env.home.path(), ws, &model)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_for_file(path: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("keel exited before the command started: {status}");
        }
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Host pids of live processes whose working directory is inside `ws`.
fn processes_in(ws: &Path) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie =
            stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if cwd.starts_with(ws) && !zombie {
            found.push((pid, stat));
        }
    }
    found
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git").args(args).current_dir(dir).status().unwrap();
    assert!(status.success(), "git {args:?}");
}

#[test]
fn redteam_orphans_kill9_of_keel_kills_every_sandboxed_process() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    // A writer double-forked away from the shell, a detached sleeper, a forked python
    // child, and the foreground: every way a command tries to outlive its parent.
    let command = "( ( while true; do date +%s%N >> tick.txt; sleep 0.05; done ) & ) ; \
                   nohup sleep 300 >/dev/null 2>&1 & \
                   python3 -c 'import os, time; os.fork(); time.sleep(300)' & \
                   sleep 0.3; echo up > started.txt; sleep 300";
    let mut keel = spawn_run(&env, &ws, command);
    wait_for_file(&ws.join("started.txt"), &mut keel);
    let before = processes_in(&ws);
    assert!(before.len() >= 5, "the command's processes are running: {before:?}");

    keel.kill().unwrap(); // SIGKILL
    keel.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));

    let alive = processes_in(&ws);
    assert!(alive.is_empty(), "processes of the command outlived keel: {alive:?}");
    let size = std::fs::metadata(ws.join("tick.txt")).unwrap().len();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::metadata(ws.join("tick.txt")).unwrap().len(), size, "still writing");

    // The neighbour: the next run in the same workspace works normally.
    let next = spawn_run(&env, &ws, "echo again > again.txt");
    let output = next.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(std::fs::read_to_string(ws.join("again.txt")).unwrap(), "again\n");
}

#[test]
fn redteam_orphans_plants_of_a_killed_keel_are_removed_at_the_next_start() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    git(&ws, &["init", "-q", "."]);
    let mut keel = spawn_run(
        &env,
        &ws,
        "echo ../evil > .git/commondir; mkdir -p .git/worktrees/evil; echo up > started.txt; sleep 300",
    );
    wait_for_file(&ws.join("started.txt"), &mut keel);
    keel.kill().unwrap();
    keel.wait().unwrap();
    assert!(ws.join(".git/commondir").exists(), "keel died before it could repair");

    // The next start repairs first (the CLI calls keel_sandbox::recover_plants).
    let next = spawn_run(&env, &ws, "git status --short >/dev/null && echo clean > after.txt");
    let output = next.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!ws.join(".git/commondir").exists(), "{}", stdout(&output));
    assert!(
        stderr(&output).contains(".git/commondir, which would redirect git to another config"),
        "the repair is reported at start: {}",
        stderr(&output)
    );
    assert!(!ws.join(".git/worktrees/evil").exists());
    assert_eq!(std::fs::read_to_string(ws.join("after.txt")).unwrap(), "clean\n");
}

#[test]
fn redteam_env_secrets_in_keels_environment_never_reach_a_command() {
    let env = Env::new();
    let ws = env.workspace();
    let model = bash_model(&env, json!({"command": "env > env.txt"}));
    let output = managed_run(&env, env.home.path(), &ws, &model)
        .env("DATABASE_URL", "postgres://user:hunter2@db/prod")
        .env("GITHUB_TOKEN", "ghp_secret")
        .env("SENTRY_DSN", "https://key@sentry.io/1")
        .env("AWS_ACCESS_KEY_ID", "AKIASECRET")
        .env("MY_SERVICE_CREDS", "opaque-secret")
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let seen = std::fs::read_to_string(ws.join("env.txt")).unwrap();
    for secret in ["hunter2", "ghp_secret", "sentry.io", "AKIASECRET", "opaque-secret"] {
        assert!(!seen.contains(secret), "{secret} reached the command:\n{seen}");
    }
    // The neighbour: the allow-listed variables are there.
    assert!(seen.lines().any(|line| line.starts_with("PATH=")), "{seen}");
    assert!(seen.lines().any(|line| line.starts_with("HOME=")), "{seen}");
    assert!(seen.lines().any(|line| line == "LC_ALL=C"), "{seen}");
}

/// The plant notes under `ws/.keel/sandbox`.
fn plant_notes(ws: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(ws.join(".keel/sandbox")) else { return Vec::new() };
    entries.flatten().map(|entry| entry.path()).collect()
}

/// Two keels with different `KEEL_HOME`s (so different note keys) in one workspace: the
/// second cannot verify the first's plant note, and must neither act on it nor remove it
/// while the first still runs its command, or a `kill -9` of the first would then leave its
/// plants unrepaired. (Found by a fresh-eyes review: six parallel runs with fresh homes.)
#[test]
fn redteam_orphans_a_keel_with_another_home_keeps_a_live_runs_plant_note() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    git(&ws, &["init", "-q", "."]);
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    let mut first = spawn_run(
        &env,
        &ws,
        "echo up > started.txt; while [ ! -e go.txt ]; do sleep 0.05; done; \
         echo ../evil > .git/commondir; echo planted > planted.txt; sleep 300",
    );
    wait_for_file(&ws.join("started.txt"), &mut first);
    let notes = plant_notes(&ws);
    assert_eq!(notes.len(), 1, "the first run's durable note: {notes:?}");

    // The second keel, its own home, a managed command of its own in the same workspace.
    let other_home = tempfile::tempdir().unwrap();
    let model = bash_model(&env, json!({"command": "echo second > second.txt"}));
    let second = managed_run(&env, other_home.path(), &ws, &model).output().unwrap();
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(std::fs::read_to_string(ws.join("second.txt")).unwrap(), "second\n");
    assert!(!stderr(&second).contains("plants-"), "{}", stderr(&second));
    assert_eq!(plant_notes(&ws), notes, "the live run's note is kept");

    // The first command plants now, and its keel dies: its own home's next start repairs
    // from the note that was kept.
    std::fs::write(ws.join("go.txt"), "").unwrap();
    wait_for_file(&ws.join("planted.txt"), &mut first);
    assert!(ws.join(".git/commondir").exists());
    first.kill().unwrap();
    first.wait().unwrap();
    let next = spawn_run(&env, &ws, "echo clean > after.txt");
    let output = next.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!ws.join(".git/commondir").exists(), "{}", stderr(&output));
    assert!(plant_notes(&ws).is_empty());
}
