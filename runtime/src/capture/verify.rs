//! Verification: the graph the driver captured, read back node by node and edge by edge,
//! checked against the plan that was checked at compile time.
//!
//! During a tracked capture every op's nodes are recorded (the nodes that appear in the
//! capture graph while the op is issued), with what the op asked for (launches, copies,
//! memsets, matmuls). After capture:
//! - every dependency of the plan (data edges, joins, `#[after]`s) must be a path from
//!   every node of the earlier op to every node of the later one, else the two race (a
//!   collective's event nodes, NCCL's own bookkeeping, are left out: [`judged_nodes`]);
//! - no path may join two ops that neither the dependencies nor stream order order, else
//!   the schedule serialises what the plan proved independent;
//! - each op's kernel, memcpy and memset nodes must match what it issued.

use std::collections::HashMap;
use std::fmt;

use crate::driver::graph::{
    CUgraph, CUgraphNodeType, OpNodes, graph_edges, graph_nodes, node_type,
};
use crate::scope::OpCounts;

use crate::error::{Error, Result};
use crate::plan::dag::{self, NodeSet};
use crate::plan::{OpId, PlanDesc};

/// What a successful verification covered.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    /// Ops checked.
    pub ops: usize,
    /// Nodes of the captured graph.
    pub nodes: usize,
    /// Edges of the captured graph.
    pub edges: usize,
    /// Dependencies of the plan found ordered in the graph.
    pub ordered_dependencies: usize,
    /// Pairs of independent ops found unordered in the graph.
    pub independent_pairs: usize,
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "graph verified against the plan: {} ops, {} nodes, {} edges; {} dependencies ordered, {} independent pairs unordered",
            self.ops, self.nodes, self.edges, self.ordered_dependencies, self.independent_pairs
        )
    }
}

/// Checks a captured graph against `plan`, given each op's nodes. The shape of the
/// graph is abstracted to what the checks need, so they are tested without a GPU.
pub(crate) fn verify_graph(
    plan: &PlanDesc,
    extra: &[(OpId, OpId)],
    one_stream: bool,
    graph: CUgraph,
    per_op: &[OpNodes],
) -> Result<VerifyReport> {
    let nodes = graph_nodes(graph)?;
    let index: HashMap<usize, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, &n)| (n as usize, i))
        .collect();
    let edges: Vec<(usize, usize)> = graph_edges(graph)?
        .into_iter()
        .filter_map(|(a, b)| Some((*index.get(&(a as usize))?, *index.get(&(b as usize))?)))
        .collect();
    let mut ops = Vec::with_capacity(per_op.len());
    for (i, op) in per_op.iter().enumerate() {
        let mut shape = OpShape {
            counts: op.counts,
            ..OpShape::default()
        };
        let mut recorded = Vec::with_capacity(op.nodes.len());
        for &n in &op.nodes {
            let Some(&ix) = index.get(&(n as usize)) else {
                return Err(Error::Internal {
                    what: format!(
                        "op `{}` recorded a node that is not in the captured graph",
                        plan.ops[i].name
                    ),
                });
            };
            recorded.push((ix, node_type(n)?));
        }
        shape.nodes = judged_nodes(&recorded, op.counts.collectives);
        // What the op issued is in its own nodes, or, for a conditional op (`#[every]`,
        // `#[when]`), in its body (its own nodes are then the condition's kernel and the
        // conditional node, ordered like any op's).
        let work: Vec<CUgraphNodeType> = match op.body {
            Some(body) => graph_nodes(body)?
                .into_iter()
                .map(node_type)
                .collect::<Result<_>>()?,
            None => recorded.iter().map(|&(_, ty)| ty).collect(),
        };
        shape.recorded = work.len();
        for ty in work {
            match ty {
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => shape.kernels += 1,
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => shape.memcpys += 1,
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => shape.memsets += 1,
                _ => {}
            }
        }
        ops.push(shape);
    }
    check(plan, extra, one_stream, nodes.len(), &edges, &ops)
}

/// An op's nodes that the ordering checks judge: all of them, except a collective's event
/// record and event wait nodes.
///
/// With more than one rank NCCL 2.28 captures an all-reduce as its kernel on the op's
/// stream plus event nodes of its own: an event wait, a root, before the first
/// collective, and an event record after each kernel, the last one a leaf. They order
/// NCCL's launches across replays of the graph and touch no buffer of any op. NCCL's
/// kernels, which read and write the buckets, are judged like any node, and so is any
/// other kind of node NCCL might add: one the checks do not know fails them loudly.
fn judged_nodes(recorded: &[(usize, CUgraphNodeType)], collectives: usize) -> Vec<usize> {
    use CUgraphNodeType::{CU_GRAPH_NODE_TYPE_EVENT_RECORD, CU_GRAPH_NODE_TYPE_WAIT_EVENT};
    recorded
        .iter()
        .filter(|(_, ty)| {
            collectives == 0
                || !matches!(
                    ty,
                    CU_GRAPH_NODE_TYPE_EVENT_RECORD | CU_GRAPH_NODE_TYPE_WAIT_EVENT
                )
        })
        .map(|&(ix, _)| ix)
        .collect()
}

/// One op as the checks see it: its node indices, node counts by type, and what it
/// issued.
#[derive(Clone, Debug, Default)]
pub(crate) struct OpShape {
    /// The nodes the ordering checks judge ([`judged_nodes`]).
    pub nodes: Vec<usize>,
    pub kernels: usize,
    pub memcpys: usize,
    pub memsets: usize,
    /// Every node the op added, of any kind.
    pub recorded: usize,
    pub counts: OpCounts,
}

fn name_pair(plan: &PlanDesc, a: usize, b: usize) -> (String, String) {
    let op = |i: usize| {
        let o = &plan.ops[i];
        format!(
            "`{}` (stream `{}`)",
            o.name,
            plan.streams[o.stream.index()].name
        )
    };
    (op(a), op(b))
}

/// The checks, over an abstract graph: `n_nodes` nodes, `edges`, and each op's shape.
/// `one_stream`: the graph was captured with every op on the origin stream (the
/// baseline), which orders every op after the one before it.
pub(crate) fn check(
    plan: &PlanDesc,
    extra: &[(OpId, OpId)],
    one_stream: bool,
    n_nodes: usize,
    edges: &[(usize, usize)],
    ops: &[OpShape],
) -> Result<VerifyReport> {
    let n_ops = plan.ops.len();
    if ops.len() != n_ops {
        return Err(Error::Internal {
            what: format!(
                "verification needs the nodes of every op: the plan has {n_ops} ops, the capture \
                 recorded {}",
                ops.len()
            ),
        });
    }
    for (i, op) in ops.iter().enumerate() {
        check_work(plan, i, op)?;
    }
    let reach = Reach::new(n_nodes, edges, ops)?;
    let ordered = check_dependencies(plan, extra, ops, &reach)?;
    let independent = check_independence(plan, extra, one_stream, ops, &reach)?;
    Ok(VerifyReport {
        ops: n_ops,
        nodes: n_nodes,
        edges: edges.len(),
        ordered_dependencies: ordered,
        independent_pairs: independent,
    })
}

/// What op `i` issued must be what the graph holds for it: work that is not in the
/// graph ran once, at capture, and never runs in a replay.
fn check_work(plan: &PlanDesc, i: usize, op: &OpShape) -> Result<()> {
    let c = op.counts;
    // A collective may add nothing (NCCL's in-place all-reduce of a world of one).
    if op.recorded == 0 && c.collectives == 0 {
        let o = &plan.ops[i];
        return Err(Error::Verify {
            what: format!(
                "op `{}` (stream `{}`) put no work into the captured graph{}: work an op \
                 issues on any stream but its capture stream (a stream of the program's \
                 own, cudarc's default stream) runs once, while the step is captured, \
                 and never in a replay; issue it on the op's stream \
                 (`CaptureStream::cuda_stream` for cudarc code)",
                o.name,
                plan.streams[o.stream.index()].name,
                if c == OpCounts::default() {
                    String::new()
                } else {
                    format!(
                        ", though it issued {} launches, {} matmuls, {} copies and {} \
                         memsets",
                        c.launches, c.matmuls, c.copies, c.memsets
                    )
                }
            ),
        });
    }
    let (kernels_ok, memsets_ok, memcpys_ok) = if c.collectives > 0 || c.raw > 0 {
        // NCCL decides a collective's nodes, and code given the raw stream issues
        // what it likes: at least what was counted must be there.
        // A collective: a copy for a world of one, kernels (and whatever else its
        // transport needs) for more ranks.
        (
            op.kernels >= c.launches + c.matmuls,
            op.memsets >= c.memsets,
            op.memcpys >= c.copies,
        )
    } else if c.matmuls == 0 {
        (
            op.kernels == c.launches,
            op.memsets == c.memsets,
            op.memcpys == c.copies,
        )
    } else {
        // A cuBLASLt matmul is one kernel or more: a split-K algorithm adds a memset of
        // its workspace and a reduction kernel.
        (
            op.kernels >= c.launches + c.matmuls,
            op.memsets >= c.memsets,
            op.memcpys == c.copies,
        )
    };
    if kernels_ok && memsets_ok && memcpys_ok {
        return Ok(());
    }
    Err(Error::Verify {
        what: format!(
            "op `{}` issued {} launches, {} matmuls, {} copies and {} memsets, but the graph holds {} kernel, {} memcpy and {} memset nodes for it: work that is not in the graph runs once, while the step is captured, and never in a replay",
            plan.ops[i].name,
            c.launches,
            c.matmuls,
            c.copies,
            c.memsets,
            op.kernels,
            op.memcpys,
            op.memsets
        ),
    })
}

/// Which nodes reach which, and the questions the checks ask of it about ops.
struct Reach<'a> {
    ops: &'a [OpShape],
    reach: Vec<NodeSet>,
    /// What the union of each op's nodes reaches.
    of_op: Vec<NodeSet>,
}

impl<'a> Reach<'a> {
    fn new(n_nodes: usize, edges: &[(usize, usize)], ops: &'a [OpShape]) -> Result<Reach<'a>> {
        let reach = dag::reachability(n_nodes, edges).map_err(|_| Error::Internal {
            what: "the captured graph has a cycle".into(),
        })?;
        let of_op = ops
            .iter()
            .map(|op| {
                let mut r = NodeSet::new(n_nodes);
                for &n in &op.nodes {
                    r.union(&reach[n]);
                }
                r
            })
            .collect();
        Ok(Reach { ops, reach, of_op })
    }

    /// Whether both ops have nodes, so that an order between them can be seen.
    fn both_seen(&self, a: usize, b: usize) -> bool {
        !self.ops[a].nodes.is_empty() && !self.ops[b].nodes.is_empty()
    }

    /// Every node of op `a` reaches every node of op `b`.
    fn all_before(&self, a: usize, b: usize) -> bool {
        let ops = self.ops;
        ops[a]
            .nodes
            .iter()
            .all(|&x| ops[b].nodes.iter().all(|&y| self.reach[x].contains(y)))
    }

    /// Some node of op `a` reaches some node of op `b`.
    fn any_path(&self, a: usize, b: usize) -> bool {
        self.ops[b].nodes.iter().any(|&y| self.of_op[a].contains(y))
    }
}

/// Every dependency of the plan, and every ordering added for views that overlap, is a
/// path from all of the earlier op's nodes to all of the later one's: else the two race.
/// Returns how many were checked.
fn check_dependencies(
    plan: &PlanDesc,
    extra: &[(OpId, OpId)],
    ops: &[OpShape],
    reach: &Reach<'_>,
) -> Result<usize> {
    let mut ordered = 0;
    for e in plan.edges {
        let (a, b) = (e.from.index(), e.to.index());
        if !reach.both_seen(a, b) {
            continue;
        }
        if !reach.all_before(a, b) {
            let (na, nb) = name_pair(plan, a, b);
            let buf = e
                .buf
                .map(|x| format!(" on buffer `{}`", plan.buffers[x.index()].name))
                .unwrap_or_default();
            return Err(Error::Verify {
                what: format!(
                    "race: op {nb} depends on op {na} ({:?}{buf}), but the captured graph does not order them",
                    e.kind
                ),
            });
        }
        ordered += 1;
    }
    for &(a, b) in extra {
        let (a, b) = (a.index(), b.index());
        if a >= ops.len() || b >= ops.len() || !reach.both_seen(a, b) {
            continue;
        }
        if !reach.all_before(a, b) {
            let (na, nb) = name_pair(plan, a, b);
            return Err(Error::Verify {
                what: format!(
                    "race: op {nb} reaches elements op {na} reaches, through views of one buffer that overlap, but the captured graph does not order them"
                ),
            });
        }
        ordered += 1;
    }
    Ok(ordered)
}

/// Nothing orders two ops that neither a dependency nor stream order orders: else the
/// schedule serialises what the plan proved independent. A one-stream capture orders
/// each op after the one before it, and must. Returns how many pairs were independent.
fn check_independence(
    plan: &PlanDesc,
    extra: &[(OpId, OpId)],
    one_stream: bool,
    ops: &[OpShape],
    reach: &Reach<'_>,
) -> Result<usize> {
    let n_ops = ops.len();
    let mut order: Vec<(usize, usize)> = plan
        .edges
        .iter()
        .map(|e| (e.from.index(), e.to.index()))
        .chain(extra.iter().map(|&(a, b)| (a.index(), b.index())))
        .filter(|&(a, b)| a < n_ops && b < n_ops)
        .collect();
    let mut last_on: HashMap<usize, usize> = HashMap::new();
    for (b, op) in plan.ops.iter().enumerate() {
        let stream = if one_stream { 0 } else { op.stream.index() };
        if let Some(a) = last_on.insert(stream, b) {
            order.push((a, b));
            if one_stream && reach.both_seen(a, b) && !reach.all_before(a, b) {
                let (na, nb) = name_pair(plan, a, b);
                return Err(Error::Verify {
                    what: format!("one-stream capture: op {nb} is not ordered after op {na}"),
                });
            }
        }
    }
    let must = dag::closure(n_ops, &order);
    let mut independent = 0;
    for (b, before_b) in must.iter().enumerate() {
        for a in 0..b {
            if before_b.contains(a) || !reach.both_seen(a, b) {
                continue;
            }
            if reach.any_path(a, b) || reach.any_path(b, a) {
                let (na, nb) = name_pair(plan, a, b);
                return Err(Error::Verify {
                    what: format!(
                        "false serialisation: ops {na} and {nb} are independent in the plan, but the captured graph orders them"
                    ),
                });
            }
            independent += 1;
        }
    }
    Ok(independent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::*;

    const fn op(
        name: &'static str,
        stream: u16,
        waits: &'static [EventId],
        record: Option<EventId>,
    ) -> OpDesc {
        let op = OpDesc::new(name, StreamId(stream)).with_waits(waits);
        match record {
            Some(e) => op.with_record(e),
            None => op,
        }
    }
    const STREAMS: &[StreamDesc] = &[StreamDesc::named("main"), StreamDesc::named("side")];
    const BUFS: &[BufferDesc] = &[BufferDesc::new("x", BufKind::Shared)];
    const A_TO_B: EdgeDesc =
        EdgeDesc::new(OpId(0), OpId(1), EdgeKind::ReadAfterWrite, Some(BufId(0)));
    // a (main) writes x; b (side) reads x; c (side) independent of a.
    const PLAN: PlanDesc = PlanDesc::new("t")
        .with_streams(STREAMS)
        .with_buffers(BUFS)
        .with_ops(&[
            op("a", 0, &[], Some(EventId(0))),
            op("b", 1, &[EventId(0)], None),
            op("c", 0, &[], None),
        ])
        .with_edges(&[A_TO_B])
        .with_events(&[EventDesc::after(StreamId(0), OpId(0))]);

    fn shapes() -> Vec<OpShape> {
        (0..3)
            .map(|i| OpShape {
                nodes: vec![i],
                kernels: 1,
                recorded: 1,
                counts: OpCounts {
                    launches: 1,
                    ..OpCounts::default()
                },
                ..OpShape::default()
            })
            .collect()
    }

    #[test]
    fn a_graph_that_matches_the_plan_passes() {
        // a -> b (the wait), a -> c (stream order on main).
        let r = check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &shapes()).unwrap();
        assert_eq!(r.ordered_dependencies, 1);
        assert_eq!(r.independent_pairs, 1); // b and c
    }

    #[test]
    fn a_missing_path_is_a_race_naming_both_ops() {
        let err = check(&PLAN, &[], false, 3, &[(0, 2)], &shapes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("race"), "{err}");
        assert!(
            err.contains("`a` (stream `main`)") && err.contains("`b` (stream `side`)"),
            "{err}"
        );
        assert!(err.contains("buffer `x`"), "{err}");
    }

    #[test]
    fn an_extra_path_is_false_serialisation_naming_both_ops() {
        let err = check(&PLAN, &[], false, 3, &[(0, 1), (0, 2), (1, 2)], &shapes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("false serialisation"), "{err}");
        assert!(
            err.contains("`b` (stream `side`)") && err.contains("`c` (stream `main`)"),
            "{err}"
        );
    }

    #[test]
    fn a_one_stream_capture_is_judged_by_program_order() {
        // Everything in a chain: right for the baseline, false serialisation for the plan.
        let chain = [(0, 1), (1, 2)];
        assert!(check(&PLAN, &[], true, 3, &chain, &shapes()).is_ok());
        assert!(check(&PLAN, &[], false, 3, &chain, &shapes()).is_err());
        let err = check(&PLAN, &[], true, 3, &[(0, 1)], &shapes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not ordered after op `b`"), "{err}");
    }

    #[test]
    fn a_matmul_may_add_kernels_and_memsets_but_nothing_else_may() {
        let mut s = shapes();
        s[1].counts.matmuls = 1;
        s[1].kernels = 3; // the launch, a split-K matmul and its reduction
        s[1].memsets = 1; // the matmul's workspace
        assert!(check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s).is_ok());
        s[1].memcpys = 1;
        assert!(check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s).is_err());
    }

    #[test]
    fn an_op_with_no_node_in_the_graph_is_named_with_why_its_work_is_lost() {
        // `b` launched on a stream of its own: nothing counted, nothing captured.
        let mut s = shapes();
        s[1] = OpShape::default();
        let err = check(&PLAN, &[], false, 3, &[(0, 2)], &s)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("op `b` (stream `side`) put no work into the captured graph: "),
            "{err}"
        );
        assert!(err.contains("never in a replay"), "{err}");
        // Counted but not captured: what it issued is in the message.
        s[1].counts.launches = 2;
        let err = check(&PLAN, &[], false, 3, &[(0, 2)], &s)
            .unwrap_err()
            .to_string();
        assert!(err.contains("though it issued 2 launches"), "{err}");
        // Some of it captured, some not.
        let mut s = shapes();
        s[1].counts.launches = 2;
        let err = check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("op `b` issued 2 launches") && err.contains("1 kernel"),
            "{err}"
        );
    }

    #[test]
    fn raw_stream_work_may_add_any_nodes_but_must_add_some() {
        let mut s = shapes();
        s[1].counts.raw = 1;
        s[1].kernels = 4;
        s[1].memcpys = 2;
        s[1].recorded = 6;
        assert!(check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s).is_ok());
        s[1].kernels = 0;
        assert!(check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s).is_err());
        let mut s = shapes();
        s[1] = OpShape {
            counts: OpCounts {
                raw: 1,
                ..OpCounts::default()
            },
            ..OpShape::default()
        };
        let err = check(&PLAN, &[], false, 3, &[(0, 2)], &s)
            .unwrap_err()
            .to_string();
        assert!(err.contains("op `b` (stream `side`) put no work"), "{err}");
        // NCCL may add nothing for a collective (an in-place all-reduce of one rank).
        s[1].counts = OpCounts {
            collectives: 1,
            ..OpCounts::default()
        };
        assert!(check(&PLAN, &[], false, 3, &[(0, 2)], &s).is_ok());
    }

    #[test]
    fn a_collective_may_add_nodes_of_any_kind_but_not_hide_issued_ones() {
        let mut s = shapes();
        s[1].counts.collectives = 1;
        // A world of one: NCCL's all-reduce is a copy, beside the op's own launch.
        s[1].memcpys = 1;
        assert!(check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s).is_ok());
        // More ranks: kernels and memsets of NCCL's own.
        s[1].kernels = 3;
        s[1].memsets = 2;
        assert!(check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s).is_ok());
        // Fewer kernels than the op launched is still wrong.
        s[1].kernels = 0;
        assert!(check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s).is_err());
    }

    #[test]
    fn only_a_collectives_event_nodes_are_left_out_of_the_ordering_checks() {
        use CUgraphNodeType::*;
        let recorded = [
            (0, CU_GRAPH_NODE_TYPE_WAIT_EVENT),
            (1, CU_GRAPH_NODE_TYPE_KERNEL),
            (2, CU_GRAPH_NODE_TYPE_MEMCPY),
            (3, CU_GRAPH_NODE_TYPE_EVENT_RECORD),
            (4, CU_GRAPH_NODE_TYPE_HOST),
        ];
        // A host node is no known bookkeeping: judged.
        assert_eq!(judged_nodes(&recorded, 1), vec![1, 2, 4]);
        // Without a collective every node is judged.
        assert_eq!(judged_nodes(&recorded, 0), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_collectives_trailing_event_record_does_not_make_a_race() {
        use CUgraphNodeType::*;
        // a (main) -> b (side) -> c (main); b's nodes: its kernel (1) and NCCL's event
        // record after it (3), a leaf that c does not wait for.
        const CHAIN: PlanDesc = PLAN.with_edges(&[
            A_TO_B,
            EdgeDesc::new(OpId(1), OpId(2), EdgeKind::ReadAfterWrite, Some(BufId(0))),
        ]);
        let plan = CHAIN;
        let edges = [(0, 1), (1, 2), (1, 3)];
        let recorded = [
            (1, CU_GRAPH_NODE_TYPE_KERNEL),
            (3, CU_GRAPH_NODE_TYPE_EVENT_RECORD),
        ];
        let mut s = shapes();
        s[1].counts.collectives = 1;
        s[1].nodes = judged_nodes(&recorded, s[1].counts.collectives);
        assert!(check(&plan, &[], false, 4, &edges, &s).is_ok());
        // The same nodes from an op without collectives: the record is judged, and races.
        s[1].counts.collectives = 0;
        s[1].nodes = judged_nodes(&recorded, s[1].counts.collectives);
        let err = check(&plan, &[], false, 4, &edges, &s)
            .unwrap_err()
            .to_string();
        assert!(err.contains("race"), "{err}");
    }

    #[test]
    fn node_counts_must_match_what_the_op_issued() {
        let mut s = shapes();
        s[1].kernels = 2;
        let err = check(&PLAN, &[], false, 3, &[(0, 1), (0, 2)], &s)
            .unwrap_err()
            .to_string();
        assert!(err.contains("op `b` issued 1 launches"), "{err}");
    }
}
