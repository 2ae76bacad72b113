//! The ops the planner places, with their `#[join]`s turned into the orderings they meant
//! as the step is written.
//!
//! Where the step leaves some ops to the planner (`auto` in `streams(..)`), the step is
//! lowered again with each op on the stream [`place`](crate::place) chose, so that each
//! op reaches its stream's scratch copies; the rules whose verdict depends on that run
//! again, and a step they refuse now would be a mistake of the planner, reported as such.
//!
//! The planner's placement of every op (`compare(auto)`) is a second plan for the same
//! ops: it keeps the buffer copies of the step's own placement, so that one `issue` serves
//! both, and plans any conflict on a copy that two of its streams now share.

use proc_macro2::Span;

use super::costs::Costs;
use super::{Instance, Ops, PerOp, PhysStream, Program, Resolved, Scope, buffers, lower, scratch};
use crate::errors::Errors;
use crate::model::{AutoStreams, BufKind, Op, Priority};
use crate::place::{self, Request};
use crate::schedule::OpIx;

/// Which ops the planner places.
#[derive(Clone, Copy)]
pub enum Mode {
    /// Those without a `#[stream]`, on at most this many streams of its own.
    Unplaced(usize),
    /// Every op: the step with its placement left wholly to the planner.
    Whole,
}

/// What the plan says of automatic placement.
#[derive(Clone, Debug)]
pub struct Report {
    /// Per op instance: the planner placed it.
    pub placed: Vec<bool>,
    /// The simulated run, in the unit of the costs.
    pub makespan: f64,
    /// The longest chain of dependencies, by cost: no placement runs faster.
    pub critical: f64,
    /// Where the costs came from.
    pub source: String,
}

/// The step resolved with the planner's placement; `None` (with an error at the step)
/// where the result breaks a rule.
pub(super) fn place(
    scope: &Scope,
    ops: &Ops,
    per_op: &PerOp,
    lowered: &lower::Lowered,
    mode: Mode,
    costs: &Costs,
    errors: &Errors,
) -> Option<Resolved> {
    // The planner places by the measured costs where there are, and the plan carries
    // them: its critical path by cost and each placed op say what the planner used.
    let costed = costs.apply(&lowered.problem);
    let problem = &costed;
    let pinned: Vec<bool> = lowered
        .instances
        .iter()
        .map(|inst| match mode {
            Mode::Whole => false,
            Mode::Unplaced(_) => ops.list[inst.op].placement.is_some(),
        })
        .collect();
    let all_pinned = pinned.iter().all(|&p| p);
    if let (Mode::Unplaced(_), Some(auto), true) = (mode, &scope.step.auto, all_pinned) {
        errors.at(
            auto.span,
            "`auto` leaves nothing to the planner: every op has a #[stream]; remove `auto`, or the #[stream] of the ops the planner may place",
        );
        return None;
    }
    let (keep, most) = match mode {
        Mode::Unplaced(most) => (scope.streams.all.len(), most),
        Mode::Whole => (
            1,
            scope
                .step
                .auto
                .as_ref()
                .map_or(AutoStreams::DEFAULT, |a| a.most),
        ),
    };
    // Under the whole placement the copies stay as they are: a conflict on one is a
    // dependency like any other, not a reason to share a stream.
    let per_stream_scratch: Vec<bool> = scope
        .buffers
        .iter()
        .map(|b| matches!(mode, Mode::Unplaced(_)) && b.kind == BufKind::ScratchPerStream)
        .collect();
    let out: Vec<Vec<usize>> = lowered
        .uses
        .iter()
        .map(|uses| {
            uses.iter()
                .filter_map(scratch::Use::written_whole)
                .collect()
        })
        .collect();
    let placed = place::place(&Request {
        problem,
        pinned: &pinned,
        keep,
        max_streams: most,
        per_stream_scratch: &per_stream_scratch,
        out: &out,
        wait_cost: wait_cost(problem),
    });
    let mut streams: Vec<PhysStream> = scope.streams.all[..keep].to_vec();
    streams.extend((0..placed.added).map(|k| PhysStream {
        name: format!("auto[{k}]"),
        decl: 0,
        priority: if placed.low_priority[k] {
            Priority::Low
        } else {
            Priority::Normal
        },
        automatic: true,
    }));
    let report = Report {
        placed: pinned.iter().map(|p| !p).collect(),
        makespan: placed.makespan(),
        critical: critical(problem),
        source: costs.source.clone(),
    };
    if let Mode::Whole = mode {
        return Some(second_plan(
            lowered, problem, &placed, streams, per_op, report,
        ));
    }
    let mut infos = per_op.infos.clone();
    let mut k = 0;
    for info in &mut infos {
        for instance in &mut info.instances {
            instance.0 = placed.streams[k];
            k += 1;
        }
        // Each `#[join]` is now the orderings it meant, in `after_instances`.
        info.joins.clear();
    }
    let resolution = lower::Resolution {
        infos: &infos,
        flags: &per_op.flags,
        branch_widths: &per_op.branch_widths,
        n_streams: streams.len(),
        after_instances: &placed.joined,
    };
    let again = lower::lower(scope, &ops.list, resolution);
    if !recheck(scope, &ops.list, per_op, &again, &streams, errors) {
        return None;
    }
    Some(Resolved {
        streams,
        instances: again.instances,
        problem: costs.apply(&again.problem),
        extra_copies: again.extra_copies,
        branch_widths: per_op.branch_widths.clone(),
        automatic: Some(report),
        whole: None,
    })
}

/// The step's own lowering with each instance on the planner's stream and its joins
/// turned into orderings: the same instances, arguments and copies.
fn second_plan(
    lowered: &lower::Lowered,
    costed: &crate::schedule::Problem,
    placed: &place::Placed,
    streams: Vec<PhysStream>,
    per_op: &PerOp,
    report: Report,
) -> Resolved {
    let mut problem = costed.clone();
    problem.n_streams = streams.len();
    for (k, op) in problem.ops.iter_mut().enumerate() {
        op.stream = placed.streams[k];
        op.joins.clear();
        op.after.extend(placed.joined[k].iter().copied());
    }
    let instances = lowered
        .instances
        .iter()
        .zip(&placed.streams)
        .map(|(inst, &stream)| Instance {
            stream,
            ..inst.clone()
        })
        .collect();
    Resolved {
        streams,
        instances,
        problem,
        extra_copies: lowered.extra_copies.clone(),
        branch_widths: per_op.branch_widths.clone(),
        automatic: Some(report),
        whole: None,
    }
}

/// A wait on another stream's event, against the ops' costs: a hundredth of the mean.
/// It breaks ties in favour of keeping a chain on one stream, and is too small to keep
/// an op off a stream where it would start a whole op earlier.
fn wait_cost(problem: &crate::schedule::Problem) -> f64 {
    let n = problem.ops.len().max(1) as f64;
    0.01 * problem.ops.iter().map(|o| o.cost).sum::<f64>() / n
}

/// The longest chain of the step's dependencies, by cost.
fn critical(problem: &crate::schedule::Problem) -> f64 {
    let edges: Vec<(OpIx, OpIx)> = crate::schedule::dependencies(problem)
        .iter()
        .map(|d| (d.from, d.to))
        .collect();
    stepgraph_plan::dag::longest_path(problem.ops.len(), &edges, |b| problem.ops[b].cost).1
}

/// The rules that depend on where ops run, on the placed step. They held for the step
/// as written; an error now is the planner's, and says so at the step.
fn recheck(
    scope: &Scope,
    ops: &[&Op],
    per_op: &PerOp,
    again: &lower::Lowered,
    streams: &[PhysStream],
    errors: &Errors,
) -> bool {
    let inner = Errors::new();
    let program = Program {
        ops,
        instances: &again.instances,
        buffers: &scope.buffers,
        streams,
        problem: &again.problem,
        flags: &per_op.flags,
    };
    buffers::check_copy_numbers(&scope.buffers, &again.problem, &inner);
    scratch::check_first_writes(&program, &again.uses, &inner);
    let found = inner.drain();
    for e in &found {
        errors.at(
            at_step(scope),
            format!(
                "the planner's placement of this step breaks a rule: {e} (a bug in stepgraph-macros; place these ops with #[stream] meanwhile)"
            ),
        );
    }
    found.is_empty()
}

fn at_step(scope: &Scope) -> Span {
    scope.step.name.span()
}
