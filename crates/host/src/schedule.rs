//! Schedules (DESIGN.md §9 "Schedules and wakes"): what a schedule is, when its slots
//! fall, and the scheduler that claims each slot once and fires it.
//!
//! - A schedule fires every `DURATION` (slots at `created_at + k × every`, k ≥ 1) or on a
//!   cron expression in a time zone (croner's DST rules: a fixed time that falls in a
//!   skipped hour fires right after the gap, a repeated hour fires a fixed time once and
//!   a wildcard time on each pass). Slots are computed from absolute time, so a clock
//!   change never fires one twice.
//! - Each slot is claimed as `(schedule_id, scheduled_at)` in the store before anything
//!   runs ([`keel_store::Schedules::claim_fire`]); only the claimer acts on it.
//! - Catch-up: slots missed while no host ran are considered back to `catch_up` before
//!   now; of several due at once only the latest fires, the earlier ones are recorded
//!   `skipped` (caught up). Slots older than the window are not recorded.
//! - Overlap (the schedule's last fire still runs): `skip` (default) records the slot
//!   `skipped`; `buffer` keeps one slot `buffered` and fires it when the run ends (later
//!   slots are skipped meanwhile); `allow` fires anyway.
//! - A fire left `claimed` or `buffered` by a holder that died (or unheard of for
//!   [`STALE_CLAIM`]) is recorded `failed` (outcome unknown) and never fired again.
//!
//! The arithmetic takes the time as an argument and the [`Scheduler`] reads it from a
//! [`Clock`], so tests run it on a fake clock; what a fire does is a [`Firer`].

use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use keel_contracts::{ApprovalMode, Clock, SessionId};
use keel_store::{FireRow, FireState, ScheduleRow, Schedules};
use serde::{Deserialize, Serialize};

use crate::error::usage;

/// How long an unsettled fire of a holder whose liveness is unknown (another machine) may
/// stay claimed before it is recorded failed.
pub const STALE_CLAIM: Duration = Duration::from_secs(600);

/// The shortest catch-up window, in milliseconds: a tick that comes a little late still
/// fires the slot it is late for.
pub const MIN_CATCH_UP_MS: u64 = 5_000;

/// The default catch-up window.
pub const DEFAULT_CATCH_UP: Duration = Duration::from_secs(300);

/// The most slots one tick records as skipped (the rest of a long outage is not recorded).
const MAX_SKIPPED_PER_TICK: usize = 100;

/// A cron expression must fire within this many days of being added (5 years).
const FIRES_WITHIN_DAYS: i64 = 5 * 366;

/// The most slots one computation enumerates.
const MAX_SLOTS: usize = 10_000;

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// Every `every_ms` milliseconds from the schedule's creation.
    Every {
        /// The interval in milliseconds (≥ 1000).
        every_ms: u64,
    },
    /// A cron expression (5 to 7 fields, croner's syntax: `[sec] min hour dom month dow
    /// [year]`) in an IANA time zone.
    Cron {
        /// The expression.
        cron: String,
        /// The zone (`Europe/Berlin`); `UTC` when none was given.
        tz: String,
    },
}

/// What a fire starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// A new turn in this session (its approval is the session's).
    Session {
        /// The session.
        session_id: SessionId,
    },
    /// A new session per fire.
    Template {
        /// The workspace (canonical).
        workspace: String,
        /// The model spec.
        model: String,
        /// How consent is answered; `deny` unless given (nobody is there to ask).
        approval: ApprovalMode,
    },
}

/// What a schedule does when its last fire still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Skip the slot (recorded `skipped`).
    #[default]
    Skip,
    /// Keep one slot and fire it when the run ends.
    Buffer,
    /// Fire anyway (a session target still runs one turn at a time: the fire is refused).
    Allow,
}

/// A schedule's description, stored as JSON in its row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// When it fires.
    pub when: When,
    /// What it starts.
    pub target: Target,
    /// The turn's input.
    pub task: String,
    /// Overlap policy.
    #[serde(default)]
    pub overlap: Overlap,
    /// Catch-up window in milliseconds.
    pub catch_up_ms: u64,
    /// Step ceiling of each fired run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Cost ceiling of each fired run, in USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
}

/// How the fields of a schedule's timing are named to whoever gave them, so an error says
/// which one is wrong: `keel schedule add`'s flags or the HTTP body's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WhenFields {
    /// The interval (`--every` / `"every"`).
    pub every: &'static str,
    /// The cron expression (`--cron` / `"cron"`).
    pub cron: &'static str,
    /// The cron expression's time zone (`--tz` / `"tz"`).
    pub tz: &'static str,
}

impl WhenFields {
    /// `keel schedule add`'s flags.
    pub const FLAGS: WhenFields = WhenFields { every: "--every", cron: "--cron", tz: "--tz" };
    /// `POST /v1/schedules`'s body fields.
    pub const JSON: WhenFields = WhenFields { every: "\"every\"", cron: "\"cron\"", tz: "\"tz\"" };
}

/// A schedule's timing from its fields: exactly one of `every` (`90s`, `10m`, `1h`: at
/// least one second) and `cron` (5 to 7 fields: `min hour dom month dow`, with an optional
/// leading seconds field and an optional trailing year; or `@daily` and the like), and
/// `tz` (an IANA zone; default UTC) only with `cron`: an interval counts from the
/// schedule's creation and has no zone.
///
/// # Errors
///
/// A usage error naming the field at fault (both, for `tz` with `every`), as `fields`
/// names them; for a cron expression with no slot in the next 5 years too.
pub fn parse_when(
    every: Option<&str>,
    cron: Option<&str>,
    tz: Option<&str>,
    fields: WhenFields,
) -> anyhow::Result<When> {
    let WhenFields { every: every_field, cron: cron_field, tz: tz_field } = fields;
    match (every, cron) {
        (Some(_), Some(_)) => {
            Err(usage(format!("give one of {every_field} and {cron_field}, not both")))
        }
        (None, None) => Err(usage(format!(
            "give {every_field} (an interval such as 90s) or {cron_field} (a cron expression)"
        ))),
        (Some(_), None) if tz.is_some() => Err(usage(format!(
            "{tz_field} goes with {cron_field} only: an {every_field} interval counts from the \
             schedule's creation and has no time zone; drop {tz_field}"
        ))),
        (Some(text), None) => {
            let every = crate::duration::parse_duration(text)
                .filter(|every| *every >= Duration::from_secs(1))
                .ok_or_else(|| {
                    usage(format!(
                        "{every_field} {text:?}: give an interval of at least 1s and at most \
                         876000h (90s, 10m, 1h)"
                    ))
                })?;
            Ok(When::Every { every_ms: u64::try_from(every.as_millis()).unwrap_or(u64::MAX) })
        }
        (None, Some(expression)) => {
            let expression = expression.trim();
            croner::Cron::from_str(expression).map_err(|error| {
                usage(format!("{cron_field} {expression:?}: {error}{}", cron_culprit(expression)))
            })?;
            let zone = tz.map_or("UTC", str::trim);
            chrono_tz::Tz::from_str(zone).map_err(|_| {
                usage(format!(
                    "{tz_field} {zone:?}: unknown time zone (an IANA name such as Europe/Berlin)"
                ))
            })?;
            let when = When::Cron { cron: expression.to_owned(), tz: zone.to_owned() };
            // One that parses may still never match (`0 0 30 2 *`, 30 February): it would
            // be stored and never fire, so it is refused here.
            let now = Utc::now();
            let horizon = now + TimeDelta::days(FIRES_WITHIN_DAYS);
            match Compiled::of(&when)?.next_after(now, now) {
                Some(next) if next <= horizon => Ok(when),
                _ => Err(usage(format!(
                    "{cron_field} {expression:?} never fires in the next 5 years (a date no \
                     month has, such as 30 February, or a year long past): give one that does"
                ))),
            }
        }
    }
}

/// Which field of a cron `expression` that does not parse is at fault, as ` (the minute
/// field, "61")`: the first field that fails alone, every other one `*`. Empty when the
/// count of fields is not 5 to 7 (croner's own message says so) or no field fails alone.
fn cron_culprit(expression: &str) -> String {
    const NAMES: [&str; 7] =
        ["second", "minute", "hour", "day of month", "month", "day of week", "year"];
    let fields: Vec<&str> = expression.split_whitespace().collect();
    // 5 fields start at the minute, 6 and 7 at the second; 7 end with the year.
    let names = match fields.len() {
        5 => &NAMES[1..6],
        6 => &NAMES[..6],
        7 => &NAMES[..],
        _ => return String::new(),
    };
    for (index, field) in fields.iter().enumerate() {
        let probe: Vec<&str> =
            (0..fields.len()).map(|other| if other == index { *field } else { "*" }).collect();
        if croner::Cron::from_str(&probe.join(" ")).is_err() {
            return format!(" (the {} field, {field:?})", names[index]);
        }
    }
    String::new()
}

/// `90s`, `10m`, `1h` as an interval (at least one second); errors name `--every`.
///
/// # Errors
///
/// A usage error for anything else.
pub fn parse_every(text: &str) -> anyhow::Result<When> {
    parse_when(Some(text), None, None, WhenFields::FLAGS)
}

/// A cron expression in a zone, checked; errors name `--cron` and `--tz`.
///
/// # Errors
///
/// A usage error when the expression does not parse or the zone is unknown.
pub fn parse_cron(expression: &str, tz: Option<&str>) -> anyhow::Result<When> {
    parse_when(None, Some(expression), tz, WhenFields::FLAGS)
}

/// A [`When`] ready to compute slots.
enum Compiled {
    Every(TimeDelta),
    Cron(Box<croner::Cron>, chrono_tz::Tz),
}

impl Compiled {
    fn of(when: &When) -> anyhow::Result<Compiled> {
        match when {
            When::Every { every_ms } => {
                let ms = i64::try_from(*every_ms).ok().filter(|ms| *ms >= 1000);
                let ms = ms.ok_or_else(|| usage("an interval is at least 1s"))?;
                Ok(Compiled::Every(TimeDelta::milliseconds(ms)))
            }
            When::Cron { cron, tz } => {
                let parsed = croner::Cron::from_str(cron)
                    .map_err(|error| usage(format!("cron {cron:?}: {error}")))?;
                let zone = chrono_tz::Tz::from_str(tz).map_err(|_| {
                    usage(format!("unknown time zone {tz:?} (an IANA name such as Europe/Berlin)"))
                })?;
                Ok(Compiled::Cron(Box::new(parsed), zone))
            }
        }
    }

    /// The first slot strictly after `after` (slots of an interval count from `origin`).
    fn next_after(&self, origin: DateTime<Utc>, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Compiled::Every(every) => {
                let every_ms = every.num_milliseconds();
                let elapsed = (after - origin).num_milliseconds();
                let k = if elapsed < 0 { 1 } else { elapsed / every_ms + 1 };
                origin.checked_add_signed(TimeDelta::milliseconds(k.checked_mul(every_ms)?))
            }
            Compiled::Cron(cron, zone) => {
                let local = after.with_timezone(zone);
                cron.find_next_occurrence(&local, false).ok().map(|next| next.with_timezone(&Utc))
            }
        }
    }
}

impl When {
    /// How a person reads it: `every 5m`, `every 90s`, `cron "0 9 * * MON-FRI" Europe/Berlin`.
    pub fn text(&self) -> String {
        match self {
            When::Every { every_ms } => {
                let ms = *every_ms;
                match ms {
                    _ if ms > 0 && ms.is_multiple_of(3_600_000) => {
                        format!("every {}h", ms / 3_600_000)
                    }
                    _ if ms > 0 && ms.is_multiple_of(60_000) => format!("every {}m", ms / 60_000),
                    _ if ms.is_multiple_of(1000) => format!("every {}s", ms / 1000),
                    _ => format!("every {ms}ms"),
                }
            }
            When::Cron { cron, tz } => format!("cron {cron:?} {tz}"),
        }
    }
}

/// The first slot of `when` strictly after `after`, for a schedule created at `origin`
/// (interval slots count from it); `None` when there is none (a cron that never matches
/// again).
///
/// # Errors
///
/// A usage error when `when` does not compile.
pub fn next_slot(
    when: &When,
    origin: DateTime<Utc>,
    after: DateTime<Utc>,
) -> anyhow::Result<Option<DateTime<Utc>>> {
    Ok(Compiled::of(when)?.next_after(origin, after))
}

/// The slots of `when` in `(after, until]`, oldest first, at most `limit`... counted from
/// the newest: when more fall in the range, the oldest are left out.
///
/// # Errors
///
/// A usage error when `when` does not compile.
pub fn slots(
    when: &When,
    origin: DateTime<Utc>,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
) -> anyhow::Result<Vec<DateTime<Utc>>> {
    let compiled = Compiled::of(when)?;
    let mut found = std::collections::VecDeque::new();
    let mut cursor = after;
    while let Some(next) = compiled.next_after(origin, cursor) {
        if next > until || next <= cursor {
            break;
        }
        found.push_back(next);
        if found.len() > MAX_SLOTS {
            found.pop_front();
        }
        cursor = next;
    }
    Ok(found.into())
}

/// What one schedule should do now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The slot to fire, if one is due.
    pub fire: Option<DateTime<Utc>>,
    /// Earlier due slots, superseded by `fire` (recorded `skipped`).
    pub caught_up: Vec<DateTime<Utc>>,
}

/// The plan for a schedule created at `created_at` whose newest claimed slot is `last`,
/// at `now`: the due slots are those after `last` (or creation) and not older than
/// `catch_up`.
///
/// # Errors
///
/// A usage error when `when` does not compile.
pub fn plan(
    when: &When,
    created_at: DateTime<Utc>,
    last: Option<DateTime<Utc>>,
    catch_up: Duration,
    now: DateTime<Utc>,
) -> anyhow::Result<Plan> {
    // Total for any stored value (a row written by hand or by an older keel may hold a
    // window of u64::MAX ms): a window reaching past the earliest representable time is
    // "since creation", never an overflow.
    let window = TimeDelta::from_std(catch_up).unwrap_or(TimeDelta::MAX);
    // A slot at exactly `now - catch_up` is still inside the window.
    let oldest = now
        .checked_sub_signed(window)
        .and_then(|oldest| oldest.checked_sub_signed(TimeDelta::milliseconds(1)))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let after = [Some(created_at), last, Some(oldest)].into_iter().flatten().max().unwrap_or(now);
    let mut due = slots(when, created_at, after, now)?;
    let fire = due.pop();
    let skip_from = due.len().saturating_sub(MAX_SKIPPED_PER_TICK);
    Ok(Plan { fire, caught_up: due.split_off(skip_from) })
}

/// What firing a slot came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FireOutcome {
    /// A turn started in this session.
    Fired(SessionId),
    /// Admission refused it (why).
    Refused(String),
    /// It failed before a turn started (why).
    Failed(String),
}

/// What a fire does: the host starts a turn; tests record the call.
#[async_trait]
pub trait Firer: Send + Sync + std::fmt::Debug {
    /// Fires `slot` of `schedule`: admission, `schedule_fired`, the turn.
    ///
    /// # Cancel safety
    ///
    /// Called from the scheduler's own task; not expected to be dropped midway.
    async fn fire(
        &self,
        schedule: &ScheduleRow,
        spec: &ScheduleSpec,
        slot: DateTime<Utc>,
    ) -> FireOutcome;

    /// Whether a run of `session_id` (a fire's session) is still open.
    async fn running(&self, session_id: SessionId) -> bool;

    /// Whether the holder of a claim is alive: `Some(false)` dead, `None` unknown.
    fn holder_alive(&self, holder: &str) -> Option<bool>;
}

/// What one tick did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tick {
    /// Slots fired (schedule, slot).
    pub fired: Vec<(uuid::Uuid, DateTime<Utc>)>,
    /// Slots recorded skipped.
    pub skipped: Vec<(uuid::Uuid, DateTime<Utc>)>,
    /// Slots buffered.
    pub buffered: Vec<(uuid::Uuid, DateTime<Utc>)>,
    /// Fires recorded failed because their holder died.
    pub recovered: Vec<(uuid::Uuid, DateTime<Utc>)>,
    /// Schedules whose stored spec cannot be read (schedule, why): they never fire.
    pub unreadable: Vec<(uuid::Uuid, String)>,
}

/// Claims and fires the slots of every schedule in the store.
#[derive(Debug, Clone)]
pub struct Scheduler {
    store: Arc<dyn Schedules>,
    clock: Arc<dyn Clock>,
    holder: String,
    firer: Arc<dyn Firer>,
    /// Schedules already warned about (an unreadable spec), so each is warned of once.
    warned: Arc<Mutex<std::collections::HashSet<uuid::Uuid>>>,
}

impl Scheduler {
    /// A scheduler claiming fires as `holder`.
    pub fn new(
        store: Arc<dyn Schedules>,
        clock: Arc<dyn Clock>,
        holder: impl Into<String>,
        firer: Arc<dyn Firer>,
    ) -> Scheduler {
        Scheduler { store, clock, holder: holder.into(), firer, warned: Arc::default() }
    }

    /// One pass: unsettled fires of dead holders are recorded failed, then every schedule
    /// that is not paused claims and fires what is due.
    ///
    /// # Errors
    ///
    /// When the store cannot be read; a failure of one schedule is recorded on its fire.
    ///
    /// # Cancel safety
    ///
    /// A dropped tick may leave a claimed fire unsettled: the next start records it failed.
    pub async fn tick(&self) -> anyhow::Result<Tick> {
        let mut tick = Tick::default();
        self.recover(&mut tick).await?;
        for row in self.store.schedules().await? {
            if row.paused {
                continue;
            }
            let spec = match serde_json::from_value::<ScheduleSpec>(row.spec.clone()) {
                Ok(spec) => spec,
                Err(error) => {
                    // Written behind keel's back or by another version: it never fires, and
                    // says so once per host (not every tick).
                    let why = format!("its stored spec is not one this keel reads: {error}");
                    if self.warned.lock().unwrap_or_else(PoisonError::into_inner).insert(row.id) {
                        eprintln!("keel serve: warning: schedule {} never fires: {why}", row.id);
                    }
                    tick.unreadable.push((row.id, why));
                    continue;
                }
            };
            if let Err(error) = self.tick_one(&row, &spec, &mut tick).await {
                eprintln!("keel serve: schedule {}: {error:#}", row.id);
            }
        }
        Ok(tick)
    }

    async fn recover(&self, tick: &mut Tick) -> anyhow::Result<()> {
        let now = self.clock.now();
        let stale = TimeDelta::from_std(STALE_CLAIM).unwrap_or(TimeDelta::MAX);
        for fire in self.store.unsettled_fires().await? {
            if fire.holder == self.holder {
                continue;
            }
            let dead = match self.firer.holder_alive(&fire.holder) {
                Some(alive) => !alive,
                None => now - fire.claimed_at > stale,
            };
            if dead
                && self
                    .store
                    .settle_fire(
                        fire.schedule_id,
                        fire.scheduled_at,
                        FireState::Failed,
                        None,
                        "outcome unknown: the host that claimed this fire stopped before \
                         recording it; it is not fired again",
                    )
                    .await?
            {
                tick.recovered.push((fire.schedule_id, fire.scheduled_at));
            }
        }
        Ok(())
    }

    fn claim(
        &self,
        schedule: &ScheduleRow,
        slot: DateTime<Utc>,
        state: FireState,
        detail: &str,
    ) -> FireRow {
        FireRow {
            schedule_id: schedule.id,
            scheduled_at: slot,
            holder: self.holder.clone(),
            claimed_at: self.clock.now(),
            state,
            session_id: None,
            detail: detail.to_owned(),
        }
    }

    async fn tick_one(
        &self,
        row: &ScheduleRow,
        spec: &ScheduleSpec,
        tick: &mut Tick,
    ) -> anyhow::Result<()> {
        let recent = self.store.fires(row.id, 20).await?;
        let last = recent.first().map(|fire| fire.scheduled_at);
        // The run that may still go on: the target session's (whoever started it), or
        // the newest fired session of a template.
        let session = match &spec.target {
            Target::Session { session_id } => Some(*session_id),
            Target::Template { .. } => recent
                .iter()
                .find(|fire| fire.state == FireState::Fired)
                .and_then(|fire| fire.session_id),
        };
        let running = match session {
            Some(session) => self.firer.running(session).await,
            None => false,
        };
        // A buffered slot of ours fires as soon as the run ends.
        if !running
            && let Some(buffered) = recent
                .iter()
                .find(|fire| fire.state == FireState::Buffered && fire.holder == self.holder)
        {
            self.run(row, spec, buffered.scheduled_at, tick).await?;
            return Ok(());
        }
        let now = self.clock.now();
        let catch_up = Duration::from_millis(spec.catch_up_ms);
        let plan = plan(&spec.when, row.created_at, last, catch_up, now)?;
        for slot in plan.caught_up {
            let detail = "missed while no host ran; a later slot caught up";
            if self.store.claim_fire(&self.claim(row, slot, FireState::Skipped, detail)).await? {
                tick.skipped.push((row.id, slot));
            }
        }
        let Some(slot) = plan.fire else { return Ok(()) };
        let buffered = recent.iter().any(|fire| fire.state == FireState::Buffered);
        let (state, detail) = match (running, spec.overlap) {
            (false, _) | (true, Overlap::Allow) => (FireState::Claimed, ""),
            (true, Overlap::Buffer) if !buffered => {
                (FireState::Buffered, "waiting for the running fire to end")
            }
            (true, Overlap::Buffer | Overlap::Skip) => {
                (FireState::Skipped, "overlap: the schedule's previous fire still runs")
            }
        };
        if !self.store.claim_fire(&self.claim(row, slot, state, detail)).await? {
            return Ok(()); // another host (or an earlier tick) has it
        }
        match state {
            FireState::Claimed => self.run(row, spec, slot, tick).await?,
            FireState::Buffered => tick.buffered.push((row.id, slot)),
            _ => tick.skipped.push((row.id, slot)),
        }
        Ok(())
    }

    /// Fires a slot this scheduler claimed and records how it went.
    async fn run(
        &self,
        row: &ScheduleRow,
        spec: &ScheduleSpec,
        slot: DateTime<Utc>,
        tick: &mut Tick,
    ) -> anyhow::Result<()> {
        let (state, session, detail) = match self.firer.fire(row, spec, slot).await {
            FireOutcome::Fired(session) => (FireState::Fired, Some(session), String::new()),
            FireOutcome::Refused(reason) => (FireState::Refused, None, reason),
            FireOutcome::Failed(reason) => (FireState::Failed, None, reason),
        };
        self.store.settle_fire(row.id, slot, state, session, &detail).await?;
        if state == FireState::Fired {
            tick.fired.push((row.id, slot));
        }
        Ok(())
    }
}

/// A new schedule's row: validated, with a fresh id, created now.
///
/// # Errors
///
/// A usage error when the spec is invalid (an empty task, a bad expression).
pub fn new_row(spec: &ScheduleSpec, now: DateTime<Utc>) -> anyhow::Result<ScheduleRow> {
    if spec.task.trim().is_empty() {
        return Err(usage("the task is empty"));
    }
    if u128::from(spec.catch_up_ms) > crate::duration::MAX_DURATION.as_millis() {
        return Err(usage("the catch-up window is at most 876000h (100 years)"));
    }
    Compiled::of(&spec.when)?;
    Ok(ScheduleRow {
        id: uuid::Uuid::now_v7(),
        created_at: now,
        paused: false,
        spec: serde_json::to_value(spec)?,
    })
}

/// A schedule for listings: its row and spec as one JSON object.
pub fn describe(row: &ScheduleRow, fires: &[FireRow]) -> serde_json::Value {
    let mut out = serde_json::json!({
        "schedule_id": row.id,
        "created_at": row.created_at,
        "paused": row.paused,
    });
    if let (Some(map), serde_json::Value::Object(spec)) = (out.as_object_mut(), &row.spec) {
        for (key, value) in spec {
            map.insert(key.clone(), value.clone());
        }
        if let Some(last) = fires.first() {
            map.insert(
                "last_fire".into(),
                serde_json::json!({"scheduled_at": last.scheduled_at, "state": last.state.as_str(),
                                   "session_id": last.session_id, "detail": last.detail}),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests;

/// The answer a delivered wake gives the waiting run.
pub fn answer_of(wake: &keel_store::WakeRow) -> keel_kernel::WakeAnswer {
    match &wake.payload {
        Some(payload) => {
            keel_kernel::WakeAnswer::Payload { payload: payload.clone(), by: wake.by.clone() }
        }
        None => keel_kernel::WakeAnswer::TimedOut,
    }
}

/// The largest wake payload accepted, in bytes.
pub const MAX_WAKE_PAYLOAD: usize = 64 * 1024;
