//! Running the `keel` binary in a private KEEL_HOME.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// A private KEEL_HOME (which is also the process's HOME) and a scratch folder, removed on
/// drop.
pub(crate) struct Env {
    pub(crate) home: TempDir,
    pub(crate) scratch: TempDir,
}

impl Env {
    pub(crate) fn new() -> Env {
        Env { home: tempfile::tempdir().unwrap(), scratch: tempfile::tempdir().unwrap() }
    }

    pub(crate) fn keel(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .env("KEEL_HOME", self.home.path())
            // HOME is private too: nothing from the machine's ~/.agents/skills,
            // ~/.config/keel or other dotfiles reaches a test.
            .env("HOME", self.home.path())
            // The user's config folder is private too (nothing from ~/.config/keel).
            .env("XDG_CONFIG_HOME", self.home.path().join("xdg-config"))
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_HEADERS")
            .stdin(Stdio::null());
        command
    }

    /// Runs keel with `args`, returns the output.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.keel().args(args).output().unwrap()
    }

    /// `keel run -C WS -m MODEL FLAGS… t`: a run of the task "t", returns the output.
    pub(crate) fn run_t(&self, ws: &Path, model: &str, flags: &[&str]) -> Output {
        let mut args = vec!["run", "-C", ws.to_str().unwrap(), "-m", model];
        args.extend_from_slice(flags);
        args.push("t");
        self.run(&args)
    }

    pub(crate) fn write_script(&self, name: &str, json: &str) -> PathBuf {
        let path = self.scratch.path().join(name);
        std::fs::write(&path, json).unwrap();
        path
    }

    pub(crate) fn workspace(&self) -> PathBuf {
        let path = self.scratch.path().join("ws");
        std::fs::create_dir_all(&path).unwrap();
        path
    }
}

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Parses `--json` output into events.
pub(crate) fn json_lines(output: &Output) -> Vec<serde_json::Value> {
    stdout(output).lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// The events of kind `kind`, in order.
pub(crate) fn events_of<'a>(
    events: &'a [serde_json::Value],
    kind: &str,
) -> Vec<&'a serde_json::Value> {
    events.iter().filter(|event| event["kind"] == kind).collect()
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Writes `json` as a script and returns the `scripted:PATH` model spec.
pub(crate) fn scripted(env: &Env, json: &str) -> String {
    format!("scripted:{}", env.write_script("script.json", json).display())
}

/// Runs `command` (stdin closed, stdout and stderr captured), failing the test instead of
/// hanging when it has not ended within `limit`.
pub(crate) fn output_within(mut command: Command, limit: Duration) -> Output {
    let mut child =
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("keel hung for {limit:?}; stderr: {}", stderr(&output));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Makes a FIFO at `path` (with the `mkfifo` tool).
pub(crate) fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}
