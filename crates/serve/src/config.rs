//! The host's settings: what `keel serve`'s flags set ([`ServeConfig`]), and the address it
//! listens on ([`parse_listen`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The host's settings (`keel serve` flags).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen (`127.0.0.1:7711`; port 0 picks one, printed at start).
    pub listen: SocketAddr,
    /// Whether a non-loopback `listen` is allowed (`--allow-remote`).
    pub allow_remote: bool,
    /// Workspaces must lie inside one of these (canonicalized at start).
    pub workspace_roots: Vec<PathBuf>,
    /// Runs driven at once; more answer 503.
    pub max_runs: usize,
    /// How long a permission request waits for an answer before it ends as deny.
    pub approval_timeout: Duration,
    /// Time between `: ping` comments on an idle stream.
    pub ping_interval: Duration,
    /// How often a stream re-reads the store for writes by other processes.
    pub poll_interval: Duration,
    /// A client that takes no event for this long is dropped.
    pub slow_client: Duration,
    /// Events buffered per stream.
    pub sse_buffer: usize,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// How often the host looks for runs of dead processes to take over.
    pub takeover_interval: Duration,
}

impl ServeConfig {
    /// The defaults for `listen`: 16 runs, a 10-minute approval timeout, 15 s pings,
    /// 1 s polls, 30 s for a slow client, 256 buffered events, 1 MiB bodies, a takeover
    /// check every 10 s; workspaces inside `workspace_roots`.
    pub fn new(listen: SocketAddr, workspace_roots: Vec<PathBuf>) -> ServeConfig {
        ServeConfig {
            listen,
            allow_remote: false,
            workspace_roots,
            max_runs: 16,
            approval_timeout: Duration::from_secs(600),
            ping_interval: Duration::from_secs(15),
            poll_interval: Duration::from_secs(1),
            slow_client: Duration::from_secs(30),
            sse_buffer: 256,
            max_body_bytes: 1024 * 1024,
            takeover_interval: keel_kernel::LEASE_RENEW_EVERY,
        }
    }
}

/// A `--listen` address: `IP:PORT` (`[::1]:PORT` for IPv6), or `localhost:PORT`, which is
/// the IPv4 loopback (no resolver is asked: `localhost` is always this machine here).
///
/// # Errors
///
/// A message naming the accepted forms, for any other text (a host name other than
/// `localhost`, a missing or invalid port).
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    let invalid = || {
        format!(
            "invalid address '{text}': give IP:PORT (127.0.0.1:7711, [::1]:7711) or \
             localhost:PORT"
        )
    };
    let (host, port) = text.rsplit_once(':').ok_or_else(invalid)?;
    if !host.eq_ignore_ascii_case("localhost") {
        return Err(invalid());
    }
    let port: u16 = port.parse().map_err(|_| invalid())?;
    Ok(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_ip_and_port_or_localhost_and_refuses_other_names() {
        assert_eq!(parse_listen("127.0.0.1:7711"), Ok(SocketAddr::from(([127, 0, 0, 1], 7711))));
        assert_eq!(parse_listen("localhost:7711"), Ok(SocketAddr::from(([127, 0, 0, 1], 7711))));
        assert_eq!(parse_listen("LOCALHOST:0"), Ok(SocketAddr::from(([127, 0, 0, 1], 0))));
        let v6 = parse_listen("[::1]:8080");
        assert!(v6.is_ok_and(|address| address.ip().is_loopback() && address.port() == 8080));
        let wide = parse_listen("0.0.0.0:7711");
        assert!(wide.is_ok_and(|address| !address.ip().is_loopback()));
        for bad in ["localhost", "localhost:", "localhost:99999", "example.com:7711", "", ":7711"] {
            assert!(parse_listen(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
