//! The token store ([`OAuthStore`]): one file per server URL, keyed by its canonical
//! form ([`canonical_url`]), written atomically with mode 0600 in a 0700 folder and read
//! only from a regular file in a real folder.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use reqwest::Url;
use rmcp::transport::auth::{AuthorizationMetadata, StoredCredentials};
use serde::{Deserialize, Serialize};

use crate::error::OAuthError;

/// The canonical form of a server URL: what tokens are keyed by (scheme and host
/// lowercased, default port dropped, no fragment).
///
/// # Errors
///
/// [`OAuthError::InvalidUrl`] when it does not parse as an `http(s)` URL with a host.
pub fn canonical_url(url: &str) -> Result<String, OAuthError> {
    let invalid = || OAuthError::InvalidUrl { url: url.to_owned() };
    let mut parsed = Url::parse(url).map_err(|_| invalid())?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(invalid());
    }
    parsed.set_fragment(None);
    Ok(parsed.to_string())
}

/// Where OAuth logins are kept: one file per server URL in a folder (normally
/// `KEEL_HOME/mcp/oauth`), created 0700, files 0600.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthStore {
    dir: PathBuf,
}

/// One stored login: the server it is for, the authorization server's metadata and the
/// client keel used, and the tokens.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct OAuthRecord {
    /// The canonical server URL the tokens were issued for.
    pub(super) server_url: String,
    /// The authorization server's metadata, as discovered at login.
    pub(super) metadata: AuthorizationMetadata,
    /// The client ID keel used.
    pub(super) client_id: String,
    /// Its secret, if the registration gave one (or the user's pre-registered one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) client_secret: Option<String>,
    /// The redirect URI of the login.
    pub(super) redirect_uri: String,
    /// rmcp's stored credentials (tokens, scopes, when they were received).
    #[serde(default)]
    pub(super) credentials: Option<StoredCredentials>,
    /// The `WWW-Authenticate` challenge of a request the server refused for lack of scope
    /// (403 `insufficient_scope`): the next login asks for its scopes too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) step_up: Option<String>,
}

impl std::fmt::Debug for OAuthRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthRecord")
            .field("server_url", &self.server_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("credentials", &self.credentials.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl OAuthRecord {
    /// The secrets in this record, for redaction from error text.
    pub(super) fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = self.client_secret.iter().cloned().collect();
        if let Some(credentials) = &self.credentials
            && let Ok(value) = serde_json::to_value(credentials)
        {
            for key in ["access_token", "refresh_token", "id_token"] {
                if let Some(token) = value["token_response"][key].as_str() {
                    secrets.push(token.to_owned());
                }
            }
        }
        secrets.retain(|secret| !secret.is_empty());
        secrets
    }
}

impl OAuthStore {
    /// A store in `dir` (created on first save).
    pub fn new(dir: impl Into<PathBuf>) -> OAuthStore {
        OAuthStore { dir: dir.into() }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The token file for the server at `url`.
    ///
    /// # Errors
    ///
    /// [`OAuthError::InvalidUrl`].
    pub fn path_for(&self, url: &str) -> Result<PathBuf, OAuthError> {
        let canonical = canonical_url(url)?;
        let digest = keel_contracts::sha256_hex(canonical.as_bytes());
        Ok(self.dir.join(format!("{}.json", &digest[..32])))
    }

    /// Whether a login with tokens is stored for `url`.
    pub fn has_login(&self, url: &str) -> bool {
        matches!(self.load(url), Ok(Some(record)) if record.credentials.is_some())
    }

    /// Deletes the login stored for `url`; whether there was one.
    ///
    /// # Errors
    ///
    /// [`OAuthError::Store`] when the file exists and cannot be removed.
    pub fn remove(&self, url: &str) -> Result<bool, OAuthError> {
        let path = self.path_for(url)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(OAuthError::Store { path, message: error.to_string() }),
        }
    }

    /// The record for `url`, if one is stored *for that URL* (a file whose `server_url`
    /// differs is ignored).
    pub(super) fn load(&self, url: &str) -> Result<Option<OAuthRecord>, OAuthError> {
        let canonical = canonical_url(url)?;
        let path = self.path_for(url)?;
        read_record(&path, &canonical)
    }
}

/// The most a token file may hold.
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// Refuses a token folder that is a symbolic link or not a folder (its target would get
/// the tokens, and a `chmod`); an absent one is fine.
fn check_dir(dir: &Path, path: &Path) -> Result<(), OAuthError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(OAuthError::Store {
            path: path.to_owned(),
            message: format!(
                "{} is a symbolic link or not a folder; keel keeps tokens only in a real folder \
                 (remove it and log in again)",
                dir.display()
            ),
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(OAuthError::Store { path: path.to_owned(), message: error.to_string() }),
    }
}

/// The bytes of the token file at `path`, `None` when absent. Opened without following a
/// symbolic link and without blocking (a FIFO would hang keel); only a regular file is read.
fn read_token_file(path: &Path) -> Result<Option<Vec<u8>>, OAuthError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let refused = |message: String| OAuthError::Store { path: path.to_owned(), message };
    if let Some(dir) = path.parent() {
        check_dir(dir, path)?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match file {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refused(
                "the token file is a symbolic link; keel reads only a regular file (remove it \
                 and log in again)"
                    .into(),
            ));
        }
        Err(error) => return Err(refused(error.to_string())),
    };
    let meta = file.metadata().map_err(|error| refused(error.to_string()))?;
    if !meta.is_file() {
        return Err(refused(
            "the token file is not a regular file (remove it and log in again)".into(),
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| refused(error.to_string()))?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(refused("the token file is larger than 1 MiB".into()));
    }
    Ok(Some(bytes))
}

pub(super) fn read_record(path: &Path, canonical: &str) -> Result<Option<OAuthRecord>, OAuthError> {
    let Some(bytes) = read_token_file(path)? else { return Ok(None) };
    let record: OAuthRecord =
        serde_json::from_slice(&bytes).map_err(|error| OAuthError::Store {
            path: path.to_owned(),
            message: format!("not a keel token file: {error}"),
        })?;
    Ok((record.server_url == canonical).then_some(record))
}

/// Writes `record` to `path` atomically: folder 0700, file 0600 from its creation.
pub(super) fn write_record(path: &Path, record: &OAuthRecord) -> Result<(), OAuthError> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
    let store_error = |error: std::io::Error| OAuthError::Store {
        path: path.to_owned(),
        message: error.to_string(),
    };
    let dir = path.parent().ok_or_else(|| OAuthError::Store {
        path: path.to_owned(),
        message: "no parent folder".into(),
    })?;
    check_dir(dir, path)?;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(store_error)?;
    // Checked again once it exists: a symlink put there meanwhile is not chmodded.
    check_dir(dir, path)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(store_error)?;
    let bytes = serde_json::to_vec_pretty(record)
        .map_err(|error| OAuthError::Store { path: path.to_owned(), message: error.to_string() })?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|name| name.to_str()).unwrap_or("token"),
        temp_suffix()
    ));
    let written = (|| {
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(store_error)
}

/// A suffix no other writer in this or another process uses at the same time.
fn temp_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    format!("{}-{count}-{nanos}", std::process::id())
}

/// Notes a 403 `insufficient_scope` challenge with the login stored for `url` (if there
/// is one), for the next [`login`](super::flow::login). Best effort: a failure to write only loses the hint.
pub(crate) fn note_step_up(store: &OAuthStore, url: &str, challenge: &str) {
    let (Ok(Some(mut record)), Ok(path)) = (store.load(url), store.path_for(url)) else {
        return;
    };
    record.step_up = Some(challenge.chars().take(2000).collect());
    let _ = write_record(&path, &record);
}
