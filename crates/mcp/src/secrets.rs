//! The user's secrets for one MCP server ([`Secrets`]), which everything the server says
//! is scrubbed of before it leaves keel-mcp.

use std::sync::Arc;

/// The user's secrets for one server, which the server's words (error text, results) are
/// scrubbed of before they leave keel-mcp: its static header values, its bearer token and
/// every OAuth token of its login seen in this process (a refresh adds the new ones).
/// Shared by the server's connections and its credential store. `Debug` shows none.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Arc<std::sync::Mutex<Vec<String>>>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets(<redacted>)")
    }
}

impl Secrets {
    /// Adds `more` (empty strings are ignored).
    pub(crate) fn add(&self, more: impl IntoIterator<Item = String>) {
        let mut secrets = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for secret in more {
            if !secret.is_empty() && !secrets.contains(&secret) {
                secrets.push(secret);
            }
        }
        // Longest first, so a secret that contains another is replaced whole.
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    }

    /// `text` with every secret replaced by `<redacted>`.
    pub(crate) fn scrub(&self, mut text: String) -> String {
        let secrets = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for secret in secrets.iter() {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), "<redacted>");
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_users_secrets_are_redacted_from_error_text() {
        let secrets = super::Secrets::default();
        secrets.add(["t0ken".to_owned(), String::new(), "hdr".to_owned()]);
        secrets.add(["t0ken-longer".to_owned(), "t0ken".to_owned()]);
        let text = secrets.scrub("bad token: Bearer t0ken key=hdr t0ken-longer".to_owned());
        assert_eq!(text, "bad token: Bearer <redacted> key=<redacted> <redacted>");
        assert_eq!(format!("{secrets:?}"), "Secrets(<redacted>)");
    }
}
