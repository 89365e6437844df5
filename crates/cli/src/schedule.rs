//! `keel schedule add|list|rm|pause|resume`: schedules are rows in the ledger's database
//! (`KEEL_HOME/keel.sqlite` or `KEEL_DATABASE_URL`); `keel serve` fires them. Adding one
//! needs no running host; the host checks admission (its workspace roots, the model, the
//! workspace's trust, budgets) again at every fire and records a refusal on the fire.

use std::sync::Arc;

use keel_host::schedule::{self, Overlap, ScheduleSpec, Target};
use keel_store::{ScheduleRow, Schedules};

use crate::app::{canonical_workspace, exit, resolve_session, usage};
use crate::args::{ApprovalArg, ScheduleAdd, ScheduleCommand};

pub(crate) async fn command(command: ScheduleCommand) -> anyhow::Result<u8> {
    let (_, store, schedules) = keel_host::root::open_stores().await?;
    match command {
        ScheduleCommand::Add(add) => {
            let ScheduleAdd {
                every,
                cron,
                tz,
                session,
                workspace,
                model,
                approval,
                overlap,
                catch_up,
                max_steps,
                max_cost_usd,
                task,
            } = *add;
            let when = match (every, cron) {
                (Some(every), None) => schedule::parse_every(&every)?,
                (None, Some(cron)) => schedule::parse_cron(&cron, tz.as_deref())?,
                _ => return Err(usage("give exactly one of --every and --cron")),
            };
            let target = match (session, workspace, model) {
                (Some(session), None, None) => {
                    if approval.is_some() {
                        return Err(usage(
                            "--approval is for a new session per fire; a session's fires use \
                             the session's approval",
                        ));
                    }
                    Target::Session { session_id: resolve_session(&store, &session).await? }
                }
                (None, Some(dir), Some(model)) => Target::Template {
                    workspace: canonical_workspace(Some(&dir))?.display().to_string(),
                    model: absolute_script(model),
                    approval: match approval.unwrap_or(ApprovalArg::Deny) {
                        ApprovalArg::Ask => keel_contracts::ApprovalMode::Ask,
                        ApprovalArg::Auto => keel_contracts::ApprovalMode::Auto,
                        ApprovalArg::Sandboxed => keel_contracts::ApprovalMode::Sandboxed,
                        ApprovalArg::Deny => keel_contracts::ApprovalMode::Deny,
                    },
                },
                _ => return Err(usage("give --session ID, or -C DIR with -m SPEC")),
            };
            let overlap = match overlap.as_str() {
                "skip" => Overlap::Skip,
                "buffer" => Overlap::Buffer,
                "allow" => Overlap::Allow,
                other => return Err(usage(format!("--overlap {other:?}: skip, buffer or allow"))),
            };
            let catch_up = keel_host::root::parse_duration(&catch_up)
                .ok_or_else(|| usage("--catch-up: a duration such as 5m"))?;
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
            for row in schedules.schedules().await? {
                let fires = schedules.fires(row.id, 1).await?;
                let described = schedule::describe(&row, &fires);
                if json {
                    outln!("{described}");
                } else {
                    let when = match described.get("when") {
                        Some(when) => when.to_string(),
                        None => String::new(),
                    };
                    let last = fires.first().map_or_else(
                        || "never fired".to_owned(),
                        |fire| {
                            format!(
                                "last {} {}",
                                fire.scheduled_at.to_rfc3339(),
                                fire.state.as_str()
                            )
                        },
                    );
                    let paused = if row.paused { " (paused)" } else { "" };
                    let task = described.get("task").and_then(|t| t.as_str()).unwrap_or_default();
                    outln!(
                        "{}{paused}  {when}  {last}  {}",
                        row.id,
                        crate::terminal::neutralize(task)
                    );
                }
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
