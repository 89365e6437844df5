//! Model selection from a spec: `openai:MODEL`, `openai-responses:MODEL`,
//! `anthropic:MODEL`, `scripted:PATH`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use keel_contracts::ModelClient;
use keel_providers::{
    AnthropicConfig, AnthropicMessages, OpenAiChat, OpenAiConfig, OpenAiResponses, ScriptedModel,
};

/// A usage or configuration problem (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// Builds the model client for `spec`.
pub(crate) fn model_client(
    spec: &str,
    base_url: Option<&str>,
    context_window: Option<u64>,
) -> anyhow::Result<Arc<dyn ModelClient>> {
    let Some((provider, rest)) = spec.split_once(':') else {
        bail!(UsageError(format!(
            "invalid model spec '{spec}': use openai:MODEL, openai-responses:MODEL, \
             anthropic:MODEL or scripted:PATH"
        )));
    };
    if provider != "scripted" && rest.trim().is_empty() {
        bail!(UsageError(format!(
            "model spec '{spec}' names no model: write {provider}:MODEL, e.g. openai:gpt-4o"
        )));
    }
    match provider {
        "scripted" => {
            let model = ScriptedModel::from_path(Path::new(rest))
                .map_err(|error| UsageError(error.to_string()))?;
            Ok(Arc::new(model))
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
            let base_url = base_url
                .map(str::to_owned)
                .or_else(|| env_var("ANTHROPIC_BASE_URL"))
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

/// A non-empty environment variable.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}
