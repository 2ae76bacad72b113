//! The subcommands that look after a host's releases and jobs: `status`, `list`,
//! `rollback`, `clean`, `logs`, `cancel`, `unlock`. Each reads the deploy folder once
//! ([`Session::inspect`]); the ones that change it hold its lock (`cancel` and `unlock`
//! need none: they stop a process, and `unlock` is for when the lock is the trouble).

use std::time::Duration;

use anyhow::Result;

use super::error::DeployError;
use super::lock::{Unlocked, unlock_script};
use super::record::{State, age};
use super::remote::REMOVE;
use super::report::{Release, Report, Run};
use super::session::{Check, QUICK_STEP, Session, expect_success, human_bytes, now_unix_s, step};
use super::{Cancel, Logs, Opened, utc_time};

/// How many finished jobs `status` lists (running ones are always listed).
const JOBS_SHOWN: usize = 10;

/// The deploy folder as the host has it; `None` (after saying so) in a dry run.
fn inspect(opened: &Opened) -> Result<Option<Report>> {
    let session = &opened.session;
    step("read the deploy folder");
    let report = session.inspect()?;
    if report.is_none() {
        eprintln!("\ndry run: nothing was run, here or on {}", session.host);
    }
    Ok(report)
}

/// Verifies `release`, the one `current` points at, before it is trusted.
pub fn verify_current(session: &Session, release: &str) -> Result<usize> {
    step("verify `current` on the host");
    match session.check_release(release)? {
        Check::Verified { files } => {
            eprintln!("releases/{release}: its {files} files match its SHA256SUMS and its name");
            Ok(files)
        }
        Check::Damaged(why) => Err(DeployError::ReleaseDamaged {
            host: session.host.clone(),
            release: release.to_string(),
            why,
        }
        .into()),
    }
}

/// `status`: what `current` is, whether it is whole, and its last run.
pub fn status(opened: &mut Opened) -> Result<()> {
    let Some(report) = inspect(opened)? else {
        return Ok(());
    };
    let session = &opened.session;
    let current = report.live_present(&session.host, &session.layout.dir)?;
    let verified = verify_current(session, &current);
    println!("{} in {}:", session.host, session.layout.dir);
    println!("current: {current}");
    if let Some(release) = report.release(&current) {
        describe(release, "  ");
    }
    if let Some(e) = report.last_made_current(&current) {
        println!(
            "  made current {}{} by {}",
            utc_time(e.time),
            if e.event == "rolled-back" {
                format!(" (a rollback from {})", e.from)
            } else {
                String::new()
            },
            if e.by.is_empty() { "?" } else { &e.by }
        );
    }
    match &verified {
        Ok(files) => println!("  verified: its {files} files match its SHA256SUMS and its name"),
        Err(_) => println!("  DAMAGED: it fails its checksums (see below)"),
    }
    match report.runs_of(&current).last() {
        Some(run) => println!("  last run: {}", run_line(run)),
        None => println!("  last run: none"),
    }
    match &report.locked_by {
        Some(holder) => println!("lock: held by {holder}"),
        None => println!("lock: free"),
    }
    jobs(&report);
    verified.map(drop)
}

/// The jobs, newest first: every running one and the last [`JOBS_SHOWN`] others, each
/// with its id, release, state, start and age.
fn jobs(report: &Report) {
    let now = now_unix_s();
    let mut shown = 0;
    let runs: Vec<&Run> = report.runs.iter().rev().collect();
    let running = runs.iter().filter(|r| r.running).count();
    println!(
        "jobs: {} ({running} running; newest first)",
        if runs.is_empty() {
            "none".to_string()
        } else {
            runs.len().to_string()
        }
    );
    for run in runs {
        if !run.running {
            if shown == JOBS_SHOWN {
                continue;
            }
            shown += 1;
        }
        let when = run
            .started()
            .map(|t| {
                format!(
                    ", started {} ({} ago)",
                    utc_time(t),
                    age(now.saturating_sub(t))
                )
            })
            .unwrap_or_default();
        println!("  {}  {}  {}{when}", run.run, run.release, run.outcome());
    }
}

/// The job `id` names; by default the newest running job (with `only_running`, the one
/// running job: several are an error), else the newest job.
pub fn pick_job<'a>(
    report: &'a Report,
    id: Option<&str>,
    session: &Session,
    only_running: bool,
) -> Result<&'a Run> {
    let names = |runs: &mut dyn Iterator<Item = &Run>| -> String {
        let names: Vec<String> = runs.take(5).map(|r| r.run.clone()).collect();
        if names.is_empty() {
            "no runs at all".into()
        } else {
            names.join(", ")
        }
    };
    if let Some(id) = id {
        return report.runs.iter().find(|r| r.run == id).ok_or_else(|| {
            DeployError::NoSuchJob {
                host: session.host.clone(),
                dir: session.layout.dir.clone(),
                job: id.to_string(),
                found: names(&mut report.runs.iter().rev()),
            }
            .into()
        });
    }
    let running: Vec<&Run> = report.runs.iter().filter(|r| r.running).collect();
    if only_running && running.len() > 1 {
        return Err(DeployError::WhichJob {
            host: session.host.clone(),
            dir: session.layout.dir.clone(),
            count: running.len(),
            found: names(&mut running.iter().rev().copied()),
        }
        .into());
    }
    running
        .last()
        .copied()
        .or(report.runs.last())
        .ok_or_else(|| {
            DeployError::NoSuchJob {
                host: session.host.clone(),
                dir: session.layout.dir.clone(),
                job: "at all".to_string(),
                found: "no runs".into(),
            }
            .into()
        })
}

/// `logs`: the job's last lines, and with `--follow` what comes until it ends.
pub fn logs(opened: &Opened, args: &Logs) -> Result<()> {
    let Some(report) = inspect(opened)? else {
        return Ok(());
    };
    let session = &opened.session;
    let run = pick_job(&report, args.id.job.as_deref(), session, false)?;
    eprintln!(
        "job {} of {} on {}: {}",
        run.run,
        run.release,
        session.host,
        run.outcome()
    );
    session.logs(&run.job(), &args.lines.to_string(), args.follow)
}

/// `cancel`: TERM to the job's process group, KILL after the grace; says what it did
/// and how the job's end was recorded.
pub fn cancel(opened: &Opened, args: &Cancel) -> Result<()> {
    let Some(report) = inspect(opened)? else {
        return Ok(());
    };
    let session = &opened.session;
    let run = pick_job(&report, args.id.job.as_deref(), session, true)?;
    let job = run.job();
    if !run.running {
        println!(
            "job {} of {} on {} is not running ({}): nothing to cancel",
            job.run,
            job.release,
            session.host,
            run.outcome()
        );
        return Ok(());
    }
    step(&format!("cancel job {}", job.run));
    let Some(lines) = session.stop_job(&job, args.grace * 10)? else {
        return Ok(());
    };
    for line in &lines {
        let mut words = line.split(' ');
        match (words.next(), words.next()) {
            (Some("none"), _) => println!("job {} was no longer running", job.run),
            (Some("term"), Some(group)) => {
                println!("sent SIGTERM to job {}'s process group {group}", job.run)
            }
            (Some("ended"), Some(tenths)) => {
                let tenths: u64 = tenths.parse().unwrap_or(0);
                println!("it ended within {}.{}s", tenths / 10, tenths % 10)
            }
            (Some("killed"), Some(group)) => println!(
                "it had not ended {}s after SIGTERM: sent SIGKILL to its process group {group}",
                args.grace
            ),
            _ => {}
        }
    }
    match session.await_end(&job, Duration::from_secs(10))? {
        Some(State::Ended(e)) => println!(
            "job {} of {} on {}: {}; its results stay there (`{}` fetches them)",
            job.run,
            job.release,
            session.host,
            e.describe_with_time(),
            session.command_line("attach", std::slice::from_ref(&job.run))
        ),
        Some(State::Running) => println!(
            "job {} on {} has not recorded its end yet: `{}` shows it",
            job.run,
            session.host,
            session.command_line("status", &[])
        ),
        Some(State::Gone) => println!(
            "job {} on {} ended without recording its status",
            job.run, session.host
        ),
        None => {}
    }
    Ok(())
}

/// `unlock`: breaks the deploy folder's lock, saying whose it was.
pub fn unlock(opened: &Opened) -> Result<()> {
    let session = &opened.session;
    step("break the deploy folder's lock");
    let outcome = session
        .ssh
        .script(unlock_script(), std::slice::from_ref(&session.layout.dir))
        .limit(QUICK_STEP)
        .run(session.dry_run)?;
    let Some(o) = expect_success(&session.ssh, outcome, "breaking the lock", None)? else {
        return Ok(());
    };
    let (dir, host) = (&session.layout.dir, &session.host);
    match Unlocked::parse(&o.stdout) {
        Unlocked::Free => println!("the lock of {dir} on {host} was free: no one held it"),
        Unlocked::Left { holder } => println!(
            "the lock of {dir} on {host} was free; it still named {holder}, which ended \
             without clearing it: cleared"
        ),
        Unlocked::Broken {
            holder,
            stopped,
            moved,
        } => {
            println!("broke the lock of {dir} on {host}, held by {holder}");
            if let Some(pid) = stopped {
                println!("  stopped its holding shell on the host (pid {pid})");
            }
            if let Some(file) = moved {
                println!(
                    "  a process that is no deploy's still held it, so the lock moved to a \
                     fresh file (the old one is {file})"
                );
            }
            println!(
                "  (the command that held it loses its lock: it stops before changing anything \
                 more)"
            );
        }
    }
    Ok(())
}

/// `list`: the releases, newest first, each with its runs; then the leftovers.
pub fn list(opened: &mut Opened) -> Result<()> {
    let Some(report) = inspect(opened)? else {
        return Ok(());
    };
    let session = &opened.session;
    println!(
        "{} in {}: {} releases (newest first; * is current)",
        session.host,
        session.layout.dir,
        report.releases.len()
    );
    for release in report.releases_newest_first() {
        let mark = if report.current.as_deref() == Some(&release.name) {
            "*"
        } else {
            " "
        };
        println!("{mark} {}", release.name);
        describe(release, "    ");
        let runs: Vec<&Run> = report.runs_of(&release.name).collect();
        if runs.is_empty() {
            println!("    runs: none");
        }
        for run in runs {
            println!("    run {}", run_line(run));
        }
    }
    let orphans: Vec<&Run> = report
        .runs
        .iter()
        .filter(|r| report.release(&r.release).is_none())
        .collect();
    if !orphans.is_empty() {
        println!("runs of releases no longer on the host:");
        for run in orphans {
            println!("  {} run {}", run.release, run_line(run));
        }
    }
    if !report.leftovers.is_empty() {
        println!("left by failed uploads and replaced damaged releases (`clean` removes them):");
        for name in &report.leftovers {
            println!("  releases/{name}");
        }
    }
    if let Some(holder) = &report.locked_by {
        println!("lock: held by {holder}");
    }
    Ok(())
}

/// `rollback`: `current` back to the release it was deployed over, skipping any that
/// are gone or fail their checksums.
pub fn rollback(opened: &mut Opened) -> Result<()> {
    let Some(report) = inspect(opened)? else {
        return Ok(());
    };
    opened.check_lock()?;
    let session = &opened.session;
    let current = report.live(&session.host, &session.layout.dir)?;
    let mut passed = Vec::new();
    for candidate in report.rollback_candidates(&current) {
        if report.release(&candidate).is_none() {
            passed.push(format!("{candidate} (removed)"));
            continue;
        }
        step(&format!("verify {candidate}"));
        match session.check_release(&candidate)? {
            Check::Verified { files } => {
                eprintln!(
                    "releases/{candidate}: its {files} files match its SHA256SUMS and its name"
                );
                session.place(&candidate, false, "rolled-back")?;
                println!(
                    "rolled back {} from {current} to {candidate}{}",
                    session.host,
                    if passed.is_empty() {
                        String::new()
                    } else {
                        format!(" (passing over {})", passed.join(", "))
                    }
                );
                return Ok(());
            }
            Check::Damaged(why) => {
                eprintln!(
                    "releases/{candidate} is damaged, passed over:{}",
                    super::error::list(&why)
                );
                passed.push(format!("{candidate} (damaged)"));
            }
        }
    }
    Err(DeployError::NoRollback {
        host: session.host.clone(),
        current,
        found: if passed.is_empty() {
            "none in the deploy folder's history".to_string()
        } else {
            format!("only {}", passed.join(", "))
        },
    }
    .into())
}

/// `clean --keep N`: all but the N most recently used releases (`current` among them,
/// and any with a running job kept too), and every leftover folder, go.
pub fn clean(opened: &mut Opened, keep: usize) -> Result<()> {
    let Some(report) = inspect(opened)? else {
        return Ok(());
    };
    opened.check_lock()?;
    let session = &opened.session;
    let mut kept: Vec<&str> = Vec::new();
    if let Some(current) = report.current.as_deref() {
        kept.push(current);
    }
    let mut remove: Vec<String> = Vec::new();
    for release in report.releases_newest_first() {
        let running = report.runs_of(&release.name).any(|r| r.running);
        if kept.contains(&release.name.as_str()) {
            continue;
        }
        if kept.len() < keep {
            kept.push(&release.name);
        } else if running {
            // The job's records say it runs there: its release stays, whoever holds the
            // lock (a job's run holds none).
            kept.push(&release.name);
            let jobs: Vec<&str> = report
                .runs_of(&release.name)
                .filter(|r| r.running)
                .map(|r| r.run.as_str())
                .collect();
            println!(
                "keeping releases/{}: job {} runs on it",
                release.name,
                jobs.join(", ")
            );
        } else {
            remove.push(release.name.clone());
        }
    }
    remove.extend(report.leftovers.iter().cloned());
    if remove.is_empty() {
        println!(
            "nothing to remove in {} on {}: {} releases, keeping {keep}",
            session.layout.dir,
            session.host,
            report.releases.len()
        );
        return Ok(());
    }
    step("remove old releases and leftovers");
    let mut args = vec![session.layout.dir.clone()];
    args.extend(remove.iter().cloned());
    let outcome = session.ssh.script(&REMOVE, &args).run(session.dry_run)?;
    if let Some(o) = expect_success(&session.ssh, outcome, "removing releases", None)? {
        let mut total = 0;
        for line in o.stdout.lines() {
            let Some(rest) = line.strip_prefix("removed ") else {
                continue;
            };
            let (bytes, name) = rest.split_once(' ').unwrap_or(("0", rest));
            let bytes: u64 = bytes.parse().unwrap_or(0);
            total += bytes;
            println!("removed releases/{name} ({})", human_bytes(bytes));
        }
        println!("freed {} on {}", human_bytes(total), session.host);
    }
    println!(
        "kept {} in {} on {}: {}",
        kept.len(),
        session.layout.dir,
        session.host,
        kept.join(", ")
    );
    Ok(())
}

/// A release's program, revision and build time, as lines under `indent`.
fn describe(release: &Release, indent: &str) {
    let built = release
        .built_at()
        .map_or("at an unknown time".to_string(), |t| {
            format!("built {}", utc_time(t))
        });
    println!(
        "{indent}program {}, revision {}, {built}",
        release.program(),
        release.revision()
    );
}

/// One run, in a line: its id, when it started, how it went, its marks.
fn run_line(run: &Run) -> String {
    let started = run
        .started()
        .map(|t| format!(", started {}", utc_time(t)))
        .unwrap_or_default();
    let notes = run.notes();
    format!(
        "{}{started}: {}{}",
        run.run,
        run.outcome(),
        if notes.is_empty() {
            String::new()
        } else {
            format!(" ({notes})")
        }
    )
}
