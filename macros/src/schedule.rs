//! The planner: plain Rust over a resolved step (no syntax, no `quote`), so that it is
//! tested with ordinary asserts and property tests.
//!
//! Input: ops in program order, each on a stream, with its buffer accesses, its explicit
//! joins and `#[after]` orderings. Output: the dependency edges, the events each op's
//! stream waits on and records, the final joins into the origin stream, and the critical
//! path.
//!
//! Waits are chosen with vector clocks: each stream knows, per other stream, how many of
//! that stream's ops are ordered before its current position. A dependency already
//! covered by that knowledge (stream order, or an earlier wait that transitively implies
//! it) needs no wait; of the rest, a wait implied by another wait of the same op is
//! dropped. What remains is needed: removing it leaves a dependency unordered.

use stepgraph_plan::dag;

/// A stream index; 0 is the origin stream.
pub type StreamIx = usize;
/// An op index in program order.
pub type OpIx = usize;

/// One copy of one buffer: per-stream and per-branch scratch and per-branch buffers have
/// several copies, which never conflict with each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource {
    pub buf: usize,
    pub copy: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpNode {
    pub stream: StreamIx,
    pub accesses: Vec<(Resource, Access)>,
    /// Streams this op joins (`#[join(..)]`): it runs after their latest earlier op.
    pub joins: Vec<StreamIx>,
    /// Ops this op runs after (`#[after(..)]`); all earlier in program order.
    pub after: Vec<OpIx>,
    pub cost: f64,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Problem {
    pub n_streams: usize,
    pub ops: Vec<OpNode>,
    /// Per buffer: the buffer it is a view of (`#[view(of = ..)]`), if any. A buffer past
    /// the end is no view. A view's accesses conflict with its parent's; views of one
    /// parent are planned as disjoint (the runtime orders those that overlap).
    pub parents: Vec<Option<usize>>,
}

impl Problem {
    /// The parent of a view buffer.
    pub fn parent(&self, buf: usize) -> Option<usize> {
        self.parents.get(buf).copied().flatten()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DepKind {
    ReadAfterWrite,
    WriteAfterRead,
    WriteAfterWrite,
    Join,
    After,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dep {
    pub from: OpIx,
    pub to: OpIx,
    pub kind: DepKind,
    pub resource: Option<Resource>,
}

/// An event recorded on `stream` right after op `after`, or at capture begin (`None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub stream: StreamIx,
    pub after: Option<OpIx>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub deps: Vec<Dep>,
    pub events: Vec<Event>,
    /// Per op: events its stream waits on before it.
    pub waits: Vec<Vec<usize>>,
    /// Per op: the event recorded after it, if any stream waits on it.
    pub records: Vec<Option<usize>>,
    /// Events the origin stream waits on after the last op.
    pub final_waits: Vec<usize>,
    pub critical_path: Vec<OpIx>,
    pub critical_path_by_cost: Vec<OpIx>,
}

/// The dependencies of each op on earlier ops, in program order: read after write, write
/// after read, write after write (per resource), joins and explicit `#[after]`s. Edges
/// between ops of one stream are included; stream order makes them free.
pub fn dependencies(p: &Problem) -> Vec<Dep> {
    use std::collections::HashMap;
    #[derive(Default)]
    struct Track {
        last_write: Option<OpIx>,
        reads_since: Vec<OpIx>,
    }
    let mut tracks: HashMap<Resource, Track> = HashMap::new();
    let mut last_on: Vec<Option<OpIx>> = vec![None; p.n_streams];
    let mut deps = Vec::new();
    // Every resource of each parent's views: an access to the parent is an access to
    // each of them too, so that it is ordered against every op that uses a view.
    let mut views: HashMap<usize, Vec<Resource>> = HashMap::new();
    for op in &p.ops {
        for &(r, _) in &op.accesses {
            if let Some(parent) = p.parent(r.buf) {
                let v = views.entry(parent).or_default();
                if !v.contains(&r) {
                    v.push(r);
                }
            }
        }
    }
    for (to, op) in p.ops.iter().enumerate() {
        let touched = op.accesses.iter().flat_map(|&(r, a)| {
            let children = views.get(&r.buf).map(Vec::as_slice).unwrap_or_default();
            std::iter::once((r, a)).chain(children.iter().map(move |&c| (c, a)))
        });
        for (resource, access) in touched {
            let t = tracks.entry(resource).or_default();
            let mut push = |from: OpIx, kind| {
                if from == to {
                    // A parent and its view in one op: both reads (validation refuses a
                    // write beside another access of the same memory).
                    return;
                }
                deps.push(Dep {
                    from,
                    to,
                    kind,
                    resource: Some(resource),
                })
            };
            match access {
                Access::Read => {
                    if let Some(w) = t.last_write {
                        push(w, DepKind::ReadAfterWrite);
                    }
                    t.reads_since.push(to);
                }
                Access::Write => {
                    if let Some(w) = t.last_write {
                        push(w, DepKind::WriteAfterWrite);
                    }
                    for &r in &t.reads_since {
                        push(r, DepKind::WriteAfterRead);
                    }
                    t.last_write = Some(to);
                    t.reads_since.clear();
                }
            }
        }
        for &s in &op.joins {
            if let Some(from) = last_on[s] {
                deps.push(Dep {
                    from,
                    to,
                    kind: DepKind::Join,
                    resource: None,
                });
            }
        }
        for &from in &op.after {
            deps.push(Dep {
                from,
                to,
                kind: DepKind::After,
                resource: None,
            });
        }
        last_on[op.stream] = Some(to);
    }
    deps
}

/// Plans events and waits. See the module docs.
pub fn plan(p: &Problem) -> Plan {
    let n = p.ops.len();
    let s = p.n_streams.max(1);
    let deps = dependencies(p);
    let stream = |op: OpIx| p.ops[op].stream;

    let mut preds: Vec<Vec<OpIx>> = vec![Vec::new(); n];
    for d in &deps {
        preds[d.to].push(d.from);
    }
    // seq[op]: 1-based position of the op on its stream.
    let mut seq = vec![0u32; n];
    let mut count = vec![0u32; s];
    let mut last_on: Vec<Option<OpIx>> = vec![None; s];
    for (i, op) in p.ops.iter().enumerate() {
        count[op.stream] += 1;
        seq[i] = count[op.stream];
        last_on[op.stream] = Some(i);
    }

    // clock[t][u]: how many ops of stream u are ordered before stream t's current point.
    let mut clock = vec![vec![0u32; s]; s];
    let mut clock_after: Vec<Vec<u32>> = Vec::with_capacity(n);
    // A side stream takes part in the capture only once it waits on a captured event.
    let mut joined = vec![false; s];
    joined[0] = true;
    let mut events: Vec<Event> = Vec::new();
    let mut records: Vec<Option<usize>> = vec![None; n];
    let mut begin_event: Option<usize> = None;
    let mut waits: Vec<Vec<usize>> = vec![Vec::new(); n];

    for b in 0..n {
        let t = stream(b);
        let mut cands: Vec<OpIx> = preds[b]
            .iter()
            .copied()
            .filter(|&a| stream(a) != t)
            .collect();
        for a in needed_waits(p, &seq, &clock[t], &mut cands, &clock_after) {
            let ev = record_after(p, a, &mut records, &mut events);
            waits[b].push(ev);
            for u in 0..s {
                clock[t][u] = clock[t][u].max(clock_after[a][u]);
            }
        }
        if !joined[t] && waits[b].is_empty() {
            // The fork: an otherwise independent side stream joins the capture by waiting
            // on an event recorded on the origin stream when capture begins.
            let ev = *begin_event.get_or_insert_with(|| {
                events.push(Event {
                    stream: 0,
                    after: None,
                });
                events.len() - 1
            });
            waits[b].push(ev);
        }
        joined[t] = true;
        clock[t][t] = seq[b];
        clock_after.push(clock[t].clone());
    }

    // Every side stream is joined back into the origin stream before capture ends.
    let mut tails: Vec<OpIx> = (1..s).filter_map(|u| last_on[u]).collect();
    let mut final_waits = Vec::new();
    let origin_clock = clock[0].clone();
    for a in needed_waits(p, &seq, &origin_clock, &mut tails, &clock_after) {
        let ev = record_after(p, a, &mut records, &mut events);
        final_waits.push(ev);
    }

    let mut plan = Plan {
        deps,
        events,
        waits,
        records,
        final_waits,
        critical_path: Vec::new(),
        critical_path_by_cost: Vec::new(),
    };
    plan.critical_path = longest_path(p, &plan, |_| 1.0);
    plan.critical_path_by_cost = longest_path(p, &plan, |op| p.ops[op].cost);
    plan
}

/// The ops among `cands` (on other streams) a stream whose clock is `clock_t` must wait
/// for: the latest per stream that it does not know of yet, less those another wait
/// implies. `seq` is each op's 1-based position on its stream.
fn needed_waits(
    p: &Problem,
    seq: &[u32],
    clock_t: &[u32],
    cands: &mut Vec<OpIx>,
    clock_after: &[Vec<u32>],
) -> Vec<OpIx> {
    let s = p.n_streams.max(1);
    let stream = |op: OpIx| p.ops[op].stream;
    // Drop what the stream already knows, keep the latest op per other stream, then
    // drop any op whose completion another candidate's wait already implies.
    cands.retain(|&a| clock_t[stream(a)] < seq[a]);
    cands.sort_unstable();
    cands.dedup();
    let mut latest: Vec<Option<OpIx>> = vec![None; s];
    for &a in cands.iter() {
        let u = stream(a);
        if latest[u].is_none_or(|b| seq[b] < seq[a]) {
            latest[u] = Some(a);
        }
    }
    let reqs: Vec<OpIx> = latest.into_iter().flatten().collect();
    let mut out: Vec<OpIx> = reqs
        .iter()
        .copied()
        .filter(|&a| {
            !reqs
                .iter()
                .any(|&b| b != a && clock_after[b][stream(a)] >= seq[a])
        })
        .collect();
    out.sort_unstable();
    out
}

/// The event recorded after op `a`, recorded now if it is not yet.
fn record_after(
    p: &Problem,
    a: OpIx,
    records: &mut [Option<usize>],
    events: &mut Vec<Event>,
) -> usize {
    *records[a].get_or_insert_with(|| {
        events.push(Event {
            stream: p.ops[a].stream,
            after: Some(a),
        });
        events.len() - 1
    })
}

/// Happens-before edges of the planned schedule: stream order and waits.
pub fn schedule_edges(p: &Problem, plan: &Plan) -> Vec<(OpIx, OpIx)> {
    dag::schedule_edges(p.ops.iter().enumerate().map(|(b, op)| {
        let waited = plan.waits[b].iter().filter_map(|&ev| plan.events[ev].after);
        (Some(op.stream), waited)
    }))
}

/// The longest path through the schedule, each op weighted by `cost`.
fn longest_path(p: &Problem, plan: &Plan, cost: impl Fn(OpIx) -> f64) -> Vec<OpIx> {
    dag::longest_path(p.ops.len(), &schedule_edges(p, plan), cost).0
}

/// Pairs of writes to one resource from different streams that nothing orders except the
/// write-after-write itself: no join, no stream order, no dependency through another
/// buffer. Planning would serialise the two streams through the buffer, silently; it is
/// almost always a scratch buffer shared by mistake.
pub fn unordered_cross_stream_writes(p: &Problem) -> Vec<Dep> {
    let deps = dependencies(p);
    let mut edges: Vec<(OpIx, OpIx)> = deps
        .iter()
        .filter(|d| d.kind != DepKind::WriteAfterWrite)
        .map(|d| (d.from, d.to))
        .collect();
    let mut last_on: Vec<Option<OpIx>> = vec![None; p.n_streams.max(1)];
    for (b, op) in p.ops.iter().enumerate() {
        if let Some(a) = last_on[op.stream] {
            edges.push((a, b));
        }
        last_on[op.stream] = Some(b);
    }
    let before = dag::closure(p.ops.len(), &edges);
    deps.into_iter()
        .filter(|d| {
            d.kind == DepKind::WriteAfterWrite
                && p.ops[d.from].stream != p.ops[d.to].stream
                && !before[d.to].contains(d.from)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(buf: usize) -> Resource {
        Resource { buf, copy: 0 }
    }
    fn op(stream: StreamIx, acc: &[(usize, Access)]) -> OpNode {
        OpNode {
            stream,
            accesses: acc.iter().map(|&(b, a)| (r(b), a)).collect(),
            joins: vec![],
            after: vec![],
            cost: 1.0,
        }
    }
    use Access::{Read as R, Write as W};

    /// Every dependency is ordered by the schedule; every side stream reaches the end.
    fn check_sound(p: &Problem, plan: &Plan) {
        let n = p.ops.len();
        let before = dag::closure(n, &schedule_edges(p, plan));
        for d in &plan.deps {
            assert!(before[d.to].contains(d.from), "dependency {d:?} unordered");
        }
    }

    #[test]
    fn disjoint_views_of_one_buffer_run_side_by_side_and_the_parent_orders_them() {
        // Buffer 0 is the parent, 1 and 2 its views. Op 0 fills the parent and writes
        // features (3); ops 1 and 2 read the features and write one view each, on two
        // streams; op 3 reads the whole parent.
        let p = Problem {
            n_streams: 3,
            ops: vec![
                op(0, &[(0, W), (3, W)]),
                op(1, &[(3, R), (1, W)]),
                op(2, &[(3, R), (2, W)]),
                op(0, &[(0, R)]),
            ],
            parents: vec![None, Some(0), Some(0)],
        };
        let plan = plan(&p);
        check_sound(&p, &plan);
        let pairs: Vec<(OpIx, OpIx)> = plan.deps.iter().map(|d| (d.from, d.to)).collect();
        // Each view write after the parent's, the parent's read after each view write,
        // and nothing between the two views.
        assert!(
            pairs.contains(&(0, 1)) && pairs.contains(&(0, 2)),
            "{pairs:?}"
        );
        assert!(
            pairs.contains(&(1, 3)) && pairs.contains(&(2, 3)),
            "{pairs:?}"
        );
        assert!(!pairs.contains(&(1, 2)), "{pairs:?}");
        assert!(unordered_cross_stream_writes(&p).is_empty());
        // Writing one view from two streams is still a write-write on one buffer.
        let racy = Problem {
            n_streams: 2,
            ops: vec![op(0, &[(1, W)]), op(1, &[(1, W)])],
            parents: vec![None, Some(0)],
        };
        assert_eq!(unordered_cross_stream_writes(&racy).len(), 1);
    }

    #[test]
    fn one_stream_needs_no_events() {
        let p = Problem {
            n_streams: 1,
            ops: vec![op(0, &[(0, W)]), op(0, &[(0, R), (1, W)]), op(0, &[(1, R)])],
            ..Problem::default()
        };
        let plan = plan(&p);
        assert!(plan.events.is_empty());
        assert!(plan.waits.iter().all(Vec::is_empty));
        assert!(plan.final_waits.is_empty());
        assert_eq!(plan.critical_path, vec![0, 1, 2]);
    }

    #[test]
    fn fork_join_of_four_chains() {
        // init on main writes x; four chains on streams 1..=4 read x and write their own
        // buffer; sum on main reads all four.
        let mut ops = vec![op(0, &[(0, W)])];
        for c in 1..=4 {
            ops.push(op(c, &[(0, R), (c, W)]));
            ops.push(op(c, &[(c, W)]));
        }
        ops.push(op(0, &[(1, R), (2, R), (3, R), (4, R), (5, W)]));
        let p = Problem {
            n_streams: 5,
            ops,
            ..Problem::default()
        };
        let plan = plan(&p);
        check_sound(&p, &plan);
        // One event after init, waited by each chain's first op; one per chain tail,
        // waited by the sum. No final joins: the sum already joined every chain.
        assert_eq!(plan.events.len(), 5);
        assert_eq!(plan.waits.iter().map(Vec::len).sum::<usize>(), 8);
        assert!(plan.final_waits.is_empty());
        assert_eq!(plan.critical_path.len(), 4);
    }

    #[test]
    fn implied_wait_is_not_emitted() {
        // a (s1) writes x; b (s2) reads x; c (s2) reads x again: c needs no wait, stream
        // order after b already covers it.
        let p = Problem {
            n_streams: 3,
            ops: vec![op(1, &[(0, W)]), op(2, &[(0, R)]), op(2, &[(0, R)])],
            ..Problem::default()
        };
        let plan = plan(&p);
        assert_eq!(plan.waits[1].len(), 1);
        assert!(plan.waits[2].is_empty());
    }

    #[test]
    fn transitively_implied_wait_is_dropped() {
        // a (s1) writes x; b (s2) reads x, writes y; c (s0) reads x and y: waiting on b
        // implies a, so c waits once.
        let p = Problem {
            n_streams: 3,
            ops: vec![
                op(1, &[(0, W)]),
                op(2, &[(0, R), (1, W)]),
                op(0, &[(0, R), (1, R)]),
            ],
            ..Problem::default()
        };
        let plan = plan(&p);
        check_sound(&p, &plan);
        assert_eq!(plan.waits[2].len(), 1);
        assert_eq!(plan.events[plan.waits[2][0]].after, Some(1));
    }

    #[test]
    fn independent_side_stream_forks_from_capture_begin_and_is_joined_at_end() {
        let p = Problem {
            n_streams: 2,
            ops: vec![op(1, &[(0, W)]), op(0, &[(1, W)])],
            ..Problem::default()
        };
        let plan = plan(&p);
        assert_eq!(plan.events[plan.waits[0][0]].after, None);
        assert_eq!(plan.final_waits.len(), 1);
        assert_eq!(plan.events[plan.final_waits[0]].after, Some(0));
    }

    #[test]
    fn write_after_read_orders_a_later_writer_after_readers_on_other_streams() {
        let p = Problem {
            n_streams: 3,
            ops: vec![
                op(0, &[(0, W)]),
                op(1, &[(0, R)]),
                op(2, &[(0, R)]),
                op(0, &[(0, W)]),
            ],
            ..Problem::default()
        };
        let plan = plan(&p);
        check_sound(&p, &plan);
        assert_eq!(plan.waits[3].len(), 2);
        assert!(plan.final_waits.is_empty());
    }

    #[test]
    fn join_orders_after_the_joined_streams_latest_op() {
        let mut j = op(0, &[]);
        j.joins = vec![1];
        let p = Problem {
            n_streams: 2,
            ops: vec![op(1, &[(0, W)]), op(1, &[(1, W)]), j],
            ..Problem::default()
        };
        let plan = plan(&p);
        assert_eq!(plan.events[plan.waits[2][0]].after, Some(1));
        assert!(plan.final_waits.is_empty());
    }

    #[test]
    fn unordered_cross_stream_write_is_found_and_ordered_one_is_not() {
        let shared = Problem {
            n_streams: 3,
            ops: vec![op(1, &[(0, W)]), op(2, &[(0, W)])],
            ..Problem::default()
        };
        let found = unordered_cross_stream_writes(&shared);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].from, found[0].to), (0, 1));

        let mut joined = shared.clone();
        joined.ops[1].joins = vec![1];
        assert!(unordered_cross_stream_writes(&joined).is_empty());
    }

    #[test]
    fn critical_path_by_cost_follows_the_expensive_branch() {
        let mut ops = vec![
            op(0, &[(0, W)]),
            op(1, &[(0, R), (1, W)]),
            op(2, &[(0, R), (2, W)]),
        ];
        ops[2].cost = 10.0;
        ops.push(op(0, &[(1, R), (2, R)]));
        let p = Problem {
            n_streams: 3,
            ops,
            ..Problem::default()
        };
        let plan = plan(&p);
        assert_eq!(plan.critical_path_by_cost, vec![0, 2, 3]);
    }
}
