//! ssh and rsync to one host: their argument lists, running them with their output shown
//! and kept, and turning their failures into [`DeployError`]s.
//!
//! The one place a shell string is unavoidable is the command ssh hands to the remote
//! shell: it is built from words, each quoted with [`cmd::quote`], and the logic that
//! needs more than a word list runs as a fixed script fed to `bash -s` (or passed to
//! `bash -c`, when what it runs keeps stdin) with its values passed as quoted arguments,
//! never pasted into the script.
//!
//! Every run is bounded ([`Remote::limit`]) and watches for Ctrl-C ([`crate::interrupt`]);
//! a run stopped early first stops what it started on the host ([`Remote::on_stop`]).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::error::DeployError;
use super::remote::Script;
use super::target::Target;
use crate::cmd;
use crate::interrupt::{self, Waited};

/// Whether every command is echoed before it runs (`--verbose`, and a dry run, which
/// shows them instead of running them). Set once, before the first command, by the
/// command line; a flag of the process rather than a field of every type that runs
/// something, since it is one choice of the user's for the whole command.
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Turns the echo of every command on (`--verbose`, `--dry-run`) or off (one line a step).
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

pub fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// `$ <command>`, with `--verbose` (or in a dry run) only: by default a deploy shows
/// its steps, not the ssh commands that make them up.
pub fn echo(command: impl std::fmt::Display) {
    if verbose() {
        eprintln!("$ {command}");
    }
}

/// How much of each output stream a run keeps (the end of it).
const KEPT_BYTES: usize = 1 << 20;

/// How to reach the host.
#[derive(Debug, Clone)]
pub struct Ssh {
    pub target: Target,
    /// `-i`: the private key (only that key is offered). `None`: ssh's defaults.
    pub key: Option<PathBuf>,
    /// `UserKnownHostsFile`: where host keys are recorded. `None`: ssh's default.
    pub known_hosts: Option<PathBuf>,
    pub connect_timeout_s: u32,
    /// `ControlPath`: the socket of the one connection every command shares (see
    /// [`Ssh::connect`]). `None`: each command connects on its own.
    pub control: Option<PathBuf>,
    /// `-F`: the ssh config file to read instead of ssh's own (`--ssh-config`).
    pub config: Option<PathBuf>,
    /// Where ssh will really connect, as `ssh -G` says once [`Ssh::resolve`] ran (an
    /// alias of the ssh config may name another host, port and user).
    pub resolved: Option<Resolved>,
}

/// The host, port and user ssh will use for a target (`ssh -G`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub hostname: String,
    pub port: u16,
    pub user: String,
}

impl Resolved {
    /// `ssh -G`'s output: one `keyword value` line per option.
    pub fn parse(text: &str) -> Option<Resolved> {
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .map(str::trim)
        };
        Some(Resolved {
            hostname: value("hostname")?.to_string(),
            port: value("port")?.parse().ok()?,
            user: value("user").unwrap_or_default().to_string(),
        })
    }
}

/// How long a shared connection outlives its last use if `ssh -O exit` never comes
/// (the deploy was killed outright). Long enough for the gaps between steps; a deploy's
/// lock holds a session open through its long steps (the build, the job).
const CONTROL_PERSIST_S: u32 = 30;

/// Keepalives: a host that stops answering is given up after about a minute
/// (`ServerAliveInterval` times `ServerAliveCountMax`), rather than after TCP's hours.
pub const SERVER_ALIVE_INTERVAL_S: u32 = 15;
pub const SERVER_ALIVE_COUNT_MAX: u32 = 4;

/// Where a full disk would be, for [`DeployError::DiskFull`]: on which machine, what
/// needed the room and in which folder.
#[derive(Debug, Clone, Copy)]
pub struct Disk<'a> {
    pub host: &'a str,
    pub what: &'static str,
    pub place: &'a str,
}

/// Whether a run's output is shown as it comes or only kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    Quiet,
    Stream,
}

/// What a finished run left: its status and the end of each output stream.
#[derive(Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// Why it was stopped early, if it was.
    pub stop: Option<Stop>,
    /// How long it ran.
    pub elapsed: Duration,
}

impl Outcome {
    /// The last `n` non-empty lines of stdout.
    pub fn tail(&self, n: usize) -> Vec<String> {
        let lines: Vec<&str> = self
            .stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| l.to_string())
            .collect()
    }
}

impl Ssh {
    /// The options every ssh connection takes: no prompts (a refused key is an error,
    /// not a password question), new host keys accepted and recorded, changed ones
    /// refused, a bounded wait for the connection, and only errors from ssh itself.
    ///
    /// With a control socket, `master` says whether this command opens the shared
    /// connection or uses it (ssh keeps the first value given for an option, so the two
    /// cannot be appended to one another).
    fn options(&self, master: bool) -> Vec<String> {
        let mut opts: Vec<String> = Vec::new();
        if let Some(config) = &self.config {
            opts.extend(["-F".into(), config.display().to_string()]);
        }
        opts.extend(
            [
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=accept-new",
                "-o",
                "LogLevel=ERROR",
            ]
            .map(String::from),
        );
        opts.extend([
            "-o".into(),
            format!("ConnectTimeout={}", self.connect_timeout_s),
            "-o".into(),
            format!("ServerAliveInterval={SERVER_ALIVE_INTERVAL_S}"),
            "-o".into(),
            format!("ServerAliveCountMax={SERVER_ALIVE_COUNT_MAX}"),
        ]);
        if let Some(port) = self.target.port {
            opts.extend(["-p".into(), port.to_string()]);
        }
        if let Some(key) = &self.key {
            opts.extend([
                "-i".into(),
                key.display().to_string(),
                "-o".into(),
                "IdentitiesOnly=yes".into(),
            ]);
        }
        if let Some(file) = &self.known_hosts {
            opts.extend([
                "-o".into(),
                format!("UserKnownHostsFile={}", file.display()),
            ]);
        }
        if let Some(socket) = &self.control {
            let mode = if master { "yes" } else { "no" };
            opts.extend([
                "-o".into(),
                format!("ControlPath={}", socket.display()),
                "-o".into(),
                format!("ControlMaster={mode}"),
            ]);
        }
        opts
    }

    /// `ssh … -o ControlMaster=yes -f -N -- user@host`: logs in once (where a refused
    /// connection or login shows first) and leaves the connection in the background for
    /// the other commands, which then skip the handshake. If it goes away they connect
    /// on their own.
    pub fn connect(&self) -> Command {
        let mut ssh = Command::new("ssh");
        ssh.args(self.options(true))
            .args([
                "-o",
                &format!("ControlPersist={CONTROL_PERSIST_S}"),
                "-f",
                "-N",
            ])
            .arg("--")
            .arg(self.target.login())
            .stdin(Stdio::null());
        ssh
    }

    /// `ssh -G … -- user@host`: prints the options ssh would use, the host, port and user
    /// among them, without connecting.
    pub fn query(&self) -> Command {
        let mut ssh = Command::new("ssh");
        ssh.args(self.options(false))
            .args(["-G", "--"])
            .arg(self.target.login())
            .stdin(Stdio::null());
        ssh
    }

    /// Asks ssh where it will connect (`ssh -G`), so that messages name that host and
    /// port, not the alias's defaults. Left unknown when ssh cannot say.
    pub fn resolve(&mut self) {
        let mut query = self.query();
        echo(cmd::display(&query));
        let Ok(out) = query.stderr(Stdio::null()).output() else {
            return;
        };
        if out.status.success() {
            self.resolved = Resolved::parse(&String::from_utf8_lossy(&out.stdout));
        }
        // Said when it is news: an alias of the ssh config, or --verbose.
        if let Some(r) = &self.resolved {
            let t = &self.target;
            let news = r.hostname != t.host
                || r.port != t.port_or_default()
                || t.user.as_ref().is_some_and(|u| *u != r.user);
            if news || verbose() {
                eprintln!(
                    "ssh will connect to {} port {} as {}",
                    r.hostname, r.port, r.user
                );
            }
        }
    }

    /// The host as messages name it: the target's, and the one ssh resolves it to when
    /// they differ (`gpu-box (10.0.0.7)`).
    pub fn host_label(&self) -> String {
        match &self.resolved {
            Some(r) if r.hostname != self.target.host => {
                format!("{} ({})", self.target.host, r.hostname)
            }
            _ => self.target.host.clone(),
        }
    }

    /// The port ssh will use.
    pub fn port(&self) -> u16 {
        self.resolved
            .as_ref()
            .map_or_else(|| self.target.port_or_default(), |r| r.port)
    }

    /// `ssh -O exit`: closes the shared connection.
    pub fn disconnect(&self) -> Command {
        let mut ssh = Command::new("ssh");
        ssh.args(self.options(false))
            .args(["-O", "exit", "--"])
            .arg(self.target.login())
            .stdin(Stdio::null());
        ssh
    }

    /// `ssh … -- user@host '<words, quoted>'`: the remote shell runs `words` as one
    /// command. stdin is closed: nothing remote reads the terminal.
    pub fn exec(&self, words: &[String]) -> Command {
        let mut ssh = Command::new("ssh");
        ssh.args(self.options(false))
            .arg("--")
            .arg(self.target.login())
            .arg(cmd::quote_words(words))
            .stdin(Stdio::null());
        ssh
    }

    /// `ssh … -- user@host 'bash -s -- <args>'`, fed `script` on stdin.
    pub fn script<'a>(&self, script: &'static Script, args: &[String]) -> Remote<'a> {
        let mut words = vec!["bash".to_string(), "-s".into(), "--".into()];
        words.extend(args.iter().cloned());
        let mut ssh = self.exec(&words);
        ssh.stdin(Stdio::piped());
        let mut remote = Remote::new(ssh);
        remote.script = Some(script);
        remote.feed = true;
        remote
    }

    /// `ssh … -- user@host 'bash -c <script> <name> <args>'`: for a script that leaves
    /// stdin to what it runs. The echo names the script rather than spelling it out.
    pub fn inline<'a>(&self, script: &'static Script, args: &[String]) -> Remote<'a> {
        let mut words = vec![
            "bash".to_string(),
            "-c".into(),
            script.text.into(),
            format!("stepgraph-{}", script.name),
        ];
        words.extend(args.iter().cloned());
        let mut remote = Remote::new(self.exec(&words));
        // A plain word, which no quoting dresses up.
        words[2] = format!("@{}-script@", script.name);
        remote.shown = cmd::display(&self.exec(&words));
        remote.script = Some(script);
        remote
    }

    /// `rsync -a -e '<ssh …>' <extra> <from> <to>`; one of `from` and `to` is
    /// [`Ssh::remote`].
    pub fn rsync(&self, extra: &[&str], from: &[String], to: &str) -> Command {
        let mut shell = vec!["ssh".to_string()];
        shell.extend(self.options(false));
        let mut rsync = Command::new("rsync");
        rsync
            .arg("-a")
            .args(extra)
            .arg("-e")
            // rsync splits this itself, honouring the same quotes.
            .arg(cmd::quote_words(&shell))
            .args(from)
            .arg(to)
            .stdin(Stdio::null());
        rsync
    }

    /// `user@host:path` for rsync.
    pub fn remote(&self, path: &str) -> String {
        format!("{}:{path}", self.target.rsync_login())
    }

    /// What the login was expected to accept, for [`DeployError::AuthRefused`].
    fn key_description(&self) -> String {
        match &self.key {
            Some(key) => format!("the key {}", key.display()),
            None => "one of ssh's default keys (~/.ssh/id_*, the agent; or pass --key)".into(),
        }
    }

    /// What to do about a key ssh would not use: `chmod` a key others can read, or pass
    /// the private key for a public one.
    fn key_hint(&self, stderr: &str) -> String {
        let key = self.key.as_ref().map(|k| k.display().to_string());
        let public = self.key.as_ref().is_some_and(|k| {
            k.extension().is_some_and(|e| e == "pub")
                || std::fs::read_to_string(k).is_ok_and(|t| {
                    let t = t.trim_start();
                    ["ssh-", "ecdsa-", "sk-"].iter().any(|p| t.starts_with(p))
                })
        });
        match key {
            Some(key) if public => {
                let private = key.strip_suffix(".pub").unwrap_or("the file without .pub");
                format!(
                    "{key} is a public key: --key takes the private key ({private}), whose .pub \
                     the host lists in its authorized_keys"
                )
            }
            Some(key) if stderr.contains("bad permissions") || stderr.contains("too open") => {
                format!("ssh uses a private key only its owner can read: `chmod 600 {key}`")
            }
            _ if stderr.contains("bad permissions") || stderr.contains("too open") => {
                "ssh uses a private key only its owner can read: `chmod 600` it".to_string()
            }
            _ => "check that --key names a private key ssh can read".to_string(),
        }
    }

    /// The error for a failed ssh or rsync run when its stderr says why: the connection
    /// or the login (ssh's own messages), a full `disk` (when the step names one), rsync
    /// missing on the host. `None` when it is none of those; the caller then names the
    /// step.
    pub fn classify(&self, stderr: &str, disk: Option<Disk<'_>>) -> Option<DeployError> {
        let line_with = |needles: &[&str]| {
            stderr
                .lines()
                .find(|l| needles.iter().any(|n| l.contains(n)))
                .map(|l| l.trim().to_string())
        };
        let host = self.host_label();
        let port = self.port();
        let unreachable = |found: String| DeployError::Unreachable {
            host: host.clone(),
            port,
            found,
        };
        if line_with(&["Connection refused"]).is_some() {
            return Some(unreachable(
                "the connection refused (nothing listens there)".into(),
            ));
        }
        if let Some(l) = line_with(&["timed out"]) {
            return Some(unreachable(format!(
                "no answer within {}s (`{l}`)",
                self.connect_timeout_s
            )));
        }
        if let Some(l) = line_with(&["No route to host", "Network is unreachable"]) {
            return Some(unreachable(format!("no route to it (`{l}`)")));
        }
        if let Some(l) = line_with(&[
            "Could not resolve hostname",
            "Name or service not known",
            "Temporary failure in name resolution",
        ]) {
            return Some(unreachable(format!("a name that does not resolve (`{l}`)")));
        }
        if let Some(l) = line_with(&["kex_exchange_identification", "Connection closed by"]) {
            return Some(unreachable(format!(
                "something that closed the connection before ssh could log in (`{l}`)"
            )));
        }
        // ssh's own reason for not offering a key comes before the refusal it causes.
        let key_lines: Vec<String> = stderr
            .lines()
            .map(str::trim)
            .filter(|l| {
                l.starts_with("Permissions ")
                    || l.starts_with("Load key ")
                    || l.contains("UNPROTECTED PRIVATE KEY FILE")
            })
            .map(String::from)
            .collect();
        let refusal = stderr.lines().map(str::trim).find(|l| is_login_refusal(l));
        if !key_lines.is_empty() && refusal.is_some() {
            return Some(DeployError::KeyUnusable {
                key: self.key_description(),
                found: key_lines.join("\n  "),
                hint: self.key_hint(stderr),
            });
        }
        if let Some(l) = refusal {
            return Some(DeployError::AuthRefused {
                login: self.target.login(),
                key: self.key_description(),
                found: l.to_string(),
            });
        }
        if let Some(l) = line_with(&["Host key verification failed", "IDENTIFICATION HAS CHANGED"])
        {
            return Some(DeployError::HostKeyChanged {
                host,
                known_hosts: self
                    .known_hosts
                    .as_ref()
                    .map_or("~/.ssh/known_hosts".into(), |p| p.display().to_string()),
                found: l,
            });
        }
        // Past the login: a "Permission denied" now is the file system's (rsync's
        // `Permission denied (13)`, a shell's `mkdir: … Permission denied`).
        if let Some(l) = line_with(&["Permission denied", "Read-only file system"]) {
            return Some(self.permission_denied(&l, disk));
        }
        if let Some(disk) = disk
            && let Some(l) = line_with(&["No space left on device"])
        {
            return Some(DeployError::DiskFull {
                host: disk.host.to_string(),
                what: disk.what,
                place: disk.place.to_string(),
                found: l,
            });
        }
        if let Some(l) = line_with(&["rsync: command not found", "rsync: not found"]) {
            return Some(DeployError::RsyncMissingOnHost { host, found: l });
        }
        None
    }
}

impl Ssh {
    /// The error for a file system's refusal, `line`: on the host, or here. rsync marks
    /// its sender's messages `[sender]` (reading), the others are its receiver's
    /// (writing); `disk` says which side receives (here for the fetch, [`HERE`]).
    fn permission_denied(&self, line: &str, disk: Option<Disk<'_>>) -> DeployError {
        let reading = line.contains("[sender]");
        let here = disk.is_some_and(|d| d.host == HERE) != reading;
        let path = denied_path(line)
            .or_else(|| disk.map(|d| d.place.to_string()))
            .unwrap_or_else(|| "the deploy folder".to_string());
        let (host, who) = if here {
            (HERE.to_string(), "this user".to_string())
        } else {
            let who = match &self.resolved {
                Some(r) if !r.user.is_empty() => format!("the user {}", r.user),
                _ => format!("the login {}", self.target.login()),
            };
            let host = match disk {
                Some(d) if d.host != HERE => d.host.to_string(),
                _ => self.host_label(),
            };
            (host, who)
        };
        DeployError::PermissionDenied {
            host,
            who,
            access: if reading { "read" } else { "write" },
            path,
            found: line.to_string(),
            here,
        }
    }
}

/// What [`Disk::host`] says for this machine (where results are fetched to).
pub const HERE: &str = "this machine";

/// Whether `line` is ssh's refusal of the login, `Permission denied (publickey,password).`:
/// the methods it would take in parentheses, not an errno (rsync's `Permission denied
/// (13)` on the host is no refused key).
fn is_login_refusal(line: &str) -> bool {
    let Some((_, rest)) = line.split_once("Permission denied (") else {
        return false;
    };
    let Some((methods, _)) = rest.split_once(')') else {
        return false;
    };
    methods.bytes().any(|b| b.is_ascii_lowercase())
        && methods
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'-' || b == b',' || b == b'@' || b == b'.')
}

/// The path a file system's refusal names: the first quoted one (rsync's `mkdir "/d/x"
/// failed`, coreutils' `cannot create directory '/d/x'`), else the word before `:
/// Permission denied` (bash's `line 4: /d/.lock: Permission denied`).
fn denied_path(line: &str) -> Option<String> {
    for (open, close) in [('"', '"'), ('\'', '\''), ('‘', '’')] {
        if let Some((_, rest)) = line.split_once(open)
            && let Some((path, _)) = rest.split_once(close)
            && !path.is_empty()
        {
            return Some(path.to_string());
        }
    }
    let (before, _) = line
        .split_once(": Permission denied")
        .or_else(|| line.split_once(": Read-only file system"))?;
    let path = before.rsplit(": ").next()?.trim();
    (!path.is_empty()).then(|| path.to_string())
}

/// What a run waits for: at most `limit`, and the way it stops early.
pub struct Remote<'a> {
    cmd: Command,
    /// The echo: the command as a reader would type it, a script shown by name.
    shown: String,
    /// A script fed to `bash -s` on stdin (`feed`), or passed inline to `bash -c`.
    script: Option<&'static Script>,
    feed: bool,
    show: Show,
    limit: Option<Duration>,
    interruptible: bool,
    on_stop: Option<&'a dyn Fn()>,
}

impl std::fmt::Debug for Remote<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("shown", &self.shown)
            .finish()
    }
}

/// How long a child is given to end by itself once its remote side was stopped, before
/// it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Why a run ended before its command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Its limit passed.
    TimedOut(Duration),
    /// SIGINT or SIGTERM asked the deploy to stop.
    Interrupted(&'static str),
}

impl<'a> Remote<'a> {
    /// Any command, run in a process group of its own (so that a Ctrl-C reaches only
    /// xtask, which stops the remote side first) with its output kept.
    pub fn new(mut cmd: Command) -> Remote<'a> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        Remote {
            shown: cmd::display(&cmd),
            cmd,
            script: None,
            feed: false,
            show: Show::Quiet,
            limit: None,
            interruptible: true,
            on_stop: None,
        }
    }

    pub fn show(mut self, show: Show) -> Self {
        self.show = show;
        self
    }

    /// Stops the run when `limit` passes.
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Not stopped by a signal: the clean-up a signal asked for.
    pub fn uninterruptible(mut self) -> Self {
        self.interruptible = false;
        self
    }

    /// Called when the run is stopped early, before the local process is: stops what it
    /// started on the host.
    pub fn on_stop(mut self, f: &'a dyn Fn()) -> Self {
        self.on_stop = Some(f);
        self
    }

    /// Echoes the command with `--verbose` (with its script as a here-document in a dry
    /// run, or named otherwise) and, unless it is a dry run, runs it: the script on its
    /// stdin if fed, its output shown as it comes (`Show::Stream`) or only kept. `None`
    /// in a dry run.
    pub fn run(mut self, dry_run: bool) -> Result<Option<Outcome>> {
        match self.script {
            Some(s) if dry_run && self.feed => {
                echo(format!("{} <<'EOF'\n{}EOF", self.shown, s.text))
            }
            Some(s) if dry_run => echo(format!(
                "{}\n  (the {} script, passed to `bash -c`:)\n{}",
                self.shown, s.name, s.text
            )),
            Some(s) if self.feed => echo(format!("{} <<'EOF' (the {} script)", self.shown, s.name)),
            _ => echo(&self.shown),
        }
        if dry_run {
            return Ok(None);
        }
        let started = Instant::now();
        let mut child = self
            .cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start `{}`", self.shown))?;
        let stream = self.show == Show::Stream;
        let out = child.stdout.take().expect("stdout is piped");
        let err = child.stderr.take().expect("stderr is piped");
        let out = thread::spawn(move || keep(out, stream.then(std::io::stdout)));
        let err = thread::spawn(move || keep(err, stream.then(std::io::stderr)));
        // Written once the readers run, so a chatty command cannot block us both.
        if let Some(s) = self.script.filter(|_| self.feed) {
            let mut stdin = child.stdin.take().expect("stdin is piped for a script");
            // A broken pipe means ssh ended early (it could not connect); its stderr says why.
            let _ = stdin.write_all(s.text.as_bytes());
        }
        let deadline = self.limit.map(|l| started + l);
        let (status, stop) = match interrupt::wait(&mut child, deadline, self.interruptible)? {
            Waited::Exited(status) => (status, None),
            Waited::TimedOut => {
                let limit = self.limit.expect("only a limit times out");
                (self.stop(&mut child)?, Some(Stop::TimedOut(limit)))
            }
            Waited::Interrupted(signal) => {
                (self.stop(&mut child)?, Some(Stop::Interrupted(signal)))
            }
        };
        let stdout = out.join().expect("the stdout reader does not panic")?;
        let stderr = err.join().expect("the stderr reader does not panic")?;
        Ok(Some(Outcome {
            status,
            stdout,
            stderr,
            stop,
            elapsed: started.elapsed(),
        }))
    }

    fn stop(&self, child: &mut std::process::Child) -> Result<ExitStatus> {
        if let Some(f) = self.on_stop {
            f();
        }
        Ok(interrupt::stop(child, STOP_GRACE)?)
    }
}

/// Reads `from` to its end, passing each chunk on to `to` at once (no waiting for a
/// line: progress output shows as it comes) and keeping the last [`KEPT_BYTES`].
fn keep(mut from: impl Read, mut to: Option<impl Write>) -> std::io::Result<String> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(to) = &mut to {
            // The terminal going away must not stop the run; the output is kept anyway.
            let _ = to.write_all(&buf[..n]).and_then(|()| to.flush());
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > 2 * KEPT_BYTES {
            kept.drain(..kept.len() - KEPT_BYTES);
        }
    }
    Ok(String::from_utf8_lossy(&kept).into_owned())
}

/// An exit status as words: `exit status 3`, `signal 9`.
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ssh(key: Option<&str>) -> Ssh {
        Ssh {
            target: "root@127.0.0.1:2222".parse().unwrap(),
            key: key.map(PathBuf::from),
            known_hosts: Some("/tmp/kh".into()),
            connect_timeout_s: 5,
            control: None,
            config: None,
            resolved: None,
        }
    }

    #[test]
    fn ssh_g_says_where_ssh_connects() {
        let r = Resolved::parse("user root\nhostname 127.0.0.1\nport 2301\naddkeystoagent false\n")
            .unwrap();
        assert_eq!(r.hostname, "127.0.0.1");
        assert_eq!((r.port, r.user.as_str()), (2301, "root"));
        let s = Ssh {
            target: "gpu".parse().unwrap(),
            resolved: Some(r),
            ..ssh(None)
        };
        assert_eq!(s.host_label(), "gpu (127.0.0.1)");
        assert_eq!(s.port(), 2301);
        let msg = s
            .classify(
                "ssh: connect to host 127.0.0.1 port 2301: Connection refused",
                None,
            )
            .unwrap()
            .to_string();
        assert!(
            msg.starts_with("cannot reach gpu (127.0.0.1): expected an ssh server on port 2301"),
            "{msg}"
        );
    }

    #[test]
    fn a_key_ssh_would_not_use_keeps_ssh_s_reason() {
        let s = ssh(Some("/k/id"));
        let stderr = "@@@@@@@@@@@\n@         WARNING: UNPROTECTED PRIVATE KEY FILE!          @\n\
            Permissions 0644 for '/k/id' are too open.\n\
            Load key \"/k/id\": bad permissions\n\
            root@127.0.0.1: Permission denied (publickey).\n";
        let msg = s.classify(stderr, None).unwrap().to_string();
        assert!(
            msg.contains("Permissions 0644 for '/k/id' are too open."),
            "{msg}"
        );
        assert!(msg.contains("`chmod 600 /k/id`"), "{msg}");
        let public = ssh(Some("/k/id.pub"));
        let msg = public
            .classify(
                "Load key \"/k/id.pub\": error in libcrypto\nroot@h: Permission denied (publickey).",
                None,
            )
            .unwrap()
            .to_string();
        assert!(
            msg.contains("Load key \"/k/id.pub\": error in libcrypto"),
            "{msg}"
        );
        assert!(msg.contains("--key takes the private key (/k/id)"), "{msg}");
    }

    #[test]
    fn ssh_takes_options_then_the_login_then_one_quoted_line() {
        let cmd = ssh(Some("/k/id")).exec(&["ls".into(), "/a b".into()]);
        assert_eq!(
            cmd::display(&cmd),
            "ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o LogLevel=ERROR \
             -o ConnectTimeout=5 -o ServerAliveInterval=15 -o ServerAliveCountMax=4 -p 2222 -i /k/id -o IdentitiesOnly=yes \
             -o UserKnownHostsFile=/tmp/kh -- root@127.0.0.1 'ls '\\''/a b'\\'''"
        );
    }

    #[test]
    fn one_command_opens_the_shared_connection_and_the_others_use_it() {
        let s = Ssh {
            control: Some("/tmp/c/cm".into()),
            ..ssh(None)
        };
        let open = cmd::display(&s.connect());
        assert!(
            open.ends_with(
                "-o ControlPath=/tmp/c/cm -o ControlMaster=yes -o ControlPersist=30 -f -N \
                 -- root@127.0.0.1"
            ),
            "{open}"
        );
        let used = cmd::display(&s.exec(&["true".into()]));
        assert!(
            used.contains("-o ControlPath=/tmp/c/cm -o ControlMaster=no --"),
            "{used}"
        );
        assert!(!used.contains("ControlMaster=yes"), "{used}");
        let close = cmd::display(&s.disconnect());
        assert!(
            close.ends_with("ControlMaster=no -O exit -- root@127.0.0.1"),
            "{close}"
        );
    }

    #[test]
    fn rsync_gets_the_same_ssh_as_its_shell() {
        let s = ssh(None);
        let cmd = s.rsync(&["--delete"], &["b/".into()], &s.remote("d/releases/r/"));
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args[..3], ["-a", "--delete", "-e"]);
        assert!(args[3].starts_with("ssh -o BatchMode=yes"), "{}", args[3]);
        assert!(args[3].contains("-p 2222"), "{}", args[3]);
        assert_eq!(args[4..], ["b/", "root@127.0.0.1:d/releases/r/"]);
    }

    #[test]
    fn ssh_failures_are_named() {
        let s = ssh(Some("/k/id"));
        let disk = Disk {
            host: "127.0.0.1",
            what: "the bundle",
            place: "/d",
        };
        let msg = |stderr: &str| s.classify(stderr, Some(disk)).map(|e| e.to_string());
        assert_eq!(
            msg("ssh: connect to host 127.0.0.1 port 2222: Connection refused\r\n").unwrap(),
            "cannot reach 127.0.0.1: expected an ssh server on port 2222, found the connection \
             refused (nothing listens there)"
        );
        assert_eq!(
            msg("root@127.0.0.1: Permission denied (publickey).\n").unwrap(),
            "root@127.0.0.1 refused the login: expected it to accept the key /k/id, found \
             `root@127.0.0.1: Permission denied (publickey).`"
        );
        assert!(
            msg("ssh: Could not resolve hostname nohost: Name or service not known")
                .unwrap()
                .contains("a name that does not resolve")
        );
        assert!(
            msg("rsync: write failed on \"/d/x\": No space left on device (28)")
                .unwrap()
                .starts_with("the disk of 127.0.0.1 is full: expected room for the bundle in /d")
        );
        assert!(
            msg("bash: line 1: rsync: command not found")
                .unwrap()
                .contains("not installed")
        );
    }

    #[test]
    fn a_permission_denied_on_the_host_is_no_refused_key() {
        let s = ssh(Some("/k/id"));
        let disk = Disk {
            host: "h",
            what: "the bundle",
            place: "/d/releases/.incoming-r",
        };
        let rsync = "rsync: [Receiver] mkdir \"/d/releases/.incoming-r\" failed: Permission \
                     denied (13)\nrsync error: error in file IO (code 11) at main.c(800)\n";
        let msg = s.classify(rsync, Some(disk)).unwrap().to_string();
        assert!(
            msg.starts_with(
                "permission denied on h: expected the login root@127.0.0.1 to be allowed to \
                 write /d/releases/.incoming-r, found `rsync: [Receiver] mkdir"
            ),
            "{msg}"
        );
        assert!(
            msg.ends_with("`ls -ld /d/releases` there shows the owner and mode)"),
            "{msg}"
        );
        assert!(!msg.contains("refused the login"), "{msg}");
        assert!(!msg.contains("key"), "{msg}");
        let msg = s
            .classify(
                "mkdir: cannot create directory '/x': Permission denied",
                None,
            )
            .unwrap()
            .to_string();
        assert!(msg.contains("to be allowed to write /x, found"), "{msg}");
        let msg = s
            .classify("bash: line 4: /d/.lock: Permission denied", None)
            .unwrap()
            .to_string();
        assert!(
            msg.contains("to be allowed to write /d/.lock, found"),
            "{msg}"
        );
        let here = Disk {
            host: HERE,
            what: "the results",
            place: "/r",
        };
        let msg = s
            .classify(
                "rsync: [Receiver] mkdir \"/r/x\" failed: Permission denied (13)",
                Some(here),
            )
            .unwrap()
            .to_string();
        assert!(
            msg.starts_with(
                "permission denied on this machine: expected this user to be allowed to write \
                 /r/x, found"
            ),
            "{msg}"
        );
        // The fetch's sender is the host.
        let msg = s
            .classify(
                "rsync: [sender] opendir \"/d/runs/r\" failed: Permission denied (13)",
                Some(here),
            )
            .unwrap()
            .to_string();
        assert!(
            msg.starts_with(
                "permission denied on 127.0.0.1: expected the login root@127.0.0.1 to be \
                 allowed to read /d/runs/r, found"
            ),
            "{msg}"
        );
        assert!(is_login_refusal(
            "u@h: Permission denied (publickey,password)."
        ));
        assert!(is_login_refusal(
            "Permission denied (publickey,gssapi-with-mic,keyboard-interactive)."
        ));
        assert!(!is_login_refusal("failed: Permission denied (13)"));
    }

    #[test]
    fn the_tail_skips_blank_lines() {
        let outcome = Outcome {
            status: std::process::ExitStatus::default(),
            stdout: "a\nb\n\nc\n".into(),
            stderr: String::new(),
            stop: None,
            elapsed: Duration::ZERO,
        };
        assert_eq!(outcome.tail(2), ["b", "c"]);
        assert_eq!(outcome.tail(9), ["a", "b", "c"]);
    }
}
