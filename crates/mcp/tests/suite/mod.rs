mod access;
mod everything;
mod fake;
mod filesystem;
mod http;
mod support;
