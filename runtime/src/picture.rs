//! Pictures of a step's schedule: a measured [`Profile`] as an SVG timeline and as a
//! Chrome/Perfetto trace, the compile-time [`PlanDesc`] as DOT and as SVG, and a small
//! text record of a profile so that one measured on a GPU host can be committed and
//! drawn again on a machine without a GPU.
//!
//! The SVG, JSON and DOT are written by hand rather than through an SVG or JSON crate:
//! each is a handful of element kinds with fixed attributes, and owning the writer keeps
//! the output byte-for-byte deterministic (same input, same bytes), which committed
//! documentation images and their up-to-date checks rely on.
//!
//! Both SVGs come from one renderer: a profile and a plan are each turned into a
//! [`Timeline`] (lanes, bars on an axis, arrows), and only that is drawn.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::error::{Error, Result};
use crate::plan::{EventId, OpId, PlanDesc};
use crate::profile::{OpTiming, Profile, WaitEdge};

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

/// The picture formats of a plan, as an example's `--print-plan` argument names them.
///
/// ```
/// use stepgraph::PlanFormat;
///
/// let args = ["fork_join", "--print-plan", "svg"].map(String::from);
/// assert_eq!(PlanFormat::from_args(args).unwrap(), Some(PlanFormat::Svg));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanFormat {
    /// Graphviz DOT ([`PlanDesc::to_dot`]).
    Dot,
    /// A self-contained SVG ([`PlanDesc::to_svg`]).
    Svg,
}

impl PlanFormat {
    /// Reads `--print-plan dot|svg` (or `--print-plan=dot|svg`) from a program's
    /// arguments: `Ok(None)` when it is absent, an error naming the value when it is not
    /// `dot` or `svg`.
    pub fn from_args<I: IntoIterator<Item = String>>(args: I) -> Result<Option<PlanFormat>> {
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let value = if arg == "--print-plan" {
                args.next().unwrap_or_default()
            } else if let Some(v) = arg.strip_prefix("--print-plan=") {
                v.to_string()
            } else {
                continue;
            };
            return match value.as_str() {
                "dot" => Ok(Some(PlanFormat::Dot)),
                "svg" => Ok(Some(PlanFormat::Svg)),
                _ => Err(Error::Invalid(format!(
                    "--print-plan: expected `dot` or `svg`, found `{value}`"
                ))),
            };
        }
        Ok(None)
    }
}

impl PlanDesc {
    /// The plan in `format`: [`to_dot`](Self::to_dot) or [`to_svg`](Self::to_svg).
    pub fn render(&self, format: PlanFormat) -> String {
        match format {
            PlanFormat::Dot => self.to_dot(),
            PlanFormat::Svg => self.to_svg(),
        }
    }

    /// Handles `--print-plan dot|svg` for an example's `main`: when the program's
    /// arguments ask for it, prints the plan in that format to stdout and returns the
    /// exit code to return at once, before anything touches a GPU (this is how
    /// `cargo xtask plan <example>` draws a plan on a machine without one). Returns
    /// `None` when the argument is absent.
    ///
    /// ```no_run
    /// # mod fork_join { pub const PLAN: stepgraph::PlanDesc = stepgraph::PlanDesc {
    /// #     step: "s", streams: &[], buffers: &[], ops: &[], edges: &[], events: &[],
    /// #     final_waits: &[], critical_path: &[], critical_path_by_cost: &[] }; }
    /// fn main() -> std::process::ExitCode {
    ///     if let Some(code) = fork_join::PLAN.print_if_asked() {
    ///         return code;
    ///     }
    ///     // ... open the device and run the step
    ///     std::process::ExitCode::SUCCESS
    /// }
    /// ```
    pub fn print_if_asked(&self) -> Option<ExitCode> {
        match PlanFormat::from_args(std::env::args().skip(1)) {
            Ok(None) => None,
            Ok(Some(format)) => {
                print!("{}", self.render(format));
                Some(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("{e}");
                Some(ExitCode::FAILURE)
            }
        }
    }

    /// The plan as Graphviz DOT: one `subgraph cluster_<i>` per stream labelled with the
    /// stream's name, a node per op in program order, solid edges for the order of ops
    /// on one stream, dashed edges labelled with the event (`e3`) for each cross-stream
    /// wait, capture begin and end nodes on the origin stream with the final joins into
    /// the end, and the critical path (by op count) in bold. Render it with
    /// `dot -Tsvg plan.dot > plan.svg`.
    ///
    /// ```
    /// use stepgraph::plan::{EventDesc, EventId, OpDesc, OpId, PlanDesc, StreamDesc, StreamId};
    ///
    /// const PLAN: PlanDesc = PlanDesc {
    ///     step: "two",
    ///     streams: &[StreamDesc::named("main"), StreamDesc::named("side")],
    ///     buffers: &[],
    ///     ops: &[
    ///         OpDesc { name: "a", func: "a", stream: StreamId(0), accesses: &[], waits: &[],
    ///                  record: Some(EventId(0)), cost: 1.0 },
    ///         OpDesc { name: "b", func: "b", stream: StreamId(1), accesses: &[],
    ///                  waits: &[EventId(0)], record: Some(EventId(1)), cost: 1.0 },
    ///     ],
    ///     edges: &[],
    ///     events: &[
    ///         EventDesc { stream: StreamId(0), after: Some(OpId(0)) },
    ///         EventDesc { stream: StreamId(1), after: Some(OpId(1)) },
    ///     ],
    ///     final_waits: &[EventId(1)],
    ///     critical_path: &[OpId(0), OpId(1)],
    ///     critical_path_by_cost: &[OpId(0), OpId(1)],
    /// };
    /// let dot = PLAN.to_dot();
    /// assert!(dot.contains("subgraph cluster_1 {"));
    /// assert!(dot.contains(r#"op0 -> op1 [style=dashed, label="e0""#));
    /// assert!(dot.contains(r#"op1 -> capture_end [style=dashed, label="e1""#));
    /// ```
    pub fn to_dot(&self) -> String {
        let mut out = String::new();
        let critical = |i: usize| self.critical_path.contains(&OpId(i as u32));
        let parts = Parts::of(self.ops.iter().map(|o| o.func));
        let _ = writeln!(
            out,
            "digraph {} {{",
            dot_str(&format!("plan {}", self.step))
        );
        let _ = writeln!(
            out,
            "  graph [label={}, labelloc=t, fontname=\"Helvetica\", fontsize=16, rankdir=LR, \
             newrank=true, nodesep=0.3, ranksep=0.5];",
            dot_str(&plan_title(self))
        );
        out.push_str(
            "  node [shape=box, style=\"rounded,filled\", fontname=\"Courier\", fontsize=11, \
             penwidth=1, color=\"#444444\"];\n  edge [fontname=\"Helvetica\", fontsize=10, \
             color=\"#555555\"];\n",
        );
        for (s, stream) in self.streams.iter().enumerate() {
            let _ = writeln!(out, "  subgraph cluster_{s} {{");
            let _ = writeln!(
                out,
                "    label={}; fontname=\"Courier-Bold\"; style=\"rounded,filled\"; \
                 color=\"#bbbbbb\"; fillcolor=\"{}\";",
                dot_str(stream.name),
                if s % 2 == 0 { "#f5f6f8" } else { "#ffffff" }
            );
            if s == 0 {
                out.push_str(
                    "    capture_begin [label=\"begin\", shape=circle, style=filled, \
                     fillcolor=\"#ffffff\", fontname=\"Helvetica\", fontsize=9];\n",
                );
            }
            for (i, op) in self.ops.iter().enumerate() {
                if op.stream.index() != s {
                    continue;
                }
                let fill = parts.color(op.func);
                let (style, pen) = if critical(i) {
                    ("rounded,filled,bold", 3)
                } else {
                    ("rounded,filled", 1)
                };
                let _ = writeln!(
                    out,
                    "    op{i} [label={}, fillcolor=\"{fill}\", fontcolor=\"{}\", \
                     style=\"{style}\", penwidth={pen}];",
                    dot_str(op.name),
                    text_color_on(fill, 1.0)
                );
            }
            if s == 0 {
                out.push_str(
                    "    capture_end [label=\"end\", shape=doublecircle, style=filled, \
                     fillcolor=\"#ffffff\", fontname=\"Helvetica\", fontsize=9];\n",
                );
            }
            out.push_str("  }\n");
        }
        // Stream order: begin, the origin's ops, end on the origin; each side stream's
        // ops in program order.
        for s in 0..self.streams.len() {
            let mut chain: Vec<String> = self
                .ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.stream.index() == s)
                .map(|(i, _)| format!("op{i}"))
                .collect();
            if s == 0 {
                chain.insert(0, "capture_begin".into());
                chain.push("capture_end".into());
            }
            for pair in chain.windows(2) {
                let bold = match (op_index(&pair[0]), op_index(&pair[1])) {
                    (Some(a), Some(b)) => self.is_critical_edge(a, b),
                    _ => false,
                };
                let attrs = if bold { " [penwidth=2.5]" } else { "" };
                let _ = writeln!(out, "  {} -> {}{attrs};", pair[0], pair[1]);
            }
        }
        let source = |e: EventId| match self.events.get(e.index()).and_then(|ev| ev.after) {
            Some(op) => format!("op{}", op.index()),
            None => "capture_begin".into(),
        };
        for (i, op) in self.ops.iter().enumerate() {
            for &e in op.waits {
                let from = source(e);
                let bold = op_index(&from).is_some_and(|a| self.is_critical_edge(a, i));
                let pen = if bold { ", penwidth=2.5" } else { "" };
                let _ = writeln!(
                    out,
                    "  {from} -> op{i} [style=dashed, label=\"e{}\"{pen}];",
                    e.0
                );
            }
        }
        for &e in self.final_waits {
            let _ = writeln!(
                out,
                "  {} -> capture_end [style=dashed, label=\"e{}\"];",
                source(e),
                e.0
            );
        }
        out.push_str("}\n");
        out
    }

    /// The plan as a self-contained SVG, drawn like a [`Profile`]'s timeline without
    /// graphviz: one lane per stream, each op at its level in the schedule (the number of
    /// ops on the longest chain of stream order and waits before it), cross-stream waits
    /// as arrows labelled with their event, capture begin and end marks on the origin
    /// stream, and the critical path (by op count) outlined.
    pub fn to_svg(&self) -> String {
        render_svg(&Timeline::of_plan(self))
    }

    /// Each op's level in the schedule: 0 for an op nothing orders before, otherwise one
    /// more than the highest level among the ops that [`schedule_edges`](Self::schedule_edges)
    /// orders before it.
    pub fn levels(&self) -> Vec<usize> {
        let mut level = vec![0usize; self.ops.len()];
        // Ops are in program order, a topological order of the schedule, and every edge
        // points forward in it.
        let mut edges = self.schedule_edges();
        edges.sort_by_key(|&(_, b)| b);
        for (a, b) in edges {
            let (a, b) = (a.index(), b.index());
            if a < b && b < level.len() {
                level[b] = level[b].max(level[a] + 1);
            }
        }
        level
    }

    fn is_critical_edge(&self, from: usize, to: usize) -> bool {
        self.critical_path
            .windows(2)
            .any(|w| w[0].index() == from && w[1].index() == to)
    }
}

impl Profile {
    /// The profile as a self-contained SVG timeline: a header with the step, device,
    /// total time and overlap; one lane per stream labelled with its name; each op a bar
    /// to scale on a time axis in milliseconds, coloured by part (its function), named
    /// inside or above when the name fits, with a `<title>` tooltip
    /// (`name stream start–end ms`); each wait an arrow from the end of the op waited
    /// for to the start of the op that waited; the critical path outlined in black (its
    /// bars carry the class `critical`); and a legend. The output depends only on the
    /// profile, byte for byte.
    ///
    /// ```
    /// use stepgraph::{OpTiming, Profile, WaitEdge};
    ///
    /// let op = |name: &str, stream, start_ms, end_ms| OpTiming {
    ///     name: name.into(), func: name.into(), stream, start_ms, end_ms,
    /// };
    /// let profile = Profile {
    ///     step: "two".into(),
    ///     device: "test".into(),
    ///     streams: vec!["main".into(), "side".into()],
    ///     ops: vec![op("a", 0, 0.0, 0.1), op("b", 1, 0.1, 0.3)],
    ///     waits: vec![WaitEdge { from: 0, to: 1 }],
    ///     critical_path: vec![0, 1],
    ///     total_ms: 0.3,
    /// };
    /// let svg = profile.to_svg();
    /// assert!(svg.starts_with("<svg"));
    /// assert!(svg.contains(">side</text>"));
    /// assert!(svg.contains("<title>b side 0.1000–0.3000 ms</title>"));
    /// ```
    pub fn to_svg(&self) -> String {
        render_svg(&Timeline::of_profile(self))
    }

    /// The profile in the Chrome trace event format (the JSON object form), which
    /// Perfetto (ui.perfetto.dev) and `chrome://tracing` open: one track per stream
    /// (process 1, thread id = stream index, named by `thread_name` metadata), a
    /// complete event (`"ph":"X"`, `ts` and `dur` in microseconds) per op with its
    /// function and stream in `args`, and a flow arrow (`"ph":"s"` / `"f"`) per wait.
    pub fn to_trace_json(&self) -> String {
        let mut out = String::from("{\"traceEvents\":[\n");
        let mut events: Vec<String> = Vec::new();
        events.push(format!(
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{{\"name\":{}}}}}",
            json_str(&format!("{} on {}", self.step, self.device))
        ));
        for (i, s) in self.streams.iter().enumerate() {
            events.push(format!(
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{i},\"args\":{{\"name\":{}}}}}",
                json_str(s)
            ));
            events.push(format!(
                "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":{i},\"args\":{{\"sort_index\":{i}}}}}"
            ));
        }
        for (i, op) in self.ops.iter().enumerate() {
            events.push(format!(
                "{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{},\"dur\":{},\
                 \"args\":{{\"func\":{},\"stream\":{},\"critical\":{}}}}}",
                json_str(&op.name),
                json_str(&op.func),
                op.stream,
                json_num(op.start_ms * 1e3),
                json_num(op.duration_ms() * 1e3),
                json_str(&op.func),
                json_str(self.stream_name(op.stream)),
                self.critical_path.contains(&i)
            ));
        }
        // Flow ends sit inside their ops (at the middle) so that a viewer binds each to
        // the right slice; it draws the arrow from the first slice's end regardless.
        let inside = |op: &OpTiming| json_num((op.start_ms + op.duration_ms() / 2.0) * 1e3);
        for (k, w) in self.waits.iter().enumerate() {
            let (Some(from), Some(to)) = (self.ops.get(w.from), self.ops.get(w.to)) else {
                continue;
            };
            events.push(format!(
                "{{\"name\":\"wait\",\"cat\":\"wait\",\"ph\":\"s\",\"id\":{k},\"pid\":1,\"tid\":{},\"ts\":{}}}",
                from.stream,
                inside(from)
            ));
            events.push(format!(
                "{{\"name\":\"wait\",\"cat\":\"wait\",\"ph\":\"f\",\"bp\":\"e\",\"id\":{k},\"pid\":1,\"tid\":{},\"ts\":{}}}",
                to.stream,
                inside(to)
            ));
        }
        out.push_str(&events.join(",\n"));
        let _ = write!(
            out,
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"step\":{},\"device\":{},\
             \"total_ms\":{},\"overlap\":{},\"critical_path_ms\":{}}}}}\n",
            json_str(&self.step),
            json_str(&self.device),
            json_num(self.total_ms),
            json_num(self.overlap()),
            json_num(self.critical_path_ms())
        );
        out
    }

    /// The profile as a small line-based text record, which
    /// [`from_record`](Self::from_record) reads back to an equal profile, so that a
    /// profile measured on a GPU host can be saved, committed, and drawn anywhere.
    ///
    /// One item per line, a keyword first; `#` starts a comment line:
    ///
    /// ```text
    /// # stepgraph profile v1
    /// step fork_join
    /// device NVIDIA H100 80GB HBM3
    /// total_ms 0.3725
    /// stream main
    /// stream chain[0]
    /// op 0 0 0.005 seed seed
    /// op 1 0.0071 0.3612 chain chain[0]
    /// wait 0 1
    /// critical 0 1
    /// ```
    ///
    /// The first line is the version header. `step`, `device` and `stream` take the
    /// rest of the line; `stream` lines come in stream order, the origin first.
    /// `op <stream> <start_ms> <end_ms> <func> <name>` in program order, with the
    /// stream's index and times in milliseconds after the replay began.
    /// `wait <from> <to>` and `critical <op>...` take op indices. Text is written with
    /// backslash escapes: `\\`, `\n`, `\r`, `\t`, and in `func` and `name` also `\s` for a
    /// space and `\e` for an empty name. Numbers are written so that they read back to
    /// the same bits.
    ///
    /// ```
    /// use stepgraph::Profile;
    ///
    /// let record = "# stepgraph profile v1\nstep s\ndevice test\ntotal_ms 1\n\
    ///               stream main\nop 0 0 1 f f[0]\ncritical 0\n";
    /// let profile = Profile::from_record(record).unwrap();
    /// assert_eq!(profile.ops[0].name, "f[0]");
    /// assert_eq!(profile.to_record(), record);
    /// ```
    pub fn to_record(&self) -> String {
        let mut out = format!("{RECORD_HEADER}\n");
        let _ = writeln!(out, "step {}", escape(&self.step, false));
        let _ = writeln!(out, "device {}", escape(&self.device, false));
        let _ = writeln!(out, "total_ms {}", self.total_ms);
        for s in &self.streams {
            let _ = writeln!(out, "stream {}", escape(s, false));
        }
        for op in &self.ops {
            let _ = writeln!(
                out,
                "op {} {} {} {} {}",
                op.stream,
                op.start_ms,
                op.end_ms,
                escape(&op.func, true),
                escape(&op.name, true)
            );
        }
        for w in &self.waits {
            let _ = writeln!(out, "wait {} {}", w.from, w.to);
        }
        out.push_str("critical");
        for i in &self.critical_path {
            let _ = write!(out, " {i}");
        }
        out.push('\n');
        out
    }

    /// Reads a record written by [`to_record`](Self::to_record) (see there for the
    /// format). Errors name the line and say what was expected and what was found;
    /// indices must refer to streams and ops already given, and times must be finite
    /// with each op ending no earlier than it starts.
    pub fn from_record(text: &str) -> Result<Profile> {
        RecordReader::default().read(text)
    }

    fn stream_name(&self, stream: usize) -> &str {
        self.streams.get(stream).map_or("?", String::as_str)
    }
}

// ---------------------------------------------------------------------------------------
// The record format
// ---------------------------------------------------------------------------------------

/// The first line of every record; the version changes when the format does.
const RECORD_HEADER: &str = "# stepgraph profile v1";

/// What each keyword's line looks like, for error messages.
const OP_SHAPE: &str = "`op <stream> <start_ms> <end_ms> <func> <name>`";

fn record_error(line: usize, expected: impl std::fmt::Display, found: &str) -> Error {
    Error::Invalid(format!(
        "profile record line {line}: expected {expected}, found `{found}`"
    ))
}

#[derive(Default)]
struct RecordReader {
    step: Option<String>,
    device: Option<String>,
    total_ms: Option<f64>,
    streams: Vec<String>,
    ops: Vec<OpTiming>,
    waits: Vec<WaitEdge>,
    critical_path: Option<Vec<usize>>,
}

impl RecordReader {
    fn read(mut self, text: &str) -> Result<Profile> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, l)) if l.trim_end() == RECORD_HEADER => {}
            Some((n, l)) => return Err(record_error(n, format!("`{RECORD_HEADER}`"), l)),
            None => return Err(record_error(1, format!("`{RECORD_HEADER}`"), "")),
        }
        let mut last = 1;
        for (n, line) in lines {
            last = n;
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            self.line(n, line)?;
        }
        let end = last + 1;
        let missing = |what: &str| record_error(end, format!("a `{what}` line"), "the end");
        Ok(Profile {
            step: self.step.ok_or_else(|| missing("step"))?,
            device: self.device.ok_or_else(|| missing("device"))?,
            total_ms: self.total_ms.ok_or_else(|| missing("total_ms"))?,
            streams: self.streams,
            ops: self.ops,
            waits: self.waits,
            critical_path: self.critical_path.unwrap_or_default(),
        })
    }

    fn line(&mut self, n: usize, line: &str) -> Result<()> {
        let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
        let once = |slot: bool| {
            if slot {
                Err(record_error(n, format!("one `{key}` line"), line))
            } else {
                Ok(())
            }
        };
        match key {
            "step" => {
                once(self.step.is_some())?;
                self.step = Some(unescape(n, rest)?);
            }
            "device" => {
                once(self.device.is_some())?;
                self.device = Some(unescape(n, rest)?);
            }
            "total_ms" => {
                once(self.total_ms.is_some())?;
                let t = number(n, rest.trim(), "a time in milliseconds")?;
                if t < 0.0 {
                    return Err(record_error(n, "a time of at least 0", rest));
                }
                self.total_ms = Some(t);
            }
            "stream" => self.streams.push(unescape(n, rest)?),
            "op" => {
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let [stream, start, end, func, name] = fields[..] else {
                    return Err(record_error(n, OP_SHAPE, line));
                };
                let stream = self.index(n, stream, self.streams.len(), "stream")?;
                let start_ms = number(n, start, "a start time in milliseconds")?;
                let end_ms = number(n, end, "an end time in milliseconds")?;
                if end_ms < start_ms {
                    return Err(record_error(
                        n,
                        format!("an end time of at least the start, {start}"),
                        end,
                    ));
                }
                self.ops.push(OpTiming {
                    name: unescape(n, name)?,
                    func: unescape(n, func)?,
                    stream,
                    start_ms,
                    end_ms,
                });
            }
            "wait" => {
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let [from, to] = fields[..] else {
                    return Err(record_error(n, "`wait <from op> <to op>`", line));
                };
                let from = self.index(n, from, self.ops.len(), "op")?;
                let to = self.index(n, to, self.ops.len(), "op")?;
                self.waits.push(WaitEdge { from, to });
            }
            "critical" => {
                once(self.critical_path.is_some())?;
                let path = rest
                    .split_whitespace()
                    .map(|i| self.index(n, i, self.ops.len(), "op"))
                    .collect::<Result<_>>()?;
                self.critical_path = Some(path);
            }
            _ => {
                return Err(record_error(
                    n,
                    "a line starting with step, device, total_ms, stream, op, wait or critical",
                    line,
                ));
            }
        }
        Ok(())
    }

    /// An index below `len` (of the streams or ops given so far).
    fn index(&self, n: usize, field: &str, len: usize, what: &str) -> Result<usize> {
        let a = if what.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        match field.parse::<usize>() {
            Ok(i) if i < len => Ok(i),
            _ if len == 0 => Err(record_error(
                n,
                format!("{a} {what} index, but no {what} is given before this line"),
                field,
            )),
            _ => Err(record_error(
                n,
                format!("{a} {what} index from 0 to {} (given so far)", len - 1),
                field,
            )),
        }
    }
}

fn number(n: usize, field: &str, what: &str) -> Result<f64> {
    match field.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(record_error(n, what, field)),
    }
}

/// Escapes text for a record. With `token`, also spaces (so the text stays one
/// whitespace-separated field) and the empty string (so the field is not missing).
fn escape(text: &str, token: bool) -> String {
    if token && text.is_empty() {
        return r"\e".into();
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '\n' => out.push_str(r"\n"),
            '\r' => out.push_str(r"\r"),
            '\t' if token => out.push_str(r"\t"),
            ' ' if token => out.push_str(r"\s"),
            c if token && c.is_whitespace() => {
                // Other whitespace would split the field too.
                let _ = write!(out, r"\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn unescape(n: usize, text: &str) -> Result<String> {
    if text == r"\e" {
        return Ok(String::new());
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let expected = r"an escape \\, \n, \r, \t, \s or \u{..}";
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('s') => out.push(' '),
            Some('u') => {
                let rest = chars.as_str();
                let code = rest
                    .strip_prefix('{')
                    .and_then(|r| r.split_once('}'))
                    .and_then(|(hex, _)| u32::from_str_radix(hex, 16).ok())
                    .and_then(char::from_u32);
                let Some(ch) = code else {
                    return Err(record_error(n, expected, &format!("\\u{rest}")));
                };
                out.push(ch);
                let skip = rest.find('}').map_or(0, |i| i + 1);
                chars = rest[skip..].chars();
            }
            Some(other) => return Err(record_error(n, expected, &format!("\\{other}"))),
            None => return Err(record_error(n, expected, r"\ at the end of the line")),
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// The layout both SVGs are drawn from
// ---------------------------------------------------------------------------------------

/// What the SVG renderer draws: lanes, bars on a horizontal axis, arrows between points,
/// marks. A profile and a plan each become one, so the drawing code exists once.
struct Timeline {
    /// The header's first line.
    title: String,
    /// The header's second line.
    subtitle: String,
    /// Lane labels, top to bottom.
    streams: Vec<String>,
    bars: Vec<Bar>,
    arrows: Vec<Arrow>,
    marks: Vec<Mark>,
    axis: Axis,
    /// What an arrow means, for the legend.
    arrow_meaning: &'static str,
}

struct Bar {
    name: String,
    /// The op's function: bars of one part share a colour.
    part: String,
    lane: usize,
    start: f64,
    end: f64,
    critical: bool,
    tooltip: String,
}

impl Bar {
    fn start_at(&self) -> At {
        At {
            t: self.start,
            lane: self.lane,
            on: On::Bar {
                start: self.start,
                end: self.end,
            },
        }
    }

    fn end_at(&self) -> At {
        At {
            t: self.end,
            ..self.start_at()
        }
    }
}

/// A point on a lane, at the height of the lane's bars: the start or end of a bar, or a
/// mark.
#[derive(Clone, Copy)]
struct At {
    t: f64,
    lane: usize,
    on: On,
}

/// What an arrow's end sits on, which says where its edges are.
#[derive(Clone, Copy)]
enum On {
    Bar { start: f64, end: f64 },
    Mark,
}

struct Arrow {
    from: At,
    to: At,
    label: Option<String>,
    critical: bool,
    tooltip: String,
}

/// A point event drawn as a circle with a label (capture begin and end).
struct Mark {
    at: At,
    label: &'static str,
}

struct Axis {
    lo: f64,
    hi: f64,
    /// Positions and labels.
    ticks: Vec<(f64, String)>,
    /// Written below the lane labels, at the tick labels' height.
    caption: &'static str,
}

impl Timeline {
    fn of_profile(p: &Profile) -> Timeline {
        let lo = p.ops.iter().map(|o| o.start_ms).fold(0.0, f64::min);
        let mut hi = p.ops.iter().map(|o| o.end_ms).fold(p.total_ms, f64::max);
        if !hi.is_finite() || hi <= lo {
            hi = lo + 1.0;
        }
        let bars: Vec<Bar> = p
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| Bar {
                name: op.name.clone(),
                part: op.func.clone(),
                lane: op.stream,
                start: op.start_ms,
                end: op.end_ms,
                critical: p.critical_path.contains(&i),
                tooltip: format!(
                    "{} {} {:.4}–{:.4} ms",
                    op.name,
                    p.stream_name(op.stream),
                    op.start_ms,
                    op.end_ms
                ),
            })
            .collect();
        let on_path = |a: usize, b: usize| p.critical_path.windows(2).any(|w| w == [a, b]);
        let arrows = p
            .waits
            .iter()
            .filter_map(|w| {
                let (from, to) = (bars.get(w.from)?, bars.get(w.to)?);
                Some(Arrow {
                    from: from.end_at(),
                    to: to.start_at(),
                    label: None,
                    critical: on_path(w.from, w.to),
                    tooltip: format!("{} waits for {}", to.name, from.name),
                })
            })
            .collect();
        let path: Vec<&str> = p
            .critical_path
            .iter()
            .filter_map(|&i| p.ops.get(i).map(|o| o.name.as_str()))
            .collect();
        let mut subtitle = format!(
            "{:.3} ms, {} ops on {} streams, overlap {:.2}x",
            p.total_ms,
            p.ops.len(),
            p.streams.len(),
            p.overlap(),
        );
        if !path.is_empty() {
            let _ = write!(
                subtitle,
                "; critical path {:.3} ms: {}",
                p.critical_path_ms(),
                path.join(" → ")
            );
        }
        Timeline {
            title: format!("{} on {}", p.step, p.device),
            subtitle,
            streams: p.streams.clone(),
            bars,
            arrows,
            marks: Vec::new(),
            axis: Axis {
                lo,
                hi,
                ticks: ms_ticks(lo, hi),
                caption: "time (ms)",
            },
            arrow_meaning: "waits for (cross-stream event)",
        }
    }

    fn of_plan(plan: &PlanDesc) -> Timeline {
        // Each op fills most of its level's unit, leaving room for the arrows between.
        const INSET: f64 = 0.14;
        let levels = plan.levels();
        let width = levels.iter().map(|l| l + 1).max().unwrap_or(1) as f64;
        let critical = |i: usize| plan.critical_path.contains(&OpId(i as u32));
        let lane_of = |s: usize| s.min(plan.streams.len().saturating_sub(1));
        let event_label = |e: EventId| format!("e{}", e.0);
        let bars = plan
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let mut tooltip = format!(
                    "{} {} level {}",
                    op.name,
                    plan.streams.get(op.stream.index()).map_or("?", |s| s.name),
                    levels[i]
                );
                if !op.waits.is_empty() {
                    let w: Vec<String> = op.waits.iter().map(|&e| event_label(e)).collect();
                    let _ = write!(tooltip, ", waits {}", w.join(", "));
                }
                if let Some(e) = op.record {
                    let _ = write!(tooltip, ", records {}", event_label(e));
                }
                Bar {
                    name: op.name.to_string(),
                    part: op.func.to_string(),
                    lane: lane_of(op.stream.index()),
                    start: levels[i] as f64 + INSET,
                    end: levels[i] as f64 + 1.0 - INSET,
                    critical: critical(i),
                    tooltip,
                }
            })
            .collect::<Vec<_>>();
        let begin = At {
            t: -0.3,
            lane: 0,
            on: On::Mark,
        };
        let end = At {
            t: width + 0.3,
            lane: 0,
            on: On::Mark,
        };
        let source = |e: EventId| {
            let op = plan.events.get(e.index()).and_then(|ev| ev.after);
            match op.and_then(|o| Some((o.index(), bars.get(o.index())?))) {
                Some((i, bar)) => (bar.end_at(), Some(i), bar.name.as_str()),
                None => (begin, None, "capture begin"),
            }
        };
        let mut arrows = Vec::new();
        for (i, (op, bar)) in plan.ops.iter().zip(&bars).enumerate() {
            for &e in op.waits {
                let (from, from_op, from_name) = source(e);
                arrows.push(Arrow {
                    from,
                    to: bar.start_at(),
                    label: Some(event_label(e)),
                    critical: from_op.is_some_and(|a| plan.is_critical_edge(a, i)),
                    tooltip: format!("{} waits on {} ({})", op.name, event_label(e), from_name),
                });
            }
        }
        for &e in plan.final_waits {
            let (from, _, from_name) = source(e);
            arrows.push(Arrow {
                from,
                to: end,
                label: Some(event_label(e)),
                critical: false,
                tooltip: format!("capture end joins {} ({from_name})", event_label(e)),
            });
        }
        let path: Vec<&str> = plan
            .critical_path
            .iter()
            .filter_map(|o| plan.ops.get(o.index()).map(|o| o.name))
            .collect();
        let mut subtitle = format!(
            "{} ops on {} streams, {} events, {} waits",
            plan.ops.len(),
            plan.streams.len(),
            plan.events.len(),
            plan.wait_count(),
        );
        if !path.is_empty() {
            let _ = write!(
                subtitle,
                "; critical path ({} ops): {}",
                path.len(),
                path.join(" → ")
            );
        }
        if plan.critical_path_by_cost != plan.critical_path
            && !plan.critical_path_by_cost.is_empty()
        {
            let by_cost: Vec<&str> = plan
                .critical_path_by_cost
                .iter()
                .filter_map(|o| plan.ops.get(o.index()).map(|o| o.name))
                .collect();
            let _ = write!(subtitle, "; by cost: {}", by_cost.join(" → "));
        }
        Timeline {
            title: plan_title(plan),
            subtitle,
            streams: plan.streams.iter().map(|s| s.name.to_string()).collect(),
            bars,
            arrows,
            marks: vec![
                Mark {
                    at: begin,
                    label: "begin",
                },
                Mark {
                    at: end,
                    label: "end",
                },
            ],
            axis: Axis {
                lo: -0.6,
                hi: width + 0.6,
                ticks: (0..width as usize)
                    .map(|l| (l as f64 + 0.5, l.to_string()))
                    .collect(),
                caption: "level",
            },
            arrow_meaning: "waits on event",
        }
    }
}

fn plan_title(plan: &PlanDesc) -> String {
    format!("plan of step {} (compile time)", plan.step)
}

fn op_index(node: &str) -> Option<usize> {
    node.strip_prefix("op")?.parse().ok()
}

/// Round tick positions (1, 2 or 5 times a power of ten apart, about eight of them)
/// from `lo` to `hi`, labelled with as many decimals as the step needs.
fn ms_ticks(lo: f64, hi: f64) -> Vec<(f64, String)> {
    let raw = (hi - lo) / 8.0;
    if !raw.is_finite() || raw <= 0.0 {
        return vec![(lo, format!("{lo}"))];
    }
    let mag = 10f64.powf(raw.log10().floor());
    let step = match raw / mag {
        n if n <= 1.0 => mag,
        n if n <= 2.0 => 2.0 * mag,
        n if n <= 5.0 => 5.0 * mag,
        _ => 10.0 * mag,
    };
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last)
        .map(|k| {
            let t = k as f64 * step;
            (t, format!("{t:.decimals$}"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The SVG renderer
// ---------------------------------------------------------------------------------------

/// Width of every picture in SVG units (pixels at 100%): the width the headless-browser
/// test screenshots, and wide enough for a readable timeline.
const WIDTH: f64 = 1200.0;
const HEADER_H: f64 = 62.0;
const LANE_H: f64 = 58.0;
/// A bar's top within its lane, leaving room above it for its name.
const BAR_TOP: f64 = 22.0;
const BAR_H: f64 = 26.0;
const AXIS_H: f64 = 34.0;
const LEGEND_ROW_H: f64 = 24.0;
const RIGHT_PAD: f64 = 40.0;
const OP_FONT: f64 = 11.0;
/// Radius of a capture begin or end mark.
const MARK_R: f64 = 6.0;
const LANE_FONT: f64 = 13.0;
const LEGEND_FONT: f64 = 12.0;
/// A monospace glyph's advance per unit of font size, to tell whether a name fits.
const MONO_ADVANCE: f64 = 0.6;
/// A generous average advance of the sans font, for laying out the legend.
const SANS_ADVANCE: f64 = 0.62;
const FONT_SANS: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";
const FONT_MONO: &str = "DejaVu Sans Mono, Menlo, Consolas, monospace";
/// Part colours (Tableau 10 without its red), in first-seen order of the parts.
const PALETTE: [&str; 9] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
    "#bab0ac",
];
const INK: &str = "#1a1a1a";
const CRITICAL_STROKE: f64 = 2.5;
/// Bars off the critical path are paler, so the path stands out without a legend.
const OFF_PATH_OPACITY: f64 = 0.55;
const ARROW: &str = "#6b6b6b";

/// Parts in first-seen order, each with its palette colour.
struct Parts(Vec<String>);

impl Parts {
    fn of<'a>(funcs: impl Iterator<Item = &'a str>) -> Parts {
        let mut parts: Vec<String> = Vec::new();
        for f in funcs {
            if !parts.iter().any(|p| p == f) {
                parts.push(f.to_string());
            }
        }
        Parts(parts)
    }

    fn color(&self, part: &str) -> &'static str {
        let i = self.0.iter().position(|p| p == part).unwrap_or(0);
        PALETTE[i % PALETTE.len()]
    }
}

/// Dark or white text, whichever reads better on `fill` drawn at `opacity` over white.
fn text_color_on(fill: &str, opacity: f64) -> &'static str {
    let channel = |i: usize| {
        let v = fill
            .get(i..i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(255) as f64
            / 255.0;
        v * opacity + (1.0 - opacity)
    };
    let luma = 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5);
    if luma < 0.55 { "#ffffff" } else { INK }
}

/// Keeps at most `max` characters, ending with `…` when cut.
fn fit(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

fn render_svg(tl: &Timeline) -> String {
    let parts = Parts::of(tl.bars.iter().map(|b| b.part.as_str()));
    let lanes = tl.streams.len().max(1);
    let longest = tl
        .streams
        .iter()
        .map(|s| s.chars().count())
        .max()
        .unwrap_or(4);
    let label_w = (longest as f64 * LANE_FONT * MONO_ADVANCE + 28.0).max(96.0);
    let x0 = label_w + 14.0;
    let x1 = WIDTH - RIGHT_PAD;
    let span = tl.axis.hi - tl.axis.lo;
    let x = |t: f64| x0 + (t - tl.axis.lo) / span * (x1 - x0);
    let lane_top = |lane: usize| HEADER_H + lane as f64 * LANE_H;
    let bar_mid = |lane: usize| lane_top(lane) + BAR_TOP + BAR_H / 2.0;
    let lanes_bottom = lane_top(lanes);

    // The legend is laid out first: its rows set the picture's height.
    let mut legend: Vec<(LegendKey, String)> = parts
        .0
        .iter()
        .map(|p| (LegendKey::Part(parts.color(p)), p.clone()))
        .collect();
    if tl.bars.iter().any(|b| b.critical) {
        legend.push((LegendKey::Critical, "critical path".into()));
    }
    if !tl.arrows.is_empty() {
        legend.push((LegendKey::Arrow, tl.arrow_meaning.into()));
    }
    if !tl.marks.is_empty() {
        legend.push((LegendKey::Mark, "capture begin / end".into()));
    }
    let mut placed = Vec::with_capacity(legend.len());
    let (mut lx, mut row) = (14.0, 0usize);
    for (key, text) in &legend {
        let w = 26.0 + text.chars().count() as f64 * LEGEND_FONT * SANS_ADVANCE + 20.0;
        if lx + w > WIDTH - 14.0 && lx > 14.0 {
            lx = 14.0;
            row += 1;
        }
        placed.push((lx, row, *key, text.as_str()));
        lx += w;
    }
    let legend_top = lanes_bottom + AXIS_H + 6.0;
    let height = legend_top + (row + 1) as f64 * LEGEND_ROW_H + 8.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {WIDTH} {height:.0}\" font-family=\"{FONT_SANS}\" role=\"img\">"
    );
    let _ = writeln!(s, "<title>{}</title>", xml(&tl.title));
    s.push_str("<defs>\n");
    for (id, color) in [("arrow", ARROW), ("arrow-critical", INK)] {
        let _ = writeln!(
            s,
            "<marker id=\"{id}\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" \
             markerHeight=\"7\" markerUnits=\"userSpaceOnUse\" orient=\"auto\">\
             <path d=\"M0,0 L10,5 L0,10 z\" fill=\"{color}\"/></marker>"
        );
    }
    s.push_str("</defs>\n");
    // A background of its own, so the picture reads the same on a dark page.
    let _ = writeln!(
        s,
        "<rect width=\"{WIDTH}\" height=\"{height:.0}\" fill=\"#ffffff\"/>"
    );
    let _ = writeln!(
        s,
        "<text class=\"title\" x=\"14\" y=\"25\" font-size=\"16\" font-weight=\"bold\" \
         fill=\"{INK}\">{}</text>",
        xml(&fit(&tl.title, 120))
    );
    let _ = writeln!(
        s,
        "<text class=\"subtitle\" x=\"14\" y=\"46\" font-size=\"12\" fill=\"#444444\">{}</text>",
        xml(&fit(&tl.subtitle, 180))
    );

    // Lanes: alternating bands with the stream's name in the left column.
    for (i, name) in tl.streams.iter().enumerate() {
        let fill = if i % 2 == 0 { "#f3f4f7" } else { "#ffffff" };
        let _ = writeln!(
            s,
            "<rect class=\"lane\" x=\"0\" y=\"{:.1}\" width=\"{WIDTH}\" height=\"{LANE_H}\" \
             fill=\"{fill}\"/>",
            lane_top(i)
        );
        let _ = writeln!(
            s,
            "<text class=\"lane-label\" x=\"14\" y=\"{:.1}\" font-family=\"{FONT_MONO}\" \
             font-size=\"{LANE_FONT}\" font-weight=\"bold\" fill=\"{INK}\">{}</text>",
            bar_mid(i) + LANE_FONT * 0.35,
            xml(name)
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{label_w:.1}\" y1=\"{HEADER_H}\" x2=\"{label_w:.1}\" y2=\"{lanes_bottom:.1}\" \
         stroke=\"#c8c8c8\"/>"
    );

    // Axis: grid lines through the lanes, tick labels below them; every k-th tick only
    // (k = 1, 2, 5, 10, 20, ...) when all of them would not fit side by side.
    let widest = tl
        .axis
        .ticks
        .iter()
        .map(|(_, l)| l.chars().count())
        .max()
        .unwrap_or(1);
    let room = widest as f64 * 11.0 * SANS_ADVANCE + 10.0;
    let pitch = match tl.axis.ticks.as_slice() {
        [(a, _), (b, _), ..] => (x(*b) - x(*a)).abs(),
        _ => f64::INFINITY,
    };
    let every = [1usize, 2, 5]
        .iter()
        .cycle()
        .scan(1usize, |scale, &m| {
            let k = m * *scale;
            if m == 5 {
                *scale *= 10;
            }
            Some(k)
        })
        .find(|&k| k as f64 * pitch >= room || k >= tl.axis.ticks.len())
        .unwrap_or(1);
    for (t, label) in tl.axis.ticks.iter().step_by(every) {
        let tx = x(*t);
        let _ = writeln!(
            s,
            "<line class=\"grid\" x1=\"{tx:.2}\" y1=\"{HEADER_H}\" x2=\"{tx:.2}\" \
             y2=\"{:.1}\" stroke=\"#d9d9d9\" stroke-width=\"1\"/>",
            lanes_bottom + 4.0
        );
        let _ = writeln!(
            s,
            "<text class=\"tick\" x=\"{tx:.2}\" y=\"{:.1}\" font-size=\"11\" fill=\"#555555\" \
             text-anchor=\"middle\">{}</text>",
            lanes_bottom + 17.0,
            xml(label)
        );
    }
    let _ = writeln!(
        s,
        "<text class=\"axis-caption\" x=\"14\" y=\"{:.1}\" font-size=\"11\" fill=\"#555555\">{}</text>",
        lanes_bottom + 17.0,
        tl.axis.caption
    );

    // Bars, then their names: inside when the name fits, else above when that space on
    // the lane is free, else only in the tooltip.
    let mut label_free = vec![f64::NEG_INFINITY; lanes];
    let mut labels = String::new();
    for bar in &tl.bars {
        let lane = bar.lane.min(lanes - 1);
        let bx = x(bar.start);
        let bw = (x(bar.end) - bx).max(2.0);
        let by = lane_top(lane) + BAR_TOP;
        let fill = parts.color(&bar.part);
        let (class, opacity, stroke) = if bar.critical {
            (
                "op critical",
                1.0,
                format!(" stroke=\"{INK}\" stroke-width=\"{CRITICAL_STROKE}\""),
            )
        } else {
            ("op", OFF_PATH_OPACITY, String::new())
        };
        let _ = writeln!(
            s,
            "<rect class=\"{class}\" x=\"{bx:.2}\" y=\"{by:.1}\" width=\"{bw:.2}\" \
             height=\"{BAR_H}\" rx=\"3\" fill=\"{fill}\" fill-opacity=\"{opacity}\"{stroke}>\
             <title>{}</title></rect>",
            xml(&bar.tooltip)
        );
        let text_w = bar.name.chars().count() as f64 * OP_FONT * MONO_ADVANCE;
        if text_w + 8.0 <= bw {
            let _ = writeln!(
                labels,
                "<text class=\"op-label\" x=\"{:.2}\" y=\"{:.1}\" font-family=\"{FONT_MONO}\" \
                 font-size=\"{OP_FONT}\" fill=\"{}\" text-anchor=\"middle\" \
                 pointer-events=\"none\">{}</text>",
                bx + bw / 2.0,
                by + BAR_H / 2.0 + OP_FONT * 0.35,
                text_color_on(fill, opacity),
                xml(&bar.name)
            );
        } else if bx >= label_free[lane] && bx + text_w <= WIDTH - 4.0 {
            let _ = writeln!(
                labels,
                "<text class=\"op-label\" x=\"{bx:.2}\" y=\"{:.1}\" font-family=\"{FONT_MONO}\" \
                 font-size=\"{OP_FONT}\" fill=\"{INK}\" pointer-events=\"none\">{}</text>",
                by - 5.0,
                xml(&bar.name)
            );
            label_free[lane] = bx + text_w + 6.0;
        }
    }

    // Arrows over the bars, those on the critical path last so that they stay on top.
    // A wait between lanes leaves its source's top or bottom edge at the source's end
    // and enters the target's facing edge at the target's start, vertically at both
    // ends: fork and join points read as such even when the two ops are microseconds
    // apart, which is too close to route an arrow around.
    let edge = |at: &At, toward: f64| -> (f64, f64) {
        let lane = at.lane.min(lanes - 1);
        let (px, half) = match at.on {
            On::Bar { start, end } => {
                let (bx0, bx1) = (x(start), x(end).max(x(start) + 2.0));
                let inset = ((bx1 - bx0) / 2.0).min(3.0);
                // The source's end or the target's start, a little inside the bar.
                let px = if at.t >= end {
                    bx1 - inset
                } else {
                    bx0 + inset
                };
                (px, BAR_H / 2.0)
            }
            On::Mark => (x(at.t), MARK_R),
        };
        (px, bar_mid(lane) + half * toward.signum())
    };
    let mut order: Vec<&Arrow> = tl.arrows.iter().filter(|a| !a.critical).collect();
    order.extend(tl.arrows.iter().filter(|a| a.critical));
    for a in order {
        let down = (a.to.lane as f64 - a.from.lane as f64).signum();
        let (class, color, width, marker) = if a.critical {
            ("wait critical-edge", INK, 2.0, "arrow-critical")
        } else {
            ("wait", ARROW, 1.3, "arrow")
        };
        let d = if down == 0.0 {
            let (sx, sy) = (x(a.from.t), bar_mid(a.from.lane.min(lanes - 1)));
            format!("M{sx:.2},{sy:.1} L{:.2},{sy:.1}", x(a.to.t))
        } else {
            let (sx, sy) = edge(&a.from, down);
            let (ex, ey) = edge(&a.to, -down);
            let mid = (sy + ey) / 2.0;
            format!("M{sx:.2},{sy:.1} C{sx:.2},{mid:.1} {ex:.2},{mid:.1} {ex:.2},{ey:.1}")
        };
        let _ = writeln!(
            s,
            "<path class=\"{class}\" d=\"{d}\" fill=\"none\" stroke=\"{color}\" \
             stroke-width=\"{width}\" marker-end=\"url(#{marker})\"><title>{}</title></path>",
            xml(&a.tooltip)
        );
        if let Some(label) = &a.label {
            // At the curve's midpoint, on a white halo so it stays legible over bars.
            let (sx, sy) = edge(&a.from, down);
            let (ex, ey) = edge(&a.to, -down);
            let _ = writeln!(
                labels,
                "<text class=\"event-label\" x=\"{:.2}\" y=\"{:.1}\" font-size=\"10\" \
                 fill=\"#333333\" text-anchor=\"middle\" stroke=\"#ffffff\" stroke-width=\"3\" \
                 paint-order=\"stroke\" pointer-events=\"none\">{}</text>",
                (sx + ex) / 2.0,
                (sy + ey) / 2.0 + 3.5,
                xml(label)
            );
        }
    }
    for m in &tl.marks {
        let (mx, my) = (x(m.at.t), bar_mid(m.at.lane.min(lanes - 1)));
        let _ = writeln!(
            s,
            "<circle class=\"mark\" cx=\"{mx:.2}\" cy=\"{my:.1}\" r=\"6\" fill=\"#ffffff\" \
             stroke=\"{INK}\" stroke-width=\"2\"><title>capture {}</title></circle>",
            m.label
        );
        let _ = writeln!(
            labels,
            "<text class=\"mark-label\" x=\"{mx:.2}\" y=\"{:.1}\" font-size=\"10\" \
             fill=\"#333333\" text-anchor=\"middle\">{}</text>",
            my - 11.0,
            m.label
        );
    }
    s.push_str(&labels);

    for (lx, row, key, text) in placed {
        let y = legend_top + row as f64 * LEGEND_ROW_H;
        match key {
            LegendKey::Part(color) => {
                let _ = writeln!(
                    s,
                    "<rect class=\"legend-key\" x=\"{lx:.1}\" y=\"{y:.1}\" width=\"18\" \
                     height=\"14\" rx=\"2\" fill=\"{color}\"/>"
                );
            }
            LegendKey::Critical => {
                let _ = writeln!(
                    s,
                    "<rect class=\"legend-key\" x=\"{lx:.1}\" y=\"{y:.1}\" width=\"18\" \
                     height=\"14\" rx=\"2\" fill=\"#d0d0d0\" stroke=\"{INK}\" \
                     stroke-width=\"{CRITICAL_STROKE}\"/>"
                );
            }
            LegendKey::Arrow => {
                let _ = writeln!(
                    s,
                    "<path class=\"legend-key\" d=\"M{lx:.1},{:.1} L{:.1},{:.1}\" \
                     stroke=\"{ARROW}\" stroke-width=\"1.3\" marker-end=\"url(#arrow)\"/>",
                    y + 7.0,
                    lx + 18.0,
                    y + 7.0
                );
            }
            LegendKey::Mark => {
                let _ = writeln!(
                    s,
                    "<circle class=\"legend-key\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"6\" \
                     fill=\"#ffffff\" stroke=\"{INK}\" stroke-width=\"2\"/>",
                    lx + 9.0,
                    y + 7.0
                );
            }
        }
        let _ = writeln!(
            s,
            "<text class=\"legend\" x=\"{:.1}\" y=\"{:.1}\" font-size=\"{LEGEND_FONT}\" \
             fill=\"#333333\">{}</text>",
            lx + 26.0,
            y + 11.5,
            xml(text)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[derive(Clone, Copy)]
enum LegendKey {
    Part(&'static str),
    Critical,
    Arrow,
    Mark,
}

// ---------------------------------------------------------------------------------------
// Escaping
// ---------------------------------------------------------------------------------------

/// Text for XML character data and attribute values.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters other than tab and newlines are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// A JSON string literal, quotes included.
fn json_str(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number with three decimals (nanoseconds, for microsecond times); `null` for a
/// value JSON cannot hold.
fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "null".into()
    }
}

/// A DOT double-quoted string.
fn dot_str(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{EventDesc, OpDesc, StreamDesc, StreamId};

    fn op(name: &str, func: &str, stream: usize, start_ms: f64, end_ms: f64) -> OpTiming {
        OpTiming {
            name: name.into(),
            func: func.into(),
            stream,
            start_ms,
            end_ms,
        }
    }

    /// A fork and join over two side streams: `seed` on main, `chain[0]` and `chain[1]`
    /// on their own streams, `total` back on main after both.
    fn fork_join() -> Profile {
        Profile {
            step: "fork_join".into(),
            device: "Test GPU <&> \"quoted\"".into(),
            streams: vec!["main".into(), "chain[0]".into(), "chain[1]".into()],
            ops: vec![
                op("seed", "seed", 0, 0.0, 0.005),
                op("chain[0]", "chain", 1, 0.008, 0.35),
                op("chain[1]", "chain", 2, 0.009, 0.362),
                op("total", "total", 0, 0.364, 0.374),
            ],
            waits: vec![
                WaitEdge { from: 0, to: 1 },
                WaitEdge { from: 0, to: 2 },
                WaitEdge { from: 1, to: 3 },
                WaitEdge { from: 2, to: 3 },
            ],
            critical_path: vec![0, 2, 3],
            total_ms: 0.374,
        }
    }

    const fn plan_op(
        name: &'static str,
        stream: u16,
        waits: &'static [EventId],
        record: Option<EventId>,
    ) -> OpDesc {
        OpDesc {
            name,
            func: name,
            stream: StreamId(stream),
            accesses: &[],
            waits,
            record,
            cost: 1.0,
        }
    }

    /// `a` on main forks `b` (side) through e1; `c` (other) starts from the capture-begin
    /// event e0; `d` on main joins `b`; `c` is joined only at capture end.
    const PLAN: PlanDesc = PlanDesc {
        step: "shapes",
        streams: &[
            StreamDesc::named("main"),
            StreamDesc::named("side"),
            StreamDesc::named("other"),
        ],
        buffers: &[],
        ops: &[
            plan_op("a", 0, &[], Some(EventId(1))),
            plan_op("b", 1, &[EventId(1)], Some(EventId(2))),
            plan_op("c", 2, &[EventId(0)], Some(EventId(3))),
            plan_op("d", 0, &[EventId(2)], None),
        ],
        edges: &[],
        events: &[
            EventDesc {
                stream: StreamId(0),
                after: None,
            },
            EventDesc {
                stream: StreamId(0),
                after: Some(OpId(0)),
            },
            EventDesc {
                stream: StreamId(1),
                after: Some(OpId(1)),
            },
            EventDesc {
                stream: StreamId(2),
                after: Some(OpId(2)),
            },
        ],
        final_waits: &[EventId(3)],
        critical_path: &[OpId(0), OpId(1), OpId(3)],
        critical_path_by_cost: &[OpId(0), OpId(1), OpId(3)],
    };

    fn parse(svg: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not well-formed: {e}\n{svg}"))
    }

    fn has_class(n: &roxmltree::Node<'_, '_>, class: &str) -> bool {
        n.attribute("class")
            .is_some_and(|c| c.split(' ').any(|t| t == class))
    }

    fn with_class<'a>(
        doc: &'a roxmltree::Document<'a>,
        class: &str,
    ) -> Vec<roxmltree::Node<'a, 'a>> {
        doc.descendants().filter(|n| has_class(n, class)).collect()
    }

    fn title_of(n: &roxmltree::Node<'_, '_>) -> String {
        n.children()
            .find(|c| c.has_tag_name("title"))
            .and_then(|t| t.text())
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn profile_svg_is_well_formed_and_labels_every_lane_and_op() {
        let p = fork_join();
        let svg = p.to_svg();
        assert_eq!(svg, p.to_svg(), "same profile, same bytes");
        let doc = parse(&svg);
        let lanes: Vec<&str> = with_class(&doc, "lane-label")
            .iter()
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(lanes, ["main", "chain[0]", "chain[1]"]);
        let titles: Vec<String> = with_class(&doc, "op").iter().map(title_of).collect();
        assert_eq!(
            titles,
            [
                "seed main 0.0000–0.0050 ms",
                "chain[0] chain[0] 0.0080–0.3500 ms",
                "chain[1] chain[1] 0.0090–0.3620 ms",
                "total main 0.3640–0.3740 ms",
            ]
        );
        let title = with_class(&doc, "title")[0].text().unwrap();
        assert_eq!(title, "fork_join on Test GPU <&> \"quoted\"");
        let subtitle = with_class(&doc, "subtitle")[0].text().unwrap();
        assert!(
            subtitle.starts_with("0.374 ms, 4 ops on 3 streams, overlap 1.90x"),
            "{subtitle}"
        );
        // Long bars carry their names; the legend names each part once.
        let ops: Vec<&str> = with_class(&doc, "op-label")
            .iter()
            .filter_map(|n| n.text())
            .collect();
        assert!(
            ops.contains(&"chain[0]") && ops.contains(&"seed"),
            "{ops:?}"
        );
        let legend: Vec<&str> = with_class(&doc, "legend")
            .iter()
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(legend[..3], ["seed", "chain", "total"]);
    }

    #[test]
    fn bars_are_to_scale_and_critical_class_marks_exactly_the_critical_ops() {
        let doc_text = fork_join().to_svg();
        let doc = parse(&doc_text);
        let critical: Vec<String> = with_class(&doc, "critical")
            .iter()
            .map(|n| {
                title_of(n)
                    .split(' ')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        assert_eq!(critical, ["seed", "chain[1]", "total"]);
        let width = |name: &str| {
            let bar = with_class(&doc, "op")
                .into_iter()
                .find(|n| title_of(n).starts_with(name))
                .unwrap();
            bar.attribute("width").unwrap().parse::<f64>().unwrap()
        };
        let ratio = width("chain[0]") / width("total");
        assert!((ratio - 0.342 / 0.010).abs() < 0.5, "{ratio}");
    }

    #[test]
    fn each_wait_is_an_arrow_and_those_on_the_critical_path_are_marked() {
        let svg = fork_join().to_svg();
        let doc = parse(&svg);
        let arrows = with_class(&doc, "wait");
        assert_eq!(arrows.len(), 4);
        assert!(arrows.iter().all(|a| a.attribute("marker-end").is_some()));
        let on_path: Vec<String> = with_class(&doc, "critical-edge")
            .iter()
            .map(title_of)
            .collect();
        assert_eq!(
            on_path,
            ["chain[1] waits for seed", "total waits for chain[1]"]
        );
        assert!(
            svg.contains("<marker id=\"arrow\"") && svg.contains("<marker id=\"arrow-critical\"")
        );
    }

    #[test]
    fn ticks_are_round_numbers_in_milliseconds() {
        let ticks = ms_ticks(0.0, 0.374);
        let labels: Vec<&str> = ticks.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "0.00", "0.05", "0.10", "0.15", "0.20", "0.25", "0.30", "0.35"
            ]
        );
        let labels: Vec<String> = ms_ticks(0.0, 12.0).into_iter().map(|(_, l)| l).collect();
        assert_eq!(labels, ["0", "2", "4", "6", "8", "10", "12"]);
        assert_eq!(ms_ticks(1.0, 1.0).len(), 1);
    }

    #[test]
    fn trace_json_has_a_track_per_stream_an_event_per_op_and_a_flow_per_wait() {
        let p = fork_join();
        let json: serde_json::Value = serde_json::from_str(&p.to_trace_json()).unwrap();
        assert_eq!(json["displayTimeUnit"], "ms");
        let events = json["traceEvents"].as_array().unwrap();
        let of = |ph: &str, name: Option<&str>| -> Vec<&serde_json::Value> {
            events
                .iter()
                .filter(|e| e["ph"] == ph && name.is_none_or(|n| e["name"] == n))
                .collect()
        };
        let threads: Vec<(u64, &str)> = of("M", Some("thread_name"))
            .iter()
            .map(|e| {
                (
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(threads, [(0, "main"), (1, "chain[0]"), (2, "chain[1]")]);
        let complete = of("X", None);
        assert_eq!(complete.len(), p.ops.len());
        for (e, op) in complete.iter().zip(&p.ops) {
            assert_eq!(e["name"], op.name.as_str());
            assert_eq!(e["tid"].as_u64().unwrap() as usize, op.stream);
            assert!(
                (e["ts"].as_f64().unwrap() - op.start_ms * 1e3).abs() < 1e-3,
                "{e}"
            );
            assert!(
                (e["dur"].as_f64().unwrap() - op.duration_ms() * 1e3).abs() < 1e-3,
                "{e}"
            );
            assert_eq!(e["args"]["func"], op.func.as_str());
            assert_eq!(e["args"]["stream"], p.streams[op.stream].as_str());
        }
        let (starts, finishes) = (of("s", None), of("f", None));
        assert_eq!((starts.len(), finishes.len()), (4, 4));
        for (k, (s, f)) in starts.iter().zip(&finishes).enumerate() {
            let w = p.waits[k];
            assert_eq!(
                (s["id"].as_u64(), f["id"].as_u64()),
                (Some(k as u64), Some(k as u64))
            );
            assert_eq!(s["tid"].as_u64().unwrap() as usize, p.ops[w.from].stream);
            assert_eq!(f["tid"].as_u64().unwrap() as usize, p.ops[w.to].stream);
            assert_eq!(f["bp"], "e");
        }
        assert_eq!(json["otherData"]["device"], p.device.as_str());
    }

    #[test]
    fn json_strings_escape_quotes_backslashes_and_control_characters() {
        assert_eq!(json_str("plain"), r#""plain""#);
        assert_eq!(json_str("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(json_str("l1\nl2\t\r"), r#""l1\nl2\t\r""#);
        assert_eq!(json_str("\u{1}é"), "\"\\u0001é\"");
        let back: String = serde_json::from_str(&json_str("\"\\\n\u{1f}x")).unwrap();
        assert_eq!(back, "\"\\\n\u{1f}x");
        assert_eq!(json_num(f64::NAN), "null");
        assert_eq!(
            xml("<a & 'b'>\u{7}"),
            "&lt;a &amp; &apos;b&apos;&gt;\u{fffd}"
        );
        assert_eq!(dot_str("x\"y\\"), r#""x\"y\\""#);
    }

    #[test]
    fn record_round_trips_and_reads_comments_and_crlf() {
        let p = fork_join();
        let text = p.to_record();
        assert_eq!(Profile::from_record(&text).unwrap(), p);
        let crlf =
            text.replace('\n', "\r\n")
                .replacen("stream main", "# a comment\r\n\r\nstream main", 1);
        assert_eq!(Profile::from_record(&crlf).unwrap(), p);
    }

    #[test]
    fn malformed_records_are_errors_naming_the_line() {
        let good = fork_join().to_record();
        let err = |text: &str| Profile::from_record(text).unwrap_err().to_string();
        let line_of = |needle: &str| good.lines().position(|l| l.starts_with(needle)).unwrap() + 1;
        let cases = [
            (
                good.replace("op 1 0.008", "op 1 0.0x8"),
                line_of("op 1"),
                "expected a start time in milliseconds, found `0.0x8`",
            ),
            (
                good.replace("op 1 0.008", "op 7 0.008"),
                line_of("op 1"),
                "expected a stream index from 0 to 2 (given so far), found `7`",
            ),
            (
                good.replace("op 1 0.008 0.35", "op 1 0.008 0.001"),
                line_of("op 1"),
                "expected an end time of at least the start, 0.008, found `0.001`",
            ),
            (
                good.replace("wait 2 3", "wait 2 9"),
                line_of("wait 2"),
                "expected an op index from 0 to 3 (given so far), found `9`",
            ),
            (
                good.replace("op 0 0 0.005 seed seed", "op 0 0 0.005 seed"),
                line_of("op 0"),
                "expected `op <stream> <start_ms> <end_ms> <func> <name>`",
            ),
            (
                good.replace("total_ms", "total"),
                line_of("total_ms"),
                "expected a line starting with step",
            ),
            (
                good.replace("seed seed", r"seed se\qd"),
                line_of("op 0"),
                r"found `\q`",
            ),
            (
                good.replace("step fork_join", "step fork_join\nstep again"),
                3,
                "expected one `step` line",
            ),
        ];
        for (text, line, message) in cases {
            let e = err(&text);
            assert!(
                e.starts_with(&format!("profile record line {line}: ")),
                "{e}"
            );
            assert!(e.contains(message), "{e}");
        }
        assert!(
            err("step x\n").contains("line 1: expected `# stepgraph profile v1`, found `step x`")
        );
        let e = err("# stepgraph profile v1\nstep s\ndevice d\n");
        assert!(
            e.contains("line 4: expected a `total_ms` line, found `the end`"),
            "{e}"
        );
        assert!(err("").contains("line 1"));
    }

    #[test]
    fn record_escapes_keep_odd_names_in_one_field() {
        for name in [
            "",
            " ",
            "a b",
            "tab\there",
            "new\nline",
            r"back\slash",
            r"\e",
            "nb\u{a0}sp",
        ] {
            let escaped = escape(name, true);
            assert!(
                !escaped.is_empty() && !escaped.contains(char::is_whitespace),
                "{escaped:?}"
            );
            assert_eq!(unescape(1, &escaped).unwrap(), name);
        }
        assert_eq!(escape("NVIDIA H100", false), "NVIDIA H100");
    }

    proptest::proptest! {
        #[test]
        fn any_profile_round_trips_through_a_record(
            step in ".*", device in ".*", name in ".*", func in ".*",
            streams in proptest::collection::vec(".*", 1..4),
            start in -1e3f64..1e3, len in 0f64..1e3, total in 0f64..1e6,
        ) {
            let p = Profile {
                step, device,
                ops: vec![op(&name, &func, streams.len() - 1, start, start + len)],
                streams,
                waits: vec![WaitEdge { from: 0, to: 0 }],
                critical_path: vec![0],
                total_ms: total,
            };
            proptest::prop_assert_eq!(Profile::from_record(&p.to_record()).unwrap(), p);
        }
    }

    #[test]
    fn levels_follow_stream_order_and_waits() {
        // b waits for a; c waits only on capture begin; d follows a on main and waits b.
        assert_eq!(PLAN.levels(), [0, 1, 0, 2]);
    }

    #[test]
    fn dot_has_a_cluster_per_stream_a_dashed_edge_per_wait_and_bold_critical_ops() {
        let dot = PLAN.to_dot();
        for (i, s) in PLAN.streams.iter().enumerate() {
            assert!(
                dot.contains(&format!(
                    "subgraph cluster_{i} {{\n    label=\"{}\";",
                    s.name
                )),
                "{dot}"
            );
        }
        assert_eq!(dot.matches("style=dashed").count(), PLAN.wait_count());
        for edge in [
            "op0 -> op1 [style=dashed, label=\"e1\"",
            "capture_begin -> op2 [style=dashed, label=\"e0\"",
            "op1 -> op3 [style=dashed, label=\"e2\"",
            "op2 -> capture_end [style=dashed, label=\"e3\"",
            "capture_begin -> op0;",
            "op0 -> op3;",
            "op3 -> capture_end;",
        ] {
            assert!(dot.contains(edge), "missing {edge}:\n{dot}");
        }
        let bold: Vec<&str> = dot
            .lines()
            .filter(|l| l.contains("style=\"rounded,filled,bold\""))
            .map(|l| l.trim().split(' ').next().unwrap())
            .collect();
        assert_eq!(bold, ["op0", "op3", "op1"], "by stream, then program order");
        assert_eq!(dot.matches('{').count(), dot.matches('}').count());
    }

    #[test]
    fn plan_svg_puts_ops_at_their_levels_with_event_arrows_and_capture_marks() {
        let svg = PLAN.to_svg();
        let doc = parse(&svg);
        let lanes: Vec<&str> = with_class(&doc, "lane-label")
            .iter()
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(lanes, ["main", "side", "other"]);
        let x_of = |name: &str| -> f64 {
            let bar = with_class(&doc, "op")
                .into_iter()
                .find(|n| title_of(n).starts_with(&format!("{name} ")))
                .unwrap();
            bar.attribute("x").unwrap().parse().unwrap()
        };
        assert_eq!(x_of("a"), x_of("c"), "both at level 0");
        assert!(x_of("a") < x_of("b") && x_of("b") < x_of("d"));
        let mut events: Vec<&str> = with_class(&doc, "event-label")
            .iter()
            .filter_map(|n| n.text())
            .collect();
        events.sort();
        assert_eq!(events, ["e0", "e1", "e2", "e3"], "one label per wait");
        assert_eq!(with_class(&doc, "wait").len(), PLAN.wait_count());
        assert_eq!(with_class(&doc, "mark").len(), 2);
        let critical: Vec<String> = with_class(&doc, "critical").iter().map(title_of).collect();
        assert_eq!(
            critical,
            [
                "a main level 0, records e1",
                "b side level 1, waits e1, records e2",
                "d main level 2, waits e2"
            ]
        );
    }

    #[test]
    fn print_plan_argument_is_read_in_both_spellings_and_checked() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(PlanFormat::from_args(args(&["--quick"])).unwrap(), None);
        assert_eq!(
            PlanFormat::from_args(args(&["--print-plan", "dot"])).unwrap(),
            Some(PlanFormat::Dot)
        );
        assert_eq!(
            PlanFormat::from_args(args(&["--print-plan=svg"])).unwrap(),
            Some(PlanFormat::Svg)
        );
        let e = PlanFormat::from_args(args(&["--print-plan", "png"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--print-plan: expected `dot` or `svg`, found `png`"
        );
        assert!(PlanFormat::from_args(args(&["--print-plan"])).is_err());
        assert_eq!(PLAN.render(PlanFormat::Dot), PLAN.to_dot());
    }
}
