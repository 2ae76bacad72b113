//! `cargo xtask deploy`: ships a bundle to a GPU host over ssh, checks it there, runs it
//! and brings the results back; and its subcommands, which look after the releases and
//! jobs a host holds (`status`, `list`, `rollback`, `clean`, `run`, `stage`, `logs`,
//! `attach`, `cancel`, `unlock`).
//!
//! A deploy's steps, each shown as one line (`== copy the bundle`) and, with `--verbose`,
//! with the ssh and rsync commands that make it up echoed before they run (`--dry-run`
//! echoes them and runs none):
//!
//! 1. open one ssh connection that every later command shares, and take the deploy
//!    folder's lock (`flock` on the host): a wrong host or key shows before any build;
//! 2. bundle the job (`cargo xtask bundle <example>`) under its folder's lock, or take
//!    `--bundle DIR` as it is;
//! 3. if the release (named by its content, see [`remote`]) is on the host already,
//!    verify it there and copy nothing; else rsync the bundle into the release's upload
//!    folder (resuming what an interrupted upload of it left there, and removing what
//!    failed uploads of other releases left) and compare the host's hashes of it with
//!    the bundle's `SHA256SUMS`;
//! 4. run the bundle's `preflight.sh` there (GPU, compute capability, driver, libraries,
//!    free disk), under `--preflight-timeout`;
//! 5. only then give the upload its release's name and switch `current` to it;
//! 6. start `run.sh ARGS` detached in a fresh `runs/<release>/<run>/` (see [`job`]), with
//!    a record of the run, its log and, when it ends, its exit file beside it; let the
//!    lock go (it covers the folder's changes and the job's start, not its run);
//! 7. follow the job's log until it ends (`--detach`: return at once), then rsync its
//!    folder back into `target/deploy/<host>/<release>/<run>/`.
//!
//! Ctrl-C (or SIGTERM) stops the step that runs, the job on the host included (unless
//! `--keep-running-on-interrupt`), closes the connection and removes the local
//! temporaries; the exit status is then the shells' (130, or 143 for SIGTERM). A lost
//! connection leaves the job running and names the `attach` that picks it up. Each
//! failure is a [`DeployError`] that names what was expected and what was found.
//!
//! `--remote-path-prefix` is a test hook: it puts a folder first on the remote PATH for
//! the preflight and the job, which is how the tests (`tests/deploy.rs`) put their
//! stand-in `nvidia-smi` in front of the host's (which on the test machine is none).

mod error;
mod job;
mod lock;
mod manage;
mod record;
pub mod remote;
mod report;
mod session;
mod ssh;
mod target;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

pub use self::error::DeployError;
use self::lock::RemoteLock;
use self::remote::Layout;
use self::session::{Check, Connection, JobPlan, PreflightPlan, Session, step};
use self::ssh::Ssh;
pub use self::target::Target;
use crate::bundle::Bundle;
use crate::bundle::build_info::{self, Revision};
use crate::bundle::contents::{BUILD_INFO, GPU_TESTS_PROGRAM, PREFLIGHT_SH, RUN_SH};
use crate::bundle::manifest::{self, Manifest};
use crate::bundle::preflight_sh::DEFAULT_MIN_FREE_MIB;
use crate::cmd;
use crate::cmd::Workspace;
use crate::lock::{FolderLock, Wait};
use crate::project::Project;

/// Bundles a program (the project's job unless `--program` says otherwise), copies it to the host
/// over ssh, verifies its checksums there, runs the preflight, switches `current` to
/// it, runs it and fetches its results.
///
/// A release is named by its program, the git revision and the hash of its content
/// (`dqn-3e675b0-dirty-1f2e3d4c5b6a`). A release already on the host is verified and
/// reused, not copied: deploying what is live again copies nothing. Otherwise only the
/// files that differ from the live release travel; the rest are copied on the host.
/// Another deploy to the same folder waits for this one's changes to it (or, with
/// --no-wait, fails), not for its job, which runs detached on the host. Ctrl-C stops the
/// job on the host too (unless --keep-running-on-interrupt), closes the connection and
/// removes the local temporaries. The subcommands look after the releases and jobs a
/// host holds; with no subcommand, `cargo xtask deploy --host H` deploys.
#[derive(Debug, Args)]
pub struct Deploy {
    /// What to do on the host; a deploy when none.
    #[command(subcommand)]
    pub action: Option<Action>,
    /// Show every ssh and rsync command before it runs, and the files rsync moves (by
    /// default, one line per step).
    #[arg(long, global = true)]
    pub verbose: bool,
    /// The deploy's options (unused with a subcommand, which has its own).
    #[command(flatten)]
    pub ship: Ship,
}

/// A deploy's options: `cargo xtask deploy --host H [OPTIONS] [-- ARGS]`.
#[derive(Debug, Args)]
pub struct Ship {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub bundle: BundleArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
    #[command(flatten)]
    pub job: JobArgs,
}

/// What to do on the host other than a deploy.
#[derive(Debug, Subcommand)]
pub enum Action {
    /// Shows what `current` is (program, revision, when it was built and made current),
    /// verifies it, and shows its last run.
    Status(HostOnly),
    /// Lists the releases (newest first) with their runs, and the folders failed uploads
    /// left.
    List(HostOnly),
    /// Switches `current` back to the release it was deployed over (or the one before,
    /// skipping any that fail their checksums).
    Rollback(HostOnly),
    /// Removes all but the newest releases (`current` and releases with a running job
    /// are always kept) and the folders failed uploads left, saying how much each took.
    /// Runs' results are kept.
    Clean(Clean),
    /// Runs the job of `current` again, without uploading: verifies it, runs the
    /// preflight, runs it and fetches its results.
    Run(RunAgain),
    /// Uploads and checks a bundle (checksums, preflight) without switching `current`; a
    /// later deploy of the same bundle switches to it without copying.
    Stage(Stage),
    /// Shows a job's log: its last lines, and with --follow what comes until it ends (a
    /// Ctrl-C stops the following, not the job).
    Logs(Logs),
    /// Reattaches to a job (after a lost connection, or a --detach): follows its log
    /// until it ends, then fetches its results. Ctrl-C stops the job, as during a deploy,
    /// unless --keep-running-on-interrupt.
    Attach(Attach),
    /// Stops a running job: SIGTERM to its process group, SIGKILL after --grace seconds
    /// if it has not ended. Its exit is recorded as cancelled; its results stay on the
    /// host.
    Cancel(Cancel),
    /// Breaks the deploy folder's lock by hand: stops the shell holding it and says whose
    /// it was (or that no one held it).
    Unlock(HostOnly),
}

/// The host, the deploy folder there and how to reach it: what every command takes.
#[derive(Debug, Args)]
pub struct HostArgs {
    /// The GPU host: `user@host`, `user@host:port`, `user@[ipv6]:port`, or an alias of
    /// the ssh config.
    // An `Option` only so that the deploy's own copy of these options may be absent
    // when a subcommand is given; clap requires it whenever it is read.
    #[arg(long, value_name = "USER@HOST[:PORT]", required = true)]
    pub host: Option<Target>,
    /// The deploy folder on the host; a relative path (or `~/PATH`) is taken from the
    /// remote home.
    // Its default, the project's deploy folder, is set by `Project::set_defaults`.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_DIR, value_parser = remote_dir)]
    pub dir: String,
    /// The ssh private key to log in with (default: ssh's own choice, ~/.ssh and the agent).
    #[arg(long, value_name = "PATH")]
    pub key: Option<PathBuf>,
    /// The known-hosts file to record and check the host's key in (default: ssh's).
    #[arg(long, value_name = "PATH")]
    pub known_hosts: Option<PathBuf>,
    /// The ssh config file to read instead of ssh's own (`ssh -F`), for host aliases.
    #[arg(long, value_name = "PATH")]
    pub ssh_config: Option<PathBuf>,
    /// Seconds to wait for the host to answer (ssh's `ConnectTimeout`; keepalives then
    /// give up on a host that stops answering after about a minute).
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = seconds)]
    pub connect_timeout: u32,
    /// Fail at once when another deploy holds the deploy folder (or another command the
    /// bundle folder), rather than wait for it.
    #[arg(long)]
    pub no_wait: bool,
    /// Seconds to wait for another deploy to release the deploy folder (or the bundle
    /// folder) before failing.
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = seconds)]
    pub lock_timeout: u32,
    /// Test hook: a folder on the host put first on PATH for the preflight and the job
    /// (the tests put a stand-in nvidia-smi there).
    #[arg(long, value_name = "DIR")]
    pub remote_path_prefix: Option<String>,
    /// Print every command without running any, changing nothing here or there.
    #[arg(long)]
    pub dry_run: bool,
}

/// Which bundle to ship.
#[derive(Debug, Args)]
pub struct BundleArgs {
    /// The program to bundle and run, one of the project's (default: its job).
    #[arg(long = "program", visible_alias = "example", value_name = "NAME", conflicts_with_all = ["bundle", "gpu_tests"])]
    pub example: Option<String>,
    /// Bundle and run the project's GPU tests (`cargo xtask bundle --gpu-tests`) instead.
    #[arg(long, conflicts_with = "bundle")]
    pub gpu_tests: bool,
    /// Deploy this bundle folder as it is, without building.
    #[arg(long, value_name = "DIR")]
    pub bundle: Option<PathBuf>,
    /// Send the bundle at most this fast, in KiB/s (rsync's `--bwlimit`), to leave room
    /// on a shared link.
    #[arg(long, value_name = "KIB_PER_S", value_parser = clap::value_parser!(u32).range(1..))]
    pub bwlimit: Option<u32>,
}

/// How the preflight runs.
#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// Free space the preflight requires in the deploy folder, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MIN_FREE_MIB)]
    pub min_free_mib: u64,
    /// Seconds the preflight may take on the host before it is stopped (a hung
    /// `nvidia-smi` is a common sign of a sick GPU host).
    #[arg(long, value_name = "SECONDS", default_value_t = 120, value_parser = seconds)]
    pub preflight_timeout: u32,
    /// For testing on a host without a GPU: the preflight skips its GPU, driver and
    /// library checks (the free-disk check stays). The run's record says so.
    #[arg(long)]
    pub no_gpu_checks: bool,
}

/// Where results go unless `--fetch-to` says otherwise.
const DEFAULT_FETCH_TO: &str = "target/deploy";

/// The deploy folder unless `--dir` says otherwise; a project sets its own
/// (`Project::set_defaults`).
const DEFAULT_DIR: &str = "stepgraph";

/// How the job runs and where its results go.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// Seconds the job may run on the host before it is stopped, with everything it
    /// started.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600, value_parser = seconds)]
    pub job_timeout: u32,
    /// Where results are fetched to, as `<DIR>/<host>/<release>/<run>/` (relative paths are
    /// taken from the workspace root).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_FETCH_TO)]
    pub fetch_to: PathBuf,
    /// Start the job and return at once, printing the commands that follow its log,
    /// attach to it (and fetch its results) and cancel it.
    #[arg(long)]
    pub detach: bool,
    /// A Ctrl-C (or SIGTERM) stops following the job and leaves it running on the host,
    /// rather than stopping it; the commands to reattach and cancel are printed.
    #[arg(long, conflicts_with = "detach")]
    pub keep_running_on_interrupt: bool,
    /// Passed to the job (`cargo xtask deploy --host h100 -- --quick`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Which job: its id (the run's name), or by default the newest running job (else the
/// newest job).
#[derive(Debug, Args)]
pub struct JobId {
    #[arg(value_name = "JOB")]
    pub job: Option<String>,
}

/// `logs`.
#[derive(Debug, Args)]
pub struct Logs {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub id: JobId,
    /// Keep showing what the job writes until it ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// How many of the log's last lines to show first.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub lines: u32,
}

/// `attach`.
#[derive(Debug, Args)]
pub struct Attach {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub id: JobId,
    /// How many of the log's last lines to show first.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub lines: u32,
    /// A Ctrl-C (or SIGTERM) stops following and leaves the job running, rather than
    /// stopping it.
    #[arg(long)]
    pub keep_running_on_interrupt: bool,
    /// Where results are fetched to, as `<DIR>/<host>/<release>/<run>/` (relative paths are
    /// taken from the workspace root).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_FETCH_TO)]
    pub fetch_to: PathBuf,
}

/// `cancel`.
#[derive(Debug, Args)]
pub struct Cancel {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub id: JobId,
    /// Seconds the job is given to end after SIGTERM before it is sent SIGKILL.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = seconds)]
    pub grace: u32,
}

/// `status`, `list`, `rollback`, `unlock`: the host alone.
#[derive(Debug, Args)]
pub struct HostOnly {
    #[command(flatten)]
    pub host: HostArgs,
}

/// `clean`.
#[derive(Debug, Args)]
pub struct Clean {
    #[command(flatten)]
    pub host: HostArgs,
    /// How many releases to keep, `current` among them (at least 1).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub keep: u32,
}

/// `run`.
#[derive(Debug, Args)]
pub struct RunAgain {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
    #[command(flatten)]
    pub job: JobArgs,
}

/// `stage`.
#[derive(Debug, Args)]
pub struct Stage {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub bundle: BundleArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
}

impl Deploy {
    /// Runs the command for `project`, whose workspace is `ws`.
    pub fn run(self, project: &Project, ws: &Workspace) -> Result<()> {
        let host = self.host_args();
        ssh::set_verbose(self.verbose || host.dry_run);
        let dir = host.dir.clone();
        self.act(project, ws)
            .map_err(|e| with_home_hint(e, &dir, std::env::var("HOME").ok()))
    }

    fn host_args(&self) -> &HostArgs {
        match &self.action {
            None => &self.ship.host,
            Some(Action::Stage(s)) => &s.host,
            Some(Action::Run(r)) => &r.host,
            Some(Action::Status(h) | Action::List(h) | Action::Rollback(h) | Action::Unlock(h)) => {
                &h.host
            }
            Some(Action::Clean(c)) => &c.host,
            Some(Action::Logs(l)) => &l.host,
            Some(Action::Attach(a)) => &a.host,
            Some(Action::Cancel(c)) => &c.host,
        }
    }

    fn act(self, project: &Project, ws: &Workspace) -> Result<()> {
        match self.action {
            None => {
                let s = &self.ship;
                ship(&s.host, &s.bundle, &s.preflight, Some(&s.job), project, ws)
            }
            Some(Action::Stage(s)) => ship(&s.host, &s.bundle, &s.preflight, None, project, ws),
            Some(Action::Run(r)) => run_again(&r, ws),
            Some(Action::Status(h)) => manage::status(&mut open(&h.host, false)?),
            Some(Action::List(h)) => manage::list(&mut open(&h.host, false)?),
            Some(Action::Rollback(h)) => manage::rollback(&mut open(&h.host, true)?),
            Some(Action::Clean(c)) => manage::clean(&mut open(&c.host, true)?, c.keep as usize),
            Some(Action::Logs(l)) => manage::logs(&open(&l.host, false)?, &l),
            Some(Action::Attach(a)) => attach(&a, ws),
            Some(Action::Cancel(c)) => manage::cancel(&open(&c.host, false)?, &c),
            Some(Action::Unlock(h)) => manage::unlock(&open(&h.host, false)?),
        }
    }
}

impl HostArgs {
    fn target(&self) -> &Target {
        self.host.as_ref().expect("clap requires --host")
    }

    fn wait(&self) -> Wait {
        if self.no_wait {
            Wait::No
        } else {
            Wait::Upto(Duration::from_secs(self.lock_timeout.into()))
        }
    }

    /// The options that reach the same deploy folder again, for the commands a message
    /// names: `--host`, `--dir` (always: its default is the project's, which these
    /// arguments do not know), and those of `--key`, `--known-hosts`,
    /// `--ssh-config` and `--connect-timeout` that were given.
    fn again(&self) -> Vec<String> {
        let mut words = vec!["--host".to_string(), self.target().to_string()];
        words.extend(["--dir".into(), self.dir.clone()]);
        let paths = [
            ("--key", &self.key),
            ("--known-hosts", &self.known_hosts),
            ("--ssh-config", &self.ssh_config),
        ];
        for (flag, path) in paths {
            if let Some(p) = path {
                words.extend([flag.to_string(), p.display().to_string()]);
            }
        }
        if self.connect_timeout != 10 {
            words.extend(["--connect-timeout".into(), self.connect_timeout.to_string()]);
        }
        words
    }

    /// What can be checked before building or connecting: the folder name, the key, the
    /// tools.
    fn check_inputs(&self) -> Result<()> {
        if let Some(key) = &self.key
            && !key.is_file()
        {
            let found = match fs::metadata(key) {
                Ok(_) => "something that is not a file".to_string(),
                Err(e) => e.to_string().to_lowercase(),
            };
            return Err(DeployError::MissingKey {
                path: key.clone(),
                found,
            }
            .into());
        }
        if !self.dry_run {
            require_tool("ssh", "openssh-client", "reach the host")?;
            require_tool("rsync", "rsync", "copy the bundle and the results")?;
        }
        Ok(())
    }
}

/// A host reached: the shared connection, the session's steps and, for a command that
/// changes the folder, its lock. The lock is dropped first: its session rides on the
/// connection.
pub struct Opened {
    pub lock: Option<RemoteLock>,
    pub session: Session,
    _connection: Connection,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("session", &self.session)
            .finish()
    }
}

impl Opened {
    /// Lets the deploy folder's lock go: what follows (a job's run) needs no lock.
    fn release_lock(&mut self) {
        if self.lock.take().is_some() {
            ssh::echo("(the deploy folder's lock is let go)");
        }
    }

    /// Fails when the lock's session went away (the connection dropped): what the lock
    /// guarded can no longer be trusted to be this command's alone.
    fn check_lock(&mut self) -> Result<()> {
        let lost = self.lock.as_mut().is_some_and(|lock| !lock.held());
        if lost {
            return Err(DeployError::LockLost {
                host: self.session.host.clone(),
                dir: self.session.layout.dir.clone(),
            }
            .into());
        }
        Ok(())
    }
}

/// Checks the inputs, connects (the host first: a wrong host or key shows in seconds,
/// not after a build) and, if `lock`, takes the deploy folder's lock.
fn open(args: &HostArgs, lock: bool) -> Result<Opened> {
    args.check_inputs()?;
    crate::interrupt::install()?;
    let ssh = Ssh {
        target: args.target().clone(),
        key: args.key.clone(),
        known_hosts: args.known_hosts.clone(),
        connect_timeout_s: args.connect_timeout,
        control: Some(session::control_dir().join("ssh")),
        config: args.ssh_config.clone(),
        resolved: None,
    };
    let mut ssh = ssh;
    step("connect");
    ssh.resolve();
    let connection = Connection::open(&ssh, args.dry_run)?;
    let now = SystemTime::now();
    let run = run_id(now);
    let by = format!("{}, pid {}", crate::lock::who(), std::process::id());
    let holder = format!(
        "{by}, since {}: cargo xtask deploy, run {run}",
        utc_time(now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
    );
    let session = Session {
        ssh,
        host: args.target().to_string(),
        layout: Layout::new(&args.dir),
        run,
        path_prefix: args.remote_path_prefix.clone().unwrap_or_default(),
        by,
        again: args.again(),
        dry_run: args.dry_run,
    };
    let lock = if lock {
        step("lock the deploy folder");
        RemoteLock::take(
            &session.ssh,
            &session.layout.dir,
            &holder,
            args.wait(),
            args.dry_run,
        )?
    } else {
        None
    };
    Ok(Opened {
        lock,
        session,
        _connection: connection,
    })
}

impl PreflightArgs {
    fn plan(&self) -> PreflightPlan {
        PreflightPlan {
            min_free_mib: self.min_free_mib,
            timeout: Duration::from_secs(self.preflight_timeout.into()),
            gpu_checks: !self.no_gpu_checks,
        }
    }
}

impl JobArgs {
    fn plan<'a>(&'a self, ws: &Workspace, host: &Target, command: &'static str) -> JobPlan<'a> {
        JobPlan {
            args: &self.args,
            timeout: Duration::from_secs(self.job_timeout.into()),
            results_root: ws.root.join(&self.fetch_to).join(host.label()),
            command,
            detach: self.detach,
            keep_running: self.keep_running_on_interrupt,
            fetch_to: fetch_to_words(&self.fetch_to),
        }
    }
}

/// `--fetch-to DIR` for the `attach` a message names, when DIR is not the default.
fn fetch_to_words(dir: &Path) -> Vec<String> {
    if dir == Path::new(DEFAULT_FETCH_TO) {
        Vec::new()
    } else {
        vec!["--fetch-to".into(), dir.display().to_string()]
    }
}

/// Starts the job of `release` (under the lock, so that `clean` sees it running), lets
/// the lock go and, unless `--detach`, follows it to its end and fetches its results.
/// `None` when it was detached.
fn launch(
    opened: &mut Opened,
    release: &str,
    plan: &JobPlan<'_>,
    gpu_checks: bool,
) -> Result<Option<session::JobRun>> {
    opened.check_lock()?;
    let job = opened.session.start_job(release, plan, gpu_checks)?;
    opened.release_lock();
    let session = &opened.session;
    if plan.detach {
        if !session.dry_run {
            session.say_detached(&job, &plan.fetch_to);
        }
        return Ok(None);
    }
    let watch = job::Watch {
        lines: "+1",
        keep_running: plan.keep_running,
        limit: Some(job::fresh_limit(plan.timeout)),
        results_root: &plan.results_root,
        command: job_command(session, release, plan.args),
    };
    session.see_through(&job, &watch, &plan.fetch_to).map(Some)
}

/// What a job of `release` runs, as a failure names it.
fn job_command(session: &Session, release: &str, args: &[String]) -> String {
    let mut words = vec![
        "bash".to_string(),
        format!("{}/{RUN_SH}", session.layout.release_dir(release)),
    ];
    words.extend(args.iter().cloned());
    cmd::quote_words(&words)
}

/// `attach`: follows a job to its end (or finds it ended) and fetches its results.
fn attach(args: &Attach, ws: &Workspace) -> Result<()> {
    let opened = open(&args.host, false)?;
    let session = &opened.session;
    step("find the job");
    let Some(report) = session.inspect()? else {
        eprintln!(
            "
dry run: nothing was run, here or on {}",
            session.host
        );
        return Ok(());
    };
    let run = manage::pick_job(&report, args.id.job.as_deref(), session, false)?;
    let job = record::JobRef {
        release: run.release.clone(),
        run: run.run.clone(),
    };
    eprintln!(
        "job {} of {} on {}: {}",
        job.run,
        job.release,
        session.host,
        run.outcome()
    );
    let args_of: Vec<String> = run.record["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let results_root = ws
        .root
        .join(&args.fetch_to)
        .join(args.host.target().label());
    let lines = args.lines.to_string();
    let watch = job::Watch {
        lines: &lines,
        keep_running: args.keep_running_on_interrupt,
        limit: job::follow_limit(run.started(), run.record["timeout_s"].as_u64()),
        results_root: &results_root,
        command: job_command(session, &job.release, &args_of),
    };
    let ran = session.see_through(&job, &watch, &fetch_to_words(&args.fetch_to))?;
    if let Some(failed) = ran.failed {
        return Err(failed.into());
    }
    eprintln!(
        "
job {} of {} on {} finished; results in {}",
        job.run,
        job.release,
        session.host,
        ran.results.display()
    );
    Ok(())
}

/// A deploy (`job`: then the job runs) or a stage (`job` is `None`: `current` stays).
fn ship(
    host: &HostArgs,
    bundle_args: &BundleArgs,
    preflight: &PreflightArgs,
    job: Option<&JobArgs>,
    project: &Project,
    ws: &Workspace,
) -> Result<()> {
    let dry_run = host.dry_run;
    let mut opened = open(host, true)?;
    let (bundle, bundle_lock, built) = bundle_args.folder(project, ws, host.wait(), dry_run)?;
    // A dry run builds nothing: the folder holds the last bundle built, not this tree's,
    // so its name and hashes are not this deploy's. The name is the tree's, its hash
    // left open.
    let (release, expected) = if dry_run && built {
        let tree = Revision::of(&ws.root);
        let release = build_info::release_name(&bundle_args.program(project), &tree, None);
        (release, None)
    } else {
        (release_of(&bundle)?, Some(expected_hashes(&bundle)?))
    };
    let session = &opened.session;
    eprintln!(
        "deploy: {} (release {release}) to {}, folder {}",
        bundle.display(),
        session.host,
        session.layout.dir
    );

    let state = session.prepare(&release)?;
    let live = state.current.as_deref() == Some(release.as_str());
    let mut upload = true;
    if state.present {
        step("verify the release already on the host");
        match session.check_release(&release)? {
            Check::Verified { files } => {
                upload = false;
                let already = if live { "live" } else { "on the host" };
                eprintln!(
                    "releases/{release} is already {already}, and its {files} files match its \
                     {} and its name: nothing to copy",
                    manifest::FILE
                );
            }
            Check::Damaged(why) => eprintln!(
                "warning: releases/{release} on {} is damaged, so it is uploaded again \
                 (the damaged copy goes to releases/{}):{}",
                session.host,
                Layout::aside(&release, &session.run),
                error::list(&why)
            ),
        }
    }
    if upload {
        session.copy(&bundle, &release, &state, bundle_args.bwlimit)?;
        session.verify(&release, expected.as_ref())?;
    }
    // What is on the host now is checked; the bundle here may be rebuilt.
    drop(bundle_lock);
    let from = if upload {
        session.upload_dir(&release)
    } else {
        session.layout.release_dir(&release)
    };
    session.preflight(&from, preflight.plan())?;
    opened.check_lock()?;
    let session = &opened.session;

    let Some(job) = job else {
        if upload {
            session.place(&release, true, "staged")?;
        }
        if !dry_run {
            eprintln!(
                "\nstaged {release} on {} (releases/{release}; `current` stays{}); deploying \
                 this bundle switches to it without copying",
                session.host,
                state
                    .current
                    .as_deref()
                    .map(|c| format!(" at {c}"))
                    .unwrap_or_default()
            );
        }
        return Ok(());
    };
    if upload || !live {
        session.place(&release, upload, "switched")?;
    }
    let plan = job.plan(ws, host.target(), "deploy");
    let ran = launch(&mut opened, &release, &plan, !preflight.no_gpu_checks)?;
    let session = &opened.session;
    let results = match ran {
        Some(session::JobRun {
            failed: Some(failed),
            ..
        }) => return Err(failed.into()),
        Some(ran) => Some(ran.results),
        None => None,
    };
    let unchecked = if preflight.no_gpu_checks {
        ", WITHOUT the preflight's GPU checks"
    } else {
        ""
    };
    if dry_run {
        eprintln!("\ndry run: nothing was run, here or on {}", session.host);
    } else if let Some(results) = results {
        eprintln!(
            "\ndeployed {release} to {} ({} -> releases/{release}){unchecked}; results in {}",
            session.host,
            session.layout.current(),
            results.display()
        );
    } else {
        eprintln!(
            "deployed {release} to {} ({} -> releases/{release}){unchecked}; its job runs \
             detached",
            session.host,
            session.layout.current(),
        );
    }
    Ok(())
}

/// `run`: the job of `current` again, once `current` is verified.
fn run_again(args: &RunAgain, ws: &Workspace) -> Result<()> {
    let mut opened = open(&args.host, true)?;
    let session = &opened.session;
    step("find `current`");
    let Some(report) = session.inspect()? else {
        eprintln!("\ndry run: nothing was run, here or on {}", session.host);
        return Ok(());
    };
    let release = report.live_present(&session.host, &session.layout.dir)?;
    eprintln!("current -> releases/{release}");
    manage::verify_current(session, &release)?;
    session.preflight(&session.layout.release_dir(&release), args.preflight.plan())?;
    let plan = args.job.plan(ws, args.host.target(), "run");
    let ran = launch(&mut opened, &release, &plan, !args.preflight.no_gpu_checks)?;
    let session = &opened.session;
    match ran {
        Some(ran) => {
            if let Some(failed) = ran.failed {
                return Err(failed.into());
            }
            eprintln!(
                "\nran {release} again on {}; results in {}",
                session.host,
                ran.results.display()
            );
        }
        None => eprintln!("started {release} again on {}, detached", session.host),
    }
    Ok(())
}

impl BundleArgs {
    /// The program whose bundle is deployed, for a release name a dry run makes up.
    fn program(&self, project: &Project) -> String {
        if self.gpu_tests {
            GPU_TESTS_PROGRAM.to_string()
        } else {
            self.example.as_deref().unwrap_or(project.job()).to_string()
        }
    }

    /// The bundle folder, `--bundle` as given or the example's (or the GPU tests')
    /// bundle built now (then `true`), and its lock, which keeps another command from
    /// rewriting it while it is copied (none in a dry run).
    fn folder(
        &self,
        project: &Project,
        ws: &Workspace,
        wait: Wait,
        dry_run: bool,
    ) -> Result<(PathBuf, Option<FolderLock>, bool)> {
        if let Some(dir) = &self.bundle {
            for file in [RUN_SH, PREFLIGHT_SH, BUILD_INFO, manifest::FILE] {
                if !dir.join(file).is_file() {
                    bail!(
                        "--bundle {}: expected a bundle folder holding {file}, found none there \
                         (bundles from before `cargo xtask deploy` lack it: rebuild with \
                         `cargo xtask bundle`)",
                        dir.display()
                    );
                }
            }
            ssh::echo(format!("lock {}", crate::lock::lock_path(dir).display()));
            let lock = if dry_run {
                None
            } else {
                Some(FolderLock::take(dir, "cargo xtask deploy --bundle", wait)?)
            };
            return Ok((dir.clone(), lock, false));
        }
        let bundle = Bundle {
            example: self.example.clone().filter(|_| !self.gpu_tests),
            gpu_tests: self.gpu_tests,
            out: None,
            dry_run,
        };
        step("bundle");
        let built = bundle.build(project, ws, wait)?;
        Ok((built.dir, built.lock, true))
    }
}

/// `--dir`: a path on the host. The remote shell and rsync take a relative path from the
/// home folder, so `~/x` becomes `x` (and `~` the home itself); `~user` is refused rather
/// than made a folder named `~user`.
fn remote_dir(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(['\n', '\0']) {
        return Err(format!("expected a path on the host, found {s:?}"));
    }
    match s.strip_prefix('~') {
        None => Ok(s.to_string()),
        Some("") | Some("/") => Ok(".".to_string()),
        Some(rest) if rest.starts_with('/') => Ok(rest.trim_start_matches('/').to_string()),
        Some(_) => {
            let user = s.split('/').next().unwrap_or(s);
            Err(format!(
                "expected a path on the host, absolute or from the remote home (`~/PATH` or \
                 `PATH`), found `{user}`, another user's home, which the deploy does not expand: \
                 give its absolute path"
            ))
        }
    }
}

/// `--dir` as this machine's shell leaves an unquoted `~/x`: the local home's `x`
/// (`$HOME` is `home`), which the host may not have or let this user write. Then the
/// `~` form that was probably meant, else `None`.
fn local_home_expansion(dir: &str, home: Option<&str>) -> Option<String> {
    let home = home?.trim_end_matches('/');
    if home.is_empty() || !home.starts_with('/') {
        return None;
    }
    match dir.strip_prefix(home)? {
        "" | "/" => Some("~".to_string()),
        rest if rest.starts_with('/') => Some(format!("~/{}", rest.trim_start_matches('/'))),
        _ => None,
    }
}

/// `e` with a hint when `--dir` looks like a `~` that the shell here expanded (see
/// [`local_home_expansion`]) and the failure is one that a wrong folder causes.
fn with_home_hint(e: anyhow::Error, dir: &str, home: Option<String>) -> anyhow::Error {
    let about_the_folder = match e.downcast_ref::<DeployError>() {
        Some(d) => matches!(
            d,
            DeployError::PermissionDenied { .. }
                | DeployError::Step { .. }
                | DeployError::NoCurrent { .. }
                | DeployError::DiskFull { .. }
        ),
        None => false,
    };
    let Some(tilde) = local_home_expansion(dir, home.as_deref()).filter(|_| about_the_folder)
    else {
        return e;
    };
    let home = home.unwrap_or_default();
    anyhow::anyhow!(
        "{e:#}\n(--dir {dir} is under this machine's home, {home}: a shell expands an unquoted \
         `{tilde}` here, before the deploy sees it. For the home on the host, quote it: \
         --dir '{tilde}')"
    )
}

/// A number of seconds for a timeout: at least 1, since 0 would mean no limit to ssh.
fn seconds(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => {
            Err("expected a number of seconds, at least 1: 0 would turn the timeout off".into())
        }
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "expected a number of seconds (at least 1), found `{s}`"
        )),
    }
}

/// Fails with [`DeployError::ToolMissing`] unless `tool` runs here.
fn require_tool(tool: &'static str, package: &'static str, why: &'static str) -> Result<()> {
    let probe = std::process::Command::new(tool)
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match probe {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(DeployError::ToolMissing { tool, package, why }.into())
        }
        _ => Ok(()),
    }
}

/// The release name recorded in the bundle's `build-info.json`.
fn release_of(bundle: &Path) -> Result<String> {
    let path = bundle.join(BUILD_INFO);
    let text =
        fs::read_to_string(&path).with_context(|| format!("could not read {}", path.display()))?;
    let info: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let release = info["release"].as_str().unwrap_or_default();
    if !remote::is_release_name(release) || !info["content_sha256"].is_string() {
        bail!(
            "{}: expected a `release` name (letters, digits, `-`, `_`, `.`) and a \
             `content_sha256`, found {:?} and {:?}; rebuild the bundle with `cargo xtask bundle`",
            path.display(),
            info["release"],
            info["content_sha256"]
        );
    }
    Ok(release.to_string())
}

/// The hashes the host must report for the upload: the manifest's, and the manifest's
/// own (so a manifest damaged on the way is caught too).
fn expected_hashes(bundle: &Path) -> Result<Manifest> {
    let mut expected = Manifest::read(bundle)?;
    let own = manifest::hash_files(bundle, &[manifest::FILE.to_string()])?;
    expected.entries.extend(own.entries);
    Ok(expected)
}

/// A run's folder name: the UTC time and this process's id, so two deploys in the same
/// second do not share a results folder (`20261129T170512Z-4242`).
fn run_id(now: SystemTime) -> String {
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{}-{}", utc_stamp(secs), std::process::id())
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time.
fn utc_stamp(unix_secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(unix_secs);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// `2026-11-29 17:05:12 UTC` for a Unix time, for people.
pub fn utc_time(unix_secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(unix_secs);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC")
}

/// The UTC calendar date and time of a Unix time. Written out rather than taken from a
/// date crate: it is the one date this crate formats, and the conversion is ten lines
/// (Howard Hinnant's `civil_from_days`).
fn civil(unix_secs: u64) -> (i64, i64, i64, u64, u64, u64) {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps_are_calendar_dates() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(1_700_000_000), "20231114T221320Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(4_102_444_799), "20991231T235959Z");
        assert_eq!(utc_stamp(4_107_542_399), "21000228T235959Z");
        assert_eq!(utc_time(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn a_tilde_in_dir_is_the_remote_home() {
        assert_eq!(remote_dir("~/x/y").unwrap(), "x/y");
        assert_eq!(remote_dir("~").unwrap(), ".");
        assert_eq!(remote_dir("~/").unwrap(), ".");
        assert_eq!(remote_dir("/abs/~x").unwrap(), "/abs/~x");
        assert_eq!(remote_dir("rel").unwrap(), "rel");
        let err = remote_dir("~bob/x").unwrap_err();
        assert!(err.contains("found `~bob`, another user's home"), "{err}");
        assert!(remote_dir("").is_err());
    }

    #[test]
    fn a_dir_under_the_local_home_is_taken_for_an_expanded_tilde() {
        let home = Some("/home/me/");
        assert_eq!(
            local_home_expansion("/home/me/stepgraph", home).as_deref(),
            Some("~/stepgraph")
        );
        assert_eq!(local_home_expansion("/home/me", home).as_deref(), Some("~"));
        assert_eq!(local_home_expansion("/home/meta/x", home), None);
        assert_eq!(local_home_expansion("stepgraph", home), None);
        assert_eq!(local_home_expansion("/srv/x", home), None);
        assert_eq!(local_home_expansion("/x", Some("/")), None);
        assert_eq!(local_home_expansion("/x", None), None);

        let failed = || -> anyhow::Error {
            DeployError::Step {
                step: "taking the deploy folder's lock",
                host: "h".into(),
                status: "exit status 3".into(),
                stderr: String::new(),
            }
            .into()
        };
        let hinted = with_home_hint(failed(), "/home/me/x", Some("/home/me".into())).to_string();
        assert!(
            hinted.ends_with(
                "(--dir /home/me/x is under this machine's home, /home/me: a shell expands an \
                 unquoted `~/x` here, before the deploy sees it. For the home on the host, quote \
                 it: --dir '~/x')"
            ),
            "{hinted}"
        );
        let plain = with_home_hint(failed(), "/srv/x", Some("/home/me".into())).to_string();
        assert!(!plain.contains("quote it"), "{plain}");
        let refused: anyhow::Error = DeployError::Unreachable {
            host: "h".into(),
            port: 22,
            found: "x".into(),
        }
        .into();
        let refused = with_home_hint(refused, "/home/me/x", Some("/home/me".into())).to_string();
        assert!(!refused.contains("quote it"), "{refused}");
    }

    #[test]
    fn run_ids_carry_the_process_id() {
        let id = run_id(UNIX_EPOCH);
        assert_eq!(id, format!("19700101T000000Z-{}", std::process::id()));
    }
}
