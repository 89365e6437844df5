//! The schedule arithmetic on a fake clock: DST in two zones, catch-up, overlap, recovery,
//! and two schedulers racing for the same slots.

use std::sync::Mutex;

use chrono::TimeZone;
use keel_testkit::FakeClock;

use super::*;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

fn cron(expression: &str, tz: &str) -> When {
    parse_cron(expression, Some(tz)).unwrap()
}

#[test]
fn berlin_spring_forward_fires_a_skipped_fixed_time_once_right_after_the_gap() {
    // 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist.
    let when = cron("30 2 * * *", "Europe/Berlin");
    let got = slots(&when, utc(2026, 3, 1, 0, 0), utc(2026, 3, 27, 0, 0), utc(2026, 3, 31, 0, 0))
        .unwrap();
    assert_eq!(
        got,
        vec![
            utc(2026, 3, 27, 1, 30), // 02:30 CET
            utc(2026, 3, 28, 1, 30),
            utc(2026, 3, 29, 1, 0),  // the gap: 03:00 CEST, once
            utc(2026, 3, 30, 0, 30), // 02:30 CEST
        ]
    );
}

#[test]
fn berlin_fall_back_fires_a_fixed_time_once_and_a_wildcard_on_each_pass() {
    // 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00 UTC); 02:00–03:00 repeats.
    let fixed = cron("30 2 * * *", "Europe/Berlin");
    let got =
        slots(&fixed, utc(2026, 10, 1, 0, 0), utc(2026, 10, 24, 0, 0), utc(2026, 10, 27, 0, 0))
            .unwrap();
    assert_eq!(
        got,
        vec![utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    );
    let wildcard = cron("*/30 * * * *", "Europe/Berlin");
    let got =
        slots(&wildcard, utc(2026, 10, 1, 0, 0), utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 2, 0))
            .unwrap();
    // 02:30 CEST, 02:00 CET, 02:30 CET, 03:00 CET: every 30 minutes of real time.
    assert_eq!(
        got,
        vec![
            utc(2026, 10, 25, 0, 30),
            utc(2026, 10, 25, 1, 0),
            utc(2026, 10, 25, 1, 30),
            utc(2026, 10, 25, 2, 0)
        ]
    );
}

#[test]
fn new_york_spring_forward_has_no_two_oclock_and_hourly_slots_stay_an_hour_apart() {
    // 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
    let when = cron("0 * * * *", "America/New_York");
    let got =
        slots(&when, utc(2026, 3, 1, 0, 0), utc(2026, 3, 8, 5, 0), utc(2026, 3, 8, 9, 0)).unwrap();
    assert_eq!(
        got,
        vec![
            utc(2026, 3, 8, 6, 0),
            utc(2026, 3, 8, 7, 0),
            utc(2026, 3, 8, 8, 0),
            utc(2026, 3, 8, 9, 0)
        ]
    );
    let zone: chrono_tz::Tz = "America/New_York".parse().unwrap();
    let hours: Vec<u32> =
        got.iter().map(|at| chrono::Timelike::hour(&at.with_timezone(&zone))).collect();
    assert_eq!(hours, vec![1, 3, 4, 5]);
}

#[test]
fn bad_expressions_and_zones_and_intervals_are_usage_errors() {
    assert!(parse_cron("61 * * * *", None).is_err());
    assert!(parse_cron("* * * * *", Some("Mars/Olympus")).is_err());
    assert!(parse_every("500ms").is_err());
    assert!(parse_every("soon").is_err());
    assert_eq!(parse_every("90s").unwrap(), When::Every { every_ms: 90_000 });
}

#[test]
fn timing_errors_name_the_field_as_the_caller_spells_it() {
    let message =
        |every, cron, tz, fields| format!("{:#}", parse_when(every, cron, tz, fields).unwrap_err());
    let flags = WhenFields::FLAGS;
    let json = WhenFields::JSON;
    let tz_with_every = message(Some("90s"), None, Some("UTC"), flags);
    assert!(tz_with_every.contains("--tz goes with --cron only"), "{tz_with_every}");
    assert!(tz_with_every.contains("--every"), "{tz_with_every}");
    let over_http = message(Some("90s"), None, Some("UTC"), json);
    assert!(over_http.starts_with("\"tz\" goes with \"cron\""), "{over_http}");
    assert!(!over_http.contains("--"), "{over_http}");
    assert!(message(Some("soon"), None, None, json).starts_with("\"every\" \"soon\""));
    assert!(message(None, Some("0 9 * *"), None, flags).starts_with("--cron \"0 9 * *\""));
    let zone = message(None, Some("* * * * *"), Some("Mars/Base"), flags);
    assert!(zone.starts_with("--tz \"Mars/Base\": unknown time zone"), "{zone}");
    assert!(message(Some("1m"), Some("* * * * *"), None, flags).contains("not both"));
    assert!(message(None, None, None, json).contains("\"every\""));
    for (every, cron, tz) in [(Some("90s"), None, None), (None, Some("0 9 * * *"), Some("UTC"))] {
        assert!(parse_when(every, cron, tz, flags).is_ok());
        assert!(parse_when(every, cron, tz, json).is_ok());
    }
    assert_eq!(
        parse_when(None, Some(" 0 9 * * * "), Some(" Europe/Berlin "), json).unwrap(),
        When::Cron { cron: "0 9 * * *".into(), tz: "Europe/Berlin".into() }
    );
}

#[test]
fn catch_up_fires_the_latest_missed_slot_and_records_the_others_inside_the_window() {
    let start = utc(2026, 1, 1, 0, 0);
    let every = When::Every { every_ms: 60_000 };
    let minute = |m: i64| start + TimeDelta::minutes(m);
    let five = Duration::from_secs(300);
    // Down from creation until minute 10: slots 5..=10 are inside the window.
    let got = plan(&every, start, None, five, minute(10)).unwrap();
    assert_eq!(got.fire, Some(minute(10)));
    assert_eq!(got.caught_up, (5..10).map(minute).collect::<Vec<_>>());
    // Slot 9 claimed before: only 10 is due.
    let got =
        plan(&every, start, Some(minute(9)), five, minute(10) + TimeDelta::seconds(30)).unwrap();
    assert_eq!(got, Plan { fire: Some(minute(10)), caught_up: Vec::new() });
    // Nothing due between slots.
    let got =
        plan(&every, start, Some(minute(10)), five, minute(10) + TimeDelta::seconds(59)).unwrap();
    assert_eq!(got, Plan::default());
    // A short window: the slots of a long outage are not fired.
    let got = plan(
        &every,
        start,
        Some(minute(1)),
        Duration::from_secs(5),
        minute(10) + TimeDelta::seconds(30),
    )
    .unwrap();
    assert_eq!(got, Plan::default());
}

/// Records fires; `busy` says whether the last fire's run still goes on.
#[derive(Debug, Default)]
struct Recorder {
    fired: Mutex<Vec<DateTime<Utc>>>,
    busy: Mutex<bool>,
    refuse: Mutex<Option<String>>,
}

#[async_trait]
impl Firer for Recorder {
    async fn fire(&self, _: &ScheduleRow, _: &ScheduleSpec, slot: DateTime<Utc>) -> FireOutcome {
        if let Some(reason) = self.refuse.lock().unwrap().clone() {
            return FireOutcome::Refused(reason);
        }
        self.fired.lock().unwrap().push(slot);
        FireOutcome::Fired(SessionId(uuid::Uuid::now_v7()))
    }

    async fn running(&self, _: SessionId) -> bool {
        *self.busy.lock().unwrap()
    }

    fn holder_alive(&self, holder: &str) -> Option<bool> {
        (holder == "dead").then_some(false)
    }
}

struct Fixture {
    clock: Arc<FakeClock>,
    store: Arc<dyn Schedules>,
    recorder: Arc<Recorder>,
    scheduler: Scheduler,
    id: uuid::Uuid,
}

async fn fixture(overlap: Overlap) -> Fixture {
    let clock = Arc::new(FakeClock::starting_at(utc(2026, 1, 1, 0, 0)));
    let store: Arc<dyn Schedules> = Arc::new(keel_store::SqliteStore::open_in_memory().unwrap());
    let recorder = Arc::new(Recorder::default());
    let spec = ScheduleSpec {
        when: When::Every { every_ms: 60_000 },
        target: Target::Session { session_id: SessionId(uuid::Uuid::nil()) },
        task: "tick".into(),
        overlap,
        catch_up_ms: 300_000,
        max_steps: None,
        max_cost_usd: None,
    };
    let row = new_row(&spec, clock.peek()).unwrap();
    store.add_schedule(&row).await.unwrap();
    let scheduler = Scheduler::new(store.clone(), clock.clone(), "me", recorder.clone());
    Fixture { clock, store, recorder, scheduler, id: row.id }
}

impl Fixture {
    async fn minute(&self) -> Tick {
        self.clock.advance(Duration::from_secs(60));
        self.scheduler.tick().await.unwrap()
    }

    async fn states(&self) -> Vec<(i64, &'static str)> {
        let start = utc(2026, 1, 1, 0, 0);
        let mut fires = self.store.fires(self.id, 100).await.unwrap();
        fires.reverse();
        fires.iter().map(|f| ((f.scheduled_at - start).num_minutes(), f.state.as_str())).collect()
    }
}

#[tokio::test]
async fn overlap_skip_records_slots_that_come_while_the_last_fire_runs() {
    let f = fixture(Overlap::Skip).await;
    assert!(f.scheduler.tick().await.unwrap().fired.is_empty(), "nothing before the first slot");
    f.minute().await;
    *f.recorder.busy.lock().unwrap() = true;
    f.minute().await;
    f.minute().await;
    *f.recorder.busy.lock().unwrap() = false;
    f.minute().await;
    assert_eq!(f.states().await, vec![(1, "fired"), (2, "skipped"), (3, "skipped"), (4, "fired")]);
    assert_eq!(f.recorder.fired.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn overlap_buffer_keeps_one_slot_and_fires_it_when_the_run_ends() {
    let f = fixture(Overlap::Buffer).await;
    f.minute().await;
    *f.recorder.busy.lock().unwrap() = true;
    assert_eq!(f.minute().await.buffered.len(), 1);
    f.minute().await;
    *f.recorder.busy.lock().unwrap() = false;
    f.clock.advance(Duration::from_secs(5));
    let tick = f.scheduler.tick().await.unwrap();
    assert_eq!(tick.fired.len(), 1, "the buffered slot fires once the run ended");
    assert_eq!(f.states().await, vec![(1, "fired"), (2, "fired"), (3, "skipped")]);
    f.minute().await;
    assert_eq!(f.states().await.last(), Some(&(4, "fired")));
}

#[tokio::test]
async fn overlap_allow_fires_while_the_last_fire_runs() {
    let f = fixture(Overlap::Allow).await;
    *f.recorder.busy.lock().unwrap() = true;
    f.minute().await;
    f.minute().await;
    assert_eq!(f.states().await, vec![(1, "fired"), (2, "fired")]);
}

#[tokio::test]
async fn a_host_down_for_ten_minutes_catches_up_once_and_never_twice() {
    let f = fixture(Overlap::Skip).await;
    f.minute().await;
    f.clock.advance(Duration::from_secs(600));
    let tick = f.scheduler.tick().await.unwrap();
    assert_eq!(tick.fired.len(), 1);
    assert_eq!(tick.skipped.len(), 4, "slots 7..=10 inside the 5 minute window: {tick:?}");
    let again = f.scheduler.tick().await.unwrap();
    assert_eq!(again, Tick::default(), "the same instant fires nothing again");
    let states = f.states().await;
    assert_eq!(states.first(), Some(&(1, "fired")));
    assert_eq!(states.last(), Some(&(11, "fired")));
    assert_eq!(states.iter().filter(|(_, s)| *s == "fired").count(), 2);
}

#[tokio::test]
async fn refusals_and_pauses_are_recorded_or_respected() {
    let f = fixture(Overlap::Skip).await;
    *f.recorder.refuse.lock().unwrap() = Some("workspace is not trusted".into());
    f.minute().await;
    let fires = f.store.fires(f.id, 10).await.unwrap();
    assert_eq!(
        (fires[0].state, fires[0].detail.as_str()),
        (FireState::Refused, "workspace is not trusted")
    );
    f.store.set_schedule_paused(f.id, true).await.unwrap();
    f.minute().await;
    assert_eq!(f.store.fires(f.id, 10).await.unwrap().len(), 1, "a paused schedule claims nothing");
}

#[tokio::test]
async fn a_dead_holders_claimed_fire_is_recorded_failed_and_never_fired() {
    let f = fixture(Overlap::Skip).await;
    let slot = utc(2026, 1, 1, 0, 1);
    let claim = FireRow {
        schedule_id: f.id,
        scheduled_at: slot,
        holder: "dead".into(),
        claimed_at: slot,
        state: FireState::Claimed,
        session_id: None,
        detail: String::new(),
    };
    assert!(f.store.claim_fire(&claim).await.unwrap());
    let tick = f.minute().await;
    assert_eq!(tick.recovered, vec![(f.id, slot)]);
    assert!(tick.fired.is_empty());
    assert!(f.recorder.fired.lock().unwrap().is_empty());
    let fires = f.store.fires(f.id, 10).await.unwrap();
    assert_eq!(fires[0].state, FireState::Failed);
    assert!(fires[0].detail.contains("outcome unknown"), "{}", fires[0].detail);
}

#[tokio::test]
async fn two_schedulers_on_one_store_fire_each_slot_once() {
    let f = fixture(Overlap::Allow).await;
    let other = Arc::new(Recorder::default());
    let second = Scheduler::new(f.store.clone(), f.clock.clone(), "other", other.clone());
    for _ in 0..10 {
        f.clock.advance(Duration::from_secs(60));
        let (a, b) = tokio::join!(f.scheduler.tick(), second.tick());
        assert_eq!(a.unwrap().fired.len() + b.unwrap().fired.len(), 1);
    }
    let mut all: Vec<DateTime<Utc>> = f.recorder.fired.lock().unwrap().clone();
    all.extend(other.fired.lock().unwrap().iter().copied());
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 10);
}

#[test]
fn a_schedule_reads_as_its_interval_or_cron_and_names_its_next_slot() {
    for (text, shown) in [("90s", "every 90s"), ("5m", "every 5m"), ("2h", "every 2h")] {
        assert_eq!(parse_every(text).unwrap().text(), shown);
    }
    let weekdays = cron("0 9 * * MON-FRI", "Europe/Berlin");
    assert_eq!(weekdays.text(), "cron \"0 9 * * MON-FRI\" Europe/Berlin");
    // Interval slots count from creation: created 10:00, every 5m, now 10:07 → 10:10.
    let every = parse_every("5m").unwrap();
    let next = next_slot(&every, utc(2026, 6, 1, 10, 0), utc(2026, 6, 1, 10, 7)).unwrap();
    assert_eq!(next, Some(utc(2026, 6, 1, 10, 10)));
    // Friday 2026-06-05 10:00 UTC (12:00 in Berlin) → Monday 09:00 CEST (07:00 UTC).
    let next = next_slot(&weekdays, utc(2026, 6, 1, 0, 0), utc(2026, 6, 5, 10, 0)).unwrap();
    assert_eq!(next, Some(utc(2026, 6, 8, 7, 0)));
}

#[test]
fn a_catch_up_window_of_any_stored_size_plans_without_overflow() {
    let start = utc(2026, 1, 1, 0, 0);
    let every = When::Every { every_ms: 2_000 };
    let now = start + TimeDelta::seconds(5);
    // What an older keel or a hand-written row may hold: the window reaches past the
    // earliest representable time, so it reads "since creation".
    for catch_up in [Duration::from_millis(u64::MAX), Duration::MAX] {
        let got = plan(&every, start, None, catch_up, now).unwrap();
        assert_eq!(got.fire, Some(start + TimeDelta::seconds(4)), "{catch_up:?}");
    }
    // A schedule created at the earliest representable time plans too.
    let got = plan(&every, DateTime::<Utc>::MIN_UTC, None, Duration::MAX, DateTime::<Utc>::MIN_UTC);
    assert_eq!(got.unwrap(), Plan::default());
}

#[test]
fn durations_beyond_a_hundred_years_are_refused_at_parse() {
    assert_eq!(crate::duration::parse_duration("876000h"), Some(crate::duration::MAX_DURATION));
    for text in ["876001h", "10000000000000s", "9223372036854775807s", "1e300s"] {
        assert_eq!(crate::duration::parse_duration(text), None, "{text}");
    }
    let message = format!("{:#}", parse_every("10000000000000s").unwrap_err());
    assert!(message.starts_with("--every \"10000000000000s\""), "{message}");
    let spec = ScheduleSpec {
        when: When::Every { every_ms: 2_000 },
        target: Target::Session { session_id: SessionId(uuid::Uuid::nil()) },
        task: "t".into(),
        overlap: Overlap::Skip,
        catch_up_ms: u64::MAX,
        max_steps: None,
        max_cost_usd: None,
    };
    assert!(new_row(&spec, utc(2026, 1, 1, 0, 0)).is_err());
}

#[tokio::test]
async fn a_stored_huge_catch_up_neither_panics_nor_stops_other_schedules() {
    let f = fixture(Overlap::Skip).await;
    // Written behind keel's back (by hand, or by an older keel that accepted it).
    let spec = ScheduleSpec {
        when: When::Every { every_ms: 60_000 },
        target: Target::Session { session_id: SessionId(uuid::Uuid::nil()) },
        task: "huge".into(),
        overlap: Overlap::Skip,
        catch_up_ms: u64::MAX,
        max_steps: None,
        max_cost_usd: None,
    };
    let spec = serde_json::to_value(spec).unwrap();
    let huge =
        ScheduleRow { id: uuid::Uuid::now_v7(), created_at: f.clock.peek(), paused: false, spec };
    f.store.add_schedule(&huge).await.unwrap();
    let tick = f.minute().await;
    let mut fired: Vec<uuid::Uuid> = tick.fired.iter().map(|(id, _)| *id).collect();
    fired.sort();
    let mut want = vec![f.id, huge.id];
    want.sort();
    assert_eq!(fired, want, "both schedules fire their first slot");
    assert_eq!(f.states().await, vec![(1, "fired")]);
}

#[test]
fn a_cron_that_never_fires_is_refused_naming_it_and_5_to_7_fields_parse() {
    let message =
        |cron, fields| format!("{:#}", parse_when(None, Some(cron), None, fields).unwrap_err());
    let feb_30 = message("0 0 30 2 *", WhenFields::FLAGS);
    assert!(
        feb_30.starts_with("--cron \"0 0 30 2 *\" never fires in the next 5 years"),
        "{feb_30}"
    );
    let over_http = message("0 0 30 2 *", WhenFields::JSON);
    assert!(over_http.starts_with("\"cron\" \"0 0 30 2 *\" never fires"), "{over_http}");
    // A year long past (the seventh field) never fires either.
    assert!(message("0 0 0 1 1 * 2020", WhenFields::FLAGS).contains("never fires"));
    // The neighbours: a leap day fires (in 2028 at the latest), and so do 6 and 7 fields.
    for cron in ["0 0 29 2 *", "30 0 9 * * MON-FRI", "0 0 9 1 1 * 2030", "@daily"] {
        assert!(parse_cron(cron, None).is_ok(), "{cron}");
    }
    // What the help text says is what the parser says: 5 to 7 fields.
    let eight = message("0 0 9 1 1 * 2030 1", WhenFields::FLAGS);
    assert!(eight.contains("between 5 and 7 fields"), "{eight}");
    assert!(message("9 * *", WhenFields::FLAGS).contains("between 5 and 7 fields"));
    // A value out of range names its field.
    for (cron, field) in [
        ("61 * * * *", "(the minute field, \"61\")"),
        ("0 25 * * *", "(the hour field, \"25\")"),
        ("0 0 32 * *", "(the day of month field, \"32\")"),
        ("0 0 * 13 *", "(the month field, \"13\")"),
        ("0 0 * * 9", "(the day of week field, \"9\")"),
        ("60 * * * * *", "(the second field, \"60\")"),
        ("0 0 0 1 1 * 99999", "(the year field, \"99999\")"),
        ("0 0 9-x * *", "(the day of month field, \"9-x\")"),
    ] {
        let said = message(cron, WhenFields::FLAGS);
        assert!(said.starts_with(&format!("--cron {cron:?}: ")), "{said}");
        assert!(said.ends_with(field), "{cron}: {said}");
    }
}

#[tokio::test]
async fn an_unreadable_stored_spec_is_reported_and_other_schedules_still_fire() {
    let f = fixture(Overlap::Skip).await;
    // Written behind keel's back: not a spec this keel reads.
    let bad = ScheduleRow {
        id: uuid::Uuid::now_v7(),
        created_at: f.clock.peek(),
        paused: false,
        spec: serde_json::json!({"when": {"hourly": true}, "task": "x"}),
    };
    f.store.add_schedule(&bad).await.unwrap();
    let tick = f.minute().await;
    assert_eq!(tick.unreadable.len(), 1, "{tick:?}");
    assert_eq!(tick.unreadable[0].0, bad.id);
    assert!(tick.unreadable[0].1.contains("stored spec is not one this keel reads"), "{tick:?}");
    assert_eq!(tick.fired.iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![f.id]);
    // Reported on every tick (for callers), warned on stderr once.
    assert_eq!(f.minute().await.unreadable.len(), 1);
    assert!(f.store.fires(bad.id, 10).await.unwrap().is_empty());
}
