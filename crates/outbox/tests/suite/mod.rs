mod config;
mod flush;
mod jsonl;
mod otlp;
mod restart;
mod support;
mod webhook;
