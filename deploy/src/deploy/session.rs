//! One command's dealings with a host: the shared connection, the deploy folder's
//! lock, and the steps on the host, each a command (echoed with `--verbose`, and only
//! echoed in a dry run) whose failure becomes a [`DeployError`].

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::error::DeployError;
use super::remote::{
    self, GUARD, HASHES, HASHES_SEPARATOR, INSPECT, Layout, PLACE, PREPARE, STOP, Script,
};
use super::report::Report;
use super::ssh::{self, Disk, Outcome, Remote, Show, Ssh, Stop};
use crate::bundle::build_info::RELEASE_HASH_DIGITS;
use crate::bundle::contents::PREFLIGHT_SH;
use crate::bundle::manifest::{self, Manifest};
use crate::bundle::preflight_sh::{FAIL_PREFIX, NO_GPU_CHECKS};

/// The bound on the small scripts (folders, hashes, the switch): seconds of work even
/// for a large bundle on a slow disk; past this the host is not well.
pub const QUICK_STEP: Duration = Duration::from_secs(120);

/// The bound on the steps that stop something (a remote job, the shared connection).
pub const QUICK_STOP: Duration = Duration::from_secs(10);

/// How long past its own limit a guarded command is given to end on the host before
/// it is given up from here.
const GUARD_GRACE: Duration = Duration::from_secs(5);

/// rsync gives up when no data moves for this long (its `--timeout`).
const RSYNC_IO_TIMEOUT: &str = "--timeout=60";

/// One command's steps on the host.
#[derive(Debug)]
pub struct Session {
    pub ssh: Ssh,
    /// The target as written, for messages.
    pub host: String,
    pub layout: Layout,
    /// This command's run id: its upload's and its job's folder names.
    pub run: String,
    /// A folder put first on the remote PATH for the preflight and the job (the test
    /// hook), or empty.
    pub path_prefix: String,
    /// Who this is (`user@host, pid N`), for the history and the run records.
    pub by: String,
    /// The options that reach this host's deploy folder again (`--host`, `--dir`, the
    /// ssh options given), for the commands a message names.
    pub again: Vec<String>,
    pub dry_run: bool,
}

/// How to run the preflight.
#[derive(Debug, Clone, Copy)]
pub struct PreflightPlan {
    pub min_free_mib: u64,
    pub timeout: Duration,
    /// Whether the GPU, driver and library checks run (`--no-gpu-checks` skips them).
    pub gpu_checks: bool,
}

/// How to run the job, and where its results go.
#[derive(Debug, Clone)]
pub struct JobPlan<'a> {
    pub args: &'a [String],
    pub timeout: Duration,
    /// `<fetch-to>/<host>`: the run's results go to `<release>/<run>/` under it.
    pub results_root: PathBuf,
    /// The command that started the run (`deploy`, `run`), for its record.
    pub command: &'static str,
    /// Start the job and return (`--detach`).
    pub detach: bool,
    /// A Ctrl-C leaves the job running (`--keep-running-on-interrupt`).
    pub keep_running: bool,
    /// `--fetch-to DIR` when it is not the default, for the `attach` a message names.
    pub fetch_to: Vec<String>,
}

/// What [`Session::prepare`] found on the host.
#[derive(Debug, Default)]
pub struct HostState {
    /// The releases folder's absolute path on the host (`pwd -P`).
    pub releases: Option<String>,
    /// The release `current` points at.
    pub current: Option<String>,
    /// Whether this deploy's release is there already.
    pub present: bool,
    /// What an interrupted upload of this release left to resume: bytes, files.
    pub resumable: Option<(u64, usize)>,
}

/// What [`Session::check_release`] found.
#[derive(Debug)]
pub enum Check {
    Verified {
        files: usize,
    },
    /// How it differs from its manifest or its name.
    Damaged(Vec<String>),
}

/// How a run of the job went (the job's own failure is not an error of the deploy
/// until its results are fetched).
#[derive(Debug)]
pub struct JobRun {
    pub results: PathBuf,
    pub failed: Option<DeployError>,
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
    pub fn prepare(&self, release: &str) -> Result<HostState> {
        step("prepare the deploy folder");
        let args = [self.layout.dir.clone(), release.to_string()];
        let outcome = self.quick(&PREPARE, &args).run(self.dry_run)?;
        let disk = self.disk("the release", &self.layout.dir);
        let Some(o) = expect_success(&self.ssh, outcome, "preparing the deploy folder", disk)?
        else {
            return Ok(HostState::default());
        };
        let mut state = HostState::default();
        let mut removed = Vec::new();
        for line in o.stdout.lines() {
            if let Some(rest) = line.strip_prefix("stale ") {
                let (bytes, name) = rest.split_once(' ').unwrap_or(("0", rest));
                removed.push((bytes.parse().unwrap_or(0), name.to_string()));
            } else if let Some(name) = line.strip_prefix("unremovable ") {
                eprintln!(
                    "warning: could not remove releases/{name}, left by a failed upload: \
                     `cargo xtask deploy clean` tries again"
                );
            } else if let Some(rest) = line.strip_prefix("incoming ") {
                let mut words = rest.split(' ').map(|w| w.parse().unwrap_or(0));
                let bytes = words.next().unwrap_or(0);
                let files = words.next().unwrap_or(0);
                state.resumable = Some((bytes, files as usize));
            } else if let Some(path) = line.strip_prefix("releases ") {
                state.releases = Some(path.to_string()).filter(|p| p.starts_with('/'));
            } else if let Some(target) = line.strip_prefix("current ") {
                state.current = remote::current_release(target).map(String::from);
            } else if line == "present" {
                state.present = true;
            }
        }
        say_removed(&removed, "left by failed uploads");
        Ok(state)
    }

    /// rsync into this deploy's own upload folder. Files the release `current` points
    /// at holds already are copied from there on the host (`--copy-dest`: copies, never
    /// links), so only the others travel; `--checksum` compares their content. `state`
    /// is what [`Session::prepare`] found.
    ///
    /// The upload folder is the release's own, so what an interrupted upload sent is
    /// kept: `--checksum` skips the files there whole, `--partial-dir` keeps a file cut
    /// off midway and continues it, and `--delete` drops what the bundle no longer holds.
    /// `bwlimit` (KiB/s) is rsync's `--bwlimit`.
    pub fn copy(
        &self,
        bundle: &Path,
        release: &str,
        state: &HostState,
        bwlimit: Option<u32>,
    ) -> Result<()> {
        step("copy the bundle");
        let incoming = self.upload_dir(release);
        if let Some((bytes, files)) = state.resumable {
            eprintln!(
                "resuming the upload an interrupted deploy left in releases/{}: {files} files, \
                 {} there already",
                Layout::upload(release),
                human_bytes(bytes)
            );
        }
        let mut options = vec![
            "--checksum".to_string(),
            "--itemize-changes".into(),
            "--stats".into(),
            "--delete".into(),
            format!("--partial-dir={}", remote::PARTIAL_DIR),
            RSYNC_IO_TIMEOUT.into(),
        ];
        if let Some(kib) = bwlimit {
            options.push(format!("--bwlimit={kib}"));
        }
        // By its absolute path: rsync 3.4.3 and the distributions' backports of its CVE
        // fixes (Debian 12's 3.2.7-1+deb12u5 among them) discard every file received
        // against a relative basis over ssh ("failed verification -- update discarded",
        // RsyncProject/rsync#928). With no path from the host, no basis: every file travels.
        if let (Some(releases), Some(current)) = (&state.releases, &state.current) {
            options.push(format!("--copy-dest={releases}/{current}"));
        }
        let options: Vec<&str> = options.iter().map(String::as_str).collect();
        let copy = self.ssh.rsync(
            &options,
            &[format!("{}/", bundle.display())],
            &self.ssh.remote(&format!("{incoming}/")),
        );
        let outcome = Remote::new(copy).show(files_shown()).run(self.dry_run)?;
        let disk = self.disk("the bundle", &incoming);
        let Some(o) = expect_success(&self.ssh, outcome, "copying the bundle", disk)? else {
            return Ok(());
        };
        let (sent, on_host) = itemized(&o.stdout);
        let data = sent_data(&o.stdout);
        let files = if on_host == 0 {
            format!("{sent} files sent")
        } else {
            format!(
                "{} files: {sent} sent, {on_host} copied on the host from the live release",
                sent + on_host
            )
        };
        eprintln!(
            "{files}; {} travelled{}",
            human_bytes(data.literal),
            if data.matched > 0 {
                format!(
                    " ({} more was on the host already)",
                    human_bytes(data.matched)
                )
            } else {
                String::new()
            }
        );
        Ok(())
    }

    /// The host's hashes of every file under `folder`, and the folder's own manifest
    /// (empty if it has none; an error, in words, if it cannot be read). `None` in a dry
    /// run.
    fn hashes(&self, folder: &str) -> Result<Option<(Manifest, Result<Manifest, String>)>> {
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
        let own = Manifest::parse(own).map_err(|e| format!("{}: {e}", manifest::FILE));
        Ok(Some((found, own)))
    }

    /// Hashes every file of the upload on the host and compares with `expected`.
    pub fn verify(&self, release: &str, expected: Option<&Manifest>) -> Result<()> {
        step("verify the checksums on the host");
        let incoming = self.upload_dir(release);
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
    pub fn check_release(&self, release: &str) -> Result<Check> {
        let Some((found, own)) = self.hashes(&self.layout.release_dir(release))? else {
            return Ok(Check::Verified { files: 0 });
        };
        let own = match own {
            Ok(own) => own,
            Err(unreadable) => return Ok(Check::Damaged(vec![unreadable])),
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
        let carries_hash =
            named.len() == RELEASE_HASH_DIGITS && named.bytes().all(|b| b.is_ascii_hexdigit());
        if why.is_empty() && !carries_hash {
            why.push(format!(
                "its name: expected it to end in the {RELEASE_HASH_DIGITS} hex digits of its \
                 content's hash (a release a deploy made), found `{release}`"
            ));
        } else if why.is_empty() && !content.starts_with(named) {
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
            .script(&STOP, &[pidfile.to_string(), "20".into(), String::new()])
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
    pub fn preflight(&self, from: &str, plan: PreflightPlan) -> Result<()> {
        step("preflight on the host");
        let mut command = vec!["bash".to_string(), format!("{from}/{PREFLIGHT_SH}")];
        if !plan.gpu_checks {
            command.push(NO_GPU_CHECKS.to_string());
        }
        command.extend([self.layout.dir.clone(), plan.min_free_mib.to_string()]);
        let pidfile = self.layout.pidfile(&format!("preflight-{}", self.run));
        let outcome = self.guarded(&pidfile, plan.timeout, "", &command)?;
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
            || timeout_status(&outcome, plan.timeout);
        if let Some(Stop::Interrupted(signal)) = outcome.stop {
            return Err(interrupted(signal, "the preflight", &self.host).into());
        }
        Err(match self.ssh.classify(&outcome.stderr, None) {
            None if timed_out => DeployError::PreflightTimedOut {
                host: self.host.clone(),
                seconds: plan.timeout.as_secs(),
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

    /// Gives the checked upload (if `uploaded`) its release's name and, unless the event
    /// is `staged`, points `current` at the release; either way a line in `history`.
    pub fn place(&self, release: &str, uploaded: bool, event: &str) -> Result<()> {
        step(if event == "staged" {
            "keep the release (`current` stays)"
        } else {
            "switch `current`"
        });
        let args = [
            self.layout.dir.clone(),
            release.to_string(),
            if uploaded {
                Layout::upload(release)
            } else {
                String::new()
            },
            Layout::aside(release, &self.run),
            event.to_string(),
            self.by.clone(),
        ];
        let outcome = self.quick(&PLACE, &args).run(self.dry_run)?;
        let disk = self.disk("the release", &self.layout.dir);
        if let Some(outcome) = expect_success(&self.ssh, outcome, "switching `current`", disk)? {
            eprint!("{}", outcome.stdout);
        }
        Ok(())
    }

    /// The upload folder of `release`.
    pub fn upload_dir(&self, release: &str) -> String {
        self.layout.release_dir(&Layout::upload(release))
    }

    /// What the deploy folder holds (see [`INSPECT`]). `None` in a dry run.
    pub fn inspect(&self) -> Result<Option<Report>> {
        let outcome = self
            .quick(&INSPECT, std::slice::from_ref(&self.layout.dir))
            .run(self.dry_run)?;
        let Some(o) = expect_success(&self.ssh, outcome, "reading the deploy folder", None)? else {
            return Ok(None);
        };
        Ok(Some(Report::parse(&o.stdout)))
    }

    /// The results folder of run `run` of `release` into `results`, and its record, log
    /// and exit file beside it.
    pub fn fetch_job(&self, release: &str, run: &str, results: &Path) -> Result<()> {
        step("fetch the results");
        ssh::echo(format!("mkdir -p {}", results.display()));
        if !self.dry_run {
            fs::create_dir_all(results)
                .with_context(|| format!("could not create {}", results.display()))?;
        }
        let mut from = vec![
            self.ssh
                .remote(&format!("{}/", self.layout.run_dir(release, run))),
        ];
        let fetch = self.ssh.rsync(
            &["--itemize-changes", RSYNC_IO_TIMEOUT],
            &from,
            &format!("{}/", results.display()),
        );
        let outcome = Remote::new(fetch).show(files_shown()).run(self.dry_run)?;
        let here = results.display().to_string();
        let disk = Some(Disk {
            host: ssh::HERE,
            what: "the results",
            place: &here,
        });
        let fetched = expect_success(&self.ssh, outcome, "fetching the results", disk)?;
        if let Some(o) = fetched.filter(|_| !ssh::verbose()) {
            let (files, _) = itemized(&o.stdout);
            eprintln!("{files} files fetched");
        }
        // The record, the log and the exit file, beside the results folder.
        from.clear();
        for ext in ["json", "log", "exit"] {
            from.push(self.ssh.remote(&self.layout.run_file(release, run, ext)));
        }
        let parent = results.parent().unwrap_or(results);
        let records = self.ssh.rsync(
            &["--ignore-missing-args", RSYNC_IO_TIMEOUT],
            &from,
            &format!("{}/", parent.display()),
        );
        let outcome = Remote::new(records).run(self.dry_run)?;
        expect_success(&self.ssh, outcome, "fetching the run's record", None).map(drop)
    }
}

/// The shared ssh connection: opened once, closed (and its socket's folder removed) when
/// dropped, whichever way the deploy ends.
pub struct Connection {
    ssh: Ssh,
    dry_run: bool,
}

impl Connection {
    pub fn open(ssh: &Ssh, dry_run: bool) -> Result<Connection> {
        let socket = ssh
            .control
            .as_ref()
            .expect("a deploy shares one connection");
        let folder = socket
            .parent()
            .expect("the socket is in a folder of its own");
        ssh::echo(format!("mkdir -m 700 {}", folder.display()));
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
pub fn control_dir() -> PathBuf {
    let name = format!("stepgraph-ssh-{}", std::process::id());
    let tmp = std::env::temp_dir();
    if tmp.as_os_str().len() + name.len() < 80 {
        tmp.join(name)
    } else {
        Path::new("/tmp").join(name)
    }
}

/// rsync's list of the files it moved (`--itemize-changes`) is shown with `--verbose`;
/// by default a line of counts ([`itemized`]) stands for it.
fn files_shown() -> Show {
    if ssh::verbose() {
        Show::Stream
    } else {
        Show::Quiet
    }
}

/// From rsync's `--itemize-changes`: how many files travelled (`<f…`, `>f…`) and how
/// many were copied on the receiving side from a `--copy-dest` (`cf…`).
fn itemized(stdout: &str) -> (usize, usize) {
    let mut sent = 0;
    let mut copied = 0;
    for line in stdout.lines() {
        match line.as_bytes() {
            [b'<' | b'>', b'f', ..] => sent += 1,
            [b'c', b'f', ..] => copied += 1,
            _ => {}
        }
    }
    (sent, copied)
}

/// What rsync's `--stats` says of the file data: `literal` is what travelled, `matched`
/// what the receiver had already (a file cut off midway, continued).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SentData {
    pub literal: u64,
    pub matched: u64,
}

/// Reads `Literal data: 1,234 bytes` and `Matched data: ...` from rsync's `--stats`
/// (digits grouped or not); 0 for what is missing.
fn sent_data(stdout: &str) -> SentData {
    let number = |label: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .map(|rest| {
                let digits: String = rest
                    .trim()
                    .split(' ')
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .filter(char::is_ascii_digit)
                    .collect();
                digits.parse().unwrap_or(0)
            })
            .unwrap_or(0)
    };
    SentData {
        literal: number("Literal data:"),
        matched: number("Matched data:"),
    }
}

/// `bytes` for people: `512 B`, `1.5 KiB`, `767.0 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Says what [`REMOVE`](super::remote::REMOVE) or [`PREPARE`] removed (`(bytes,
/// name)`s, of folders in `releases/`), each with its size and their total, `why` they
/// were there.
pub fn say_removed(removed: &[(u64, String)], why: &str) {
    if removed.is_empty() {
        return;
    }
    for (bytes, name) in removed {
        eprintln!("removed releases/{name} ({})", human_bytes(*bytes));
    }
    let total: u64 = removed.iter().map(|(b, _)| b).sum();
    eprintln!(
        "freed {} on the host: {} folders {why}",
        human_bytes(total),
        removed.len()
    );
}

/// The one line a step shows by default (with `--verbose`, a blank line first sets it
/// apart from the commands of the one before).
pub fn step(what: &str) {
    if ssh::verbose() {
        eprintln!();
    }
    eprintln!("== {what}");
}

/// `Ok(outcome)` when the run succeeded (or was not run: a dry run), else the
/// [`failure`].
pub fn expect_success(
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
pub fn failure(ssh: &Ssh, o: Outcome, step: &'static str, disk: Option<Disk<'_>>) -> DeployError {
    ssh.classify(&o.stderr, disk)
        .unwrap_or_else(|| DeployError::Step {
            step,
            host: ssh.target.to_string(),
            status: ssh::describe(o.status),
            stderr: o.stderr,
        })
}

/// The error for a step stopped by a signal; the guards' `Drop`s clean up as it unwinds.
pub fn interrupted(signal: &'static str, step: &'static str, host: &str) -> DeployError {
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

/// Now, in Unix seconds.
pub fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsync_s_itemized_list_is_counted() {
        let out = "cd+++++++++ ./\n<fcst...... preflight.sh\ncf..t...... bin/job\n\
                   >f+++++++++ table.csv\ncL+++++++++ lib -> x\n";
        assert_eq!(itemized(out), (2, 1));
        assert_eq!(itemized(""), (0, 0));
    }

    #[test]
    fn rsync_s_stats_give_the_data_that_travelled() {
        let out = "Number of files: 7 (reg: 5, dir: 2)\n\
                   Total transferred file size: 4,194,910 bytes\n\
                   Literal data: 1,572,864 bytes\n\
                   Matched data: 2,622,046 bytes\n";
        assert_eq!(
            sent_data(out),
            SentData {
                literal: 1_572_864,
                matched: 2_622_046
            }
        );
        assert_eq!(sent_data("Literal data: 12 bytes\n").literal, 12);
        assert_eq!(sent_data(""), SentData::default());
    }

    #[test]
    fn sizes_are_said_in_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(767 * 1024 * 1024), "767.0 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
