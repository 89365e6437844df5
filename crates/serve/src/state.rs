//! The host's state: the store, the runs it drives, who waits on which session's ledger,
//! and the answers in flight. Everything else is read from the ledger.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use keel_contracts::{
    ApprovalMode, EventKind, RunId, RuntimeEvent, Seq, SessionId, Store, StreamDelta, TurnId,
};
use keel_host::root::{self, RunSettings, SessionFacts};
use keel_kernel::{Cancellation, KernelError, Observer, PermissionHook, Steering};
use tokio::sync::{oneshot, watch};

use crate::approvals::{Approvals, RemotePerson};
use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::ledger;

/// Per-session wake-ups: the seq last recorded by a run of this host. Subscribers re-read
/// the ledger when woken (and on a timer, for writes by other processes), so the channel
/// carries no events and never grows.
#[derive(Debug, Default)]
pub(crate) struct Feed {
    senders: Mutex<HashMap<SessionId, watch::Sender<u64>>>,
}

impl Feed {
    pub(crate) fn subscribe(&self, session_id: SessionId) -> watch::Receiver<u64> {
        let mut senders = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        senders.entry(session_id).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    fn publish(&self, session_id: SessionId, seq: Seq) {
        let mut senders = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = senders.get(&session_id) {
            if sender.receiver_count() == 0 {
                senders.remove(&session_id);
            } else {
                sender.send_replace(seq.0);
            }
        }
    }
}

/// The observer of hosted runs: wakes the session's subscribers.
#[derive(Debug)]
struct Wake(Arc<Feed>);

impl Observer for Wake {
    fn on_event(&self, event: &RuntimeEvent) {
        self.0.publish(event.session_id, event.seq);
    }

    fn on_delta(&self, _delta: &StreamDelta) {}
}

/// What a client asked a run to do.
#[derive(Debug, Clone)]
pub(crate) enum Job {
    /// A new turn with this input.
    Turn(String),
    /// The session's interrupted or suspended turn, with a new run.
    Resume,
    /// The session's run parked on `wait` with this wake id, woken with this answer.
    Wake(String, keel_kernel::WakeAnswer),
}

/// The ids of a run that started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Started {
    pub(crate) turn_id: Option<TurnId>,
    pub(crate) run_id: Option<RunId>,
}

/// A run this host drives.
#[derive(Debug)]
struct Active {
    cancel: Cancellation,
    /// Where input sent while the run is active goes (`POST /v1/sessions/{id}/input`).
    steering: Steering,
    generation: u64,
}

/// The host.
#[derive(Debug)]
pub(crate) struct Host {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) home: PathBuf,
    pub(crate) config: ServeConfig,
    pub(crate) feed: Arc<Feed>,
    pub(crate) approvals: Arc<Approvals>,
    active: Mutex<(u64, HashMap<SessionId, Active>)>,
    /// Schedules, fires and wakes (the same database as `store`), set once at start.
    pub(crate) schedules: std::sync::OnceLock<Arc<dyn keel_store::Schedules>>,
    /// Held for writing by [`Host::take_over`] while it closes and resumes dead processes'
    /// runs, and for reading by an answer deciding whether to resume the run it answers:
    /// so an answer that comes while a takeover is closing that very run waits for it and
    /// then finds the run resumed here, instead of losing the race for the lease and being
    /// told another process drives the session.
    pub(crate) takeover: tokio::sync::RwLock<()>,
}

impl Host {
    pub(crate) fn new(store: Arc<dyn Store>, home: PathBuf, config: ServeConfig) -> Host {
        Host {
            store,
            home,
            config,
            feed: Arc::new(Feed::default()),
            approvals: Arc::new(Approvals::default()),
            active: Mutex::new((0, HashMap::new())),
            schedules: std::sync::OnceLock::new(),
            takeover: tokio::sync::RwLock::new(()),
        }
    }

    pub(crate) fn observer(&self) -> Arc<dyn Observer> {
        Arc::new(Wake(self.feed.clone()))
    }

    pub(crate) fn person(&self) -> Arc<dyn PermissionHook> {
        Arc::new(RemotePerson {
            approvals: self.approvals.clone(),
            store: self.store.clone(),
            timeout: self.config.approval_timeout,
        })
    }

    /// Whether `workspace` (canonical) lies inside one of the allowed roots and does not
    /// hold `KEEL_HOME` (the token, the ledger and the trust records an agent working
    /// there could read).
    pub(crate) fn admits(&self, workspace: &Path) -> bool {
        let home = self.home.canonicalize().unwrap_or_else(|_| self.home.clone());
        self.config.workspace_roots.iter().any(|root| workspace.starts_with(root))
            && !home.starts_with(workspace)
    }

    /// Whether this host drives a run of the session now.
    pub(crate) fn is_active(&self, session_id: SessionId) -> bool {
        let active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
        active.1.contains_key(&session_id)
    }

    /// Whether this host drives the session's run: its own, or (for a child session, run
    /// inside its parent's run) an ancestor's.
    pub(crate) async fn drives(&self, session_id: SessionId, events: &[RuntimeEvent]) -> bool {
        if self.is_active(session_id) {
            return true;
        }
        let mut lineage = ledger::parent(events);
        for _ in 0..16 {
            let Some(parent) = lineage else { return false };
            if self.is_active(parent) {
                return true;
            }
            lineage = match self.store.read(parent, Seq(0)).await {
                Ok(events) => ledger::parent(&events),
                Err(_) => None,
            };
        }
        false
    }

    /// The steering inbox of the session's run on this host, if it has one.
    pub(crate) fn steering(&self, session_id: SessionId) -> Option<Steering> {
        let active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
        active.1.get(&session_id).map(|run| run.steering.clone())
    }

    /// Cancels the session's run on this host; whether there was one.
    pub(crate) fn cancel(&self, session_id: SessionId) -> bool {
        let active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
        match active.1.get(&session_id) {
            Some(run) => {
                run.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// The session's events, 404 when there are none.
    pub(crate) async fn events(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<RuntimeEvent>, ApiError> {
        let events = self.store.read(session_id, Seq(0)).await.map_err(ApiError::internal)?;
        if events.is_empty() {
            return Err(ApiError::not_found(format!("no session {session_id}")));
        }
        Ok(events)
    }

    /// The approval a hosted session was created with (`KEEL_HOME/serve/sessions/ID`),
    /// else its last run's, else `ask`.
    pub(crate) fn approval_of(
        &self,
        session_id: SessionId,
        facts: &SessionFacts<'_>,
    ) -> ApprovalMode {
        let recorded = std::fs::read_to_string(self.session_file(session_id))
            .ok()
            .and_then(|text| serde_json::from_str::<SessionFile>(&text).ok())
            .map(|file| file.approval);
        recorded.or(facts.approval).unwrap_or(ApprovalMode::Ask)
    }

    /// Records the approval a session was created with.
    pub(crate) fn remember_approval(
        &self,
        session_id: SessionId,
        approval: ApprovalMode,
    ) -> std::io::Result<()> {
        let path = self.session_file(session_id);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, serde_json::to_vec(&SessionFile { approval })?)?;
        std::fs::rename(temporary, path)
    }

    fn session_file(&self, session_id: SessionId) -> PathBuf {
        self.home.join("serve").join("sessions").join(format!("{session_id}.json"))
    }

    /// Starts `job` for the session and answers once its run has started (its
    /// `run_started` is in the ledger).
    ///
    /// # Errors
    ///
    /// 404 no session, 423 sealed or not admitted, 409 a run is active (here or elsewhere)
    /// or nothing to resume, 503 the host is at its run limit, 400 a setting is invalid.
    pub(crate) async fn start(
        self: &Arc<Self>,
        session_id: SessionId,
        job: Job,
        mut settings: RunSettings,
    ) -> Result<Started, ApiError> {
        let events = self.events(session_id).await?;
        if let Some(reason) = ledger::sealed(&events) {
            return Err(ApiError::locked(format!(
                "session {session_id} is sealed ({reason}); it never runs agent code again"
            )));
        }
        let Some(facts) = SessionFacts::of(&events) else {
            return Err(ApiError::internal(format!("session {session_id} has no session_created")));
        };
        let Some(EventKind::SessionCreated { workspace, .. }) = events.first().map(|e| &e.kind)
        else {
            return Err(ApiError::internal(format!("session {session_id} has no session_created")));
        };
        let workspace = Path::new(workspace)
            .canonicalize()
            .ok()
            .filter(|workspace| self.admits(workspace))
            .ok_or_else(|| {
                ApiError::locked(format!(
                    "session {session_id} is not admitted: its workspace is not inside the \
                     host's allowed workspace roots, or holds KEEL_HOME"
                ))
            })?;
        let last_seq = events.last().map_or(Seq(0), |event| event.seq);
        let cancel = Cancellation::new();
        let steering = Steering::new();
        let generation = self.reserve(session_id, &cancel, &steering)?;
        let release = Release { host: self.clone(), session_id, generation };

        settings.approval = Some(self.approval_of(session_id, &facts));
        let workspace = root::canonical_workspace(Some(&workspace)).map_err(ApiError::from_root)?;
        let prepared = root::prepare(
            &self.home,
            &workspace,
            &settings,
            Some(&facts),
            &self.store,
            Some(self.person()),
        )
        .map_err(ApiError::from_root)?;
        let assembly =
            root::assemble(prepared, &self.home, &workspace, self.store.clone(), self.observer())
                .await
                .map_err(ApiError::from_root)?;

        let mut woken = self.feed.subscribe(session_id);
        let (done_sender, mut done) = oneshot::channel::<Result<(), KernelError>>();
        tokio::spawn(async move {
            let run = &assembly.resolved.run;
            let report = match &job {
                Job::Turn(input) => {
                    assembly
                        .kernel
                        .run_turn_steered(session_id, input, run, &cancel, &steering)
                        .await
                }
                Job::Resume => {
                    assembly.kernel.resume_steered(session_id, run, &cancel, &steering).await
                }
                Job::Wake(wake_id, answer) => {
                    assembly.kernel.wake(session_id, wake_id, answer, run, &cancel).await
                }
            };
            assembly.outbox.finish().await;
            assembly.mcp.close().await;
            if let Err(error) = &report {
                eprintln!("keel serve: the run of session {session_id} ended in error: {error}");
            }
            drop(release);
            let _ = done_sender.send(report.map(|_| ()));
        });
        // The run has started once its `run_started` is durable. Each wake-up reads only
        // the events after the last one seen, not everything since `last_seq` again.
        let mut seen = last_seq;
        loop {
            let recorded = self.store.read(session_id, seen).await.map_err(ApiError::internal)?;
            if let Some(started) =
                recorded.iter().find(|event| matches!(event.kind, EventKind::RunStarted { .. }))
            {
                return Ok(Started { turn_id: started.turn_id, run_id: started.run_id });
            }
            if let Some(last) = recorded.last() {
                seen = last.seq;
            }
            tokio::select! {
                _ = woken.changed() => {}
                () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                finished = &mut done => {
                    return match finished {
                        Ok(Err(error)) => Err(ApiError::from_kernel(error)),
                        Ok(Ok(())) | Err(_) => {
                            // It ended before we saw `run_started`: read once more.
                            let recorded = self
                                .store
                                .read(session_id, seen)
                                .await
                                .map_err(ApiError::internal)?;
                            recorded
                                .iter()
                                .find(|event| matches!(event.kind, EventKind::RunStarted { .. }))
                                .map(|started| Started {
                                    turn_id: started.turn_id,
                                    run_id: started.run_id,
                                })
                                .ok_or_else(|| ApiError::internal("the run ended before it started"))
                        }
                    };
                }
            }
        }
    }

    /// Takes a run slot for the session: 409 when it has a run here, 503 at the limit.
    fn reserve(
        &self,
        session_id: SessionId,
        cancel: &Cancellation,
        steering: &Steering,
    ) -> Result<u64, ApiError> {
        let mut guard = self.active.lock().unwrap_or_else(PoisonError::into_inner);
        let (generation, active) = &mut *guard;
        if active.contains_key(&session_id) {
            return Err(ApiError::conflict(
                "run_active",
                format!("session {session_id} has an active run; wait for it or cancel it"),
            ));
        }
        if active.len() >= self.config.max_runs {
            return Err(ApiError::overloaded(format!(
                "the host runs {} runs, its limit; try again later",
                active.len()
            )));
        }
        *generation += 1;
        active.insert(
            session_id,
            Active { cancel: cancel.clone(), steering: steering.clone(), generation: *generation },
        );
        Ok(*generation)
    }

    /// Takes over the runs of processes that died (a host killed, on this machine or
    /// another sharing the ledger): closes each under its lapsed or dead lease
    /// (`Kernel::repair_interrupted`), then resumes its turn here when its workspace is
    /// admitted. A live holder's run is left alone.
    pub(crate) async fn take_over(self: &Arc<Self>) {
        let _takeover = self.takeover.write().await;
        let repaired = match root::inert_kernel(self.store.clone(), self.observer()) {
            Ok(kernel) => match kernel.repair_interrupted().await {
                Ok(repaired) => repaired,
                Err(error) => {
                    eprintln!("keel serve: cannot check for interrupted runs: {error}");
                    return;
                }
            },
            Err(error) => {
                eprintln!("keel serve: {error:#}");
                return;
            }
        };
        for session_id in repaired {
            if self.is_active(session_id) {
                continue;
            }
            if !self.takes_over(session_id).await {
                eprintln!(
                    "keel serve: closed the interrupted run of session {session_id}; not \
                     resumed here (not a hosted session): POST /v1/sessions/{session_id}/resume \
                     continues it"
                );
                continue;
            }
            match self.start(session_id, Job::Resume, RunSettings::default()).await {
                Ok(_) => eprintln!(
                    "keel serve: took over session {session_id} (its process stopped mid-run)"
                ),
                Err(error) => eprintln!(
                    "keel serve: closed the interrupted run of session {session_id}; not \
                     resumed here: {}",
                    error.message
                ),
            }
        }
    }

    /// Whether a dead process's run of the session is resumed here unasked: a session this
    /// host created (its file is here), or one whose last run asked a person (`ask`), so
    /// nothing it does needs no one. A `keel run` killed with `--approval auto` is not
    /// brought back to life in the background.
    async fn takes_over(&self, session_id: SessionId) -> bool {
        if self.session_file(session_id).exists() {
            return true;
        }
        match self.store.read(session_id, Seq(0)).await {
            Ok(events) => SessionFacts::of(&events)
                .is_some_and(|facts| facts.approval == Some(ApprovalMode::Ask)),
            Err(_) => false,
        }
    }

    /// Runs left waiting for consent by a host that stopped are asked again now, so their
    /// requests are live (and their timeouts run) again.
    pub(crate) async fn resume_awaiting(self: &Arc<Self>) {
        let sessions = match self.store.sessions().await {
            Ok(sessions) => sessions,
            Err(error) => {
                eprintln!("keel serve: cannot list sessions to resume: {error}");
                return;
            }
        };
        for session in sessions {
            let Ok(events) = self.store.read(session.id, Seq(0)).await else { continue };
            if ledger::pending(&events).is_empty()
                || ledger::run_open(&events)
                || ledger::sealed(&events).is_some()
            {
                continue;
            }
            match self.start(session.id, Job::Resume, RunSettings::default()).await {
                Ok(_) => eprintln!(
                    "keel serve: resumed session {} (a permission request was pending)",
                    session.id
                ),
                Err(error) => eprintln!(
                    "keel serve: cannot resume session {} with a pending permission request: {}",
                    session.id, error.message
                ),
            }
        }
    }
}

/// Frees the run slot when the run ends (or never started).
struct Release {
    host: Arc<Host>,
    session_id: SessionId,
    generation: u64,
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut guard = self.host.active.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.1.get(&self.session_id).is_some_and(|run| run.generation == self.generation) {
            guard.1.remove(&self.session_id);
        }
    }
}

/// What the host keeps of a session beyond its ledger: the approval it was created with
/// (a run records it in `run_started`; before the first run only this file has it).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SessionFile {
    approval: ApprovalMode,
}
