//! Skills (Agent Skills, agentskills.io): folders with a `SKILL.md` (YAML frontmatter, then
//! Markdown instructions) and optional `scripts/`, `references/` and `assets/`.
//!
//! Found, in this order (the first skill of a name wins; a later one of the same name is
//! skipped with a note, so a repository can never shadow the user's own skill):
//! 1. `~/.agents/skills/NAME/SKILL.md`, then the user's config folder
//!    (`$XDG_CONFIG_HOME/keel/skills`, else `~/.config/keel/skills`);
//! 2. for a **trusted** workspace only (its `.keel/config.toml` trusted with `keel trust`),
//!    `WORKSPACE/.agents/skills` then `WORKSPACE/.claude/skills`. An untrusted workspace's
//!    skills are not read at all; a note says so and how to trust.
//!
//! **Strict parse, lenient load.** A `SKILL.md` must be UTF-8, at most
//! [`MAX_SKILL_BYTES`], open with a `---` line and close its frontmatter with another; the
//! frontmatter has exactly the spec's fields (`name`, `description`, optional `license`,
//! `compatibility`, `metadata` (strings to strings), `allowed-tools`), with `name` 1–64
//! lowercase letters, digits and single hyphens (not first or last) equal to the folder's
//! name and `description` 1–1024 characters. A skill that breaks any rule is skipped with a
//! diagnostic (recorded in the run's `skill_catalog` event and printed), never fatal.
//!
//! A workspace skill's files came with the repository: its folder and `SKILL.md` must
//! resolve inside the skills folder (a symlink that escapes is skipped, never read), and
//! the user's read-deny rules hold. The user's own folders may link elsewhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use keel_kernel::{Skill, SkillOrigin, Skills};
use serde::Deserialize;

use crate::safe_read::{self, Outcome};

/// Largest `SKILL.md` loaded, in bytes; a larger one is skipped, not truncated (the spec
/// recommends under 500 lines, and the body enters the context whole when activated).
pub const MAX_SKILL_BYTES: u64 = 32 * 1024;

/// Most skill folders read from one skills folder.
const MAX_SKILLS_PER_FOLDER: usize = 200;
/// Most files listed for one skill, and how deep its folder is walked.
const MAX_LISTED_FILES: usize = 100;
const MAX_LIST_DEPTH: usize = 4;

/// The spec's limits, in characters.
const MAX_NAME_CHARS: usize = 64;
const MAX_DESCRIPTION_CHARS: usize = 1024;
const MAX_COMPATIBILITY_CHARS: usize = 500;

/// A skills folder to search, and what its skills are.
#[derive(Debug, Clone)]
pub struct SkillRoot {
    /// The folder holding one folder per skill.
    pub dir: PathBuf,
    /// Whose it is.
    pub origin: SkillOrigin,
}

/// The frontmatter of a `SKILL.md`, exactly as the spec has it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Frontmatter {
    name: String,
    description: String,
    #[serde(default)]
    #[allow(dead_code)]
    license: Option<String>,
    #[serde(default)]
    compatibility: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "allowed-tools")]
    #[allow(dead_code)]
    allowed_tools: Option<String>,
}

/// A parsed `SKILL.md`: its frontmatter's name and description, and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// `name`.
    pub name: String,
    /// `description`.
    pub description: String,
    /// The Markdown after the frontmatter.
    pub body: String,
}

/// The skill folders for `workspace` (canonical): the user's, then the workspace's when
/// `trusted`.
pub fn roots(workspace: &Path, trusted: bool) -> Vec<SkillRoot> {
    let mut roots = Vec::new();
    if let Some(home) = std::env::var_os("HOME").filter(|home| !home.is_empty()) {
        roots.push(SkillRoot {
            dir: PathBuf::from(home).join(".agents/skills"),
            origin: SkillOrigin::User,
        });
    }
    if let Some(dir) = crate::config::user_config_dir() {
        roots.push(SkillRoot { dir: dir.join("skills"), origin: SkillOrigin::User });
    }
    if trusted {
        for relative in WORKSPACE_FOLDERS {
            roots.push(SkillRoot { dir: workspace.join(relative), origin: SkillOrigin::Workspace });
        }
    }
    roots
}

/// Where a workspace keeps skills.
const WORKSPACE_FOLDERS: [&str; 2] = [".agents/skills", ".claude/skills"];

/// The skills of a run in `workspace` (canonical): [`roots`], then [`load_from`]. Skipped
/// skills are printed on stderr; an untrusted workspace's skills folders are named in a
/// note (and a diagnostic).
pub fn load(workspace: &Path, trusted: bool, denied: &keel_contracts::DeniedPaths) -> Skills {
    let mut skills = load_from(&roots(workspace, trusted), workspace, denied);
    if !trusted {
        for relative in WORKSPACE_FOLDERS {
            if workspace.join(relative).is_dir() {
                skills.diagnostics.push(format!(
                    "{}: not loaded: this workspace is not trusted (run `{}` to trust it)",
                    workspace.join(relative).display(),
                    crate::trust::trust_command(workspace)
                ));
            }
        }
    }
    for note in &skills.diagnostics {
        eprintln!("keel: skill {}", safe_read::visible(note, false));
    }
    skills
}

/// The skills under `roots`, in order, first name wins (testable without the process
/// environment).
pub fn load_from(
    roots: &[SkillRoot],
    workspace: &Path,
    denied: &keel_contracts::DeniedPaths,
) -> Skills {
    let mut skills = Skills::default();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root.dir) else { continue };
        let canonical_root = match root.dir.canonicalize() {
            Ok(dir) => dir,
            Err(error) => {
                skills.diagnostics.push(format!("{}: cannot be read: {error}", root.dir.display()));
                continue;
            }
        };
        if root.origin == SkillOrigin::Workspace && !canonical_root.starts_with(workspace) {
            skills.diagnostics.push(format!(
                "{}: not loaded: it resolves to {}, outside the workspace",
                root.dir.display(),
                canonical_root.display()
            ));
            continue;
        }
        let mut folders: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
        folders.sort();
        if folders.len() > MAX_SKILLS_PER_FOLDER {
            skills.diagnostics.push(format!(
                "{}: only the first {MAX_SKILLS_PER_FOLDER} of {} entries are read",
                root.dir.display(),
                folders.len()
            ));
            folders.truncate(MAX_SKILLS_PER_FOLDER);
        }
        for folder in folders {
            if !folder.is_dir() {
                continue;
            }
            let file = folder.join("SKILL.md");
            match load_one(&folder, &canonical_root, root.origin, workspace, denied) {
                Ok(None) => {}
                Ok(Some(skill)) => {
                    if let Some(first) = skills.skills.iter().find(|s| s.name == skill.name) {
                        skills.diagnostics.push(format!(
                            "{}: skipped: a skill named '{}' was already loaded from {}",
                            file.display(),
                            skill.name,
                            first.location
                        ));
                    } else {
                        skills.skills.push(skill);
                    }
                }
                Err(reason) => {
                    skills.diagnostics.push(format!("{}: skipped: {reason}", file.display()));
                }
            }
        }
    }
    skills
}

/// One skill folder: `Ok(None)` when it has no `SKILL.md`, `Err` with why it is skipped.
fn load_one(
    folder: &Path,
    canonical_root: &Path,
    origin: SkillOrigin,
    workspace: &Path,
    denied: &keel_contracts::DeniedPaths,
) -> Result<Option<Skill>, String> {
    let file = folder.join("SKILL.md");
    let confine = match origin {
        SkillOrigin::Workspace => Some(canonical_root),
        SkillOrigin::User => None,
    };
    if origin == SkillOrigin::Workspace {
        let relative = |path: &Path| {
            path.strip_prefix(workspace)
                .map_or_else(|_| path.display().to_string(), |r| r.display().to_string())
        };
        let resolved = file.canonicalize().ok();
        if denied.covers(&relative(&file))
            || resolved.as_deref().is_some_and(|real| denied.covers(&relative(real)))
        {
            return Err("a read-deny rule covers it".into());
        }
    }
    let rules =
        safe_read::Rules { cap: MAX_SKILL_BYTES, follow_symlink: true, confine_to: confine };
    let bytes = match safe_read::read(&file, rules) {
        Outcome::Missing => return Ok(None),
        Outcome::Skipped(reason) => return Err(reason),
        Outcome::Bytes(bytes) => bytes,
    };
    let text = String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())?;
    let folder_name = folder
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| "its folder's name is not UTF-8".to_owned())?;
    let parsed = parse(&text, folder_name)?;
    let files = match origin {
        SkillOrigin::Workspace => list_files(folder, Some(canonical_root)),
        SkillOrigin::User => list_files(folder, None),
    };
    Ok(Some(Skill {
        name: parsed.name,
        description: parsed.description,
        location: file.display().to_string(),
        body: parsed.body,
        files,
        origin,
    }))
}

/// Parses a `SKILL.md` of the folder `folder_name` strictly (see the module docs).
///
/// # Errors
///
/// Why it is not a valid skill, for a diagnostic.
pub fn parse(text: &str, folder_name: &str) -> Result<Parsed, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let opening = lines.next().unwrap_or("");
    if opening.trim_end_matches(['\r', '\n']) != "---" {
        return Err("it has no YAML frontmatter (the file must begin with a `---` line)".into());
    }
    let mut yaml = String::new();
    let mut closed = false;
    let mut consumed = opening.len();
    for line in lines.by_ref() {
        consumed += line.len();
        if line.trim_end_matches(['\r', '\n']) == "---" {
            closed = true;
            break;
        }
        yaml.push_str(line);
    }
    if !closed {
        return Err("its frontmatter is not closed by a `---` line".into());
    }
    let body = text[consumed..].to_owned();
    let frontmatter: Frontmatter = serde_saphyr::from_str(&yaml).map_err(|error| {
        let message = error.to_string();
        let first = message.lines().next().unwrap_or("invalid YAML").to_owned();
        format!("its frontmatter is invalid: {first}")
    })?;
    check_name(&frontmatter.name, folder_name)?;
    let description = frontmatter.description.trim();
    if description.is_empty() {
        return Err("its description is empty".into());
    }
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(format!("its description is longer than {MAX_DESCRIPTION_CHARS} characters"));
    }
    if let Some(compatibility) = &frontmatter.compatibility
        && (compatibility.trim().is_empty()
            || compatibility.chars().count() > MAX_COMPATIBILITY_CHARS)
    {
        return Err(format!("its compatibility must be 1 to {MAX_COMPATIBILITY_CHARS} characters"));
    }
    Ok(Parsed { name: frontmatter.name, description: description.to_owned(), body })
}

/// The spec's rules for `name`, and that it is the folder's name.
fn check_name(name: &str, folder_name: &str) -> Result<(), String> {
    let shown = safe_read::visible(name, false);
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(format!("its name '{shown}' must be 1 to {MAX_NAME_CHARS} characters"));
    }
    if !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        return Err(format!(
            "its name '{shown}' may hold only lowercase letters, digits and hyphens"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err(format!(
            "its name '{shown}' may not start or end with a hyphen or hold two in a row"
        ));
    }
    if name != folder_name {
        return Err(format!(
            "its name '{shown}' is not its folder's name '{}'",
            safe_read::visible(folder_name, false)
        ));
    }
    Ok(())
}

/// The skill's files other than `SKILL.md`, relative to `folder`, sorted; symlinks are
/// listed only when they resolve inside `confine_to` (when given), folders are walked
/// [`MAX_LIST_DEPTH`] deep, at most [`MAX_LISTED_FILES`].
fn list_files(folder: &Path, confine_to: Option<&Path>) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![(folder.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(metadata) = std::fs::symlink_metadata(&path) else { continue };
            if metadata.file_type().is_symlink() {
                let inside = match (path.canonicalize(), confine_to) {
                    (Ok(real), Some(root)) => real.starts_with(root),
                    (Ok(_), None) => true,
                    (Err(_), _) => false,
                };
                if !inside {
                    continue;
                }
            }
            if path.is_dir() {
                if depth + 1 < MAX_LIST_DEPTH && !metadata.file_type().is_symlink() {
                    pending.push((path, depth + 1));
                }
                continue;
            }
            let Ok(relative) = path.strip_prefix(folder) else { continue };
            if relative == Path::new("SKILL.md") {
                continue;
            }
            files.push(safe_read::visible(&relative.display().to_string(), false));
        }
    }
    files.sort();
    files.truncate(MAX_LISTED_FILES);
    files
}

/// Whether `workspace`'s (canonical) `.keel/config.toml` is trusted (`keel trust`) as it
/// is now; a workspace without one is not.
pub fn workspace_trusted(home: &Path, workspace: &Path) -> bool {
    match crate::config::read_workspace_file(workspace).outcome {
        Outcome::Bytes(bytes) => {
            crate::trust::state(home, workspace, &crate::trust::sha256_hex(&bytes))
                == crate::trust::State::Trusted
        }
        Outcome::Missing | Outcome::Skipped(_) => false,
    }
}

#[cfg(test)]
mod tests;
