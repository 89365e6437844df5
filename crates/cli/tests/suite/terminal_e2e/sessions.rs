//! The session habits: `keel sessions` filtered by folder and limited, with zoned times,
//! and `--last` for `stop`, `resume` and `seal`.

use crate::suite::support::{Env, scripted, stderr, stdout};

#[test]
fn sessions_show_the_workspace_filter_by_dir_and_limit_with_zoned_times() {
    let env = Env::new();
    let model = scripted(
        &env,
        r#"{"steps":[{"tool_calls":[{"name":"bash","arguments":{"command":"true"}}]},{"text":"hi"}]}"#,
    );
    let a = env.scratch.path().join("a");
    let b = env.scratch.path().join("b");
    for dir in [&a, &b, &a] {
        std::fs::create_dir_all(dir).unwrap();
        let output = env.run_t(dir, &model, &["--approval", "sandboxed"]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        // The sandbox made .keel/ for the command (so it could not plant one); keel
        // leaves no empty folder behind.
        assert!(!dir.join(".keel").exists(), "{}", dir.display());
    }
    // The neighbour: a .keel/ the user made stays, even empty.
    let own = env.scratch.path().join("own");
    std::fs::create_dir_all(own.join(".keel")).unwrap();
    let output = env.run_t(&own, &model, &["--approval", "sandboxed"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(own.join(".keel").is_dir());
    let all = stdout(&env.run(&["sessions", "-C", env.scratch.path().to_str().unwrap()]));
    assert_eq!(all.lines().count(), 4, "{all}");
    let all: String =
        all.lines().filter(|l| !l.contains("/own")).map(|l| format!("{l}\n")).collect();
    assert_eq!(all.lines().count(), 3, "{all}");
    let a_canonical = a.canonicalize().unwrap();
    let only_a = stdout(&env.run(&["sessions", "-C", a.to_str().unwrap()]));
    assert_eq!(only_a.lines().count(), 2, "{only_a}");
    assert!(only_a.lines().all(|line| line.contains(a_canonical.to_str().unwrap())), "{only_a}");
    let limited = stdout(&env.run(&["sessions", "--limit", "2"]));
    assert_eq!(limited.lines().count(), 2, "{limited}");
    assert!(limited.lines().next().unwrap().contains("/own"), "newest first: {limited}");
    // Times carry their zone (UTC offset).
    let first = all.lines().next().unwrap();
    assert!(
        first.split_whitespace().any(|word| word.len() == 6
            && (word.starts_with('+') || word.starts_with('-'))
            && word.as_bytes()[3] == b':'),
        "{first}"
    );
}

#[test]
fn stop_without_an_active_run_says_so_and_exits_1() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"hi"}]}"#);
    assert_eq!(env.run_t(&ws, &model, &[]).status.code(), Some(0));
    let output = env.run(&["stop", "--last"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("has no active run (it is completed)"), "{}", stderr(&output));
    // --last works for resume, compact and seal too.
    let resumed = env.run(&["resume", "--last", "again"]);
    assert_eq!(resumed.status.code(), Some(1), "{}", stderr(&resumed));
    assert!(stderr(&resumed).contains("script"), "{}", stderr(&resumed));
    let sealed = env.run(&["seal", "--last"]);
    assert_eq!(sealed.status.code(), Some(0), "{}", stderr(&sealed));
    assert!(stdout(&env.run(&["sessions"])).contains("sealed"));
}
