//! Pictures of a compile-time plan: Graphviz DOT, and an SVG drawn by the timeline
//! renderer with each op at its level in the schedule; and the `--print-plan` argument
//! through which `cargo xtask plan` asks an example for them.

use std::fmt::Write as _;
use std::process::ExitCode;

use stepgraph_plan::{EventId, OpDesc, OpId, PlanDesc};

use crate::Error;
use crate::timeline::{Arrow, At, Axis, Bar, Mark, On, Parts, Timeline, render_svg, text_color_on};

/// The picture formats of a plan, as an example's `--print-plan` argument names them.
///
/// ```
/// use stepgraph_picture::PlanFormat;
///
/// let args = ["fork_join", "--print-plan", "svg"].map(String::from);
/// assert_eq!(PlanFormat::from_args(args).unwrap(), Some(PlanFormat::Svg));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanFormat {
    /// Graphviz DOT ([`plan_dot`]).
    Dot,
    /// A self-contained SVG ([`plan_svg`]).
    Svg,
}

impl PlanFormat {
    /// Reads `--print-plan dot|svg` (or `--print-plan=dot|svg`) from a program's
    /// arguments: `Ok(None)` when it is absent, [`Error::PlanFormat`] naming the value
    /// when it is not `dot` or `svg`.
    pub fn from_args<I: IntoIterator<Item = String>>(args: I) -> Result<Option<PlanFormat>, Error> {
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
                _ => Err(Error::PlanFormat { found: value }),
            };
        }
        Ok(None)
    }
}

/// The plan in `format`: [`plan_dot`] or [`plan_svg`].
pub fn render_plan(plan: &PlanDesc, format: PlanFormat) -> String {
    match format {
        PlanFormat::Dot => plan_dot(plan),
        PlanFormat::Svg => plan_svg(plan),
    }
}

/// Handles `--print-plan dot|svg` for an example's `main`: when the program's arguments
/// ask for it, prints the plan in that format to stdout and returns the exit code to
/// return at once, before anything touches a GPU (this is how `cargo xtask plan
/// <example>` draws a plan on a machine without one). Returns `None` when the argument
/// is absent; prints the error and returns a failure code when its value is neither
/// `dot` nor `svg`.
///
/// ```no_run
/// # mod fork_join {
/// #     pub const PLAN: stepgraph_picture::PlanDesc = stepgraph_picture::PlanDesc::new("s");
/// # }
/// fn main() -> std::process::ExitCode {
///     if let Some(code) = stepgraph_picture::print_plan_if_asked(&fork_join::PLAN) {
///         return code;
///     }
///     // ... open the device and run the step
///     std::process::ExitCode::SUCCESS
/// }
/// ```
pub fn print_plan_if_asked(plan: &PlanDesc) -> Option<ExitCode> {
    match PlanFormat::from_args(std::env::args().skip(1)) {
        Ok(None) => None,
        Ok(Some(format)) => {
            print!("{}", render_plan(plan, format));
            Some(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Some(ExitCode::FAILURE)
        }
    }
}

/// The plan as Graphviz DOT: one `subgraph cluster_<i>` per stream labelled with the
/// stream's name, a node per op in program order, solid edges for the order of ops on
/// one stream, dashed edges labelled with the event (`e3`) for each cross-stream wait,
/// capture begin and end nodes on the origin stream with the final joins into the end,
/// and the critical path (by op count) in bold. Render it with
/// `dot -Tsvg plan.dot > plan.svg`.
///
/// ```
/// use stepgraph_picture::plan_dot;
/// use stepgraph_plan::{EventDesc, EventId, OpDesc, OpId, PlanDesc, StreamDesc, StreamId};
///
/// const PLAN: PlanDesc = PlanDesc::new("two")
///     .with_streams(&[StreamDesc::named("main"), StreamDesc::named("side")])
///     .with_ops(&[
///         OpDesc::new("a", StreamId(0)).with_record(EventId(0)),
///         OpDesc::new("b", StreamId(1)).with_waits(&[EventId(0)]).with_record(EventId(1)),
///     ])
///     .with_events(&[
///         EventDesc::after(StreamId(0), OpId(0)),
///         EventDesc::after(StreamId(1), OpId(1)),
///     ])
///     .with_final_waits(&[EventId(1)])
///     .with_critical_paths(&[OpId(0), OpId(1)], &[OpId(0), OpId(1)]);
/// let dot = plan_dot(&PLAN);
/// assert!(dot.contains("subgraph cluster_1 {"));
/// assert!(dot.contains(r#"op0 -> op1 [style=dashed, label="e0""#));
/// assert!(dot.contains(r#"op1 -> capture_end [style=dashed, label="e1""#));
/// ```
pub fn plan_dot(plan: &PlanDesc) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "digraph {} {{",
        dot_str(&format!("plan {}", plan.step))
    );
    let _ = writeln!(
        out,
        "  graph [label={}, labelloc=t, fontname=\"Helvetica\", fontsize=16, rankdir=LR, \
         newrank=true, nodesep=0.3, ranksep=0.5];",
        dot_str(&plan_title(plan))
    );
    out.push_str(
        "  node [shape=box, style=\"rounded,filled\", fontname=\"Courier\", fontsize=11, \
         penwidth=1, color=\"#444444\"];\n  edge [fontname=\"Helvetica\", fontsize=10, \
         color=\"#555555\"];\n",
    );
    write_dot_clusters(&mut out, plan);
    write_dot_stream_order(&mut out, plan);
    write_dot_waits(&mut out, plan);
    out.push_str("}\n");
    out
}

/// A cluster per stream holding its ops, the origin's with the capture's begin and end.
fn write_dot_clusters(out: &mut String, plan: &PlanDesc) {
    let critical = |i: usize| plan.critical_path.contains(&OpId(i as u32));
    let parts = Parts::of(plan.ops.iter().map(|o| o.func));
    for (s, stream) in plan.streams.iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_{s} {{");
        let _ = writeln!(
            out,
            "    label={}; fontname=\"Courier-Bold\"; style=\"rounded,filled\"; \
             color=\"#bbbbbb\"; fillcolor=\"{}\";",
            dot_str(&if stream.automatic {
                format!("{} (the planner's)", stream.name)
            } else {
                stream.name.to_string()
            }),
            if s % 2 == 0 { "#f5f6f8" } else { "#ffffff" }
        );
        if s == 0 {
            out.push_str(
                "    capture_begin [label=\"begin\", shape=circle, style=filled, \
                 fillcolor=\"#ffffff\", fontname=\"Helvetica\", fontsize=9];\n",
            );
        }
        for (i, op) in plan.ops.iter().enumerate() {
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
                dot_str(&op_label(plan, op)),
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
}

/// Stream order: begin, the origin's ops, end on the origin; each side stream's ops in
/// program order.
fn write_dot_stream_order(out: &mut String, plan: &PlanDesc) {
    for s in 0..plan.streams.len() {
        let mut chain: Vec<String> = plan
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
                (Some(a), Some(b)) => is_critical_edge(plan, a, b),
                _ => false,
            };
            let attrs = if bold { " [penwidth=2.5]" } else { "" };
            let _ = writeln!(out, "  {} -> {}{attrs};", pair[0], pair[1]);
        }
    }
}

/// The waits on events, dashed, from the op that recorded each (or the capture's begin).
fn write_dot_waits(out: &mut String, plan: &PlanDesc) {
    let source = |e: EventId| match plan.events.get(e.index()).and_then(|ev| ev.after) {
        Some(op) => format!("op{}", op.index()),
        None => "capture_begin".into(),
    };
    for (i, op) in plan.ops.iter().enumerate() {
        for &e in op.waits {
            let from = source(e);
            let bold = op_index(&from).is_some_and(|a| is_critical_edge(plan, a, i));
            let pen = if bold { ", penwidth=2.5" } else { "" };
            let _ = writeln!(
                out,
                "  {from} -> op{i} [style=dashed, label=\"e{}\"{pen}];",
                e.0
            );
        }
    }
    for &e in plan.final_waits {
        let _ = writeln!(
            out,
            "  {} -> capture_end [style=dashed, label=\"e{}\"];",
            source(e),
            e.0
        );
    }
}

/// The plan as a self-contained SVG, drawn like a profile's timeline
/// ([`timeline_svg`](crate::timeline_svg)) without graphviz: one lane per stream, each op
/// at its level in the schedule ([`PlanDesc::levels`]: the number of ops on the longest
/// chain of stream order and waits before it), cross-stream waits as arrows labelled
/// with their event, capture begin and end marks on the origin stream, and the critical
/// path (by op count) outlined. The output depends only on the plan, byte for byte.
///
/// ```
/// use stepgraph_picture::plan_svg;
/// use stepgraph_plan::{OpDesc, PlanDesc, StreamDesc, StreamId};
///
/// const PLAN: PlanDesc = PlanDesc::new("one")
///     .with_streams(&[StreamDesc::named("main")])
///     .with_ops(&[OpDesc::new("a", StreamId::ORIGIN)]);
/// let svg = plan_svg(&PLAN);
/// assert!(svg.contains("<title>plan of step one (compile time)</title>"));
/// assert!(svg.contains("<title>a main level 0</title>"));
/// ```
pub fn plan_svg(plan: &PlanDesc) -> String {
    render_svg(&timeline(plan))
}

/// Each op fills most of its level's unit, leaving room for the arrows between.
const INSET: f64 = 0.14;

/// The plan laid out for the timeline renderer: levels for times.
fn timeline(plan: &PlanDesc) -> Timeline {
    let levels = plan.levels();
    let width = levels.iter().map(|l| l + 1).max().unwrap_or(1) as f64;
    let bars = plan_bars(plan, &levels);
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
    let arrows = plan_arrows(plan, &bars, begin, end);
    Timeline {
        title: plan_title(plan),
        subtitle: plan_subtitle(plan),
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

fn event_label(e: EventId) -> String {
    format!("e{}", e.0)
}

/// A bar per op, at its level, on its stream's lane.
fn plan_bars(plan: &PlanDesc, levels: &[usize]) -> Vec<Bar> {
    let critical = |i: usize| plan.critical_path.contains(&OpId(i as u32));
    let lane_of = |s: usize| s.min(plan.streams.len().saturating_sub(1));
    plan.ops
        .iter()
        .enumerate()
        .map(|(i, op)| Bar {
            name: op_label(plan, op),
            part: op.func.to_string(),
            lane: lane_of(op.stream.index()),
            start: levels[i] as f64 + INSET,
            end: levels[i] as f64 + 1.0 - INSET,
            critical: critical(i),
            tooltip: op_tooltip(plan, op, levels[i]),
        })
        .collect()
}

/// An op's stream, level, events and condition, for its bar's tooltip.
fn op_tooltip(plan: &PlanDesc, op: &OpDesc, level: usize) -> String {
    let mut tooltip = format!(
        "{} {} level {}",
        op.name,
        plan.streams.get(op.stream.index()).map_or("?", |s| s.name),
        level
    );
    if !op.waits.is_empty() {
        let w: Vec<String> = op.waits.iter().map(|&e| event_label(e)).collect();
        let _ = write!(tooltip, ", waits {}", w.join(", "));
    }
    if let Some(e) = op.record {
        let _ = write!(tooltip, ", records {}", event_label(e));
    }
    if let Some(k) = op.every {
        let _ = write!(tooltip, ", every {k} replays (a conditional node)");
    }
    if let Some(flag) = op.when {
        let flag = plan.buffer_name(flag);
        let _ = write!(tooltip, ", when {flag} is set (a conditional node)");
    }
    if op.automatic {
        let _ = write!(tooltip, ", placed by the planner (cost {})", op.cost);
    }
    tooltip
}

/// An arrow per wait: from the op that recorded the event (or the capture's begin) to
/// the op that waits, or to the capture's end for its final joins.
fn plan_arrows(plan: &PlanDesc, bars: &[Bar], begin: At, end: At) -> Vec<Arrow> {
    let source = |e: EventId| {
        let op = plan.events.get(e.index()).and_then(|ev| ev.after);
        match op.and_then(|o| Some((o.index(), bars.get(o.index())?))) {
            Some((i, bar)) => (bar.end_at(), Some(i), bar.name.as_str()),
            None => (begin, None, "capture begin"),
        }
    };
    let mut arrows = Vec::new();
    for (i, (op, bar)) in plan.ops.iter().zip(bars).enumerate() {
        for &e in op.waits {
            let (from, from_op, from_name) = source(e);
            arrows.push(Arrow {
                from,
                to: bar.start_at(),
                label: Some(event_label(e)),
                critical: from_op.is_some_and(|a| is_critical_edge(plan, a, i)),
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
    arrows
}

/// The plan's counts and its critical paths, by level and by cost where they differ.
fn plan_subtitle(plan: &PlanDesc) -> String {
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
    if plan.critical_path_by_cost != plan.critical_path && !plan.critical_path_by_cost.is_empty() {
        let by_cost: Vec<&str> = plan
            .critical_path_by_cost
            .iter()
            .filter_map(|o| plan.ops.get(o.index()).map(|o| o.name))
            .collect();
        let _ = write!(subtitle, "; by cost: {}", by_cost.join(" → "));
    }
    if let Some(placement) = plan.placement {
        let _ = write!(subtitle, "; {placement}");
    }
    subtitle
}

fn plan_title(plan: &PlanDesc) -> String {
    format!("plan of step {} (compile time)", plan.step)
}

/// Whether `from -> to` is a step of the critical path.
fn is_critical_edge(plan: &PlanDesc, from: usize, to: usize) -> bool {
    plan.critical_path
        .windows(2)
        .any(|w| w[0].index() == from && w[1].index() == to)
}

/// The op index of a DOT node (`op3`); `None` for capture begin and end.
fn op_index(node: &str) -> Option<usize> {
    node.strip_prefix("op")?.parse().ok()
}

/// A DOT double-quoted string.
pub(crate) fn dot_str(text: &str) -> String {
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

/// An op's label: its name, and for a conditional op when it runs (`#[every(k)]`,
/// `#[when(flag)]`).
fn op_label(plan: &PlanDesc, op: &stepgraph_plan::OpDesc) -> String {
    match (op.every, op.when) {
        (Some(k), _) => format!("{} (every {k})", op.name),
        (None, Some(flag)) => format!("{} (when {})", op.name, plan.buffer_name(flag)),
        (None, None) => op.name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use stepgraph_plan::{EventDesc, OpDesc, StreamDesc, StreamId};

    use super::*;
    use crate::testing::{parse, title_of, with_class};

    /// `a` on main forks `b` (side) through e1; `c` (other) starts from the capture-begin
    /// event e0; `d` on main joins `b`; `c` is joined only at capture end.
    const PLAN: PlanDesc = PlanDesc::new("shapes")
        .with_streams(&[
            StreamDesc::named("main"),
            StreamDesc::named("side"),
            StreamDesc::named("other"),
        ])
        .with_ops(&[
            OpDesc::new("a", StreamId(0)).with_record(EventId(1)),
            OpDesc::new("b", StreamId(1))
                .with_waits(&[EventId(1)])
                .with_record(EventId(2)),
            OpDesc::new("c", StreamId(2))
                .with_waits(&[EventId(0)])
                .with_record(EventId(3)),
            OpDesc::new("d", StreamId(0)).with_waits(&[EventId(2)]),
        ])
        .with_events(&[
            EventDesc::at_capture_begin(),
            EventDesc::after(StreamId(0), OpId(0)),
            EventDesc::after(StreamId(1), OpId(1)),
            EventDesc::after(StreamId(2), OpId(2)),
        ])
        .with_final_waits(&[EventId(3)])
        .with_critical_paths(&[OpId(0), OpId(1), OpId(3)], &[OpId(0), OpId(1), OpId(3)]);

    #[test]
    fn levels_follow_stream_order_and_waits() {
        // b waits for a; c waits only on capture begin; d follows a on main and waits b.
        assert_eq!(PLAN.levels(), [0, 1, 0, 2]);
    }

    #[test]
    fn dot_has_a_cluster_per_stream_a_dashed_edge_per_wait_and_bold_critical_ops() {
        let dot = plan_dot(&PLAN);
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
        let svg = plan_svg(&PLAN);
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
    fn a_conditional_op_is_labelled_with_its_condition_in_both_pictures() {
        use stepgraph_plan::{AccessDesc, BufId, BufKind, BufferDesc};
        const PLAN: PlanDesc = PlanDesc::new("cond")
            .with_streams(&[StreamDesc::named("main")])
            .with_buffers(&[BufferDesc::new("go", BufKind::Shared)])
            .with_ops(&[
                OpDesc::new("set", StreamId(0)).with_accesses(&[AccessDesc::write(BufId(0), 0)]),
                OpDesc::new("maybe", StreamId(0))
                    .with_accesses(&[AccessDesc::read(BufId(0), 0)])
                    .with_when(BufId(0)),
                OpDesc::new("sync", StreamId(0)).with_every("k"),
            ])
            .with_critical_paths(&[OpId(0), OpId(1), OpId(2)], &[OpId(0), OpId(1), OpId(2)]);
        PLAN.check().unwrap();
        let dot = plan_dot(&PLAN);
        assert!(dot.contains("label=\"maybe (when go)\""), "{dot}");
        assert!(dot.contains("label=\"sync (every k)\""), "{dot}");
        let svg = plan_svg(&PLAN);
        let doc = parse(&svg);
        let titles: Vec<String> = with_class(&doc, "op").iter().map(title_of).collect();
        assert!(
            titles
                .iter()
                .any(|t| t.ends_with(", when go is set (a conditional node)")),
            "{titles:?}"
        );
    }

    #[test]
    fn the_planner_s_placements_are_marked_with_their_costs_in_both_pictures() {
        const PLAN: PlanDesc = PlanDesc::new("placed")
            .with_streams(&[
                StreamDesc::named("main"),
                StreamDesc::named("auto[0]").automatic(),
            ])
            .with_ops(&[
                OpDesc::new("hand", StreamId(0)),
                OpDesc::new("placed", StreamId(1))
                    .with_cost(12.5)
                    .placed_automatically(),
            ])
            .with_final_waits(&[])
            .with_placement("placed by the planner: 1 of 2 ops, from the costs in `x.costs`");
        let dot = plan_dot(&PLAN);
        assert!(dot.contains("label=\"auto[0] (the planner's)\""), "{dot}");
        assert!(dot.contains("label=\"main\""), "{dot}");
        let svg = plan_svg(&PLAN);
        assert!(svg.contains("from the costs in `x.costs`"), "{svg}");
        let doc = parse(&svg);
        let titles: Vec<String> = with_class(&doc, "op").iter().map(title_of).collect();
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with("placed ")
                    && t.ends_with(", placed by the planner (cost 12.5)")),
            "{titles:?}"
        );
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with("hand ") && !t.contains("planner")),
            "{titles:?}"
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
        assert_eq!(render_plan(&PLAN, PlanFormat::Dot), plan_dot(&PLAN));
    }

    #[test]
    fn dot_strings_escape_quotes_backslashes_and_newlines() {
        assert_eq!(dot_str("x\"y\\"), r#""x\"y\\""#);
        assert_eq!(dot_str("two\nlines"), r#""two\nlines""#);
    }
}
