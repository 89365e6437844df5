//! Local (stdio) servers: the child process in its own process group, its stderr in the
//! server log, and a line filter between its stdout and the JSON-RPC transport.
//!
//! The filter is bug case B12's fix on the client side: a line that does not start like a
//! JSON value (a log banner such as `Server starting on stdio...`) is logged with the
//! server's name and skipped; a leading UTF-8 BOM is stripped. rmcp 3.11's own reader
//! skips unparsable lines too, but only into `tracing`; here the user finds them in the
//! server's log, next to its stderr.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use process_wrap::tokio::{ChildWrapper, CommandWrap, ProcessGroup};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::process::{ChildStdin, ChildStdout};

use crate::error::ConnectError;

/// Longest JSON-RPC line accepted from a server (rmcp's own cap).
const MAX_LINE_BYTES: u64 = 16 * 1024 * 1024;
/// Longest stderr line kept whole; longer ones are split.
const MAX_STDERR_LINE_BYTES: u64 = 8 * 1024;
/// How many stderr lines an error report quotes.
const STDERR_TAIL_LINES: usize = 20;
/// How much of a stderr line an error report quotes, in characters.
const STDERR_TAIL_CHARS: usize = 300;
/// A log file larger than this is started afresh when the server starts.
const MAX_LOG_BYTES: u64 = 4 * 1024 * 1024;
/// Buffer between the stdout filter and the transport.
const PIPE_BYTES: usize = 256 * 1024;

/// A server's log file (`<log_dir>/mcp-<server>.log`) and the last lines of its stderr.
#[derive(Debug)]
pub(crate) struct ServerLog {
    server: String,
    path: PathBuf,
    file: Mutex<Option<std::fs::File>>,
    tail: Mutex<VecDeque<String>>,
}

impl ServerLog {
    /// Opens (creating the folder) the log of `server` for appending.
    pub(crate) fn open(log_dir: &Path, server: &str) -> Result<ServerLog, ConnectError> {
        let path = log_dir.join(format!("mcp-{server}.log"));
        let error = |source| ConnectError::Log { path: path.clone(), source };
        std::fs::create_dir_all(log_dir).map_err(error)?;
        let too_big = std::fs::metadata(&path).is_ok_and(|meta| meta.len() > MAX_LOG_BYTES);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(!too_big)
            .write(true)
            .truncate(too_big)
            .open(&path)
            .map_err(error)?;
        Ok(ServerLog {
            server: server.to_owned(),
            path,
            file: Mutex::new(Some(file)),
            tail: Mutex::new(VecDeque::new()),
        })
    }

    /// The log file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a line of keel's own (`[keel] ...`) to the log.
    pub(crate) fn note(&self, text: &str) {
        self.write(format!("[keel] mcp server '{}': {text}\n", self.server).as_bytes());
    }

    /// The last stderr lines since the server last started, oldest first.
    pub(crate) fn tail(&self) -> Vec<String> {
        lock(&self.tail).iter().cloned().collect()
    }

    fn started(&self, command: &str) {
        lock(&self.tail).clear();
        self.note(&format!("starting `{command}`"));
    }

    fn stderr_line(&self, line: &[u8]) {
        self.write(line);
        if !line.ends_with(b"\n") {
            self.write(b"\n");
        }
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end();
        if text.is_empty() {
            return;
        }
        let mut tail = lock(&self.tail);
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(text.chars().take(STDERR_TAIL_CHARS).collect());
    }

    fn write(&self, bytes: &[u8]) {
        let mut file = lock(&self.file);
        // A log that cannot be written is dropped rather than failing the server.
        if let Some(handle) = file.as_mut()
            && handle.write_all(bytes).is_err()
        {
            *file = None;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The server process; dropping it kills its whole process group.
#[derive(Debug)]
pub(crate) struct ChildGuard {
    child: Mutex<Box<dyn ChildWrapper>>,
}

impl ChildGuard {
    /// The exit status, if the process has exited by now.
    pub(crate) fn try_exit_status(&self) -> Option<ExitStatus> {
        lock(&self.child).try_wait().ok().flatten()
    }

    /// Waits up to `within` for the process to exit; its status if it did.
    pub(crate) async fn exit_status_within(&self, within: Duration) -> Option<ExitStatus> {
        let step = Duration::from_millis(20);
        let mut waited = Duration::ZERO;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Some(status);
            }
            if waited >= within {
                return None;
            }
            tokio::time::sleep(step).await;
            waited += step;
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let mut child = lock(&self.child);
        // SIGKILL to the process group; an already-exited group answers ESRCH, ignored.
        let _ = child.start_kill();
        let _ = child.try_wait();
    }
}

/// A spawned server: the guard, its filtered stdout and its stdin.
pub(crate) struct Spawned {
    pub(crate) child: ChildGuard,
    pub(crate) stdout: DuplexStream,
    pub(crate) stdin: ChildStdin,
}

/// What a stdio server is started with.
pub(crate) struct Launch<'a> {
    pub(crate) command: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a BTreeMap<String, String>,
    pub(crate) cwd: PathBuf,
    pub(crate) inherited_env: &'a BTreeMap<OsString, OsString>,
}

/// Spawns the server in a new process group with a cleared environment (the inherited
/// allow-list plus its own `env`), stderr into `log`, stdout through the line filter.
pub(crate) fn spawn(launch: &Launch<'_>, log: &Arc<ServerLog>) -> Result<Spawned, ConnectError> {
    let mut command = tokio::process::Command::new(launch.command);
    command
        .args(launch.args)
        .env_clear()
        .envs(launch.inherited_env)
        .envs(launch.env)
        .current_dir(&launch.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut wrapped = CommandWrap::from(command);
    wrapped.wrap(ProcessGroup::leader());
    let described = std::iter::once(launch.command)
        .chain(launch.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    log.started(&described);
    let mut child = wrapped
        .spawn()
        .map_err(|source| ConnectError::Spawn { command: described.clone(), source })?;
    let pipes = (child.stdin().take(), child.stdout().take(), child.stderr().take());
    let guard = ChildGuard { child: Mutex::new(child) };
    let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
        return Err(ConnectError::Spawn {
            command: described,
            source: std::io::Error::other("the child's stdio pipes are missing"),
        });
    };
    let (transport_side, filter_side) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(filter_stdout(stdout, filter_side, log.clone()));
    tokio::spawn(capture_stderr(stderr, log.clone()));
    Ok(Spawned { child: guard, stdout: transport_side, stdin })
}

/// Copies JSON lines from the server's stdout to the transport; logs and skips the rest.
async fn filter_stdout(stdout: ChildStdout, mut sink: DuplexStream, log: Arc<ServerLog>) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE_BYTES).read_until(b'\n', &mut line).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                log.note(&format!("reading stdout failed: {error}"));
                break;
            }
        }
        if !line.ends_with(b"\n") && line.len() as u64 == MAX_LINE_BYTES {
            log.note(&format!("skipped a stdout line longer than {MAX_LINE_BYTES} bytes"));
            let (complete, tail) = skip_rest_of_line(&mut reader).await;
            // The answer is dropped; its request fails now instead of at its timeout.
            if let Some(id) = leading_id(&line).or_else(|| trailing_id(&tail)) {
                let error = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {
                    "code": -32603,
                    "message": format!(
                        "the server's answer is larger than keel's limit of {} MiB and was \
                         dropped",
                        MAX_LINE_BYTES / (1024 * 1024)
                    ),
                }});
                let text = error.to_string();
                if sink.write_all(text.as_bytes()).await.is_err()
                    || sink.write_all(b"\n").await.is_err()
                {
                    break;
                }
            }
            if !complete {
                break;
            }
            continue;
        }
        let Some(message) = json_line(&line) else {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if !text.is_empty() {
                let preview: String = text.chars().take(200).collect();
                log.note(&format!("skipped a non-JSON line on stdout: {preview}"));
            }
            continue;
        };
        let replaced = known_blocks_only(message).or_else(|| mark_task_only_tools(message));
        let message = replaced.as_deref().unwrap_or(message);
        if sink.write_all(message).await.is_err() || sink.write_all(b"\n").await.is_err() {
            break;
        }
    }
    let _ = sink.shutdown().await;
}

/// Content block types keel's MCP library decodes.
const KNOWN_BLOCK_TYPES: &[&str] = &["text", "image", "audio", "resource", "resource_link"];

/// A tool result whose `content` has blocks of a type keel does not know would fail to
/// decode as a whole; this rewrites each such block into a text block that names its type,
/// so the known blocks arrive. `None` when nothing needs rewriting.
pub(crate) fn known_blocks_only(message: &[u8]) -> Option<Vec<u8>> {
    // Cheap filter first: only results with content blocks can need it.
    if !message.windows(9).any(|w| w == b"\"content\"") {
        return None;
    }
    let mut value: serde_json::Value = serde_json::from_slice(message).ok()?;
    let blocks = value.get_mut("result")?.get_mut("content")?.as_array_mut()?;
    let mut changed = false;
    for block in blocks.iter_mut() {
        let kind = block["type"].as_str().unwrap_or("(none)");
        if !KNOWN_BLOCK_TYPES.contains(&kind) {
            let name: String = kind.chars().take(60).collect();
            *block = serde_json::json!({
                "type": "text",
                "text": format!("[a content block of unknown type '{name}' left out]"),
            });
            changed = true;
        }
    }
    changed.then(|| value.to_string().into_bytes())
}

/// The `_meta` key that marks a listed tool as requiring task augmentation (rmcp's tool type
/// has no `execution` field, so the mark travels in `_meta`, which it keeps).
pub(crate) const TASK_REQUIRED_META: &str = "keel/taskSupportRequired";

/// A `tools/list` result whose tools say `execution.taskSupport = "required"`: each such
/// tool gets [`TASK_REQUIRED_META`] in its `_meta`, so the manager can leave it out.
pub(crate) fn mark_task_only_tools(message: &[u8]) -> Option<Vec<u8>> {
    if !message.windows(13).any(|w| w == b"\"taskSupport\"") {
        return None;
    }
    let mut value: serde_json::Value = serde_json::from_slice(message).ok()?;
    let tools = value.get_mut("result")?.get_mut("tools")?.as_array_mut()?;
    let mut changed = false;
    for tool in tools.iter_mut() {
        if tool["execution"]["taskSupport"] == "required" {
            if !tool["_meta"].is_object() {
                tool["_meta"] = serde_json::json!({});
            }
            tool["_meta"][TASK_REQUIRED_META] = serde_json::Value::Bool(true);
            changed = true;
        }
    }
    changed.then(|| value.to_string().into_bytes())
}

/// The JSON text of a stdout line (without BOM and line end), or `None` when the line
/// does not start like a JSON-RPC message.
fn json_line(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let line = line.trim_ascii();
    match line.first() {
        Some(b'{' | b'[') => Some(line),
        _ => None,
    }
}

/// Discards input up to and including the next newline. Returns whether a newline was
/// found (false at EOF or on error) and the last bytes of the line (up to 64 KiB).
async fn skip_rest_of_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> (bool, Vec<u8>) {
    let mut scratch = Vec::new();
    let mut tail = Vec::new();
    loop {
        scratch.clear();
        match (&mut *reader).take(64 * 1024).read_until(b'\n', &mut scratch).await {
            Ok(0) | Err(_) => return (false, tail),
            Ok(_) => {
                let done = scratch.ends_with(b"\n");
                if !(done && scratch.len() == 1) {
                    tail.clone_from(&scratch);
                }
                if done {
                    return (true, tail);
                }
            }
        }
    }
}

/// The id of a JSON-RPC message that starts `{"jsonrpc": "2.0", "id": ID, ...` (how Python
/// and most servers write it), from the first bytes of a line.
fn leading_id(line: &[u8]) -> Option<serde_json::Value> {
    let head = String::from_utf8_lossy(&line[..line.len().min(200)]);
    let text = head.trim_start_matches('\u{feff}').trim_start();
    let rest = text.strip_prefix('{')?;
    let rest = rest.trim_start();
    let rest = match rest.strip_prefix("\"jsonrpc\"") {
        Some(after) => after
            .trim_start()
            .strip_prefix(':')?
            .trim_start()
            .strip_prefix("\"2.0\"")?
            .trim_start()
            .strip_prefix(',')?
            .trim_start(),
        None => rest,
    };
    let value = rest.strip_prefix("\"id\"")?.trim_start().strip_prefix(':')?;
    id_value(value.split([',', '}']).next()?)
}

/// The id of a JSON-RPC message that ends `..., "id": ID}` (how the TypeScript SDK writes
/// it), from the last bytes of a line.
fn trailing_id(tail: &[u8]) -> Option<serde_json::Value> {
    let text = String::from_utf8_lossy(tail);
    let text = text.trim_end();
    let body = text.strip_suffix('}')?;
    let at = body.rfind("\"id\"")?;
    let value = body[at + 4..].trim_start().strip_prefix(':')?;
    if value.contains([',', '{', '[', ']', '}']) {
        return None;
    }
    id_value(value)
}

/// A JSON-RPC id: a number or a string.
fn id_value(text: &str) -> Option<serde_json::Value> {
    match serde_json::from_str::<serde_json::Value>(text.trim()).ok()? {
        id @ (serde_json::Value::Number(_) | serde_json::Value::String(_)) => Some(id),
        _ => None,
    }
}

async fn capture_stderr(stderr: tokio::process::ChildStderr, log: Arc<ServerLog>) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_STDERR_LINE_BYTES).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => log.stderr_line(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_oversized_lines_table() {
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        assert_eq!(leading_id(br#"{"jsonrpc": "2.0", "id": 7, "result": {"#), Some(json("7")));
        assert_eq!(leading_id(br#"{"id":"a-1","jsonrpc":"2.0","result":"#), Some(json(r#""a-1""#)));
        assert_eq!(leading_id(br#"{"result": {"content": [{"id": 3"#), None);
        assert_eq!(trailing_id(b"xxxx\"}]},\"jsonrpc\":\"2.0\",\"id\":12}\n"), Some(json("12")));
        assert_eq!(trailing_id(b"xxxx\"}]}}\n"), None);
        assert_eq!(trailing_id(b"\"id\": {\"a\": 1}}"), None);
    }

    #[test]
    fn unknown_blocks_are_named_and_known_ones_kept() {
        let line = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"},{"type":"hologram","x":1}]}}"#;
        let rewritten: serde_json::Value =
            serde_json::from_slice(&known_blocks_only(line).unwrap()).unwrap();
        assert_eq!(rewritten["result"]["content"][0]["text"], "a");
        assert_eq!(
            rewritten["result"]["content"][1]["text"],
            "[a content block of unknown type 'hologram' left out]"
        );
        let known =
            br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}]}}"#;
        assert_eq!(known_blocks_only(known), None);
        assert_eq!(known_blocks_only(b"{\"content\": not json"), None);
    }

    #[test]
    fn json_lines_table() {
        let cases: [(&[u8], Option<&[u8]>); 8] = [
            (b"{\"jsonrpc\":\"2.0\"}\n", Some(b"{\"jsonrpc\":\"2.0\"}")),
            (b"{\"a\":1}\r\n", Some(b"{\"a\":1}")),
            (b"\xEF\xBB\xBF{\"a\":1}\n", Some(b"{\"a\":1}")),
            (b"  [1]\n", Some(b"[1]")),
            (b"Server starting on stdio...\n", None),
            (b"not json\n", None),
            (b"\n", None),
            (b"\xEF\xBB\xBFnot json", None),
        ];
        for (line, expected) in cases {
            assert_eq!(json_line(line), expected, "{}", String::from_utf8_lossy(line));
        }
    }
}
