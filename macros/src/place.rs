//! Automatic stream placement: the streams of the ops a step leaves to the planner, and
//! their priorities, from the dependency graph and each op's cost. Plain Rust over the
//! planner's [`Problem`], like the planner itself.
//!
//! The step as written is the contract: an op without a `#[stream]` runs on the origin,
//! and its `#[join]`s name the ops they mean through that reading. Placement moves such
//! ops onto the origin or onto streams of the planner's own and changes nothing else: the
//! dependencies are those of the step as written, each `#[join]` becomes the orderings it
//! meant, and an op placed by hand is never moved.
//!
//! The ops are placed in program order (the order each stream issues them in), each on
//! the stream where it could start earliest in a simulated run where every op takes its
//! cost and a wait on another stream's event `wait_cost` more: list scheduling by
//! earliest start. Ties go to the stream that just ran one of the op's inputs (a chain
//! stays on one stream and needs no event), then to a stream already open, then to the
//! lowest. With streams enough, every op starts as soon as its inputs are done, so the
//! run takes its critical path.
//!
//! A per-stream scratch buffer is a copy per stream: an op that reads what an earlier op
//! wrote to such a buffer (by `&`, or by a `&mut` that is no `#[out]`) must run on that
//! op's stream, or it would read another copy.
//! Such ops are placed together. Their other conflicts on the buffer (a write after a
//! read, two writes) vanish once they sit on different streams, and do not hold
//! placement back.

use crate::schedule::{DepKind, OpIx, Problem, StreamIx, dependencies};

/// What placement needs besides the problem.
pub struct Request<'a> {
    /// The step as written: ops left to the planner sit on the origin (stream 0).
    pub problem: &'a Problem,
    /// Per op: whether the step placed it by hand.
    pub pinned: &'a [bool],
    /// The step's streams placement keeps; the planner's are numbered from here. All of
    /// them where the step leaves some ops to the planner; the origin alone where the
    /// planner places every op.
    pub keep: usize,
    /// The most streams the planner may add to the step's own.
    pub max_streams: usize,
    /// Per buffer: whether it is scratch with a copy per stream.
    pub per_stream_scratch: &'a [bool],
    /// Per op: the per-stream scratch buffers it writes whole before it reads them
    /// (`#[out]`), and so needs nothing from an earlier op on its stream.
    pub out: &'a [Vec<usize>],
    /// What a wait on another stream costs, in the unit of the ops' costs.
    pub wait_cost: f64,
}

/// Where each op runs, and what the simulated run says of the planner's streams.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    /// Per op: its stream. The planner's streams follow the step's own it keeps,
    /// numbered from `keep`.
    pub streams: Vec<StreamIx>,
    /// How many streams the planner added.
    pub added: usize,
    /// Per added stream: whether every op on it could start late without delaying the
    /// step (its slack is at least a quarter of the run), so that it yields the GPU to
    /// the streams of the critical path.
    pub low_priority: Vec<bool>,
    /// Per op: the ops a `#[join]` of it ordered it after, as the step was written.
    pub joined: Vec<Vec<OpIx>>,
    /// Per op: its start and end in the simulated run.
    pub start: Vec<f64>,
    pub end: Vec<f64>,
}

impl Placed {
    /// The simulated run's length.
    pub fn makespan(&self) -> f64 {
        self.end.iter().copied().fold(0.0, f64::max)
    }
}

/// The placement's view of the step: ops' inputs, and the ops that must share a stream.
struct Graph {
    preds: Vec<Vec<OpIx>>,
    /// Per op: the op whose stream it must share (a per-stream scratch it reads), if any;
    /// always an earlier op.
    tied_to: Vec<Option<OpIx>>,
    joined: Vec<Vec<OpIx>>,
}

fn graph(req: &Request) -> Graph {
    let p = req.problem;
    let n = p.ops.len();
    let mut g = Graph {
        preds: vec![Vec::new(); n],
        tied_to: vec![None; n],
        joined: vec![Vec::new(); n],
    };
    let per_stream = |buf: usize| req.per_stream_scratch.get(buf).copied().unwrap_or(false);
    for d in dependencies(p) {
        match (d.kind, d.resource) {
            (DepKind::ReadAfterWrite, Some(r)) if per_stream(r.buf) => {
                // The reader follows the writer's stream, whichever it is; the writer
                // is placed first (program order), so the reader joins it there.
                g.tied_to[d.to].get_or_insert(d.from);
            }
            (DepKind::WriteAfterWrite, Some(r))
                if per_stream(r.buf) && !req.out.get(d.to).is_some_and(|o| o.contains(&r.buf)) =>
            {
                // A `&mut` that is no `#[out]` reads what the last writer left.
                g.tied_to[d.to].get_or_insert(d.from);
            }
            (_, Some(r)) if per_stream(r.buf) => continue,
            (DepKind::Join, _) => g.joined[d.to].push(d.from),
            _ => {}
        }
        if !g.preds[d.to].contains(&d.from) {
            g.preds[d.to].push(d.from);
        }
    }
    g
}

/// Places the ops the step left to the planner. See the module docs.
pub fn place(req: &Request) -> Placed {
    let p = req.problem;
    let n = p.ops.len();
    let own = req.keep.max(1);
    let g = graph(req);
    let mut stream = vec![0; n];
    let mut start = vec![0.0; n];
    let mut end = vec![0.0; n];
    // Per stream: when its last op ends, and which op that is.
    let mut free: Vec<f64> = vec![0.0; own];
    let mut last: Vec<Option<OpIx>> = vec![None; own];
    for b in 0..n {
        let ready_on = |s: StreamIx, free: &[f64]| {
            let inputs = g.preds[b].iter().map(|&a| {
                let wait = if stream[a] == s { 0.0 } else { req.wait_cost };
                end[a] + wait
            });
            inputs.fold(free.get(s).copied().unwrap_or(0.0), f64::max)
        };
        let s = if req.pinned.get(b).copied().unwrap_or(true) {
            p.ops[b].stream
        } else if let Some(a) = g.tied_to[b] {
            stream[a]
        } else {
            let opened = free.len() - own;
            // The origin, the planner's streams so far, and one more while any is left.
            let mut candidates: Vec<StreamIx> = std::iter::once(0).chain(own..free.len()).collect();
            if opened < req.max_streams {
                candidates.push(free.len());
            }
            let key = |s: StreamIx| {
                let t = ready_on(s, &free);
                let chain = last
                    .get(s)
                    .copied()
                    .flatten()
                    .is_some_and(|a| g.preds[b].contains(&a));
                let new = s >= free.len();
                (t, !chain, new, s)
            };
            candidates
                .into_iter()
                .min_by(|&x, &y| {
                    let (kx, ky) = (key(x), key(y));
                    kx.0.total_cmp(&ky.0)
                        .then(kx.1.cmp(&ky.1))
                        .then(kx.2.cmp(&ky.2))
                        .then(kx.3.cmp(&ky.3))
                })
                .unwrap_or(0)
        };
        let at = ready_on(s, &free);
        if s >= free.len() {
            free.resize(s + 1, 0.0);
            last.resize(s + 1, None);
        }
        stream[b] = s;
        start[b] = at;
        end[b] = start[b] + p.ops[b].cost.max(0.0);
        free[s] = end[b];
        last[s] = Some(b);
    }
    let added = free.len() - own;
    let low_priority = low_priority(&g, &stream, &start, &end, own, added);
    Placed {
        streams: stream,
        added,
        low_priority,
        joined: g.joined,
        start,
        end,
    }
}

/// Per added stream: whether each of its ops has slack of a quarter of the run or more,
/// slack being how much later the op could end without delaying the run, along its
/// inputs' orderings and its stream's order.
fn low_priority(
    g: &Graph,
    stream: &[StreamIx],
    start: &[f64],
    end: &[f64],
    own: usize,
    added: usize,
) -> Vec<bool> {
    let n = stream.len();
    let makespan = end.iter().copied().fold(0.0, f64::max);
    // Latest end of each op: backwards over program order, which orders every input
    // and every stream.
    let mut latest = vec![makespan; n];
    let mut next_on: Vec<Option<OpIx>> = vec![None; own + added];
    for b in (0..n).rev() {
        if let Some(c) = next_on[stream[b]] {
            latest[b] = latest[b].min(latest[c] - (end[c] - start[c]));
        }
        next_on[stream[b]] = Some(b);
        let begin = latest[b] - (end[b] - start[b]);
        for &a in &g.preds[b] {
            latest[a] = latest[a].min(begin);
        }
    }
    (own..own + added)
        .map(|s| {
            let mut slacks = (0..n)
                .filter(|&b| stream[b] == s)
                .map(|b| latest[b] - end[b]);
            slacks.all(|slack| slack >= 0.25 * makespan && makespan > 0.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Access, OpNode, Resource};

    fn op(acc: &[(usize, Access)], cost: f64) -> OpNode {
        OpNode {
            stream: 0,
            accesses: acc
                .iter()
                .map(|&(buf, a)| (Resource { buf, copy: 0 }, a))
                .collect(),
            joins: vec![],
            after: vec![],
            cost,
        }
    }
    use Access::{Read as R, Write as W};

    fn place_all(p: &Problem, max_streams: usize, scratch: &[bool]) -> Placed {
        let pinned = vec![false; p.ops.len()];
        place(&Request {
            problem: p,
            pinned: &pinned,
            keep: p.n_streams,
            max_streams,
            per_stream_scratch: scratch,
            out: &[],
            wait_cost: 0.01,
        })
    }

    #[test]
    fn four_independent_chains_get_a_stream_each_and_a_chain_stays_on_one() {
        // A seed, four chains of two ops, a sum: the shape of fork_join.
        let mut ops = vec![op(&[(0, W)], 1.0)];
        for c in 1..=4 {
            ops.push(op(&[(0, R), (c, W)], 2.0));
            ops.push(op(&[(c, R), (c + 4, W)], 2.0));
        }
        ops.push(op(&[(5, R), (6, R), (7, R), (8, R), (9, W)], 1.0));
        let p = Problem {
            n_streams: 1,
            ops,
            ..Problem::default()
        };
        let placed = place_all(&p, 8, &[]);
        let chains: Vec<(usize, usize)> = (0..4)
            .map(|c| (placed.streams[1 + 2 * c], placed.streams[2 + 2 * c]))
            .collect();
        for (a, b) in &chains {
            assert_eq!(a, b, "a chain on one stream: {:?}", placed.streams);
        }
        let mut distinct: Vec<usize> = chains.iter().map(|c| c.0).collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "{:?}", placed.streams);
        // The first chain continues the origin; three more streams.
        assert_eq!(placed.added, 3);
        assert!(
            (placed.makespan() - 6.02).abs() < 1e-9,
            "{}",
            placed.makespan()
        );
    }

    #[test]
    fn the_bound_on_streams_holds_and_the_rest_queue_where_they_start_earliest() {
        let mut ops = vec![op(&[(0, W)], 1.0)];
        for c in 1..=4 {
            ops.push(op(&[(0, R), (c, W)], 2.0));
        }
        let p = Problem {
            n_streams: 1,
            ops,
            ..Problem::default()
        };
        let placed = place_all(&p, 1, &[]);
        assert_eq!(placed.added, 1);
        assert!(
            placed.streams.iter().all(|&s| s <= 1),
            "{:?}",
            placed.streams
        );
        // Two branches a stream after the seed: 1 + 2 + 2 plus one wait.
        assert!(
            (placed.makespan() - 5.01).abs() < 1e-9,
            "{}",
            placed.makespan()
        );
    }

    #[test]
    fn a_reader_of_per_stream_scratch_follows_its_writer() {
        // Op 0 writes scratch 0 and x (1); op 1 is independent; op 2 reads the scratch.
        let p = Problem {
            n_streams: 1,
            ops: vec![
                op(&[(2, W)], 5.0),
                op(&[(0, W), (1, W)], 1.0),
                op(&[(0, R), (3, W)], 1.0),
            ],
            ..Problem::default()
        };
        let placed = place_all(&p, 4, &[true, false, false, false]);
        assert_ne!(placed.streams[1], placed.streams[0]);
        assert_eq!(placed.streams[2], placed.streams[1]);
    }

    #[test]
    fn a_pinned_op_stays_and_a_join_becomes_the_ordering_it_meant() {
        // Op 0 and 1 on the origin as written; op 2 (pinned to stream 1) joins the
        // origin: it meant op 1.
        let mut ops = vec![op(&[(0, W)], 1.0), op(&[(1, W)], 1.0), op(&[(2, W)], 1.0)];
        ops[2].stream = 1;
        ops[2].joins = vec![0];
        let p = Problem {
            n_streams: 2,
            ops,
            ..Problem::default()
        };
        let pinned = [false, false, true];
        let placed = place(&Request {
            problem: &p,
            pinned: &pinned,
            keep: 2,
            max_streams: 4,
            per_stream_scratch: &[],
            out: &[],
            wait_cost: 0.01,
        });
        assert_eq!(placed.streams[2], 1);
        assert_eq!(placed.joined[2], vec![1]);
        assert!(placed.start[2] >= placed.end[1]);
    }

    #[test]
    fn a_side_stream_with_much_slack_is_low_priority() {
        // A long chain of three, and one short op beside it.
        let p = Problem {
            n_streams: 1,
            ops: vec![
                op(&[(0, W)], 4.0),
                op(&[(9, W)], 1.0),
                op(&[(0, R), (1, W)], 4.0),
                op(&[(1, R), (2, W)], 4.0),
            ],
            ..Problem::default()
        };
        let placed = place_all(&p, 4, &[]);
        assert_eq!(placed.added, 1);
        assert_eq!(placed.streams[1], 1);
        assert_eq!(placed.low_priority, vec![true]);
    }
}
