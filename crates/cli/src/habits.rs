//! The session commands people reach for between runs: `keel sessions`, `log`, `stop`, and
//! `--last` wherever a session id is taken.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

use keel_contracts::{Seq, SessionId, SessionStatus, SessionSummary, Store};
use keel_host::error::usage;
use keel_host::root::{gone_holder, open_store, open_store_for_reading, shown_state};

use crate::exit;
use crate::output;
use crate::terminal::one_line;
use crate::view::{LineKind, Verbosity, View, ViewOptions};

/// A session as the user named it: an id or unique prefix, or `--last`.
#[derive(Debug, Clone)]
pub(crate) struct SessionArg {
    prefix: Option<String>,
    last: bool,
}

impl SessionArg {
    pub(crate) fn new(prefix: Option<String>, last: bool) -> SessionArg {
        SessionArg { prefix, last }
    }

    /// The session id: the prefix resolved, or the newest session for `--last`.
    ///
    /// # Errors
    ///
    /// A usage error when the prefix matches no session or several, when there is no
    /// session at all for `--last`, or when neither was given.
    pub(crate) async fn resolve(&self, store: &Arc<dyn Store>) -> anyhow::Result<SessionId> {
        match (&self.prefix, self.last) {
            (Some(prefix), false) => resolve_session(store, prefix).await,
            (None, true) => {
                let sessions = store.sessions().await?;
                sessions
                    .iter()
                    .filter(|session| session.parent.is_none())
                    .max_by_key(|session| (session.created_at, session.id))
                    .map(|session| session.id)
                    .ok_or_else(|| usage("--last: there are no sessions yet"))
            }
            (Some(_), true) => Err(usage("give a session id or --last, not both")),
            (None, false) => Err(usage("give a session id (or a unique prefix), or --last")),
        }
    }
}

/// The session a prefix of its id names (a usage error when none or several do).
async fn resolve_session(store: &Arc<dyn Store>, prefix: &str) -> anyhow::Result<SessionId> {
    store.resolve_session(prefix).await.map_err(|error| usage(error.to_string()))
}

/// `keel sessions [--json] [--tree] [-C DIR] [--limit N]`.
pub(crate) async fn sessions(
    json: bool,
    tree: bool,
    workspace: Option<&Path>,
    limit: Option<usize>,
) -> anyhow::Result<u8> {
    let (_, store) = open_store_for_reading().await?;
    let mut sessions = store.sessions().await?;
    if let Some(dir) = workspace {
        let dir = keel_host::root::canonical_workspace(Some(dir))?;
        sessions.retain(|session| Path::new(&session.workspace).starts_with(&dir));
    }
    if let Some(limit) = limit {
        if limit == 0 {
            return Err(usage("--limit must be at least 1"));
        }
        // Newest first; children stay with a parent that is kept.
        let mut kept: Vec<SessionId> = Vec::new();
        for session in sessions.iter().filter(|session| session.parent.is_none()) {
            if kept.len() < limit {
                kept.push(session.id);
            }
        }
        let ancestors_kept = |session: &SessionSummary| {
            let mut current = Some(session);
            while let Some(node) = current {
                if kept.contains(&node.id) {
                    return true;
                }
                current = node.parent.and_then(|p| sessions.iter().find(|s| s.id == p));
            }
            false
        };
        let keep: Vec<bool> = sessions.iter().map(ancestors_kept).collect();
        let mut flags = keep.into_iter();
        sessions.retain(|_| flags.next().unwrap_or(false));
    }
    // The store keeps each session's usage in its listing row: no event is read here.
    let totals: std::collections::BTreeMap<SessionId, keel_contracts::UsageTotals> =
        sessions.iter().map(|session| (session.id, session.usage)).collect();
    let cost_text = |usage: &keel_contracts::UsageTotals| match (usage.responses, usage.cost_usd) {
        (0, _) => "-".to_owned(),
        (_, Some(usd)) => format!("${usd:.4}"),
        (_, None) => "cost ?".to_owned(),
    };
    // What each session is now: a run whose process is gone is shown as interrupted.
    let mut states = std::collections::BTreeMap::new();
    for session in &sessions {
        states.insert(session.id, shown_state(store.as_ref(), session).await);
    }
    let state_of = |session: &SessionSummary| {
        states.get(&session.id).copied().unwrap_or(session.status.as_str())
    };
    if json {
        for session in &sessions {
            let usage = totals.get(&session.id).copied().unwrap_or_default();
            let line = serde_json::json!({
                "session_id": session.id,
                "created_at": session.created_at,
                "updated_at": session.updated_at,
                "workspace": session.workspace,
                "model": session.model,
                "title": session.title,
                "last_seq": session.last_seq,
                // `state`, as the HTTP listing names it (DESIGN.md §9); `status` is the
                // same value under the name this listing used first.
                "state": state_of(session),
                "status": state_of(session),
                "parent": session.parent,
                "usage": usage,
            });
            outln!("{line}");
        }
        return Ok(exit::COMPLETED);
    }
    if sessions.is_empty() {
        eprintln!("keel: no sessions yet");
        return Ok(exit::COMPLETED);
    }
    let print_row = |session: &SessionSummary, depth: usize| {
        let usage = totals.get(&session.id).copied().unwrap_or_default();
        // Local time with its offset, so a reader never guesses the zone.
        let updated = session.updated_at.with_timezone(&chrono::Local);
        outln!(
            "{}{}  {:<11}  {}  {:>8} tok  {:>9}  {}  {}  {}",
            "  ".repeat(depth),
            session.id,
            state_of(session),
            updated.format("%Y-%m-%d %H:%M:%S %:z"),
            usage.input_tokens + usage.output_tokens + usage.reasoning_tokens,
            cost_text(&usage),
            one_line(&session.model, 60),
            one_line(&session.workspace, 120),
            one_line(session.title.lines().next().unwrap_or_default(), 80)
        );
    };
    if tree {
        fn walk(
            all: &[SessionSummary],
            parent: Option<SessionId>,
            depth: usize,
            print_row: &dyn Fn(&SessionSummary, usize),
        ) {
            for session in all.iter().filter(|s| s.parent == parent) {
                print_row(session, depth);
                walk(all, Some(session.id), depth + 1, print_row);
            }
        }
        walk(&sessions, None, 0, &print_row);
    } else {
        for session in &sessions {
            print_row(session, 0);
        }
    }
    Ok(exit::COMPLETED)
}

/// `keel log SESSION|--last [--json | -v]`: the run's view (the same projection a live run
/// shows, answers included), every event (`-v`), or the exact events as JSON lines.
pub(crate) async fn log(session: &SessionArg, json: bool, verbose: bool) -> anyhow::Result<u8> {
    let (_, store) = open_store_for_reading().await?;
    let session_id = session.resolve(&store).await?;
    let events = store.read(session_id, Seq(0)).await?;
    let verbosity = if verbose { Verbosity::Verbose } else { Verbosity::Normal };
    let mut view = View::new(ViewOptions {
        verbosity,
        paint: output::paint_for(std::io::stdout().is_terminal()),
    });
    for event in &events {
        if json {
            output::print_json(event);
            continue;
        }
        for line in view.lines(event) {
            match line.kind {
                LineKind::Progress => outln!("{}", line.text),
                LineKind::Answer => {
                    for text in line.text.lines() {
                        outln!("  {text}");
                    }
                }
            }
        }
    }
    // The same rule as `keel sessions`: an open run nobody drives was interrupted. Not in
    // `--json`, which is the ledger's events exactly.
    if !json
        && store.session(session_id).await?.is_some_and(|row| row.status == SessionStatus::Running)
        && let Some(gone) = gone_holder(store.as_ref(), session_id).await
    {
        outln!(
            "interrupted: {gone}, so nothing drives this run; `keel resume {session_id}` \
             continues it"
        );
    }
    Ok(exit::COMPLETED)
}

/// `keel stop SESSION|--last`: asks the session's active run to cancel; exit 1 when the
/// session has no active run, or when its open run has no live process (it was killed:
/// the run is interrupted, and `keel resume` continues it).
pub(crate) async fn stop(session: &SessionArg) -> anyhow::Result<u8> {
    let (_, store) = open_store().await?;
    let session_id = session.resolve(&store).await?;
    let status = store
        .sessions()
        .await?
        .into_iter()
        .find(|summary| summary.id == session_id)
        .map(|summary| summary.status);
    match status {
        Some(SessionStatus::Running) => {
            if let Some(gone) = gone_holder(store.as_ref(), session_id).await {
                // Nothing runs it: a cancel request would wait for nobody.
                eprintln!(
                    "keel: session {session_id} has no live run: {gone}, so its last run was \
                     interrupted and nothing is running to stop; `keel resume {session_id}` \
                     continues it"
                );
                return Ok(exit::FAILED);
            }
            store.request_cancel(session_id).await?;
            eprintln!(
                "keel: stop requested for session {session_id}; its run ends at the next check"
            );
            Ok(exit::COMPLETED)
        }
        Some(other) => {
            eprintln!(
                "keel: session {session_id} has no active run (it is {}); nothing to stop",
                other.as_str()
            );
            Ok(exit::FAILED)
        }
        None => Err(usage(format!("no session {session_id}"))),
    }
}

/// Removes the workspace's `.keel/` when keel made it and left it empty.
///
/// The managed sandbox creates `.keel/` before a command runs, so a command cannot plant
/// one (it is read-only inside the sandbox). Once the command is over, nothing is left
/// to protect it from, so an empty `.keel/` that did not exist before keel started is
/// removed when this guard drops: keel leaves no empty folder in a repository.
#[derive(Debug)]
pub(crate) struct EmptyKeelDir {
    /// The `.keel/` path when it did not exist at the start; `None` when it did.
    created: Option<std::path::PathBuf>,
}

impl EmptyKeelDir {
    pub(crate) fn watch(workspace: &Path) -> EmptyKeelDir {
        let dir = workspace.join(".keel");
        EmptyKeelDir { created: dir.symlink_metadata().is_err().then_some(dir) }
    }
}

impl Drop for EmptyKeelDir {
    fn drop(&mut self) {
        if let Some(dir) = &self.created
            && dir.symlink_metadata().is_ok_and(|meta| meta.is_dir())
        {
            // Fails, as it should, when the folder is not empty.
            let _ = std::fs::remove_dir(dir);
        }
    }
}
