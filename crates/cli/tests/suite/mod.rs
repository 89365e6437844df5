mod cli_surface;
mod example;
mod openai_e2e;
mod support;
