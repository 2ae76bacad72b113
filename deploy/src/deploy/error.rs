//! The ways a deploy fails, each naming what was expected and what was found.

use std::path::PathBuf;

use crate::bundle::manifest::Mismatch;

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error(
        "`{tool}` is not installed here: expected it on PATH to {why} (Debian: apt-get install {package})"
    )]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
        why: &'static str,
    },

    #[error("no ssh key at {}: expected a private key file there (--key), found {found}", path.display())]
    MissingKey { path: PathBuf, found: String },

    #[error("cannot reach {host}: expected an ssh server on port {port}, found {found}")]
    Unreachable {
        host: String,
        port: u16,
        found: String,
    },

    #[error(
        "ssh could not use {key}: expected a private key it can read, found ssh saying:\n  \
         {found}\n({hint})"
    )]
    KeyUnusable {
        key: String,
        found: String,
        hint: String,
    },

    #[error("{login} refused the login: expected it to accept {key}, found `{found}`")]
    AuthRefused {
        login: String,
        key: String,
        found: String,
    },

    #[error(
        "permission denied on {host}: expected {who} to be allowed to {access} {path}, found \
         `{found}`\n({})",
        permission_hint(*here, path)
    )]
    PermissionDenied {
        host: String,
        who: String,
        /// `write` (or `read`, for what rsync sends).
        access: &'static str,
        path: String,
        found: String,
        /// On this machine, not on the host.
        here: bool,
    },

    #[error(
        "the host key of {host} is not the one known: expected the key recorded in {known_hosts}, found `{found}`"
    )]
    HostKeyChanged {
        host: String,
        known_hosts: String,
        found: String,
    },

    #[error(
        "`rsync` is not installed on {host}: expected it on the remote PATH to copy the bundle, found `{found}`"
    )]
    RsyncMissingOnHost { host: String, found: String },

    #[error("the disk of {host} is full: expected room for {what} in {place}, found `{found}`")]
    DiskFull {
        host: String,
        what: &'static str,
        place: String,
        found: String,
    },

    #[error(
        "checksum mismatch on {host} in {place} after the copy; `current` was not switched:{}\n\
         (`sha256sum -c SHA256SUMS` in the bundle here says whether it changed since it was built)",
        list(mismatches)
    )]
    ChecksumMismatch {
        host: String,
        place: String,
        mismatches: Vec<Mismatch>,
    },

    #[error(
        "preflight failed on {host} ({} of its checks); `current` was not switched:{}",
        failures.len(),
        list(failures)
    )]
    PreflightFailed { host: String, failures: Vec<String> },

    #[error(
        "the preflight on {host} did not finish within {seconds}s (--preflight-timeout), so it \
         was stopped; `current` was not switched{}\n(a hung `nvidia-smi` is a common sign of a sick \
         GPU or driver: run `nvidia-smi` on the host to see)",
        if failures.is_empty() { String::new() } else { format!(":{}", list(failures)) }
    )]
    PreflightTimedOut {
        host: String,
        seconds: u64,
        failures: Vec<String>,
    },

    #[error(
        "the deploy folder {dir} on {host} is in use: expected no other deploy there, found \
         its lock held by {holder}{}",
        match waited {
            Some(s) => format!(" after waiting {s}s (--lock-timeout)"),
            None => "; wait for it, or drop --no-wait to wait".to_string(),
        }
    )]
    Locked {
        host: String,
        dir: String,
        holder: String,
        waited: Option<u64>,
    },

    #[error(
        "lost the lock of the deploy folder {dir} on {host} (the connection dropped?); \
         `current` was not switched"
    )]
    LockLost { host: String, dir: String },

    #[error(
        "no release is live in {dir} on {host}: expected `current` to point at one, found {found}"
    )]
    NoCurrent {
        host: String,
        dir: String,
        found: String,
    },

    #[error(
        "`current` in {dir} on {host} points at releases/{release}, which no longer exists: \
         expected the release it names, found no such folder\n(deploy again to make a release \
         current, or `cargo xtask deploy rollback` to go back to the one it was deployed over)"
    )]
    CurrentGone {
        host: String,
        dir: String,
        release: String,
    },

    #[error(
        "the release {release} on {host} is damaged: expected its files to match its \
         SHA256SUMS and its name, found:{}\n(nothing was run: `cargo xtask deploy rollback` goes \
         back to the previous verified release, a deploy of the bundle uploads it again)",
        list(why)
    )]
    ReleaseDamaged {
        host: String,
        release: String,
        why: Vec<String>,
    },

    #[error(
        "no release to roll back to on {host}: expected an earlier verified release that \
         {current} was deployed over, found {found}"
    )]
    NoRollback {
        host: String,
        current: String,
        found: String,
    },

    #[error("{step} on {host} did not finish within {seconds}s, so it was stopped")]
    TimedOut {
        step: &'static str,
        host: String,
        seconds: u64,
    },

    #[error(
        "interrupted by {signal} during {step} on {host}: what ran there was stopped and the \
         connection closed"
    )]
    Interrupted {
        signal: &'static str,
        step: &'static str,
        host: String,
    },

    /// Boxed: the largest variant, which would make every `Result` carry its size.
    #[error(transparent)]
    JobFailed(Box<JobFailure>),

    #[error(
        "lost the connection to {host} while {what}, found {found}: the job was not \
         stopped, and its results were not fetched; {state}\nreattach (follows it, then fetches \
         its results):\n  {attach}"
    )]
    ConnectionLost {
        host: String,
        /// What it was doing, naming the job: `following the job 20261129T170512Z-4242`.
        what: String,
        found: String,
        state: String,
        attach: String,
    },

    #[error(
        "interrupted by {signal} while following the job {job} on {host}, which goes on there \
         (--keep-running-on-interrupt); its results were not fetched\nreattach (follows it, then \
         fetches its results):\n  {attach}\ncancel it:\n  {cancel}"
    )]
    JobLeftRunning {
        signal: &'static str,
        host: String,
        job: String,
        attach: String,
        cancel: String,
    },

    #[error(
        "the job {job} on {host} was followed for {seconds}s, past its own time limit, without \
         an end; its results were not fetched; {state}\nreattach:\n  {attach}"
    )]
    JobOverdue {
        host: String,
        job: String,
        seconds: u64,
        state: String,
        attach: String,
    },

    #[error("no job {job} in {dir} on {host}: expected one of its runs, found {found}")]
    NoSuchJob {
        host: String,
        dir: String,
        job: String,
        found: String,
    },

    #[error("which job? {dir} on {host} has {count} running: {found}; name one (`cancel JOB`)")]
    WhichJob {
        host: String,
        dir: String,
        count: usize,
        found: String,
    },

    #[error(
        "{step} failed on {host}: expected exit status 0, found {status}{}",
        detail(stderr)
    )]
    Step {
        step: &'static str,
        host: String,
        status: String,
        stderr: String,
    },
}

/// A job that did not exit with status 0 (its results were fetched all the same).
#[derive(Debug, thiserror::Error)]
#[error(
    "the job {job} failed on {host}: expected `{command}` to exit with status 0, found {status}; its last lines:\n{}\n(results fetched into {})",
    tail.iter().map(|l| format!("  | {l}")).collect::<Vec<_>>().join("\n"),
    results.display()
)]
pub struct JobFailure {
    pub host: String,
    pub job: String,
    pub command: String,
    pub status: String,
    pub tail: Vec<String>,
    pub results: PathBuf,
}

pub fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|i| format!("\n  - {i}")).collect()
}

/// What to look at when `path` was refused: on the host, the deploy folder's modes;
/// here, the bundle's and --fetch-to's.
fn permission_hint(here: bool, path: &str) -> String {
    let folder = match std::path::Path::new(path).parent() {
        Some(p) if !p.as_os_str().is_empty() => p.display().to_string(),
        _ => path.to_string(),
    };
    let ls = format!("`ls -ld {}`", crate::cmd::quote(&folder));
    if here {
        format!(
            "the bundle must be readable and --fetch-to writable by this user: {ls} shows the owner and mode"
        )
    } else {
        format!(
            "the deploy folder, its releases/ and runs/ must be writable by that user on the \
             host: {ls} there shows the owner and mode"
        )
    }
}

fn detail(stderr: &str) -> String {
    let text = stderr.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(":\n{text}")
    }
}
