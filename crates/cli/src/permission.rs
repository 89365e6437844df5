//! `--approval ask`: consent asked at the terminal.

use std::io::{BufRead, IsTerminal, Write};

use async_trait::async_trait;
use keel_contracts::PermissionAnswer;
use keel_kernel::{PermissionHook, PermissionRequest};

/// Asks on stderr and reads the answer from the terminal.
#[derive(Debug, Default)]
pub(crate) struct TerminalPrompt;

impl TerminalPrompt {
    /// Whether a person can answer: stdin and stderr are terminals.
    pub(crate) fn available() -> bool {
        std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
    }
}

#[async_trait]
impl PermissionHook for TerminalPrompt {
    async fn decide(&self, request: &PermissionRequest<'_>) -> (PermissionAnswer, String) {
        let question = format!(
            "\nkeel wants to run {} ({} access) with arguments:\n  {}\n\
             Allow? [y] once  [e] this exact call again for 24 h  [s] for this session (tool '{}', \
             any arguments)  [n] deny: ",
            request.tool,
            request.access.as_str(),
            request.arguments,
            request.tool,
        );
        let answer = tokio::task::spawn_blocking(move || {
            let mut stderr = std::io::stderr();
            loop {
                let _ = write!(stderr, "{question}");
                let _ = stderr.flush();
                let mut line = String::new();
                match std::io::stdin().lock().read_line(&mut line) {
                    Ok(0) | Err(_) => return PermissionAnswer::Deny,
                    Ok(_) => {}
                }
                match line.trim().to_ascii_lowercase().as_str() {
                    "y" | "yes" => return PermissionAnswer::AllowOnce,
                    "s" | "session" => return PermissionAnswer::AllowSession,
                    "e" | "exact" => return PermissionAnswer::AllowExact,
                    "n" | "no" | "" => return PermissionAnswer::Deny,
                    _ => {}
                }
            }
        })
        .await
        .unwrap_or(PermissionAnswer::Deny);
        (answer, "user".to_owned())
    }
}
