//! Property tests of the planner over random step definitions.

use proptest::prelude::*;
use stepgraph_plan::dag::{self, NodeSet};

use crate::schedule::{
    Access, DepKind, OpIx, OpNode, Plan, Problem, Resource, plan, schedule_edges,
};

/// Buffers 4 and 5 are views of buffer 0 in the problems that have views.
const VIEW_PARENTS: [Option<usize>; 6] = [None, None, None, None, Some(0), Some(0)];

/// Random problems: up to 6 streams, up to 40 ops, 6 buffers with up to 2 copies, random
/// joins and `after`s to earlier ops; in half of them buffers 4 and 5 are views of buffer
/// 0 (a shared buffer: one copy).
pub(crate) fn problem() -> impl Strategy<Value = Problem> {
    (problem_without_views(), any::<bool>()).prop_map(|(mut p, views)| {
        if views {
            p.parents = VIEW_PARENTS.to_vec();
            for op in &mut p.ops {
                for (r, _) in &mut op.accesses {
                    if r.buf == 0 {
                        r.copy = 0;
                    }
                }
                let mut seen: Vec<Resource> = Vec::new();
                op.accesses.retain(|(r, _)| {
                    let first = !seen.contains(r);
                    seen.push(*r);
                    first
                });
                // As validation does: an op that writes buffer 0's memory reaches it once.
                let family = |r: &Resource| r.buf == 0 || r.buf >= 4;
                let in_family = op.accesses.iter().filter(|(r, _)| family(r)).count();
                let writes = op
                    .accesses
                    .iter()
                    .any(|(r, a)| family(r) && *a == Access::Write);
                if writes && in_family > 1 {
                    let mut kept = false;
                    op.accesses.retain(|(r, _)| {
                        let keep = !family(r) || !kept;
                        kept |= family(r);
                        keep
                    });
                }
            }
        }
        p
    })
}

/// Whether two resources are the same memory whatever the spans: one resource, or a view
/// and its parent.
fn same_memory(p: &Problem, a: Resource, b: Resource) -> bool {
    a == b || p.parent(a.buf) == Some(b.buf) || p.parent(b.buf) == Some(a.buf)
}

fn problem_without_views() -> impl Strategy<Value = Problem> {
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
            Problem {
                n_streams,
                ops,
                ..Problem::default()
            }
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

pub(crate) fn all_deps_ordered(p: &Problem, plan: &Plan) -> Result<(), String> {
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
                        same_memory(&p, *ra, *rb) && (*xa == Access::Write || *xb == Access::Write)
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

    /// Views of one buffer are planned as disjoint: every data dependency joins two ops
    /// that reach the same memory whatever the views' spans, so two ops that share only
    /// sibling views are never ordered through them.
    #[test]
    fn sibling_views_add_no_dependency(p in problem()) {
        for d in plan(&p).deps {
            if !matches!(d.kind, DepKind::ReadAfterWrite | DepKind::WriteAfterRead | DepKind::WriteAfterWrite) {
                continue;
            }
            let shared = p.ops[d.from].accesses.iter().any(|(ra, _)| {
                p.ops[d.to].accesses.iter().any(|(rb, _)| same_memory(&p, *ra, *rb))
            });
            prop_assert!(shared, "dependency {:?} joins ops that share no memory", d);
        }
    }

    /// Once the views' spans are known, the orderings `overlap_orderings` adds to the
    /// plan order every conflict, overlapping sibling views included, and none of them
    /// orders two ops the plan orders already.
    #[test]
    fn overlapping_views_are_ordered_once_their_spans_are_known(
        p in problem(),
        spans in prop::collection::vec((0usize..8, 0usize..4), 4),
    ) {
        // Spans of the view resources (4, c) and (5, c), over 12 elements of buffer 0.
        let span = |r: Resource| {
            let (start, len) = spans[(r.buf - 4) * 2 + r.copy];
            (start, start + len)
        };
        let overlap = |a: Resource, b: Resource| {
            a != b
                && p.parent(a.buf).is_some()
                && p.parent(a.buf) == p.parent(b.buf)
                && {
                    let ((s0, e0), (s1, e1)) = (span(a), span(b));
                    s0 < e1 && s1 < e0 && s0 < e0 && s1 < e1
                }
        };
        let plan = plan(&p);
        let mut resources: Vec<Resource> = Vec::new();
        let accesses: Vec<Vec<(usize, bool)>> = p.ops.iter().map(|op| {
            op.accesses.iter().map(|&(r, x)| {
                let ix = resources.iter().position(|&q| q == r).unwrap_or_else(|| {
                    resources.push(r);
                    resources.len() - 1
                });
                (ix, x == Access::Write)
            }).collect()
        }).collect();
        let ops: Vec<&[(usize, bool)]> = accesses.iter().map(Vec::as_slice).collect();
        let edges = schedule_edges(&p, &plan);
        let added = stepgraph_plan::views::overlap_orderings(&ops, &edges, |x, y| overlap(resources[x], resources[y]));
        let before_plan = dag::closure(p.ops.len(), &edges);
        for &(a, b) in &added {
            prop_assert!(a < b && !before_plan[b].contains(a), "ordering {a} -> {b} was not needed");
        }
        let mut all = edges.clone();
        all.extend(added.iter().copied());
        let before = dag::closure(p.ops.len(), &all);
        for (b, before_b) in before.iter().enumerate() {
            for a in 0..b {
                let conflict = p.ops[a].accesses.iter().any(|&(ra, xa)| {
                    p.ops[b].accesses.iter().any(|&(rb, xb)| {
                        (same_memory(&p, ra, rb) || overlap(ra, rb))
                            && (xa == Access::Write || xb == Access::Write)
                    })
                });
                if conflict {
                    prop_assert!(before_b.contains(a), "ops {a} and {b} conflict but are unordered");
                }
            }
        }
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
