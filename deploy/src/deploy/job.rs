//! Jobs on the host: started detached from the connection ([`START`], supervised by
//! [`JOB`]), followed through their log ([`FOLLOW`]), stopped ([`STOP`]) and looked at
//! ([`STATE`]). A job's id is its run's name (`20261129T170512Z-4242`).
//!
//! A deploy or `run` starts the job under the deploy folder's lock, lets the lock go and
//! follows the job's log until the job ends; only then are its results fetched. A lost
//! connection leaves the job running: the deploy says so (looking over a new connection
//! when it can) and names the `attach` that picks it up again.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::error::{DeployError, JobFailure};
use super::record::{JobRef, State};
use super::remote::{FOLLOW, JOB, START, STATE, STOP};
use super::session::{
    JobPlan, JobRun, QUICK_STOP, Session, expect_success, interrupted, now_unix_s, step,
};
use super::ssh::{self, Outcome, Show, Stop};
use crate::bundle::contents::RUN_SH;
use crate::cmd;

/// How many of the job's last lines a failure shows.
const TAIL_LINES: usize = 15;

/// How long past its own limit a job is followed before it is given up from here.
const FOLLOW_GRACE: Duration = Duration::from_secs(15);

/// How long a Ctrl-C's stop gives the job to end on TERM before it is killed, in tenths
/// of a second.
const INTERRUPT_GRACE_TENTHS: u32 = 20;

/// How to follow a job and what to do at its end.
#[derive(Debug)]
pub struct Watch<'a> {
    /// How much of the log to show first: `+1` for all of it, else a number of lines.
    pub lines: &'a str,
    /// A Ctrl-C leaves the job running (`--keep-running-on-interrupt`) rather than
    /// stopping it.
    pub keep_running: bool,
    /// How long to follow at most (the job's own limit, and a grace), if known.
    pub limit: Option<Duration>,
    /// `<fetch-to>/<host>`: the results go to `<release>/<run>/` under it.
    pub results_root: &'a Path,
    /// What the job runs, for a failure's message.
    pub command: String,
}

impl Session {
    /// The log, pid file, exit file and cancel marker of `job` on the host.
    fn job_files(&self, job: &JobRef) -> [String; 4] {
        let l = &self.layout;
        [
            l.run_file(&job.release, &job.run, "log"),
            l.pidfile(&job.run),
            l.run_file(&job.release, &job.run, "exit"),
            l.cancel_marker(&job.run),
        ]
    }

    /// `cargo xtask deploy <action> <this host's options> <extra>`, as a user types it.
    pub fn command_line(&self, action: &str, extra: &[String]) -> String {
        let mut words = vec![action.to_string()];
        words.extend(self.again.iter().cloned());
        words.extend(extra.iter().cloned());
        format!("cargo xtask deploy {}", cmd::quote_words(&words))
    }

    /// Writes the run's record and starts `run.sh ARGS` of `release` detached (see
    /// [`START`]): the job this command's run names.
    pub fn start_job(&self, release: &str, job: &JobPlan<'_>, gpu_checks: bool) -> Result<JobRef> {
        step("start the job");
        let me = JobRef {
            release: release.to_string(),
            run: self.run.clone(),
        };
        let run_dir = self.layout.run_dir(release, &self.run);
        let [log, pidfile, exitfile, marker] = self.job_files(&me);
        let record = serde_json::json!({
            "run": self.run,
            "release": release,
            "command": job.command,
            "args": job.args,
            "gpu_checks": gpu_checks,
            "started_unix_s": now_unix_s(),
            "timeout_s": job.timeout.as_secs(),
            "by": self.by,
        });
        let mut args = vec![
            JOB.text.to_string(),
            pidfile,
            log.clone(),
            self.layout.run_file(release, &self.run, "json"),
            record.to_string(),
            job.timeout.as_secs().to_string(),
            self.path_prefix.clone(),
            exitfile,
            marker,
            "env".to_string(),
            format!("OUT={run_dir}"),
            "bash".to_string(),
            format!("{}/{RUN_SH}", self.layout.release_dir(release)),
        ];
        args.extend(job.args.iter().cloned());
        let outcome = self
            .ssh
            .script(&START, &args)
            .limit(super::session::QUICK_STEP)
            .run(self.dry_run)?;
        let disk = Some(ssh::Disk {
            host: &self.host,
            what: "the run",
            place: &run_dir,
        });
        if let Some(o) = expect_success(&self.ssh, outcome, "starting the job", disk)? {
            let group = o
                .stdout
                .lines()
                .find_map(|l| l.strip_prefix("started "))
                .and_then(|rest| rest.split(' ').next())
                .map(|g| format!(", process group {g}"))
                .unwrap_or_default();
            eprintln!(
                "job {} started on {} (detached{group}); its output goes to {log} there",
                self.run, self.host
            );
        }
        Ok(me)
    }

    /// What `deploy --detach` says once the job runs: the commands that follow, attach
    /// and cancel it.
    pub fn say_detached(&self, job: &JobRef, fetch_to: &[String]) {
        eprintln!(
            "\njob {} runs on {}, detached; its results stay there until fetched.\n\
             follow its log:   {}\n\
             attach to it:     {}\n  \
             (follows it, then fetches its results)\n\
             cancel it:        {}",
            job.run,
            self.host,
            self.command_line("logs", &["--follow".into(), job.run.clone()]),
            self.attach_line(job, fetch_to),
            self.command_line("cancel", std::slice::from_ref(&job.run)),
        );
    }

    fn attach_line(&self, job: &JobRef, fetch_to: &[String]) -> String {
        let mut extra = fetch_to.to_vec();
        extra.push(job.run.clone());
        self.command_line("attach", &extra)
    }

    /// How `job` stands, over the shared connection. `None` in a dry run.
    pub fn job_state(&self, job: &JobRef) -> Result<Option<State>> {
        let [_, pidfile, exitfile, _] = self.job_files(job);
        let outcome = self
            .ssh
            .script(&STATE, &[pidfile, exitfile])
            .limit(super::session::QUICK_STEP)
            .run(self.dry_run)?;
        let o = expect_success(&self.ssh, outcome, "reading the job's state", None)?;
        Ok(o.map(|o| State::parse(&o.stdout)))
    }

    /// How `job` stands, over a connection of its own (the shared one is gone), in
    /// words for a lost connection's message.
    fn job_state_anew(&self, job: &JobRef) -> String {
        let mut ssh = self.ssh.clone();
        ssh.control = None;
        let [_, pidfile, exitfile, _] = self.job_files(job);
        let limit = Duration::from_secs(ssh.connect_timeout_s.into()) + QUICK_STOP;
        let outcome = ssh
            .script(&STATE, &[pidfile, exitfile])
            .limit(limit)
            .run(false);
        let found = outcome.and_then(|o| expect_success(&ssh, o, "reading the job's state", None));
        match found {
            Ok(Some(o)) => match State::parse(&o.stdout) {
                State::Running => {
                    "it is still running there (looked at over a new connection)".into()
                }
                State::Ended(e) => format!(
                    "it has ended there since ({}, looked at over a new connection); its results \
                     are on the host",
                    e.describe_with_time()
                ),
                gone @ State::Gone => format!("it {}", gone.describe()),
            },
            Ok(None) => "it was running when the connection was lost".into(),
            Err(e) => format!(
                "it was running when the connection was lost (a new connection to look failed \
                 too: {e:#})"
            ),
        }
    }

    /// Stops `job` on the host, TERM then KILL after `grace_tenths` tenths of a second,
    /// marking it cancelled; [`STOP`]'s lines. `None` in a dry run.
    pub fn stop_job(&self, job: &JobRef, grace_tenths: u32) -> Result<Option<Vec<String>>> {
        let [_, pidfile, _, marker] = self.job_files(job);
        let limit = QUICK_STOP + Duration::from_millis(100 * u64::from(grace_tenths));
        let outcome = self
            .ssh
            .script(&STOP, &[pidfile, grace_tenths.to_string(), marker])
            .limit(limit)
            .uninterruptible()
            .run(self.dry_run)?;
        let o = expect_success(&self.ssh, outcome, "stopping the job", None)?;
        Ok(o.map(|o| o.stdout.lines().map(String::from).collect()))
    }

    /// Ctrl-C's stop of a followed job: what goes wrong is only reported, the deploy is
    /// stopping anyway.
    fn stop_on_interrupt(&self, job: &JobRef) {
        eprintln!("\nstopping job {} on {}", job.run, self.host);
        if let Err(e) = self.stop_job(job, INTERRUPT_GRACE_TENTHS) {
            eprintln!("warning: could not stop it on {}: {e:#}", self.host);
        }
    }

    /// The job's log: its last `lines` (`+1`: all), then, if `follow`, what comes until
    /// it ends. `on_stop` runs when a signal stops the following.
    fn show_log(
        &self,
        job: &JobRef,
        lines: &str,
        follow: bool,
        limit: Option<Duration>,
        on_stop: &dyn Fn(),
    ) -> Result<Option<Outcome>> {
        let [log, pidfile, exitfile, _] = self.job_files(job);
        let args = [
            log,
            pidfile,
            exitfile,
            lines.to_string(),
            if follow { "1" } else { "0" }.to_string(),
        ];
        let mut remote = self
            .ssh
            .script(&FOLLOW, &args)
            .show(Show::Stream)
            .on_stop(on_stop);
        if let Some(limit) = limit {
            remote = remote.limit(limit);
        }
        remote.run(self.dry_run)
    }

    /// `logs`: the job's last `lines` lines, and with `follow` what comes until it ends
    /// (a Ctrl-C stops the following, not the job).
    pub fn logs(&self, job: &JobRef, lines: &str, follow: bool) -> Result<()> {
        let limit = (!follow).then_some(super::session::QUICK_STEP);
        let outcome = self.show_log(job, lines, follow, limit, &|| {})?;
        let Some(o) = outcome else { return Ok(()) };
        if let Some(Stop::Interrupted(_)) = o.stop {
            eprintln!(
                "\nstopped following; job {} goes on on {}",
                job.run, self.host
            );
            return Ok(());
        }
        if o.status.code() == Some(255) {
            return Err(self
                .connection_lost(job, &o.stderr, &[], "following the log of job")
                .into());
        }
        expect_success(&self.ssh, Some(o), "reading the job's log", None)?;
        if let Some(state) = self.job_state(job)? {
            eprintln!("\njob {} on {}: {}", job.run, self.host, state.describe());
        }
        Ok(())
    }

    /// Follows `job` until it ends, then fetches its results: what a deploy, `run` and
    /// `attach` do. A failing job is returned, not raised, so that its results are still
    /// fetched; a lost connection or a signal is raised, the job left running (or, on a
    /// signal and unless `watch.keep_running`, stopped).
    pub fn see_through(
        &self,
        job: &JobRef,
        watch: &Watch<'_>,
        fetch_to: &[String],
    ) -> Result<JobRun> {
        step("follow the job");
        let results = watch.results_root.join(&job.release).join(&job.run);
        let keep = watch.keep_running;
        let stop = || {
            if !keep {
                self.stop_on_interrupt(job);
            }
        };
        let outcome = self.show_log(job, watch.lines, true, watch.limit, &stop)?;
        let Some(o) = outcome else {
            self.fetch_job(&job.release, &job.run, &results)?;
            return Ok(JobRun {
                results,
                failed: None,
            });
        };
        match o.stop {
            Some(Stop::Interrupted(signal)) if keep => {
                return Err(DeployError::JobLeftRunning {
                    signal,
                    host: self.host.clone(),
                    job: job.run.clone(),
                    attach: self.attach_line(job, fetch_to),
                    cancel: self.command_line("cancel", std::slice::from_ref(&job.run)),
                }
                .into());
            }
            Some(Stop::Interrupted(signal)) => {
                return Err(interrupted(signal, "the job", &self.host).into());
            }
            Some(Stop::TimedOut(limit)) => {
                return Err(DeployError::JobOverdue {
                    host: self.host.clone(),
                    job: job.run.clone(),
                    seconds: limit.as_secs(),
                    state: self.job_state_anew(job),
                    attach: self.attach_line(job, fetch_to),
                }
                .into());
            }
            None => {}
        }
        if o.status.code() == Some(255) {
            return Err(self
                .connection_lost(job, &o.stderr, fetch_to, "following the job")
                .into());
        }
        let o = match expect_success(&self.ssh, Some(o), "following the job's log", None) {
            Ok(o) => o.expect("a run that ran"),
            Err(e) => return Err(e),
        };
        let state = match self.job_state(job) {
            Ok(state) => state.expect("not a dry run"),
            Err(e) if is_connection(&e) => {
                return Err(self
                    .connection_lost(
                        job,
                        &format!("{e:#}"),
                        fetch_to,
                        "looking at the end of job",
                    )
                    .into());
            }
            Err(e) => return Err(e),
        };
        let failed = match &state {
            State::Ended(e) if e.success() => {
                eprintln!(
                    "job {} finished on {}: {}",
                    job.run,
                    self.host,
                    e.describe_with_time()
                );
                None
            }
            State::Running => {
                // The log's follower ended before the job: it is not over.
                return Err(self
                    .connection_lost(
                        job,
                        "the log's follower ended early",
                        fetch_to,
                        "following the job",
                    )
                    .into());
            }
            ended => Some(DeployError::JobFailed(Box::new(JobFailure {
                host: self.host.clone(),
                job: job.run.clone(),
                command: watch.command.clone(),
                status: match ended {
                    State::Ended(e) => e.describe_with_time(),
                    gone => gone.describe(),
                },
                tail: o.tail(TAIL_LINES),
                results: results.clone(),
            }))),
        };
        let fetched = self.fetch_job(&job.release, &job.run, &results);
        if let Some(failed) = failed {
            // The job's failure is the news; a failed fetch only adds to it.
            if let Err(e) = fetched {
                eprintln!("warning: {e:#}");
            }
            return Ok(JobRun {
                results,
                failed: Some(failed),
            });
        }
        fetched?;
        Ok(JobRun {
            results,
            failed: None,
        })
    }

    /// The error for a connection lost while following `job` (`what` it was doing), with
    /// how the job stands as far as can be told and the command that reattaches.
    fn connection_lost(
        &self,
        job: &JobRef,
        stderr: &str,
        fetch_to: &[String],
        what: &'static str,
    ) -> DeployError {
        let found = stderr
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .map_or(
                "ssh ending with status 255, its own failure".to_string(),
                |l| format!("ssh saying `{l}`"),
            );
        DeployError::ConnectionLost {
            host: self.host.clone(),
            what: format!("{what} {}", job.run),
            found,
            state: self.job_state_anew(job),
            attach: self.attach_line(job, fetch_to),
        }
    }

    /// `attach` and `cancel` for a job that is not this command's: waits (a few
    /// seconds) for its exit to be recorded after a stop.
    pub fn await_end(&self, job: &JobRef, within: Duration) -> Result<Option<State>> {
        let until = Instant::now() + within;
        loop {
            let state = self.job_state(job)?;
            match state {
                Some(State::Running) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                other => return Ok(other),
            }
        }
    }
}

/// Whether `e` is a failure to reach the host (as opposed to a step's own failure).
fn is_connection(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<DeployError>(),
        Some(DeployError::Unreachable { .. })
    ) || matches!(
        e.downcast_ref::<DeployError>(),
        Some(DeployError::Step { status, .. }) if status == "exit status 255"
    )
}

/// The limit to follow a job started `started` seconds ago (by its record) with a
/// limit of `timeout_s` on the host.
pub fn follow_limit(started: Option<u64>, timeout_s: Option<u64>) -> Option<Duration> {
    let timeout_s = timeout_s?;
    let elapsed = started.map_or(0, |s| now_unix_s().saturating_sub(s));
    Some(Duration::from_secs(timeout_s.saturating_sub(elapsed)) + FOLLOW_GRACE)
}

/// The limit to follow a job this command just started.
pub fn fresh_limit(timeout: Duration) -> Duration {
    timeout + FOLLOW_GRACE
}
