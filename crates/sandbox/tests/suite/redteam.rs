//! Red-team attempts against the managed boundary at the sandbox level (issue #11, items
//! 3, 5 and 6): protected paths through aliases and links, plants on every exit path,
//! what a command inherits and can read, set-id bits, and processes that try to outlive
//! the call. Each attempt asserts that it is blocked on the host *and* that the legitimate
//! neighbour still works.

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keel_sandbox::{CommandOutput, CommandSpec, SandboxMode, Termination, recover_plants, run};

/// `T/ws` is a git repository with one commit; `T/outside` is outside every boundary.
struct Repo {
    _dir: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    outside: PathBuf,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let root = base.join("ws");
        let outside = base.join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        git(&root, &["init", "-q", "."]);
        std::fs::write(root.join("a.txt"), "a\n").unwrap();
        git(&root, &["add", "a.txt"]);
        git(&root, &["-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init"]);
        Repo { _dir: dir, base, root, outside }
    }

    fn spec(&self, script: &str) -> CommandSpec {
        CommandSpec::new("bash", &self.root, Duration::from_secs(30)).arg("-c").arg(script)
    }

    async fn sh(&self, script: &str) -> CommandOutput {
        run(&self.spec(script), SandboxMode::Managed).await.unwrap()
    }

    fn read(&self, relative: &str) -> String {
        std::fs::read_to_string(self.root.join(relative)).unwrap()
    }

    /// The legitimate neighbour of every git attack: a commit inside the sandbox works.
    async fn assert_commit_works(&self) {
        let out = self
            .sh("echo more >> a.txt && git -c user.name=t -c user.email=t@e commit -qam more \
                 && git log --oneline | wc -l")
            .await;
        assert_eq!(out.stdout.text.trim(), "2", "{out:?}");
    }
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git").args(args).current_dir(dir).status().unwrap();
    assert!(status.success(), "git {args:?}");
}

fn all_notes(out: &CommandOutput) -> String {
    out.notes.join("\n")
}

// ---- Item 3: protected paths through every alias -------------------------------------

#[tokio::test]
async fn redteam_alias_proc_self_cwd_git_config() {
    let repo = Repo::new();
    let before = repo.read(".git/config");
    let out = repo
        .sh("printf '[core]\\n\\tfsmonitor = touch /tmp/x\\n' >> /proc/self/cwd/.git/config; \
             echo hook > /proc/$$/cwd/.git/hooks/pre-commit; \
             echo fine > /proc/self/cwd/normal.txt; cat normal.txt")
        .await;
    assert_eq!(repo.read(".git/config"), before);
    assert!(!repo.root.join(".git/hooks/pre-commit").exists());
    assert_eq!(out.stdout.text, "fine\n");
}

#[tokio::test]
async fn redteam_alias_symlink_to_git_config() {
    let repo = Repo::new();
    let before = repo.read(".git/config");
    repo.sh("ln -s .git/config c && printf '[core]\\n\\tfsmonitor = x\\n' >> c; \
             ln -s .git/hooks h && echo evil > h/post-checkout")
        .await;
    assert_eq!(repo.read(".git/config"), before);
    assert!(!repo.root.join(".git/hooks/post-checkout").exists());
    repo.assert_commit_works().await;
}

#[tokio::test]
async fn redteam_alias_hard_link_made_by_the_command() {
    let repo = Repo::new();
    let before = repo.read(".git/config");
    let out = repo
        .sh("ln .git/config hl 2>&1 || echo refused; [ -e hl ] && echo >> hl; \
             ln a.txt b.txt && echo linked")
        .await;
    assert!(out.stdout.text.contains("refused"), "{out:?}");
    assert!(!repo.root.join("hl").exists());
    assert_eq!(repo.read(".git/config"), before);
    assert!(out.stdout.text.contains("linked"), "an ordinary hard link works: {out:?}");
}

#[tokio::test]
async fn redteam_alias_hard_link_that_existed_before() {
    let repo = Repo::new();
    std::fs::hard_link(repo.root.join(".git/config"), repo.root.join("config-alias")).unwrap();
    let hook = repo.root.join(".git/hooks/pre-commit");
    std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::hard_link(&hook, repo.root.join("hook-alias")).unwrap();
    let before = repo.read(".git/config");
    let out = repo
        .sh("printf '[core]\\n\\tfsmonitor = x\\n' >> config-alias; echo 'touch /tmp/p' >> hook-alias")
        .await;
    assert_eq!(repo.read(".git/config"), before);
    assert_eq!(repo.read(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n");
    assert!(all_notes(&out).contains("hard links; gave it a private copy"), "{out:?}");
    assert_eq!(std::fs::metadata(repo.root.join(".git/config")).unwrap().nlink(), 1);
    repo.assert_commit_works().await;
}

#[tokio::test]
async fn redteam_link_protected_config_that_is_a_symlink() {
    let repo = Repo::new();
    let real = repo.root.join("gitconfig.txt");
    std::fs::rename(repo.root.join(".git/config"), &real).unwrap();
    symlink("../gitconfig.txt", repo.root.join(".git/config")).unwrap();
    let before = std::fs::read_to_string(&real).unwrap();
    let out = repo
        .sh("printf '[core]\\n\\tfsmonitor = x\\n' >> gitconfig.txt; \
             rm -f .git/config && printf '[core]\\n\\tfsmonitor = touch /tmp/y\\n' > .git/config; \
             git status --short >/dev/null; echo done")
        .await;
    assert!(out.stdout.text.contains("done"), "{out:?}");
    assert_eq!(std::fs::read_to_string(&real).unwrap(), before, "the link's target is read-only");
    let link = std::fs::read_link(repo.root.join(".git/config")).unwrap();
    assert_eq!(link, Path::new("../gitconfig.txt"), "the link itself was put back");
    assert!(all_notes(&out).contains("changed the protected link"), "{out:?}");
    repo.assert_commit_works().await;
}

#[tokio::test]
async fn redteam_link_hooks_directory_that_is_a_symlink() {
    let repo = Repo::new();
    std::fs::create_dir_all(repo.root.join("tools/hooks")).unwrap();
    std::fs::remove_dir_all(repo.root.join(".git/hooks")).unwrap();
    symlink("../tools/hooks", repo.root.join(".git/hooks")).unwrap();
    repo.sh("echo evil > tools/hooks/pre-commit; \
             rm .git/hooks && mkdir .git/hooks && echo evil > .git/hooks/pre-commit; \
             echo ok > tools/readme.txt")
        .await;
    assert!(!repo.root.join("tools/hooks/pre-commit").exists());
    assert_eq!(
        std::fs::read_link(repo.root.join(".git/hooks")).unwrap(),
        Path::new("../tools/hooks")
    );
    assert!(!repo.root.join("tools/hooks/pre-commit").exists());
    assert_eq!(repo.read("tools/readme.txt"), "ok\n", "the rest of tools/ stays writable");
}

/// Unmounts a bind mount made by a test when dropped.
struct BindGuard(PathBuf);

impl Drop for BindGuard {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test]
async fn redteam_alias_second_bind_mount_of_the_workspace() {
    let repo = Repo::new();
    let alias = repo.base.join("alias");
    std::fs::create_dir_all(&alias).unwrap();
    let status = Command::new("mount").arg("--bind").arg(&repo.root).arg(&alias).status().unwrap();
    assert!(status.success(), "tests run as root: a bind mount must work");
    let _guard = BindGuard(alias.clone());
    let before = repo.read(".git/config");
    let spec = repo
        .spec(&format!(
            "printf '[core]\\n\\tfsmonitor = x\\n' >> {a}/.git/config; echo evil > {a}/.git/hooks/pre-push; \
             mkdir -p {a}/.keel && echo 'x' > {a}/.keel/config.toml; echo fine > {a}/via-alias.txt",
            a = alias.display()
        ));
    run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(repo.read(".git/config"), before);
    assert!(!repo.root.join(".git/hooks/pre-push").exists());
    assert!(!repo.root.join(".keel/config.toml").exists());
    assert_eq!(repo.read("via-alias.txt"), "fine\n", "the alias still shows a writable workspace");
}

#[tokio::test]
async fn redteam_alias_symlink_to_the_workspace_elsewhere() {
    let repo = Repo::new();
    let link = repo.outside.join("ws-link");
    symlink(&repo.root, &link).unwrap();
    let before = repo.read(".git/config");
    repo.sh(&format!(
        "echo x >> {l}/.git/config; echo evil > {l}/.git/hooks/pre-commit; echo ok > {l}/new.txt",
        l = link.display()
    ))
    .await;
    assert_eq!(repo.read(".git/config"), before);
    assert!(!repo.root.join(".git/hooks/pre-commit").exists());
    assert_eq!(repo.read("new.txt"), "ok\n");
}

#[tokio::test]
async fn redteam_alias_working_directory_inside_the_git_directory() {
    let repo = Repo::new();
    let before = repo.read(".git/config");
    let spec = CommandSpec::new("bash", repo.root.join(".git"), Duration::from_secs(30))
        .workspace(&repo.root)
        .arg("-c")
        .arg("echo x >> config; echo evil > hooks/pre-commit; echo ok > ../from-git-dir.txt");
    run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(repo.read(".git/config"), before);
    assert!(!repo.root.join(".git/hooks/pre-commit").exists());
    assert_eq!(repo.read("from-git-dir.txt"), "ok\n");
}

#[tokio::test]
async fn redteam_alias_proc_pid_root_of_processes_outside() {
    let repo = Repo::new();
    let before = repo.read(".git/config");
    let outsider = std::process::id();
    let out = repo
        .sh(&format!(
            "for pid in 1 {outsider}; do echo x >> /proc/$pid/root{ws}/.git/config; \
             echo x >> /proc/$pid/cwd/.git/config; done 2>/dev/null; \
             echo fine > /proc/self/root{ws}/via-own-root.txt; cat via-own-root.txt",
            ws = repo.root.display()
        ))
        .await;
    assert_eq!(repo.read(".git/config"), before);
    assert_eq!(out.stdout.text, "fine\n", "{out:?}");
}

// ---- Item 3: config-named files, every spelling ---------------------------------------

#[tokio::test]
async fn redteam_hookspath_every_spelling() {
    for (config, dir) in [
        ("[core] hooksPath = .hooks-a\n", ".hooks-a"),
        ("[CORE]\n\tHOOKSPATH = \".hooks-b\" ; shared\n", ".hooks-b"),
        ("[core]\n\thooksPath = .hoo\\\nks-c # continued\n", ".hooks-c"),
        ("[core]\n\thooksPath = ~/.hooks-d\n", ".hooks-d"),
    ] {
        let repo = Repo::new();
        std::fs::OpenOptions::new()
            .append(true)
            .open(repo.root.join(".git/config"))
            .and_then(|mut file| std::io::Write::write_all(&mut file, config.as_bytes()))
            .unwrap();
        // HOME is the workspace, so `~/.hooks-d` lies inside it.
        let spec = repo
            .spec(&format!("mkdir -p {dir}; echo evil > {dir}/pre-commit; echo ok > ok.txt"))
            .env("HOME", &repo.root);
        run(&spec, SandboxMode::Managed).await.unwrap();
        assert!(!repo.root.join(dir).join("pre-commit").exists(), "{config:?}");
        assert_eq!(repo.read("ok.txt"), "ok\n");
    }
}

#[tokio::test]
async fn redteam_include_path_files_are_protected() {
    let repo = Repo::new();
    std::fs::create_dir_all(repo.root.join("tools")).unwrap();
    std::fs::write(repo.root.join("tools/git.inc"), "[core]\n\thooksPath = tools/hooks\n").unwrap();
    let config = format!(
        "{}[include]\n\tpath = ../tools/git.inc\n[includeIf \"onbranch:main\"]\n\tpath = ../later.inc\n",
        repo.read(".git/config")
    );
    std::fs::write(repo.root.join(".git/config"), config).unwrap();
    let out = repo
        .sh("printf '[core]\\n\\tfsmonitor = x\\n' >> tools/git.inc; \
             mkdir -p tools/hooks; echo evil > tools/hooks/pre-commit; \
             printf '[core]\\n\\tfsmonitor = touch /tmp/z\\n' > later.inc; echo ok > tools/other.txt")
        .await;
    assert_eq!(repo.read("tools/git.inc"), "[core]\n\thooksPath = tools/hooks\n");
    assert!(!repo.root.join("tools/hooks/pre-commit").exists());
    assert!(!repo.root.join("later.inc").exists(), "a planted include is removed");
    assert!(all_notes(&out).contains("later.inc"), "{out:?}");
    assert_eq!(repo.read("tools/other.txt"), "ok\n");
}

#[tokio::test]
async fn redteam_fifo_where_a_config_should_be_is_skipped() {
    let repo = Repo::new();
    let config = format!("{}[include]\n\tpath = fifo.inc\n", repo.read(".git/config"));
    std::fs::write(repo.root.join(".git/config"), config).unwrap();
    let status = Command::new("mkfifo").arg(repo.root.join(".git/fifo.inc")).status().unwrap();
    assert!(status.success());
    std::fs::remove_file(repo.root.join(".git/config.worktree")).ok();
    let status =
        Command::new("mkfifo").arg(repo.root.join(".git/config.worktree")).status().unwrap();
    assert!(status.success());
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(20), repo.sh("echo ran"))
        .await
        .expect("a FIFO config must never hang the run");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out.stdout.text, "ran\n");
    assert!(all_notes(&out).contains("not a regular file"), "{out:?}");
}

#[tokio::test]
async fn redteam_keel_home_inside_the_workspace() {
    let repo = Repo::new();
    std::fs::create_dir_all(repo.root.join(".local/share/keel")).unwrap();
    std::fs::write(repo.root.join(".local/share/keel/config.toml"), "model = \"x\"\n").unwrap();
    let spec = repo
        .spec(
            "echo 'base_url = \"http://evil\"' >> .local/share/keel/config.toml; \
               echo ok > .local/other.txt",
        )
        .env("HOME", &repo.root);
    run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(repo.read(".local/share/keel/config.toml"), "model = \"x\"\n");
    assert_eq!(repo.read(".local/other.txt"), "ok\n");
}

#[tokio::test]
async fn redteam_outside_symlinked_worktrees_and_modules_are_not_written() {
    let repo = Repo::new();
    let modules = repo.outside.join("modules");
    let fake = modules.join("sub");
    std::fs::create_dir_all(fake.join("objects")).unwrap();
    std::fs::write(fake.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    let worktrees = repo.outside.join("worktrees");
    std::fs::create_dir_all(worktrees.join("wt")).unwrap();
    symlink(&modules, repo.root.join(".git/modules")).unwrap();
    symlink(&worktrees, repo.root.join(".git/worktrees")).unwrap();
    let out = repo.sh("echo ran").await;
    assert_eq!(out.stdout.text, "ran\n");
    assert!(!fake.join("hooks").exists(), "nothing created outside");
    assert!(!fake.join("config.worktree").exists(), "nothing created outside");
    assert!(!worktrees.join("wt/config.worktree").exists(), "nothing created outside");
    assert!(all_notes(&out).contains("is a symbolic link; it was not entered"), "{out:?}");
    repo.assert_commit_works().await;
}

// ---- Issue #13: the cached scan for repositories ---------------------------------------

#[tokio::test]
async fn redteam_sandbox_gitscan_cache_new_repo() {
    let repo = Repo::new();
    std::fs::create_dir_all(repo.root.join("vendor/deep/src")).unwrap();
    std::fs::write(repo.root.join("vendor/deep/src/lib.rs"), "fn f() {}\n").unwrap();
    // The first managed run creates `.keel/`; once every directory is older than the
    // racy margin (module `gitscan`), the next run caches the scan and the one after (and
    // the file tools' check) is answered from the cache.
    assert_eq!(repo.sh("echo ok").await.stdout.text, "ok\n");
    std::thread::sleep(Duration::from_millis(2_100));
    for _ in 0..2 {
        assert_eq!(repo.sh("echo ok").await.stdout.text, "ok\n");
    }
    let hook = |nested: &str| repo.root.join(nested).join(".git/hooks/pre-commit");
    assert_eq!(keel_sandbox::protected_path(&repo.root, &repo.root.join("vendor/x"), None), None);
    // A repository that appears after the scan was cached: one made on the host, and one a
    // sandboxed command makes itself. A later command must find both protected.
    git(&repo.root.join("vendor/deep"), &["init", "-q", "host-made"]);
    let out = repo.sh("git init -q vendor/deep/src/agent-made && echo made").await;
    assert_eq!(out.stdout.text, "made\n", "{out:?}");
    for nested in ["vendor/deep/host-made", "vendor/deep/src/agent-made"] {
        assert!(keel_sandbox::protected_path(&repo.root, &hook(nested), None).is_some());
        let before = repo.read(&format!("{nested}/.git/config"));
        let out = repo
            .sh(&format!(
                "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' >> {nested}/.git/config; \
                 echo 'touch /tmp/pwned' > {nested}/.git/hooks/pre-commit; \
                 echo fine > {nested}/normal.txt; cat {nested}/normal.txt"
            ))
            .await;
        assert_eq!(repo.read(&format!("{nested}/.git/config")), before, "{nested}: {out:?}");
        assert!(!hook(nested).exists(), "{nested}");
        // The neighbours: a normal file in that repository, and a commit in it.
        assert_eq!(out.stdout.text, "fine\n", "{nested}: {out:?}");
        let out = repo
            .sh(&format!(
                "cd {nested} && git add normal.txt && \
                 git -c user.name=t -c user.email=t@e commit -qm one && git log --oneline | wc -l"
            ))
            .await;
        assert_eq!(out.stdout.text.trim(), "1", "{nested}: {out:?}");
    }
    repo.assert_commit_works().await;
}

// ---- Item 3: plants on every exit path ---------------------------------------------------

#[tokio::test]
async fn redteam_plant_worktree_entry_and_commondir() {
    let repo = Repo::new();
    git(&repo.root, &["worktree", "add", "-q", "-b", "side", "../side"]);
    let out = repo
        .sh("mkdir -p .git/worktrees/evil && echo ../.. > .git/worktrees/evil/commondir; \
             echo ../evil > .git/commondir; echo planted")
        .await;
    assert!(out.stdout.text.contains("planted"));
    assert!(!repo.root.join(".git/worktrees/evil").exists());
    assert!(!repo.root.join(".git/commondir").exists());
    assert!(repo.root.join(".git/worktrees/side").is_dir(), "the existing worktree stays");
    repo.assert_commit_works().await;
}

#[tokio::test]
async fn redteam_plant_removed_at_timeout() {
    let repo = Repo::new();
    let spec = CommandSpec::new("bash", &repo.root, Duration::from_millis(700))
        .arg("-c")
        .arg("echo ../evil > .git/commondir; mkdir -p .git/worktrees/t; sleep 30");
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert!(matches!(out.termination, Termination::TimedOut { .. }));
    assert!(!repo.root.join(".git/commondir").exists());
    assert!(!repo.root.join(".git/worktrees").exists());
    let notes = repo.root.join(".keel/sandbox");
    assert!(!notes.exists() || !notes.read_dir().unwrap().any(|_| true), "note deleted");
    repo.assert_commit_works().await;
}

#[tokio::test]
async fn redteam_plant_removed_when_the_call_is_cancelled() {
    let repo = Repo::new();
    let spec = repo.spec(
        "echo ../evil > .git/commondir; ( while true; do echo ../evil > .git/commondir 2>/dev/null; \
         sleep 0.05; done ) & echo started > started.txt; sleep 30",
    );
    let call = run(&spec, SandboxMode::Managed);
    let cancelled = tokio::time::timeout(Duration::from_millis(1500), call).await;
    assert!(cancelled.is_err(), "the call was still running");
    assert_eq!(repo.read("started.txt"), "started\n");
    assert!(!repo.root.join(".git/commondir").exists(), "removed once the namespace was gone");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!repo.root.join(".git/commondir").exists(), "nothing re-planted it");
    repo.assert_commit_works().await;
}

/// The start time of `pid` (clock ticks since boot, /proc/PID/stat field 22), as plant
/// notes record it.
fn started_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// A plant note that keel did not write (one committed to a cloned repository, or forged by
/// a command) names paths to delete or replace anywhere; it is never acted upon, only
/// removed. The genuine note of a keel killed mid-command is repaired at the next start:
/// `redteam_orphans_plants_of_a_killed_keel_are_removed_at_the_next_start` in keel-cli runs it.
#[tokio::test]
async fn redteam_plant_note_forged_or_from_the_repository_is_never_acted_upon() {
    keel_sandbox::set_plant_note_key([7; 32]);
    let repo = Repo::new();
    repo.sh("true").await;
    let notes_dir = repo.root.join(".keel/sandbox");
    std::fs::create_dir_all(&notes_dir).unwrap();
    let victim = repo.outside.join("victim");
    std::fs::write(&victim, "keep me\n").unwrap();
    let inside = repo.root.join("a.txt");
    let bytes = |path: &Path| path.as_os_str().as_encoded_bytes().to_vec();
    for (name, mac) in [("plants-forged.json", ""), ("plants-wrong.json", "00ff")] {
        let note = serde_json::json!({
            "keel_pid": 0,
            "keel_started": 0,
            "writable": [b"/".to_vec()],
            "absent": [bytes(&victim), bytes(&inside)],
            "watched": [],
            "links": [[bytes(&repo.root.join(".git/config")), bytes(&inside)]],
            "mac": mac,
        });
        std::fs::write(notes_dir.join(name), note.to_string()).unwrap();
    }
    let repairs = recover_plants(&repo.root);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n", "{repairs:?}");
    assert_eq!(repo.read("a.txt"), "a\n");
    assert!(!repo.root.join(".git/config").is_symlink());
    assert_eq!(repairs.iter().filter(|n| n.contains("cannot verify")).count(), 2, "{repairs:?}");
    assert!(!notes_dir.join("plants-forged.json").exists(), "removed, never read again");
    assert!(recover_plants(&repo.root).is_empty());

    // A note this keel cannot verify that names a live process (a keel with another
    // KEEL_HOME, so another key, running a command in the same workspace; or a forgery
    // naming one): still never acted upon, and left for that keel, not removed under it.
    let live = serde_json::json!({
        "keel_pid": std::process::id(),
        "keel_started": started_ticks(std::process::id()),
        "writable": [b"/".to_vec()],
        "absent": [bytes(&victim), bytes(&inside)],
        "watched": [],
        "links": [],
        "mac": "00ff",
    });
    std::fs::create_dir_all(&notes_dir).unwrap(); // the empty folder went with the notes
    std::fs::write(notes_dir.join("plants-other-home.json"), live.to_string()).unwrap();
    let repairs = recover_plants(&repo.root);
    assert!(repairs.is_empty(), "{repairs:?}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n");
    assert_eq!(repo.read("a.txt"), "a\n");
    assert!(notes_dir.join("plants-other-home.json").exists(), "a live run's note is kept");
    // Once the process it names is gone (here: the start time no longer matches), it goes.
    let dead = serde_json::json!({
        "keel_pid": std::process::id(),
        "keel_started": started_ticks(std::process::id()) + 1,
        "writable": [b"/".to_vec()],
        "absent": [bytes(&victim), bytes(&inside)],
        "watched": [],
        "links": [],
        "mac": "00ff",
    });
    std::fs::write(notes_dir.join("plants-other-home.json"), dead.to_string()).unwrap();
    let repairs = recover_plants(&repo.root);
    assert_eq!(repairs.iter().filter(|n| n.contains("cannot verify")).count(), 1, "{repairs:?}");
    assert!(!notes_dir.join("plants-other-home.json").exists());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n");
    // The neighbour: managed runs still work and repair their own plants.
    let out = repo.sh("echo ../evil > .git/commondir; echo planted").await;
    assert!(out.stdout.text.contains("planted"));
    assert!(!repo.root.join(".git/commondir").exists());
    repo.assert_commit_works().await;
}

/// The sweep of plant notes never follows a linked `.keel` (a cloned repository's, or one a
/// command made in a folder a later run starts in) and removes only files of keel's own
/// names: nothing outside the workspace, and no other file, is removed or read as a note.
#[tokio::test]
async fn redteam_plant_note_sweep_never_follows_a_linked_keel_folder() {
    keel_sandbox::set_plant_note_key([7; 32]);
    let repo = Repo::new();
    let dead_note = serde_json::json!({
        "keel_pid": 999_999_999_u32, "keel_started": 1, "writable": [], "absent": [],
        "watched": [], "links": [], "mac": "00ff",
    })
    .to_string();
    let elsewhere = repo.outside.join("linked");
    std::fs::create_dir_all(elsewhere.join("sandbox")).unwrap();
    for name in ["plants-dead.json", "important.json"] {
        std::fs::write(elsewhere.join("sandbox").join(name), &dead_note).unwrap();
    }
    let keel = repo.root.join(".keel");
    let _ = std::fs::remove_dir_all(&keel);
    std::os::unix::fs::symlink(&elsewhere, &keel).unwrap();
    let repairs = recover_plants(&repo.root);
    assert!(repairs.is_empty(), "{repairs:?}");
    for name in ["plants-dead.json", "important.json"] {
        assert!(elsewhere.join("sandbox").join(name).exists(), "{name} outside was removed");
    }

    // The neighbour: a real `.keel/sandbox` is swept, of keel's own names only.
    std::fs::remove_file(&keel).unwrap();
    std::fs::create_dir_all(keel.join("sandbox")).unwrap();
    for name in ["plants-dead.json", "important.json"] {
        std::fs::write(keel.join("sandbox").join(name), &dead_note).unwrap();
    }
    let repairs = recover_plants(&repo.root);
    assert_eq!(repairs.iter().filter(|n| n.contains("cannot verify")).count(), 1, "{repairs:?}");
    assert!(!keel.join("sandbox/plants-dead.json").exists());
    assert!(keel.join("sandbox/important.json").exists(), "not a note: left alone");
    // A note another keel is still writing (its temporary name) is neither read nor
    // reported.
    std::fs::write(keel.join("sandbox/.writing-plants-x.json"), "{\"keel_pid\": 1").unwrap();
    assert!(recover_plants(&repo.root).is_empty());
    assert!(keel.join("sandbox/.writing-plants-x.json").exists());
    let out = repo.sh("echo ../evil > .git/commondir; echo planted").await;
    assert!(out.stdout.text.contains("planted"));
    assert!(!repo.root.join(".git/commondir").exists());
}

// ---- Item 5: what a command inherits and can read ---------------------------------------

#[tokio::test]
async fn redteam_env_only_the_allow_list_is_inherited() {
    let repo = Repo::new();
    // cargo sets these for the test process: not on the allow-list, so not inherited.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let out = repo.sh("env | cut -d= -f1 | sort | tr '\\n' ' '").await;
    let names: Vec<&str> = out.stdout.text.split_whitespace().collect();
    assert!(!names.contains(&"CARGO_MANIFEST_DIR"), "{names:?}");
    assert!(!names.contains(&"CARGO_PKG_NAME"), "{names:?}");
    for name in names.iter().filter(|name| !name.starts_with("LC_")) {
        let allowed = keel_sandbox::INHERITED_ENV.contains(name)
            || keel_sandbox::NON_INTERACTIVE_ENV.iter().any(|(key, _)| key == name)
            || name.starts_with("GIT_CONFIG_")
            || ["TMP", "TEMP", "XDG_CACHE_HOME", "PWD", "SHLVL", "_", "OLDPWD"].contains(name);
        assert!(allowed, "{name} reached the command: {names:?}");
    }
    assert!(names.contains(&"PATH") && names.contains(&"HOME"), "{names:?}");
    // The neighbour: a variable the user named is inherited.
    let spec = repo.spec("echo \"$CARGO_MANIFEST_DIR\"").inherit_env("CARGO_MANIFEST_DIR");
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text.trim(), env!("CARGO_MANIFEST_DIR"));
}

/// Credential stores of a fake home folder, with their content.
const CREDENTIALS: &[(&str, &str)] = &[
    (".ssh/id_ed25519", "PRIVATE KEY"),
    (".aws/credentials", "aws_secret_access_key=x"),
    (".git-credentials", "https://u:token@github.com"),
    (".config/git/credentials", "https://u:token@example.com"),
    (".cargo/credentials.toml", "[registry]\ntoken = \"x\""),
    (".npmrc", "//registry.npmjs.org/:_authToken=x"),
    (".pypirc", "password = x"),
    (".config/pip/pip.conf", "index-url = https://u:p@x"),
    (".config/gcloud/credentials.db", "gcloud-secret"),
    (".azure/accessTokens.json", "azure-secret"),
    (".kube/config", "token: x"),
    (".docker/config.json", "{\"auths\":{}}"),
    (".netrc", "machine x password y"),
    (".gnupg/private-keys-v1.d/k", "gpg-secret"),
    (".config/gh/hosts.yml", "oauth_token: x"),
];

/// A fake home folder holding [`CREDENTIALS`] and ordinary files.
fn fake_home(home: &Path) {
    let ordinary = [
        (".config/git/config", "[user]\n\tname = me\n"),
        (".cargo/config.toml", "[build]\njobs = 1\n"),
        ("notes.txt", "ordinary"),
    ];
    for (path, content) in CREDENTIALS.iter().chain(&ordinary) {
        let path = home.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
}

/// Reads (to stdout) and appends to every credential store.
fn credential_attack() -> String {
    CREDENTIALS
        .iter()
        .map(|(file, _)| {
            format!("cat ~/{file} 2>/dev/null; {{ echo x >> ~/{file}; }} 2>/dev/null; ")
        })
        .collect()
}

fn assert_credentials_untouched(home: &Path, out: &CommandOutput) {
    assert_eq!(out.stdout.text, "", "a credential store was readable: {out:?}");
    for (file, content) in CREDENTIALS {
        assert_eq!(&std::fs::read_to_string(home.join(file)).unwrap(), content, "{file}");
    }
}

#[tokio::test]
async fn redteam_creds_home_stores_next_to_granted_toolchains() {
    let repo = Repo::new();
    let home = repo.base.join("home");
    fake_home(&home);
    std::fs::create_dir_all(home.join(".cargo/bin")).unwrap();
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", home.join(".cargo/bin").display());
    let script = credential_attack() + "cat ~/.config/git/config ~/.cargo/config.toml >&2";
    let spec = repo.spec(&script).env("HOME", &home).env("PATH", path);
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_credentials_untouched(&home, &out);
    assert!(out.stderr.text.contains("name = me"), "git's own config stays readable: {out:?}");
    assert!(out.stderr.text.contains("jobs = 1"), "cargo's config stays readable: {out:?}");
}

#[tokio::test]
async fn redteam_creds_workspace_that_is_the_home_folder() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().canonicalize().unwrap();
    fake_home(&home);
    let script = credential_attack() + "cat notes.txt >&2; echo more >> notes.txt";
    let spec = CommandSpec::new("bash", &home, Duration::from_secs(30))
        .arg("-c")
        .arg(script)
        .env("HOME", &home);
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_credentials_untouched(&home, &out);
    assert_eq!(out.stderr.text, "ordinary", "{out:?}");
    assert_eq!(std::fs::read_to_string(home.join("notes.txt")).unwrap(), "ordinarymore\n");
}

// ---- Item 5: set-id bits and nosuid -------------------------------------------------------

#[tokio::test]
async fn redteam_setid_chmod_variants() {
    let repo = Repo::new();
    let out = repo
        .sh("cp /bin/true t; chmod u+s t; chmod g+s t; chmod 4755 t; chmod 2755 t; \
             install -m 4755 /bin/true t2; cp /bin/true t3; chmod +x t3 && ./t3 && echo runs")
        .await;
    for name in ["t", "t2"] {
        if let Ok(meta) = std::fs::metadata(repo.root.join(name)) {
            assert_eq!(meta.permissions().mode() & 0o6000, 0, "{name}: {:o}", meta.mode());
        }
    }
    assert!(out.stdout.text.contains("runs"), "{out:?}");
}

#[tokio::test]
async fn redteam_setid_create_with_a_set_id_mode() {
    let repo = Repo::new();
    std::fs::write(
        repo.root.join("setid.py"),
        "import os\n\
         for name, mode in (('a', 0o4755), ('b', 0o2755)):\n\
         \x20   try:\n\
         \x20       os.close(os.open(name, os.O_CREAT | os.O_WRONLY, mode))\n\
         \x20   except OSError as e:\n\
         \x20       print(name, e.errno)\n\
         try:\n\
         \x20   os.mknod('c', 0o104755)\n\
         except OSError as e:\n\
         \x20   print('c', e.errno)\n\
         os.close(os.open('d', os.O_CREAT | os.O_WRONLY, 0o755))\n\
         print('d ok')\n",
    )
    .unwrap();
    let out = repo.sh("python3 setid.py").await;
    for name in ["a", "b", "c"] {
        if let Ok(meta) = std::fs::metadata(repo.root.join(name)) {
            assert_eq!(meta.permissions().mode() & 0o6000, 0, "{name}");
        }
    }
    assert!(out.stdout.text.contains("a 1\n"), "EPERM for a set-uid create: {out:?}");
    assert!(out.stdout.text.contains("d ok"), "{out:?}");
    assert_eq!(std::fs::metadata(repo.root.join("d")).unwrap().permissions().mode() & 0o777, 0o755);
}

#[tokio::test]
async fn redteam_setid_workspace_is_mounted_nosuid() {
    let repo = Repo::new();
    let out = repo
        .sh(&format!("awk '$5 == \"{}\" {{print $6}}' /proc/self/mountinfo", repo.root.display()))
        .await;
    let options = out.stdout.text.lines().last().unwrap_or("");
    assert!(options.split(',').any(|option| option == "nosuid"), "{out:?}");
    assert!(options.split(',').any(|option| option == "rw"), "still writable: {out:?}");
    repo.assert_commit_works().await;
}

// ---- Item 6: nothing outlives the call ----------------------------------------------------

#[tokio::test]
async fn redteam_orphan_double_fork_stops_writing() {
    let repo = Repo::new();
    let out = repo
        .sh("( ( while true; do date +%s%N >> tick; sleep 0.05; done ) & ) ; sleep 0.3; echo back")
        .await;
    assert_eq!(out.stdout.text, "back\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let size = std::fs::metadata(repo.root.join("tick")).unwrap().len();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(std::fs::metadata(repo.root.join("tick")).unwrap().len(), size, "still writing");
}

#[tokio::test]
async fn redteam_orphan_command_runs_in_its_own_pid_namespace() {
    let repo = Repo::new();
    let out = repo.sh("grep NSpid /proc/self/status; echo $$").await;
    let nspid = out.stdout.text.lines().next().unwrap_or("");
    assert_eq!(nspid.split_whitespace().count(), 3, "nested pid namespace: {out:?}");
    // The neighbour: signals inside the namespace behave as usual.
    let out = repo.sh("kill -KILL $$").await;
    assert_eq!(out.termination, Termination::Signaled { signal: 9 });
    let out = repo.sh("exit 7").await;
    assert_eq!(out.termination, Termination::Exited { code: 7 });
}

/// A descriptor keel inherited from its own parent without close-on-exec (a CI runner's
/// socket, a make jobserver pipe, a file opened outside the workspace) never reaches a
/// command, in either mode; the command's standard streams still work.
#[tokio::test]
#[allow(unsafe_code)]
async fn redteam_fd_inherited_descriptors_do_not_reach_commands() {
    let repo = Repo::new();
    let secret = repo.outside.join("secret");
    std::fs::write(&secret, "outside-secret\n").unwrap();
    let file = std::fs::File::open(&secret).unwrap();
    // SAFETY: dup of a descriptor this test owns; the duplicate has no close-on-exec flag,
    // as a descriptor inherited from a parent process would not.
    let fd = unsafe { libc::dup(std::os::fd::AsRawFd::as_raw_fd(&file)) };
    assert!(fd > 2);
    for mode in [SandboxMode::Managed, SandboxMode::Bypass] {
        let script = format!("cat <&{fd} 2>/dev/null || echo no-such-descriptor; echo fine");
        let out = run(&repo.spec(&script), mode).await.unwrap();
        assert!(!out.stdout.text.contains("outside-secret"), "{mode:?}: {out:?}");
        assert!(out.stdout.text.contains("no-such-descriptor"), "{mode:?}: {out:?}");
        assert!(out.stdout.text.contains("fine"), "{mode:?}: {out:?}");
    }
    // SAFETY: closing the duplicate made above.
    unsafe { libc::close(fd) };
}
