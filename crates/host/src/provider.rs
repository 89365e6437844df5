//! Model selection from a spec: `openai:MODEL`, `openai-responses:MODEL`,
//! `anthropic:MODEL`, `scripted:PATH`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use keel_contracts::ModelClient;
use keel_providers::{
    AnthropicConfig, AnthropicMessages, OpenAiChat, OpenAiConfig, OpenAiResponses, ScriptedModel,
};

use crate::error::UsageError;

/// The providers a model spec may name, before its `:`.
const PROVIDERS: [&str; 4] = ["openai", "openai-responses", "anthropic", "scripted"];

/// Checks the shape of a model spec without building a client, reading a file or looking
/// for a key: `PROVIDER:MODEL` with a provider keel knows and a model named. For specs
/// stored to be used later (a schedule), where the key is the firing host's business.
///
/// # Errors
///
/// A [`UsageError`] naming what is wrong, the same as [`model_client`] gives.
pub fn check_model_spec(spec: &str) -> anyhow::Result<()> {
    split_spec(spec).map(drop)
}

/// `(provider, rest)` of a well-formed spec (see [`check_model_spec`]).
fn split_spec(spec: &str) -> anyhow::Result<(&str, &str)> {
    let Some((provider, rest)) = spec.split_once(':') else {
        bail!(UsageError(format!(
            "invalid model spec '{spec}': use openai:MODEL, openai-responses:MODEL, \
             anthropic:MODEL or scripted:PATH"
        )));
    };
    if !PROVIDERS.contains(&provider) {
        bail!(UsageError(format!("unknown provider '{provider}' in model spec '{spec}'")));
    }
    if provider != "scripted" && rest.trim().is_empty() {
        bail!(UsageError(format!(
            "model spec '{spec}' names no model: write {provider}:MODEL, e.g. openai:gpt-4o"
        )));
    }
    Ok((provider, rest))
}

/// Builds the model client for `spec`.
pub fn model_client(
    spec: &str,
    base_url: Option<&str>,
    context_window: Option<u64>,
) -> anyhow::Result<Arc<dyn ModelClient>> {
    let (provider, rest) = split_spec(spec)?;
    match provider {
        "scripted" => {
            let model = ScriptedModel::from_path(Path::new(rest))
                .map_err(|error| UsageError(error.to_string()))?;
            // `--context-window` applies to every model, the scripted one too.
            Ok(match context_window {
                Some(window) => Arc::new(Windowed { inner: model, window }),
                None => Arc::new(model),
            })
        }
        "openai" => {
            let config = openai_config(rest, base_url, context_window);
            require_key(
                &config.api_key,
                &config.base_url,
                OPENAI_DEFAULT_BASE_URL,
                "OPENAI_API_KEY",
            )?;
            let client = OpenAiChat::new(config).context("cannot build the OpenAI client")?;
            Ok(Arc::new(client))
        }
        "openai-responses" => {
            let config = openai_config(rest, base_url, context_window);
            require_key(
                &config.api_key,
                &config.base_url,
                OPENAI_DEFAULT_BASE_URL,
                "OPENAI_API_KEY",
            )?;
            let client =
                OpenAiResponses::new(config).context("cannot build the OpenAI Responses client")?;
            Ok(Arc::new(client))
        }
        "anthropic" => {
            let base_url = effective_base_url(spec, base_url)
                .unwrap_or_else(|| AnthropicConfig::DEFAULT_BASE_URL.to_owned());
            let mut config = AnthropicConfig::new(base_url, rest.to_owned());
            config.api_key = env_var("ANTHROPIC_API_KEY");
            config.context_window = context_window;
            require_key(
                &config.api_key,
                &config.base_url,
                AnthropicConfig::DEFAULT_BASE_URL,
                "ANTHROPIC_API_KEY",
            )?;
            let client =
                AnthropicMessages::new(config).context("cannot build the Anthropic client")?;
            Ok(Arc::new(client))
        }
        other => bail!(UsageError(format!("unknown provider '{other}' in model spec '{spec}'"))),
    }
}

/// OpenAI's own endpoint.
const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// A hosted provider's own endpoint needs its key; a server the user pointed keel at
/// (Ollama, vLLM, a proxy) may need none. Checked before any session is created.
fn require_key(
    key: &Option<String>,
    base_url: &str,
    default_base_url: &str,
    variable: &str,
) -> anyhow::Result<()> {
    if key.is_none() && base_url.trim_end_matches('/') == default_base_url.trim_end_matches('/') {
        bail!(UsageError(format!(
            "{variable} is not set: export it (e.g. `export {variable}=...`), or point \
             --base-url at a server that needs no key"
        )));
    }
    Ok(())
}

/// The OpenAI settings shared by `openai:` and `openai-responses:`: `--base-url`, else
/// `OPENAI_BASE_URL`, else OpenAI's own; the key from `OPENAI_API_KEY`.
fn openai_config(model: &str, base_url: Option<&str>, context_window: Option<u64>) -> OpenAiConfig {
    let base_url = base_url
        .map(str::to_owned)
        .or_else(|| env_var("OPENAI_BASE_URL"))
        .unwrap_or_else(|| OPENAI_DEFAULT_BASE_URL.to_owned());
    let mut config = OpenAiConfig::new(base_url, model.to_owned());
    config.api_key = env_var("OPENAI_API_KEY");
    config.context_window = context_window;
    config
}

/// The endpoint [`model_client`] uses for `spec`: `base_url` (flag or config), else the
/// provider's environment variable, else its default; `None` for scripted models and specs
/// keel cannot parse.
pub fn effective_base_url(spec: &str, base_url: Option<&str>) -> Option<String> {
    let (provider, _) = spec.split_once(':')?;
    let (variable, default) = match provider {
        "openai" | "openai-responses" => ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
        "anthropic" => ("ANTHROPIC_BASE_URL", AnthropicConfig::DEFAULT_BASE_URL),
        _ => return None,
    };
    Some(
        base_url
            .map(str::to_owned)
            .or_else(|| env_var(variable))
            .unwrap_or_else(|| default.to_owned()),
    )
}

/// `url` as the ledger may keep it: without userinfo (`user:pass@`), without a fragment,
/// and without query parameters whose names look like credentials (`key`, `api-key`,
/// `token`, `sig`, `secret`, `password`, `auth`, `credential`, `session`); other
/// parameters (`api-version`) stay.
pub fn recordable_base_url(url: &str) -> String {
    let url = url.split_once('#').map_or(url, |(before, _)| before);
    let (before_query, query) = match url.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (url, None),
    };
    let (scheme, rest) = match before_query.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, before_query),
    };
    let (authority, path) = match rest.find('/') {
        Some(index) => rest.split_at(index),
        None => (rest, ""),
    };
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let mut recorded = match scheme {
        Some(scheme) => format!("{scheme}://{host}{path}"),
        None => format!("{host}{path}"),
    };
    let kept: Vec<&str> = query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(name, _)| name).to_ascii_lowercase();
            !SECRET_PARAMETER_WORDS.iter().any(|word| name.contains(word))
        })
        .collect();
    if !kept.is_empty() {
        recorded.push('?');
        recorded.push_str(&kept.join("&"));
    }
    recorded
}

/// Words that make a query parameter's name look like a credential.
const SECRET_PARAMETER_WORDS: &[&str] =
    &["key", "token", "sig", "secret", "password", "passwd", "auth", "credential", "session"];

/// A non-empty environment variable.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_endpoints_keep_no_secret() {
        let table = [
            ("http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1"),
            ("https://user:s3cret@proxy.example/v1", "https://proxy.example/v1"),
            (
                "https://x.openai.azure.com/openai?api-version=2024-10-21&api-key=abc",
                "https://x.openai.azure.com/openai?api-version=2024-10-21",
            ),
            ("https://h/v1?token=t&sig=s&Key=k#frag", "https://h/v1"),
            ("https://h/v1?x-goog-api-key=k&region=eu", "https://h/v1?region=eu"),
            ("https://h:8443", "https://h:8443"),
        ];
        for (given, recorded) in table {
            assert_eq!(recordable_base_url(given), recorded, "{given}");
        }
    }

    #[test]
    fn scripted_models_have_no_endpoint() {
        assert_eq!(effective_base_url("scripted:/tmp/x.json", Some("http://h")), None);
        assert_eq!(
            effective_base_url("openai:gpt", Some("http://h/v1")).as_deref(),
            Some("http://h/v1")
        );
    }
}

/// A scripted model with the window `--context-window` gave it.
#[derive(Debug)]
struct Windowed {
    inner: ScriptedModel,
    window: u64,
}

#[async_trait::async_trait]
impl keel_contracts::ModelClient for Windowed {
    fn info(&self) -> keel_contracts::ModelInfo {
        keel_contracts::ModelInfo { context_window: Some(self.window), ..self.inner.info() }
    }

    async fn complete(
        &self,
        request: &keel_contracts::ModelRequest,
        on_delta: &(dyn Fn(keel_contracts::StreamDelta) + Send + Sync),
    ) -> Result<keel_contracts::ModelResponse, keel_contracts::ModelError> {
        keel_contracts::ModelClient::complete(&self.inner, request, on_delta).await
    }
}
