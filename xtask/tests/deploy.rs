//! `cargo xtask deploy` against a host on this machine: an sshd of the test's own on
//! 127.0.0.1 with throwaway keys, a bundle whose job needs no GPU, and one stand-in, an
//! `nvidia-smi` script put first on the remote PATH, that answers the preflight's query
//! with whatever GPU a test writes for it.
//!
//! Needs sshd, ssh, ssh-keygen and rsync (`xtask::test::DEPLOY_TOOLS`), which
//! `cargo xtask test` installs before it runs the tests; without them the tests fail saying
//! what to install. Nothing is skipped, and nothing is installed here.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use xtask::bundle::preflight_sh::GPU_QUERY;
use xtask::bundle::{Artifact, Contents, Kind, Runner};
use xtask::project::needs;
use xtask::test;

#[path = "deploy/second_workspace.rs"]
mod second_workspace;

/// A GPU the preflight accepts, and one it refuses on every count.
const GOOD_GPU: &str = "0, Stand-in H100 80GB HBM3, 9.0, 580.159.04";
const OLD_GPU: &str = "0, Stand-in Tesla T4, 7.5, 570.86.15";

/// The job of the test bundle: writes a table and a JSON file into its working folder
/// (the run's results folder), prints a few lines, and fails on request.
const JOB: &str = r#"#!/usr/bin/env bash
echo "job: started with: $*"
printf 'op,ms\nseed,0.010\nchain,0.250\n' > table.csv
printf '{"ok": true}\n' > result.json
for arg in "$@"; do
    case "$arg" in
        --exit=*)
            echo "job: failing on purpose" >&2
            exit "${arg#--exit=}"
            ;;
        --sleep=*)
            echo "job: sleeping"
            sleep "${arg#--sleep=}"
            ;;
        --gate=*)
            # Waits (a minute at most) for the test to make the file: the test decides
            # when the job ends, not a clock.
            echo "job: waiting at the gate"
            for _ in $(seq 600); do
                [ -e "${arg#--gate=}" ] && break
                sleep 0.1
            done
            ;;
    esac
done
echo "job: done"
"#;

/// The stand-in: answers the preflight's one query (anything else is an error, so a
/// change of query shows here) with the line in the file `gpus` beside it.
fn stand_in_nvidia_smi() -> String {
    format!(
        r#"#!/usr/bin/env bash
# STAND-IN for nvidia-smi, written by xtask/tests/deploy.rs: there is no GPU here.
# With a file `hang` beside it, it never answers, as nvidia-smi on a sick GPU host.
if [ -e "$(dirname "$0")/hang" ]; then
    exec sleep 1000
fi
# With a file `hold` beside it, it waits (a minute at most) until the file is gone: a
# preflight, and the deploy folder's lock with it, held for as long as a test needs.
for _ in $(seq 600); do
    [ -e "$(dirname "$0")/hold" ] || break
    sleep 0.1
done
if [ "$*" != {query:?} ]; then
    echo "stand-in nvidia-smi: unexpected arguments: $*" >&2
    exit 2
fi
cat "$(dirname "$0")/gpus"
"#,
        query = GPU_QUERY.join(" ")
    )
}

// ---------------------------------------------------------------------------------------
// Setup: the tools, an sshd, a host folder, a bundle.

/// Fails, naming what is missing and how to get it, when a tool the tests run is not
/// installed. The tests install nothing: `cargo xtask test` does, before it runs them.
fn ensure_tools() {
    let missing = test::missing(test::DEPLOY_TOOLS);
    assert!(missing.is_empty(), "{}", test::missing_message(&missing));
    // sshd started by root wants its privilege separation folder, which the service
    // scripts (not run here) would make.
    assert!(
        !test::is_root() || Path::new(test::SSHD_PRIVSEP_DIR).is_dir(),
        "sshd run as root needs {dir}, which is missing: run `cargo xtask test`, which makes \
         it, or `sudo mkdir -p {dir}`",
        dir = test::SSHD_PRIVSEP_DIR
    );
}

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "stepgraph-deploy-test",
            "-f",
        ])
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .expect("ssh-keygen runs");
    assert!(status.success(), "ssh-keygen failed for {}", path.display());
}

/// A port nothing listens on (for the moment).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

fn user() -> String {
    let out = Command::new("id").arg("-un").output().expect("id runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An sshd on 127.0.0.1 that accepts one throwaway key; stopped when dropped.
struct Sshd {
    child: Child,
    port: u16,
    key: PathBuf,
    log: PathBuf,
}

/// Who the host's sessions are: root as usual, or root that the file system's modes bind
/// (without the capabilities that override them), as an ordinary user is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Login {
    AsUsual,
    BoundByModes,
}

impl Sshd {
    fn start(dir: &Path, login: Login) -> Sshd {
        let host_key = dir.join("host_key");
        let key = dir.join("id_ed25519");
        keygen(&host_key);
        keygen(&key);
        let authorized = dir.join("authorized_keys");
        fs::copy(key.with_extension("pub"), &authorized).unwrap();
        let port = free_port();
        let config = dir.join("sshd_config");
        fs::write(
            &config,
            format!(
                "ListenAddress 127.0.0.1:{port}\n\
                 HostKey {host_key}\n\
                 PidFile {pid}\n\
                 AuthorizedKeysFile {authorized}\n\
                 StrictModes no\n\
                 UsePAM no\n\
                 PermitRootLogin yes\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n",
                host_key = host_key.display(),
                pid = dir.join("sshd.pid").display(),
                authorized = authorized.display(),
            ),
        )
        .unwrap();
        let log = dir.join("sshd.log");
        // Root writes anywhere, whatever a folder's mode says; sessions that must meet
        // a folder they cannot write run without CAP_DAC_OVERRIDE (and its read-only
        // sibling), which sshd's children inherit. An ordinary user needs nothing.
        let mut command = if login == Login::BoundByModes && test::is_root() {
            let mut c = Command::new("setpriv");
            c.args([
                "--bounding-set",
                "-dac_override,-dac_read_search",
                test::SSHD,
            ]);
            c
        } else {
            Command::new(test::SSHD)
        };
        let mut child = command
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("sshd starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "sshd exited ({status}) before listening:\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "sshd did not listen on {port} within 10s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Sshd {
            child,
            port,
            key,
            log,
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One test's host: its sshd, the deploy folder, the stand-in folder, and where results
/// are fetched to, all in one temporary folder.
struct Host {
    sshd: Sshd,
    tmp: TempDir,
}

/// What a deploy printed and how it ended.
struct Deployed {
    ok: bool,
    text: String,
}

impl Deployed {
    fn expect_ok(&self) -> &Self {
        assert!(self.ok, "the deploy failed:\n{}", self.text);
        self
    }

    fn expect_failure(&self, needles: &[&str]) -> &Self {
        assert!(
            !self.ok,
            "the deploy succeeded, expected it to fail:\n{}",
            self.text
        );
        self.expect_output(needles)
    }

    fn expect_output(&self, needles: &[&str]) -> &Self {
        for needle in needles {
            assert!(
                self.text.contains(needle),
                "expected `{needle}` in the output:\n{}",
                self.text
            );
        }
        self
    }
}

impl Host {
    fn start() -> Host {
        Host::start_with(Login::AsUsual)
    }

    fn start_with(login: Login) -> Host {
        ensure_tools();
        let tmp = tempfile::tempdir().unwrap();
        let sshd = Sshd::start(tmp.path(), login);
        let host = Host { sshd, tmp };
        fs::create_dir_all(host.stand_in()).unwrap();
        write_executable(&host.stand_in().join("nvidia-smi"), &stand_in_nvidia_smi());
        host.gpu(GOOD_GPU);
        host
    }

    fn stand_in(&self) -> PathBuf {
        self.tmp.path().join("stand-in")
    }

    /// The deploy folder on the "host" (this machine).
    fn remote(&self) -> PathBuf {
        self.tmp.path().join("remote")
    }

    fn fetched(&self) -> PathBuf {
        self.tmp.path().join("fetched")
    }

    fn target(&self) -> String {
        format!("{}@127.0.0.1:{}", user(), self.sshd.port)
    }

    /// What the stand-in nvidia-smi reports.
    fn gpu(&self, line: &str) {
        fs::write(self.stand_in().join("gpus"), format!("{line}\n")).unwrap();
    }

    /// A bundle of the test job written by the bundle code itself; its preflight requires
    /// `libraries`.
    fn bundle(&self, libraries: &[&str]) -> PathBuf {
        self.bundle_of("job", libraries)
    }

    /// A bundle like [`Host::bundle`]'s whose program is called `program`, in its own
    /// folder.
    fn bundle_of(&self, program: &str, libraries: &[&str]) -> PathBuf {
        let job = self.tmp.path().join("job.sh");
        write_executable(&job, JOB);
        let out = self.tmp.path().join(format!("bundle-{program}"));
        let bins = BTreeMap::from([(
            program.to_string(),
            Artifact {
                kind: Kind::Program,
                target: "job".into(),
                path: job,
            },
        )]);
        Contents {
            out: &out,
            bins: &bins,
            runner: &Runner::Job {
                job: program.into(),
                args: Vec::new(),
            },
            needs: &needs().libraries(libraries.iter().copied()),
            data: &[],
            info: &no_kernels(),
        }
        .write(workspace_root(), false)
        .unwrap();
        out
    }

    /// A bundle like [`Host::bundle`]'s whose job carries `bytes` more of data that
    /// does not compress or repeat, after its end: an upload that takes a while.
    fn bundle_with_payload(&self, bytes: usize) -> PathBuf {
        let job = self.tmp.path().join("job.sh");
        let mut text = format!("{JOB}exit 0\n");
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        while text.len() < JOB.len() + bytes {
            text.push('#');
            for _ in 0..8 {
                // xorshift64: no two lines alike, so rsync finds nothing to match.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push_str(&format!("{x:016x}"));
            }
            text.push('\n');
        }
        write_executable(&job, &text);
        let out = self.tmp.path().join("bundle-payload");
        let bins = BTreeMap::from([(
            "job".to_string(),
            Artifact {
                kind: Kind::Program,
                target: "job".into(),
                path: job,
            },
        )]);
        Contents {
            out: &out,
            bins: &bins,
            runner: &Runner::Job {
                job: "job".into(),
                args: Vec::new(),
            },
            needs: &needs().libraries(["libc.so.6"]),
            data: &[],
            info: &no_kernels(),
        }
        .write(workspace_root(), false)
        .unwrap();
        out
    }

    /// `cargo xtask deploy --bundle <bundle>` to this host. `extra` holds options, which
    /// replace the defaults of the same name (`--key`, `--host`, `--dir`), then possibly `--` and
    /// the job's arguments.
    fn deploy(&self, bundle: &Path, extra: &[&str]) -> Deployed {
        self.output(&mut self.command(bundle, extra))
    }

    /// Runs `cmd` to its end: what it printed, and whether it succeeded.
    fn output(&self, cmd: &mut Command) -> Deployed {
        let out = cmd.stdin(Stdio::null()).output().expect("xtask runs");
        Deployed {
            ok: out.status.success(),
            text: format!(
                "{}{}\n(sshd log: {})",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.sshd.log.display()
            ),
        }
    }

    /// The command [`Host::deploy`] runs. Its environment names this test's folder, so
    /// that [`processes_of`] finds the ssh processes it starts here.
    fn command(&self, bundle: &Path, extra: &[&str]) -> Command {
        let split = extra.iter().position(|a| *a == "--").unwrap_or(extra.len());
        let (options, job_args) = extra.split_at(split);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
        cmd.arg("deploy").args(options);
        let given = |flag: &str| options.contains(&flag);
        if !given("--host") {
            cmd.args(["--host", &self.target()]);
        }
        if !given("--key") {
            cmd.arg("--key").arg(&self.sshd.key);
        }
        if !given("--dir") {
            cmd.arg("--dir").arg(self.remote());
        }
        cmd.arg("--bundle")
            .arg(bundle)
            .arg("--known-hosts")
            .arg(self.tmp.path().join("known_hosts"))
            .arg("--fetch-to")
            .arg(self.fetched())
            .arg("--remote-path-prefix")
            .arg(self.stand_in())
            .args(["--connect-timeout", "5"])
            .args(job_args)
            .env(TEST_MARK, self.tmp.path());
        cmd
    }

    /// Starts a deploy of `bundle` whose preflight waits (with the deploy folder's lock
    /// held) until [`Host::let_go`].
    fn hold_the_lock(&self, bundle: &Path) -> Running {
        fs::write(self.stand_in().join("hold"), "").unwrap();
        let running = Running::start(self.command(bundle, &[]));
        running.wait_for("== preflight on the host");
        // The stand-in runs: the preflight has reached it.
        assert!(
            within(Duration::from_secs(30), || processes_of(self.tmp.path())
                .iter()
                .any(|p| p.contains("stand-in/nvidia-smi"))),
            "the preflight did not reach nvidia-smi:\n{}",
            running.shown()
        );
        running
    }

    /// Lets the preflight [`Host::hold_the_lock`] holds go on.
    fn let_go(&self) {
        fs::remove_file(self.stand_in().join("hold")).unwrap();
    }

    /// `--gate=FILE` for the test job, and FILE: the job waits until the file is made.
    fn gate(&self) -> (String, PathBuf) {
        let gate = self.tmp.path().join("gate");
        (format!("--gate={}", gate.display()), gate)
    }

    /// Drops every connection to the host, as a network that fails does: kills the
    /// processes sshd forked for them (sshd itself keeps listening).
    fn drop_connections(&self) {
        let sshd = self.sshd.child.id().to_string();
        let mut killed = 0;
        for pid in children_of(&sshd) {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            killed += 1;
        }
        assert!(killed > 0, "no connection to drop");
    }

    /// The lock file of the deploy folder.
    fn lock_file(&self) -> PathBuf {
        self.remote().join(".lock")
    }

    fn current(&self) -> Option<PathBuf> {
        fs::read_link(self.remote().join("current")).ok()
    }

    /// The fetched results folders of `release`, oldest first.
    fn runs(&self, release: &str) -> Vec<PathBuf> {
        let dir = self
            .fetched()
            .join(format!("127.0.0.1-{}", self.sshd.port))
            .join(release);
        let mut runs: Vec<PathBuf> = fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        runs.sort();
        runs
    }

    /// `cargo xtask deploy ARGS` (no `--bundle`: it bundles) against this host's deploy
    /// folder, with the usual options.
    fn manage_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
        cmd.args(["deploy", "--host", &self.target()])
            .arg("--key")
            .arg(&self.sshd.key)
            .arg("--known-hosts")
            .arg(self.tmp.path().join("known_hosts"))
            .arg("--dir")
            .arg(self.remote())
            .args(args)
            .env(TEST_MARK, self.tmp.path())
            .stdin(Stdio::null());
        cmd
    }

    /// `cargo xtask deploy <action>` against this host's deploy folder, `extra` after the
    /// usual options (and perhaps `--` and the job's arguments).
    fn manage(&self, action: &str, extra: &[&str]) -> Deployed {
        self.output(&mut self.manage_action(action, extra))
    }

    /// The command [`Host::manage`] runs.
    fn manage_action(&self, action: &str, extra: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
        cmd.args(["deploy", action, "--host", &self.target()])
            .arg("--key")
            .arg(&self.sshd.key)
            .arg("--known-hosts")
            .arg(self.tmp.path().join("known_hosts"))
            .arg("--dir")
            .arg(self.remote())
            .arg("--remote-path-prefix")
            .arg(self.stand_in())
            .args(["--connect-timeout", "5"]);
        if action == "run" {
            cmd.arg("--fetch-to").arg(self.fetched());
        }
        cmd.args(extra).env(TEST_MARK, self.tmp.path());
        cmd
    }
}

/// A deploy started in the background, its output collected as it comes.
struct Running {
    child: Child,
    text: std::sync::Arc<std::sync::Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("xtask runs");
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let readers = [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ]
        .into_iter()
        .map(|mut from| {
            let text = std::sync::Arc::clone(&text);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = from.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    text.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            })
        })
        .collect();
        Running {
            child,
            text,
            readers,
        }
    }

    fn shown(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Waits until the output holds `needle`; panics, showing it, after a minute.
    fn wait_for(&self, needle: &str) {
        assert!(
            within(Duration::from_secs(60), || self.shown().contains(needle)),
            "`{needle}` did not show within a minute:\n{}",
            self.shown()
        );
    }

    fn finish(mut self) -> Deployed {
        let status = self.child.wait().unwrap();
        for r in self.readers.drain(..) {
            r.join().unwrap();
        }
        Deployed {
            ok: status.success(),
            text: self.shown(),
        }
    }
}

impl Drop for Running {
    /// A test that fails while its deploy runs stops it as Ctrl-C would, so that it
    /// cleans up (its job, its connection, its control folder), and kills it only if it
    /// does not end.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let child = &mut self.child;
            within(Duration::from_secs(10), || {
                matches!(child.try_wait(), Ok(Some(_)))
            });
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that a release folder on the host is whole: every file there is in its
/// manifest, and every one matches.
fn assert_whole(release: &Path) {
    let ok = Command::new("sha256sum")
        .args(["-c", "--quiet", "--strict", "SHA256SUMS"])
        .current_dir(release)
        .status()
        .unwrap();
    assert!(ok.success(), "{} fails its checksums", release.display());
    let listed = fs::read_to_string(release.join("SHA256SUMS")).unwrap();
    let count = Command::new("find")
        .args([".", "-type", "f"])
        .current_dir(release)
        .output()
        .unwrap()
        .stdout
        .iter()
        .filter(|&&b| b == b'\n')
        .count();
    assert_eq!(count, listed.lines().count() + 1, "{}", release.display());
}

/// The names in the host's `releases/`, sorted.
fn release_folders(host: &Host) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(host.remote().join("releases"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The environment variable that marks the processes a test's deploy starts here.
const TEST_MARK: &str = "STEPGRAPH_DEPLOY_TEST";

/// The processes, here or "on the host" (this machine too), that belong to the test whose
/// folder is `dir`: those whose command line or environment names it (the ssh processes a
/// deploy starts, and the remote job, whose PATH holds the stand-in folder), less this
/// test binary and the sshd processes.
fn processes_of(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let read = |what: &str| {
            fs::read(entry.path().join(what))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default()
        };
        let cmdline = read("cmdline");
        if cmdline.starts_with("sshd") || cmdline.starts_with(test::SSHD) {
            continue;
        }
        if cmdline.contains(&needle) || read("environ").contains(&needle) {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

/// The pids of the processes whose parent is `parent`.
fn children_of(parent: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stat = fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid ...`; comm may hold spaces, so read after its `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1));
        if ppid == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// The `cargo xtask deploy ...` line printed after `label` (on the next line), as the
/// arguments to give the xtask binary.
fn printed_command(text: &str, label: &str) -> Vec<String> {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no `{label}` in:\n{text}"));
    let line = text[at + label.len()..]
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("cargo xtask deploy "))
        .unwrap_or_else(|| panic!("no command after `{label}` in:\n{text}"));
    line.split_whitespace().skip(2).map(String::from).collect()
}

/// Polls `done` until it holds or `limit` passes; whether it held.
fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_executable(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// What the test bundles' `build-info.json` says of nvcc.
fn no_kernels() -> serde_json::Map<String, serde_json::Value> {
    serde_json::Map::from_iter([(
        "nvcc".to_string(),
        "none: the test job has no kernels".into(),
    )])
}

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// The release name a bundle's `build-info.json` gives.
fn release_of(bundle: &Path) -> String {
    let info: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(bundle.join("build-info.json")).unwrap()).unwrap();
    info["release"].as_str().unwrap().to_string()
}

/// Each file's modification time and inode under `dir`, to tell whether a deploy wrote
/// into it.
fn stamps(dir: &Path) -> BTreeMap<String, (i64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    for name in [
        "bin/job",
        "run.sh",
        "preflight.sh",
        "build-info.json",
        "SHA256SUMS",
    ] {
        let m = fs::metadata(dir.join(name)).unwrap();
        out.insert(name.to_string(), (m.mtime(), m.ino()));
    }
    out
}

// ---------------------------------------------------------------------------------------
// The cases.

#[test]
fn first_deploy_checks_switches_runs_and_fetches() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let release = release_of(&bundle);
    host.deploy(&bundle, &["--verbose", "--", "--steps", "3"])
        .expect_ok()
        .expect_output(&[
            "<f+++++++++ bin/job",
            "all 6 files match SHA256SUMS",
            "ok    gpu: 0: Stand-in H100 80GB HBM3 (compute capability 9.0)",
            "ok    driver: 580.159.04 (at least 580.65.06)",
            "ok    library libc.so.6: /",
            "preflight: ok",
            "job: started with: --steps 3",
            "job: done",
            &format!("deployed {release} to"),
        ]);

    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{release}")))
    );
    let live = host.remote().join("current");
    assert!(live.join("bin/job").is_file());
    let leftovers: Vec<_> = fs::read_dir(host.remote().join("releases"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let runs = host.runs(&release);
    assert_eq!(runs.len(), 1, "{runs:?}");
    for file in ["table.csv", "result.json", "output.log", "build-info.json"] {
        assert!(runs[0].join(file).is_file(), "{file} was not fetched");
    }
    let log = fs::read_to_string(runs[0].join("output.log")).unwrap();
    assert!(log.contains("job: done"), "{log}");
}

#[test]
fn redeploy_of_what_is_live_copies_nothing_and_touches_nothing() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let release = release_of(&bundle);
    host.deploy(&bundle, &[]).expect_ok();
    let live = host.remote().join("releases").join(&release);
    let before = stamps(&live);
    // Rebuilt: the same programs and scripts, another build time.
    std::thread::sleep(Duration::from_millis(1100));
    let bundle = host.bundle(&["libc.so.6"]);
    assert_eq!(release_of(&bundle), release);
    // --verbose: the commands show, so an rsync of the bundle would.
    let again = host.deploy(&bundle, &["--verbose"]);
    again.expect_ok().expect_output(&[
        "$ ssh -o BatchMode=yes",
        &format!(
            "releases/{release} is already live, and its 6 files match its SHA256SUMS and its \
             name: nothing to copy"
        ),
        "preflight: ok",
        "job: done",
    ]);
    assert!(
        !again.text.contains("$ rsync -a --checksum"),
        "the redeploy copied:\n{}",
        again.text
    );
    assert_eq!(stamps(&live), before, "the live files were rewritten");
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{release}")))
    );
    assert_eq!(host.runs(&release).len(), 2);
}

#[test]
fn a_changed_bundle_sends_only_what_changed_and_leaves_the_live_files_alone() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let first = release_of(&bundle);
    host.deploy(&bundle, &[]).expect_ok();
    let live = host.remote().join("releases").join(&first);
    let before = stamps(&live);
    // Another library needed: preflight.sh changes, the job does not.
    let bundle = host.bundle(&["libc.so.6", "libm.so.6"]);
    let second = release_of(&bundle);
    assert_ne!(second, first);
    let again = host.deploy(&bundle, &["--verbose"]);
    again
        .expect_ok()
        .expect_output(&["<fcst...... preflight.sh", "cf..t...... bin/job"]);
    assert!(
        !again.text.contains("<f+++++++++ bin/job"),
        "{}",
        again.text
    );
    assert_eq!(stamps(&live), before, "the earlier release was written to");
    let new = stamps(&host.remote().join("releases").join(&second));
    assert_ne!(
        new["bin/job"].1, before["bin/job"].1,
        "a hard link to a live file"
    );
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{second}")))
    );
}

#[test]
fn releases_of_two_programs_at_one_revision_do_not_overwrite_each_other() {
    let host = Host::start();
    let one = host.bundle_of("job", &["libc.so.6"]);
    let two = host.bundle_of("other", &["libc.so.6"]);
    let (r1, r2) = (release_of(&one), release_of(&two));
    assert!(
        r1.starts_with("job-") && r2.starts_with("other-"),
        "{r1} {r2}"
    );
    assert_eq!(r1.split('-').nth(1), r2.split('-').nth(1), "one revision");
    host.deploy(&one, &[]).expect_ok();
    host.deploy(&two, &[]).expect_ok();
    for (bundle, r) in [(&one, &r1), (&two, &r2)] {
        let program = r.split('-').next().unwrap();
        let there = host.remote().join("releases").join(r);
        assert_eq!(
            fs::read_to_string(there.join("run.sh")).unwrap(),
            fs::read_to_string(bundle.join("run.sh")).unwrap()
        );
        assert!(there.join("bin").join(program).is_file());
    }
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r2}")))
    );
    // The first is still whole: deploying it again copies nothing.
    host.deploy(&one, &[])
        .expect_ok()
        .expect_output(&[&format!("releases/{r1} is already on the host")]);
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r1}")))
    );
}

#[test]
fn a_damaged_release_is_uploaded_again_not_trusted() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let release = release_of(&bundle);
    host.deploy(&bundle, &[]).expect_ok();
    let live = host.remote().join("releases").join(&release);
    fs::write(live.join("bin/job"), "#!/bin/sh\necho truncated\n").unwrap();
    host.deploy(&bundle, &[]).expect_ok().expect_output(&[
        &format!("warning: releases/{release} on "),
        "is damaged, so it is uploaded again",
        "- bin/job: expected sha256 ",
        "job: done",
    ]);
    assert_eq!(
        fs::read_to_string(live.join("bin/job")).unwrap(),
        JOB,
        "the release was not replaced"
    );
}

#[test]
fn corrupted_file_is_caught_by_the_checksums() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let mut job = fs::read_to_string(bundle.join("bin/job")).unwrap();
    job.push_str("# changed after the manifest was written\n");
    fs::write(bundle.join("bin/job"), job).unwrap();
    host.deploy(&bundle, &[]).expect_failure(&[
        "checksum mismatch on ",
        "after the copy; `current` was not switched:",
        "`current` was not switched",
        "bin/job: expected sha256 ",
        ", found ",
    ]);
    assert_eq!(host.current(), None);
    assert!(host.runs(&release_of(&bundle)).is_empty());
}

#[test]
fn wrong_port_is_reported_as_unreachable() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let port = free_port();
    let target = format!("{}@127.0.0.1:{port}", user());
    host.deploy(&bundle, &["--host", &target])
        .expect_failure(&[&format!(
            "cannot reach 127.0.0.1: expected an ssh server on port {port}, found the connection \
         refused (nothing listens there)"
        )]);
    assert!(!host.remote().exists());
}

#[test]
fn missing_key_is_reported_before_connecting() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let key = host.tmp.path().join("no-such-key");
    host.deploy(&bundle, &["--key", key.to_str().unwrap()])
        .expect_failure(&[&format!(
            "no ssh key at {}: expected a private key file there (--key), found no such file",
            key.display()
        )]);
    assert!(!host.remote().exists());
}

#[test]
fn key_the_host_does_not_accept_is_refused() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let stranger = host.tmp.path().join("stranger");
    keygen(&stranger);
    host.deploy(&bundle, &["--key", stranger.to_str().unwrap()])
        .expect_failure(&[
            &format!(
                "{}@127.0.0.1 refused the login: expected it to accept the key {}, found `",
                user(),
                stranger.display()
            ),
            "Permission denied (publickey",
        ]);
    assert!(!host.remote().exists());
}

#[test]
fn failing_preflight_leaves_current_untouched() {
    let host = Host::start();
    // A release already live, made by hand.
    fs::create_dir_all(host.remote().join("releases/previous")).unwrap();
    std::os::unix::fs::symlink("releases/previous", host.remote().join("current")).unwrap();
    host.gpu(OLD_GPU);
    let bundle = host.bundle(&["libc.so.6", "libstepgraph_missing.so.1"]);
    host.deploy(&bundle, &["--min-free-mib", "999999999"])
        .expect_failure(&[
            "preflight failed on ",
            "(4 of its checks); `current` was not switched:",
            "- compute capability: expected at least 8.0 on one GPU, found 7.5 on GPU 0 \
             (Stand-in Tesla T4)",
            "- driver: expected at least 580.65.06 (CUDA 13.0), found 570.86.15",
            "- library libstepgraph_missing.so.1: expected it in LD_LIBRARY_PATH",
            "or on the loader cache (ldconfig -p), found it in neither",
            "- free disk: expected at least 999999999 MiB free in ",
        ])
        .expect_output(&["ok    library libc.so.6"]);
    assert_eq!(host.current(), Some(PathBuf::from("releases/previous")));
    assert!(
        !host
            .remote()
            .join(format!("releases/{}", release_of(&bundle)))
            .exists()
    );
    assert!(host.runs(&release_of(&bundle)).is_empty());
}

#[test]
fn failing_job_shows_its_last_lines_and_its_results_come_back() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    host.deploy(&bundle, &["--", "--exit=3"]).expect_failure(&[
        "error: the job 20",
        " failed on ",
        "found exit status 3 after ",
        "; its last lines:",
        "  | job: started with: --exit=3",
        "  | job: failing on purpose",
        "(results fetched into ",
    ]);
    let runs = host.runs(&release_of(&bundle));
    assert_eq!(runs.len(), 1, "{runs:?}");
    let log = fs::read_to_string(runs[0].join("output.log")).unwrap();
    assert!(log.contains("job: failing on purpose"), "{log}");
    assert!(runs[0].join("table.csv").is_file());
    // The job's own log and its exit file come back beside its results.
    let job_log = fs::read_to_string(runs[0].with_extension("log")).unwrap();
    assert!(job_log.contains("job: failing on purpose"), "{job_log}");
    let exit = fs::read_to_string(runs[0].with_extension("exit")).unwrap();
    assert!(
        exit.starts_with("3 ") && exit.trim_end().ends_with(" exited"),
        "{exit}"
    );
}

#[test]
fn dry_run_prints_every_command_and_changes_nothing() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    host.deploy(&bundle, &["--dry-run", "--", "--quick"])
        .expect_ok()
        .expect_output(&[
            "$ ssh -o BatchMode=yes",
            "'bash -s -- ",
            "<<'EOF'\nset -eu\n",
            "$ rsync -a --checksum --itemize-changes --stats --delete --partial-dir=.rsync-partial \
             --timeout=60 -e ",
            "sha256sum --",
            "preflight.sh",
            "mv -T -- current.new current",
            "/releases/.incoming-job-",
            "run.sh --quick'",
            "@guard-script@",
            "timeout --kill-after=5 \"$limit\" \"$@\"",
            "dry run: nothing was run",
        ]);
    assert!(!host.remote().exists());
    assert!(!host.fetched().exists());
}

#[test]
fn hung_nvidia_smi_fails_the_preflight_on_its_timeout() {
    let host = Host::start();
    fs::write(host.stand_in().join("hang"), "").unwrap();
    let bundle = host.bundle(&["libc.so.6"]);
    let running = Running::start(host.command(&bundle, &["--preflight-timeout", "3"]));
    running.wait_for("== preflight on the host");
    let start = Instant::now();
    running.finish().expect_failure(&[
        "did not finish within 3s (--preflight-timeout), so it was stopped; `current` was \
             not switched:",
        "- gpu: expected nvidia-smi to list the GPUs, found no answer when the preflight \
             was stopped",
        "a hung `nvidia-smi` is a common sign of a sick GPU or driver",
    ]);
    let took = start.elapsed();
    // The timeout, and the clean-up: a few seconds.
    assert!(took < Duration::from_secs(3 + 5), "took {took:?}");
    assert_eq!(host.current(), None);
    assert!(
        within(Duration::from_secs(5), || processes_of(host.tmp.path())
            .is_empty()),
        "left running: {:?}",
        processes_of(host.tmp.path())
    );
}

#[test]
fn sigint_during_the_job_stops_it_there_and_here() {
    signal_during_the_job_stops_it_there_and_here("INT");
}

#[test]
fn sigterm_during_the_job_stops_it_there_and_here() {
    signal_during_the_job_stops_it_there_and_here("TERM");
}

/// `kill -SIGNAL` to the deploy while its job runs: within 5 s the deploy has exited
/// (the shells' 130 for SIGINT, 143 for SIGTERM), and no process of the job, there or here, nor any ssh of the deploy is left.
fn signal_during_the_job_stops_it_there_and_here(signal: &str) {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let mut running = Running::start(host.command(&bundle, &["--", "--sleep=300"]));
    running.wait_for("job: sleeping");
    assert!(!processes_of(host.tmp.path()).is_empty());
    let pid = running.child.id();

    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let signalled = Instant::now();
    let mut exit = None;
    let gone = within(Duration::from_secs(5), || {
        if exit.is_none() {
            exit = running.child.try_wait().unwrap();
        }
        exit.is_some() && processes_of(host.tmp.path()).is_empty()
    });
    let shown = || running.shown();
    assert!(
        gone,
        "5 s after SIG{signal}: xtask {exit:?}, still running: {:?}\n{}",
        processes_of(host.tmp.path()),
        shown()
    );
    let took = signalled.elapsed();
    let expected = if signal == "TERM" { 143 } else { 130 };
    assert_eq!(exit.and_then(|s| s.code()), Some(expected), "{}", shown());
    assert!(
        shown().contains(&format!("interrupted by SIG{signal} during the job on ")),
        "{}",
        shown()
    );
    let control = std::env::temp_dir().join(format!("stepgraph-ssh-{pid}"));
    assert!(!control.exists(), "{} left behind", control.display());
    eprintln!("stopped {took:?} after SIG{signal}");
}

#[test]
fn zero_timeouts_are_refused() {
    for flag in ["--connect-timeout", "--preflight-timeout", "--job-timeout"] {
        let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["deploy", "--host", "h", flag, "0", "--dry-run"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} 0 was accepted");
        assert!(
            text.contains(&format!(
                "invalid value '0' for '{flag} <SECONDS>': expected a number of seconds, at \
                 least 1: 0 would turn the timeout off"
            )),
            "{text}"
        );
    }
}

#[test]
fn a_second_deploy_to_a_busy_folder_refuses_with_no_wait() {
    let host = Host::start();
    let one = host.bundle_of("job", &["libc.so.6"]);
    let two = host.bundle_of("other", &["libc.so.6"]);
    let first = host.hold_the_lock(&one);
    host.deploy(&two, &["--no-wait"]).expect_failure(&[
        &format!(
            "the deploy folder {} on {} is in use: expected no other deploy there, found its \
             lock held by {}@",
            host.remote().display(),
            host.target(),
            user()
        ),
        ", since 20",
        "UTC: cargo xtask deploy, run ",
        " on the host)",
        "; wait for it, or drop --no-wait to wait",
    ]);
    host.let_go();
    first.finish().expect_ok();
    // The refused deploy left nothing: no upload, no release.
    let r1 = release_of(&one);
    assert_eq!(release_folders(&host), std::slice::from_ref(&r1));
    assert_whole(&host.remote().join("releases").join(&r1));
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r1}")))
    );
}

#[test]
fn a_second_deploy_to_a_busy_folder_waits_its_turn() {
    let host = Host::start();
    let one = host.bundle_of("job", &["libc.so.6"]);
    let two = host.bundle_of("other", &["libc.so.6"]);
    let first = host.hold_the_lock(&one);
    let second = Running::start(host.command(&two, &[]));
    second.wait_for(&format!(
        "waiting (up to 600s) for the deploy folder {}",
        host.remote().display()
    ));
    assert_eq!(
        release_folders(&host),
        [format!(".incoming-{}", release_of(&one))],
        "the second did not wait"
    );
    host.let_go();
    first.finish().expect_ok();
    second.finish().expect_ok().expect_output(&[
        "its lock is held by ",
        ", since 20",
        "(--no-wait fails instead)",
    ]);
    let (r1, r2) = (release_of(&one), release_of(&two));
    let mut both = vec![r1.clone(), r2.clone()];
    both.sort();
    assert_eq!(release_folders(&host), both);
    for r in [&r1, &r2] {
        assert_whole(&host.remote().join("releases").join(r));
    }
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r2}")))
    );
}

#[test]
fn status_list_run_and_clean_on_a_host_with_several_releases() {
    let host = Host::start();
    let mut names = Vec::new();
    for (program, libraries) in [
        ("job", &["libc.so.6"][..]),
        ("job", &["libc.so.6", "libm.so.6"][..]),
        ("other", &["libc.so.6"][..]),
    ] {
        let bundle = host.bundle_of(program, libraries);
        names.push(release_of(&bundle));
        host.deploy(&bundle, &["--", "--steps", "1"]).expect_ok();
    }
    let [r1, r2, r3] = [&names[0], &names[1], &names[2]];
    fs::create_dir_all(
        host.remote()
            .join("releases/.incoming-job-x-1-20260101T000000Z-1"),
    )
    .unwrap();

    host.manage("status", &[]).expect_ok().expect_output(&[
        &format!("current: {r3}"),
        "  program other, revision ",
        "  made current 20",
        "  verified: its 6 files match its SHA256SUMS and its name",
        ": exit status 0 after ",
        "(args `--steps 1`, by `deploy`)",
        "lock: free",
    ]);

    let listed = host.manage("list", &[]);
    listed.expect_ok().expect_output(&[
        "3 releases (newest first; * is current)",
        &format!("* {r3}\n    program other"),
        &format!("  {r2}\n    program job"),
        "left by failed uploads and replaced damaged releases (`clean` removes them):",
        "  releases/.incoming-job-x-1-20260101T000000Z-1",
    ]);
    let at = |r: &str| listed.text.find(&format!(" {r}\n")).unwrap();
    assert!(at(r3) < at(r2) && at(r2) < at(r1), "{}", listed.text);

    host.manage("run", &["--", "--steps", "9"])
        .expect_ok()
        .expect_output(&[
            &format!("releases/{r3}: its 6 files match its SHA256SUMS and its name"),
            "preflight: ok",
            "job: started with: --steps 9",
            &format!("ran {r3} again on "),
        ]);
    assert_eq!(host.runs(r3).len(), 2);

    host.manage("clean", &["--keep", "1"])
        .expect_ok()
        .expect_output(&[
            &format!("removed releases/{r1}"),
            &format!("removed releases/{r2}"),
            "removed releases/.incoming-job-x-1-20260101T000000Z-1",
            &format!("kept 1 in {} on ", host.remote().display()),
        ]);
    assert_eq!(release_folders(&host), std::slice::from_ref(r3));
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r3}")))
    );
    // Results stay.
    assert!(host.remote().join("runs").join(r1).is_dir());
    host.manage("list", &[]).expect_ok().expect_output(&[
        "1 releases",
        "runs of releases no longer on the host:",
        &format!("  {r1} run "),
    ]);
}

#[test]
fn a_damaged_live_release_is_caught_before_run_and_rollback_passes_over_damage() {
    let host = Host::start();
    let mut names = Vec::new();
    for libraries in [
        &["libc.so.6"][..],
        &["libm.so.6"][..],
        &["libc.so.6", "libm.so.6"][..],
    ] {
        let bundle = host.bundle_of("job", libraries);
        names.push(release_of(&bundle));
        host.deploy(&bundle, &[]).expect_ok();
    }
    let [r1, r2, r3] = [&names[0], &names[1], &names[2]];
    let truncate = |r: &str| {
        let job = host.remote().join("releases").join(r).join("bin/job");
        fs::write(&job, "#!/bin/sh\n").unwrap();
    };
    truncate(r3);
    host.manage("run", &[]).expect_failure(&[
        &format!("the release {r3} on "),
        "is damaged: expected its files to match its SHA256SUMS and its name, found:",
        "- bin/job: expected sha256 ",
        "nothing was run: `cargo xtask deploy rollback` goes back",
    ]);
    assert_eq!(host.runs(r3).len(), 1, "the damaged release ran");
    host.manage("status", &[])
        .expect_failure(&["DAMAGED", &format!("the release {r3} on ")]);

    // The release r3 was deployed over is damaged too: rollback goes on to r1.
    truncate(r2);
    host.manage("rollback", &[]).expect_ok().expect_output(&[
        &format!("releases/{r2} is damaged, passed over:"),
        &format!("releases/{r1}: its 6 files match its SHA256SUMS and its name"),
        &format!("from {r3} to {r1} (passing over {r2} (damaged))"),
    ]);
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r1}")))
    );
    host.manage("run", &[])
        .expect_ok()
        .expect_output(&["job: done"]);
    host.manage("rollback", &[]).expect_failure(&[
        "no release to roll back to on ",
        &format!("an earlier verified release that {r1} was deployed over, found none"),
    ]);
}

#[test]
fn stage_uploads_and_checks_without_switching() {
    let host = Host::start();
    let one = host.bundle_of("job", &["libc.so.6"]);
    let two = host.bundle_of("other", &["libc.so.6"]);
    let (r1, r2) = (release_of(&one), release_of(&two));
    host.deploy(&one, &[]).expect_ok();
    let staged = host.manage("stage", &["--bundle", two.to_str().unwrap()]);
    staged.expect_ok().expect_output(&[
        "all 6 files match SHA256SUMS",
        "preflight: ok",
        &format!("staged {r2} on "),
        &format!("`current` stays at {r1}"),
    ]);
    assert!(!staged.text.contains("== run the job"), "{}", staged.text);
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r1}")))
    );
    assert_whole(&host.remote().join("releases").join(&r2));
    host.deploy(&two, &[]).expect_ok().expect_output(&[
        &format!("releases/{r2} is already on the host, and its 6 files match"),
        "job: done",
    ]);
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r2}")))
    );
}

#[test]
fn no_gpu_checks_skips_them_and_marks_the_run() {
    let host = Host::start();
    // nvidia-smi would hang, and a library is missing: neither is looked at.
    fs::write(host.stand_in().join("hang"), "").unwrap();
    let bundle = host.bundle(&["libstepgraph_missing.so.1"]);
    let release = release_of(&bundle);
    host.deploy(&bundle, &["--no-gpu-checks", "--preflight-timeout", "20"])
        .expect_ok()
        .expect_output(&[
            "skip  gpu: --no-gpu-checks (no GPU, compute capability, driver or library checks)",
            "ok    free disk: ",
            "preflight: ok",
            "WITHOUT the preflight's GPU checks",
        ]);
    let runs = host.runs(&release);
    let record = fs::read_to_string(runs[0].with_extension("json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["gpu_checks"], false, "{record}");
    host.manage("status", &[])
        .expect_ok()
        .expect_output(&["NO GPU CHECKS (--no-gpu-checks)"]);
}

#[test]
fn a_key_others_can_read_is_refused_with_ssh_s_own_reason() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let open = host.tmp.path().join("open_key");
    fs::copy(&host.sshd.key, &open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o644)).unwrap();
    let key = open.display().to_string();
    host.deploy(&bundle, &["--key", &key]).expect_failure(&[
        &format!(
            "ssh could not use the key {key}: expected a private key it can read, found ssh \
             saying:"
        ),
        &format!("Permissions 0644 for '{key}' are too open."),
        &format!("Load key \"{key}\": bad permissions"),
        &format!("(ssh uses a private key only its owner can read: `chmod 600 {key}`)"),
    ]);
    assert!(!host.remote().exists());
}

#[test]
fn a_public_key_given_as_the_key_is_named_as_such() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let public = host.sshd.key.with_extension("pub");
    let key = public.display().to_string();
    host.deploy(&bundle, &["--key", &key]).expect_failure(&[
        &format!("ssh could not use the key {key}: expected a private key it can read"),
        &format!("Load key \"{key}\": "),
        &format!(
            "({key} is a public key: --key takes the private key ({}), whose .pub the host \
             lists in its authorized_keys)",
            host.sshd.key.display()
        ),
    ]);
}

/// The remote user's home, as sshd finds it (the password database, not $HOME).
fn remote_home() -> PathBuf {
    let out = Command::new("getent")
        .args(["passwd", &user()])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    PathBuf::from(
        line.trim()
            .split(':')
            .nth(5)
            .expect("a home in the passwd line"),
    )
}

#[test]
fn a_tilde_in_dir_is_the_remote_home() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    // A folder of this test's own in the home, removed however the test ends.
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    let name = format!(
        "stepgraph-deploy-test-{}",
        host.tmp.path().file_name().unwrap().to_string_lossy()
    );
    let there = Remove(remote_home().join(&name));
    let dir = format!("~/{name}");
    host.deploy(&bundle, &["--dir", &dir]).expect_ok();
    assert!(
        there.0.join("current/bin/job").is_file(),
        "{}",
        there.0.display()
    );
    assert!(!remote_home().join("~").exists());

    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["deploy", "--host", "h", "--dir", "~bob/x", "--dry-run"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        text.contains(
            "invalid value '~bob/x' for '--dir <PATH>': expected a path on the host, absolute \
             or from the remote home (`~/PATH` or `PATH`), found `~bob`, another user's home"
        ),
        "{text}"
    );
}

#[test]
fn an_ssh_config_alias_is_reported_with_the_port_ssh_uses() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let closed = free_port();
    let config = host.tmp.path().join("ssh_config");
    fs::write(
        &config,
        format!(
            "Host stepgraph-closed\n  HostName 127.0.0.1\n  Port {closed}\n  User {user}\n\
             Host stepgraph-open\n  HostName 127.0.0.1\n  Port {open}\n  User {user}\n",
            open = host.sshd.port,
            user = user()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    host.deploy(
        &bundle,
        &["--host", "stepgraph-closed", "--ssh-config", config],
    )
    .expect_failure(&[&format!(
        "cannot reach stepgraph-closed (127.0.0.1): expected an ssh server on port {closed}, \
         found the connection refused"
    )]);
    host.deploy(
        &bundle,
        &["--host", "stepgraph-open", "--ssh-config", config],
    )
    .expect_ok()
    .expect_output(&[
        &format!(
            "ssh will connect to 127.0.0.1 port {} as {}",
            host.sshd.port,
            user()
        ),
        "job: done",
    ]);
}

#[test]
fn a_host_with_two_ports_is_refused_before_anything_runs() {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["deploy", "--host", "root@gpu:2222:22"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(
            "invalid value 'root@gpu:2222:22' for '--host <USER@HOST[:PORT]>': expected \
             user@host, user@host:port or user@[ipv6]:port, found `gpu:2222:22` in \
             `root@gpu:2222:22`: more than one `:`"
        ),
        "{text}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_host_is_contacted_before_the_build() {
    let host = Host::start();
    let target = format!("{}@127.0.0.1:{}", user(), free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["deploy", "--example", "fork_join", "--host", &target])
        .arg("--key")
        .arg(&host.sshd.key)
        .arg("--known-hosts")
        .arg(host.tmp.path().join("known_hosts"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains("cannot reach 127.0.0.1"), "{text}");
    assert!(!text.contains("== bundle"), "it built first:\n{text}");
}

#[test]
fn a_dry_run_shows_the_tree_as_it_is_not_the_last_bundle() {
    let host = Host::start();
    let tree = xtask::bundle::build_info::Revision::of(workspace_root());
    let release = xtask::bundle::build_info::release_name("fork_join", &tree, None);
    let out = host
        .manage_cmd(&["--example", "fork_join", "--dry-run"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for needle in [
        "build --release -p stepgraph-suite --example fork_join",
        &format!("(release {release})"),
        &format!("/releases/.incoming-{release}/"),
        "dry run: nothing was run",
    ] {
        assert!(text.contains(needle), "expected `{needle}` in:\n{text}");
    }
    assert!(!host.remote().exists());
}

#[test]
fn a_releases_folder_the_login_cannot_write_is_named_not_the_key() {
    let host = Host::start_with(Login::BoundByModes);
    let one = host.bundle_of("job", &["libc.so.6"]);
    let two = host.bundle_of("other", &["libc.so.6"]);
    let r1 = release_of(&one);
    host.deploy(&one, &[]).expect_ok();
    let releases = host.remote().join("releases");
    // Given back however the test ends, so that the folder can be removed.
    struct Writable(PathBuf);
    impl Drop for Writable {
        fn drop(&mut self) {
            let _ = fs::set_permissions(&self.0, fs::Permissions::from_mode(0o755));
        }
    }
    let _writable = Writable(releases.clone());
    fs::set_permissions(&releases, fs::Permissions::from_mode(0o555)).unwrap();
    let failed = host.deploy(&two, &[]);
    failed.expect_failure(&[
        &format!(
            "permission denied on {}: expected the user {} to be allowed to write ",
            host.target(),
            user()
        ),
        &format!("{}/.incoming-other-", releases.display()),
        "Permission denied (13)",
        &format!(
            "must be writable by that user on the host: `ls -ld {}` there shows the owner and \
             mode)",
            releases.display()
        ),
    ]);
    for wrong in ["refused the login", "could not use the key", "--key"] {
        assert!(
            !failed.text.contains(wrong),
            "`{wrong}` in:\n{}",
            failed.text
        );
    }
    assert_eq!(release_folders(&host), std::slice::from_ref(&r1));
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r1}")))
    );
}

#[test]
fn status_names_a_current_whose_release_was_removed() {
    let host = Host::start();
    let one = host.bundle_of("job", &["libc.so.6"]);
    let two = host.bundle_of("other", &["libc.so.6"]);
    let (r1, r2) = (release_of(&one), release_of(&two));
    host.deploy(&one, &[]).expect_ok();
    host.deploy(&two, &[]).expect_ok();
    fs::remove_dir_all(host.remote().join("releases").join(&r2)).unwrap();
    let gone = [
        format!(
            "`current` in {} on {} points at releases/{r2}, which no longer exists",
            host.remote().display(),
            host.target()
        ),
        "(deploy again to make a release current, or `cargo xtask deploy rollback`".to_string(),
    ];
    let gone: Vec<&str> = gone.iter().map(String::as_str).collect();
    for action in ["status", "run"] {
        let failed = host.manage(action, &[]);
        failed.expect_failure(&gone);
        assert!(
            !failed.text.contains("hashing the files"),
            "{}",
            failed.text
        );
    }
    // What the message says to do works.
    host.manage("rollback", &[])
        .expect_ok()
        .expect_output(&[&format!("from {r2} to {r1}")]);
    host.manage("status", &[])
        .expect_ok()
        .expect_output(&[&format!("current: {r1}")]);
}

#[test]
fn a_dir_the_local_shell_expanded_is_hinted_to_be_quoted() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    // The home here, as the shell expanded `~/stepgraph` into --dir; the host has a file
    // where that folder would go, so the deploy folder cannot be made there.
    let home = host.tmp.path().join("home");
    fs::write(&home, "").unwrap();
    let dir = home.join("stepgraph");
    let dir = dir.to_str().unwrap();
    let hint = format!(
        "(--dir {dir} is under this machine's home, {}: a shell expands an unquoted \
         `~/stepgraph` here, before the deploy sees it. For the home on the host, quote it: \
         --dir '~/stepgraph')",
        home.display()
    );
    let failed = host.output(host.command(&bundle, &["--dir", dir]).env("HOME", &home));
    failed.expect_failure(&["taking the deploy folder's lock failed on ", &hint]);
    // Under another home, the same failure gets no hint.
    let elsewhere = host.tmp.path().join("elsewhere");
    let plain = host.output(
        host.command(&bundle, &["--dir", dir])
            .env("HOME", &elsewhere),
    );
    plain.expect_failure(&["taking the deploy folder's lock failed on "]);
    assert!(!plain.text.contains("quote it"), "{}", plain.text);
    assert!(host.current().is_none());
}

#[test]
fn output_is_a_line_a_step_and_verbose_shows_the_commands() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let quiet = host.deploy(&bundle, &[]);
    quiet.expect_ok().expect_output(&[
        "== connect\n== lock the deploy folder\n",
        "== copy the bundle\n6 files sent; ",
        " travelled\n== verify the checksums on the host\n",
        "job: done",
        "== fetch the results\n",
        " files fetched\n",
    ]);
    for noise in ["$ ", "<f+++++++++", "ssh will connect to"] {
        assert!(!quiet.text.contains(noise), "`{noise}` in:\n{}", quiet.text);
    }
    // `--verbose` is taken by the subcommands too.
    host.manage("status", &["--verbose"])
        .expect_ok()
        .expect_output(&[
            "$ ssh -o BatchMode=yes",
            "(the inspect script)",
            "current: job-",
        ]);
}

#[test]
fn an_error_shows_no_backtrace_even_with_rust_backtrace_set() {
    let target = format!("{}@127.0.0.1:{}", user(), free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "deploy",
            "status",
            "--host",
            &target,
            "--connect-timeout",
            "5",
        ])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("error: cannot reach 127.0.0.1: expected an ssh server on port "),
        "{text}"
    );
    assert!(!text.to_lowercase().contains("backtrace"), "{text}");
    assert!(!text.contains("main.rs"), "{text}");
}

/// The bytes of the files under `dir` (0 when it is not there).
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// The number rsync's `--stats` gives after `label` (`Literal data: 1,234 bytes`).
fn stat(text: &str, label: &str) -> u64 {
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` in:\n{text}"));
    let digits: String = line
        .trim()
        .split(' ')
        .next()
        .unwrap()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

#[test]
fn an_interrupted_upload_is_resumed_by_the_next_deploy() {
    const PAYLOAD: usize = 6 << 20;
    let host = Host::start();
    let bundle = host.bundle_with_payload(PAYLOAD);
    let release = release_of(&bundle);
    let incoming = host.remote().join(format!("releases/.incoming-{release}"));
    // At 1 MiB/s the upload takes six seconds: it is stopped once a quarter is there.
    let running = Running::start(host.command(&bundle, &["--bwlimit", "1024"]));
    running.wait_for("== copy the bundle");
    assert!(
        within(Duration::from_secs(30), || bytes_under(&incoming)
            >= (PAYLOAD / 4) as u64),
        "the upload did not get going:\n{}",
        running.shown()
    );
    let pid = running.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let stopped = running.finish();
    stopped.expect_failure(&["interrupted by SIGINT during copying the bundle on "]);

    // Nothing half-sent became a release, let alone `current`; what was sent is kept,
    // the file cut off midway in rsync's partial folder.
    assert_eq!(host.current(), None);
    assert_eq!(release_folders(&host), [format!(".incoming-{release}")]);
    let kept = bytes_under(&incoming);
    let partial = bytes_under(&incoming.join("bin/.rsync-partial"));
    assert!(
        partial > 0 && kept < bytes_under(&bundle),
        "kept {kept} bytes, {partial} of them partial:\n{}",
        stopped.text
    );

    let again = host.deploy(&bundle, &["--verbose"]);
    again.expect_ok().expect_output(&[
        &format!(
            "resuming the upload an interrupted deploy left in releases/.incoming-{release}: "
        ),
        " more was on the host already)",
        "all 6 files match SHA256SUMS",
        "job: done",
    ]);
    let literal = stat(&again.text, "Literal data:");
    let matched = stat(&again.text, "Matched data:");
    // What was there travelled no more: the data sent is the bundle less what the
    // interrupted upload left (of the file cut off, what it held is matched, not sent).
    assert!(
        matched >= partial / 2 && literal + kept / 2 <= bytes_under(&bundle),
        "sent {literal} bytes, matched {matched}, of a {}-byte bundle of which {kept} were \
         there:\n{}",
        bytes_under(&bundle),
        again.text
    );
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{release}")))
    );
    assert_whole(&host.remote().join("releases").join(&release));
    assert_eq!(release_folders(&host), [release]);
}

#[test]
fn what_failed_uploads_left_is_removed_by_clean_and_by_the_next_deploy_with_its_size() {
    let host = Host::start();
    let one = host.bundle_of("job", &["libc.so.6"]);
    let r1 = release_of(&one);
    host.deploy(&one, &[]).expect_ok();
    let leave = |name: &str, mib: usize| {
        let dir = host.remote().join("releases").join(name);
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::write(dir.join("bin/job"), vec![7u8; mib << 20]).unwrap();
    };

    leave(".incoming-other-x-1", 3);
    host.manage("clean", &["--keep", "3"])
        .expect_ok()
        .expect_output(&[
            "removed releases/.incoming-other-x-1 (3.0 MiB)\n",
            "freed 3.0 MiB on ",
            &format!("kept 1 in {} on ", host.remote().display()),
        ]);
    assert_eq!(release_folders(&host), std::slice::from_ref(&r1));

    // One of another bundle, in the naming of deploys before uploads were resumed.
    leave(".incoming-other-x-1-20260101T000000Z-1", 2);
    let two = host.bundle_of("job", &["libc.so.6", "libm.so.6"]);
    let r2 = release_of(&two);
    host.deploy(&two, &[]).expect_ok().expect_output(&[
        "removed releases/.incoming-other-x-1-20260101T000000Z-1 (2.0 MiB)\n",
        "freed 2.0 MiB on the host: 1 folders left by failed uploads\n",
        &format!("deployed {r2} to"),
    ]);
    let mut both = vec![r1, r2.clone()];
    both.sort();
    assert_eq!(release_folders(&host), both);
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{r2}")))
    );
}

// ---------------------------------------------------------------------------------------
// Detached jobs and the lock's scope.

#[test]
fn a_second_deploy_run_and_clean_proceed_while_a_long_job_runs() {
    let host = Host::start();
    let one = host.bundle_of("job", &["libc.so.6"]);
    let two = host.bundle_of("other", &["libc.so.6"]);
    let (r1, r2) = (release_of(&one), release_of(&two));
    let (gate_arg, gate) = host.gate();
    let first = Running::start(host.command(&one, &["--", &gate_arg]));
    first.wait_for("job: waiting at the gate");

    // The job runs, and the deploy folder is free: another deploy goes through at once.
    let started = Instant::now();
    host.deploy(&two, &["--no-wait"])
        .expect_ok()
        .expect_output(&[&format!("deployed {r2} to ")]);
    host.manage("run", &["--no-wait", "--", "--steps", "2"])
        .expect_ok()
        .expect_output(&[&format!("ran {r2} again on ")]);
    // `clean` keeps the release the running job uses, though it is not `current`.
    host.manage("clean", &["--keep", "1", "--no-wait"])
        .expect_ok()
        .expect_output(&[
            &format!("keeping releases/{r1}: job 20"),
            " runs on it",
            "nothing to remove in ",
        ]);
    let mut both = vec![r1.clone(), r2.clone()];
    both.sort();
    assert_eq!(release_folders(&host), both);
    host.manage("status", &[]).expect_ok().expect_output(&[
        "jobs: 3 (1 running; newest first)",
        &format!("  {r1}  running, started 20"),
        " ago)",
        &format!("  {r2}  exit status 0 after "),
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the others waited for the job"
    );
    assert!(
        first.shown().lines().all(|l| !l.contains("; results in")),
        "{}",
        first.shown()
    );

    fs::write(&gate, "").unwrap();
    let first = first.finish();
    first.expect_ok().expect_output(&[
        "job 20",
        "finished on ",
        ": exit status 0 after ",
        &format!("deployed {r1} to "),
        "; results in ",
    ]);
    let runs = host.runs(&r1);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].join("table.csv").is_file());
}

/// What a deploy says when it loses its connection while following its job: the job
/// goes on, nothing was fetched, and the command to reattach.
fn expect_lost_connection(lost: &Deployed) -> Vec<String> {
    lost.expect_failure(&[
        "error: lost the connection to ",
        " while following the job 20",
        "the job was not stopped, and its results were not fetched; it is still running there \
         (looked at over a new connection)",
        "reattach (follows it, then fetches its results):",
    ]);
    for wrong in [
        "failed on",
        "; results in",
        "files fetched",
        "== fetch the results",
    ] {
        assert!(!lost.text.contains(wrong), "`{wrong}` in:\n{}", lost.text);
    }
    printed_command(
        &lost.text,
        "reattach (follows it, then fetches its results):",
    )
}

#[test]
fn a_dropped_network_leaves_the_job_running_and_attach_fetches_its_results() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let release = release_of(&bundle);
    let (gate_arg, gate) = host.gate();
    let running = Running::start(host.command(&bundle, &["--", &gate_arg]));
    running.wait_for("job: waiting at the gate");
    host.drop_connections();
    let lost = running.finish();
    let attach = expect_lost_connection(&lost);
    assert!(host.runs(&release).is_empty(), "results were fetched");
    assert!(
        attach.starts_with(&["deploy".into(), "attach".into()]),
        "{attach:?}"
    );

    // Reattached, it follows the job to its end and fetches its results.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(&attach).env(TEST_MARK, host.tmp.path());
    let attached = Running::start(cmd);
    attached.wait_for("job: waiting at the gate");
    fs::write(&gate, "").unwrap();
    attached.finish().expect_ok().expect_output(&[
        ": running\n",
        "job: done",
        "finished on ",
        ": exit status 0 after ",
        "results in ",
    ]);
    let runs = host.runs(&release);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].join("table.csv").is_file());
    assert!(runs[0].with_extension("exit").is_file());
}

#[test]
fn a_killed_control_master_leaves_the_job_running_and_cancel_stops_it() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let release = release_of(&bundle);
    let running = Running::start(host.command(&bundle, &["--", "--sleep=300"]));
    running.wait_for("job: sleeping");
    let masters: Vec<String> = processes_of(host.tmp.path())
        .into_iter()
        .filter(|p| p.contains("ControlMaster=yes"))
        .map(|p| p.split(':').next().unwrap().to_string())
        .collect();
    assert_eq!(masters.len(), 1, "{:?}", processes_of(host.tmp.path()));
    Command::new("kill")
        .args(["-KILL", &masters[0]])
        .status()
        .unwrap();
    let lost = running.finish();
    let attach = expect_lost_connection(&lost);
    let job = attach.last().unwrap().clone();
    assert!(host.runs(&release).is_empty(), "results were fetched");

    host.manage("logs", &[&job]).expect_ok().expect_output(&[
        &format!("job {job} of {release} on "),
        ": running",
        "job: sleeping",
    ]);
    host.manage("cancel", &[&job, "--grace", "5"])
        .expect_ok()
        .expect_output(&[
            &format!("sent SIGTERM to job {job}'s process group "),
            "it ended within ",
            &format!("job {job} of {release} on "),
            ": cancelled (SIGTERM) after ",
            "its results stay there",
        ]);
    assert!(
        within(Duration::from_secs(5), || processes_of(host.tmp.path())
            .iter()
            .all(|p| !p.contains("--sleep=300"))),
        "the job still runs: {:?}",
        processes_of(host.tmp.path())
    );
    host.manage("cancel", &[&job]).expect_ok().expect_output(&[
        "is not running (cancelled (SIGTERM) after ",
        "nothing to cancel",
    ]);
    host.manage("status", &[])
        .expect_ok()
        .expect_output(&[&format!("  {job}  {release}  cancelled (SIGTERM) after ")]);
    // Attaching to the ended job fetches what it left, and says how it ended.
    host.manage(
        "attach",
        &[&job, "--fetch-to", &host.fetched().display().to_string()],
    )
    .expect_failure(&[
        &format!("error: the job {job} failed on "),
        "found cancelled (SIGTERM) after ",
        "(results fetched into ",
    ]);
    assert_eq!(host.runs(&release).len(), 1);
}

#[test]
fn detach_returns_at_once_naming_the_commands_and_logs_follows_to_the_end() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let (gate_arg, gate) = host.gate();
    let started = Instant::now();
    let detached = host.deploy(&bundle, &["--detach", "--", &gate_arg]);
    detached.expect_ok().expect_output(&[
        "runs on ",
        ", detached; its results stay there until fetched.",
        "follow its log:   cargo xtask deploy logs --host ",
        "cancel it:        cargo xtask deploy cancel --host ",
        "its job runs detached",
    ]);
    assert!(started.elapsed() < Duration::from_secs(40));
    let follow = printed_command(&detached.text, "follow its log:");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(&follow).env(TEST_MARK, host.tmp.path());
    let following = Running::start(cmd);
    following.wait_for("job: waiting at the gate");
    fs::write(&gate, "").unwrap();
    following
        .finish()
        .expect_ok()
        .expect_output(&["job: done", ": ended: exit status 0 after "]);
    // Nothing was fetched: only `attach` fetches.
    assert!(host.runs(&release_of(&bundle)).is_empty());
}

#[test]
fn a_stale_lock_is_taken_over_and_unlock_breaks_one() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    fs::create_dir_all(host.remote()).unwrap();
    let dead = {
        let mut c = Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        c.id()
    };
    let old = "someone@elsewhere, pid 77, since 2026-01-01 00:00:00 UTC: old deploy";
    // A holder whose process ended without clearing the lock file.
    fs::write(host.lock_file(), format!("{old}\n@ pid {dead}\n")).unwrap();
    host.deploy(&bundle, &["--no-wait"])
        .expect_ok()
        .expect_output(&[&format!(
            "taking over the lock of the deploy folder {} on {}: it was held by {old}, which is \
         gone (its process on the host, pid {dead}, is gone)",
            host.remote().display(),
            host.target()
        )]);

    // A lock still held by a process that is no holder (it inherited the file), whose
    // holder is gone: the lock moves to a fresh file.
    fs::write(host.lock_file(), format!("{old}\n@ pid {dead}\n")).unwrap();
    let mut squatter = Command::new("flock")
        .arg(host.lock_file())
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    assert!(within(Duration::from_secs(5), || Command::new("flock")
        .args(["-n"])
        .arg(host.lock_file())
        .arg("true")
        .status()
        .is_ok_and(|s| !s.success())));
    host.manage("run", &["--no-wait"])
        .expect_ok()
        .expect_output(&[&format!(
            "it was held by {old}, which is gone (its process on the host, pid {dead}, is gone)"
        )]);
    let _ = squatter.kill();
    let _ = squatter.wait();
    let aside: Vec<String> = fs::read_dir(host.remote())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".lock.stale-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");

    // unlock: nothing held.
    host.manage("unlock", &[])
        .expect_ok()
        .expect_output(&[&format!(
            "the lock of {} on {} was free: no one held it",
            host.remote().display(),
            host.target()
        )]);
    // unlock: a deploy holds it; it is broken, and that deploy stops before switching.
    let two = host.bundle_of("other", &["libc.so.6"]);
    let holder = host.hold_the_lock(&two);
    host.manage("unlock", &[]).expect_ok().expect_output(&[
        &format!(
            "broke the lock of {} on {}, held by {}@",
            host.remote().display(),
            host.target(),
            user()
        ),
        "UTC: cargo xtask deploy, run ",
        "stopped its holding shell on the host (pid ",
    ]);
    host.let_go();
    holder.finish().expect_failure(&[
        "lost the lock of the deploy folder",
        "`current` was not switched",
    ]);
    assert_eq!(
        host.current(),
        Some(PathBuf::from(format!("releases/{}", release_of(&bundle))))
    );
    host.deploy(&two, &["--no-wait"]).expect_ok();
}

#[test]
fn ctrl_c_while_waiting_for_the_lock_leaves_no_waiter_on_the_host() {
    let host = Host::start();
    let one = host.bundle_of("job", &["libc.so.6"]);
    let two = host.bundle_of("other", &["libc.so.6"]);
    let first = host.hold_the_lock(&one);
    let mut second = Running::start(host.command(&two, &[]));
    second.wait_for("waiting (up to 600s) for the deploy folder");
    let pid = second.child.id();
    let mine = format!("pid {pid}, since");
    let waiters = || -> Vec<String> {
        processes_of(host.tmp.path())
            .into_iter()
            .filter(|p| p.contains("stepgraph-lock") && p.contains(&mine))
            .collect()
    };
    assert!(!waiters().is_empty(), "no waiter to stop");
    Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    let mut exit = None;
    let gone = within(Duration::from_secs(5), || {
        if exit.is_none() {
            exit = second.child.try_wait().unwrap();
        }
        exit.is_some() && waiters().is_empty()
    });
    assert!(
        gone,
        "5 s after SIGINT: {exit:?}, waiters {:?}\n{}",
        waiters(),
        second.shown()
    );
    assert_eq!(exit.and_then(|s| s.code()), Some(130));
    second
        .finish()
        .expect_failure(&["interrupted by SIGINT during the wait for the deploy folder's lock"]);
    // The first goes on and lets the lock go; no one takes it after.
    host.let_go();
    first.finish().expect_ok();
    std::thread::sleep(Duration::from_secs(1));
    let lock = fs::read_to_string(host.lock_file()).unwrap();
    assert!(
        !lock.contains(&mine),
        "the stopped waiter took the lock: {lock}"
    );
    assert!(lock.is_empty(), "the lock was not cleared: {lock}");
    assert_eq!(release_folders(&host), [release_of(&one)]);
}

#[test]
fn keep_running_on_interrupt_leaves_the_job_and_names_attach_and_cancel() {
    let host = Host::start();
    let bundle = host.bundle(&["libc.so.6"]);
    let mut running = Running::start(host.command(
        &bundle,
        &["--keep-running-on-interrupt", "--", "--sleep=300"],
    ));
    running.wait_for("job: sleeping");
    let pid = running.child.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status().unwrap();
    let mut exit = None;
    assert!(within(Duration::from_secs(10), || {
        exit = running.child.try_wait().unwrap();
        exit.is_some()
    }));
    assert_eq!(exit.and_then(|s| s.code()), Some(130));
    let left = running.finish();
    left.expect_failure(&[
        "interrupted by SIGINT while following the job 20",
        "which goes on there (--keep-running-on-interrupt); its results were not fetched",
        "cancel it:\n  cargo xtask deploy cancel --host ",
    ]);
    let sleeping = || {
        processes_of(host.tmp.path())
            .iter()
            .any(|p| p.contains("--sleep=300"))
    };
    assert!(sleeping(), "the job was stopped");
    let cancel = printed_command(&left.text, "cancel it:");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(&cancel).env(TEST_MARK, host.tmp.path());
    host.output(&mut cmd)
        .expect_ok()
        .expect_output(&["sent SIGTERM to job ", ": cancelled (SIGTERM) after "]);
    assert!(within(Duration::from_secs(5), || !sleeping()));
}
