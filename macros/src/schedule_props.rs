//! Property tests of the planner over random step definitions.

use proptest::prelude::*;
use stepgraph_plan::dag::{self, NodeSet};

use crate::schedule::{
    Access, DepKind, OpIx, OpNode, Plan, Problem, Resource, plan, schedule_edges,
};

/// Random problems: up to 6 streams, up to 40 ops, 6 buffers with up to 2 copies, random
/// joins and `after`s to earlier ops.
fn problem() -> impl Strategy<Value = Problem> {
    (1usize..=6).prop_flat_map(|n_streams| {
        let op = (
            0..n_streams,
            prop::collection::vec(((0usize..6, 0usize..2), any::<bool>()), 0..4),
            prop::collection::vec(0..n_streams, 0..2),
            prop::collection::vec(any::<prop::sample::Index>(), 0..2),
            1u32..5,
        );
        prop::collection::vec(op, 1..40).prop_map(move |raw| {
            let mut ops = Vec::with_capacity(raw.len());
            for (i, (stream, acc, joins, after, cost)) in raw.into_iter().enumerate() {
                let mut accesses: Vec<(Resource, Access)> = Vec::new();
                for ((buf, copy), write) in acc {
                    let res = Resource { buf, copy };
                    // One access per resource per op, as validation enforces.
                    if accesses.iter().all(|(r, _)| *r != res) {
                        accesses.push((res, if write { Access::Write } else { Access::Read }));
                    }
                }
                let after: Vec<OpIx> = if i == 0 {
                    Vec::new()
                } else {
                    after.iter().map(|ix| ix.index(i)).collect()
                };
                let joins = joins.into_iter().filter(|&s| s != stream).collect();
                ops.push(OpNode {
                    stream,
                    accesses,
                    joins,
                    after,
                    cost: f64::from(cost),
                });
            }
            Problem { n_streams, ops }
        })
    })
}

/// Happens-before of the schedule, with one extra END node after every op on the origin
/// stream and the final waits.
fn before_with_end(p: &Problem, plan: &Plan) -> (Vec<NodeSet>, usize) {
    let n = p.ops.len();
    let mut edges = schedule_edges(p, plan);
    let end = n;
    if let Some(last) = (0..n).rev().find(|&i| p.ops[i].stream == 0) {
        edges.push((last, end));
    }
    for &ev in &plan.final_waits {
        if let Some(a) = plan.events[ev].after {
            edges.push((a, end));
        }
    }
    (dag::closure(n + 1, &edges), end)
}

fn all_deps_ordered(p: &Problem, plan: &Plan) -> Result<(), String> {
    let (before, _) = before_with_end(p, plan);
    for d in &plan.deps {
        if !before[d.to].contains(d.from) {
            return Err(format!("dependency {d:?} is not ordered"));
        }
    }
    Ok(())
}

fn all_streams_joined(p: &Problem, plan: &Plan) -> Result<(), String> {
    let (before, end) = before_with_end(p, plan);
    for (i, op) in p.ops.iter().enumerate() {
        if op.stream != 0 && !before[end].contains(i) {
            return Err(format!(
                "op {i} on stream {} is not joined before the end",
                op.stream
            ));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// Every conflicting pair (and every join and `after`) is ordered by the plan.
    #[test]
    fn every_conflicting_pair_is_ordered(p in problem()) {
        let plan = plan(&p);
        prop_assert!(all_deps_ordered(&p, &plan).is_ok(), "{:?}", all_deps_ordered(&p, &plan));
        // Conflicts found independently of `dependencies`: any two accesses to one
        // resource, at least one a write.
        let (before, _) = before_with_end(&p, &plan);
        for (b, before_b) in before.iter().enumerate().take(p.ops.len()) {
            for a in 0..b {
                let conflict = p.ops[a].accesses.iter().any(|(ra, xa)| {
                    p.ops[b].accesses.iter().any(|(rb, xb)| {
                        ra == rb && (*xa == Access::Write || *xb == Access::Write)
                    })
                });
                if conflict {
                    prop_assert!(before_b.contains(a), "ops {a} and {b} conflict but are unordered");
                }
            }
        }
    }

    /// Removing any one wait leaves some dependency unordered or some stream unjoined.
    #[test]
    fn no_planned_wait_is_redundant(p in problem()) {
        let full = plan(&p);
        for b in 0..p.ops.len() {
            for k in 0..full.waits[b].len() {
                if full.events[full.waits[b][k]].after.is_none() {
                    // The fork wait orders nothing; it brings the stream into the capture.
                    continue;
                }
                let mut cut = full.clone();
                cut.waits[b].remove(k);
                prop_assert!(
                    all_deps_ordered(&p, &cut).is_err(),
                    "wait {k} of op {b} is redundant"
                );
            }
        }
        for k in 0..full.final_waits.len() {
            let mut cut = full.clone();
            cut.final_waits.remove(k);
            prop_assert!(all_streams_joined(&p, &cut).is_err(), "final wait {k} is redundant");
        }
    }

    /// Every side stream is joined back to the origin before capture ends, and joins
    /// the capture (waits on something) before its first op.
    #[test]
    fn all_streams_are_joined(p in problem()) {
        let plan = plan(&p);
        prop_assert!(all_streams_joined(&p, &plan).is_ok(), "{:?}", all_streams_joined(&p, &plan));
        let mut seen = vec![false; p.n_streams];
        seen[0] = true;
        for (i, op) in p.ops.iter().enumerate() {
            if !seen[op.stream] {
                prop_assert!(!plan.waits[i].is_empty(), "first op {i} of stream {} never forks", op.stream);
                seen[op.stream] = true;
            }
        }
    }

    /// With every op on the origin stream the plan is the program order: no events, no
    /// waits, and the critical path by count is every op.
    #[test]
    fn one_stream_plan_is_program_order(mut p in problem()) {
        for op in &mut p.ops {
            op.stream = 0;
            op.joins.clear();
        }
        p.n_streams = 1;
        let plan = plan(&p);
        prop_assert!(plan.events.is_empty());
        prop_assert!(plan.waits.iter().all(Vec::is_empty));
        prop_assert!(plan.final_waits.is_empty());
        prop_assert_eq!(plan.critical_path, (0..p.ops.len()).collect::<Vec<_>>());
    }

    /// Dependencies only point backwards and data edges name their resource.
    #[test]
    fn dependencies_point_backwards(p in problem()) {
        for d in plan(&p).deps {
            prop_assert!(d.from < d.to);
            let data = matches!(d.kind, DepKind::ReadAfterWrite | DepKind::WriteAfterRead | DepKind::WriteAfterWrite);
            prop_assert_eq!(data, d.resource.is_some());
        }
    }
}
