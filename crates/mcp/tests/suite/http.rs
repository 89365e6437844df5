//! npm's server-everything over streamable HTTP on a loopback port.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keel_contracts::{Access, Egress, Outcome};
use keel_mcp::{AccessSource, ServerState};

use super::support::{Scratch, call, names, server_js, unfence};

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

#[tokio::test]
async fn streamable_http_server_everything_lists_tools_and_answers_echo() {
    let server = HttpEverything::start();
    let scratch = Scratch::new();
    let servers = scratch.start(&[("remote", &format!("url = \"{}\"", server.url()))]).await;
    let status = &servers.statuses()[0];
    assert_eq!(status.state, ServerState::Connected, "{status:?}");
    assert_eq!(status.transport, format!("http: {}", server.url()));
    assert!(names(&servers).iter().any(|name| name == "mcp__remote__get-sum"));
    // A remote server's undeclared tools are writes with external egress.
    let echo = status.tools.iter().find(|tool| tool.server_tool == "echo").unwrap();
    assert_eq!(
        (echo.access, echo.effects.egress, echo.source),
        (Access::Write, Egress::External, AccessSource::Default)
    );

    let output =
        call(&servers, "mcp__remote__echo", serde_json::json!({"message": "over http"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(unfence(&output.content, "mcp__remote__echo"), "Echo: over http");
    let output = call(&servers, "mcp__remote__get-sum", serde_json::json!({"a": 1, "b": 2})).await;
    assert!(unfence(&output.content, "mcp__remote__get-sum").contains('3'), "{}", output.content);
}

#[tokio::test]
async fn an_unreachable_http_server_is_reported_not_fatal() {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port();
    let scratch = Scratch::new();
    let config = format!("url = \"http://127.0.0.1:{port}/mcp\"\nstartup_timeout_ms = 5000");
    let servers = scratch.start(&[("down", &config)]).await;
    assert!(
        matches!(&servers.statuses()[0].state, ServerState::Failed { .. }),
        "{:?}",
        servers.statuses()
    );
    assert!(servers.tools().is_empty());
}
