//! `keel schedule add|list|rm|pause|resume`: schedules are rows in the ledger's database
//! (`KEEL_HOME/keel.sqlite` or `KEEL_DATABASE_URL`); `keel serve` fires them. Adding one
//! needs no running host; the host checks admission (its workspace roots, the model, the
//! workspace's trust, budgets) again at every fire and records a refusal on the fire.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use keel_host::error::usage;
use keel_host::root::canonical_workspace;
use keel_host::schedule::{self, Overlap, ScheduleSpec, Target};
use keel_store::{FireRow, ScheduleRow, Schedules};

use crate::args::{ApprovalArg, ScheduleAdd, ScheduleCommand};
use crate::exit;
use crate::terminal;

pub(crate) async fn command(command: ScheduleCommand) -> anyhow::Result<u8> {
    let (_, store, schedules) = keel_host::root::open_stores().await?;
    match command {
        ScheduleCommand::Add(add) => {
            let ScheduleAdd {
                every,
                cron,
                tz,
                session,
                last,
                workspace,
                model,
                approval,
                overlap,
                catch_up,
                max_steps,
                max_cost_usd,
                task,
            } = *add;
            let when = schedule::parse_when(
                every.as_deref(),
                cron.as_deref(),
                tz.as_deref(),
                schedule::WhenFields::FLAGS,
            )?;
            let session =
                (session.is_some() || last).then(|| crate::habits::SessionArg::new(session, last));
            let target = match (session, workspace, model) {
                (Some(session), None, None) => {
                    if approval.is_some() {
                        return Err(usage(
                            "--approval is for a new session per fire; a session's fires use \
                             the session's approval",
                        ));
                    }
                    Target::Session { session_id: session.resolve(&store).await? }
                }
                (None, Some(dir), Some(model)) => Target::Template {
                    workspace: canonical_workspace(Some(&dir))?.display().to_string(),
                    model: checked_model(absolute_script(model))?,
                    approval: match approval.unwrap_or(ApprovalArg::Deny) {
                        ApprovalArg::Ask => keel_contracts::ApprovalMode::Ask,
                        ApprovalArg::Auto => keel_contracts::ApprovalMode::Auto,
                        ApprovalArg::Sandboxed => keel_contracts::ApprovalMode::Sandboxed,
                        ApprovalArg::Deny => keel_contracts::ApprovalMode::Deny,
                    },
                },
                _ => return Err(usage("give --session ID (or --last), or -C DIR with -m SPEC")),
            };
            let overlap = match overlap.as_str() {
                "skip" => Overlap::Skip,
                "buffer" => Overlap::Buffer,
                "allow" => Overlap::Allow,
                other => return Err(usage(format!("--overlap {other:?}: skip, buffer or allow"))),
            };
            let catch_up = keel_host::duration::parse_duration(&catch_up).ok_or_else(|| {
                usage("--catch-up: a duration such as 5m, at most 876000h (100 years)")
            })?;
            let spec = ScheduleSpec {
                when,
                target,
                task,
                overlap,
                catch_up_ms: u64::try_from(catch_up.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(schedule::MIN_CATCH_UP_MS),
                max_steps,
                max_cost_usd,
            };
            let row = schedule::new_row(&spec, chrono::Utc::now())?;
            schedules.add_schedule(&row).await?;
            outln!("{}", row.id);
            Ok(exit::COMPLETED)
        }
        ScheduleCommand::List { json } => {
            let rows = schedules.schedules().await?;
            let mut listed = Vec::with_capacity(rows.len());
            for row in rows {
                let fires = schedules.fires(row.id, 1).await?;
                listed.push((row, fires));
            }
            if json {
                for (row, fires) in &listed {
                    outln!("{}", schedule::describe(row, fires));
                }
            } else if listed.is_empty() {
                eprintln!("keel: no schedules (add one with `keel schedule add`)");
            } else {
                print_table(&listed, chrono::Utc::now());
            }
            Ok(exit::COMPLETED)
        }
        ScheduleCommand::Rm { id } => {
            let id = resolve(&schedules, &id).await?;
            schedules.remove_schedule(id).await?;
            outln!("removed {id}");
            Ok(exit::COMPLETED)
        }
        ScheduleCommand::Pause { id } => pause(&schedules, &id, true).await,
        ScheduleCommand::Resume { id } => pause(&schedules, &id, false).await,
    }
}

async fn pause(schedules: &Arc<dyn Schedules>, id: &str, paused: bool) -> anyhow::Result<u8> {
    let id = resolve(schedules, id).await?;
    schedules.set_schedule_paused(id, paused).await?;
    outln!("{} {id}", if paused { "paused" } else { "resumed" });
    Ok(exit::COMPLETED)
}

/// `keel schedule list`: one row per schedule (id, when, next fire, last fire, target,
/// task), times local with their offset; a last fire's reason (a refusal, an error) on
/// the line below it.
fn print_table(listed: &[(ScheduleRow, Vec<FireRow>)], now: DateTime<Utc>) {
    let time = |at: DateTime<Utc>| {
        at.with_timezone(&chrono::Local).format("%Y-%m-%d %H:%M:%S %:z").to_string()
    };
    let header = ["SCHEDULE", "WHEN", "NEXT FIRE", "LAST FIRE", "TARGET", "TASK"];
    let mut rows: Vec<([String; 6], Option<String>)> = Vec::new();
    for (row, fires) in listed {
        let spec = serde_json::from_value::<ScheduleSpec>(row.spec.clone());
        let (when, next, target, task) = match &spec {
            Ok(spec) => {
                let next = if row.paused {
                    "paused".to_owned()
                } else {
                    match schedule::next_slot(&spec.when, row.created_at, now) {
                        Ok(Some(at)) => time(at),
                        Ok(None) => "never".to_owned(),
                        Err(error) => format!("invalid: {error:#}"),
                    }
                };
                let target = match &spec.target {
                    Target::Session { session_id } => format!("session {session_id}"),
                    Target::Template { workspace, .. } => format!("new session in {workspace}"),
                };
                (spec.when.text(), next, target, spec.task.clone())
            }
            Err(error) => (format!("unreadable: {error}"), "-".into(), "-".into(), String::new()),
        };
        let (last, reason) = match fires.first() {
            None => ("never fired".to_owned(), None),
            Some(fire) => {
                let reason = (!fire.detail.is_empty())
                    .then(|| format!("{}: {}", fire.state.as_str(), fire.detail));
                (format!("{} {}", fire.state.as_str(), time(fire.scheduled_at)), reason)
            }
        };
        let cells = [
            row.id.to_string(),
            terminal::one_line(&when, 60),
            next,
            last,
            terminal::one_line(&target, 80),
            terminal::one_line(&task, 80),
        ];
        rows.push((cells, reason.map(|reason| terminal::one_line(&reason, 300))));
    }
    let mut widths = header.map(|title| title.chars().count());
    for (cells, _) in &rows {
        for (width, cell) in widths.iter_mut().zip(cells) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut text = String::new();
        for (index, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if index + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_owned()
    };
    outln!("{}", line(&header.map(str::to_owned)));
    for (cells, reason) in &rows {
        outln!("{}", line(cells));
        if let Some(reason) = reason {
            outln!("  ↳ {reason}");
        }
    }
}

/// A schedule id from its full text or a unique prefix.
async fn resolve(schedules: &Arc<dyn Schedules>, prefix: &str) -> anyhow::Result<uuid::Uuid> {
    let prefix = prefix.trim().to_ascii_lowercase();
    if prefix.is_empty() {
        return Err(usage("give a schedule id"));
    }
    let rows: Vec<ScheduleRow> = schedules.schedules().await?;
    let matching: Vec<uuid::Uuid> =
        rows.iter().map(|row| row.id).filter(|id| id.to_string().starts_with(&prefix)).collect();
    match matching.as_slice() {
        [one] => Ok(*one),
        [] => Err(usage(format!("no schedule {prefix}"))),
        _ => Err(usage(format!("{prefix} names several schedules; give more of the id"))),
    }
}

/// `model` if it is a spec `keel run` would take: a known provider and a model named, and
/// a scripted model's file readable as a script. The key of a hosted provider is not looked
/// for: the host that fires the schedule needs it, not this shell.
fn checked_model(model: String) -> anyhow::Result<String> {
    keel_host::provider::check_model_spec(&model)?;
    if model.starts_with("scripted:") {
        keel_host::provider::model_client(&model, None, None)?;
    }
    Ok(model)
}

/// A `scripted:` model with a relative path names it from here, as `keel run` does: the
/// host that fires the schedule may run in another folder.
fn absolute_script(model: String) -> String {
    match model.strip_prefix("scripted:") {
        Some(path) if std::path::Path::new(path).is_relative() => match std::env::current_dir() {
            Ok(dir) => format!("scripted:{}", dir.join(path).display()),
            Err(_) => model,
        },
        _ => model,
    }
}
