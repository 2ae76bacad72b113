//! Views declared in the buffers: branch d's region of one allocation, written by each
//! branch on its own stream, and a column block of a wider matrix read by a matmul. Two
//! ops writing disjoint views are independent; a view is ordered against its parent.
use stepgraph::{Blas, CaptureStream, DeviceBuffer, Matmul, MatmulArgs, Result, Span, View, ViewMut};

#[stepgraph::step(streams(main, branch[4]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        /// `[rows, 530]`: 512 features and 18 extra columns.
        pub obs: DeviceBuffer<f32>,
        /// The 512 feature columns of `obs`.
        #[view(of = obs)]
        pub features: Span,
        pub w: DeviceBuffer<f32>,
        pub trunk_out: DeviceBuffer<f32>,
        /// `[4, rows, 64]`: every branch's output in one allocation.
        pub q_all: DeviceBuffer<f32>,
        /// Branch d's rows of `q_all`.
        #[view(of = q_all)]
        #[per_branch]
        pub q: [Span; 4],
        pub total: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub rows: usize,
    }

    fn trunk(b: &Blas<'_>, features: &View<'_, f32>, w: &DeviceBuffer<f32>, trunk_out: &mut DeviceBuffer<f32>, rows: usize) -> Result<()> {
        let fc = Matmul::new(rows, 64, 512).with_ld_a(530);
        b.matmul(&fc, features, w, trunk_out, MatmulArgs::new())
    }

    #[stream(branch[d])]
    fn branch(s: &CaptureStream<'_>, trunk_out: &DeviceBuffer<f32>, q: &mut ViewMut<'_, f32>) -> Result<()> {
        s.copy(&trunk_out.view(..q.len())?, q)
    }

    #[join(branch)]
    fn combine(s: &CaptureStream<'_>, q_all: &DeviceBuffer<f32>, total: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(q_all, total)
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    // The views know their parents.
    let buffer = |name: &str| plan.buffers.iter().position(|b| b.name == name).unwrap();
    let view_of = |name: &str| plan.buffers[buffer(name)].view_of.map(|p| p.index());
    assert_eq!(view_of("features"), Some(buffer("obs")));
    assert_eq!(view_of("q"), Some(buffer("q_all")));
    assert_eq!(view_of("q_all"), None);
    // trunk, 4 branches, combine: each branch waits once (for the trunk), combine once
    // per branch; the four writes of `q_all`'s views are not ordered among themselves.
    assert_eq!(plan.ops.len(), 6);
    assert_eq!(plan.wait_count(), 8);
    for op in &plan.ops[1..5] {
        assert_eq!(op.waits.len(), 1, "{}", op.name);
    }
    // Spans: branch d's 256 rows of 64.
    let q: [Span; 4] = std::array::from_fn(|d| Span::rows(d * 256, 256, 64));
    assert!(!q[0].overlaps(&q[1]));
    println!("{plan}");
}
