//! Declared specifications and argument handling shared by the built-in tools.

use keel_contracts::{Access, Effects, ToolContext, ToolOutput, ToolSpec};
use serde::de::DeserializeOwned;

use crate::workspace::Workspace;

/// A first-party local read: `Access::Read`, `Effects::LOCAL_READ`, `first_party: true`.
pub(crate) fn read_spec(name: &str, description: &str, parameters: serde_json::Value) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
        access: Access::Read,
        effects: Effects::LOCAL_READ,
        intrinsic: false,
        first_party: true,
    }
}

/// A local write: `Access::Write`, `Effects::LOCAL_WRITE`.
pub(crate) fn write_spec(name: &str, description: &str, parameters: serde_json::Value) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
        access: Access::Write,
        effects: Effects::LOCAL_WRITE,
        intrinsic: false,
        first_party: false,
    }
}

/// Parses the arguments object, or explains to the model what is wrong with it.
pub(crate) fn parse_arguments<T: DeserializeOwned>(
    tool: &str,
    arguments: &serde_json::Value,
) -> Result<T, ToolOutput> {
    serde_json::from_value(arguments.clone())
        .map_err(|error| ToolOutput::error(format!("invalid arguments for {tool}: {error}")))
}

/// The session's workspace, or an error result when its root is unusable.
pub(crate) fn workspace(context: &ToolContext) -> Result<Workspace, ToolOutput> {
    Workspace::new(&context.workspace).map_err(|error| ToolOutput::error(error.to_string()))
}

/// Runs blocking file-system work off the async runtime.
///
/// # Cancel safety
///
/// Dropping the future does not stop the closure: it runs to completion in the blocking
/// pool. The closures here are bounded by their caps, and writes are atomic renames.
pub(crate) async fn blocking<F>(work: F) -> ToolOutput
where
    F: FnOnce() -> ToolOutput + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(output) => output,
        Err(error) => ToolOutput::error(format!("tool task failed: {error}")),
    }
}
