//! How consent is answered for a run (`--approval ask|auto|sandboxed|deny`): the policy
//! ([`Approver`]), shared by `keel run` and `keel serve`, and the person it asks: the
//! prompt at the terminal ([`TerminalPrompt`]) for the CLI, the ledger and HTTP for the
//! host (keel-serve's `RemotePerson`).
//!
//! Two rules hold in every mode (DESIGN.md §5):
//! - **A wider boundary needs a person.** `request_boundary` is never approved by a blanket
//!   answer (`auto`, `sandboxed`): it is asked at the terminal, or granted by an explicit
//!   rule in the user's own config (`request_boundary` for any request, or
//!   `request_boundary(PATTERN)` for requests whose every path matches PATTERN and that
//!   do not ask for the network); headless, it is refused with that reason. Allow rules
//!   come only from the user's config (see `config.rs`), never from the workspace file.
//! - **A consent prompt cannot be forged.** Everything the prompt shows from the call
//!   (tool name, argument names and values) is neutralised by [`crate::terminal`] and
//!   framed line by line, so no argument can erase, overwrite or imitate the question.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{
    ApprovalMode, ElicitationAnswer, EventKind, PermissionAnswer, SandboxMode, Seq, Store,
};
use keel_kernel::{ElicitationQuestion, NOBODY_TO_ASK, PermissionHook, PermissionRequest};

use crate::terminal::one_line;

/// The intrinsic tool that asks to widen the boundary.
pub const REQUEST_BOUNDARY: &str = "request_boundary";

/// Who refused a call when keel chose `deny` only because nobody can answer (no
/// terminal, no `--approval`). The view shows it with the refused call, so the notice
/// appears only when a call is actually refused for it.
pub const BY_NO_TERMINAL: &str =
    "no terminal to ask: pass --approval sandboxed (or auto) to let such calls run headless";

/// The answer policy of one run. See the module doc.
#[derive(Debug)]
pub struct Approver {
    /// The mode asked for.
    pub mode: ApprovalMode,
    /// Whether `mode` is `deny` only because there is no terminal (nothing was chosen).
    pub implicit: bool,
    /// Who answers when a person must: the terminal prompt, the host's remote approvals;
    /// `None` when nobody can (headless).
    pub person: Option<Arc<dyn PermissionHook>>,
    /// The run's sandbox: `sandboxed` approves nothing when it is `bypass`.
    pub sandbox: SandboxMode,
    /// The workspace root (canonical).
    pub workspace: PathBuf,
    /// `request_boundary(PATTERN)` rules from the user's config: the patterns.
    pub boundary_patterns: Vec<String>,
    /// The ledger, to see whether the session's boundary was widened before.
    pub store: Arc<dyn Store>,
}

impl Approver {
    /// The `request_boundary(PATTERN)` patterns among the user's allow rules.
    pub fn boundary_patterns(allow: &[String]) -> Vec<String> {
        allow
            .iter()
            .filter_map(|rule| {
                let rest = rule.trim().strip_prefix(REQUEST_BOUNDARY)?.trim_start();
                let pattern = rest.strip_prefix('(')?.strip_suffix(')')?;
                (!pattern.is_empty()).then(|| pattern.to_owned())
            })
            .collect()
    }

    /// The user rule that grants this boundary request, if one does.
    fn boundary_rule(&self, arguments: &serde_json::Value) -> Option<String> {
        if arguments.get("network").and_then(serde_json::Value::as_bool) == Some(true) {
            return None;
        }
        let paths: Vec<String> = arguments
            .get("paths")?
            .as_array()?
            .iter()
            .map(|entry| entry.get("path").and_then(serde_json::Value::as_str).map(str::to_owned))
            .collect::<Option<_>>()?;
        if paths.is_empty() {
            return None;
        }
        // A rule grants only paths that lead where they say: one that goes through a
        // symbolic link (which a command could have made, or retarget later) is asked.
        let mut absolute = Vec::new();
        for path in &paths {
            let lexical = lexical_absolute(&self.workspace, Path::new(path));
            if resolve_existing(&self.workspace, path) != lexical {
                return None;
            }
            absolute.push(lexical.display().to_string());
        }
        self.boundary_patterns
            .iter()
            .find(|pattern| {
                absolute.iter().all(|path| wildcard_match(pattern.as_bytes(), path.as_bytes()))
            })
            .map(|pattern| format!("rule:{REQUEST_BOUNDARY}({pattern})"))
    }

    /// `Ok` when the managed sandbox contains the call (a command, or a file edit inside
    /// the workspace, with the session's boundary never widened); else why not.
    async fn contained(&self, request: &PermissionRequest<'_>) -> Result<(), String> {
        if self.sandbox != SandboxMode::Managed {
            return Err("the sandbox is bypassed, so nothing is contained".to_owned());
        }
        match request.tool {
            "bash" => {}
            "write_file" | "edit_file" => {
                let path = request.arguments.get("path").and_then(serde_json::Value::as_str);
                let Some(target) = path.map(|path| resolve_existing(&self.workspace, path)) else {
                    return Err(format!("{} names no path", request.tool));
                };
                if !target.starts_with(&self.workspace) {
                    return Err(format!("{} writes outside the workspace", request.tool));
                }
                // Git and keel metadata are not the workspace's content: a hook or a
                // config planted there runs outside the sandbox later.
                let metadata = target
                    .strip_prefix(&self.workspace)
                    .map(|inner| {
                        inner
                            .components()
                            .any(|c| matches!(c.as_os_str().to_str(), Some(".git" | ".keel")))
                    })
                    .unwrap_or(true);
                if metadata {
                    return Err(format!("{} writes git or keel metadata", request.tool));
                }
            }
            other => {
                return Err(format!(
                    "'{}' is not contained by the sandbox (only bash and file edits in the \
                     workspace are)",
                    one_line(other, 60)
                ));
            }
        }
        match self.store.read(request.session_id, Seq(0)).await {
            Ok(events) => {
                if events.iter().any(|e| matches!(e.kind, EventKind::BoundaryRevised { .. })) {
                    return Err("the session's boundary was widened".to_owned());
                }
                Ok(())
            }
            Err(error) => Err(format!("cannot read the session's boundary: {error}")),
        }
    }

    /// `ask`: the person answers; with nobody to ask, deny (fail closed).
    async fn ask_person(&self, request: &PermissionRequest<'_>) -> (PermissionAnswer, String) {
        self.prompt_or_refuse(request, "approval=ask, and nobody to ask".to_owned()).await
    }

    async fn prompt_or_refuse(
        &self,
        request: &PermissionRequest<'_>,
        why: String,
    ) -> (PermissionAnswer, String) {
        match &self.person {
            Some(person) => person.decide(request).await,
            None => (PermissionAnswer::Deny, why),
        }
    }
}

#[async_trait]
impl PermissionHook for Approver {
    async fn decide(&self, request: &PermissionRequest<'_>) -> (PermissionAnswer, String) {
        let mode = match self.mode {
            ApprovalMode::Ask => "ask",
            ApprovalMode::Auto => "auto",
            ApprovalMode::Sandboxed => "sandboxed",
            ApprovalMode::Deny => "deny",
        };
        if request.tool == REQUEST_BOUNDARY {
            if let Some(rule) = self.boundary_rule(request.arguments) {
                return (PermissionAnswer::AllowOnce, rule);
            }
            return match self.mode {
                ApprovalMode::Ask => self.ask_person(request).await,
                ApprovalMode::Auto | ApprovalMode::Sandboxed => {
                    let why = format!(
                        "approval={mode}: a wider boundary needs a person; answer at a \
                         terminal, or allow it in your config with {REQUEST_BOUNDARY}(PATH)"
                    );
                    self.prompt_or_refuse(request, why).await
                }
                ApprovalMode::Deny if self.implicit => {
                    (PermissionAnswer::Deny, BY_NO_TERMINAL.to_owned())
                }
                ApprovalMode::Deny => (PermissionAnswer::Deny, "approval=deny".to_owned()),
            };
        }
        match self.mode {
            ApprovalMode::Ask => self.ask_person(request).await,
            ApprovalMode::Auto => (PermissionAnswer::AllowOnce, "approval=auto".to_owned()),
            ApprovalMode::Sandboxed => match self.contained(request).await {
                Ok(()) => (PermissionAnswer::AllowOnce, "approval=sandboxed".to_owned()),
                Err(why) => {
                    let why = format!("approval=sandboxed: {why}, and no terminal to ask");
                    self.prompt_or_refuse(request, why).await
                }
            },
            ApprovalMode::Deny if self.implicit => {
                (PermissionAnswer::Deny, BY_NO_TERMINAL.to_owned())
            }
            ApprovalMode::Deny => (PermissionAnswer::Deny, "approval=deny".to_owned()),
        }
    }

    /// A server's question: `deny` declines it; `auto` accepts a form whose required
    /// fields all have defaults with them; otherwise the person answers, and with nobody
    /// to ask it is declined with that reason.
    async fn elicit(&self, question: &ElicitationQuestion<'_>) -> ElicitationAnswer {
        match self.mode {
            ApprovalMode::Deny if self.implicit => {
                return ElicitationAnswer::decline("keel", NOBODY_TO_ASK);
            }
            ApprovalMode::Deny => {
                return keel_kernel::answer_by_policy(false, question.form);
            }
            ApprovalMode::Auto => {
                if let Ok(content) = question.form.defaults() {
                    return ElicitationAnswer::accept(content, "approval=auto");
                }
            }
            ApprovalMode::Ask | ApprovalMode::Sandboxed => {}
        }
        match &self.person {
            Some(person) => person.elicit(question).await,
            None if self.mode == ApprovalMode::Auto => {
                keel_kernel::answer_by_policy(true, question.form)
            }
            None => ElicitationAnswer::decline("keel", NOBODY_TO_ASK),
        }
    }

    fn elicits_at_once(&self) -> bool {
        self.person.is_none() || self.mode == ApprovalMode::Deny
    }

    /// `auto` and `deny` answer every call but `request_boundary` from the mode alone;
    /// `ask` and `sandboxed` may prompt, so their requests are committed before asking.
    fn answers_at_once(&self, request: &PermissionRequest<'_>) -> bool {
        request.tool != REQUEST_BOUNDARY
            && matches!(self.mode, ApprovalMode::Auto | ApprovalMode::Deny)
    }
}

/// `path` made absolute against `workspace` and normalised lexically (`.` and `..`
/// resolved without touching the file system; the tools resolve links themselves).
fn lexical_absolute(workspace: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() { path.to_path_buf() } else { workspace.join(path) };
    let mut out = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Where a file tool's `path` leads: made absolute against `workspace`, normalised, and
/// with its longest existing prefix resolved through symbolic links (so a link inside
/// the workspace that leads out, or into `.git`, is judged by where it leads).
fn resolve_existing(workspace: &Path, path: &str) -> PathBuf {
    let lexical = lexical_absolute(workspace, Path::new(path));
    let mut existing = lexical.as_path();
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    loop {
        if let Ok(resolved) = existing.canonicalize() {
            let mut out = resolved;
            out.extend(rest.iter().rev());
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return lexical,
        }
    }
}

/// `*` matches any run of bytes (including `/`), `?` one byte; the rest literally.
fn wildcard_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p + 1, t));
            p += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Asks on stderr and reads the answer from the terminal.
#[derive(Debug, Default)]
pub struct TerminalPrompt;

/// Lines of one argument value shown in a prompt.
const PROMPT_VALUE_LINES: usize = 12;
/// Lines of arguments shown in a prompt, in all.
const PROMPT_TOTAL_LINES: usize = 40;
/// Characters of one prompt line.
const PROMPT_LINE_CHARS: usize = 200;

impl TerminalPrompt {
    /// Whether a person can answer: stdin and stderr are terminals.
    pub fn available() -> bool {
        std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
    }

    /// The question for one request. Every line from the call is neutralised and starts
    /// with `│ `; only the first line (`┌ keel asks…`) and the last (`└ Allow? …`) are
    /// keel's own, so nothing in the call can erase, overwrite or imitate them.
    pub fn question(request: &PermissionRequest<'_>) -> String {
        let tool = one_line(request.tool, 60);
        let mut lines = vec![format!(
            "┌ keel asks to run {tool} ({} access) with these arguments:",
            request.access.as_str()
        )];
        let mut body: Vec<String> = Vec::new();
        match request.arguments {
            serde_json::Value::Object(map) if !map.is_empty() => {
                // What the call acts on first (the command, the path), then the rest.
                let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
                entries.sort_by_key(|(key, _)| !matches!(key.as_str(), "command" | "path"));
                for (key, value) in entries {
                    let key = one_line(key, 40);
                    match value {
                        serde_json::Value::String(text) => {
                            let shown = crate::terminal::block(
                                text,
                                PROMPT_VALUE_LINES,
                                PROMPT_LINE_CHARS,
                                false,
                            );
                            if shown.len() <= 1 {
                                body.push(format!(
                                    "{key}: {}",
                                    shown.first().map_or("", String::as_str)
                                ));
                            } else {
                                body.push(format!("{key}:"));
                                body.extend(shown.into_iter().map(|line| format!("  {line}")));
                            }
                        }
                        other => body.push(format!(
                            "{key}: {}",
                            one_line(&other.to_string(), PROMPT_LINE_CHARS)
                        )),
                    }
                }
            }
            other => body.push(one_line(&other.to_string(), PROMPT_LINE_CHARS)),
        }
        let n_body = body.len();
        if n_body > PROMPT_TOTAL_LINES {
            body.truncate(PROMPT_TOTAL_LINES);
            body.push(crate::terminal::more_lines(n_body - PROMPT_TOTAL_LINES));
        }
        lines.extend(body.into_iter().map(|line| format!("│ {line}")));
        lines.push(format!(
            "└ Allow? [y] once  [e] this exact call again for 24 h  [s] for this session \
             ({tool}, any arguments)  [n] deny: "
        ));
        format!("\n{}", lines.join("\n"))
    }
}

#[async_trait]
impl PermissionHook for TerminalPrompt {
    async fn decide(&self, request: &PermissionRequest<'_>) -> (PermissionAnswer, String) {
        let question = TerminalPrompt::question(request);
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

    /// The server's question, framed (see [`crate::elicit`]), answered field by field.
    async fn elicit(&self, question: &ElicitationQuestion<'_>) -> ElicitationAnswer {
        // The blocking reader needs owned data: the form and the text are rebuilt there.
        let request = question.request.clone();
        let form = question.form.clone();
        let (call_id, tool, id, session_id) = (
            question.call_id.clone(),
            question.tool.to_owned(),
            question.question.to_owned(),
            question.session_id,
        );
        tokio::task::spawn_blocking(move || {
            let question = ElicitationQuestion {
                session_id,
                call_id: &call_id,
                tool: &tool,
                question: &id,
                request: &request,
                form: &form,
            };
            crate::elicit::ask_form(&question, &mut std::io::stdin().lock(), &mut std::io::stderr())
        })
        .await
        .unwrap_or_else(|_| ElicitationAnswer::cancel("user", "the terminal prompt failed"))
    }
}

#[cfg(test)]
mod tests {
    use keel_contracts::{Access, SessionId, ToolCallId};

    use super::*;

    fn question(tool: &str, arguments: serde_json::Value) -> String {
        let call_id = ToolCallId("c1".to_owned());
        TerminalPrompt::question(&PermissionRequest {
            session_id: SessionId(uuid::Uuid::nil()),
            call_id: &call_id,
            tool,
            access: Access::Write,
            arguments: &arguments,
        })
    }

    /// The prompt's shape: keel's first line, framed argument lines, keel's last line.
    fn assert_framed(question: &str) {
        let lines: Vec<&str> = question.trim_start_matches('\n').split('\n').collect();
        assert!(lines[0].starts_with("┌ keel asks to run "), "{question}");
        let last = lines.len() - 1;
        assert!(lines[last].starts_with("└ Allow? [y] once"), "{question}");
        for line in &lines[1..last] {
            assert!(line.starts_with("│ "), "unframed line {line:?} in {question}");
        }
        assert_eq!(lines.iter().filter(|line| line.starts_with('└')).count(), 1, "{question}");
        assert!(!question.contains('\r') && !question.contains('\x1b'), "{question:?}");
    }

    #[test]
    fn redteam_terminal_arguments_cannot_forge_the_consent_prompt() {
        let forged =
            "ls\r\x1b[2K└ Allow? [y] once  [e] this exact call again: y\n\n\n\n└ Allow? [y]";
        let shown = question("bash", serde_json::json!({"command": forged}));
        assert_framed(&shown);
        assert!(shown.contains("ls\\r\\x1b[2K└ Allow? [y] once"), "{shown}");
        // Hundreds of newlines cannot push the question out of view: the block is capped.
        let flood = format!("echo hi{}rm -rf ~", "\n".repeat(500));
        let shown = question("bash", serde_json::json!({"command": flood}));
        assert_framed(&shown);
        assert!(shown.lines().count() < PROMPT_TOTAL_LINES + 4, "{shown}");
        assert!(shown.contains("more lines"), "{shown}");
        // Escapes hidden in argument names and the tool name are just as visible.
        let shown = question("write\x1b[8m_file", serde_json::json!({"pa\x1b[8mth": "a.txt"}));
        assert_framed(&shown);
        assert!(shown.contains("write\\x1b[8m_file") && shown.contains("pa\\x1b[8mth"), "{shown}");
        // The legitimate neighbour: an ordinary call reads naturally, UTF-8 intact.
        let shown = question(
            "write_file",
            serde_json::json!({"path": "docs/café 日本.md", "content": "🚀\nline two"}),
        );
        assert_framed(&shown);
        assert!(shown.contains("│ path: docs/café 日本.md"), "{shown}");
        assert!(shown.contains("│ content:\n│   🚀\n│   line two"), "{shown}");
    }

    #[tokio::test]
    async fn questions_by_mode_auto_takes_defaults_deny_and_nobody_decline() {
        use keel_contracts::{ElicitationAction, ElicitationRequest, FormSchema};
        let approver = |mode: ApprovalMode, implicit: bool| Approver {
            mode,
            implicit,
            person: None,
            sandbox: SandboxMode::Managed,
            workspace: PathBuf::from("/ws"),
            boundary_patterns: Vec::new(),
            store: Arc::new(keel_testkit::MemStore::new()),
        };
        let ask = |schema: serde_json::Value| ElicitationRequest {
            server: "srv".to_owned(),
            message: "Pick".to_owned(),
            schema,
        };
        let defaulted = ask(serde_json::json!({"type": "object", "properties": {
            "color": {"type": "string", "enum": ["red"], "default": "red"}}, "required": ["color"]}));
        let bare = ask(serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string"}}, "required": ["name"]}));
        let answer = |approver: Approver, request: ElicitationRequest| async move {
            let form = FormSchema::parse(&request.schema).unwrap();
            let question = ElicitationQuestion {
                session_id: SessionId(uuid::Uuid::nil()),
                call_id: &ToolCallId("c1".to_owned()),
                tool: "mcp__srv__ask",
                question: "c1#1",
                request: &request,
                form: &form,
            };
            approver.elicit(&question).await
        };
        let auto = answer(approver(ApprovalMode::Auto, false), defaulted.clone()).await;
        assert_eq!((auto.action, auto.by.as_str()), (ElicitationAction::Accept, "approval=auto"));
        assert_eq!(auto.content, Some(serde_json::json!({"color": "red"})));
        let auto = answer(approver(ApprovalMode::Auto, false), bare.clone()).await;
        assert_eq!(auto.action, ElicitationAction::Decline);
        assert!(auto.reason.unwrap().contains("name"));
        let deny = answer(approver(ApprovalMode::Deny, false), defaulted.clone()).await;
        assert_eq!((deny.action, deny.by.as_str()), (ElicitationAction::Decline, "approval=deny"));
        for mode in [ApprovalMode::Ask, ApprovalMode::Sandboxed] {
            let nobody = answer(approver(mode, false), defaulted.clone()).await;
            assert_eq!(nobody.action, ElicitationAction::Decline);
            assert_eq!(nobody.reason.as_deref(), Some(keel_kernel::NOBODY_TO_ASK));
        }
        let implicit = answer(approver(ApprovalMode::Deny, true), defaulted).await;
        assert_eq!(implicit.reason.as_deref(), Some(keel_kernel::NOBODY_TO_ASK));
    }

    #[test]
    fn boundary_patterns_come_from_request_boundary_rules() {
        let allow = ["bash(git status*)".to_owned(), "request_boundary(/srv/data/*)".to_owned()];
        assert_eq!(Approver::boundary_patterns(&allow), vec!["/srv/data/*".to_owned()]);
        assert!(wildcard_match(b"/srv/data/*", b"/srv/data/a/b"));
        assert!(!wildcard_match(b"/srv/data/*", b"/srv/database"));
        assert_eq!(
            lexical_absolute(Path::new("/ws"), Path::new("a/../../etc")),
            PathBuf::from("/etc")
        );
    }
}
