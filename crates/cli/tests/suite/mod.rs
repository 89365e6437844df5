mod cli_surface;
mod context_e2e;
mod example;
mod mcp_e2e;
mod openai_e2e;
mod postgres_e2e;
mod providers_e2e;
mod support;
