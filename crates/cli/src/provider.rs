//! Model selection from a spec: `openai:MODEL`, `openai-responses:MODEL`,
//! `anthropic:MODEL`, `scripted:PATH`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use keel_contracts::ModelClient;
use keel_providers::{OpenAiChat, OpenAiConfig, ScriptedModel};

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
    match provider {
        "scripted" => {
            let model = ScriptedModel::from_path(Path::new(rest))
                .map_err(|error| UsageError(error.to_string()))?;
            Ok(Arc::new(model))
        }
        "openai" => {
            let base_url = base_url
                .map(str::to_owned)
                .or_else(|| std::env::var("OPENAI_BASE_URL").ok().filter(|v| !v.is_empty()))
                .unwrap_or_else(|| "https://api.openai.com/v1".to_owned());
            let api_key = std::env::var("OPENAI_API_KEY").ok().filter(|v| !v.is_empty());
            let mut config = OpenAiConfig::new(base_url, rest.to_owned());
            config.api_key = api_key;
            config.context_window = context_window;
            let client = OpenAiChat::new(config).context("cannot build the OpenAI client")?;
            Ok(Arc::new(client))
        }
        "openai-responses" | "anthropic" => bail!(UsageError(format!(
            "provider '{provider}' is not available in this build yet; use openai:MODEL \
             (any OpenAI-compatible server) or scripted:PATH"
        ))),
        other => bail!(UsageError(format!("unknown provider '{other}' in model spec '{spec}'"))),
    }
}
