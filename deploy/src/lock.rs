//! A lock per folder this crate writes and others read (a bundle folder): `flock(2)` on a
//! file beside it, `<folder>.lock`, through `std::fs::File::lock`. The kernel drops the
//! lock when its holder exits, however it exits, so a lock is never left stale; the
//! file only holds a description of the last holder, shown to whoever waits.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::interrupt;

/// What to do when another process holds a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Wait for it, at most this long, saying so.
    Upto(Duration),
    /// Fail at once, naming the holder.
    No,
}

/// How long a command waits for a lock unless told otherwise.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(600);

/// A held lock on a folder; released when dropped.
#[derive(Debug)]
pub struct FolderLock {
    path: PathBuf,
    _file: File,
}

impl FolderLock {
    /// Takes the lock of `folder` (`<folder>.lock`, made if missing), doing `wait`'s
    /// bidding while another process holds it. `what` describes the holder for others
    /// (`cargo xtask bundle fork_join`).
    pub fn take(folder: &Path, what: &str, wait: Wait) -> Result<FolderLock> {
        let path = lock_path(folder);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("could not create {}", parent.display()))?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("could not open the lock file {}", path.display()))?;
        let started = Instant::now();
        let mut said = false;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("could not lock {}", path.display()));
                }
            }
            let holder = holder(&mut file);
            match wait {
                Wait::No => bail!(
                    "{} is in use: expected no other command writing or reading it, found the \
                     lock {} held by {holder}; wait for it, or drop --no-wait to wait",
                    folder.display(),
                    path.display()
                ),
                Wait::Upto(limit) if started.elapsed() >= limit => bail!(
                    "{} is in use: waited {}s for the lock {}, still held by {holder}",
                    folder.display(),
                    limit.as_secs(),
                    path.display()
                ),
                Wait::Upto(limit) if !said => {
                    eprintln!(
                        "waiting (up to {}s) for {}: the lock {} is held by {holder}",
                        limit.as_secs(),
                        folder.display(),
                        path.display()
                    );
                    said = true;
                }
                Wait::Upto(_) => {}
            }
            if let Some(signal) = interrupt::requested() {
                bail!(
                    "interrupted by {signal} while waiting for the lock {}",
                    path.display()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
        // Only the holder writes the file; a reader sees the old text or the new.
        let _ = file.set_len(0).and_then(|()| {
            file.rewind()?;
            file.write_all(describe_holder(what).as_bytes())
        });
        Ok(FolderLock { path, _file: file })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `<folder>.lock`, beside the folder (inside it, it would be part of the bundle).
pub fn lock_path(folder: &Path) -> PathBuf {
    let mut name = folder
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "folder".into());
    name.push(".lock");
    folder.with_file_name(name)
}

/// Who holds a lock, as its file says.
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.rewind().and_then(|()| file.read_to_string(&mut text));
    let text = text.trim();
    if text.is_empty() {
        "another process (it has not said which)".into()
    } else {
        text.to_string()
    }
}

/// `root@gpu-box, pid 4242: cargo xtask bundle dqn`: who holds a lock, for whoever waits.
pub fn describe_holder(what: &str) -> String {
    format!("{}, pid {}: {what}", who(), std::process::id())
}

/// `user@host` of this process, as far as it can tell.
pub fn who() -> String {
    let host = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            let out = std::process::Command::new("id").arg("-un").output().ok()?;
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    format!("{user}@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_taker_fails_or_waits_and_a_dropped_lock_is_free() {
        let tmp = tempfile::tempdir().unwrap();
        let folder = tmp.path().join("bundle-job");
        let first = FolderLock::take(&folder, "the first", Wait::No).unwrap();
        assert_eq!(first.path(), tmp.path().join("bundle-job.lock"));

        let err = FolderLock::take(&folder, "the second", Wait::No)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bundle-job is in use"), "{err}");
        assert!(err.contains(": the first"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );

        let err = FolderLock::take(&folder, "x", Wait::Upto(Duration::from_millis(300)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("waited 0s for the lock"), "{err}");

        let waiter = thread::spawn({
            let folder = folder.clone();
            move || FolderLock::take(&folder, "the waiter", Wait::Upto(Duration::from_secs(20)))
        });
        thread::sleep(Duration::from_millis(300));
        drop(first);
        let second = waiter.join().unwrap().unwrap();
        let text = fs::read_to_string(second.path()).unwrap();
        assert!(text.ends_with(": the waiter"), "{text}");
    }
}
