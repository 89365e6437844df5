//! Issue 4 escape suite: attempts to leave the managed sandbox, each run end to end through
//! the real `bash` tool (or a file tool) in `SandboxMode::Managed`, each checked on the host
//! afterwards (the effect did not happen), not only by the command's exit status.
//!
//! Layout: `T/ws` is the workspace (a git repository with one commit, a nested repository
//! `vendor/lib`, a link `out-link` to `T/outside`); `T/outside` holds `victim.txt` and
//! `secret.txt`.

use std::io::ErrorKind;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_contracts::{Outcome, SandboxMode, ToolOutput};
use serde_json::json;

use super::support::{call, context};

const SECRET: &str = "keel-escape-secret-7f3a";
const VICTIM: &str = "victim: untouched\n";

struct Escape {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

impl Escape {
    fn new() -> Escape {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let root = base.join("ws");
        let outside = base.join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("victim.txt"), VICTIM).unwrap();
        std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
        symlink(&outside, root.join("out-link")).unwrap();
        let setup = "git init -q . && git -c user.name=t -c user.email=t@e commit -q --allow-empty -m init \
                     && mkdir -p vendor/lib && git -C vendor/lib init -q . && echo setup-ok";
        let status = std::process::Command::new("bash")
            .arg("-c")
            .arg(setup)
            .current_dir(&root)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&status.stdout), "setup-ok\n");
        Escape { _dir: dir, root, outside }
    }

    async fn bash(&self, command: &str) -> ToolOutput {
        let context = context(&self.root, SandboxMode::Managed);
        let output =
            call(&context, "bash", json!({"command": command, "timeout_ms": 30_000})).await;
        assert_eq!(output.outcome, Outcome::Ok, "{command}: {}", output.content);
        output
    }

    fn out(&self) -> String {
        self.outside.display().to_string()
    }

    fn assert_victim_untouched(&self) {
        assert_eq!(std::fs::read_to_string(self.outside.join("victim.txt")).unwrap(), VICTIM);
    }

    fn assert_absent(&self, path: &Path) {
        assert!(path.symlink_metadata().is_err(), "{} was created", path.display());
    }
}

/// A secret file in the real `$HOME`, removed when dropped.
struct HomeSecret(PathBuf);

impl HomeSecret {
    fn new(name: &str) -> HomeSecret {
        let home = PathBuf::from(std::env::var_os("HOME").unwrap());
        let path = home.join(format!(".keel-escape-{name}-{}", std::process::id()));
        std::fs::write(&path, SECRET).unwrap();
        HomeSecret(path)
    }
}

impl Drop for HomeSecret {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

// --- Writing outside the workspace -----------------------------------------------------

#[tokio::test]
async fn escape_01_write_absolute_path_outside() {
    let escape = Escape::new();
    let output = escape.bash(&format!("echo pwned > {}/abs.txt", escape.out())).await;
    assert!(output.content.contains("Permission denied"), "{}", output.content);
    escape.assert_absent(&escape.outside.join("abs.txt"));
}

#[tokio::test]
async fn escape_02_write_through_dotdot() {
    let escape = Escape::new();
    escape.bash("echo pwned > ../outside/dotdot.txt; echo pwned > ../../dotdot2.txt").await;
    escape.assert_absent(&escape.outside.join("dotdot.txt"));
    escape.assert_absent(&escape.root.join("../../dotdot2.txt"));
}

#[tokio::test]
async fn escape_03_write_through_a_new_symlink() {
    let escape = Escape::new();
    escape.bash(&format!("ln -s {} new-link; echo pwned > new-link/link.txt", escape.out())).await;
    escape.assert_absent(&escape.outside.join("link.txt"));
}

#[tokio::test]
async fn escape_04_write_through_an_existing_symlink() {
    let escape = Escape::new();
    escape.bash("echo pwned > out-link/pre.txt; echo pwned >> out-link/victim.txt").await;
    escape.assert_absent(&escape.outside.join("pre.txt"));
    escape.assert_victim_untouched();
}

#[tokio::test]
async fn escape_05_hard_link_to_an_outside_file() {
    let escape = Escape::new();
    let output = escape
        .bash(&format!(
            "ln {out}/victim.txt hard.txt && echo linked; ln out-link/victim.txt hard2.txt && echo linked; \
             echo pwned >> hard.txt; echo done",
            out = escape.out()
        ))
        .await;
    assert!(output.content.contains("done"));
    assert!(!output.content.contains("linked"), "{}", output.content);
    escape.assert_victim_untouched();
}

#[tokio::test]
async fn escape_06_modify_or_truncate_an_outside_file() {
    let escape = Escape::new();
    escape
        .bash(&format!(
            "echo pwned >> {out}/victim.txt; truncate -s 0 {out}/victim.txt; rm -f {out}/victim.txt; \
             mv {out}/victim.txt moved.txt",
            out = escape.out()
        ))
        .await;
    escape.assert_victim_untouched();
}

#[tokio::test]
async fn escape_07_write_to_home() {
    let escape = Escape::new();
    let home = PathBuf::from(std::env::var_os("HOME").unwrap());
    let target = home.join(format!(".keel-escape-write-{}", std::process::id()));
    escape.bash(&format!("echo pwned > {}", target.display())).await;
    escape.assert_absent(&target);
}

#[tokio::test]
async fn escape_08_write_to_shared_tmp_and_dev_shm() {
    let escape = Escape::new();
    let tmp = PathBuf::from(format!("/tmp/keel-escape-tmp-{}", std::process::id()));
    let shm = PathBuf::from(format!("/dev/shm/keel-escape-shm-{}", std::process::id()));
    escape.bash(&format!("echo pwned > {}; echo pwned > {}", tmp.display(), shm.display())).await;
    escape.assert_absent(&tmp);
    escape.assert_absent(&shm);
}

// --- Reading secrets outside the workspace ---------------------------------------------

#[tokio::test]
async fn escape_09_read_a_secret_in_home() {
    let escape = Escape::new();
    let secret = HomeSecret::new("read");
    let output = escape.bash(&format!("cat {}; ls -a ~", secret.0.display())).await;
    assert!(!output.content.contains(SECRET), "{}", output.content);
    assert!(output.content.contains("ls: cannot open directory"), "{}", output.content);
    assert!(output.content.contains("Permission denied"), "{}", output.content);
}

#[tokio::test]
async fn escape_10_read_outside_files_directly_and_through_links() {
    let escape = Escape::new();
    let output = escape
        .bash(&format!(
            "cat {out}/secret.txt; cat out-link/secret.txt; ln -s {out}/secret.txt s; cat s; \
             cp {out}/secret.txt copy.txt; cat copy.txt",
            out = escape.out()
        ))
        .await;
    assert!(!output.content.contains(SECRET), "{}", output.content);
}

#[tokio::test]
async fn escape_11_read_etc_shadow() {
    let escape = Escape::new();
    let output = escape.bash("cat /etc/shadow; head -c 100 /etc/gshadow").await;
    assert!(!output.content.contains("root:"), "{}", output.content);
}

#[tokio::test]
async fn escape_12_proc_self_root_tricks() {
    let escape = Escape::new();
    let output = escape
        .bash(&format!(
            "cat /proc/self/root{out}/secret.txt; cat /proc/1/root{out}/secret.txt; \
             echo pwned > /proc/self/root{out}/procroot.txt; cat /proc/self/cwd/../outside/secret.txt",
            out = escape.out()
        ))
        .await;
    assert!(!output.content.contains(SECRET), "{}", output.content);
    escape.assert_absent(&escape.outside.join("procroot.txt"));
}

#[tokio::test]
async fn escape_13_read_keel_process_memory_and_environment() {
    let escape = Escape::new();
    let pid = std::process::id();
    let output = escape
        .bash(&format!(
            "cat /proc/{pid}/environ | tr '\\0' '\\n' | head -3; head -c 16 /proc/{pid}/mem | wc -c"
        ))
        .await;
    assert!(!output.content.contains("PATH="), "{}", output.content);
    assert!(!output.content.contains("HOME="), "{}", output.content);
}

// --- Planting code that later runs outside the sandbox (B08) -----------------------------

#[tokio::test]
async fn escape_14_git_hook_in_the_root_repository() {
    let escape = Escape::new();
    escape
        .bash("mkdir -p .git/hooks; printf '#!/bin/sh\\ntouch /tmp/hook-ran\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit")
        .await;
    escape.assert_absent(&escape.root.join(".git/hooks/pre-commit"));
}

#[tokio::test]
async fn escape_15_git_config_in_the_root_repository() {
    let escape = Escape::new();
    let before = std::fs::read_to_string(escape.root.join(".git/config")).unwrap();
    escape
        .bash("printf '[core]\\n\\thooksPath = /tmp/evil-hooks\\n' >> .git/config; git config core.fsmonitor 'touch /tmp/x'; rm -f .git/config")
        .await;
    assert_eq!(std::fs::read_to_string(escape.root.join(".git/config")).unwrap(), before);
}

#[tokio::test]
async fn escape_16_git_hook_and_config_in_a_nested_repository() {
    let escape = Escape::new();
    let config = escape.root.join("vendor/lib/.git/config");
    let before = std::fs::read_to_string(&config).unwrap();
    escape
        .bash("mkdir -p vendor/lib/.git/hooks; printf '#!/bin/sh\\ntouch \"$HOME/hook-ran-outside-sandbox\"\\n' > vendor/lib/.git/hooks/pre-commit; \
               chmod +x vendor/lib/.git/hooks/pre-commit; printf '[core]\\n\\thooksPath = /tmp/evil-hooks\\n' >> vendor/lib/.git/config")
        .await;
    escape.assert_absent(&escape.root.join("vendor/lib/.git/hooks/pre-commit"));
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before);
}

#[tokio::test]
async fn escape_17_replace_the_git_directory() {
    let escape = Escape::new();
    escape
        .bash(
            "mv .git .git-old; mv vendor vendor-moved; mv vendor/lib/.git vendor/lib/.git-old; \
               rm -rf vendor; mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit",
        )
        .await;
    escape.assert_absent(&escape.root.join(".git-old"));
    escape.assert_absent(&escape.root.join("vendor-moved"));
    escape.assert_absent(&escape.root.join("vendor/lib/.git-old"));
    escape.assert_absent(&escape.root.join(".git/hooks/pre-commit"));
    // Contents may be deleted (the workspace is writable), but the protected paths stay.
    assert!(escape.root.join("vendor/lib/.git/hooks").is_dir());
    assert!(escape.root.join("vendor/lib/.git/config").is_file());
}

#[tokio::test]
async fn escape_18_redirect_git_with_a_planted_commondir() {
    let escape = Escape::new();
    let output = escape
        .bash("mkdir -p evil/hooks && printf '[core]\\n\\tfsmonitor = touch /tmp/fsmonitor-ran\\n' > evil/config; \
               echo ../evil > .git/commondir; echo planted")
        .await;
    assert!(output.content.contains("planted"));
    escape.assert_absent(&escape.root.join(".git/commondir"));
    assert!(
        output.content.contains("would redirect git to another config; removed it"),
        "{}",
        output.content
    );
}

#[tokio::test]
async fn escape_19_keel_workspace_config() {
    let escape = Escape::new();
    escape
        .bash("mkdir -p .keel; echo 'sandbox = \"bypass\"' > .keel/config.toml; mv .keel .keel-old")
        .await;
    escape.assert_absent(&escape.root.join(".keel/config.toml"));
    escape.assert_absent(&escape.root.join(".keel-old"));
}

// --- Network ---------------------------------------------------------------------------

#[tokio::test]
async fn escape_20_tcp_connect_to_a_loopback_listener() {
    let escape = Escape::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let output = escape
        .bash(&format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected; curl -s -m 2 http://127.0.0.1:{port}/ && echo curl-ok; \
             python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('py-connected')\""
        ))
        .await;
    assert!(!output.content.contains("connected\n"), "{}", output.content);
    assert!(!output.content.contains("curl-ok"), "{}", output.content);
    assert_eq!(listener.accept().map(|_| ()).unwrap_err().kind(), ErrorKind::WouldBlock);
}

#[tokio::test]
async fn escape_21_tcp_bind_and_listen() {
    let escape = Escape::new();
    let output = escape
        .bash("python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print('listening')\"")
        .await;
    assert!(!output.content.contains("listening"), "{}", output.content);
    assert!(output.content.contains("Operation not permitted"), "{}", output.content);
}

#[tokio::test]
async fn escape_22_udp_send() {
    let escape = Escape::new();
    let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    receiver.set_nonblocking(true).unwrap();
    let port = receiver.local_addr().unwrap().port();
    escape
        .bash(&format!(
            "echo pwned > /dev/udp/127.0.0.1/{port}; python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'pwned', ('127.0.0.1', {port}))\"; \
             python3 -c \"import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\""
        ))
        .await;
    let mut buffer = [0_u8; 16];
    assert_eq!(receiver.recv(&mut buffer).unwrap_err().kind(), ErrorKind::WouldBlock);
}

#[tokio::test]
async fn escape_23_unix_and_raw_sockets() {
    let escape = Escape::new();
    let socket_path = escape.outside.join("daemon.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let output = escape
        .bash(&format!(
            "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{}'); print('unix-connected')\"; \
             python3 -c \"import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW); print('netlink')\"; \
             python3 -c \"import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print('packet')\"",
            socket_path.display()
        ))
        .await;
    for leaked in ["unix-connected", "netlink\n", "packet\n"] {
        assert!(!output.content.contains(leaked), "{}", output.content);
    }
    assert_eq!(listener.accept().map(|_| ()).unwrap_err().kind(), ErrorKind::WouldBlock);
}

// --- Processes, privileges and the sandbox itself ----------------------------------------

#[tokio::test]
async fn escape_24_ptrace_a_sibling_and_keel() {
    let escape = Escape::new();
    let pid = std::process::id();
    let output = escape
        .bash(&format!(
            "sleep 30 & sib=$!; python3 -c \"import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); \
             print('sibling', libc.ptrace(16, int(sys.argv[1]), 0, 0)); print('keel', libc.ptrace(16, {pid}, 0, 0))\" $sib; \
             strace -p $sib -e trace=none -o /dev/null & s=$!; sleep 0.5; kill $s 2>/dev/null; wait $s; echo strace=$?"
        ))
        .await;
    assert!(output.content.contains("sibling -1"), "{}", output.content);
    assert!(output.content.contains("keel -1"), "{}", output.content);
    assert!(!output.content.contains("strace=0"), "{}", output.content);
}

#[tokio::test]
async fn escape_25_mount_and_namespaces() {
    let escape = Escape::new();
    let output = escape
        .bash(&format!(
            "mkdir -p m; mount -t tmpfs none m && echo mounted; mount --bind {} m && echo bound; \
             unshare -r -m sh -c 'echo in-namespace'; unshare -n true && echo netns; chroot / true && echo chrooted",
            escape.out()
        ))
        .await;
    for leaked in ["mounted", "bound", "in-namespace", "netns", "chrooted"] {
        assert!(!output.content.contains(leaked), "{leaked}: {}", output.content);
    }
}

#[tokio::test]
async fn escape_26_change_the_sandbox_from_inside() {
    let escape = Escape::new();
    let out = escape.out();
    escape
        .bash(&format!(
            "setpriv --reuid=0 --regid=0 --clear-groups --inh-caps=+all bash -c 'echo pwned > {out}/setpriv.txt'; \
             env -i /bin/bash -c 'echo pwned > {out}/reexec.txt'; \
             exec /bin/bash -c 'echo pwned > {out}/exec.txt'"
        ))
        .await;
    for name in ["setpriv.txt", "reexec.txt", "exec.txt"] {
        escape.assert_absent(&escape.outside.join(name));
    }
}

#[tokio::test]
async fn escape_27_background_process_survives_and_writes_later() {
    let escape = Escape::new();
    let output = escape
        .bash(
            "(sleep 1; echo late > late1.txt) & disown; \
             nohup sh -c 'sleep 1; echo late > late2.txt' >/dev/null 2>&1 & \
             setsid sh -c 'sleep 1; echo late > late3.txt' & \
             python3 -c \"import os, time; os.setpgid(0, 0); time.sleep(1); open('late4.txt', 'w')\" & \
             echo started",
        )
        .await;
    assert!(output.content.starts_with("started"), "{}", output.content);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    for name in ["late1.txt", "late2.txt", "late3.txt", "late4.txt"] {
        escape.assert_absent(&escape.root.join(name));
    }
}

#[tokio::test]
async fn escape_28_signal_a_process_outside() {
    let escape = Escape::new();
    let mut outsider = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let pid = outsider.id();
    escape.bash(&format!("kill -9 {pid}; kill -STOP {pid}")).await;
    assert!(outsider.try_wait().unwrap().is_none(), "the outside process was killed");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(!stat.contains(") T"), "the outside process was stopped: {stat}");
    outsider.kill().unwrap();
    outsider.wait().unwrap();
}

#[tokio::test]
async fn escape_29_device_nodes() {
    let escape = Escape::new();
    escape.bash("mknod disk b 8 0; mknod mem c 1 1; mkfifo fifo && echo fifo-ok").await;
    escape.assert_absent(&escape.root.join("disk"));
    escape.assert_absent(&escape.root.join("mem"));
}

#[tokio::test]
async fn escape_30_file_tools_refuse_outside_in_managed_mode() {
    let escape = Escape::new();
    let context = context(&escape.root, SandboxMode::Managed);
    for (tool, arguments) in [
        ("write_file", json!({"path": "../outside/tool.txt", "content": "pwned"})),
        ("write_file", json!({"path": "out-link/tool.txt", "content": "pwned"})),
        ("read_file", json!({"path": escape.outside.join("secret.txt")})),
        ("edit_file", json!({"path": "out-link/victim.txt", "old": "untouched", "new": "pwned"})),
        ("grep", json!({"pattern": "secret", "path": "out-link"})),
    ] {
        let output = call(&context, tool, arguments.clone()).await;
        assert_eq!(output.outcome, Outcome::Error, "{tool} {arguments}");
        assert!(output.content.contains("outside the workspace"), "{tool}: {}", output.content);
        assert!(!output.content.contains(SECRET));
    }
    escape.assert_absent(&escape.outside.join("tool.txt"));
    escape.assert_victim_untouched();
}

/// A configured `core.hooksPath` written with an inline comment (which git accepts) is still
/// the hooks folder, and stays read-only.
#[tokio::test]
async fn escape_31_hooks_path_with_an_inline_comment() {
    let escape = Escape::new();
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg("mkdir -p .hooks && printf '[core]\\n\\thooksPath = .hooks ; shared hooks\\n' >> .git/config")
        .current_dir(&escape.root)
        .status()
        .unwrap();
    assert!(status.success());
    escape
        .bash("printf '#!/bin/sh\\ntouch /tmp/hook-ran\\n' > .hooks/pre-commit; chmod +x .hooks/pre-commit")
        .await;
    escape.assert_absent(&escape.root.join(".hooks/pre-commit"));
}

/// A linked worktree's `config.worktree` (read once extensions.worktreeConfig is on) can
/// set core.fsmonitor: it stays read-only too, even where none existed.
#[tokio::test]
async fn escape_32_linked_worktree_config() {
    let escape = Escape::new();
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg("git worktree add -q ../wt 2>/dev/null || git worktree add -q -b wt ../wt")
        .current_dir(&escape.root)
        .status()
        .unwrap();
    assert!(status.success());
    let planted = escape.root.join(".git/worktrees/wt/config.worktree");
    escape
        .bash(
            "printf '[core]\\n\\tfsmonitor = touch /tmp/x\\n' >> .git/worktrees/wt/config.worktree",
        )
        .await;
    let content = std::fs::read_to_string(&planted).unwrap_or_default();
    assert!(!content.contains("fsmonitor"), "planted: {content}");
}

/// `git rebase -i` asks the sequence editor: it must not wait for a terminal (B11's kind).
#[tokio::test]
async fn a_sequence_editor_never_waits_for_a_terminal() {
    let escape = Escape::new();
    // The repository itself asks for vi (set on the host, where the config is writable).
    let status = std::process::Command::new("git")
        .args(["config", "sequence.editor", "vi"])
        .current_dir(&escape.root)
        .status()
        .unwrap();
    assert!(status.success());
    let started = std::time::Instant::now();
    let output = escape
        .bash(
            "export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t \
             GIT_COMMITTER_EMAIL=t@e; git commit -q --allow-empty -m two; \
             git rebase -i HEAD~1 2>&1 | tail -1",
        )
        .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "{}", output.content);
    assert!(output.content.contains("[exit code"), "{}", output.content);
}
