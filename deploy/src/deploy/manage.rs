//! The subcommands that look after a host's releases: `status`, `list`, `rollback`,
//! `clean`. Each reads the deploy folder once ([`Session::inspect`]); the ones that
//! change it hold its lock.

use anyhow::Result;

use super::error::DeployError;
use super::remote::REMOVE;
use super::report::{Release, Report, Run};
use super::session::{Check, Session, expect_success, human_bytes, step};
use super::{Opened, utc_time};

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
    verified.map(drop)
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
        if kept.len() < keep || running {
            kept.push(&release.name);
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
