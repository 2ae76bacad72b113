//! What a deploy folder holds, read from the [`INSPECT`](super::remote::INSPECT)
//! script's sections: the releases with their build-info, the folders failed uploads
//! left, the runs with their records, and the history of `current`.

use serde_json::Value;

use super::error::DeployError;
use super::record::{Ending, JobRef, age};
use super::remote;

/// One release folder.
#[derive(Debug, Clone)]
pub struct Release {
    pub name: String,
    /// Its `build-info.json` (`Null` if it had none or it was not JSON).
    pub info: Value,
}

impl Release {
    pub fn program(&self) -> &str {
        self.info["program"]
            .as_str()
            .unwrap_or_else(|| self.name.split('-').next().unwrap_or("?"))
    }

    /// `3e675b0`, with ` (dirty)` for a tree with changes.
    pub fn revision(&self) -> String {
        let rev = self.info["git_revision"]
            .as_str()
            .map_or("?", |r| &r[..r.len().min(7)]);
        if self.info["git_dirty"] == true {
            format!("{rev} (dirty)")
        } else {
            rev.to_string()
        }
    }

    pub fn built_at(&self) -> Option<u64> {
        self.info["built_at_unix_s"].as_u64()
    }
}

/// One run of a release's job.
#[derive(Debug, Clone)]
pub struct Run {
    pub release: String,
    pub run: String,
    /// Its record (see `Session::run_job`).
    pub record: Value,
    /// How it ended, once it did.
    pub exit: Option<Ending>,
    /// Whether its supervisor still runs.
    pub running: bool,
}

impl Run {
    pub fn started(&self) -> Option<u64> {
        self.record["started_unix_s"].as_u64()
    }

    /// How it went, in words: `exit status 0 after 12s`, `running`, `ended without a word`.
    pub fn outcome(&self) -> String {
        match &self.exit {
            Some(e) if e.start.is_some() => e.describe_with_time(),
            Some(e) => match self.started() {
                Some(s) => format!("{} after {}", e.describe(), age(e.end.saturating_sub(s))),
                None => e.describe(),
            },
            None if self.running => "running".into(),
            None => "no exit recorded (the host went down, or it is starting)".into(),
        }
    }

    /// The job this run is.
    pub fn job(&self) -> JobRef {
        JobRef {
            release: self.release.clone(),
            run: self.run.clone(),
        }
    }

    /// The marks of its record worth a reader's attention: its arguments, skipped checks.
    pub fn notes(&self) -> String {
        let mut notes = Vec::new();
        if let Some(args) = self.record["args"].as_array()
            && !args.is_empty()
        {
            let words: Vec<&str> = args.iter().filter_map(Value::as_str).collect();
            notes.push(format!("args `{}`", words.join(" ")));
        }
        if self.record["gpu_checks"] == false {
            notes.push("NO GPU CHECKS (--no-gpu-checks)".into());
        }
        if let Some(c) = self.record["command"].as_str() {
            notes.push(format!(
                "by `deploy{}`",
                if c == "run" { " run" } else { "" }
            ));
        }
        notes.join(", ")
    }
}

/// One line of `history`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub time: u64,
    /// `switched`, `rolled-back`, `staged`, `cleaned`.
    pub event: String,
    pub release: String,
    /// Where `current` pointed before (`-`: nowhere).
    pub from: String,
    pub by: String,
}

/// The deploy folder as [`INSPECT`](super::remote::INSPECT) saw it.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The folder does not exist.
    pub missing: bool,
    /// The release `current` points at.
    pub current: Option<String>,
    /// Where `current` points, as the link says, when it is not a release.
    pub current_target: String,
    /// Who holds the lock, when someone does.
    pub locked_by: Option<String>,
    pub releases: Vec<Release>,
    /// Folders failed uploads and replaced damaged releases left (`.incoming-…`,
    /// `.damaged-…`).
    pub leftovers: Vec<String>,
    pub runs: Vec<Run>,
    pub history: Vec<Event>,
}

impl Report {
    /// The release `current` points at, or the error saying there is none in `dir` on
    /// `host` and where `current` points instead.
    pub fn live(&self, host: &str, dir: &str) -> Result<String, DeployError> {
        self.current.clone().ok_or_else(|| DeployError::NoCurrent {
            host: host.to_string(),
            dir: dir.to_string(),
            found: if self.current_target.is_empty() {
                "no `current`".to_string()
            } else {
                format!(
                    "`current` pointing at {}, which is not a release",
                    self.current_target
                )
            },
        })
    }

    /// Like [`Report::live`], and the release is there: a `current` whose release
    /// folder was removed is named as such, not found wanting when it is verified.
    pub fn live_present(&self, host: &str, dir: &str) -> Result<String, DeployError> {
        let release = self.live(host, dir)?;
        if self.release(&release).is_none() {
            return Err(DeployError::CurrentGone {
                host: host.to_string(),
                dir: dir.to_string(),
                release,
            });
        }
        Ok(release)
    }

    pub fn parse(text: &str) -> Report {
        let mut report = Report::default();
        // The section being read: its header words and its lines.
        let mut sections: Vec<(Vec<String>, String)> = Vec::new();
        for line in text.lines() {
            if let Some(header) = line.strip_prefix("@@ ") {
                sections.push((header.split(' ').map(String::from).collect(), String::new()));
            } else if let Some((_, body)) = sections.last_mut() {
                body.push_str(line);
                body.push('\n');
            }
        }
        for (words, body) in sections {
            let word = |i: usize| words.get(i).cloned().unwrap_or_default();
            match word(0).as_str() {
                "missing" => report.missing = true,
                "current" => {
                    let target = words[1..].join(" ");
                    report.current = remote::current_release(&target).map(String::from);
                    report.current_target = target;
                }
                "lock" if word(1) == "held" => report.locked_by = Some(body.trim().to_string()),
                "release" => report.releases.push(Release {
                    name: word(1),
                    info: serde_json::from_str(&body).unwrap_or(Value::Null),
                }),
                "leftover" => report.leftovers.push(word(1)),
                "run" => report.runs.push(Run {
                    release: word(1),
                    run: word(2),
                    record: serde_json::from_str(body.trim()).unwrap_or(Value::Null),
                    exit: None,
                    running: false,
                }),
                "exit" | "running" => {
                    let Some(run) = report
                        .runs
                        .iter_mut()
                        .find(|r| r.release == word(1) && r.run == word(2))
                    else {
                        continue;
                    };
                    if word(0) == "running" {
                        run.running = true;
                    } else {
                        run.exit = Ending::parse(&body);
                    }
                }
                "history" => {
                    report.history = body
                        .lines()
                        .filter_map(|l| {
                            let f: Vec<&str> = l.split('\t').collect();
                            Some(Event {
                                time: f.first()?.parse().ok()?,
                                event: f.get(1)?.to_string(),
                                release: f.get(2)?.to_string(),
                                from: f.get(3)?.to_string(),
                                by: f.get(4).unwrap_or(&"").to_string(),
                            })
                        })
                        .collect()
                }
                _ => {}
            }
        }
        report.runs.sort_by(|a, b| a.run.cmp(&b.run));
        report
    }

    pub fn release(&self, name: &str) -> Option<&Release> {
        self.releases.iter().find(|r| r.name == name)
    }

    /// The runs of `release`, oldest first.
    pub fn runs_of<'a>(&'a self, release: &'a str) -> impl Iterator<Item = &'a Run> + 'a {
        self.runs.iter().filter(move |r| r.release == release)
    }

    /// When `release` was last made current or staged (else built), for ordering.
    pub fn last_used(&self, release: &Release) -> u64 {
        self.history
            .iter()
            .filter(|e| e.release == release.name)
            .map(|e| e.time)
            .max()
            .or(release.built_at())
            .unwrap_or(0)
    }

    /// The releases, most recently used first.
    pub fn releases_newest_first(&self) -> Vec<&Release> {
        let mut releases: Vec<&Release> = self.releases.iter().collect();
        releases.sort_by_key(|r| (std::cmp::Reverse(self.last_used(r)), r.name.clone()));
        releases
    }

    /// The last time `release` was made current, by a deploy or a rollback: that event.
    pub fn last_made_current(&self, release: &str) -> Option<&Event> {
        self.history
            .iter()
            .rev()
            .find(|e| e.release == release && (e.event == "switched" || e.event == "rolled-back"))
    }

    /// The last time `release` was switched to (not by a rollback): that event.
    pub fn last_switch_to(&self, release: &str) -> Option<&Event> {
        self.history
            .iter()
            .rev()
            .find(|e| e.event == "switched" && e.release == release)
    }

    /// The releases to go back to from `current`, in order: the one each was deployed
    /// over, then the one that one was deployed over, and so on (a rollback skips those
    /// that are gone or fail their checks).
    pub fn rollback_candidates(&self, current: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut at = current.to_string();
        while let Some(e) = self.last_switch_to(&at) {
            let from = e.from.clone();
            if from == "-" || from == current || out.contains(&from) {
                break;
            }
            out.push(from.clone());
            at = from;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "@@ current releases/job-a-1\n@@ lock held\npid 1 on h (root): x\n\
@@ release job-a-1\n{\"program\": \"job\", \"git_revision\": \"abcdef123\", \"git_dirty\": true, \"built_at_unix_s\": 5}\n\n\
@@ release job-b-2\n\n@@ leftover .incoming-job-c-3-r9\n\
@@ run job-a-1 r2\n{\"args\": [\"--steps\", \"3\"], \"gpu_checks\": false, \"started_unix_s\": 100, \"command\": \"run\"}\n\
@@ exit job-a-1 r2\n0 112 101\n@@ run job-a-1 r1\n{}\n@@ running job-a-1 r1\n\
@@ history\n10\tswitched\tjob-b-2\t-\tme\n20\tswitched\tjob-a-1\tjob-b-2\tme\n";

    #[test]
    fn the_inspect_sections_are_read() {
        let r = Report::parse(SAMPLE);
        assert_eq!(r.current.as_deref(), Some("job-a-1"));
        assert_eq!(r.locked_by.as_deref(), Some("pid 1 on h (root): x"));
        assert_eq!(r.releases.len(), 2);
        let a = r.release("job-a-1").unwrap();
        assert_eq!(a.program(), "job");
        assert_eq!(a.revision(), "abcdef1 (dirty)");
        assert_eq!(r.release("job-b-2").unwrap().program(), "job");
        assert_eq!(r.leftovers, [".incoming-job-c-3-r9"]);
        let runs: Vec<&Run> = r.runs_of("job-a-1").collect();
        assert_eq!(runs[0].run, "r1");
        assert_eq!(runs[0].outcome(), "running");
        assert_eq!(runs[1].outcome(), "exit status 0 after 11s");
        assert_eq!(
            runs[1].notes(),
            "args `--steps 3`, NO GPU CHECKS (--no-gpu-checks), by `deploy run`"
        );
        assert_eq!(r.history.len(), 2);
        assert_eq!(r.rollback_candidates("job-a-1"), ["job-b-2"]);
        assert_eq!(r.last_made_current("job-a-1").map(|e| e.time), Some(20));
        let newest: Vec<&str> = r
            .releases_newest_first()
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(newest, ["job-a-1", "job-b-2"]);
        assert!(Report::parse("@@ missing\n").missing);
        assert_eq!(r.live_present("h", "d").unwrap(), "job-a-1");
        let gone = Report::parse("@@ current releases/job-z-9\n@@ release job-a-1\n{}\n");
        let msg = gone.live_present("h", "d").unwrap_err().to_string();
        assert!(
            msg.starts_with(
                "`current` in d on h points at releases/job-z-9, which no longer exists"
            ),
            "{msg}"
        );
        assert_eq!(gone.live("h", "d").unwrap(), "job-z-9");
    }
}
