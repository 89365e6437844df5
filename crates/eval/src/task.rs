//! Harbor task folders and datasets.
//!
//! A task folder holds `instruction.md`, `task.toml`, `tests/test.sh`, `solution/solve.sh`
//! and `environment/`; a dataset is a folder of task folders. `task.toml` is read with the
//! fields keel uses, typed strictly (a timeout that is not a number is an error, never a
//! default); other Harbor fields are accepted and ignored, as Harbor's own model does.
//! A task's name is its folder's name: names inside `task.toml` never become paths.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The default agent time budget when `[agent] timeout_sec` is absent.
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(600);
/// Harbor's default verifier timeout (`[verifier] timeout_sec`).
pub const DEFAULT_VERIFIER_TIMEOUT: Duration = Duration::from_secs(600);
/// The largest `instruction.md` or `task.toml` read, in bytes.
pub const MAX_TASK_FILE_BYTES: u64 = 1024 * 1024;

/// One Harbor task, loaded.
#[derive(Debug, Clone)]
pub struct Task {
    /// The folder's name.
    pub name: String,
    /// The task folder.
    pub dir: PathBuf,
    /// `instruction.md`.
    pub instruction: String,
    /// `task.toml`.
    pub config: TaskConfig,
}

/// The parts of Harbor's `task.toml` keel uses.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TaskConfig {
    /// `[verifier]`.
    pub verifier: VerifierConfig,
    /// `[agent]`.
    pub agent: AgentConfig,
    /// `[environment]`.
    pub environment: EnvironmentConfig,
    /// `[solution]`.
    pub solution: SolutionConfig,
    /// `[metadata]`: free-form; keel reads `pass_threshold` (a number) from it.
    pub metadata: toml::Table,
}

/// `[verifier]` of `task.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct VerifierConfig {
    /// Seconds `tests/test.sh` may run.
    pub timeout_sec: Option<f64>,
    /// Environment variables for `tests/test.sh`.
    pub env: std::collections::BTreeMap<String, String>,
}

/// `[agent]` of `task.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct AgentConfig {
    /// Seconds the agent may run: its session's time budget.
    pub timeout_sec: Option<f64>,
}

/// `[environment]` of `task.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct EnvironmentConfig {
    /// A prebuilt image instead of `environment/Dockerfile` (needs Docker).
    pub docker_image: Option<String>,
    /// Environment variables of the task's environment.
    pub env: std::collections::BTreeMap<String, String>,
}

/// `[solution]` of `task.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SolutionConfig {
    /// Environment variables for `solution/solve.sh`.
    pub env: std::collections::BTreeMap<String, String>,
}

/// Why a task folder cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// A required file is missing or is not a regular file.
    #[error("{file} is missing (or not a regular file)")]
    Missing {
        /// The file, relative to the task folder.
        file: String,
    },
    /// A file could not be read or is too large.
    #[error("{file} cannot be read: {reason}")]
    Unreadable {
        /// The file, relative to the task folder.
        file: String,
        /// Why.
        reason: String,
    },
    /// A folder of the task (`tests/`, `environment/`, `solution/`) is a symbolic link:
    /// a task's folders are its own, and a link could point anywhere outside it.
    #[error(
        "{folder}/ is a symbolic link (a task's folders are its own; it could point outside the task)"
    )]
    Linked {
        /// The folder, relative to the task folder.
        folder: String,
    },
    /// `task.toml` is not valid TOML or a field has the wrong type.
    #[error("task.toml is malformed: {reason}")]
    Malformed {
        /// The parser's message.
        reason: String,
    },
    /// A value in `task.toml` is out of range.
    #[error("task.toml: {reason}")]
    Invalid {
        /// Why.
        reason: String,
    },
}

impl TaskConfig {
    /// The agent's time budget.
    ///
    /// # Errors
    ///
    /// [`TaskError::Invalid`] for a timeout that is not a positive finite number.
    pub fn agent_timeout(&self) -> Result<Duration, TaskError> {
        seconds("agent.timeout_sec", self.agent.timeout_sec, DEFAULT_AGENT_TIMEOUT)
    }

    /// The verifier's time limit.
    ///
    /// # Errors
    ///
    /// As [`TaskConfig::agent_timeout`].
    pub fn verifier_timeout(&self) -> Result<Duration, TaskError> {
        seconds("verifier.timeout_sec", self.verifier.timeout_sec, DEFAULT_VERIFIER_TIMEOUT)
    }

    /// The reward at or above which an attempt passes: `[metadata] pass_threshold`, else 1.
    ///
    /// # Errors
    ///
    /// [`TaskError::Invalid`] when `pass_threshold` is present but not a finite number.
    pub fn pass_threshold(&self) -> Result<f64, TaskError> {
        match self.metadata.get("pass_threshold") {
            None => Ok(1.0),
            Some(toml::Value::Float(value)) if value.is_finite() => Ok(*value),
            Some(toml::Value::Integer(value)) => Ok(*value as f64),
            Some(other) => Err(TaskError::Invalid {
                reason: format!("metadata.pass_threshold must be a number, not {other}"),
            }),
        }
    }
}

fn seconds(field: &str, value: Option<f64>, default: Duration) -> Result<Duration, TaskError> {
    match value {
        None => Ok(default),
        Some(value) if value.is_finite() && value > 0.0 && value < 1e9 => {
            Ok(Duration::from_secs_f64(value))
        }
        Some(value) => Err(TaskError::Invalid {
            reason: format!("{field} must be a positive number of seconds, not {value}"),
        }),
    }
}

/// Whether `dir` is a task folder itself (it has `task.toml` or `instruction.md`) rather
/// than a dataset.
pub fn is_task_folder(dir: &Path) -> bool {
    dir.join("task.toml").exists() || dir.join("instruction.md").exists()
}

/// The task folders of `path`: itself when it is a task folder, else its sub-folders (a
/// dataset), sorted by name. Entries that are not directories (a README, a link to a
/// file) and hidden ones are skipped; a symbolic link to a folder is refused (a dataset's
/// tasks are its own folders, and a link could point anywhere).
///
/// # Errors
///
/// The I/O error when `path` cannot be listed; an error naming every entry that is a
/// symbolic link to a folder.
pub fn task_folders(path: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    if is_task_folder(path) {
        let name = path
            .canonicalize()?
            .file_name()
            .map_or_else(|| "task".to_owned(), |name| name.to_string_lossy().into_owned());
        return Ok(vec![(name, path.to_path_buf())]);
    }
    let mut folders = Vec::new();
    let mut linked = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let file_type = entry.file_type()?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if file_type.is_symlink() && entry.path().metadata().is_ok_and(|meta| meta.is_dir()) {
            linked.push(entry.path().display().to_string());
            continue;
        }
        if !file_type.is_dir() {
            continue;
        }
        folders.push((name, entry.path()));
    }
    if !linked.is_empty() {
        linked.sort();
        return Err(std::io::Error::other(format!(
            "{} is a symbolic link to a folder (a dataset's tasks are its own folders); \
             refused",
            linked.join(", ")
        )));
    }
    folders.sort();
    Ok(folders)
}

/// Loads the task in `dir`, named `name`.
///
/// # Errors
///
/// [`TaskError`] for a missing, unreadable or malformed `task.toml` or `instruction.md`.
pub fn load(name: &str, dir: &Path) -> Result<Task, TaskError> {
    let toml_text = read_small(dir, "task.toml")?;
    let config: TaskConfig = toml::from_str(&toml_text)
        .map_err(|error| TaskError::Malformed { reason: error.message().to_owned() })?;
    config.agent_timeout()?;
    config.verifier_timeout()?;
    config.pass_threshold()?;
    let instruction = read_small(dir, "instruction.md")?;
    Ok(Task { name: name.to_owned(), dir: dir.to_path_buf(), instruction, config })
}

/// Reads a small regular file of the task folder (never through a symbolic link, never a
/// FIFO or device).
fn read_small(dir: &Path, file: &str) -> Result<String, TaskError> {
    let path = dir.join(file);
    let bytes =
        crate::environment::read_regular(&path, MAX_TASK_FILE_BYTES).map_err(
            |error| match error.kind() {
                std::io::ErrorKind::NotFound => TaskError::Missing { file: file.to_owned() },
                _ => TaskError::Unreadable { file: file.to_owned(), reason: error.to_string() },
            },
        )?;
    String::from_utf8(bytes)
        .map_err(|_| TaskError::Unreadable { file: file.to_owned(), reason: "not UTF-8".into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_take_integers_and_floats_and_refuse_text() {
        let config: TaskConfig = toml::from_str(
            "version = \"1.0\"\n[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 2.5\n",
        )
        .unwrap();
        assert_eq!(config.agent_timeout().unwrap(), Duration::from_secs(120));
        assert_eq!(config.verifier_timeout().unwrap(), Duration::from_millis(2500));
        assert!(toml::from_str::<TaskConfig>("[agent]\ntimeout_sec = \"soon\"\n").is_err());
    }
}
