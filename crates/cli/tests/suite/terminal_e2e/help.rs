//! `--help`: every flag it lists is in the README, and each command lists only the flags
//! it honours (the others are usage errors).

use crate::suite::support::{Env, repo_root, stderr, stdout};

/// The long flags `keel ARGS --help` lists.
fn help_flags(env: &Env, args: &[&str]) -> std::collections::BTreeSet<String> {
    let mut args = args.to_vec();
    args.push("--help");
    let help = stdout(&env.run(&args));
    help.lines()
        .map(str::trim_start)
        // Option lines: `-C, --workspace <DIR>  description` (not `- value: …`).
        .filter(|line| line.starts_with('-') && !line.starts_with("- "))
        .map(|line| line.split("  ").next().unwrap_or(line))
        .flat_map(|line| line.split([' ', ',']))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .filter(|flag| !matches!(*flag, "--help" | "--version"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_flag_in_help_is_in_the_readme() {
    let env = Env::new();
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    for command in
        ["run", "resume", "sessions", "log", "stop", "compact", "seal", "acp", "wake", "config"]
    {
        let flags = help_flags(&env, &[command]);
        assert!(!flags.is_empty(), "{command}: {}", stdout(&env.run(&[command, "--help"])));
        for flag in &flags {
            assert!(readme.contains(flag.as_str()), "`keel {command} {flag}` is not in README.md");
        }
    }
}

#[test]
fn each_command_help_lists_only_the_flags_it_honours() {
    let env = Env::new();
    let model = ["--model", "--base-url", "--context-window"];
    let envelope = ["--mode", "--reads", "--writes", "--forbid"];
    let consent = ["--sandbox", "--approval"];
    let budget = ["--max-steps", "--max-tokens", "--max-cost-usd", "--max-time"];
    let output = ["--json", "--output-format", "--quiet", "--verbose"];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        // The workspace is each ACP session's cwd, and stdout is the protocol's.
        (
            "acp",
            [
                &model[..],
                &envelope,
                &consent,
                &budget,
                &["--output-schema", "--permission-timeout"],
            ]
            .concat(),
        ),
        // A woken session keeps its workspace, mode and envelope.
        ("wake", [&model[..], &consent, &budget, &output, &["--output-schema"]].concat()),
        // Compaction asks the model for a summary; nothing else runs.
        ("compact", [&model[..], &["--last"]].concat()),
        // What the settings would be: every setting flag, nothing about output.
        ("config", [&model[..], &envelope, &consent, &budget, &["--workspace"]].concat()),
    ];
    for (command, honoured) in cases {
        let mut expected: std::collections::BTreeSet<String> =
            honoured.iter().map(|flag| (*flag).to_owned()).collect();
        expected.insert("--config".into());
        assert_eq!(help_flags(&env, &[command]), expected, "keel {command} --help");
    }
    // The neighbour: run and resume still take every group.
    for command in ["run", "resume"] {
        let flags = help_flags(&env, &[command]);
        for flag in model.iter().chain(&envelope).chain(&consent).chain(&budget).chain(&output) {
            assert!(flags.contains(*flag), "keel {command} --help lacks {flag}");
        }
        assert!(flags.contains("--workspace"), "keel {command}");
    }
    // A flag a command does not take is a usage error, not silently ignored.
    for args in [
        &["acp", "-C", "/tmp"][..],
        &["acp", "--json"],
        &["wake", "wake_x", "--mode", "plan"],
        &["wake", "wake_x", "-C", "/tmp"],
        &["compact", "--last", "--approval", "auto"],
        &["config", "--output-format", "json"],
    ] {
        let refused = env.run(args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {}", stderr(&refused));
        assert!(stderr(&refused).contains("unexpected argument"), "{args:?}: {}", stderr(&refused));
    }
    // What `keel config` takes it shows: --context-window as a flag's setting.
    let shown = stdout(&env.run(&["config", "--context-window", "5000"]));
    let row = shown.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "context_window").then(|| value.trim().to_owned())
    });
    assert_eq!(row.as_deref(), Some("5000  # flag --context-window"), "{shown}");
}
