//! `keel acp` end to end: the real binary, driven by the official ACP TypeScript SDK
//! (`@agentclientprotocol/sdk`, pinned in crates/cli/tests/acp, installed by
//! `scripts/test`) and, for bad input, by raw JSON-RPC lines; the model is scripted.

mod harness;

mod elicitation;
mod protocol;
mod redteam;
mod sdk;
