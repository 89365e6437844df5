//! npm's server-everything over streamable HTTP on a loopback port.

use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use keel_contracts::{Access, Egress, Outcome};
use keel_mcp::{AccessSource, McpServers, ServerState};

use super::support::{HttpEverything, Scratch, call, names, unfence};

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

#[tokio::test]
async fn a_restarted_http_server_answers_the_next_call_at_once() {
    let server = HttpEverything::start();
    let port = server.port;
    let scratch = Scratch::new();
    // A long tool timeout: a call that waited for it would show in the bound below.
    let config = format!("url = \"{}\"\ntool_timeout_ms = 60000", server.url());
    let servers = scratch.start(&[("remote", &config)]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let echo = |message: &str| {
        call(&servers, "mcp__remote__echo", serde_json::json!({"message": message}))
    };
    let output = echo("before").await;
    assert_eq!(unfence(&output.content, "mcp__remote__echo"), "Echo: before");

    // The server goes away: the next call fails at once, naming the connection, not the timeout.
    server.stop();
    let started = Instant::now();
    let output = echo("while down").await;
    assert_eq!(output.outcome, Outcome::Error, "{}", output.content);
    assert!(!output.content.contains("did not answer within"), "{}", output.content);
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());

    // It comes back on the same port with no memory of keel's session: a new session is
    // started and the call works.
    let server = HttpEverything::start_on(port);
    let started = Instant::now();
    let output = echo("after").await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(unfence(&output.content, "mcp__remote__echo"), "Echo: after");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    let output = echo("again").await;
    assert_eq!(unfence(&output.content, "mcp__remote__echo"), "Echo: again");
    drop(server);
}

#[tokio::test]
async fn a_restart_without_a_call_in_between_starts_a_new_session() {
    let server = HttpEverything::start();
    let port = server.port;
    let scratch = Scratch::new();
    let config = format!("url = \"{}\"\ntool_timeout_ms = 60000", server.url());
    let servers = scratch.start(&[("remote", &config)]).await;
    server.stop();
    let _server = HttpEverything::start_on(port);
    let started = Instant::now();
    let output = call(&servers, "mcp__remote__echo", serde_json::json!({"message": "x"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(unfence(&output.content, "mcp__remote__echo"), "Echo: x");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
}

/// A loopback TCP relay in front of `target` that records the first line of every HTTP
/// request keel sends through it (`DELETE /mcp HTTP/1.1`), in the order `target` gets them.
struct RecordingRelay {
    port: u16,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl RecordingRelay {
    async fn start(target: u16) -> RecordingRelay {
        RecordingRelay::start_delaying_gets(target, Duration::ZERO).await
    }

    /// A relay that holds each GET request for `delay` before passing it on (a slow
    /// network, or a client thread that the OS did not run for a while).
    async fn start_delaying_gets(target: u16, delay: Duration) -> RecordingRelay {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(mut server) =
                        tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, target)).await
                    else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.split();
                    let (mut server_read, mut server_write) = server.split();
                    let upstream = async {
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            let n = match client_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let text = String::from_utf8_lossy(&buffer[..n]);
                            if text.starts_with("GET ") {
                                tokio::time::sleep(delay).await;
                            }
                            for method in ["GET ", "POST ", "DELETE "] {
                                for (at, _) in text.match_indices(method) {
                                    let rest = &text[at..];
                                    let head = rest.split("\r\n\r\n").next().unwrap_or("");
                                    if head.lines().next().is_some_and(|l| l.ends_with("HTTP/1.1"))
                                    {
                                        seen.lock().unwrap().push(head.to_owned());
                                    }
                                }
                            }
                            if server_write.write_all(&buffer[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = server_write.shutdown().await;
                    };
                    let downstream = tokio::io::copy(&mut server_read, &mut client_write);
                    let _ = tokio::join!(upstream, downstream);
                });
            }
        });
        RecordingRelay { port, requests }
    }

    /// The request lines (`POST /mcp HTTP/1.1`).
    fn requests(&self) -> Vec<String> {
        self.heads().iter().map(|head| head.lines().next().unwrap_or("").to_owned()).collect()
    }

    /// Each request's head: request line and headers.
    fn heads(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn closing_the_servers_deletes_the_http_session() {
    let server = HttpEverything::start();
    let relay = RecordingRelay::start(server.port).await;
    let scratch = Scratch::new();
    let config = format!("url = \"http://127.0.0.1:{}/mcp\"", relay.port);
    let servers = scratch.start(&[("remote", &config)]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let output = call(&servers, "mcp__remote__echo", serde_json::json!({"message": "hi"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert!(
        !relay.requests().iter().any(|line| line.starts_with("DELETE")),
        "{:?}",
        relay.requests()
    );
    servers.close().await;
    assert!(
        relay.requests().iter().any(|line| line == "DELETE /mcp HTTP/1.1"),
        "{:?}",
        relay.requests()
    );
    // A tool used after close starts a new session.
    let output = call(&servers, "mcp__remote__echo", serde_json::json!({"message": "again"})).await;
    assert_eq!(unfence(&output.content, "mcp__remote__echo"), "Echo: again");
}

/// The servers of `scratch` with one, `remote`, reached through `relay`; connected.
async fn connected_through(relay: &RecordingRelay, scratch: &Scratch) -> McpServers {
    let config = format!("url = \"http://127.0.0.1:{}/mcp\"", relay.port);
    let servers = scratch.start(&[("remote", &config)]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    servers
}

/// rmcp opens a session's GET stream from a task of its own while it goes on sending
/// requests. When that GET reached the server late (a client thread not run for a while
/// under CPU load), the first requests overtook it, and a server that resumes a call's
/// closed stream on the session's next GET answered the call on it before the call's own
/// stream closed (the conformance suite's `sse-retry` failing under load). keel sends a
/// new session's requests once the server has answered that GET.
#[tokio::test]
async fn a_new_sessions_requests_wait_until_the_server_answered_its_get_stream() {
    let server = HttpEverything::start();
    let relay = RecordingRelay::start_delaying_gets(server.port, Duration::from_millis(700)).await;
    let scratch = Scratch::new();
    let servers = connected_through(&relay, &scratch).await;
    let output = call(&servers, "mcp__remote__echo", serde_json::json!({"message": "hi"})).await;
    assert_eq!(unfence(&output.content, "mcp__remote__echo"), "Echo: hi");
    // initialize, notifications/initialized, the session's GET, and only then the rest.
    let requests = relay.requests();
    assert_eq!(
        requests[..4],
        ["POST /mcp HTTP/1.1", "POST /mcp HTTP/1.1", "GET /mcp HTTP/1.1", "POST /mcp HTTP/1.1"],
        "{requests:?}"
    );
    servers.close().await;
}

/// A server that never answers the session's GET holds the first request back for
/// `SESSION_STREAM_WAIT` (3 s) at most, and the ones after it not at all.
#[tokio::test]
async fn an_unanswered_get_stream_delays_a_new_sessions_requests_only_for_a_while() {
    let server = HttpEverything::start();
    let relay = RecordingRelay::start_delaying_gets(server.port, Duration::from_secs(600)).await;
    let scratch = Scratch::new();
    let started = Instant::now();
    let servers = connected_through(&relay, &scratch).await;
    let connected = started.elapsed();
    assert!(
        connected >= Duration::from_secs(3) && connected < Duration::from_secs(15),
        "{connected:?}"
    );
    let asked = Instant::now();
    let output = call(&servers, "mcp__remote__echo", serde_json::json!({"message": "hi"})).await;
    assert_eq!(unfence(&output.content, "mcp__remote__echo"), "Echo: hi");
    assert!(asked.elapsed() < Duration::from_secs(3), "{:?}", asked.elapsed());
    assert!(!relay.requests().iter().any(|line| line.starts_with("GET")), "{:?}", relay.requests());
}

#[tokio::test]
async fn configured_headers_and_the_bearer_token_are_sent_with_every_request() {
    let server = HttpEverything::start();
    let relay = RecordingRelay::start(server.port).await;
    let scratch = Scratch::new();
    let variable = "KEEL_MCP_TEST_BEARER_TOKEN";
    let config = format!(
        "url = \"http://127.0.0.1:{}/mcp\"\nbearer_token_env = \"{variable}\"\n\
         headers = {{ X-Tenant = \"acme\" }}",
        relay.port
    );
    let mut options = scratch.options();
    options.bearer_tokens.0.insert(variable.to_owned(), "t0ken-s3cret".to_owned());
    assert!(!format!("{options:?}").contains("t0ken-s3cret"), "{options:?}");
    let servers = McpServers::start(vec![super::support::spec("remote", &config)], options).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let output = call(&servers, "mcp__remote__echo", serde_json::json!({"message": "hi"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    let posts: Vec<String> =
        relay.heads().into_iter().filter(|head| head.starts_with("POST ")).collect();
    assert!(posts.len() >= 3, "{posts:?}");
    for head in &posts {
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("\r\nauthorization: bearer t0ken-s3cret"), "{head}");
        assert!(lower.contains("\r\nx-tenant: acme"), "{head}");
    }
    // The token shows nowhere keel reports about the server.
    let report = format!("{:?}", servers.statuses());
    assert!(!report.contains("t0ken-s3cret"), "{report}");
}

#[tokio::test]
async fn a_missing_bearer_token_variable_is_named_and_nothing_is_sent() {
    let server = HttpEverything::start();
    let relay = RecordingRelay::start(server.port).await;
    let scratch = Scratch::new();
    let config = format!(
        "url = \"http://127.0.0.1:{}/mcp\"\nbearer_token_env = \"KEEL_MCP_TEST_UNSET_TOKEN\"",
        relay.port
    );
    let servers = scratch.start(&[("remote", &config)]).await;
    let ServerState::Failed { reason } = &servers.statuses()[0].state else {
        panic!("{:?}", servers.statuses());
    };
    assert!(reason.contains("KEEL_MCP_TEST_UNSET_TOKEN"), "{reason}");
    assert!(relay.heads().is_empty(), "{:?}", relay.heads());
}

#[tokio::test]
async fn a_server_that_wants_a_login_is_reported_as_such() {
    use std::io::{Read as _, Write as _};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_millis(300)));
            let mut buffer = [0u8; 8192];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer resource_metadata=\
                     \"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp\"\r\n\
                     content-length: 0\r\nconnection: close\r\n\r\n"
                )
                .as_bytes(),
            );
        }
    });
    let scratch = Scratch::new();
    let config = format!("url = \"http://127.0.0.1:{port}/mcp\"\nstartup_timeout_ms = 10000");
    let servers = scratch.start(&[("locked", &config)]).await;
    let ServerState::Failed { reason } = &servers.statuses()[0].state else {
        panic!("{:?}", servers.statuses());
    };
    assert!(reason.contains("requires authorization"), "{reason}");
    // A headless start never waits for a browser: it names the command that logs in.
    assert!(reason.contains("keel mcp login locked"), "{reason}");
    assert!(reason.contains("bearer_token_env"), "{reason}");
}

/// A minimal streamable HTTP MCP server on loopback that answers `tools/call` with
/// `500 text/plain` (one thread per connection, `Connection: close`).
fn failing_http_server() -> u16 {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request_line = String::new();
                let _ = reader.read_line(&mut request_line);
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                let message: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let (status, kind, text) = match message["method"].as_str() {
                    _ if !request_line.starts_with("POST") => {
                        ("405 Method Not Allowed", "text/plain", String::new())
                    }
                    Some("initialize") => (
                        "200 OK",
                        "application/json",
                        serde_json::json!({
                        "jsonrpc": "2.0", "id": message["id"], "result": {
                            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                            "serverInfo": {"name": "failing", "version": "0"}}})
                        .to_string(),
                    ),
                    Some("tools/list") => (
                        "200 OK",
                        "application/json",
                        serde_json::json!({
                        "jsonrpc": "2.0", "id": message["id"], "result": {"tools": [
                            {"name": "boom", "inputSchema": {"type": "object"}}]}})
                        .to_string(),
                    ),
                    Some("tools/call") => {
                        ("500 Internal Server Error", "text/plain", "kaboom".to_owned())
                    }
                    _ => ("202 Accepted", "text/plain", String::new()),
                };
                let mut stream = stream;
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
                         mcp-session-id: s1\r\nconnection: close\r\n\r\n{text}",
                        text.len()
                    )
                    .as_bytes(),
                );
            });
        }
    });
    port
}

#[tokio::test]
async fn an_http_error_on_a_call_ends_that_call_at_once_with_its_status() {
    let port = failing_http_server();
    let scratch = Scratch::new();
    let config = format!("url = \"http://127.0.0.1:{port}/mcp\"\ntool_timeout_ms = 60000");
    let servers = scratch.start(&[("failing", &config)]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let started = Instant::now();
    let output = call(&servers, "mcp__failing__boom", serde_json::json!({})).await;
    assert_eq!(output.outcome, Outcome::Error, "{}", output.content);
    assert!(output.content.contains("500"), "{}", output.content);
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
}

/// A server that answers with a redirect to another host does not get the user's headers
/// sent there: keel follows no redirect (reqwest would keep custom headers across it).
#[tokio::test]
async fn redteam_mcp_a_redirect_never_carries_the_users_headers_elsewhere() {
    let server = HttpEverything::start();
    let elsewhere = RecordingRelay::start(server.port).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirecting = listener.local_addr().unwrap().port();
    let target = elsewhere.port;
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buffer = vec![0_u8; 65536];
            let _ = stream.read(&mut buffer).await;
            let answer = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:{target}/mcp\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    let scratch = Scratch::new();
    let variable = "KEEL_MCP_TEST_REDIRECT_TOKEN";
    let config = format!(
        "url = \"http://127.0.0.1:{redirecting}/mcp\"\nbearer_token_env = \"{variable}\"\n\
         headers = {{ X-Api-Key = \"hdr-s3cret\" }}"
    );
    let mut options = scratch.options();
    options.bearer_tokens.0.insert(variable.to_owned(), "t0ken-s3cret".to_owned());
    let servers = McpServers::start(vec![super::support::spec("remote", &config)], options).await;
    assert!(
        matches!(servers.statuses()[0].state, ServerState::Failed { .. }),
        "{:?}",
        servers.statuses()
    );
    assert!(elsewhere.heads().is_empty(), "{:?}", elsewhere.heads());
}

#[tokio::test]
async fn a_task_only_tool_is_left_out_over_http_as_over_stdio() {
    let server = HttpEverything::start();
    let scratch = Scratch::new();
    let servers = scratch.start(&[("remote", &format!("url = \"{}\"", server.url()))]).await;
    let status = &servers.statuses()[0];
    assert_eq!(status.state, ServerState::Connected, "{status:?}");
    // server-everything's simulate-research-query says execution.taskSupport = required.
    assert!(
        !names(&servers).iter().any(|name| name == "mcp__remote__simulate-research-query"),
        "{:?}",
        names(&servers)
    );
    assert!(
        status.notes.iter().any(|note| note.contains("simulate-research-query")
            && note.contains("can only run as a task")),
        "{:?}",
        status.notes
    );
    // The neighbours over the same stream are listed and work.
    let output = call(&servers, "mcp__remote__echo", serde_json::json!({"message": "hi"})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
}
