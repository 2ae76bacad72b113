//! What the host records of a job, and how it reads: its id ([`JobRef`]), how it ended
//! (its exit file, [`Ending`]) and how it stands ([`State`]). Plain data, shared by the
//! jobs' commands and the folder's report.

/// A job on the host: the release it runs and its run, whose name is the job's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRef {
    pub release: String,
    pub run: String,
}

/// How a job ended, from its exit file (`<status> <end> <start> <how>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub status: i32,
    /// When it ended and started, by the host's clock (Unix seconds).
    pub end: u64,
    pub start: Option<u64>,
    pub how: How,
}

/// The last word of an exit file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    Exited,
    TimedOut,
    /// Killed by this signal (`TERM`), not by a cancel.
    Signal(String),
    /// Stopped by a cancel (or a Ctrl-C of the deploy that followed it) with this signal.
    Cancelled(String),
    /// An exit file of an older deploy, which did not say.
    Unsaid,
}

impl Ending {
    pub fn parse(text: &str) -> Option<Ending> {
        let mut words = text.split_whitespace();
        let status = words.next()?.parse().ok()?;
        let end = words.next()?.parse().ok()?;
        let start = words.next().and_then(|w| w.parse().ok());
        let how = match (words.next(), words.next()) {
            (Some("exited"), _) => How::Exited,
            (Some("timed-out"), _) => How::TimedOut,
            (Some("signal"), Some(s)) => How::Signal(s.to_string()),
            (Some("cancelled"), Some(s)) => How::Cancelled(s.to_string()),
            _ => How::Unsaid,
        };
        Some(Ending {
            status,
            end,
            start,
            how,
        })
    }

    pub fn success(&self) -> bool {
        self.status == 0 && matches!(self.how, How::Exited | How::Unsaid)
    }

    /// How it ended, in words: `exit status 3`, `cancelled (SIGTERM)`.
    pub fn describe(&self) -> String {
        match &self.how {
            How::TimedOut => "stopped at its time limit (--job-timeout)".into(),
            How::Signal(s) => format!("killed by SIG{s} (exit status {})", self.status),
            How::Cancelled(s) => format!("cancelled (SIG{s})"),
            How::Unsaid if matches!(self.status, 124 | 137) => "stopped at its timeout".into(),
            How::Unsaid if self.status == 143 => "stopped (SIGTERM)".into(),
            How::Exited | How::Unsaid => format!("exit status {}", self.status),
        }
    }

    /// [`Ending::describe`] with how long it ran, when the exit file says.
    pub fn describe_with_time(&self) -> String {
        match self.start {
            Some(s) => format!(
                "{} after {}",
                self.describe(),
                age(self.end.saturating_sub(s))
            ),
            None => self.describe(),
        }
    }
}

/// How a job stands on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Running,
    Ended(Ending),
    /// No exit recorded and no supervisor: the host went down, or the supervisor was
    /// killed.
    Gone,
}

impl State {
    /// The answer of the job-state script (`running`, `exit <ending>`, or anything else
    /// for gone).
    pub fn parse(stdout: &str) -> State {
        let line = stdout.lines().next().unwrap_or_default();
        if line == "running" {
            return State::Running;
        }
        match line.strip_prefix("exit ").and_then(Ending::parse) {
            Some(e) => State::Ended(e),
            None => State::Gone,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            State::Running => "running".into(),
            State::Ended(e) => format!("ended: {}", e.describe_with_time()),
            State::Gone => "ended without recording its status (its supervisor on the host \
                            was killed, or the host restarted)"
                .into(),
        }
    }
}

/// A span of seconds for people: `45s`, `3m12s`, `2h05m`, `3d04h`.
pub fn age(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_files_say_how_the_job_ended() {
        let e = Ending::parse("0 112 100 exited\n").unwrap();
        assert!(e.success());
        assert_eq!(e.describe_with_time(), "exit status 0 after 12s");
        let e = Ending::parse("143 200 10 cancelled TERM").unwrap();
        assert!(!e.success());
        assert_eq!(e.describe_with_time(), "cancelled (SIGTERM) after 3m10s");
        let e = Ending::parse("137 9 1 signal KILL").unwrap();
        assert_eq!(e.describe(), "killed by SIGKILL (exit status 137)");
        assert_eq!(
            Ending::parse("124 9 1 timed-out").unwrap().describe(),
            "stopped at its time limit (--job-timeout)"
        );
        // An exit file of an older deploy.
        let old = Ending::parse("3 9 1").unwrap();
        assert_eq!(
            (old.how.clone(), old.describe()),
            (How::Unsaid, "exit status 3".into())
        );
        assert_eq!(Ending::parse("0 9").unwrap().start, None);
        assert!(Ending::parse("x 9").is_none());
        assert_eq!(State::parse("running\n"), State::Running);
        assert_eq!(State::parse("gone\n"), State::Gone);
        assert!(matches!(State::parse("exit 0 2 1 exited\n"), State::Ended(e) if e.success()));
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(age(5), "5s");
        assert_eq!(age(192), "3m12s");
        assert_eq!(age(7500), "2h05m");
        assert_eq!(age(3 * 86_400 + 4 * 3600), "3d04h");
    }
}
