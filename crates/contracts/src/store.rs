//! The [`Store`] trait: the durable, append-only ledger the kernel writes through.

use std::fmt::Debug;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::{RuntimeEvent, Seq, SessionId, ToolCallId, UsageTotals};

/// Where a session stands, derived from its last run event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStatus {
    /// No run has started.
    Idle,
    /// A run started and has no terminal event (running, or its process died).
    Running,
    /// The last run completed.
    Completed,
    /// The last run failed.
    Failed,
    /// The last run was suspended.
    Suspended,
    /// The last run was cancelled.
    Cancelled,
    /// The last run ended because a permission denial finalized the turn.
    Denied,
    /// The session is sealed.
    Sealed,
}

impl SessionStatus {
    /// Every status, so stores can round-trip all of them (a new variant must be added
    /// here, or the exhaustive match below fails to compile).
    pub const ALL: [SessionStatus; 8] = [
        SessionStatus::Idle,
        SessionStatus::Running,
        SessionStatus::Completed,
        SessionStatus::Failed,
        SessionStatus::Suspended,
        SessionStatus::Cancelled,
        SessionStatus::Denied,
        SessionStatus::Sealed,
    ];

    /// The status spelled `text` (the inverse of [`SessionStatus::as_str`]).
    pub fn parse(text: &str) -> Option<SessionStatus> {
        SessionStatus::ALL.into_iter().find(|status| status.as_str() == text)
    }

    /// Lowercase display spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Idle => "idle",
            SessionStatus::Running => "running",
            SessionStatus::Completed => "completed",
            SessionStatus::Failed => "failed",
            SessionStatus::Suspended => "suspended",
            SessionStatus::Cancelled => "cancelled",
            SessionStatus::Denied => "denied",
            SessionStatus::Sealed => "sealed",
        }
    }

    /// The status once an event that sets `next` ([`crate::EventKind::session_status`]) is
    /// recorded: `next`, except that sealing is final (nothing recorded afterwards makes a
    /// sealed session look runnable).
    ///
    /// # Examples
    ///
    /// ```
    /// use keel_contracts::SessionStatus;
    /// let done = SessionStatus::Running.then(SessionStatus::Completed);
    /// assert_eq!(done, SessionStatus::Completed);
    /// assert_eq!(SessionStatus::Sealed.then(SessionStatus::Running), SessionStatus::Sealed);
    /// ```
    pub fn then(self, next: SessionStatus) -> SessionStatus {
        if self == SessionStatus::Sealed { self } else { next }
    }
}

/// Longest session title kept ([`session_title`]), in characters, the ellipsis included.
pub const SESSION_TITLE_MAX_CHARS: usize = 80;

/// The listing title a turn's input makes: whitespace runs collapsed to one space, at most
/// [`SESSION_TITLE_MAX_CHARS`] characters, ending in `…` when cut.
///
/// # Examples
///
/// ```
/// use keel_contracts::session_title;
/// assert_eq!(session_title("  fix\n the   tests "), "fix the tests");
/// let long = session_title(&"word ".repeat(40));
/// assert_eq!(long.chars().count(), 80);
/// assert!(long.ends_with("word…"));
/// ```
pub fn session_title(input: &str) -> String {
    let collapsed = input.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() <= SESSION_TITLE_MAX_CHARS {
        return collapsed;
    }
    let mut title: String = collapsed.chars().take(SESSION_TITLE_MAX_CHARS - 1).collect();
    title.truncate(title.trim_end().len());
    title.push('…');
    title
}

/// One row of a session listing, kept by the store in the same transaction as each append,
/// so listing sessions never reads their events.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSummary {
    /// The session.
    pub id: SessionId,
    /// When `session_created` was recorded.
    pub created_at: DateTime<Utc>,
    /// When the last event was recorded.
    pub updated_at: DateTime<Utc>,
    /// Workspace root.
    pub workspace: String,
    /// Model spec.
    pub model: String,
    /// The first turn's input, for display.
    pub title: String,
    /// The last seq.
    pub last_seq: Seq,
    /// Derived status.
    pub status: SessionStatus,
    /// Parent session, for children.
    pub parent: Option<SessionId>,
    /// Usage and cost summed over every `model_response` of the session (every purpose),
    /// folded with [`UsageTotals::add`] in seq order. A session whose events could not be
    /// decoded when an older store was migrated reads as one response of unknown usage
    /// and cost ([`UsageTotals::unknown`]).
    pub usage: UsageTotals,
}

impl SessionSummary {
    /// The summary of session `id` whose first stored event (normally `session_created`)
    /// was recorded at `at`, before that event is folded in: idle, untitled, no usage.
    pub fn starting(id: SessionId, at: DateTime<Utc>) -> SessionSummary {
        SessionSummary {
            id,
            created_at: at,
            updated_at: at,
            workspace: String::new(),
            model: String::new(),
            title: String::new(),
            last_seq: Seq(0),
            status: SessionStatus::Idle,
            parent: None,
            usage: UsageTotals::default(),
        }
    }
}

/// Appending failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// Another event already sits at this seq (a second writer, or a stale view).
    #[error("seq conflict in session {session_id}: expected {expected}, got {got}")]
    SeqConflict {
        /// The session.
        session_id: SessionId,
        /// The seq the store would accept next.
        expected: Seq,
        /// The seq offered.
        got: Seq,
    },
    /// The append was made under a lease that is no longer the newest (fencing).
    #[error("fenced: session {session_id} is now leased with token {current}, not {offered}")]
    Fenced {
        /// The session.
        session_id: SessionId,
        /// The token of the newest lease.
        current: u64,
        /// The token the writer offered.
        offered: u64,
    },
    /// The batch mixes sessions or is not contiguous.
    #[error("invalid batch: {reason}")]
    InvalidBatch {
        /// What is wrong.
        reason: String,
    },
    /// The backend failed (I/O, disk full, fsync).
    #[error("ledger write failed: {message}")]
    Backend {
        /// The backend's message.
        message: String,
    },
}

/// Reading failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// A stored record does not decode (corruption or a newer format).
    #[error("corrupt event at seq {seq} in session {session_id}: {message}")]
    Corrupt {
        /// The session.
        session_id: SessionId,
        /// The undecodable seq.
        seq: Seq,
        /// Why it does not decode.
        message: String,
    },
    /// The backend failed.
    #[error("ledger read failed: {message}")]
    Backend {
        /// The backend's message.
        message: String,
    },
}

/// The right to drive a session's runs, held by one process at a time (DESIGN.md §6).
///
/// Fencing: every acquisition gets a token larger than any before it for the session;
/// appends made under a lease are refused once a newer token exists, so a process whose
/// lease expired and was taken over cannot write another event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The session.
    pub session_id: SessionId,
    /// Who holds it (a process label chosen by the host).
    pub holder: String,
    /// The fencing token.
    pub token: u64,
    /// When it lapses unless renewed.
    pub expires_at: DateTime<Utc>,
}

/// A lease could not be had or kept.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// Another holder has an unexpired lease.
    #[error("session {session_id} is being driven by {holder} (lease until {expires_at})")]
    Held {
        /// The session.
        session_id: SessionId,
        /// Who holds it.
        holder: String,
        /// Until when.
        expires_at: DateTime<Utc>,
    },
    /// The lease was taken over (a newer token exists): stop writing.
    #[error("the lease on session {session_id} was taken over (token {token} is stale)")]
    Lost {
        /// The session.
        session_id: SessionId,
        /// The stale token.
        token: u64,
    },
    /// This store does not implement leases.
    #[error("this store does not support leases")]
    Unsupported,
    /// The backend failed.
    #[error("lease operation failed: {message}")]
    Backend {
        /// The backend's message.
        message: String,
    },
}

/// Resolving a session id prefix failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No session id starts with the prefix.
    #[error("no session matches '{prefix}'")]
    NotFound {
        /// The prefix given.
        prefix: String,
    },
    /// More than one session id starts with the prefix.
    #[error("'{prefix}' matches {count} sessions; give more characters")]
    Ambiguous {
        /// The prefix given.
        prefix: String,
        /// How many matched.
        count: usize,
    },
    /// The backend failed.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// The durable ledger. Implementations: SQLite (keel-store), PostgreSQL, `MemStore`
/// (keel-testkit).
#[async_trait]
pub trait Store: Send + Sync + Debug {
    /// Appends `events`, all of one session, with contiguous seqs starting right after the
    /// session's last seq. The batch is atomic and durable when this returns `Ok`.
    /// Appending an event identical to the one already stored at its seq is a no-op.
    ///
    /// # Errors
    ///
    /// [`AppendError::SeqConflict`] when a different event holds the seq;
    /// [`AppendError::Backend`] when nothing was written.
    ///
    /// # Cancel safety
    ///
    /// If dropped, the batch was either wholly written or not at all.
    async fn append(&self, events: &[RuntimeEvent]) -> Result<(), AppendError>;

    /// Events of `session_id` with seq greater than `after`, in seq order.
    ///
    /// # Errors
    ///
    /// [`ReadError::Corrupt`] when a stored record does not decode.
    async fn read(&self, session_id: SessionId, after: Seq)
    -> Result<Vec<RuntimeEvent>, ReadError>;

    /// Events of `session_id` with seq at most `up_to` whose kind ([`crate::EventKind::name`])
    /// is one of `kinds`, in seq order. A database answers it from an index on the kind, so
    /// the kernel can load a session's facts without reading its whole history.
    ///
    /// The default filters [`Store::read`].
    ///
    /// # Errors
    ///
    /// [`ReadError::Corrupt`] when a stored record does not decode.
    async fn read_kinds(
        &self,
        session_id: SessionId,
        kinds: &[&str],
        up_to: Seq,
    ) -> Result<Vec<RuntimeEvent>, ReadError> {
        let mut events = self.read(session_id, Seq(0)).await?;
        events.retain(|event| event.seq <= up_to && kinds.contains(&event.kind.name()));
        Ok(events)
    }

    /// The session's latest event of `kind` ([`crate::EventKind::name`]), if any: what a
    /// resume starts from (the latest `compaction`).
    ///
    /// The default scans [`Store::read`].
    ///
    /// # Errors
    ///
    /// [`ReadError::Corrupt`] when that record does not decode.
    async fn last_of_kind(
        &self,
        session_id: SessionId,
        kind: &str,
    ) -> Result<Option<RuntimeEvent>, ReadError> {
        let events = self.read(session_id, Seq(0)).await?;
        Ok(events.into_iter().rev().find(|event| event.kind.name() == kind))
    }

    /// The session's latest `tool_result` event for the call `call_id`, if any: whether
    /// that id is taken (the kernel gives a call that repeats an answered call's id a fresh
    /// one), and the result `read_tool_result` pages when memory no longer holds it. A
    /// database answers it from an index on the results' call ids, so it costs the same at
    /// event 1 000 and 100 000.
    ///
    /// The default scans [`Store::read_kinds`].
    ///
    /// # Errors
    ///
    /// [`ReadError::Corrupt`] when a record read does not decode.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn last_tool_result(
        &self,
        session_id: SessionId,
        call_id: &ToolCallId,
    ) -> Result<Option<RuntimeEvent>, ReadError> {
        let results = self.read_kinds(session_id, &["tool_result"], Seq(u64::MAX)).await?;
        Ok(results.into_iter().rev().find(|event| {
            matches!(&event.kind, crate::EventKind::ToolResult { call_id: answered, .. }
                if answered == call_id)
        }))
    }

    /// Every session, newest first.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when the backend fails.
    async fn sessions(&self) -> Result<Vec<SessionSummary>, ReadError>;

    /// One session's listing row, `None` when there is no such session. The default reads
    /// [`Store::sessions`]; a backend with an index answers from one row.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when the backend fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn session(&self, session_id: SessionId) -> Result<Option<SessionSummary>, ReadError> {
        let rows = self.sessions().await?;
        Ok(rows.into_iter().find(|row| row.id == session_id))
    }

    /// The session whose id starts with `prefix` (case-insensitive hex, dashes optional).
    ///
    /// # Errors
    ///
    /// [`ResolveError::NotFound`] or [`ResolveError::Ambiguous`].
    async fn resolve_session(&self, prefix: &str) -> Result<SessionId, ResolveError>;

    /// Records that the user asked to cancel the session's active run (`keel stop`).
    ///
    /// # Errors
    ///
    /// [`AppendError::Backend`] when nothing was written.
    async fn request_cancel(&self, session_id: SessionId) -> Result<(), AppendError>;

    /// Acquires the lease on `session_id` for `holder` until `now + ttl`, with a new fencing
    /// token. A holder may re-acquire its own unexpired lease (it gets a new token).
    ///
    /// # Errors
    ///
    /// [`LeaseError::Held`] when another holder's lease has not expired;
    /// [`LeaseError::Unsupported`] from stores without leases (the default).
    async fn acquire_lease(
        &self,
        session_id: SessionId,
        holder: &str,
        now: DateTime<Utc>,
        ttl: std::time::Duration,
    ) -> Result<Lease, LeaseError> {
        let _ = (session_id, holder, now, ttl);
        Err(LeaseError::Unsupported)
    }

    /// The session's newest lease as stored, without taking it: it may have lapsed or been
    /// released (`expires_at` in the past). `None` when the session never had one. Writes
    /// nothing, so a listing can tell a live run from one whose process died.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Unsupported`] from stores without leases (the default);
    /// [`LeaseError::Backend`] when the backend fails.
    async fn current_lease(&self, session_id: SessionId) -> Result<Option<Lease>, LeaseError> {
        let _ = session_id;
        Err(LeaseError::Unsupported)
    }

    /// Extends `lease` to `now + ttl`, keeping its token.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Lost`] when a newer lease exists.
    async fn renew_lease(
        &self,
        lease: &Lease,
        now: DateTime<Utc>,
        ttl: std::time::Duration,
    ) -> Result<Lease, LeaseError> {
        let _ = (lease, now, ttl);
        Err(LeaseError::Unsupported)
    }

    /// Gives `lease` up (a no-op when a newer lease exists).
    ///
    /// # Errors
    ///
    /// [`LeaseError::Backend`] when the backend fails.
    async fn release_lease(&self, lease: &Lease) -> Result<(), LeaseError> {
        let _ = lease;
        Err(LeaseError::Unsupported)
    }

    /// [`Store::append`] under `lease`: refused with [`AppendError::Fenced`] when a newer
    /// lease exists for the session, checked in the same transaction as the append.
    ///
    /// # Errors
    ///
    /// As [`Store::append`], plus [`AppendError::Fenced`].
    ///
    /// # Cancel safety
    ///
    /// As [`Store::append`].
    async fn append_leased(
        &self,
        events: &[RuntimeEvent],
        lease: &Lease,
    ) -> Result<(), AppendError> {
        let _ = lease;
        self.append(events).await
    }

    /// Takes a pending cancel request: returns whether one was pending and clears it.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when the backend fails.
    async fn take_cancel_request(&self, session_id: SessionId) -> Result<bool, ReadError>;
}
