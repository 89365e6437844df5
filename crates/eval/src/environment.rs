//! A task's `environment/` as a fresh workspace.
//!
//! Host mode (no Docker): the Dockerfile may only pick a base image (`FROM`), set
//! `WORKDIR` and `COPY` files from `environment/` into the working directory; the
//! workspace is a new folder with those files, shown to commands at `WORKDIR` by the
//! managed sandbox. Anything else (`RUN`, `ENV`, `ADD`, `COPY --from`, a file outside the
//! working directory, continuation lines) needs Docker, and without it the attempt is
//! `infra_error`. Files are copied, never linked: a symbolic link, FIFO or device inside
//! `environment/` is refused, so a task cannot smuggle a path from outside into the
//! workspace.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// What a task's `environment/` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Host mode: the workspace is these copies, shown at `workdir`.
    Host {
        /// `WORKDIR` (absolute); `None` when the Dockerfile sets none.
        workdir: Option<PathBuf>,
        /// The `COPY` lines, in order.
        copies: Vec<Copy>,
    },
    /// Only Docker can build it; the reason names the first thing host mode cannot do.
    NeedsDocker {
        /// Why.
        reason: String,
    },
}

/// One `COPY`: `source` (relative to `environment/`) to `destination` (relative to the
/// working directory). A folder's contents are copied into `destination`; a file becomes
/// `destination`, or `destination/NAME` when `into_dir` (the destination ended in `/`, or
/// several sources were given), as Docker does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// Relative to `environment/`.
    pub source: PathBuf,
    /// Relative to the working directory.
    pub destination: PathBuf,
    /// Whether `destination` names a folder.
    pub into_dir: bool,
}

/// Reads `environment/Dockerfile` of `task_dir` and decides how to build the workspace.
/// `docker_image` is `[environment] docker_image` of `task.toml`.
pub fn plan(task_dir: &Path, docker_image: Option<&str>) -> Plan {
    if let Some(image) = docker_image {
        return Plan::NeedsDocker { reason: format!("the task names a Docker image ({image})") };
    }
    let dockerfile = task_dir.join("environment").join("Dockerfile");
    let text = match read_regular(&dockerfile, 1024 * 1024) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(error) => {
            return Plan::NeedsDocker {
                reason: format!("environment/Dockerfile cannot be read: {error}"),
            };
        }
    };
    parse_dockerfile(&text)
}

/// Parses a Dockerfile for host mode.
pub fn parse_dockerfile(text: &str) -> Plan {
    let mut workdir: Option<PathBuf> = None;
    let mut copies = Vec::new();
    let needs = |line_no: usize, why: &str| Plan::NeedsDocker {
        reason: format!("Dockerfile line {line_no}: {why}"),
    };
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.ends_with('\\') {
            return needs(line_no, "continuation lines need Docker");
        }
        let (instruction, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        match instruction.to_ascii_uppercase().as_str() {
            "FROM" => {}
            "WORKDIR" => {
                let path = Path::new(rest);
                let next = match &workdir {
                    _ if path.is_absolute() => path.to_path_buf(),
                    Some(current) => current.join(path),
                    None => Path::new("/").join(path),
                };
                if !plain(&next) || next == Path::new("/") {
                    return needs(line_no, "WORKDIR must be a plain absolute path below /");
                }
                workdir = Some(next);
            }
            "COPY" => {
                if rest.starts_with('[') || rest.starts_with("--") {
                    return needs(line_no, "COPY with flags or JSON form needs Docker");
                }
                let parts: Vec<&str> = rest.split_whitespace().collect();
                let Some((destination, sources)) = parts.split_last() else {
                    return needs(line_no, "COPY without a destination");
                };
                if sources.is_empty() {
                    return needs(line_no, "COPY without a source");
                }
                let destination = Path::new(destination);
                let relative = if destination.is_absolute() {
                    let Some(current) = &workdir else {
                        return needs(line_no, "COPY to an absolute path without WORKDIR");
                    };
                    match destination.strip_prefix(current) {
                        Ok(rest) => rest.to_path_buf(),
                        Err(_) => {
                            return needs(line_no, "COPY outside WORKDIR needs Docker");
                        }
                    }
                } else {
                    destination.to_path_buf()
                };
                if !plain(&relative) {
                    return needs(line_no, "COPY destination must be a plain path");
                }
                let into_dir = sources.len() > 1
                    || rest.ends_with('/')
                    || rest.ends_with("/.")
                    || rest.ends_with(" .");
                for source in sources {
                    let source = Path::new(source);
                    if source.is_absolute() || !plain(source) {
                        return needs(line_no, "COPY source must be a plain path in environment/");
                    }
                    copies.push(Copy {
                        source: source.to_path_buf(),
                        destination: relative.clone(),
                        into_dir,
                    });
                }
            }
            other => {
                return needs(line_no, &format!("{other} needs Docker"));
            }
        }
    }
    Plan::Host { workdir, copies }
}

/// Whether `path` has only plain names (and a root): no `..`, no `.` in the middle.
fn plain(path: &Path) -> bool {
    path.components().all(|component| {
        matches!(component, Component::Normal(_) | Component::RootDir | Component::CurDir)
    })
}

/// Fills `workspace` (an empty folder) with the `copies` of `plan` from `environment`.
///
/// # Errors
///
/// A message naming the file when a source is missing, lies outside `environment/`, or is
/// (or holds) a symbolic link, FIFO or device, or a copy fails.
pub fn build(environment: &Path, copies: &[Copy], workspace: &Path) -> Result<(), String> {
    let environment = environment
        .canonicalize()
        .map_err(|error| format!("environment/ cannot be resolved: {error}"))?;
    for copy in copies {
        let source = &copy.source;
        let from = environment.join(source);
        let resolved = from
            .canonicalize()
            .map_err(|error| format!("COPY source {} cannot be read: {error}", source.display()))?;
        if !resolved.starts_with(&environment) {
            return Err(format!("COPY source {} lies outside environment/", source.display()));
        }
        let destination = workspace.join(&copy.destination);
        let target = match resolved.file_name() {
            Some(name) if copy.into_dir && !resolved.is_dir() => destination.join(name),
            _ => destination,
        };
        copy_tree(&from, &target)?;
    }
    Ok(())
}

/// Copies `from` (a file or folder) to `to`, refusing symbolic links and special files.
///
/// # Errors
///
/// A message naming the refused or failing path.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let metadata = from
        .symlink_metadata()
        .map_err(|error| format!("{} cannot be read: {error}", from.display()))?;
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        return Err(format!(
            "{} is a symbolic link (task files are copied, never linked)",
            from.display()
        ));
    }
    if file_type.is_dir() {
        std::fs::create_dir_all(to).map_err(|error| format!("{}: {error}", to.display()))?;
        let mut entries: Vec<_> = std::fs::read_dir(from)
            .map_err(|error| format!("{}: {error}", from.display()))?
            .collect::<Result<_, _>>()
            .map_err(|error| format!("{}: {error}", from.display()))?;
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if !file_type.is_file() {
        return Err(format!("{} is not a regular file", from.display()));
    }
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| format!("{}: {error}", parent.display()))?;
    }
    std::fs::copy(from, to).map_err(|error| format!("{}: {error}", from.display()))?;
    Ok(())
}

/// Reads a regular file of at most `max_bytes`, never through a symbolic link and never
/// blocking on a FIFO (opened non-blocking, then refused for not being a regular file).
///
/// # Errors
///
/// `NotFound` when it is missing; `InvalidData` when it is not a regular file or is
/// larger than `max_bytes`; the I/O error otherwise.
pub fn read_regular(path: &Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file"));
    }
    if metadata.len() > max_bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max_bytes} bytes"),
        ));
    }
    let mut bytes = Vec::new();
    file.take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max_bytes} bytes"),
        ));
    }
    Ok(bytes)
}

/// Whether Docker can be used here: a `docker` client on `PATH` whose daemon answers
/// `docker info` within 10 s (a client without a daemon is no Docker).
pub async fn docker_available() -> bool {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join("docker").is_file()));
    if !on_path {
        return false;
    }
    let spec = keel_sandbox::CommandSpec::new(
        "docker",
        std::env::temp_dir(),
        std::time::Duration::from_secs(10),
    )
    .args(["info", "--format", "{{.ServerVersion}}"]);
    // The probe only asks the local client for the daemon's version; it runs on the host
    // because the managed sandbox refuses the socket it needs.
    match keel_sandbox::run(&spec, keel_sandbox::SandboxMode::Bypass).await {
        Ok(output) => output.termination.success() && !output.stdout.text.trim().is_empty(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_mode_takes_from_workdir_and_copy_only() {
        let plan = parse_dockerfile(
            "# comment\nFROM ubuntu:24.04\nWORKDIR /app\nCOPY data.txt /app/data.txt\nCOPY src/ ./src/\n",
        );
        assert_eq!(
            plan,
            Plan::Host {
                workdir: Some(PathBuf::from("/app")),
                copies: vec![
                    Copy {
                        source: PathBuf::from("data.txt"),
                        destination: PathBuf::from("data.txt"),
                        into_dir: false,
                    },
                    Copy {
                        source: PathBuf::from("src/"),
                        destination: PathBuf::from("./src/"),
                        into_dir: true,
                    },
                ],
            }
        );
        for docker_only in [
            "FROM x\nRUN apt-get install -y git\n",
            "FROM x\nENV A=1\n",
            "FROM x\nWORKDIR /app\nCOPY --from=build /a /app/a\n",
            "FROM x\nWORKDIR /app\nCOPY a /etc/a\n",
            "FROM x\nWORKDIR /app\nCOPY ../secret /app/s\n",
            "FROM x\nWORKDIR /app/../etc\n",
        ] {
            assert!(
                matches!(parse_dockerfile(docker_only), Plan::NeedsDocker { .. }),
                "{docker_only}"
            );
        }
    }
}
