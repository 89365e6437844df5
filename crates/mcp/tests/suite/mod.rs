mod access;
mod conformance;
mod everything;
mod fake;
mod filesystem;
mod http;
mod oauth;
mod support;
