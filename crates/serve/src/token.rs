//! The host's bearer token: `KEEL_SERVE_TOKEN`, else `KEEL_HOME/serve.token`, made once
//! with 32 random bytes (hex) and mode 0600. A token file that is not a regular file of
//! ours with mode 0600 is refused, not used.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use keel_host::error::usage;

/// The token and where it came from (what `keel serve` prints: never the token).
pub(crate) struct Token {
    pub(crate) secret: String,
    pub(crate) source: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token").field("source", &self.source).finish_non_exhaustive()
    }
}

const FILE: &str = "serve.token";
/// Shortest token accepted from the environment.
const MIN_LEN: usize = 16;

pub(crate) fn load(home: &Path) -> anyhow::Result<Token> {
    match std::env::var("KEEL_SERVE_TOKEN") {
        Ok(secret) if !secret.trim().is_empty() => {
            let secret = secret.trim().to_owned();
            if secret.len() < MIN_LEN || secret.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(usage(format!(
                    "KEEL_SERVE_TOKEN must be at least {MIN_LEN} characters without spaces"
                )));
            }
            return Ok(Token { secret, source: "KEEL_SERVE_TOKEN".to_owned() });
        }
        Ok(_) | Err(std::env::VarError::NotPresent) => {}
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(usage("KEEL_SERVE_TOKEN is not valid UTF-8"));
        }
    }
    std::fs::create_dir_all(home)?;
    let path = home.join(FILE);
    let source = path.display().to_string();
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(mut file) => {
            let secret = random_hex()?;
            file.write_all(secret.as_bytes())?;
            file.sync_all()?;
            return Ok(Token { secret, source });
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(usage(format!("cannot create {source}: {error}"))),
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|error| usage(format!("cannot read {source}: {error}")))?;
    let meta = file.metadata()?;
    // The file must be this user's and private.
    let ours = meta.uid() == current_uid();
    if !meta.is_file() || meta.permissions().mode() & 0o077 != 0 || !ours {
        return Err(usage(format!(
            "{source} must be a regular file of this user with mode 0600; remove it and \
             start again to make a new token"
        )));
    }
    let mut secret = String::new();
    Read::by_ref(&mut file).take(1024).read_to_string(&mut secret)?;
    let secret = secret.trim().to_owned();
    if secret.len() < MIN_LEN {
        return Err(usage(format!("{source} holds no usable token; remove it to make a new one")));
    }
    Ok(Token { secret, source })
}

/// This process's user id, read from `/proc/self` (no unsafe call).
fn current_uid() -> u32 {
    std::fs::metadata("/proc/self").map(|meta| meta.uid()).unwrap_or(u32::MAX)
}

fn random_hex() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}
