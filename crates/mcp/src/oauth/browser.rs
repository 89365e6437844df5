//! The browser step ([`Browser`]): sending the user to the authorization URL; and
//! [`FetchingBrowser`], which fetches it without a user, for tests and harnesses.

use futures::future::BoxFuture;
use reqwest::Url;

use super::discovery::PROBE_TIMEOUT;

/// Sends the user to the authorization URL: a real browser for `keel mcp login`, an HTTP
/// fetch for tests and the conformance harness. It returns once the user was sent (or the
/// fetch done); the redirect is awaited separately.
pub trait Browser: Send + Sync {
    /// Opens `url`.
    ///
    /// # Errors
    ///
    /// Why it could not; the login then fails with
    /// [`OAuthError::Browser`](crate::error::OAuthError::Browser).
    fn open<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<(), String>>;
}

/// A [`Browser`] that fetches the authorization URL over HTTP without a user (an
/// authorization server that redirects at once, as test servers do) and follows the
/// redirect to keel's loopback listener. For tests and headless harnesses.
#[derive(Debug, Clone, Default)]
pub struct FetchingBrowser;

impl Browser for FetchingBrowser {
    fn open<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(PROBE_TIMEOUT)
                .build()
                .map_err(|error| error.to_string())?;
            let answer = client.get(url).send().await.map_err(|error| error.to_string())?;
            let location = answer
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok())
                .ok_or_else(|| {
                    format!(
                        "the authorization endpoint answered {} without a redirect",
                        answer.status()
                    )
                })?
                .to_owned();
            let target = Url::parse(&location).map_err(|error| error.to_string())?;
            if target.host_str().is_none_or(|host| host != "127.0.0.1") {
                return Err(format!(
                    "the authorization endpoint redirected to {location}, not to keel"
                ));
            }
            client.get(target).send().await.map_err(|error| error.to_string())?;
            Ok(())
        })
    }
}
