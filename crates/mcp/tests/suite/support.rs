//! Finding the test servers, starting them through [`McpServers`] (server-everything over
//! stdio with [`everything_stdio`], over streamable HTTP with [`HttpEverything`]), calling
//! their tools.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_contracts::{SandboxMode, SessionId, Tool, ToolCallId, ToolContext, ToolOutput};
use keel_mcp::{INHERITED_ENV_VARS, McpServerConfig, McpServers, ServerSpec, StartOptions};
use tempfile::TempDir;

/// The folder holding `node_modules` with the pinned servers: `KEEL_MCP_SERVERS_DIR`, else
/// this crate's `tests/servers`. Fails (never skips) when the servers are not installed.
pub(crate) fn servers_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_MCP_SERVERS_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers"));
    let modules = dir.join("node_modules/@modelcontextprotocol");
    assert!(
        modules.join("server-everything").is_dir() && modules.join("server-filesystem").is_dir(),
        "the MCP test servers are not installed in {}: run `scripts/test`, which installs them, \
         (or point KEEL_MCP_SERVERS_DIR at a folder with their node_modules)",
        dir.display()
    );
    dir
}

/// `dist/index.js` of an installed `@modelcontextprotocol/<name>`.
pub(crate) fn server_js(name: &str) -> String {
    servers_dir()
        .join("node_modules/@modelcontextprotocol")
        .join(name)
        .join("dist/index.js")
        .display()
        .to_string()
}

/// The fake stdio server script.
pub(crate) fn fake_server() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/fake_server.py").display().to_string()
}

/// server-everything over stdio, with `extra` lines in its table.
pub(crate) fn everything_stdio(extra: &str) -> String {
    format!(
        "command = \"node\"\nargs = [{}, \"stdio\"]\n{extra}",
        quoted(&server_js("server-everything"))
    )
}

/// server-everything in streamable HTTP mode on a free loopback port; killed on drop.
/// It listens on every interface; the tests only ever talk to 127.0.0.1.
pub(crate) struct HttpEverything {
    child: Child,
    pub(crate) port: u16,
}

impl HttpEverything {
    pub(crate) fn start() -> HttpEverything {
        let port =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port();
        HttpEverything::start_on(port)
    }

    /// On `port` (e.g. again after [`HttpEverything::stop`]).
    pub(crate) fn start_on(port: u16) -> HttpEverything {
        let child = Command::new("node")
            .arg(server_js("server-everything"))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = HttpEverything { child, port };
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let started = Instant::now();
        while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "server-everything did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Kills the server and waits for it to exit.
    pub(crate) fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch workspace with a `logs` folder beside it.
pub(crate) struct Scratch {
    pub(crate) dir: TempDir,
}

impl Scratch {
    pub(crate) fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        Scratch { dir }
    }

    pub(crate) fn workspace(&self) -> PathBuf {
        self.dir.path().join("ws").canonicalize().unwrap()
    }

    pub(crate) fn log_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    pub(crate) fn log(&self, server: &str) -> String {
        std::fs::read_to_string(self.log_dir().join(format!("mcp-{server}.log"))).unwrap()
    }

    pub(crate) fn options(&self) -> StartOptions {
        StartOptions {
            log_dir: self.log_dir(),
            workspace: self.workspace(),
            inherited_env: std::env::vars_os()
                .filter(|(name, _)| INHERITED_ENV_VARS.iter().any(|allowed| name == allowed))
                .collect(),
            bearer_tokens: Default::default(),
            elicitation: Default::default(),
            oauth: None,
        }
    }

    pub(crate) async fn start(&self, servers: &[(&str, &str)]) -> McpServers {
        let specs = servers.iter().map(|(name, toml)| spec(name, toml)).collect();
        McpServers::start(specs, self.options()).await
    }
}

/// A validated server from its TOML table body.
pub(crate) fn spec(name: &str, toml_text: &str) -> ServerSpec {
    let config: McpServerConfig = toml::from_str(toml_text).unwrap();
    config.validate(name).unwrap()
}

/// A TOML string literal.
pub(crate) fn quoted(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

pub(crate) fn tool(servers: &McpServers, name: &str) -> Arc<dyn Tool> {
    servers
        .tools()
        .into_iter()
        .find(|tool| tool.spec().name == name)
        .unwrap_or_else(|| panic!("no tool {name} in {:?}", names(servers)))
}

pub(crate) fn names(servers: &McpServers) -> Vec<String> {
    servers.tools().iter().map(|tool| tool.spec().name.clone()).collect()
}

pub(crate) fn context(workspace: &Path) -> ToolContext {
    ToolContext {
        workspace: workspace.to_path_buf(),
        session_id: SessionId(uuid::Uuid::nil()),
        call_id: ToolCallId::from("c1"),
        sandbox: SandboxMode::Managed,
        boundary: Default::default(),
        denied_paths: Default::default(),
        write_denied_paths: Default::default(),
        elicitor: None,
    }
}

pub(crate) async fn call(
    servers: &McpServers,
    name: &str,
    arguments: serde_json::Value,
) -> ToolOutput {
    let workspace = std::env::temp_dir();
    tool(servers, name).invoke(&context(&workspace), &arguments).await
}

/// The text inside a fence (asserting it is one, from `source`).
pub(crate) fn unfence<'a>(text: &'a str, source: &str) -> &'a str {
    let first_end = text.find('\n').unwrap_or_else(|| panic!("not fenced: {text}"));
    assert!(
        text[..first_end].starts_with(&format!("<<<untrusted:{source}:")),
        "not fenced as {source}: {text}"
    );
    let last_start = text.rfind('\n').unwrap();
    assert!(text[last_start + 1..].starts_with(&format!("<<<end untrusted:{source}:")), "{text}");
    &text[first_end + 1..last_start]
}
