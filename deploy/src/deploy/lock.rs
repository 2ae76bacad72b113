//! The lock of a deploy folder on the host: `flock` on `<dir>/.lock`, held by a shell
//! that a session of the shared ssh connection keeps open ([`LOCK`]). It covers the
//! changes to the folder (an upload, the switch of `current`, `clean`, `rollback`) and
//! the start of a job, not the job's run.
//!
//! The holding shell lets go when its client does, however that happens: when the
//! client closes its stdin (its `Drop`, or its death), and when the client falls silent
//! (a connection lost without a word): the client sends a beat every [`BEAT`], and the
//! holder gives up after [`LEASE`] without one. The file names the holder (shown to
//! whoever waits) and the holding shell's pid on the host, so that a waiter can tell a
//! holder that is gone: one whose process ended without clearing the file, one that let
//! go when its client fell silent, one whose pid is gone while something else (a process
//! that inherited the file) keeps it locked, or one that stopped beating. A waiter takes
//! such a lock over, saying whose it was. A waiter whose client goes away (Ctrl-C, a lost
//! connection) stops at once: it reads its stdin while it waits, and ends at its end.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::{OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::error::DeployError;
use super::remote::Script;
use super::ssh::{Ssh, echo};
use crate::cmd;
use crate::interrupt;
use crate::lock::Wait;

/// How often the client tells the holding shell that it is still there.
pub const BEAT: Duration = Duration::from_secs(5);

/// How long the holding shell waits for a beat before it lets go (a lost connection).
pub const LEASE: Duration = Duration::from_secs(30);

/// Shell functions the lock scripts share. `holder_pid`: the holding shell's pid, from the
/// lock file's `@ pid N` line. `is_holder PID`: whether PID is a holding shell of a deploy
/// (not another process that got its number since). `gone LEASE_S`: why the holder the
/// lock file names is gone, or nothing while it is there.
const LOCK_FUNCTIONS: &str = r#"holder_pid() {
    sed -n 's/^@ pid \([0-9][0-9]*\)$/\1/p' -- "$lock" 2>/dev/null | head -n 1
}
is_holder() {
    [ -n "$1" ] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q stepgraph-lock
}
gone() {
    local pid age
    if grep -q '^@ expired' -- "$lock" 2>/dev/null; then
        echo "its client fell silent for $1s (a lost connection), so the host let it go"
        return
    fi
    pid="$(holder_pid)"
    [ -n "$pid" ] || return 0
    if ! is_holder "$pid"; then
        echo "its process on the host, pid $pid, is gone"
        return
    fi
    age=$(($(date +%s) - $(stat -c %Y -- "$lock" 2>/dev/null || date +%s)))
    if [ "$age" -gt $(($1 + 10)) ]; then
        echo "its client has not answered for ${age}s"
    fi
}
"#;

/// `LOCK DIR WAIT_S HOLDER LEASE_S`: takes the lock of the deploy folder DIR (made if
/// missing), waiting at most WAIT_S seconds (0: not at all) after printing `busy
/// <holder>`; a holder that is gone is taken over (`stale <why>\t<holder>` while
/// waiting, `left <why>\t<holder>` for one that let go without clearing the file). Then
/// writes HOLDER and its own pid into the lock file, prints `locked` and holds the lock
/// while its stdin brings a line at least every LEASE_S seconds. Exits 75 when the lock
/// stayed taken, 76 when its client went away while it waited.
pub const LOCK: Script = Script {
    name: "lock",
    text: r#"set -u
dir=$1 wait_s=$2 holder=$3 lease_s=$4
lock="$dir/.lock"
mkdir -p -- "$dir" || exit 3
@FUNCTIONS@
exec 9>>"$lock" || exit 3
said=
start="$(date +%s)"
while :; do
    if flock -n 9; then
        # A lock broken by hand is moved aside: the file locked must still be the lock.
        if [ "$(stat -L -c %d:%i /dev/fd/9)" = "$(stat -c %d:%i -- "$lock" 2>/dev/null)" ]; then
            break
        fi
        exec 9>&- 9>>"$lock" || exit 3
        continue
    fi
    why="$(gone "$lease_s")"
    if [ -n "$why" ]; then
        printf 'stale %s\t%s\n' "$why" "$(head -n 1 -- "$lock")"
        pid="$(holder_pid)"
        if is_holder "$pid"; then
            kill -TERM "$pid" 2>/dev/null
        fi
        for _ in $(seq 30); do
            flock -n 9 && break
            sleep 0.1
        done
        if ! flock -n 9; then
            # Held by a process that is no holder (it inherited the file): not ours to
            # kill, so the lock moves to a fresh file.
            mv -f -- "$lock" "$lock.stale-$(date +%s)"
            exec 9>&- 9>>"$lock" || exit 3
        fi
        continue
    fi
    if [ -z "$said" ]; then
        pid="$(holder_pid)"
        printf 'busy %s%s\n' "$(head -n 1 -- "$lock")" "${pid:+ (pid $pid on the host)}"
        said=1
    fi
    if [ "$wait_s" = 0 ] || [ $(($(date +%s) - start)) -ge "$wait_s" ]; then
        exit 75
    fi
    # The client's end of stdin: it went away (Ctrl-C, a lost connection), so must this.
    IFS= read -r -t 0.2 _
    rc=$?
    if [ "$rc" != 0 ] && [ "$rc" -le 128 ]; then
        exit 76
    fi
done
previous="$(head -n 1 /dev/fd/9)"
if [ -n "$previous" ]; then
    why="$(gone "$lease_s")"
    printf 'left %s\t%s\n' "${why:-it ended without clearing the lock}" "$previous"
fi
# Through the descriptor: the file it locked, even if it has been moved aside since.
printf '%s\n@ pid %s\n' "$holder" "$$" >/dev/fd/9
echo locked
while :; do
    IFS= read -r -t "$lease_s" _
    rc=$?
    [ "$rc" = 0 ] || break
    touch -c /dev/fd/9
done
if [ "$rc" -gt 128 ]; then
    printf '%s\n@ expired\n' "$holder" >/dev/fd/9
else
    : >/dev/fd/9
fi
"#,
};

/// `UNLOCK DIR`: breaks the lock of DIR. Prints `none` (no one held it), `left <holder>`
/// (free, but its last holder ended without clearing it: cleared now), or `held <holder>`
/// and then `stopped <pid>` (the holding shell, stopped), `released` or `moved <file>`
/// (still held by a process that is no holder: the lock moved to a fresh file).
pub const UNLOCK: Script = Script {
    name: "unlock",
    text: r#"set -u
lock="$1/.lock"
@FUNCTIONS@
if [ ! -e "$lock" ]; then
    echo none
    exit 0
fi
holder="$(head -n 1 -- "$lock")"
if flock -n "$lock" true; then
    if [ -n "$holder" ]; then
        : >"$lock"
        printf 'left %s\n' "$holder"
    else
        echo none
    fi
    exit 0
fi
pid="$(holder_pid)"
printf 'held %s (pid %s on the host)\n' "$holder" "${pid:-unknown}"
if is_holder "$pid"; then
    kill -TERM "$pid" 2>/dev/null && printf 'stopped %s\n' "$pid"
fi
for _ in $(seq 30); do
    if flock -n "$lock" true; then
        if [ "$(head -n 1 -- "$lock")" = "$holder" ]; then
            : >"$lock"
        fi
        echo released
        exit 0
    fi
    sleep 0.1
done
aside="$lock.broken-$(date +%s)"
mv -f -- "$lock" "$aside"
printf 'moved %s\n' "$aside"
"#,
};

/// The text of a lock script, its shared functions in place.
fn script_text(script: &Script) -> String {
    script.text.replace("@FUNCTIONS@", LOCK_FUNCTIONS)
}

/// The lock of a deploy folder, held until dropped.
#[derive(Debug)]
pub struct RemoteLock {
    child: Child,
    /// Dropped to stop the beats, which closes the holder's stdin: it lets go.
    beats: Option<mpsc::Sender<()>>,
    beating: Option<thread::JoinHandle<()>>,
}

impl RemoteLock {
    /// Takes the lock of `dir` on the host, doing `wait`'s bidding while another deploy
    /// holds it, and taking over one whose holder is gone. `None` in a dry run.
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
        let text = script_text(&LOCK);
        let mut words = vec![
            "bash".to_string(),
            "-c".into(),
            text.clone(),
            "stepgraph-lock".into(),
        ];
        let args = [
            dir.to_string(),
            wait_s.to_string(),
            holder.to_string(),
            LEASE.as_secs().to_string(),
        ];
        words.extend(args.iter().cloned());
        let mut shown = words.clone();
        shown[2] = "@lock-script@".into();
        if dry_run {
            echo(format!(
                "{}\n  (the lock script, passed to `bash -c`:)\n{text}",
                cmd::display(&ssh.exec(&shown)),
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
        let stdin = child.stdin.take().expect("stdin is piped");
        let (beats, stop) = mpsc::channel::<()>();
        let beating = thread::spawn(move || beat(stdin, &stop));
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
        let mut lock = RemoteLock {
            child,
            beats: Some(beats),
            beating: Some(beating),
        };
        // The host's own wait, plus the connection's and a takeover's.
        let deadline = Instant::now()
            + Duration::from_secs(wait_s + u64::from(ssh.connect_timeout_s))
            + Duration::from_secs(15);
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
                    } else if let Some(rest) =
                        line.strip_prefix("stale ").or(line.strip_prefix("left "))
                    {
                        let (why, old) = rest.split_once('\t').unwrap_or((rest, ""));
                        let old = if old.trim().is_empty() {
                            "a holder that left no name"
                        } else {
                            old.trim()
                        };
                        eprintln!(
                            "taking over the lock of the deploy folder {dir} on {}: it was held \
                             by {old}, which is gone ({why})",
                            ssh.target
                        );
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
            // Returning drops the lock: its stdin closes and the waiter on the host ends.
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

/// Sends the holder a line every [`BEAT`] until `stop` says to (or is dropped), then
/// closes its stdin by dropping it.
fn beat(mut stdin: impl Write, stop: &mpsc::Receiver<()>) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(BEAT) {
        if stdin.write_all(b"\n").and_then(|()| stdin.flush()).is_err() {
            break;
        }
    }
}

impl Drop for RemoteLock {
    fn drop(&mut self) {
        // The beats stop and the holder's stdin closes: it clears the file and exits,
        // and the lock goes with it.
        drop(self.beats.take());
        if let Some(beating) = self.beating.take() {
            let _ = beating.join();
        }
        let _ = interrupt::stop(&mut self.child, Duration::from_secs(3));
    }
}

/// What [`unlock`] found and did.
#[derive(Debug, PartialEq, Eq)]
pub enum Unlocked {
    /// No one held the lock.
    Free,
    /// Free, but its last holder ended without clearing it: cleared.
    Left { holder: String },
    /// Held: broken. `stopped`: the holding shell's pid, stopped; `moved`: where the
    /// lock file went when a process that is no holder kept it.
    Broken {
        holder: String,
        stopped: Option<String>,
        moved: Option<String>,
    },
}

impl Unlocked {
    /// [`UNLOCK`]'s lines.
    pub fn parse(text: &str) -> Unlocked {
        let mut out = Unlocked::Free;
        for line in text.lines() {
            if let Some(h) = line.strip_prefix("left ") {
                out = Unlocked::Left {
                    holder: h.to_string(),
                };
            } else if let Some(h) = line.strip_prefix("held ") {
                out = Unlocked::Broken {
                    holder: h.to_string(),
                    stopped: None,
                    moved: None,
                };
            } else if let Unlocked::Broken { stopped, moved, .. } = &mut out {
                if let Some(p) = line.strip_prefix("stopped ") {
                    *stopped = Some(p.to_string());
                } else if let Some(f) = line.strip_prefix("moved ") {
                    *moved = Some(f.to_string());
                }
            }
        }
        out
    }
}

/// The [`UNLOCK`] script with its functions in place, made once.
pub fn unlock_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script {
        name: UNLOCK.name,
        text: Box::leak(script_text(&UNLOCK).into_boxed_str()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_scripts_get_their_functions() {
        for script in [&LOCK, &UNLOCK] {
            let text = script_text(script);
            assert!(!text.contains("@FUNCTIONS@"), "{}", script.name);
            assert!(text.contains("is_holder() {"), "{}", script.name);
        }
        // The holder is known by the name its shell is given.
        assert!(LOCK_FUNCTIONS.contains("grep -q stepgraph-lock"));
    }

    #[test]
    fn unlock_s_lines_are_read() {
        assert_eq!(Unlocked::parse("none\n"), Unlocked::Free);
        assert_eq!(
            Unlocked::parse("left me@h, pid 4\n"),
            Unlocked::Left {
                holder: "me@h, pid 4".into()
            }
        );
        assert_eq!(
            Unlocked::parse("held me (pid 9 on the host)\nstopped 9\nreleased\n"),
            Unlocked::Broken {
                holder: "me (pid 9 on the host)".into(),
                stopped: Some("9".into()),
                moved: None
            }
        );
    }
}
