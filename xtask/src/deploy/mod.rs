//! `cargo xtask deploy`: ships a bundle to a GPU host over ssh, checks it there, runs it
//! and brings the results back.
//!
//! The steps, each a command echoed before it runs (and only echoed with `--dry-run`):
//!
//! 1. bundle the job (`cargo xtask bundle <example>`), or take `--bundle DIR` as it is;
//! 2. prepare the deploy folder on the host (see [`remote`] for its layout);
//! 3. rsync the bundle into `releases/<release>.incoming/` (a redeploy sends only what
//!    changed);
//! 4. hash every file there and compare with the bundle's `SHA256SUMS`;
//! 5. run the bundle's `preflight.sh` there (GPU, compute capability, driver, libraries,
//!    free disk);
//! 6. only then make the upload `releases/<release>` and switch `current` to it;
//! 7. run `run.sh ARGS` with its output streamed, in a fresh `runs/<release>/<run>/`;
//! 8. rsync that folder back into `target/deploy/<host>/<release>/<run>/`.
//!
//! Each failure is a [`DeployError`] that names what was expected and what was found.
//!
//! `--remote-path-prefix` is a test hook: it puts a folder first on the remote PATH for
//! the preflight and the job, which is how the tests (`tests/deploy.rs`) put their
//! stand-in `nvidia-smi` in front of the host's (which on the test machine is none).

mod error;
mod lock;
pub mod remote;
mod ssh;
mod target;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;

pub use self::error::DeployError;
use self::lock::RemoteLock;
use self::remote::{GUARD, HASHES, HASHES_SEPARATOR, Layout, PLACE, PREPARE, STOP, Script};
use self::ssh::{Disk, Outcome, Remote, Show, Ssh, Stop};
pub use self::target::Target;
use crate::bundle::build_info::Revision;
use crate::bundle::contents::{BUILD_INFO, GPU_TESTS_PROGRAM, PREFLIGHT_SH, RUN_SH};
use crate::bundle::manifest::{self, Manifest};
use crate::bundle::preflight_sh::{DEFAULT_MIN_FREE_MIB, FAIL_PREFIX};
use crate::bundle::{Bundle, build_info};
use crate::cmd::{self, Workspace};
use crate::lock::FolderLock;
use crate::programs::DEMO;

/// How many of the job's last lines a failure shows.
const TAIL_LINES: usize = 15;

/// The bound on the small scripts (folders, hashes, the switch): seconds of work even
/// for a large bundle on a slow disk; past this the host is not well.
const QUICK_STEP: Duration = Duration::from_secs(120);

/// The bound on the steps that stop something (a remote job, the shared connection).
const QUICK_STOP: Duration = Duration::from_secs(10);

/// How long past its own limit a guarded command is given to end on the host before
/// it is given up from here.
const GUARD_GRACE: Duration = Duration::from_secs(5);

/// rsync gives up when no data moves for this long (its `--timeout`).
const RSYNC_IO_TIMEOUT: &str = "--timeout=60";

/// Bundles the job, copies it to the host over ssh, verifies its checksums there, runs
/// the preflight, switches `current` to it, runs it and fetches its results.
#[derive(Debug, Args)]
pub struct Deploy {
    /// The GPU host: `user@host`, `user@host:port`, or `user@[ipv6]:port`.
    #[arg(long, value_name = "USER@HOST[:PORT]")]
    pub host: Target,
    /// The program to bundle and run (`dqn`, `fork_join`, `capture_cost`).
    #[arg(long, default_value = DEMO, conflicts_with_all = ["bundle", "gpu_tests"])]
    pub example: String,
    /// Bundle and run the GPU tests (`cargo xtask bundle --gpu-tests`) instead.
    #[arg(long, conflicts_with = "bundle")]
    pub gpu_tests: bool,
    /// Deploy this bundle folder as it is, without building.
    #[arg(long, value_name = "DIR")]
    pub bundle: Option<PathBuf>,
    /// The deploy folder on the host; a relative path is taken from the remote home.
    #[arg(long, value_name = "PATH", default_value = "stepgraph")]
    pub dir: String,
    /// The ssh private key to log in with (default: ssh's own choice, ~/.ssh and the agent).
    #[arg(long, value_name = "PATH")]
    pub key: Option<PathBuf>,
    /// The known-hosts file to record and check the host's key in (default: ssh's).
    #[arg(long, value_name = "PATH")]
    pub known_hosts: Option<PathBuf>,
    /// Seconds to wait for the host to answer (ssh's `ConnectTimeout`; keepalives then
    /// give up on a host that stops answering after about a minute).
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = seconds)]
    pub connect_timeout: u32,
    /// Seconds the preflight may take on the host before it is stopped (a hung
    /// `nvidia-smi` is a common sign of a sick GPU host).
    #[arg(long, value_name = "SECONDS", default_value_t = 120, value_parser = seconds)]
    pub preflight_timeout: u32,
    /// Seconds the job may run on the host before it is stopped, with everything it
    /// started.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600, value_parser = seconds)]
    pub job_timeout: u32,
    /// Free space the preflight requires in the deploy folder, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MIN_FREE_MIB)]
    pub min_free_mib: u64,
    /// Where results are fetched to, as `<DIR>/<host>/<release>/<run>/` (relative paths are
    /// taken from the workspace root).
    #[arg(long, value_name = "DIR", default_value = "target/deploy")]
    pub fetch_to: PathBuf,
    /// Test hook: a folder on the host put first on PATH for the preflight and the job
    /// (the tests put a stand-in nvidia-smi there).
    #[arg(long, value_name = "DIR")]
    pub remote_path_prefix: Option<String>,
    /// Fail at once when another deploy holds the deploy folder (or a command the bundle
    /// folder), rather than wait for it.
    #[arg(long)]
    pub no_wait: bool,
    /// Seconds to wait for another deploy to release the deploy folder (or the bundle
    /// folder) before failing.
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = seconds)]
    pub lock_timeout: u32,
    /// Print every command without running any, changing nothing here or there.
    #[arg(long)]
    pub dry_run: bool,
    /// Passed to the job (`cargo xtask deploy --host h100 -- --quick`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

impl Deploy {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        let dry_run = self.dry_run;
        self.check_inputs()?;
        crate::interrupt::install()?;
        let ssh = Ssh {
            target: self.host.clone(),
            key: self.key.clone(),
            known_hosts: self.known_hosts.clone(),
            connect_timeout_s: self.connect_timeout,
            control: Some(control_dir().join("ssh")),
        };
        // The host first: a wrong host or key shows in seconds, not after a build.
        step("connect");
        let _connection = Connection::open(&ssh, dry_run)?;
        step("lock the deploy folder");
        let what = format!("cargo xtask deploy to {}", self.dir);
        let mut folder_lock = RemoteLock::take(
            &ssh,
            &self.dir,
            &crate::lock::describe_holder(&what),
            self.wait(),
            dry_run,
        )?;

        let (bundle, bundle_lock) = self.bundle_dir(ws)?;
        let release = release_of(&bundle, ws, dry_run, &self.program())?;
        let expected = expected_hashes(&bundle, dry_run)?;
        let run = run_id(SystemTime::now());
        let session = Session {
            ssh,
            host: self.host.to_string(),
            layout: Layout::new(&self.dir, &release, &run),
            results: ws
                .root
                .join(&self.fetch_to)
                .join(self.host.label())
                .join(&release)
                .join(&run),
            run,
            path_prefix: self.remote_path_prefix.clone().unwrap_or_default(),
            preflight_timeout: Duration::from_secs(self.preflight_timeout.into()),
            job_timeout: Duration::from_secs(self.job_timeout.into()),
            dry_run,
        };
        eprintln!(
            "deploy: {} (release {release}) to {}, folder {}",
            bundle.display(),
            session.host,
            session.layout.dir
        );

        let state = session.prepare()?;
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
                    session.layout.aside(),
                    error::list(&why)
                ),
            }
        }
        if upload {
            session.copy(&bundle, state.current.as_deref())?;
            session.verify(expected.as_ref())?;
        }
        // What is on the host now is checked; the bundle here may be rebuilt.
        drop(bundle_lock);
        let from = if upload {
            session.layout.incoming()
        } else {
            session.layout.release_dir()
        };
        session.preflight(&from, self.min_free_mib)?;
        if let Some(lock) = &mut folder_lock
            && !lock.held()
        {
            return Err(DeployError::LockLost {
                host: session.host.clone(),
                dir: session.layout.dir.clone(),
            }
            .into());
        }
        if upload || !live {
            session.place(upload, true)?;
        }
        let job_failed = session.run_job(&self.args)?;
        let fetched = session.fetch();
        if let Some(job_failed) = job_failed {
            // The job's failure is the news; a failed fetch only adds to it.
            if let Err(e) = fetched {
                eprintln!("warning: {e:#}");
            }
            return Err(job_failed.into());
        }
        fetched?;

        if dry_run {
            eprintln!("\ndry run: nothing was run, here or on {}", session.host);
        } else {
            eprintln!(
                "\ndeployed {release} to {} ({} -> releases/{release}); results in {}",
                session.host,
                session.layout.current(),
                session.results.display()
            );
        }
        Ok(())
    }

    /// The program whose bundle is deployed, for a release name a dry run makes up.
    fn program(&self) -> String {
        if self.gpu_tests {
            GPU_TESTS_PROGRAM.to_string()
        } else {
            self.example.clone()
        }
    }

    /// What can be checked before building or connecting: the folder name, the key, the
    /// tools.
    fn check_inputs(&self) -> Result<()> {
        if self.dir.is_empty() || self.dir.contains(['\n', '\0']) {
            bail!("--dir: expected a path on the host, found {:?}", self.dir);
        }
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

    fn wait(&self) -> crate::lock::Wait {
        if self.no_wait {
            crate::lock::Wait::No
        } else {
            crate::lock::Wait::Upto(Duration::from_secs(self.lock_timeout.into()))
        }
    }

    /// The bundle folder, `--bundle` as given or the example's (or the GPU tests')
    /// bundle built now, and its lock, which keeps another command from rewriting it
    /// while it is copied (none in a dry run).
    fn bundle_dir(&self, ws: &Workspace) -> Result<(PathBuf, Option<FolderLock>)> {
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
            eprintln!("$ lock {}", crate::lock::lock_path(dir).display());
            let lock = if self.dry_run {
                None
            } else {
                Some(FolderLock::take(
                    dir,
                    "cargo xtask deploy --bundle",
                    self.wait(),
                )?)
            };
            return Ok((dir.clone(), lock));
        }
        let bundle = Bundle {
            example: (!self.gpu_tests).then(|| self.example.clone()),
            gpu_tests: self.gpu_tests,
            out: None,
            dry_run: self.dry_run,
        };
        eprintln!("\n== bundle");
        let built = bundle.build(ws, self.wait())?;
        Ok((built.dir, built.lock))
    }
}

/// One deploy's steps on the host, in the order [`Deploy::run`] takes them.
#[derive(Debug)]
struct Session {
    ssh: Ssh,
    /// The target as written, for messages.
    host: String,
    layout: Layout,
    /// The run's folder name, on the host and here.
    run: String,
    /// Where this run's results are fetched to.
    results: PathBuf,
    /// A folder put first on the remote PATH for the preflight and the job (the test
    /// hook), or empty.
    path_prefix: String,
    preflight_timeout: Duration,
    job_timeout: Duration,
    dry_run: bool,
}

impl Session {
    fn disk<'a>(&'a self, what: &'static str, place: &'a str) -> Option<Disk<'a>> {
        Some(Disk {
            host: &self.host,
            what,
            place,
        })
    }

    /// A quick script on the host: a bounded wait.
    fn quick<'a>(&self, script: &'static Script, args: &[String]) -> Remote<'a> {
        self.ssh.script(script, args).limit(QUICK_STEP)
    }

    /// Makes the folders and says what is there: where `current` points, whether the
    /// release is there already. In a dry run, an empty folder.
    fn prepare(&self) -> Result<HostState> {
        step("prepare the deploy folder");
        let args = [self.layout.dir.clone(), self.layout.release.clone()];
        let outcome = self.quick(&PREPARE, &args).run(self.dry_run)?;
        let disk = self.disk("the release", &self.layout.dir);
        let Some(o) = expect_success(&self.ssh, outcome, "preparing the deploy folder", disk)?
        else {
            return Ok(HostState::default());
        };
        let mut state = HostState::default();
        for line in o.stdout.lines() {
            if let Some(target) = line.strip_prefix("current ") {
                state.current = remote::current_release(target).map(String::from);
            } else if line == "present" {
                state.present = true;
            }
        }
        Ok(state)
    }

    /// rsync into this deploy's own upload folder. Files the release `current` points
    /// at holds already are copied from there on the host (`--copy-dest`: copies, never
    /// links), so only the others travel; `--checksum` compares their content.
    fn copy(&self, bundle: &Path, current: Option<&str>) -> Result<()> {
        step("copy the bundle");
        let incoming = self.layout.incoming();
        let mut options = vec![
            "--checksum".to_string(),
            "--itemize-changes".into(),
            RSYNC_IO_TIMEOUT.into(),
        ];
        // Relative to the upload folder, which sits beside the releases.
        if let Some(current) = current {
            options.push(format!("--copy-dest=../{current}"));
        }
        let options: Vec<&str> = options.iter().map(String::as_str).collect();
        let copy = self.ssh.rsync(
            &options,
            &[format!("{}/", bundle.display())],
            &self.ssh.remote(&format!("{incoming}/")),
        );
        let outcome = Remote::new(copy).show(Show::Stream).run(self.dry_run)?;
        let disk = self.disk("the bundle", &incoming);
        expect_success(&self.ssh, outcome, "copying the bundle", disk).map(drop)
    }

    /// The host's hashes of every file under `folder`, and the folder's own manifest
    /// (empty if it has none). `None` in a dry run.
    fn hashes(&self, folder: &str) -> Result<Option<(Manifest, Manifest)>> {
        let outcome = self
            .quick(&HASHES, &[folder.to_string()])
            .run(self.dry_run)?;
        let Some(outcome) = expect_success(&self.ssh, outcome, "hashing the files", None)? else {
            return Ok(None);
        };
        let (found, own) = outcome
            .stdout
            .split_once(HASHES_SEPARATOR)
            .context("the host's hashes lack their end marker")?;
        let found = Manifest::parse(found).context("reading the host's sha256sum")?;
        let own = Manifest::parse(own)
            .with_context(|| format!("reading {folder}/{} on the host", manifest::FILE))?;
        Ok(Some((found, own)))
    }

    /// Hashes every file of the upload on the host and compares with `expected`.
    fn verify(&self, expected: Option<&Manifest>) -> Result<()> {
        step("verify the checksums on the host");
        let incoming = self.layout.incoming();
        let Some((found, _)) = self.hashes(&incoming)? else {
            return Ok(());
        };
        let expected = expected.context("the bundle's manifest was not read")?;
        let mismatches = expected.compare(&found);
        if !mismatches.is_empty() {
            return Err(DeployError::ChecksumMismatch {
                host: self.host.clone(),
                place: incoming,
                mismatches,
            }
            .into());
        }
        eprintln!("all {} files match {}", found.entries.len(), manifest::FILE);
        Ok(())
    }

    /// Whether the release `release` on the host is whole: its files match its own
    /// manifest, and their content hash is the one its name carries (which catches a
    /// damaged manifest too).
    fn check_release(&self, release: &str) -> Result<Check> {
        let Some((found, own)) = self.hashes(&self.layout.release_dir_of(release))? else {
            return Ok(Check::Verified { files: 0 });
        };
        let mut own_with_itself = own.clone();
        if let Some(h) = found.entries.get(manifest::FILE) {
            own_with_itself
                .entries
                .insert(manifest::FILE.to_string(), h.clone());
        }
        let mut why: Vec<String> = own_with_itself
            .compare(&found)
            .iter()
            .map(|m| m.to_string())
            .collect();
        if own.entries.is_empty() {
            why.push(format!(
                "{}: expected the release's manifest, found none",
                manifest::FILE
            ));
        }
        let content = manifest::content_hash(&found)?;
        let named = release.rsplit('-').next().unwrap_or_default();
        if why.is_empty() && !content.starts_with(named) {
            why.push(format!(
                "its content: expected the hash its name carries ({named}...), found {content}"
            ));
        }
        Ok(if why.is_empty() {
            Check::Verified {
                files: found.entries.len(),
            }
        } else {
            Check::Damaged(why)
        })
    }

    /// `command` on the host under the [`GUARD`], its output streamed: at most `limit`,
    /// stopped with all it started when the limit passes or a signal asks the deploy to
    /// stop. `exitfile` (or empty) gets its status when it ends.
    fn guarded(
        &self,
        pidfile: &str,
        limit: Duration,
        exitfile: &str,
        command: &[String],
    ) -> Result<Option<Outcome>> {
        let mut args = vec![
            pidfile.to_string(),
            limit.as_secs().to_string(),
            self.path_prefix.clone(),
            exitfile.to_string(),
        ];
        args.extend(command.iter().cloned());
        let stop = || self.stop_remote(pidfile);
        self.ssh
            .inline(&GUARD, &args)
            .show(Show::Stream)
            // The host's own limit ends the command first; this one holds when the host
            // cannot end it (a process stuck in the kernel) or cannot be reached.
            .limit(limit + GUARD_GRACE)
            .on_stop(&stop)
            .run(self.dry_run)
    }

    /// Ends what a [`GUARD`] runs on the host, over a connection of its own; what goes
    /// wrong is only reported, the deploy is stopping anyway.
    fn stop_remote(&self, pidfile: &str) {
        eprintln!("\nstopping it on {}", self.host);
        let stopped = self
            .ssh
            .script(&STOP, &[pidfile.to_string()])
            .limit(QUICK_STOP)
            .uninterruptible()
            .run(false);
        match stopped {
            Ok(Some(o)) if o.status.success() && o.stop.is_none() => {}
            Ok(Some(o)) => eprintln!(
                "warning: could not stop it on {} ({}): {}",
                self.host,
                ssh::describe(o.status),
                o.stderr.trim()
            ),
            Ok(None) => {}
            Err(e) => eprintln!("warning: could not stop it on {}: {e:#}", self.host),
        }
    }

    /// The bundle's `preflight.sh`, run from the upload folder; its `FAIL` lines become
    /// the error.
    fn preflight(&self, from: &str, min_free_mib: u64) -> Result<()> {
        step("preflight on the host");
        let command = [
            "bash".to_string(),
            format!("{from}/{PREFLIGHT_SH}"),
            self.layout.dir.clone(),
            min_free_mib.to_string(),
        ];
        let pidfile = self.layout.pidfile(&format!("preflight-{}", self.run));
        let outcome = self.guarded(&pidfile, self.preflight_timeout, "", &command)?;
        let Some(outcome) = outcome.filter(|o| !o.status.success() || o.stop.is_some()) else {
            return Ok(());
        };
        let failures: Vec<String> = outcome
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix(FAIL_PREFIX))
            .map(|l| l.trim().to_string())
            .collect();
        let timed_out = matches!(outcome.stop, Some(Stop::TimedOut(_)))
            || timeout_status(&outcome, self.preflight_timeout);
        if let Some(Stop::Interrupted(signal)) = outcome.stop {
            return Err(interrupted(signal, "the preflight", &self.host).into());
        }
        Err(match self.ssh.classify(&outcome.stderr, None) {
            None if timed_out => DeployError::PreflightTimedOut {
                host: self.host.clone(),
                seconds: self.preflight_timeout.as_secs(),
                failures,
            },
            None if !failures.is_empty() => DeployError::PreflightFailed {
                host: self.host.clone(),
                failures,
            },
            _ => failure(&self.ssh, outcome, "the preflight", None),
        }
        .into())
    }

    /// Gives the checked upload (if `uploaded`) its release's name and, if `switch`,
    /// points `current` at the release.
    fn place(&self, uploaded: bool, switch: bool) -> Result<()> {
        step(if switch {
            "switch `current`"
        } else {
            "keep the release"
        });
        let args = [
            self.layout.dir.clone(),
            self.layout.release.clone(),
            if uploaded {
                self.layout.upload.clone()
            } else {
                String::new()
            },
            self.layout.aside(),
            if switch { "switch" } else { "keep" }.to_string(),
        ];
        let outcome = self.quick(&PLACE, &args).run(self.dry_run)?;
        let disk = self.disk("the release", &self.layout.dir);
        if let Some(outcome) = expect_success(&self.ssh, outcome, "switching `current`", disk)? {
            eprint!("{}", outcome.stdout);
        }
        Ok(())
    }

    /// Runs `run.sh ARGS` with its output streamed. A failing job is returned, not
    /// raised, so that its results are still fetched; a lost connection or a signal is
    /// raised.
    fn run_job(&self, args: &[String]) -> Result<Option<DeployError>> {
        step("run the job");
        let run_dir = self.layout.run_dir(&self.run);
        let mut job = vec![format!("{}/{RUN_SH}", self.layout.release_dir())];
        job.extend(args.iter().cloned());
        let mut command = vec![
            "env".to_string(),
            format!("OUT={run_dir}"),
            "bash".to_string(),
        ];
        command.extend(job.iter().cloned());
        let pidfile = self.layout.pidfile(&self.run);
        let outcome = self.guarded(&pidfile, self.job_timeout, "", &command)?;
        let Some(o) = outcome.filter(|o| !o.status.success() || o.stop.is_some()) else {
            return Ok(None);
        };
        if let Some(Stop::Interrupted(signal)) = o.stop {
            return Err(interrupted(signal, "the job", &self.host).into());
        }
        let timed_out =
            matches!(o.stop, Some(Stop::TimedOut(_))) || timeout_status(&o, self.job_timeout);
        // 255 is ssh's own failure (or a job that exits 255: then stderr names no cause).
        if !timed_out
            && o.status.code() == Some(255)
            && let Some(e) = self
                .ssh
                .classify(&o.stderr, self.disk("the results", &run_dir))
        {
            return Err(e.into());
        }
        let status = if timed_out {
            format!(
                "no end within {}s (--job-timeout): it was stopped",
                self.job_timeout.as_secs()
            )
        } else {
            ssh::describe(o.status)
        };
        Ok(Some(DeployError::JobFailed {
            host: self.host.clone(),
            command: format!("bash {}", cmd::quote_words(&job)),
            status,
            tail: o.tail(TAIL_LINES),
            results: self.results.clone(),
        }))
    }

    fn fetch(&self) -> Result<()> {
        step("fetch the results");
        eprintln!("$ mkdir -p {}", self.results.display());
        if !self.dry_run {
            fs::create_dir_all(&self.results)
                .with_context(|| format!("could not create {}", self.results.display()))?;
        }
        let fetch = self.ssh.rsync(
            &["--itemize-changes", RSYNC_IO_TIMEOUT],
            &[self
                .ssh
                .remote(&format!("{}/", self.layout.run_dir(&self.run)))],
            &format!("{}/", self.results.display()),
        );
        let outcome = Remote::new(fetch).show(Show::Stream).run(self.dry_run)?;
        let here = self.results.display().to_string();
        let disk = Some(Disk {
            host: "this machine",
            what: "the results",
            place: &here,
        });
        expect_success(&self.ssh, outcome, "fetching the results", disk).map(drop)
    }
}

/// What [`Session::prepare`] found on the host.
#[derive(Debug, Default)]
struct HostState {
    /// The release `current` points at.
    current: Option<String>,
    /// Whether this deploy's release is there already.
    present: bool,
}

/// What [`Session::check_release`] found.
#[derive(Debug)]
enum Check {
    Verified {
        files: usize,
    },
    /// How it differs from its manifest or its name.
    Damaged(Vec<String>),
}

/// The shared ssh connection: opened once, closed (and its socket's folder removed) when
/// dropped, whichever way the deploy ends.
struct Connection {
    ssh: Ssh,
    dry_run: bool,
}

impl Connection {
    fn open(ssh: &Ssh, dry_run: bool) -> Result<Connection> {
        let socket = ssh
            .control
            .as_ref()
            .expect("a deploy shares one connection");
        let folder = socket
            .parent()
            .expect("the socket is in a folder of its own");
        eprintln!("$ mkdir -m 700 {}", folder.display());
        if !dry_run {
            use std::os::unix::fs::DirBuilderExt;
            // A folder left by a killed deploy of the same process id.
            let _ = fs::remove_dir_all(folder);
            fs::DirBuilder::new()
                .mode(0o700)
                .create(folder)
                .with_context(|| format!("could not create {}", folder.display()))?;
        }
        // From here on the folder is removed on the way out, whatever happens.
        let connection = Connection {
            ssh: ssh.clone(),
            dry_run,
        };
        let outcome = Remote::new(ssh.connect())
            .limit(Duration::from_secs(ssh.connect_timeout_s.into()) + QUICK_STOP)
            .run(dry_run)?;
        expect_success(ssh, outcome, "connecting", None)?;
        Ok(connection)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Nothing to close when the connection never opened; either way it is gone. A
        // bounded wait, and not cut short by a signal: this is the clean-up it asked for.
        let _ = Remote::new(self.ssh.disconnect())
            .limit(QUICK_STOP)
            .uninterruptible()
            .run(self.dry_run);
        if self.dry_run {
            return;
        }
        if let Some(folder) = self.ssh.control.as_ref().and_then(|s| s.parent()) {
            let _ = fs::remove_dir_all(folder);
        }
    }
}

/// A folder for the control socket, private to this process. Under the system's
/// temporary folder unless that path is long: a Unix socket's path must stay under 108
/// bytes.
fn control_dir() -> PathBuf {
    let name = format!("stepgraph-ssh-{}", std::process::id());
    let tmp = std::env::temp_dir();
    if tmp.as_os_str().len() + name.len() < 80 {
        tmp.join(name)
    } else {
        Path::new("/tmp").join(name)
    }
}

fn step(what: &str) {
    eprintln!("\n== {what}");
}

/// `Ok(outcome)` when the run succeeded (or was not run: a dry run), else the
/// [`failure`].
fn expect_success(
    ssh: &Ssh,
    outcome: Option<Outcome>,
    step: &'static str,
    disk: Option<Disk<'_>>,
) -> Result<Option<Outcome>> {
    match outcome.as_ref().and_then(|o| o.stop) {
        Some(Stop::Interrupted(signal)) => {
            return Err(interrupted(signal, step, &ssh.target.to_string()).into());
        }
        Some(Stop::TimedOut(limit)) => {
            return Err(DeployError::TimedOut {
                step,
                host: ssh.target.to_string(),
                seconds: limit.as_secs(),
            }
            .into());
        }
        None => {}
    }
    match outcome {
        Some(o) if !o.status.success() => Err(failure(ssh, o, step, disk).into()),
        other => Ok(other),
    }
}

/// Why a step failed: ssh's own reasons (or a full disk) when its stderr gives them,
/// else the step with its status and stderr.
fn failure(ssh: &Ssh, o: Outcome, step: &'static str, disk: Option<Disk<'_>>) -> DeployError {
    ssh.classify(&o.stderr, disk)
        .unwrap_or_else(|| DeployError::Step {
            step,
            host: ssh.target.to_string(),
            status: ssh::describe(o.status),
            stderr: o.stderr,
        })
}

/// The error for a step stopped by a signal; the guards' `Drop`s clean up as it unwinds.
fn interrupted(signal: &'static str, step: &'static str, host: &str) -> DeployError {
    DeployError::Interrupted {
        signal,
        step,
        host: host.to_string(),
    }
}

/// Whether a guarded command ended on the host's own limit: `timeout`'s status 124 (or
/// 137 when it had to kill), once the limit had passed.
fn timeout_status(o: &Outcome, limit: Duration) -> bool {
    matches!(o.status.code(), Some(124 | 137)) && o.elapsed + Duration::from_millis(500) >= limit
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

/// The release name recorded in the bundle's `build-info.json`; in a dry run whose bundle
/// was not built, the one it would get with its hash left open.
fn release_of(bundle: &Path, ws: &Workspace, dry_run: bool, program: &str) -> Result<String> {
    let path = bundle.join(BUILD_INFO);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(_) if dry_run => {
            return Ok(build_info::release_name(
                program,
                &Revision::of(&ws.root),
                None,
            ));
        }
        Err(e) => return Err(e).with_context(|| format!("could not read {}", path.display())),
    };
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
/// own (so a manifest damaged on the way is caught too). `None` in a dry run whose bundle
/// was not built.
fn expected_hashes(bundle: &Path, dry_run: bool) -> Result<Option<Manifest>> {
    if dry_run && !bundle.join(manifest::FILE).is_file() {
        return Ok(None);
    }
    let mut expected = Manifest::read(bundle)?;
    let own = manifest::hash_files(bundle, &[manifest::FILE.to_string()])?;
    expected.entries.extend(own.entries);
    Ok(Some(expected))
}

/// A run's folder name: the UTC time and this process's id, so two deploys in the same
/// second do not share a results folder (`20261129T170512Z-4242`).
fn run_id(now: SystemTime) -> String {
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{}-{}", utc_stamp(secs), std::process::id())
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time. Written out rather than taken from a date crate:
/// it is the one date this crate formats, and the conversion is ten lines (Howard
/// Hinnant's `civil_from_days`).
fn utc_stamp(unix_secs: u64) -> String {
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
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
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
    }

    #[test]
    fn run_ids_carry_the_process_id() {
        let id = run_id(UNIX_EPOCH);
        assert_eq!(id, format!("19700101T000000Z-{}", std::process::id()));
    }
}
