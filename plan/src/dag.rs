//! The graph algorithms over a schedule, written once for the `#[step]` macro (which plans
//! at compile time), the runtime (which verifies captured graphs and times profiles) and
//! the pictures. Nodes are `0..n`; edges are `(from, to)` pairs.
//!
//! A schedule's ops are in program order, which is a topological order of its
//! happens-before edges: [`closure`], [`longest_path`] and [`levels`] rely on every edge
//! pointing forward (`from < to`) and ignore any that does not. A captured CUDA graph has
//! no such order; [`reachability`] sorts it first.

/// A dense set of nodes `0..n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSet(Vec<u64>);

impl NodeSet {
    /// An empty set with room for nodes `0..n`.
    pub fn new(n: usize) -> Self {
        NodeSet(vec![0; n.div_ceil(64)])
    }

    /// Adds node `i`; a node past the set's room is ignored.
    pub fn insert(&mut self, i: usize) {
        if let Some(word) = self.0.get_mut(i / 64) {
            *word |= 1 << (i % 64);
        }
    }

    /// Whether node `i` is in the set.
    pub fn contains(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Adds every node of `other`.
    pub fn union(&mut self, other: &NodeSet) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
}

/// The happens-before edges of a multi-stream schedule: stream order between consecutive
/// ops of each stream, then each wait, from the op its event follows to the waiting op.
///
/// `ops` gives, in program order, each op's stream (`None` for a stream the caller cannot
/// name, which then orders nothing) and the ops whose recorded events it waits on.
///
/// ```
/// use stepgraph_plan::dag::schedule_edges;
///
/// // a on stream 0, b on stream 1 waiting on a, c on stream 0.
/// let ops = [(Some(0), vec![]), (Some(1), vec![0]), (Some(0), vec![])];
/// assert_eq!(schedule_edges(ops), [(0, 1), (0, 2)]);
/// ```
pub fn schedule_edges<W>(ops: impl IntoIterator<Item = (Option<usize>, W)>) -> Vec<(usize, usize)>
where
    W: IntoIterator<Item = usize>,
{
    let mut edges = Vec::new();
    let mut last_on: Vec<Option<usize>> = Vec::new();
    for (b, (stream, waited)) in ops.into_iter().enumerate() {
        if let Some(s) = stream {
            if last_on.len() <= s {
                last_on.resize(s + 1, None);
            }
            if let Some(a) = last_on[s].replace(b) {
                edges.push((a, b));
            }
        }
        edges.extend(waited.into_iter().map(|a| (a, b)));
    }
    edges
}

/// The predecessors of each node `0..n` through forward edges.
fn forward_preds(n: usize, edges: &[(usize, usize)]) -> Vec<Vec<usize>> {
    let mut preds = vec![Vec::new(); n];
    for &(a, b) in edges {
        if a < b && b < n {
            preds[b].push(a);
        }
    }
    preds
}

/// `before[b]`: every node ordered before node `b` by forward `edges` (`from < to`;
/// other edges are ignored), transitively.
pub fn closure(n: usize, edges: &[(usize, usize)]) -> Vec<NodeSet> {
    let preds = forward_preds(n, edges);
    let mut before: Vec<NodeSet> = Vec::with_capacity(n);
    for ps in &preds {
        let mut set = NodeSet::new(n);
        for &a in ps {
            set.union(&before[a]);
            set.insert(a);
        }
        before.push(set);
    }
    before
}

/// A graph handed to [`reachability`] has a cycle, so it orders nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cycle;

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the graph has a cycle")
    }
}

impl std::error::Error for Cycle {}

/// `reach[a]`: every node reachable from node `a` by one or more of `edges`, for any
/// acyclic graph whatever the order of its nodes (a captured CUDA graph's). Edges that
/// name a node outside `0..n` are ignored.
pub fn reachability(n: usize, edges: &[(usize, usize)]) -> Result<Vec<NodeSet>, Cycle> {
    let mut succ = vec![Vec::new(); n];
    let mut indeg = vec![0usize; n];
    for &(a, b) in edges.iter().filter(|&&(a, b)| a < n && b < n) {
        succ[a].push(b);
        indeg[b] += 1;
    }
    let mut order = Vec::with_capacity(n);
    let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    while let Some(a) = ready.pop() {
        order.push(a);
        for &b in &succ[a] {
            indeg[b] -= 1;
            if indeg[b] == 0 {
                ready.push(b);
            }
        }
    }
    if order.len() != n {
        return Err(Cycle);
    }
    let mut reach = vec![NodeSet::new(n); n];
    for &a in order.iter().rev() {
        let mut r = NodeSet::new(n);
        for &b in &succ[a] {
            r.insert(b);
            r.union(&reach[b]);
        }
        reach[a] = r;
    }
    Ok(reach)
}

/// The longest path through forward `edges` over nodes `0..n`, each node weighted by
/// `cost`: its nodes in order and its total.
///
/// Ties go to the earliest node, at both ends: a node's path comes through the earliest
/// predecessor that finishes last, and the path ends at the earliest node that finishes
/// last. A node whose predecessors all finish at 0 starts the path.
///
/// ```
/// use stepgraph_plan::dag::longest_path;
///
/// // 0 -> 1 -> 3 and 0 -> 2 -> 3, equally long: the tie goes to the earlier node, 1.
/// let edges = [(0, 1), (0, 2), (1, 3), (2, 3)];
/// assert_eq!(longest_path(4, &edges, |_| 1.0), (vec![0, 1, 3], 3.0));
/// assert_eq!(longest_path(4, &edges, |i| if i == 2 { 5.0 } else { 1.0 }).0, [0, 2, 3]);
/// ```
pub fn longest_path(
    n: usize,
    edges: &[(usize, usize)],
    cost: impl Fn(usize) -> f64,
) -> (Vec<usize>, f64) {
    let preds = forward_preds(n, edges);
    let mut best = vec![0.0f64; n];
    let mut from: Vec<Option<usize>> = vec![None; n];
    for b in 0..n {
        let mut start = 0.0;
        // Predecessors are visited in the order their edges were given; the earliest
        // node wins a tie, whatever that order.
        let mut ps = preds[b].clone();
        ps.sort_unstable();
        for a in ps {
            if best[a] > start {
                start = best[a];
                from[b] = Some(a);
            }
        }
        best[b] = start + cost(b);
    }
    let Some(mut at) = (0..n).reduce(|x, y| if best[y] > best[x] { y } else { x }) else {
        return (Vec::new(), 0.0);
    };
    let total = best[at];
    let mut path = vec![at];
    while let Some(a) = from[at] {
        path.push(a);
        at = a;
    }
    path.reverse();
    (path, total)
}

/// The chains-and-work bound of a schedule ([`chain_work_bound`]): its value and where
/// it was found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChainWork {
    /// The bound, in the units of the costs.
    pub total: f64,
    /// The node whose longest chain from the start heads the bound, if any.
    pub head: Option<usize>,
    /// The node whose longest chain to the end tails the bound, if any.
    pub tail: Option<usize>,
}

/// A lower bound on any execution of a schedule that combines its chains with the work
/// between them: for a node `h` and a node `t` after it,
///
/// `longest chain from the start through h` (each node at `alone`)
/// `+ Σ work over the nodes after h and before t`
/// `+ longest chain from t to the end`,
///
/// maximised over `h` and `t`; either may be absent (the chain is then empty and the
/// work runs from the start or to the end). No node after `h` can start before `h`'s
/// chain ends, nor `t` before every node before it ends, and the nodes between share the
/// GPU, so they take at least their summed work. With no `h` and no `t` it is the total
/// work, with no node between it is a chain through the schedule: it is never below the
/// larger of the longest path and the total work, and where the two disagree (chains at
/// the ends of a schedule whose middle fills the GPU) it is the tighter of the three.
///
/// `alone(i)` is node `i`'s time by itself, `work(i)` the share of it no other node can
/// use (at most `alone(i)`). Edges as [`closure`] takes them. Quadratic in pairs of
/// nodes, each pair a scan of the nodes between: for the few hundred ops of a step.
///
/// ```
/// use stepgraph_plan::dag::chain_work_bound;
///
/// // A chain 0 -> {1, 2} -> 3: 1 and 2 each fill the GPU (work = alone = 4), 0 and 3
/// // are small kernels (alone 1, work 0). The longest path is 6 and the work 8; no
/// // execution beats 1 + 8 + 1.
/// let edges = [(0, 1), (0, 2), (1, 3), (2, 3)];
/// let alone = [1.0, 4.0, 4.0, 1.0];
/// let work = [0.0, 4.0, 4.0, 0.0];
/// let b = chain_work_bound(4, &edges, |i| alone[i], |i| work[i]);
/// assert_eq!((b.total, b.head, b.tail), (10.0, Some(0), Some(3)));
/// ```
pub fn chain_work_bound(
    n: usize,
    edges: &[(usize, usize)],
    alone: impl Fn(usize) -> f64,
    work: impl Fn(usize) -> f64,
) -> ChainWork {
    let preds = forward_preds(n, edges);
    let before = closure(n, edges);
    let mut after = vec![NodeSet::new(n); n];
    for (b, set) in before.iter().enumerate() {
        for (a, later) in after.iter_mut().enumerate().take(b) {
            if set.contains(a) {
                later.insert(b);
            }
        }
    }
    // Longest chain ending at each node (from the start) and starting at it (to the end).
    let mut to_end = vec![0.0f64; n];
    let mut from_start = vec![0.0f64; n];
    for b in 0..n {
        from_start[b] = preds[b].iter().map(|&a| from_start[a]).fold(0.0, f64::max) + alone(b);
    }
    let mut succs = vec![Vec::new(); n];
    for (b, ps) in preds.iter().enumerate() {
        for &a in ps {
            succs[a].push(b);
        }
    }
    for a in (0..n).rev() {
        to_end[a] = succs[a].iter().map(|&b| to_end[b]).fold(0.0, f64::max) + alone(a);
    }
    let work: Vec<f64> = (0..n).map(work).collect();
    let sum =
        |pick: &dyn Fn(usize) -> bool| (0..n).filter(|&j| pick(j)).map(|j| work[j]).sum::<f64>();
    let mut best = ChainWork {
        total: work.iter().sum(),
        head: None,
        tail: None,
    };
    let mut offer = |total: f64, head: Option<usize>, tail: Option<usize>| {
        if total > best.total {
            best = ChainWork { total, head, tail };
        }
    };
    for t in 0..n {
        offer(sum(&|j| before[t].contains(j)) + to_end[t], None, Some(t));
    }
    for h in 0..n {
        offer(
            from_start[h] + sum(&|j| after[h].contains(j)),
            Some(h),
            None,
        );
        for t in (h + 1..n).filter(|&t| after[h].contains(t)) {
            let between = sum(&|j| after[h].contains(j) && before[t].contains(j));
            offer(from_start[h] + between + to_end[t], Some(h), Some(t));
        }
    }
    best
}

/// Each node's level: 0 for a node nothing orders before it, otherwise one more than the
/// highest level among the nodes that forward `edges` order before it.
pub fn levels(n: usize, edges: &[(usize, usize)]) -> Vec<usize> {
    let preds = forward_preds(n, edges);
    let mut level = vec![0usize; n];
    for b in 0..n {
        level[b] = preds[b].iter().map(|&a| level[a] + 1).max().unwrap_or(0);
    }
    level
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_holds_what_was_inserted_and_ignores_what_has_no_room() {
        let mut s = NodeSet::new(70);
        s.insert(3);
        s.insert(69);
        s.insert(700);
        assert!(s.contains(3) && s.contains(69));
        assert!(!s.contains(4) && !s.contains(700));
        let mut t = NodeSet::new(70);
        t.insert(4);
        t.union(&s);
        assert!(t.contains(3) && t.contains(4) && t.contains(69));
    }

    #[test]
    fn the_closure_is_transitive_and_ignores_backward_edges() {
        let before = closure(4, &[(0, 1), (1, 2), (3, 0)]);
        assert!(before[2].contains(0) && before[2].contains(1));
        assert!(!before[0].contains(3), "a backward edge orders nothing");
        assert!(!before[3].contains(0));
    }

    #[test]
    fn reachability_sorts_any_acyclic_graph_and_refuses_a_cycle() {
        // 3 -> 1 -> 0, 3 -> 2: not in index order.
        let reach = reachability(4, &[(3, 1), (1, 0), (3, 2)]).unwrap();
        assert!(reach[3].contains(0) && reach[3].contains(1) && reach[3].contains(2));
        assert!(!reach[1].contains(2) && !reach[0].contains(1));
        assert_eq!(reachability(2, &[(0, 1), (1, 0)]).unwrap_err(), Cycle);
        assert!(reachability(2, &[(0, 9)]).unwrap()[0] == NodeSet::new(2));
    }

    #[test]
    fn the_longest_path_breaks_ties_towards_the_earliest_node_whatever_the_edge_order() {
        for edges in [[(0, 2), (1, 2)], [(1, 2), (0, 2)]] {
            assert_eq!(longest_path(3, &edges, |_| 1.0), (vec![0, 2], 2.0));
        }
        // Two ends that finish together: the earlier one.
        assert_eq!(longest_path(2, &[], |_| 1.0), (vec![0], 1.0));
        assert_eq!(longest_path(0, &[], |_| 1.0), (vec![], 0.0));
    }

    #[test]
    fn levels_count_the_longest_chain_before_each_node() {
        assert_eq!(levels(4, &[(0, 1), (1, 3), (0, 3), (2, 3)]), [0, 1, 0, 2]);
    }

    #[test]
    fn schedule_edges_skip_unknown_streams() {
        let ops = [(Some(0), vec![]), (None, vec![0]), (Some(0), vec![])];
        assert_eq!(schedule_edges(ops), [(0, 1), (0, 2)]);
    }

    #[test]
    fn the_chain_work_bound_joins_a_head_chain_the_middle_work_and_a_tail_chain() {
        // 0 -> 1 -> {2, 3} -> 4 -> 5: a head chain of two small ops, two GPU-filling ops
        // side by side, a tail of two small ops, and 6 beside everything (small).
        let edges = [(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (4, 5)];
        let alone = [1.0, 2.0, 5.0, 5.0, 1.5, 0.5, 3.0];
        let work = [0.1, 0.2, 5.0, 5.0, 0.1, 0.1, 0.5];
        let b = chain_work_bound(7, &edges, |i| alone[i], |i| work[i]);
        // 1 + 2 (to the end of 1) + 10 (2 and 3) + 1.5 + 0.5 (from 4 to the end).
        assert_eq!((b.total, b.head, b.tail), (15.0, Some(1), Some(4)));
        assert_eq!(longest_path(7, &edges, |i| alone[i]).1, 10.0);
        // Nothing between: no node, no bound; one node: its time alone.
        assert_eq!(chain_work_bound(0, &[], |_| 1.0, |_| 1.0).total, 0.0);
        let one = chain_work_bound(1, &[], |_| 2.0, |_| 0.5);
        assert_eq!((one.total, one.head, one.tail), (2.0, None, Some(0)));
    }

    proptest::proptest! {
        /// On random schedules: never below the longest path or the total work, never
        /// above one node at a time (an execution every schedule allows); the total work
        /// where every node fills the GPU, the longest path where none takes any.
        #[test]
        fn the_chain_work_bound_lies_between_the_bounds_and_a_serial_execution(
            n in 1usize..24,
            raw_edges in proptest::collection::vec((0usize..24, 0usize..24), 0..60),
            alone in proptest::collection::vec(0.0f64..4.0, 24),
            share in proptest::collection::vec(0.0f64..=1.0, 24),
        ) {
            let edges: Vec<(usize, usize)> = raw_edges
                .into_iter()
                .map(|(a, b)| (a.min(b), a.max(b)))
                .filter(|&(a, b)| a < b && b < n)
                .collect();
            let eps = 1e-9;
            let path = longest_path(n, &edges, |i| alone[i]).1;
            let serial: f64 = alone[..n].iter().sum();
            let total_work: f64 = (0..n).map(|i| alone[i] * share[i]).sum();
            let b = chain_work_bound(n, &edges, |i| alone[i], |i| alone[i] * share[i]);
            proptest::prop_assert!(b.total >= path - eps && b.total >= total_work - eps, "{b:?} {path} {total_work}");
            proptest::prop_assert!(b.total <= serial + eps, "{b:?} {serial}");
            let full = chain_work_bound(n, &edges, |i| alone[i], |i| alone[i]);
            proptest::prop_assert!((full.total - serial).abs() <= eps, "{full:?} {serial}");
            let none = chain_work_bound(n, &edges, |i| alone[i], |_| 0.0);
            proptest::prop_assert!((none.total - path).abs() <= eps, "{none:?} {path}");
        }
    }
}
