//! Ctrl-C and SIGTERM as a request to stop, not an abrupt exit: a command that leaves
//! things behind elsewhere (a job on a GPU host, a shared ssh connection, a lock) installs
//! the handler, polls [`requested`] while it waits on its children, and unwinds through
//! its guards' `Drop`s when it is set. A second signal exits at once (with the status
//! of the first's kind, see [`exit_status`]), for when the clean-up itself hangs.
//!
//! The handler only stores the signal's number (signal-hook's `flag` module: an atomic
//! store, nothing else in the handler); the work happens in the waiting loops.

use std::process::{Child, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};

/// The exit status of a command stopped by `signal` (as [`requested`] names it), the
/// shells' 128 + its number: 130 for SIGINT, 143 for SIGTERM. A job scheduler or a
/// service manager reads 143 as "stopped as asked", 130 as "interrupted at the terminal".
pub fn exit_status(signal: &str) -> i32 {
    128 + if signal == "SIGINT" { SIGINT } else { SIGTERM }
}

/// How often a waiting loop looks at its child and at the flag.
const POLL: Duration = Duration::from_millis(20);

static SIGNAL: OnceLock<Arc<AtomicUsize>> = OnceLock::new();
static INSTALL: Mutex<()> = Mutex::new(());

/// Turns SIGINT and SIGTERM into a request to stop (see the module docs). Idempotent.
pub fn install() -> Result<()> {
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if SIGNAL.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        // Registered first, so it sees `seen` as it was before this signal: the first
        // signal only sets it, the second (of either kind) exits, with its own status.
        signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, Arc::clone(&seen))
            .context("installing the signal handler")?;
        signal_hook::flag::register(signal, Arc::clone(&seen))
            .context("installing the signal handler")?;
        signal_hook::flag::register_usize(signal, Arc::clone(&flag), signal as usize)
            .context("installing the signal handler")?;
    }
    let _ = SIGNAL.set(flag);
    Ok(())
}

/// The signal that asked to stop (`SIGINT`, `SIGTERM`), if one came since [`install`].
pub fn requested() -> Option<&'static str> {
    match SIGNAL.get()?.load(Ordering::SeqCst) {
        0 => None,
        s if s == SIGINT as usize => Some("SIGINT"),
        _ => Some("SIGTERM"),
    }
}

/// How a wait on a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The child exited.
    Exited(ExitStatus),
    /// The limit passed; the child still runs.
    TimedOut,
    /// A signal asked to stop; the child still runs.
    Interrupted(&'static str),
}

/// Waits for `child` until it exits, `deadline` passes or (when `interruptible`) a
/// signal asks to stop.
pub fn wait(
    child: &mut Child,
    deadline: Option<Instant>,
    interruptible: bool,
) -> std::io::Result<Waited> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Waited::Exited(status));
        }
        if let Some(signal) = requested().filter(|_| interruptible) {
            return Ok(Waited::Interrupted(signal));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(Waited::TimedOut);
        }
        thread::sleep(POLL);
    }
}

/// Waits up to `grace` for `child` to exit on its own, then kills its process group (the
/// children this crate spawns for a remote step lead groups of their own: rsync and its
/// ssh go together) and reaps it.
pub fn stop(child: &mut Child, grace: Duration) -> std::io::Result<ExitStatus> {
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        thread::sleep(POLL);
    }
    kill_group(child.id());
    let _ = child.kill();
    child.wait()
}

/// `kill -KILL -- -PGID`, through the `kill` program rather than an unsafe libc call:
/// it runs only when a command is being stopped.
fn kill_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    use super::*;

    #[test]
    fn a_signal_s_exit_status_is_the_shells_one() {
        assert_eq!(exit_status("SIGINT"), 130);
        assert_eq!(exit_status("SIGTERM"), 143);
    }

    #[test]
    fn a_wait_ends_on_exit_or_at_its_deadline() {
        let mut quick = Command::new("true").spawn().unwrap();
        assert!(matches!(wait(&mut quick, None, true).unwrap(), Waited::Exited(s) if s.success()));

        let mut slow = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let start = Instant::now();
        let deadline = start + Duration::from_millis(200);
        assert_eq!(
            wait(&mut slow, Some(deadline), true).unwrap(),
            Waited::TimedOut
        );
        let status = stop(&mut slow, Duration::from_millis(100)).unwrap();
        assert!(!status.success());
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
