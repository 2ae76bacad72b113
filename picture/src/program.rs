//! A training loop as a picture: the steps the host launches in turn, which of them loop on
//! the device, and the `#[shared]` buffers through which they hand each other their work.
//!
//! A [`Program`] lists [`Launch`]es in host order; each is a step's plan and how often it
//! repeats inside one launch ([`Repeat`]). Steps are linked through buffers that their
//! plans mark as shared across steps ([`BufferDesc::across_steps`]), by field name: steps
//! that share a buffer name its field alike.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use stepgraph_plan::{Access, BufferDesc, PlanDesc};

use crate::curve::escape;
use crate::plan::dot_str;

/// How often a launch runs its step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repeat {
    /// One replay of the step's graph.
    Once,
    /// A device loop ([`Step::replay_loop`]): the step's graph as the body of a CUDA
    /// conditional WHILE node, run `iterations` times per launch with no host round trip.
    /// The count as the program sets it (`"250"`, `"eval_freq / num_envs"`).
    ///
    /// [`Step::replay_loop`]: https://docs.rs/stepgraph/latest/stepgraph/struct.Step.html#method.replay_loop
    Loop {
        /// Iterations per launch.
        iterations: String,
    },
}

/// One launch of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch<'a> {
    /// The step's plan.
    pub plan: &'a PlanDesc,
    /// How often it runs per launch.
    pub repeat: Repeat,
}

/// The steps of a training loop in the order the host launches them; the whole sequence
/// repeats `rounds` times (a label, such as `"40 evaluations"`), or once where it is `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct Program<'a> {
    /// The picture's title.
    pub title: String,
    /// The launches, in host order.
    pub launches: Vec<Launch<'a>>,
    /// How often the host repeats the sequence.
    pub rounds: Option<String>,
}

/// How one launch uses a shared buffer: `op` is the step's last op that writes it (when
/// the step writes it) or its first op that reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Use {
    launch: usize,
    op: usize,
    access: Access,
}

/// Every buffer shared across steps, by field name, with each launch that uses it.
fn shared_buffers(program: &Program<'_>) -> BTreeMap<&'static str, Vec<Use>> {
    let mut shared: BTreeMap<&'static str, Vec<Use>> = BTreeMap::new();
    for (l, launch) in program.launches.iter().enumerate() {
        let plan = launch.plan;
        for (b, buf) in plan.buffers.iter().enumerate() {
            if !buf.across_steps {
                continue;
            }
            let uses = |access: Access| {
                plan.ops.iter().enumerate().filter(move |(_, op)| {
                    op.accesses
                        .iter()
                        .any(|a| a.access == access && touches_buffer(plan, a.buf.index(), b))
                })
            };
            let found = match uses(Access::Write).next_back() {
                Some((op, _)) => Some((op, Access::Write)),
                None => uses(Access::Read).next().map(|(op, _)| (op, Access::Read)),
            };
            if let Some((op, access)) = found {
                shared.entry(buf.name).or_default().push(Use {
                    launch: l,
                    op,
                    access,
                });
            }
        }
    }
    shared
}

/// An access of buffer `accessed` is one of buffer `b`: the buffer itself or a view of it.
fn touches_buffer(plan: &PlanDesc, accessed: usize, b: usize) -> bool {
    accessed == b
        || plan
            .buffers
            .get(accessed)
            .and_then(|v: &BufferDesc| v.view_of)
            .is_some_and(|p| p.index() == b)
}

fn repeat_label(repeat: &Repeat) -> String {
    match repeat {
        Repeat::Once => "one replay per launch".to_string(),
        Repeat::Loop { iterations } => {
            format!("device loop: WHILE node, {iterations} iterations per launch")
        }
    }
}

/// The program as Graphviz DOT: a cluster per launch holding its step's ops in program
/// order, a back edge around a device loop's body, the host's order between launches, and
/// a node per shared buffer with an edge from each step that writes it and to each step
/// that reads it.
///
/// ```
/// use stepgraph_picture::{Launch, Program, Repeat, program_dot};
/// use stepgraph_plan::{AccessDesc, BufId, BufKind, BufferDesc, OpDesc, PlanDesc, StreamDesc, StreamId};
///
/// const SHARED: &[BufferDesc] = &[BufferDesc::new("params", BufKind::Shared).with_across_steps()];
/// const TRAIN: PlanDesc = PlanDesc::new("train")
///     .with_streams(&[StreamDesc::named("main")])
///     .with_buffers(SHARED)
///     .with_ops(&[OpDesc::new("update", StreamId::ORIGIN).with_accesses(&[AccessDesc::write(BufId(0), 0)])]);
/// const ACT: PlanDesc = PlanDesc::new("act")
///     .with_streams(&[StreamDesc::named("main")])
///     .with_buffers(SHARED)
///     .with_ops(&[OpDesc::new("act", StreamId::ORIGIN).with_accesses(&[AccessDesc::read(BufId(0), 0)])]);
/// let dot = program_dot(&Program {
///     title: "two steps".into(),
///     launches: vec![
///         Launch { plan: &TRAIN, repeat: Repeat::Loop { iterations: "250".into() } },
///         Launch { plan: &ACT, repeat: Repeat::Once },
///     ],
///     rounds: None,
/// });
/// assert!(dot.contains(r#"l0_op0 -> l0_op0 [label="while i < 250""#));
/// assert!(dot.contains("l0_op0 -> shared_params"));
/// assert!(dot.contains("shared_params -> l1_op0"));
/// ```
pub fn program_dot(program: &Program<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", dot_str(&program.title));
    let title = match &program.rounds {
        Some(r) => format!("{} (the host repeats the sequence: {r})", program.title),
        None => program.title.clone(),
    };
    let _ = writeln!(
        out,
        "  graph [label={}, labelloc=t, fontname=\"Helvetica\", fontsize=16, rankdir=TB, \
         compound=true, nodesep=0.3, ranksep=0.4];",
        dot_str(&title)
    );
    out.push_str(
        "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#eef2f8\", \
         fontname=\"Courier\", fontsize=11, color=\"#444444\"];\n  edge [fontname=\"Helvetica\", \
         fontsize=10, color=\"#555555\"];\n",
    );
    for (l, launch) in program.launches.iter().enumerate() {
        let plan = launch.plan;
        let _ = writeln!(out, "  subgraph cluster_{l} {{");
        let _ = writeln!(
            out,
            "    label={}; fontname=\"Courier-Bold\"; style=\"rounded,filled\"; color=\"#999999\"; \
             fillcolor=\"{}\";",
            dot_str(&format!(
                "{}. step {}: {}",
                l + 1,
                plan.step,
                repeat_label(&launch.repeat)
            )),
            if matches!(launch.repeat, Repeat::Loop { .. }) {
                "#fff7e6"
            } else {
                "#f5f6f8"
            }
        );
        for (i, op) in plan.ops.iter().enumerate() {
            let stream = plan.streams.get(op.stream.index()).map_or("?", |s| s.name);
            let _ = writeln!(
                out,
                "    l{l}_op{i} [label={}];",
                dot_str(&format!("{}\n({stream})", op.name))
            );
        }
        for i in 1..plan.ops.len() {
            let _ = writeln!(out, "    l{l}_op{} -> l{l}_op{i};", i - 1);
        }
        if let (Repeat::Loop { iterations }, Some(last)) =
            (&launch.repeat, plan.ops.len().checked_sub(1))
        {
            let _ = writeln!(
                out,
                "    l{l}_op{last} -> l{l}_op0 [label={}, style=bold, color=\"#c77700\", \
                 constraint=false];",
                dot_str(&format!("while i < {iterations}"))
            );
        }
        out.push_str("  }\n");
    }
    for l in 1..program.launches.len() {
        let (a, b) = (&program.launches[l - 1], &program.launches[l]);
        if let (Some(last), false) = (a.plan.ops.len().checked_sub(1), b.plan.ops.is_empty()) {
            let _ = writeln!(
                out,
                "  l{}_op{last} -> l{l}_op0 [label=\"then\", style=bold, ltail=cluster_{}, \
                 lhead=cluster_{l}];",
                l - 1,
                l - 1
            );
        }
    }
    for (name, uses) in shared_buffers(program) {
        let node = format!(
            "shared_{}",
            name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        let _ = writeln!(
            out,
            "  {node} [label={}, shape=cylinder, fillcolor=\"#e8f5e9\", fontname=\"Helvetica\"];",
            dot_str(&format!("shared: {name}"))
        );
        for Use {
            launch: l,
            op,
            access,
        } in uses
        {
            match access {
                Access::Write => {
                    let _ = writeln!(
                        out,
                        "  l{l}_op{op} -> {node} [label=\"writes\", color=\"#b03030\"];"
                    );
                }
                Access::Read => {
                    let _ = writeln!(
                        out,
                        "  {node} -> l{l}_op{op} [label=\"reads\", style=dashed, color=\"#3060b0\"];"
                    );
                }
            }
        }
    }
    out.push_str("}\n");
    out
}

const SVG_WIDTH: f64 = 760.0;
const STEP_X: f64 = 60.0;
const STEP_W: f64 = 430.0;
const BUFFER_X: f64 = 560.0;
const BUFFER_W: f64 = 170.0;
const LINE: f64 = 18.0;
const HEADER: f64 = 40.0;
const GAP: f64 = 34.0;

/// The program as SVG: the launches stacked in host order, each a box listing its step's
/// ops in program order (with their streams), a loop arrow beside a device loop, and the
/// shared buffers in a column on the right, joined to the op of each step that writes
/// (solid) or reads (dashed) them. The same [`Program`] gives the same bytes.
///
/// ```
/// use stepgraph_picture::{Launch, Program, Repeat, program_svg};
/// use stepgraph_plan::{OpDesc, PlanDesc, StreamDesc, StreamId};
///
/// const PLAN: PlanDesc = PlanDesc::new("train")
///     .with_streams(&[StreamDesc::named("main")])
///     .with_ops(&[OpDesc::new("update", StreamId::ORIGIN)]);
/// let svg = program_svg(&Program {
///     title: "one loop".into(),
///     launches: vec![Launch { plan: &PLAN, repeat: Repeat::Loop { iterations: "n".into() } }],
///     rounds: None,
/// });
/// assert!(svg.contains("<title>train: device loop: WHILE node, n iterations per launch</title>"));
/// ```
pub fn program_svg(program: &Program<'_>) -> String {
    // Each launch's box: a header, then a line per op.
    let mut tops = Vec::with_capacity(program.launches.len());
    let mut y = 70.0;
    for launch in &program.launches {
        tops.push(y);
        y += HEADER + LINE * launch.plan.ops.len() as f64 + 10.0 + GAP;
    }
    let op_y = |l: usize, op: usize| tops[l] + HEADER + LINE * op as f64 + LINE * 0.5;
    let shared = shared_buffers(program);
    let height = y.max(90.0 + 50.0 * shared.len() as f64) + 10.0;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{SVG_WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {SVG_WIDTH} {height}\" font-family=\"Helvetica, Arial, sans-serif\" \
         font-size=\"12\">"
    );
    out.push_str(
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" \
         markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path \
         d=\"M0,0 L10,5 L0,10 z\" fill=\"#555555\"/></marker></defs>\n",
    );
    let _ = writeln!(out, "<title>{}</title>", escape(&program.title));
    let _ = writeln!(
        out,
        "<text x=\"{STEP_X}\" y=\"28\" font-size=\"16\" font-weight=\"bold\">{}</text>",
        escape(&program.title)
    );
    let subtitle = match &program.rounds {
        Some(r) => format!("launched by the host top to bottom, the sequence repeated: {r}"),
        None => "launched by the host top to bottom".to_string(),
    };
    let _ = writeln!(
        out,
        "<text x=\"{STEP_X}\" y=\"48\" fill=\"#555555\">{}</text>",
        escape(&subtitle)
    );

    for (l, launch) in program.launches.iter().enumerate() {
        let plan = launch.plan;
        let top = tops[l];
        let h = HEADER + LINE * plan.ops.len() as f64 + 10.0;
        let looped = matches!(launch.repeat, Repeat::Loop { .. });
        let what = repeat_label(&launch.repeat);
        let _ = writeln!(
            out,
            "<g class=\"launch\"><title>{}: {}</title><rect x=\"{STEP_X}\" y=\"{top}\" \
             width=\"{STEP_W}\" height=\"{h}\" rx=\"8\" fill=\"{}\" stroke=\"#999999\"/>",
            escape(plan.step),
            escape(&what),
            if looped { "#fff7e6" } else { "#f5f6f8" }
        );
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" font-weight=\"bold\" font-family=\"Courier New, monospace\">{}. step {}</text>",
            STEP_X + 10.0,
            top + 17.0,
            l + 1,
            escape(plan.step)
        );
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" fill=\"#555555\">{}</text>",
            STEP_X + 10.0,
            top + 33.0,
            escape(&what)
        );
        for (i, op) in plan.ops.iter().enumerate() {
            let stream = plan.streams.get(op.stream.index()).map_or("?", |s| s.name);
            let _ = writeln!(
                out,
                "<text class=\"op\" x=\"{}\" y=\"{}\" font-family=\"Courier New, monospace\">{}<tspan fill=\"#777777\"> ({})</tspan></text>",
                STEP_X + 22.0,
                op_y(l, i) + 4.0,
                escape(op.name),
                escape(stream)
            );
        }
        if looped && !plan.ops.is_empty() {
            // The loop: from the body's last op back up to its first, left of the box.
            let (y0, y1) = (op_y(l, 0), op_y(l, plan.ops.len() - 1));
            let x = STEP_X - 22.0;
            let _ = writeln!(
                out,
                "<path class=\"loop\" d=\"M{STEP_X},{y1} L{x},{y1} L{x},{y0} L{},{y0}\" fill=\"none\" \
                 stroke=\"#c77700\" stroke-width=\"2\" marker-end=\"url(#arrow)\"/>",
                STEP_X + 12.0
            );
        }
        out.push_str("</g>\n");
        if l > 0 {
            let _ = writeln!(
                out,
                "<line class=\"then\" x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"#555555\" \
                 stroke-width=\"2\" marker-end=\"url(#arrow)\"/>",
                top - GAP + 2.0,
                top - 2.0,
                x = STEP_X + STEP_W / 2.0
            );
        }
    }

    for (k, (name, uses)) in shared.iter().enumerate() {
        let top = 70.0 + 50.0 * k as f64;
        let mid = top + 15.0;
        let _ = writeln!(
            out,
            "<g class=\"shared\"><title>shared buffer {}</title><rect x=\"{BUFFER_X}\" y=\"{top}\" \
             width=\"{BUFFER_W}\" height=\"30\" rx=\"12\" fill=\"#e8f5e9\" stroke=\"#4a7a4c\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-family=\"Courier New, monospace\">{}</text></g>",
            escape(name),
            BUFFER_X + BUFFER_W / 2.0,
            mid + 4.0,
            escape(name)
        );
        for u in uses {
            let y = op_y(u.launch, u.op);
            let (colour, dash, from, to) = match u.access {
                Access::Write => ("#b03030", "", (STEP_X + STEP_W, y), (BUFFER_X, mid)),
                Access::Read => (
                    "#3060b0",
                    " stroke-dasharray=\"5,3\"",
                    (BUFFER_X, mid),
                    (STEP_X + STEP_W, y),
                ),
            };
            let _ = writeln!(
                out,
                "<line class=\"{}\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{colour}\"{dash} \
                 marker-end=\"url(#arrow)\"/>",
                if u.access == Access::Write {
                    "writes"
                } else {
                    "reads"
                },
                from.0,
                from.1,
                to.0,
                to.1
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use stepgraph_plan::{AccessDesc, BufId, BufKind, OpDesc, StreamDesc, StreamId};

    use super::*;
    use crate::testing::{parse, with_class};

    const TRAIN_BUFFERS: &[BufferDesc] = &[
        BufferDesc::new("params", BufKind::Shared).with_across_steps(),
        BufferDesc::new("grads", BufKind::Shared),
        BufferDesc::new("head", BufKind::Shared).with_view_of(BufId(0)),
    ];
    /// Reads the parameters, then writes them through a view, then reads them again: the
    /// picture ties the write to the view's op.
    const TRAIN: PlanDesc = PlanDesc::new("train")
        .with_streams(&[StreamDesc::named("main"), StreamDesc::named("side")])
        .with_buffers(TRAIN_BUFFERS)
        .with_ops(&[
            OpDesc::new("forward", StreamId(0)).with_accesses(&[AccessDesc::read(BufId(0), 0)]),
            OpDesc::new("step_head", StreamId(1)).with_accesses(&[AccessDesc::write(BufId(2), 0)]),
            OpDesc::new("grads", StreamId(0)).with_accesses(&[
                AccessDesc::read(BufId(0), 0),
                AccessDesc::write(BufId(1), 0),
            ]),
        ]);
    const EVAL_BUFFERS: &[BufferDesc] = &[
        BufferDesc::new("scratch", BufKind::Shared),
        BufferDesc::new("params", BufKind::Shared).with_across_steps(),
    ];
    const EVAL: PlanDesc = PlanDesc::new("eval")
        .with_streams(&[StreamDesc::named("main")])
        .with_buffers(EVAL_BUFFERS)
        .with_ops(&[
            OpDesc::new("clear", StreamId(0)).with_accesses(&[AccessDesc::write(BufId(0), 0)]),
            OpDesc::new("act", StreamId(0)).with_accesses(&[AccessDesc::read(BufId(1), 0)]),
        ]);

    fn program() -> Program<'static> {
        Program {
            title: "train & evaluate".into(),
            launches: vec![
                Launch {
                    plan: &TRAIN,
                    repeat: Repeat::Loop {
                        iterations: "250".into(),
                    },
                },
                Launch {
                    plan: &EVAL,
                    repeat: Repeat::Once,
                },
            ],
            rounds: Some("40 evaluations".into()),
        }
    }

    #[test]
    fn a_write_through_a_view_is_the_steps_use_and_reads_tie_to_the_first_reader() {
        let shared = shared_buffers(&program());
        assert_eq!(
            shared.len(),
            1,
            "only `params` is shared across steps: {shared:?}"
        );
        assert_eq!(
            shared["params"],
            [
                Use {
                    launch: 0,
                    op: 1,
                    access: Access::Write
                },
                Use {
                    launch: 1,
                    op: 1,
                    access: Access::Read
                },
            ]
        );
    }

    #[test]
    fn dot_draws_the_loop_the_order_and_the_shared_buffer() {
        let dot = program_dot(&program());
        assert!(dot.contains(
            r#"label="1. step train: device loop: WHILE node, 250 iterations per launch""#
        ));
        assert!(dot.contains(r#"l0_op2 -> l0_op0 [label="while i < 250""#));
        assert!(
            !dot.contains("l1_op1 -> l1_op0"),
            "a launch run once has no back edge:\n{dot}"
        );
        assert!(dot.contains("l0_op2 -> l1_op0 [label=\"then\""));
        assert!(dot.contains("l0_op1 -> shared_params [label=\"writes\""));
        assert!(dot.contains("shared_params -> l1_op1 [label=\"reads\""));
        assert!(dot.contains("the host repeats the sequence: 40 evaluations"));
    }

    #[test]
    fn svg_is_well_formed_with_a_box_per_launch_one_loop_and_each_use() {
        let svg = program_svg(&program());
        let doc = parse(&svg);
        assert_eq!(with_class(&doc, "launch").len(), 2);
        assert_eq!(with_class(&doc, "loop").len(), 1);
        assert_eq!(with_class(&doc, "then").len(), 1);
        assert_eq!(with_class(&doc, "shared").len(), 1);
        assert_eq!(with_class(&doc, "writes").len(), 1);
        assert_eq!(with_class(&doc, "reads").len(), 1);
        assert_eq!(with_class(&doc, "op").len(), 5);
        assert!(svg.contains("train &amp; evaluate"));
        assert_eq!(
            svg,
            program_svg(&program()),
            "the same program, other bytes"
        );
    }
}
