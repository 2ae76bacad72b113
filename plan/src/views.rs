//! Views of one buffer whose elements overlap: the orderings the compile-time schedule
//! lacks for them.
//!
//! The macro plans a step before its buffers exist. It knows that a `#[view(of = p)]`
//! field lies inside `p`, so a view and its parent conflict; two views of one parent
//! are planned as disjoint, since where each lies is known only once the buffers are.
//! When the step is built, the views' spans are known: views that overlap after all
//! conflict like one buffer, and [`overlap_orderings`] finds the pairs of ops the
//! schedule must then order and does not. The runtime adds a wait for each.

use std::ops::Range;

use crate::{Access, BufId, OpId, PlanDesc, dag};

/// One op's accesses for [`overlap_orderings`]: `(resource, writes)`, a resource being an
/// opaque index (a buffer's copy, a view's element).
pub type Accesses = [(usize, bool)];

/// The pairs `(a, b)`, `a` before `b` in program order, that conflict through
/// `overlapping` resources (distinct resources whose memory overlaps: two views of one
/// buffer) with a write among them, and that the schedule (`edges`, happens-before over
/// `ops.len()` ops) leaves unordered, with the orderings added so far: ordering the pairs
/// returned, in the order returned, orders every such conflict. For each op the nearest
/// conflicting earlier op is taken first, so that earlier ones are often ordered through
/// it and need no ordering of their own.
pub fn overlap_orderings(
    ops: &[&Accesses],
    edges: &[(usize, usize)],
    overlapping: impl Fn(usize, usize) -> bool,
) -> Vec<(usize, usize)> {
    let n = ops.len();
    let conflict = |a: usize, b: usize| {
        ops[a].iter().any(|&(x, wx)| {
            ops[b]
                .iter()
                .any(|&(y, wy)| (wx || wy) && x != y && overlapping(x, y))
        })
    };
    let mut edges = edges.to_vec();
    let mut before = dag::closure(n, &edges);
    let mut added = Vec::new();
    for b in 0..n {
        for a in (0..b).rev() {
            if before[b].contains(a) || !conflict(a, b) {
                continue;
            }
            added.push((a, b));
            edges.push((a, b));
            // Rare (only overlapping views need it) and small: recompute.
            before = dag::closure(n, &edges);
        }
    }
    added
}

impl PlanDesc {
    /// [`overlap_orderings`] for this plan's views: `place(view, copy)` is where that copy
    /// of a view buffer ([`BufferDesc::view_of`](crate::BufferDesc::view_of)) lies in its
    /// parent, and `edges` the schedule's happens-before (op indices). Two copies overlap
    /// when they are views of one parent and share an element.
    pub fn view_orderings(
        &self,
        edges: &[(usize, usize)],
        place: impl Fn(BufId, u16) -> Option<Range<usize>>,
    ) -> Vec<(OpId, OpId)> {
        // Resources as opaque indices: each (buffer, copy) an op accesses, once.
        let mut resources: Vec<(BufId, u16)> = Vec::new();
        let accesses: Vec<Vec<(usize, bool)>> = self
            .ops
            .iter()
            .map(|op| {
                op.accesses
                    .iter()
                    .map(|a| {
                        let r = (a.buf, a.copy);
                        let ix = resources.iter().position(|&x| x == r).unwrap_or_else(|| {
                            resources.push(r);
                            resources.len() - 1
                        });
                        (ix, a.access == Access::Write)
                    })
                    .collect()
            })
            .collect();
        // Where each resource lies, for the views among them: (parent, elements).
        let placed: Vec<Option<(BufId, Range<usize>)>> = resources
            .iter()
            .map(|&(buf, copy)| {
                let parent = self.buffers.get(buf.index())?.view_of?;
                Some((parent, place(buf, copy)?))
            })
            .collect();
        let overlapping = |x: usize, y: usize| match (&placed[x], &placed[y]) {
            (Some((p, a)), Some((q, b))) => {
                p == q && !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
            }
            _ => false,
        };
        let ops: Vec<&Accesses> = accesses.iter().map(Vec::as_slice).collect();
        overlap_orderings(&ops, edges, overlapping)
            .into_iter()
            .map(|(a, b)| (OpId(a as u32), OpId(b as u32)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resources 0 and 1 overlap; 2 overlaps nothing.
    fn overlap(x: usize, y: usize) -> bool {
        matches!((x, y), (0, 1) | (1, 0))
    }

    #[test]
    fn overlapping_writes_on_unordered_ops_are_ordered_and_disjoint_ones_are_not() {
        let a: &Accesses = &[(0, true)];
        let b: &Accesses = &[(1, true)];
        let c: &Accesses = &[(2, true)];
        assert_eq!(overlap_orderings(&[a, b], &[], overlap), vec![(0, 1)]);
        assert_eq!(overlap_orderings(&[a, c], &[], overlap), vec![]);
        // Already ordered by the schedule: nothing to add.
        assert_eq!(overlap_orderings(&[a, b], &[(0, 1)], overlap), vec![]);
    }

    #[test]
    fn a_plans_views_are_ordered_where_their_places_overlap() {
        use crate::{AccessDesc, BufKind, BufferDesc, OpDesc, StreamDesc, StreamId};
        const PLAN: PlanDesc = PlanDesc::new("views")
            .with_streams(&[StreamDesc::named("main"), StreamDesc::named("side")])
            .with_buffers(&[
                BufferDesc::new("all", BufKind::Shared),
                BufferDesc::new("a", BufKind::Shared).with_view_of(BufId(0)),
                BufferDesc::new("b", BufKind::Shared).with_view_of(BufId(0)),
            ])
            .with_ops(&[
                OpDesc::new("fill_a", StreamId(0)).with_accesses(&[AccessDesc::write(BufId(1), 0)]),
                OpDesc::new("fill_b", StreamId(1)).with_accesses(&[AccessDesc::write(BufId(2), 0)]),
            ]);
        let at = |a: Range<usize>, b: Range<usize>| {
            move |buf: BufId, _: u16| {
                Some(if buf == BufId(1) {
                    a.clone()
                } else {
                    b.clone()
                })
            }
        };
        assert_eq!(
            PLAN.view_orderings(&[], at(0..10, 5..15)),
            vec![(OpId(0), OpId(1))]
        );
        assert!(PLAN.view_orderings(&[], at(0..10, 10..15)).is_empty());
        assert!(PLAN.view_orderings(&[], at(0..0, 0..15)).is_empty());
        // Unknown places overlap nothing.
        assert!(PLAN.view_orderings(&[], |_, _| None).is_empty());
    }

    #[test]
    fn two_reads_of_overlapping_views_need_no_ordering() {
        let r0: &Accesses = &[(0, false)];
        let r1: &Accesses = &[(1, false)];
        assert_eq!(overlap_orderings(&[r0, r1], &[], overlap), vec![]);
        let w1: &Accesses = &[(1, true)];
        assert_eq!(overlap_orderings(&[r0, w1], &[], overlap), vec![(0, 1)]);
    }

    #[test]
    fn an_ordering_through_the_nearest_conflict_covers_earlier_ones() {
        // 0 writes view 0, 1 writes view 0 after it (ordered by the schedule), 2 writes
        // view 1: ordering 1 -> 2 orders 0 -> 2 too.
        let w0: &Accesses = &[(0, true)];
        let w1: &Accesses = &[(1, true)];
        assert_eq!(
            overlap_orderings(&[w0, w0, w1], &[(0, 1)], overlap),
            vec![(1, 2)]
        );
    }
}
