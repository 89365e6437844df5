//! The Landlock ruleset: which paths a contained command may read, write or execute, and
//! (from ABI 4) that it may not bind or connect TCP sockets, and (from ABI 6) that it may
//! not signal processes or reach abstract UNIX sockets outside its sandbox.
//!
//! - Read and execute: system directories (`/usr`, `/bin`, `/sbin`, `/lib*`, `/opt`,
//!   `/nix/store`), `/proc`, `/sys`, `/etc` minus its secret stores (`shadow`, `gshadow`,
//!   `sudoers`, `ssh`, `ssl/private`, ...), and the toolchains the user's `PATH` points
//!   into under `$HOME` (`~/.cargo`, `~/.pyenv`, `~/.rustup`, ...; entries named like
//!   credentials, tokens or secrets left out) plus `~/.gitconfig` and `~/.config/git`.
//!   Nothing else under `$HOME` is readable.
//! - Read and write: the workspace and the per-run temporary directory. Device nodes
//!   cannot be created anywhere.
//! - `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`: read and write.
//! - The extra paths of a widened boundary (canonical, checked to exist): read-only or read
//!   and write. Unlike the system paths above, one that cannot be opened fails the ruleset.
//!   With the network allowed, TCP is not handled at all.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};

/// The oldest Landlock ABI managed mode accepts: 3 (Linux 6.2) is the first that controls
/// truncation; without it a contained command could empty files it may only read.
pub(crate) const MIN_LANDLOCK_ABI: u8 = 3;

const SYSTEM_READ_ONLY: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/nix/store",
    "/proc",
    "/sys",
];

const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// Entries of `/etc` that hold secrets and stay unreadable.
const ETC_SECRETS: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssh",
    "security",
    "krb5.keytab",
    "credstore",
    "credstore.encrypted",
    "polkit-1",
];

/// What the ruleset grants, before it is compiled.
#[derive(Debug, Default)]
pub(crate) struct FsPolicy {
    pub(crate) read_only: Vec<PathBuf>,
    pub(crate) read_write: Vec<PathBuf>,
    pub(crate) devices: Vec<PathBuf>,
    /// Extra read-only paths of a widened boundary: each must be granted.
    pub(crate) extra_read: Vec<PathBuf>,
    /// Extra read-write paths of a widened boundary: each must be granted.
    pub(crate) extra_write: Vec<PathBuf>,
}

/// The policy for one run.
pub(crate) fn policy(
    workspace: &Path,
    temp_dir: &Path,
    home: Option<&Path>,
    path_var: Option<&OsStr>,
) -> FsPolicy {
    let mut policy = FsPolicy {
        read_write: vec![workspace.to_owned(), temp_dir.to_owned()],
        devices: DEVICES.iter().map(PathBuf::from).collect(),
        ..FsPolicy::default()
    };
    policy.read_only.extend(SYSTEM_READ_ONLY.iter().map(PathBuf::from));
    push_entries_except(&mut policy.read_only, Path::new("/etc"), |name| {
        ETC_SECRETS.contains(&name)
    });
    if let Some(index) = policy.read_only.iter().position(|path| path == Path::new("/etc/ssl")) {
        policy.read_only.remove(index);
        push_entries_except(&mut policy.read_only, Path::new("/etc/ssl"), |name| name == "private");
    }
    policy.read_only.extend(toolchains(home, path_var));
    policy
}

/// Read-only toolchain paths from `PATH`: a directory outside `$HOME` as is; one inside
/// `$HOME` through its top-level entry there (`~/.cargo/bin` grants `~/.cargo`), listed
/// one level deep without credential-like names.
fn toolchains(home: Option<&Path>, path_var: Option<&OsStr>) -> Vec<PathBuf> {
    let mut granted = Vec::new();
    let mut home_roots: Vec<PathBuf> = Vec::new();
    for dir in path_var.map(std::env::split_paths).into_iter().flatten() {
        if !dir.is_absolute() || dir == Path::new("/") {
            continue;
        }
        match home {
            Some(home) if home.starts_with(&dir) => {}
            Some(home) if dir.starts_with(home) => {
                let Ok(relative) = dir.strip_prefix(home) else { continue };
                let Some(first) = relative.components().next() else { continue };
                let top = home.join(first);
                if top.file_name() == Some(OsStr::new(".local")) {
                    granted.push(top.join("bin"));
                    granted.push(top.join("lib"));
                } else {
                    home_roots.push(top);
                }
            }
            _ => granted.push(dir),
        }
    }
    if let Some(home) = home {
        home_roots.push(home.join(".rustup"));
        granted.push(home.join(".gitconfig"));
        granted.push(home.join(".config/git"));
    }
    home_roots.sort();
    home_roots.dedup();
    for root in home_roots {
        if root.is_dir() {
            push_entries_except(&mut granted, &root, looks_like_a_secret);
        } else {
            granted.push(root);
        }
    }
    granted
}

fn looks_like_a_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["credential", "token", "secret", "password"].iter().any(|word| name.contains(word))
}

fn push_entries_except(into: &mut Vec<PathBuf>, dir: &Path, skip: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !skip(&entry.file_name().to_string_lossy()) {
            into.push(entry.path());
        }
    }
}

/// What a compiled ruleset enforces beyond the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Enforced {
    pub(crate) abi: u8,
    pub(crate) tcp: bool,
    pub(crate) scopes: bool,
}

impl Enforced {
    pub(crate) fn for_abi(abi: u8) -> Enforced {
        Enforced { abi, tcp: abi >= 4, scopes: abi >= 6 }
    }
}

/// Compiles `policy` into a Landlock ruleset for `abi` (already checked to be at least
/// [`MIN_LANDLOCK_ABI`]). Every requested right is a hard requirement. `network` leaves TCP
/// unhandled (allowed) even where the ABI could deny it.
pub(crate) fn ruleset(
    policy: &FsPolicy,
    enforced: Enforced,
    network: bool,
) -> Result<OwnedFd, String> {
    let abi = match enforced.abi {
        3 => ABI::V3,
        4 => ABI::V4,
        _ => ABI::V5,
    };
    let handled = AccessFs::from_all(abi);
    let read_only = AccessFs::from_read(abi);
    let read_write = handled & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let device: BitFlags<AccessFs> = AccessFs::ReadFile | AccessFs::WriteFile;

    let landlock_error = |error: landlock::RulesetError| format!("landlock: {error}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(handled)
        .map_err(landlock_error)?;
    if enforced.tcp && !network {
        ruleset = ruleset.handle_access(AccessNet::from_all(ABI::V4)).map_err(landlock_error)?;
    }
    if enforced.scopes {
        ruleset = ruleset.scope(Scope::from_all(ABI::V6)).map_err(landlock_error)?;
    }
    let mut created = ruleset.create().map_err(landlock_error)?;
    let grants = policy
        .read_only
        .iter()
        .map(|path| (path, read_only))
        .chain(policy.read_write.iter().map(|path| (path, read_write)))
        .chain(policy.devices.iter().map(|path| (path, device)));
    for (path, access) in grants {
        // Paths that do not exist on this machine (`/lib32`, `/nix/store`) grant nothing.
        let Ok(fd) = PathFd::new(path) else { continue };
        let access = if path.is_dir() { access } else { access & AccessFs::from_file(abi) };
        created = created.add_rule(PathBeneath::new(fd, access)).map_err(landlock_error)?;
    }
    let extra = policy
        .extra_read
        .iter()
        .map(|path| (path, read_only))
        .chain(policy.extra_write.iter().map(|path| (path, read_write)));
    for (path, access) in extra {
        let fd = PathFd::new(path)
            .map_err(|error| format!("landlock: cannot open {}: {error}", path.display()))?;
        let access = if path.is_dir() { access } else { access & AccessFs::from_file(abi) };
        created = created.add_rule(PathBeneath::new(fd, access)).map_err(landlock_error)?;
    }
    Option::<OwnedFd>::from(created)
        .ok_or_else(|| "landlock: the ruleset was not created by the kernel".to_owned())
}

/// Credential stores of the home folder, relative to `$HOME` (directories with everything
/// under them, or files). They are never readable by a command, even when a grant covers
/// them (the workspace is the home folder, a toolchain lives next to them).
const HOME_CREDENTIAL_STORES: &[&str] = &[
    ".git-credentials",
    ".config/git/credentials",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".pypirc",
    ".config/pip",
    ".pip",
    ".aws",
    ".config/gcloud",
    ".azure",
    ".kube",
    ".docker/config.json",
    ".ssh",
    ".netrc",
    ".gnupg",
    ".config/gh",
    ".config/hub",
    ".config/glab-cli",
    ".terraform.d/credentials.tfrc.json",
    ".config/containers/auth.json",
    ".local/share/keyrings",
    ".password-store",
    ".gem/credentials",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
];

/// Every credential store for this home folder (and `$XDG_CONFIG_HOME/git/credentials`
/// when that is set), whether it exists or not.
pub(crate) fn credential_stores(home: Option<&Path>, xdg_config: Option<&Path>) -> Vec<PathBuf> {
    let mut stores: Vec<PathBuf> = home
        .into_iter()
        .flat_map(|home| HOME_CREDENTIAL_STORES.iter().map(move |store| home.join(store)))
        .collect();
    if let Some(config) = xdg_config.filter(|path| path.is_absolute()) {
        stores.push(config.join("git/credentials"));
        stores.push(config.join("gh"));
        stores.push(config.join("gcloud"));
        stores.push(config.join("pip"));
    }
    stores
}

/// The existing credential stores a grant of `policy` would make reachable, to be masked
/// with an empty placeholder in the child (`true` for a directory). A store the user named
/// in the widened boundary (`named`: the store itself or a path inside it) is left alone.
pub(crate) fn credential_stores_to_mask(
    policy: &FsPolicy,
    home: Option<&Path>,
    xdg_config: Option<&Path>,
    named: &[PathBuf],
) -> Vec<(PathBuf, bool)> {
    let grants: Vec<&PathBuf> = policy
        .read_only
        .iter()
        .chain(&policy.read_write)
        .chain(&policy.extra_read)
        .chain(&policy.extra_write)
        .collect();
    let mut masked = Vec::new();
    for store in credential_stores(home, xdg_config) {
        // Resolved, so that a store that is a link is masked where it points.
        let Ok(resolved) = store.canonicalize() else { continue };
        let Ok(meta) = resolved.metadata() else { continue };
        let reachable =
            grants.iter().any(|grant| resolved.starts_with(grant) || store.starts_with(grant));
        let named_by_user =
            named.iter().any(|path| path.starts_with(&store) || path.starts_with(&resolved));
        if reachable && !named_by_user && !masked.iter().any(|(path, _)| resolved.starts_with(path))
        {
            masked.push((resolved, meta.is_dir()));
        }
    }
    masked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_stores_under_a_grant_are_masked_unless_named() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().canonicalize().unwrap();
        for store in [".ssh", ".aws", ".config/git"] {
            std::fs::create_dir_all(home.join(store)).unwrap();
        }
        std::fs::write(home.join(".config/git/credentials"), "x").unwrap();
        std::fs::write(home.join(".netrc"), "x").unwrap();
        let policy = FsPolicy {
            read_only: vec![home.join(".config/git")],
            read_write: vec![home.clone()],
            ..FsPolicy::default()
        };
        let mut masked =
            credential_stores_to_mask(&policy, Some(&home), None, &[home.join(".aws")]);
        masked.sort();
        let expected = vec![
            (home.join(".config/git/credentials"), false),
            (home.join(".netrc"), false),
            (home.join(".ssh"), true),
        ];
        assert_eq!(masked, expected, "the named ~/.aws is left alone");
        assert!(
            !credential_stores_to_mask(&FsPolicy::default(), Some(&home), None, &[])
                .iter()
                .any(|_| true),
            "nothing granted, nothing to mask"
        );
    }
}
