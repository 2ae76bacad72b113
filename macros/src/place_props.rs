//! Property tests of automatic placement over random step definitions.

use proptest::prelude::*;
use stepgraph_plan::dag;

use crate::place::{Placed, Request, place};
use crate::schedule::{Problem, dependencies, plan};
use crate::schedule_props::{all_deps_ordered, problem};

/// The problem with the placement applied: each op on its stream, each join turned into
/// the orderings it meant. (No per-stream scratch in these problems, so no copy moves.)
fn applied(p: &Problem, placed: &Placed) -> Problem {
    let mut q = p.clone();
    q.n_streams = p.n_streams + placed.added;
    for (b, op) in q.ops.iter_mut().enumerate() {
        op.stream = placed.streams[b];
        op.joins.clear();
        op.after.extend(placed.joined[b].iter().copied());
    }
    q
}

fn run(p: &Problem, pinned: &[bool], max_streams: usize, wait_cost: f64) -> Placed {
    place(&Request {
        problem: p,
        pinned,
        keep: p.n_streams,
        max_streams,
        per_stream_scratch: &[],
        out: &[],
        wait_cost,
    })
}

/// Random problems with a random choice of ops placed by hand; the rest, as the
/// step is written, on the origin.
fn problem_and_pins() -> impl Strategy<Value = (Problem, Vec<bool>, usize)> {
    (
        problem(),
        prop::collection::vec(any::<bool>(), 40),
        0usize..6,
    )
        .prop_map(|(mut p, pins, max)| {
            let pinned: Vec<bool> = (0..p.ops.len()).map(|i| pins[i]).collect();
            for (op, &pin) in p.ops.iter_mut().zip(&pinned) {
                if !pin {
                    op.stream = 0;
                }
            }
            (p, pinned, max)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// A hand-placed op keeps its stream, the planner adds at most its bound, and an op
    /// it places goes to the origin or to a stream of its own.
    #[test]
    fn pinned_ops_stay_and_the_bound_holds((p, pinned, max) in problem_and_pins()) {
        let placed = run(&p, &pinned, max, 0.01);
        prop_assert!(placed.added <= max);
        for (b, &s) in placed.streams.iter().enumerate() {
            if pinned[b] {
                prop_assert_eq!(s, p.ops[b].stream);
            } else {
                prop_assert!(s == 0 || s >= p.n_streams, "op {b} on a hand stream {s}");
            }
            prop_assert!(s < p.n_streams + placed.added);
        }
    }

    /// Planned after placement, every dependency of the step as written is ordered:
    /// its data conflicts, its `after`s and what each `#[join]` meant.
    #[test]
    fn every_dependency_as_written_is_ordered((p, pinned, max) in problem_and_pins()) {
        let placed = run(&p, &pinned, max, 0.01);
        let q = applied(&p, &placed);
        let planned = plan(&q);
        prop_assert!(all_deps_ordered(&q, &planned).is_ok(), "{:?}", all_deps_ordered(&q, &planned));
        let edges = crate::schedule::schedule_edges(&q, &planned);
        let before = dag::closure(q.ops.len(), &edges);
        for d in dependencies(&p) {
            prop_assert!(before[d.to].contains(d.from), "{d:?} as written is unordered");
        }
    }

    /// While the planner has streams left, no op it places waits behind another op's
    /// stream: it starts as soon as its inputs end (a wait later where they ran on
    /// another stream).
    #[test]
    fn no_placed_op_waits_while_a_stream_is_free(p in problem()) {
        let n = p.ops.len();
        let mut p = p;
        for op in &mut p.ops {
            op.stream = 0;
        }
        let pinned = vec![false; n];
        let wait = 0.01;
        let placed = run(&p, &pinned, n, wait);
        let mut preds = vec![Vec::new(); n];
        for d in dependencies(&p) {
            preds[d.to].push(d.from);
        }
        for (b, before) in preds.iter().enumerate() {
            let ready = before.iter().map(|&a| placed.end[a] + wait).fold(0.0, f64::max);
            prop_assert!(placed.start[b] <= ready + 1e-9, "op {b} starts at {} though ready at {ready}", placed.start[b]);
        }
        // So the run is the critical path of the costs and waits, and no longer.
        let free = run(&p, &pinned, n, 0.0);
        let edges: Vec<(usize, usize)> = dependencies(&p).iter().map(|d| (d.from, d.to)).collect();
        let (_, longest) = dag::longest_path(n, &edges, |b| p.ops[b].cost);
        prop_assert!((free.makespan() - longest).abs() < 1e-9, "{} against {longest}", free.makespan());
    }
}
