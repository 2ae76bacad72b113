//! How a step is built and checked: the schedule, verification, graph dumps and stream
//! priorities. [`Options::from_env`] reads the environment switches, so that a
//! program can be steered without a rebuild; the fields say the same in code.

use crate::error::{Error, Result};
use crate::plan::{PlanDesc, StreamPriority};

/// Which streams a step's ops are issued on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// The plan: each op on its stream, with the planned events.
    #[default]
    Planned,
    /// Every op on the origin stream in program order: the baseline every comparison needs.
    OneStream,
    /// The plan with every stream at the same priority, whatever the step declares: the
    /// baseline that shows what the declared priorities buy.
    PlannedEqualPriority,
    /// The planner's own placement of every op, ignoring each `#[stream]` and the declared
    /// priorities: the plan `compare(auto)` adds to a step (its `AUTO_PLAN`), to compare
    /// against the hand placement on the GPU. A step without `compare(auto)` is refused
    /// with [`Error::Config`](crate::Error::Config).
    Automatic,
}

impl Schedule {
    /// Whether ops run on their planned streams.
    pub(crate) fn parallel(self) -> bool {
        self != Schedule::OneStream
    }
}

/// Environment variable naming a file: every verified capture writes the graph it
/// captured there as Graphviz DOT (every node's parameters) before checking it, for
/// reading what a library such as NCCL or cuBLASLt added to the capture. Sets
/// [`Options::graph_dot`].
pub const GRAPH_DOT: &str = "STEPGRAPH_GRAPH_DOT";

/// Environment variable that replaces the declared stream priorities of every planned
/// step in the process, to try others without rebuilding:
/// `STEPGRAPH_STREAM_PRIORITIES="aux_attn=high,branch=low"`. Sets
/// [`Options::stream_priorities`].
pub const STREAM_PRIORITIES: &str = "STEPGRAPH_STREAM_PRIORITIES";

/// Environment variable that turns verification of every capture on (`1`) or off (`0`),
/// whatever the build. Sets [`Options::verify`].
pub const VERIFY: &str = "STEPGRAPH_VERIFY";

/// Environment variable that turns the capture guard on (`1`) or off (`0`): off, the
/// CUDA calls an op makes outside its capture stream are not watched, as a program run
/// under a profiler that holds CUPTI needs. Sets [`Options::capture_guard`].
pub const CAPTURE_GUARD: &str = "STEPGRAPH_CAPTURE_GUARD";

/// The name [`Error::Config`] gives priorities set with
/// [`Options::with_stream_priorities`] (those of [`STREAM_PRIORITIES`] are named by it).
const PRIORITIES_OPTION: &str = "stream priorities";

/// How a step is built and checked.
///
/// ```
/// use stepgraph::{Options, Schedule};
///
/// let options = Options::default()
///     .with_schedule(Schedule::OneStream)
///     .with_verify(true)
///     .with_stream_priorities("aux_attn=high, branch=low")?;
/// assert_eq!(options.schedule, Schedule::OneStream);
/// # Ok::<(), stepgraph::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// Which streams the ops are issued on.
    pub schedule: Schedule,
    /// Whether every capture is read back from the driver and checked against the plan
    /// (on by default in debug builds; [`VERIFY`]).
    pub verify: bool,
    /// Where every verified capture writes its graph as Graphviz DOT ([`GRAPH_DOT`]): in
    /// the name, `{step}` is replaced by the step's name and `{device}` by the GPU's
    /// ordinal, so that two steps, or the ranks of a data-parallel step, write a file
    /// each; a later capture of the same step on the same GPU overwrites its file. A
    /// step's device loop ([`Step::replay_loop`](crate::Step::replay_loop)) writes its
    /// graph as the step `{step}.loop`: the WHILE node with the step in its body.
    pub graph_dot: Option<String>,
    /// Stream priorities that replace the declared ones under [`Schedule::Planned`]
    /// ([`STREAM_PRIORITIES`]): a stream's name or a group's name (which sets all its
    /// streams) with its priority; streams not named are normal.
    pub stream_priorities: Option<Vec<(String, StreamPriority)>>,
    /// Whether each capture is watched through CUPTI for CUDA calls that escape it: work
    /// an op's code issues on another stream than the op's, a synchronisation, an
    /// allocation, a capture of its own. Each such call fails the capture, naming the op
    /// and the call. On by default, in every build; the cost is paid at capture, never at
    /// a replay ([`CAPTURE_GUARD`]). It needs CUPTI (`libcupti`, in the CUDA toolkit),
    /// and no other CUPTI subscriber in the process (profilers and compute-sanitizer are
    /// one): without them, capture fails saying so, unless the guard is off.
    pub capture_guard: bool,
}

impl Default for Options {
    /// The planned schedule, verification in debug builds, no dump, declared priorities.
    fn default() -> Self {
        Options {
            schedule: Schedule::Planned,
            verify: cfg!(debug_assertions),
            graph_dot: None,
            stream_priorities: None,
            capture_guard: true,
        }
    }
}

impl Options {
    /// The defaults, changed by the environment switches that are set: [`GRAPH_DOT`],
    /// [`STREAM_PRIORITIES`], [`VERIFY`] and [`CAPTURE_GUARD`]. A switch whose value does not parse is an
    /// error naming it.
    pub fn from_env() -> Result<Options> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Options::from_env`] over any source of variables.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Options> {
        let mut options = Options::default();
        if let Some(path) = var(GRAPH_DOT) {
            options.graph_dot = Some(path);
        }
        if let Some(text) = var(STREAM_PRIORITIES) {
            options = options.priorities_from(STREAM_PRIORITIES, &text)?;
        }
        if let Some(text) = var(VERIFY) {
            options.verify = switch(VERIFY, &text)?;
        }
        if let Some(text) = var(CAPTURE_GUARD) {
            options.capture_guard = switch(CAPTURE_GUARD, &text)?;
        }
        Ok(options)
    }

    /// The same options with `schedule`.
    pub fn with_schedule(self, schedule: Schedule) -> Options {
        Options { schedule, ..self }
    }

    /// The same options with verification of every capture on or off.
    pub fn with_verify(self, verify: bool) -> Options {
        Options { verify, ..self }
    }

    /// The same options with the capture guard on or off.
    pub fn with_capture_guard(self, capture_guard: bool) -> Options {
        Options {
            capture_guard,
            ..self
        }
    }

    /// The same options with every verified capture dumped as DOT to `path`.
    pub fn with_graph_dot(self, path: impl Into<String>) -> Options {
        Options {
            graph_dot: Some(path.into()),
            ..self
        }
    }

    /// The same options with the priorities `text` gives, as in
    /// `"aux_attn=high, branch=low"` (`stream=low|normal|high`, comma-separated). The
    /// names are checked against each step's streams when it is built.
    pub fn with_stream_priorities(self, text: &str) -> Result<Options> {
        self.priorities_from(PRIORITIES_OPTION, text)
    }

    /// [`Options::with_stream_priorities`], with errors naming the setting `name`.
    fn priorities_from(self, name: &'static str, text: &str) -> Result<Options> {
        let mut list = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = |what: String| Error::Config {
                name,
                expected: "stream=low|normal|high".into(),
                found: format!("{item:?} ({what})"),
            };
            let (name, level) = item.split_once('=').ok_or_else(|| bad("no `=`".into()))?;
            let level = match level.trim() {
                "low" => StreamPriority::Low,
                "normal" => StreamPriority::Normal,
                "high" => StreamPriority::High,
                other => return Err(bad(format!("unknown priority `{other}`"))),
            };
            list.push((name.trim().to_string(), level));
        }
        Ok(Options {
            stream_priorities: Some(list),
            ..self
        })
    }

    /// The priority of each of `plan`'s streams that the step is built with: the
    /// declared ones, or those of [`Options::stream_priorities`], whose names must be
    /// streams or groups of `plan`.
    pub(crate) fn priorities(&self, plan: &PlanDesc) -> Result<Vec<StreamPriority>> {
        let Some(list) = &self.stream_priorities else {
            return Ok(plan.streams.iter().map(|s| s.priority).collect());
        };
        let mut out = vec![StreamPriority::Normal; plan.streams.len()];
        for (name, level) in list {
            let mut found = false;
            for (i, s) in plan.streams.iter().enumerate() {
                let group = s.name.split_once('[').map_or(s.name, |(g, _)| g);
                if s.name == name || group == name {
                    out[i] = *level;
                    found = true;
                }
            }
            if !found {
                let names: Vec<&str> = plan.streams.iter().map(|s| s.name).collect();
                return Err(Error::Config {
                    name: PRIORITIES_OPTION,
                    expected: format!(
                        "a stream of step `{}` ({}) or a group's name",
                        plan.step,
                        names.join(", ")
                    ),
                    found: format!("no stream `{name}`"),
                });
            }
        }
        Ok(out)
    }

    /// The DOT path for `step` on GPU `device`, when dumps are on.
    pub(crate) fn graph_dot_path(&self, step: &str, device: usize) -> Option<String> {
        self.graph_dot.as_ref().map(|p| {
            p.replace("{step}", step)
                .replace("{device}", &device.to_string())
        })
    }
}

/// An on/off switch's value: `1`, `true` or `on`, or `0`, `false` or `off`.
fn switch(name: &'static str, text: &str) -> Result<bool> {
    match text.trim() {
        "1" | "true" | "on" => Ok(true),
        "0" | "false" | "off" => Ok(false),
        other => Err(Error::Config {
            name,
            expected: "1 or 0 (or true/false, on/off)".into(),
            found: format!("`{other}`"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::StreamDesc;

    const PLAN: PlanDesc = PlanDesc::new("s").with_streams(&[
        StreamDesc::named("main"),
        StreamDesc::named("branch[0]"),
        StreamDesc::named("branch[1]"),
        StreamDesc::named("aux_attn"),
    ]);

    fn priorities(text: &str) -> Result<Vec<StreamPriority>> {
        Options::default()
            .with_stream_priorities(text)?
            .priorities(&PLAN)
    }

    #[test]
    fn priorities_name_streams_or_whole_groups() {
        use StreamPriority::*;
        assert_eq!(
            priorities("aux_attn=high, branch=low").unwrap(),
            [Normal, Low, Low, High]
        );
        assert_eq!(
            priorities("branch[1]=high").unwrap(),
            [Normal, Normal, High, Normal]
        );
        assert_eq!(priorities("").unwrap(), [Normal; 4]);
        assert_eq!(Options::default().priorities(&PLAN).unwrap(), [Normal; 4]);
    }

    #[test]
    fn bad_priorities_say_what_was_expected() {
        let e = priorities("attn=high").unwrap_err().to_string();
        assert!(
            e.contains("no stream `attn`") && e.contains("main, branch[0]"),
            "{e}"
        );
        let e = priorities("main=urgent").unwrap_err().to_string();
        assert!(e.contains("unknown priority `urgent`"), "{e}");
        let e = priorities("main").unwrap_err().to_string();
        assert!(e.contains("no `=`"), "{e}");
    }

    #[test]
    fn a_setting_that_does_not_parse_is_a_config_error_naming_it() {
        let e =
            Options::from_vars(|name| (name == VERIFY).then(|| " maybe ".to_string())).unwrap_err();
        let Error::Config {
            name,
            expected,
            found,
        } = &e
        else {
            panic!("expected Error::Config, got {e:?}");
        };
        assert_eq!(
            (*name, expected.as_str(), found.as_str()),
            (VERIFY, "1 or 0 (or true/false, on/off)", "`maybe`")
        );
        assert_eq!(
            e.to_string(),
            "STEPGRAPH_VERIFY: expected 1 or 0 (or true/false, on/off), found `maybe`"
        );
        // Priorities from the environment name its variable; those given to the
        // builder, the option.
        let e = Options::from_vars(|name| {
            (name == STREAM_PRIORITIES).then(|| "main=urgent".to_string())
        })
        .unwrap_err();
        assert!(
            matches!(&e, Error::Config { name: STREAM_PRIORITIES, found, .. }
                if found == "\"main=urgent\" (unknown priority `urgent`)"),
            "{e:?}"
        );
        let e = priorities("attn=high").unwrap_err();
        assert!(
            matches!(&e, Error::Config { name: "stream priorities", expected, found }
                if expected.contains("step `s` (main, branch[0], branch[1], aux_attn)")
                    && found == "no stream `attn`"),
            "{e:?}"
        );
    }

    #[test]
    fn the_environment_sets_the_switches_it_names_and_refuses_bad_values() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let o = Options::from_vars(vars(&[
            (GRAPH_DOT, "/tmp/{step}-{device}.dot"),
            (VERIFY, "1"),
        ]))
        .unwrap();
        assert!(o.verify);
        assert_eq!(
            o.graph_dot_path("dqn", 1).as_deref(),
            Some("/tmp/dqn-1.dot")
        );
        let o = Options::from_vars(vars(&[(VERIFY, "off")])).unwrap();
        assert!(!o.verify && o.graph_dot.is_none());
        let e = Options::from_vars(vars(&[(VERIFY, "maybe")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("STEPGRAPH_VERIFY") && e.contains("`maybe`"),
            "{e}"
        );
        // The capture guard is on unless the environment turns it off.
        assert!(Options::default().capture_guard);
        let o = Options::from_vars(vars(&[(CAPTURE_GUARD, "0")])).unwrap();
        assert!(!o.capture_guard);
        assert!(o.with_capture_guard(true).capture_guard);
        let e = Options::from_vars(vars(&[(CAPTURE_GUARD, "no")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("STEPGRAPH_CAPTURE_GUARD") && e.contains("`no`"),
            "{e}"
        );
    }
}
