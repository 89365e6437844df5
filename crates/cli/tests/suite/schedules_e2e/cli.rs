//! `keel schedule add` and `keel schedule list`: bad flags named, and the listing's table.

use keel_store::{FireRow, FireState};

use super::harness::{sessions, sqlite_schedules};
use crate::suite::support::{Env, json_lines, stderr, stdout};

/// Schedule errors name the flag at fault, and `--tz` with `--every` (an interval has no
/// zone) is refused naming both; nothing is added. The neighbours: `--tz` with `--cron`
/// and `--every` alone are added.
#[test]
fn bad_schedule_flags_are_usage_errors_that_name_the_flag() {
    let env = Env::new();
    let ws = env.workspace();
    let model = format!("scripted:{}", env.write_script("s.json", r#"{"steps":[]}"#).display());
    let target = ["-C", ws.to_str().unwrap(), "-m", model.as_str(), "x"];
    let add = |flags: &[&str]| {
        let mut args = vec!["schedule", "add"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&target);
        env.run(&args)
    };
    for (flags, named) in [
        (&["--every", "90s", "--tz", "Europe/Berlin"][..], &["--tz", "--every", "--cron"][..]),
        (&["--every", "soon"][..], &["--every \"soon\""][..]),
        (&["--cron", "0 9 * *"][..], &["--cron \"0 9 * *\""][..]),
        (&["--cron", "0 9 * * *", "--tz", "Mars/Base"][..], &["--tz \"Mars/Base\""][..]),
        // 30 February: parses, never fires; refused rather than stored to never fire.
        (&["--cron", "0 0 30 2 *"][..], &["--cron \"0 0 30 2 *\" never fires"][..]),
        (&["--cron", "0 0 9 1 1 * 2030 1"][..], &["between 5 and 7 fields"][..]),
        // Beyond 100 years: refused, never stored to overflow the host's arithmetic.
        (&["--every", "2s", "--catch-up", "10000000000000s"][..], &["--catch-up"][..]),
        (&["--every", "10000000000000s"][..], &["--every \"10000000000000s\""][..]),
    ] {
        let output = add(flags);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {}", stderr(&output));
        for name in named {
            assert!(stderr(&output).contains(name), "{name} not in {}", stderr(&output));
        }
    }
    // A model `keel run` would refuse is refused when the schedule is added, not at its
    // first fire.
    let with_model = |model: &str| {
        env.run(&[
            "schedule",
            "add",
            "--every",
            "90s",
            "-C",
            ws.to_str().unwrap(),
            "-m",
            model,
            "x",
        ])
    };
    for (model, named) in [
        ("bogus:zzz", "unknown provider 'bogus'"),
        ("openai:", "names no model"),
        ("gpt-4o", "invalid model spec"),
        ("scripted:/nonexistent/s.json", "/nonexistent/s.json"),
    ] {
        let output = with_model(model);
        assert_eq!(output.status.code(), Some(2), "{model}: {}", stderr(&output));
        assert!(stderr(&output).contains(named), "{named} not in {}", stderr(&output));
    }
    let listed = env.run(&["schedule", "list", "--json"]);
    assert_eq!(stdout(&listed), "", "nothing was added");
    for flags in [&["--cron", "0 9 * * *", "--tz", "Europe/Berlin"][..], &["--every", "90s"][..]] {
        let output = add(flags);
        assert_eq!(output.status.code(), Some(0), "{flags:?}: {}", stderr(&output));
    }
    // The neighbour: a hosted model needs no key in this shell (the firing host has it).
    let output = with_model("openai:gpt-4o");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let listed = stdout(&env.run(&["schedule", "list", "--json"]));
    assert_eq!(listed.lines().count(), 3, "{listed}");
    assert!(listed.contains("Europe/Berlin"), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_list_is_a_table_with_next_and_last_fire_and_says_when_empty() {
    let env = Env::new();
    let ws = env.workspace();
    let empty = env.run(&["schedule", "list"]);
    assert_eq!(empty.status.code(), Some(0), "{}", stderr(&empty));
    assert_eq!(stdout(&empty), "");
    assert!(stderr(&empty).contains("no schedules"), "{}", stderr(&empty));
    assert_eq!(stdout(&env.run(&["schedule", "list", "--json"])), "");

    let model = format!(
        "scripted:{}",
        env.write_script("hi.json", r#"{"steps":[{"text":"hi"}]}"#).display()
    );
    let ran = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "t"]);
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    let session = sessions(&env, &[]).remove(0);
    // `--last` names the newest session, as for the other commands that take one.
    let added = env.run(&["schedule", "add", "--every", "5m", "--last", "again"]);
    assert_eq!(added.status.code(), Some(0), "{}", stderr(&added));
    let into_session = stdout(&added).trim().to_owned();
    let both = env.run(&["schedule", "add", "--every", "5m", "--last", "--session", &session, "x"]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    let added = env.run(&[
        "schedule",
        "add",
        "--cron",
        "0 9 * * MON-FRI",
        "--tz",
        "Europe/Berlin",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "triage",
    ]);
    assert_eq!(added.status.code(), Some(0), "{}", stderr(&added));
    let template = stdout(&added).trim().to_owned();
    // A refused fire, as a host records it.
    let store = sqlite_schedules(&env);
    let refused = FireRow {
        schedule_id: uuid::Uuid::parse_str(&into_session).unwrap(),
        scheduled_at: chrono::Utc::now(),
        holder: "keel pid 1 on elsewhere".into(),
        claimed_at: chrono::Utc::now(),
        state: FireState::Refused,
        session_id: None,
        detail: "session is sealed".into(),
    };
    assert!(store.claim_fire(&refused).await.unwrap());
    assert!(env.run(&["schedule", "pause", &template]).status.success());

    let listed = env.run(&["schedule", "list"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    let text = stdout(&listed);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("SCHEDULE") && lines[0].contains("NEXT FIRE"), "{text}");
    assert!(!text.contains("every_ms") && !text.contains('{'), "no raw JSON: {text}");
    let row = |id: &str| *lines.iter().find(|line| line.starts_with(id)).unwrap();
    let first = row(&into_session);
    assert!(first.contains("every 5m"), "{first}");
    assert!(first.contains("refused 20"), "{first}");
    assert!(first.contains(&format!("session {session}")), "{first}");
    assert!(first.ends_with("again"), "{first}");
    // The next fire is a zoned time; the refusal's reason is on the line below.
    let zoned = |line: &str| {
        line.split_whitespace()
            .filter(|word| {
                word.len() == 6
                    && (word.starts_with('+') || word.starts_with('-'))
                    && word.as_bytes()[3] == b':'
            })
            .count()
    };
    assert_eq!(zoned(first), 2, "next and last fire, each with its zone: {first}");
    let below = lines[lines.iter().position(|line| *line == first).unwrap() + 1];
    assert_eq!(below, "  ↳ refused: session is sealed");
    let second = row(&template);
    assert!(second.contains("cron \"0 9 * * MON-FRI\" Europe/Berlin"), "{second}");
    assert!(second.contains("paused") && second.contains("never fired"), "{second}");
    assert!(second.contains("new session in") && second.ends_with("triage"), "{second}");
    // Columns line up: every row's WHEN starts where the header's does.
    let column = lines[0].find("WHEN").unwrap();
    assert_eq!(first.find("every 5m"), Some(column), "{text}");
    assert_eq!(second.find("cron "), Some(column), "{text}");
    // --json keeps the full data.
    let json = json_lines(&env.run(&["schedule", "list", "--json"]));
    let full = json.iter().find(|s| s["schedule_id"] == into_session.as_str()).unwrap();
    assert_eq!(full["when"]["every"]["every_ms"], 300_000, "{full}");
    assert_eq!(full["last_fire"]["detail"], "session is sealed");
    assert_eq!(full["target"]["session"]["session_id"], session.as_str());
}
