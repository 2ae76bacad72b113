//! The lock of a deploy folder on the host: `flock` on `<dir>/.lock`, held by a shell
//! that a session of the shared ssh connection keeps open ([`LOCK`]). It goes when that
//! session ends, however it ends: the deploy's `Drop` closes its stdin, and a deploy that
//! is killed outright closes it too (the pipe's writer is gone), so the lock is never
//! left stale. The file holds a description of the holder, shown to whoever waits.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::error::DeployError;
use super::remote::Script;
use super::ssh::{Ssh, echo};
use crate::cmd;
use crate::interrupt;
use crate::lock::Wait;

/// `LOCK DIR WAIT_S HOLDER`: takes the lock of the deploy folder DIR (made if missing),
/// waiting at most WAIT_S seconds (0: not at all) after printing `busy <holder>`; then
/// writes HOLDER into the lock file, prints `locked` and holds the lock until its stdin
/// closes. Exits 75 when the lock stayed taken.
pub const LOCK: Script = Script {
    name: "lock",
    text: r#"set -u
dir=$1 wait_s=$2 holder=$3
mkdir -p -- "$dir" || exit 3
exec 9>>"$dir/.lock" || exit 3
if ! flock -n 9; then
    printf 'busy %s\n' "$(head -c 600 -- "$dir/.lock" | tr '\n' ' ')"
    if [ "$wait_s" = 0 ]; then
        exit 75
    fi
    flock -w "$wait_s" 9 || exit 75
fi
printf '%s\n' "$holder" >"$dir/.lock"
echo locked
cat >/dev/null
"#,
};

/// The lock of a deploy folder, held until dropped.
#[derive(Debug)]
pub struct RemoteLock {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl RemoteLock {
    /// Takes the lock of `dir` on the host, doing `wait`'s bidding while another deploy
    /// holds it. `None` in a dry run.
    pub fn take(
        ssh: &Ssh,
        dir: &str,
        holder: &str,
        wait: Wait,
        dry_run: bool,
    ) -> Result<Option<RemoteLock>> {
        let wait_s = match wait {
            Wait::No => 0,
            Wait::Upto(d) => d.as_secs().max(1),
        };
        let mut words = vec![
            "bash".to_string(),
            "-c".into(),
            LOCK.text.into(),
            "stepgraph-lock".into(),
        ];
        let args = [dir.to_string(), wait_s.to_string(), holder.to_string()];
        words.extend(args.iter().cloned());
        let mut shown = words.clone();
        shown[2] = "@lock-script@".into();
        if dry_run {
            echo(format!(
                "{}\n  (the lock script, passed to `bash -c`:)\n{}",
                cmd::display(&ssh.exec(&shown)),
                LOCK.text
            ));
            return Ok(None);
        }
        echo(cmd::display(&ssh.exec(&shown)));
        let mut command = ssh.exec(&words);
        {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("could not start ssh for the deploy folder's lock")?;
        let stdin = child.stdin.take();
        let (lines, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout is piped");
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lock = RemoteLock { child, stdin };
        // The host's own wait, plus the connection's.
        let deadline = Instant::now()
            + Duration::from_secs(wait_s + u64::from(ssh.connect_timeout_s))
            + Duration::from_secs(10);
        let mut holder_seen = None;
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) if line == "locked" => return Ok(Some(lock)),
                Ok(line) => {
                    if let Some(h) = line.strip_prefix("busy ") {
                        let h = h.trim().to_string();
                        if wait != Wait::No {
                            eprintln!(
                                "waiting (up to {wait_s}s) for the deploy folder {dir} on {}: \
                                 its lock is held by {h} (--no-wait fails instead)",
                                ssh.target
                            );
                        }
                        holder_seen = Some(h);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = lock.child.wait()?;
                    let mut stderr = String::new();
                    if let Some(mut e) = lock.child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut stderr);
                    }
                    return Err(match (status.code(), holder_seen) {
                        (Some(75), Some(holder)) => DeployError::Locked {
                            host: ssh.target.to_string(),
                            dir: dir.to_string(),
                            holder,
                            waited: (wait != Wait::No).then_some(wait_s),
                        },
                        _ => ssh.classify(&stderr, None).unwrap_or(DeployError::Step {
                            step: "taking the deploy folder's lock",
                            host: ssh.target.to_string(),
                            status: super::ssh::describe(status),
                            stderr,
                        }),
                    }
                    .into());
                }
            }
            if let Some(signal) = interrupt::requested() {
                return Err(DeployError::Interrupted {
                    signal,
                    step: "the wait for the deploy folder's lock",
                    host: ssh.target.to_string(),
                }
                .into());
            }
            if Instant::now() >= deadline {
                return Err(DeployError::TimedOut {
                    step: "taking the deploy folder's lock",
                    host: ssh.target.to_string(),
                    seconds: wait_s,
                }
                .into());
            }
        }
    }

    /// Whether the session holding the lock is still there (a lost connection ends it,
    /// and the lock with it).
    pub fn held(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for RemoteLock {
    fn drop(&mut self) {
        // EOF to the holding shell, which then exits and the lock goes with it.
        drop(self.stdin.take());
        let _ = interrupt::stop(&mut self.child, Duration::from_secs(3));
    }
}
