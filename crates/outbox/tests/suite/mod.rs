mod config;
mod flush;
mod jsonl;
mod restart;
mod support;
mod webhook;
