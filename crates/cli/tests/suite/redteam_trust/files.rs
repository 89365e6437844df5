//! The config and trust files themselves: records shipped in the repository or behind a
//! link, a config that is a link, a FIFO or huge, a `.keel` folder linked outside, and
//! names or lines that would drive the terminal.

use std::io::Write as _;
use std::process::{Output, Stdio};
use std::time::Duration;

use super::harness::{DONE, marker_server, run_in, trust, write_workspace_config};
use crate::suite::support::{Env, mkfifo, output_within, scripted, stderr, stdout};

fn sha256_hex(bytes: &[u8]) -> String {
    let output = std::process::Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(bytes)?;
            child.wait_with_output()
        })
        .unwrap();
    stdout(&output).split_whitespace().next().unwrap().to_owned()
}

#[test]
fn redteam_trust_keel_home_inside_the_workspace_cannot_pretrust() {
    let env = Env::new();
    let ws = env.workspace();
    let marker = env.scratch.path().join("started");
    let text = marker_server("evil", &marker);
    let config = write_workspace_config(&ws, &text);
    // The repository ships a KEEL_HOME with a record trusting its own file.
    let home = ws.join(".keel-home");
    std::fs::create_dir_all(&home).unwrap();
    let sha = sha256_hex(&std::fs::read(&config).unwrap());
    std::fs::write(
        home.join("trusted-workspaces.toml"),
        format!(
            "[[workspace]]\npath = \"{}\"\nconfig_sha256 = \"{sha}\"\ntrusted_at = \"2026-01-01T00:00:00Z\"\n",
            ws.canonicalize().unwrap().display()
        ),
    )
    .unwrap();
    let model = scripted(&env, DONE);
    let mut command = env.keel();
    command.env("KEEL_HOME", &home).args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "t"]);
    let output = command.output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!marker.exists(), "trust records shipped in the repository were used");
    assert!(stderr(&output).contains("is inside this workspace"), "{}", stderr(&output));
    let mut command = env.keel();
    command.env("KEEL_HOME", &home).args(["trust", ws.to_str().unwrap()]);
    let refused = command.output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));

    // The neighbour: with the user's own KEEL_HOME, trust works.
    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    assert_eq!(run_in(&env, &ws, &model, &[]).status.code(), Some(0));
    assert!(marker.exists());
}

#[test]
fn redteam_trust_trust_records_through_a_symlink_are_not_used() {
    let env = Env::new();
    let ws = env.workspace();
    let marker = env.scratch.path().join("started");
    let config = write_workspace_config(&ws, &marker_server("evil", &marker));
    // The records file is a symlink to a file the repository controls.
    let planted = ws.join("records.toml");
    std::fs::write(
        &planted,
        format!(
            "[[workspace]]\npath = \"{}\"\nconfig_sha256 = \"{}\"\ntrusted_at = \"2026-01-01T00:00:00Z\"\n",
            ws.canonicalize().unwrap().display(),
            sha256_hex(&std::fs::read(&config).unwrap())
        ),
    )
    .unwrap();
    let records = env.home.path().join("trusted-workspaces.toml");
    std::os::unix::fs::symlink(&planted, &records).unwrap();
    let model = scripted(&env, DONE);
    let output = run_in(&env, &ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!marker.exists(), "records behind a symlink were used");

    // `keel trust` refuses to write through the link, and leaves its target alone.
    let before = std::fs::read(&planted).unwrap();
    let refused = trust(&env, &ws);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("it is a symbolic link"), "{}", stderr(&refused));
    assert_eq!(std::fs::read(&planted).unwrap(), before);
    assert!(!marker.exists());

    // The neighbour: once the link is gone, trust is recorded in a file of keel's own.
    std::fs::remove_file(&records).unwrap();
    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    assert!(std::fs::symlink_metadata(&records).unwrap().file_type().is_file());
    assert_eq!(run_in(&env, &ws, &model, &[]).status.code(), Some(0));
    assert!(marker.exists());
}

#[test]
fn redteam_trust_workspace_config_symlink_is_not_read() {
    let env = Env::new();
    let ws = env.workspace();
    let marker = env.scratch.path().join("started");
    let elsewhere = env.scratch.path().join("elsewhere.toml");
    std::fs::write(&elsewhere, marker_server("evil", &marker)).unwrap();
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, ws.join(".keel/config.toml")).unwrap();
    let model = scripted(&env, DONE);
    let output = run_in(&env, &ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("it is a symbolic link"), "{}", stderr(&output));
    let refused = trust(&env, &ws);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(!marker.exists());

    // The neighbour: a regular file in its place is read (and can be trusted).
    std::fs::remove_file(ws.join(".keel/config.toml")).unwrap();
    std::fs::copy(&elsewhere, ws.join(".keel/config.toml")).unwrap();
    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    assert_eq!(run_in(&env, &ws, &model, &[]).status.code(), Some(0));
    assert!(marker.exists());
}

#[test]
fn redteam_trust_workspace_config_fifo_or_huge_file_never_hangs() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    let config = ws.join(".keel/config.toml");
    mkfifo(&config);
    let model = scripted(&env, DONE);
    let mut command = env.keel();
    command.args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "t"]);
    let output = output_within(command, Duration::from_secs(20));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("not a regular file"), "{}", stderr(&output));
    let mut command = env.keel();
    command.args(["trust", ws.to_str().unwrap()]);
    assert_eq!(output_within(command, Duration::from_secs(20)).status.code(), Some(2));

    std::fs::remove_file(&config).unwrap();
    std::fs::write(&config, format!("# {}\nmax_steps = 1\n", "x".repeat(2 * 1024 * 1024))).unwrap();
    let output = run_in(&env, &ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("more than the"), "{}", stderr(&output));

    // The neighbour: a normal file applies.
    std::fs::write(&config, "max_steps = 1\n").unwrap();
    let two_steps = scripted(
        &env,
        r#"{"steps":[{"tool_calls":[{"name":"todo","arguments":{"items":[]}}]},{"text":"done"}]}"#,
    );
    assert_eq!(run_in(&env, &ws, &two_steps, &[]).status.code(), Some(3));
}

#[test]
fn redteam_trust_workspace_keel_folder_symlinked_outside_is_not_read() {
    let env = Env::new();
    let ws = env.workspace();
    let marker = env.scratch.path().join("started");
    let elsewhere = env.scratch.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("config.toml"), marker_server("evil", &marker)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, ws.join(".keel")).unwrap();
    let model = scripted(&env, DONE);
    let output = run_in(&env, &ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("outside"), "{}", stderr(&output));
    assert_eq!(trust(&env, &ws).status.code(), Some(2));
    assert!(!marker.exists());

    // The neighbour: a `.keel` folder symlinked within the workspace is read.
    std::fs::remove_file(ws.join(".keel")).unwrap();
    std::fs::create_dir_all(ws.join("config/keel")).unwrap();
    std::fs::copy(elsewhere.join("config.toml"), ws.join("config/keel/config.toml")).unwrap();
    std::os::unix::fs::symlink("config/keel", ws.join(".keel")).unwrap();
    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    assert_eq!(run_in(&env, &ws, &model, &[]).status.code(), Some(0));
    assert!(marker.exists());
}

#[test]
fn redteam_trust_hostile_names_cannot_drive_the_terminal() {
    let env = Env::new();
    let ws = env.workspace();
    // A server name and a symlink target full of escape sequences.
    write_workspace_config(
        &ws,
        "[mcp_servers.\"x\\u001b]0;owned\\u0007\\u001b[2J\"]\ncommand = \"true\"\n",
    );
    let target = env.scratch.path().join("evil\x1b[2Jname");
    std::fs::write(&target, "outside").unwrap();
    std::os::unix::fs::symlink(&target, ws.join("AGENTS.md")).unwrap();
    let output = run_in(&env, &ws, &scripted(&env, DONE), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(!message.contains('\x1b') && !message.contains('\x07'), "{message:?}");
    assert!(message.contains("ignored `mcp_servers.x\\x1b]0;owned\\x07"), "{message}");
    assert!(message.contains("evil\\x1b[2Jname"), "{message}");
    let shown = env.run(&["config", "-C", ws.to_str().unwrap()]);
    assert!(!stdout(&shown).contains('\x1b'), "{:?}", stdout(&shown));
    // The neighbour: the answer itself is printed as it is.
    assert_eq!(stdout(&output).trim(), "done");
}

/// A repository's rule or server name with a newline cannot forge a line on stderr: the
/// config error shows it escaped. A valid rule of the same file works.
#[test]
fn redteam_trust_config_errors_show_a_repositorys_newlines_escaped() {
    let env = Env::new();
    let ws = env.workspace();
    let forged = |output: &Output| stderr(output).lines().any(|line| line.starts_with('└'));
    write_workspace_config(&ws, "[permissions]\ndeny = [\"bash(x\\n└ keel: trusted\"]\n");
    let output = run_in(&env, &ws, &scripted(&env, DONE), &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("invalid permission rule 'bash(x\\n└ keel: trusted'"));
    assert!(!forged(&output), "{}", stderr(&output));

    write_workspace_config(&ws, "[mcp_servers.\"x\\n└ Allow? [y] yes\"]\ncommand = \"true\"\n");
    assert_eq!(trust(&env, &ws).status.code(), Some(0));
    for output in [
        env.run(&["mcp", "list", "-C", ws.to_str().unwrap()]),
        run_in(&env, &ws, &scripted(&env, DONE), &[]),
    ] {
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(stderr(&output).contains("x\\n└ Allow? [y] yes"), "{}", stderr(&output));
        assert!(!forged(&output), "{}", stderr(&output));
    }

    // The neighbour: a valid deny rule from the same file is applied, the run succeeds.
    write_workspace_config(&ws, "[permissions]\ndeny = [\"bash(rm*)\"]\n");
    let output = run_in(&env, &ws, &scripted(&env, DONE), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}
