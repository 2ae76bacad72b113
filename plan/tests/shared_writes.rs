//! `PlanDesc::shared_writes` on random plans, against a reference that walks the
//! dependency graph op by op (breadth first) instead of closing it with bit sets.

use proptest::prelude::*;
use stepgraph_plan::{
    AccessDesc, BufId, BufKind, BufferDesc, EdgeDesc, EdgeKind, OpDesc, OpId, PlanDesc, StreamDesc,
    StreamId,
};

/// One random op: its stream and its accesses as (buffer, copy, write).
type RandomOp = (u16, Vec<(u16, u16, bool)>);

/// Up to 12 ops on up to 3 streams over 4 buffers of up to 2 copies (buffer 3 a view of
/// buffer 0, in half the plans), and joins or afters to earlier ops.
fn random_plan() -> impl Strategy<Value = (Vec<RandomOp>, Vec<(usize, usize, bool)>, bool)> {
    (1usize..=12).prop_flat_map(|n| {
        let op = (
            0u16..3,
            prop::collection::vec((0u16..4, 0u16..2, any::<bool>()), 0..4),
        );
        (
            prop::collection::vec(op, n),
            prop::collection::vec((0usize..n, 0usize..n, any::<bool>()), 0..4),
            any::<bool>(),
        )
    })
}

fn leak<T>(v: Vec<T>) -> &'static [T] {
    Box::leak(v.into_boxed_slice())
}

fn build(ops: &[RandomOp], edges: &[(usize, usize, bool)], view: bool) -> PlanDesc {
    let mut buffers: Vec<BufferDesc> = ["a", "b", "c", "d"]
        .iter()
        .map(|&n| BufferDesc::new(n, BufKind::Shared))
        .collect();
    if view {
        buffers[3] = BufferDesc::new("d", BufKind::Shared).with_view_of(BufId(0));
    }
    let ops: Vec<OpDesc> = ops
        .iter()
        .map(|(stream, accesses)| {
            let accesses: Vec<AccessDesc> = accesses
                .iter()
                .map(|&(buf, copy, write)| {
                    // A view and its parent have one copy.
                    let copy = if view && (buf == 0 || buf == 3) {
                        0
                    } else {
                        copy
                    };
                    if write {
                        AccessDesc::write(BufId(buf), copy)
                    } else {
                        AccessDesc::read(BufId(buf), copy)
                    }
                })
                .collect();
            OpDesc::new("op", StreamId(*stream)).with_accesses(leak(accesses))
        })
        .collect();
    let edges: Vec<EdgeDesc> = edges
        .iter()
        .filter(|&&(a, b, _)| a < b)
        .map(|&(a, b, join)| {
            let kind = if join {
                EdgeKind::Join
            } else {
                EdgeKind::After
            };
            EdgeDesc::new(OpId(a as u32), OpId(b as u32), kind, None)
        })
        .collect();
    PlanDesc::new("random")
        .with_streams(leak(vec![
            StreamDesc::named("s0"),
            StreamDesc::named("s1"),
            StreamDesc::named("s2"),
        ]))
        .with_buffers(leak(buffers))
        .with_ops(leak(ops))
        .with_edges(leak(edges))
}

/// Whether some access of `a` and one of `b` reach the same memory with these kinds.
fn meet(plan: &PlanDesc, a: usize, first_writes: bool, b: usize, then_writes: bool) -> bool {
    let is = |x: &AccessDesc, w: bool| (x.access == stepgraph_plan::Access::Write) == w;
    plan.ops[a].accesses.iter().any(|x| {
        is(x, first_writes)
            && plan.ops[b]
                .accesses
                .iter()
                .any(|y| is(y, then_writes) && plan.same_memory(x, y))
    })
}

/// Whether `to` is reachable from `from` along `edges` (breadth first).
fn reaches(n: usize, edges: &[(usize, usize)], from: usize, to: usize) -> bool {
    let mut seen = vec![false; n];
    let mut queue = vec![from];
    while let Some(u) = queue.pop() {
        for &(a, b) in edges {
            if a == u && !seen[b] {
                if b == to {
                    return true;
                }
                seen[b] = true;
                queue.push(b);
            }
        }
    }
    false
}

fn reference(plan: &PlanDesc) -> Vec<(usize, usize)> {
    let n = plan.ops.len();
    let mut truth: Vec<(usize, usize)> = plan
        .edges
        .iter()
        .map(|e| (e.from.index(), e.to.index()))
        .collect();
    for b in 0..n {
        for a in 0..b {
            if meet(plan, a, true, b, false) || meet(plan, a, false, b, true) {
                truth.push((a, b));
            }
        }
    }
    let mut candidates = Vec::new();
    for b in 0..n {
        for a in 0..b {
            if meet(plan, a, true, b, true) && !reaches(n, &truth, a, b) {
                candidates.push((a, b));
            }
        }
    }
    let mut all = truth.clone();
    all.extend(&candidates);
    candidates
        .into_iter()
        .filter(|&(a, b)| !((a + 1)..b).any(|c| reaches(n, &all, a, c) && reaches(n, &all, c, b)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn shared_writes_are_the_pairs_only_a_shared_mut_orders((ops, edges, view) in random_plan()) {
        let plan = build(&ops, &edges, view);
        let found = plan.shared_writes();
        let pairs: Vec<(usize, usize)> =
            found.iter().map(|w| (w.first.index(), w.second.index())).collect();
        let mut want = reference(&plan);
        want.sort_by_key(|&(a, b)| (b, a));
        prop_assert_eq!(&pairs, &want);
        // The buffer named is written by both.
        for w in &found {
            let writes = |op: OpId| {
                plan.ops[op.index()].accesses.iter().any(|x| {
                    x.access == stepgraph_plan::Access::Write
                        && plan.ops[w.second.index()]
                            .accesses
                            .iter()
                            .any(|y| y.buf == w.buf && plan.same_memory(x, y))
                })
            };
            prop_assert!(writes(w.first) && writes(w.second));
        }
    }
}
