//! A widened boundary: extra read and write paths and the network, exactly as granted and
//! no wider; a path that cannot be granted refuses before anything runs.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_sandbox::{Boundary, CommandSpec, SandboxError, SandboxMode, Termination, run};

struct Dirs {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    /// Outside the workspace, next to the granted path.
    base: PathBuf,
}

fn dirs() -> Dirs {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let workspace = base.join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    Dirs { _dir: dir, workspace, base }
}

fn bash(workspace: &Path, script: &str) -> CommandSpec {
    CommandSpec::new("bash", workspace, Duration::from_secs(30)).arg("-c").arg(script)
}

#[tokio::test]
async fn an_extra_write_path_is_writable_and_its_neighbour_is_not() {
    let dirs = dirs();
    let granted = dirs.base.join("granted");
    std::fs::create_dir_all(&granted).unwrap();
    let granted_file = dirs.base.join("granted.txt");
    std::fs::write(&granted_file, "old\n").unwrap();
    let script = format!(
        "echo in > {g}/new.txt && mkdir {g}/sub && echo deep > {g}/sub/f && echo wrote; \
         echo replaced > {f} && echo file; \
         echo no > {b}/next.txt; echo no > {b}/granted2.txt; echo $?",
        g = granted.display(),
        f = granted_file.display(),
        b = dirs.base.display(),
    );
    let spec = bash(&dirs.workspace, &script).allow_write(&granted).allow_write(&granted_file);
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text, "wrote\nfile\n1\n", "{out:?}");
    assert!(out.stderr.text.contains("Permission denied"), "{}", out.stderr.text);
    assert_eq!(std::fs::read_to_string(granted.join("new.txt")).unwrap(), "in\n");
    assert_eq!(std::fs::read_to_string(granted.join("sub/f")).unwrap(), "deep\n");
    assert_eq!(std::fs::read_to_string(&granted_file).unwrap(), "replaced\n");
    assert!(!dirs.base.join("next.txt").exists());
    assert!(!dirs.base.join("granted2.txt").exists());

    // Without the grant the same write is refused.
    let spec = bash(&dirs.workspace, &format!("echo again > {}/again.txt", granted.display()));
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.termination, Termination::Exited { code: 1 }, "{out:?}");
    assert!(!granted.join("again.txt").exists());
}

#[tokio::test]
async fn an_extra_read_path_is_readable_but_not_writable() {
    let dirs = dirs();
    let shared = dirs.base.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("data.txt"), "shared data\n").unwrap();
    let secret = dirs.base.join("secret.txt");
    std::fs::write(&secret, "secret\n").unwrap();
    let script = format!(
        "cat {s}/data.txt; ls {s}; echo x >> {s}/data.txt; echo $?; echo x > {s}/new; echo $?; \
         rm -f {s}/data.txt; cat {secret}; echo $?",
        s = shared.display(),
        secret = secret.display(),
    );
    let spec = bash(&dirs.workspace, &script)
        .boundary(&Boundary { read: vec![shared.clone()], ..Boundary::default() });
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text, "shared data\ndata.txt\n1\n1\n1\n", "{out:?}");
    assert_eq!(std::fs::read_to_string(shared.join("data.txt")).unwrap(), "shared data\n");
    assert!(!shared.join("new").exists());

    // Without the grant it is not readable at all.
    let spec = bash(&dirs.workspace, &format!("cat {}/data.txt", shared.display()));
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.termination, Termination::Exited { code: 1 }, "{out:?}");
    assert_eq!(out.stdout.text, "");
}

#[tokio::test]
async fn protected_paths_stay_read_only_inside_an_extra_write_path() {
    let dirs = dirs();
    let other = dirs.base.join("other");
    for dir in ["repo/.git/hooks", "repo/.git/objects", ".keel"] {
        std::fs::create_dir_all(other.join(dir)).unwrap();
    }
    std::fs::write(other.join("repo/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(other.join("repo/.git/config"), "[core]\n").unwrap();
    let script = format!(
        "cd {o} && echo ok > repo/file && echo ok > repo/.git/objects/x && echo wrote; \
         echo evil > repo/.git/hooks/pre-commit; echo evil >> repo/.git/config; \
         echo evil > .keel/config; mv repo/.git repo/.git-old; true",
        o = other.display()
    );
    // Also granting the config file itself, exactly, does not make it writable.
    let spec = bash(&dirs.workspace, &script)
        .allow_write(&other)
        .allow_write(other.join("repo/.git/config"));
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text, "wrote\n", "{out:?}");
    assert!(other.join("repo/.git/objects/x").exists());
    assert!(!other.join("repo/.git/hooks/pre-commit").exists());
    assert_eq!(std::fs::read_to_string(other.join("repo/.git/config")).unwrap(), "[core]\n");
    assert!(!other.join(".keel/config").exists());
    assert!(other.join("repo/.git/HEAD").exists(), "the git directory was not renamed away");

    // A path inside a `.keel` directory cannot be granted for writing.
    let spec = bash(&dirs.workspace, "true").allow_write(other.join(".keel"));
    let error = run(&spec, SandboxMode::Managed).await.unwrap_err();
    assert!(matches!(error, SandboxError::BoundaryPath { .. }), "{error:?}");
}

fn connect_script(port: u16) -> String {
    format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected")
}

#[tokio::test]
async fn network_allowed_reaches_a_local_listener_and_denied_does_not() {
    let dirs = dirs();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();

    let denied = bash(&dirs.workspace, &connect_script(port));
    let out = run(&denied, SandboxMode::Managed).await.unwrap();
    assert_ne!(out.termination, Termination::Exited { code: 0 }, "{out:?}");
    assert_eq!(out.stdout.text, "");
    assert!(
        matches!(listener.accept().map_err(|error| error.kind()), Err(ErrorKind::WouldBlock)),
        "no connection arrived"
    );
    // Explicitly not allowed is the same as the default.
    let out = run(&denied.clone().allow_network(false), SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text, "", "{out:?}");

    let allowed = bash(&dirs.workspace, &connect_script(port)).allow_network(true);
    let out = run(&allowed, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text, "connected\n", "{out:?}");
    assert!(listener.accept().is_ok(), "the connection arrived");

    // UNIX sockets stay refused with the network allowed (checked where python3 exists).
    let unix = bash(
        &dirs.workspace,
        "command -v python3 >/dev/null || { echo refused; exit 0; }; python3 -c '\
import socket\ntry:\n socket.socket(socket.AF_UNIX)\n print(\"opened\")\n\
except PermissionError:\n print(\"refused\")'",
    )
    .allow_network(true);
    let out = run(&unix, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.stdout.text, "refused\n", "{out:?}");

    // The network grant opens IP sockets only: writing outside is still refused.
    let outside = dirs.base.join("outside.txt");
    let spec = bash(&dirs.workspace, &format!("echo no > {}", outside.display()))
        .boundary(&Boundary { network: true, ..Boundary::default() });
    let out = run(&spec, SandboxMode::Managed).await.unwrap();
    assert_eq!(out.termination, Termination::Exited { code: 1 }, "{out:?}");
    assert!(!outside.exists());
}

#[tokio::test]
async fn a_path_that_cannot_be_granted_refuses_and_nothing_runs() {
    let dirs = dirs();
    let marker = dirs.workspace.join("ran");
    let script = format!("touch {}", marker.display());
    let missing = dirs.base.join("no-such-dir");
    for spec in [
        bash(&dirs.workspace, &script).allow_write(&missing),
        bash(&dirs.workspace, &script).allow_read(&missing),
        bash(&dirs.workspace, &script).allow_read("relative/path"),
    ] {
        let error = run(&spec, SandboxMode::Managed).await.unwrap_err();
        let SandboxError::BoundaryPath { path, reason } = &error else {
            panic!("expected a boundary refusal, got {error:?}");
        };
        assert!(
            spec.extra_boundary().read.contains(path) || spec.extra_boundary().write.contains(path)
        );
        assert!(!reason.is_empty());
        assert!(error.to_string().contains("the command was not run"), "{error}");
        assert!(!marker.exists(), "nothing ran");
        assert!(!missing.exists(), "nothing was created");
    }
}

#[tokio::test]
async fn the_extra_boundary_is_a_no_op_in_bypass_mode() {
    let dirs = dirs();
    let spec = bash(&dirs.workspace, "echo ran")
        .allow_write(dirs.base.join("no-such-dir"))
        .allow_network(true);
    let out = run(&spec, SandboxMode::Bypass).await.unwrap();
    assert_eq!(out.stdout.text, "ran\n");
}
