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
}
