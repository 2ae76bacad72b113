//! GPU tests of views and leading dimensions against CPU references: views at odd
//! offsets as kernel arguments, copies and memsets; matmuls on a column block of a wider
//! matrix and into one; and steps whose ops write views of one buffer, disjoint (run side
//! by side) and overlapping (ordered when the step is built).

use stepgraph::exec::BlasSession;
use stepgraph::exec::Mode;
use stepgraph::{CaptureStream, DeviceBuffer, Matmul, MatmulArgs, Result, Span, View, ViewMut};
use stepgraph_kernels::Kernels;
use stepgraph_kernels::reference::{axpby_reference, chain_step_reference};
use stepgraph_testkit::{Rng, check_within};

use super::{device, kernels, run_one_op};

#[test]
fn gpu_views_at_odd_offsets_are_kernel_arguments_copies_and_memsets() -> Result<()> {
    let device = device();
    let k = kernels(&device);
    let mut rng = Rng::new(61);
    let (n, len) = (1001, 1500);
    let x = rng.vec_nonzero(len, -1.0, 1.0);
    let y0 = rng.vec_nonzero(len, -1.0, 1.0);
    let x_dev = device.upload_new("x", &x)?;
    let mut y_dev = device.upload_new("y", &y0)?;
    let (xo, yo) = (3, 17);
    // y[17..1018] = 0.5 x[3..1004] + 2 y[17..1018], the rest of y untouched.
    run_one_op(&device, |s| {
        k.axpby(
            s,
            &x_dev.view(xo..xo + n)?,
            &mut y_dev.view_mut(yo..yo + n)?,
            0.5,
            2.0,
        )
    })?;
    let mut want = y0.clone();
    axpby_reference(&x[xo..xo + n], &mut want[yo..yo + n], 0.5, 2.0);
    assert_eq!(device.download(&y_dev)?, want, "axpby through views");

    // A copy between views, then a memset of another: elements outside are kept.
    let mut z_dev = device.upload_new("z", &y0)?;
    run_one_op(&device, |s| {
        s.copy(&x_dev.view(5..5 + 77)?, &mut z_dev.view_mut(101..178)?)?;
        s.memset_zeros(&mut z_dev.view_mut(1..4)?)
    })?;
    let mut want = y0.clone();
    want[101..178].copy_from_slice(&x[5..82]);
    want[1..4].fill(0.0);
    assert_eq!(
        device.download(&z_dev)?,
        want,
        "copy and memset through views"
    );
    // A view's own download reads only its elements.
    assert_eq!(device.download(&x_dev.view(7..19)?)?, x[7..19]);
    // Out of bounds: an error naming both ranges, nothing issued.
    let e = x_dev.view(1400..1600).unwrap_err().to_string();
    assert!(e.contains("0..1500") && e.contains("1400..1600"), "{e}");
    Ok(())
}

/// `d[m, n] = a[m, k]·b[k, n]` on the CPU, in f64, each operand read through its row
/// stride: `a` from element `a0` with rows `lda` apart, `d` written the same way.
#[allow(clippy::too_many_arguments)]
fn strided_matmul(
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    (a0, lda): (usize, usize),
    b: &[f32],
    d: &mut [f32],
    (d0, ldd): (usize, usize),
) {
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|p| f64::from(a[a0 + i * lda + p]) * f64::from(b[p * n + j]))
                .sum();
            d[d0 + i * ldd + j] = s as f32;
        }
    }
}

#[test]
fn gpu_a_matmul_reads_a_column_block_of_a_wider_matrix_and_writes_into_one() -> Result<()> {
    let device = device();
    let mut rng = Rng::new(62);
    let (rows, wide, first, k, n) = (64, 530, 18, 512, 96);
    let x = rng.vec_nonzero(rows * wide, -1.0, 1.0);
    let w = rng.vec_nonzero(k * n, -0.1, 0.1);
    let x_dev = device.upload_new("x", &x)?;
    let w_dev = device.upload_new("w", &w)?;
    // D is the columns 7..103 of a [64, 131] matrix that is otherwise kept.
    let (d_wide, d_first) = (131, 7);
    let d0 = rng.vec_nonzero(rows * d_wide, -1.0, 1.0);
    let mut d_dev = device.upload_new("d", &d0)?;
    let fc = Matmul::new(rows, n, k).with_ld_a(wide).with_ld_d(d_wide);
    let a_span = Span::columns(rows, wide, first, k);
    let d_span = Span::columns(rows, d_wide, d_first, n);
    assert_eq!((a_span.len(), d_span.len()), (fc.a_len(), fc.d_len()));
    let session = BlasSession::new(&device)?;
    // The block starts 18 floats in: 8-byte aligned, less than a whole buffer's 256.
    session.blas(Mode::Eager).matmul(
        &fc,
        &x_dev.view(a_span)?,
        &w_dev,
        &mut d_dev.view_mut(d_span)?,
        MatmulArgs::new(),
    )?;
    session.synchronize()?;
    let mut want = d0.clone();
    strided_matmul(
        (rows, n, k),
        &x,
        (first, wide),
        &w,
        &mut want,
        (d_first, d_wide),
    );
    let got = device.download(&d_dev)?;
    check_within("column block", "d", &got, &want, 0.05, 1e-4);
    // The columns outside the block are the ones uploaded, bit for bit.
    for r in 0..rows {
        for c in (0..d_first).chain(d_first + n..d_wide) {
            assert_eq!(
                got[r * d_wide + c].to_bits(),
                d0[r * d_wide + c].to_bits(),
                "({r}, {c})"
            );
        }
    }
    // A leading dimension below the stored columns is refused before anything runs.
    let bad = Matmul::new(rows, n, k).with_ld_a(k - 1);
    let e = session
        .blas(Mode::Eager)
        .matmul(&bad, &x_dev, &w_dev, &mut d_dev, MatmulArgs::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("leading dimension of A") && e.contains("511"),
        "{e}"
    );
    Ok(())
}

const ROWS: usize = 96;
const WIDTH: usize = 64;

/// Four branches, each writing its view of one allocation, then a sum over all of it.
#[stepgraph::step(streams(main, branch[4]), kernels = Kernels)]
mod regions {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub features: DeviceBuffer<f32>,
        pub all: DeviceBuffer<f32>,
        #[view(of = all)]
        #[per_branch]
        pub part: [Span; 4],
        pub total: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub iters: u32,
    }

    #[stream(branch[d])]
    fn fill(
        s: &CaptureStream<'_>,
        k: &Kernels,
        d: usize,
        features: &DeviceBuffer<f32>,
        part: &mut ViewMut<'_, f32>,
        iters: u32,
    ) -> Result<()> {
        let n = part.len();
        s.copy(&features.view(d..d + n)?, part)?;
        k.chain_step(s, part, iters, 0.999, 0.001)
    }

    #[join(branch)]
    fn sum(
        s: &CaptureStream<'_>,
        k: &Kernels,
        all: &DeviceBuffer<f32>,
        total: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(&all.view(..total.len())?, total)?;
        k.axpby(s, &all.view(total.len()..2 * total.len())?, total, 1.0, 1.0)
    }
}

/// What `regions` computes, on the CPU, for spans that may overlap: the branches in
/// program order, then the sum.
fn regions_reference(
    features: &[f32],
    all0: &[f32],
    parts: &[Span; 4],
    iters: u32,
    half: usize,
) -> Vec<f32> {
    let mut all = all0.to_vec();
    for (d, p) in parts.iter().enumerate() {
        let mut v = features[d..d + p.len()].to_vec();
        chain_step_reference(&mut v, iters, 0.999, 0.001);
        all[p.start()..p.end()].copy_from_slice(&v);
    }
    (0..half).map(|i| all[i] + all[half + i]).collect()
}

fn run_regions(parts: [Span; 4], seed: u64) -> Result<(Vec<f32>, Vec<f32>, usize, usize)> {
    let device = device();
    let k = kernels(&device);
    let mut rng = Rng::new(seed);
    let len = 4 * ROWS * WIDTH;
    let features = rng.vec(len, -1.0, 1.0);
    let all0 = rng.vec(len, -1.0, 1.0);
    let half = len / 2;
    let buffers = regions::Buffers {
        features: device.upload_new("features", &features)?,
        all: device.upload_new("all", &all0)?,
        part: parts,
        total: device.alloc_zeros("total", half)?,
    };
    let iters = 40;
    let mut step = regions::Step::new(&device, k, buffers, regions::Config { iters })?;
    let orderings = step.view_orderings().len();
    let report = step.verify()?;
    step.replay()?;
    let got = step.download(|b| &b.total)?;
    let want = regions_reference(&features, &all0, &parts, iters, half);
    Ok((got, want, orderings, report.independent_pairs))
}

#[test]
fn gpu_branches_writing_disjoint_views_of_one_buffer_run_side_by_side() -> Result<()> {
    // Branch d's rows, at an odd offset so that no view is aligned beyond a float.
    let parts: [Span; 4] =
        std::array::from_fn(|d| Span::new(1 + d * ROWS * WIDTH - d, ROWS * WIDTH - 3));
    let (got, want, orderings, independent) = run_regions(parts, 63)?;
    check_within("disjoint views", "total", &got, &want, 1e-6, 1e-5);
    assert_eq!(orderings, 0, "disjoint views need no ordering");
    // The four branches are pairwise independent in the verified graph.
    assert!(independent >= 6, "{independent} independent pairs");
    Ok(())
}

#[test]
fn gpu_branches_writing_overlapping_views_are_ordered_and_compute_the_serial_result() -> Result<()>
{
    // Branch 1's view overlaps branch 0's and branch 2's; branch 3's overlaps nothing.
    let n = ROWS * WIDTH;
    let parts = [
        Span::new(0, n),
        Span::new(n - 100, n),
        Span::new(2 * n - 150, n / 2),
        Span::new(3 * n, n),
    ];
    let (got, want, orderings, _) = run_regions(parts, 64)?;
    check_within("overlapping views", "total", &got, &want, 1e-6, 1e-5);
    assert_eq!(
        orderings, 2,
        "branch 1 after branch 0, branch 2 after branch 1"
    );
    Ok(())
}

/// A read-only view declared on the buffers, read by a matmul with a leading dimension:
/// what a step does with "the first 512 of 530 columns".
#[stepgraph::step(streams(main))]
mod column_block {
    use super::*;
    use stepgraph::Blas;

    #[buffers]
    pub struct Buffers {
        pub obs: DeviceBuffer<f32>,
        #[view(of = obs)]
        pub features: Span,
        pub w: DeviceBuffer<f32>,
        pub out: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub fc: Matmul,
    }

    fn project(
        b: &Blas<'_>,
        features: &View<'_, f32>,
        w: &DeviceBuffer<f32>,
        out: &mut DeviceBuffer<f32>,
        fc: Matmul,
    ) -> Result<()> {
        b.matmul(&fc, features, w, out, MatmulArgs::new())
    }
}

#[test]
fn gpu_a_declared_view_is_a_column_block_for_a_step_matmul() -> Result<()> {
    let device = device();
    let mut rng = Rng::new(65);
    let (rows, wide, k, n) = (32, 530, 512, 64);
    let obs = rng.vec_nonzero(rows * wide, -1.0, 1.0);
    let w = rng.vec_nonzero(k * n, -0.1, 0.1);
    let fc = Matmul::new(rows, n, k).with_ld_a(wide);
    let buffers = column_block::Buffers {
        obs: device.upload_new("obs", &obs)?,
        features: Span::columns(rows, wide, 0, k),
        w: device.upload_new("w", &w)?,
        out: device.alloc_zeros("out", rows * n)?,
    };
    let mut step = column_block::Step::new(&device, (), buffers, column_block::Config { fc })?;
    step.replay()?;
    let got = step.download(|b| &b.out)?;
    let mut want = vec![0.0; rows * n];
    strided_matmul((rows, n, k), &obs, (0, wide), &w, &mut want, (0, n));
    // Relative to the outputs' size (about 0.75), not to the few that cancel to near zero.
    check_within("declared column block", "out", &got, &want, 0.05, 1e-4);
    // A span past the parent is an error naming the view, when the step is built.
    let buffers = column_block::Buffers {
        obs: device.upload_new("obs", &obs)?,
        features: Span::new(100, rows * wide),
        w: device.upload_new("w", &w)?,
        out: device.alloc_zeros("out", rows * n)?,
    };
    let e = column_block::Step::new(&device, (), buffers, column_block::Config { fc }).unwrap_err();
    assert!(
        e.chain().contains("view `features` of `obs`"),
        "{}",
        e.chain()
    );
    Ok(())
}
