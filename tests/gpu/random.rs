//! GPU tests of the counter-based generator (`DeviceRng`: `Kernels::rng_normal`,
//! `rng_uniform`, `rng_indices`, `rng_advance`) and of `Kernels::gather_rows`, against
//! the CPU references, at lengths of one element, odd ones that end inside a block, and
//! many blocks; and of a captured graph that draws fresh values at every replay. They
//! need a CUDA GPU of compute capability 9.0.
//!
//! Bounds: uniforms, indices and gathers are bit for bit; normals within
//! `RNG_NORMAL_ULPS` ulps (the device's `logf` and `cospif` against f64). A wrong
//! counter, substream or element index gives another value altogether.

use super::{Rng, bits, nan_buffer, run_one_op};
use stepgraph::{CaptureStream, Device, DeviceBuffer, Result, StepBuffer};
use stepgraph_kernels::reference::{
    gather_rows_reference, rng_indices_reference, rng_normal_reference, rng_uniform_reference,
};
use stepgraph_kernels::{DeviceRng, Kernels, RNG_NORMAL_ULPS, Substream};

/// One element, odd lengths inside the first and second block, and many blocks.
const LENGTHS: [usize; 6] = [1, 7, 255, 257, 4099, 100_003];

/// The distance in ulps between two floats (the sign of a zero does not count).
fn ulps(a: f32, b: f32) -> u64 {
    let ordered = |x: f32| {
        let i = x.to_bits() as i32;
        i64::from(if i < 0 { i32::MIN - i } else { i })
    };
    ordered(a).abs_diff(ordered(b))
}

/// A buffer of `u32::MAX`: an index the kernel forgot to write is out of every range.
fn unwritten_indices(device: &Device, len: usize) -> Result<DeviceBuffer<u32>> {
    device.upload_new("indices", &vec![u32::MAX; len])
}

#[test]
fn gpu_rng_normals_are_within_their_ulp_bound_of_the_reference() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    // A fresh counter, one far along, and one about to wrap; two substreams each.
    for (seed, counter) in [(1u64, 0u64), (0xdead_beef, 123_456_789), (7, u64::MAX)] {
        let rng = DeviceRng::resume(&device, seed, counter)?;
        for substream in [Substream(0), Substream(5)] {
            for n in LENGTHS {
                let mut out = nan_buffer(&device, "normals", n)?;
                run_one_op(&device, |s| k.rng_normal(s, &rng, substream, &mut out))?;
                let got = device.download(&out)?;
                let want = rng_normal_reference(seed, counter, substream, n);
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(&g, &w)| ulps(g, w))
                    .max()
                    .unwrap();
                eprintln!(
                    "normals, seed {seed}, counter {counter}, {substream:?}, n {n}: {worst} ulps"
                );
                assert!(
                    worst <= u64::from(RNG_NORMAL_ULPS),
                    "seed {seed}, counter {counter}, {substream:?}, n {n}: {worst} ulps"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn gpu_rng_uniforms_and_indices_equal_the_reference_bit_for_bit() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let (seed, counter) = (0x5eed, 41);
    let rng = DeviceRng::resume(&device, seed, counter)?;
    // [1, 2) and [-3, -2.5) are where fmaf can round up to hi.
    for (lo, hi) in [(0.0f32, 1.0f32), (1.0, 2.0), (-3.0, -2.5), (-0.02, 0.98)] {
        for n in LENGTHS {
            let sub = Substream(n as u32);
            let mut out = nan_buffer(&device, "uniforms", n)?;
            run_one_op(&device, |s| k.rng_uniform(s, &rng, sub, lo, hi, &mut out))?;
            let got = device.download(&out)?;
            let want = rng_uniform_reference(seed, counter, sub, lo, hi, n);
            assert_eq!(bits(&[&got]), bits(&[&want]), "[{lo}, {hi}), n {n}");
            assert!(
                got.iter().all(|v| (lo..hi).contains(v)),
                "[{lo}, {hi}), n {n}"
            );
        }
    }
    for rows in [1usize, 2, 1_000_003, u32::MAX as usize] {
        for n in LENGTHS {
            let sub = Substream(3);
            let mut idx = unwritten_indices(&device, n)?;
            run_one_op(&device, |s| k.rng_indices(s, &rng, sub, rows, &mut idx))?;
            let got = device.download(&idx)?;
            assert_eq!(
                got,
                rng_indices_reference(seed, counter, sub, rows as u32, n),
                "rows {rows}, n {n}"
            );
            assert!(got.iter().all(|&i| (i as usize) < rows), "rows {rows}");
        }
    }
    Ok(())
}

#[test]
fn gpu_gather_rows_of_drawn_indices_equals_the_reference() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let mut rng = Rng::new(61);
    let draws_rng = DeviceRng::new(&device, 99)?;
    for (rows, row_len, batch) in [(1, 1, 1), (13, 3, 7), (1000, 64, 257), (5, 257, 4099)] {
        let src_host = rng.vec_nonzero(rows * row_len, -4.0, 4.0);
        let src = device.upload_new("src", &src_host)?;
        let mut idx = unwritten_indices(&device, batch)?;
        let mut dst = nan_buffer(&device, "dst", batch * row_len)?;
        run_one_op(&device, |s| {
            k.rng_indices(s, &draws_rng, Substream(0), rows, &mut idx)?;
            k.gather_rows(s, &src, &idx, &mut dst, row_len)
        })?;
        let idx_host = device.download(&idx)?;
        let want = gather_rows_reference(&src_host, &idx_host, row_len);
        let got = device.download(&dst)?;
        assert_eq!(
            bits(&[&got]),
            bits(&[&want]),
            "{rows} x {row_len}, batch {batch}"
        );
    }
    // An index of the caller's own out of range gathers NaN, not memory past src.
    let src_host = rng.vec_nonzero(4 * 3, -1.0, 1.0);
    let src = device.upload_new("src", &src_host)?;
    let idx = device.upload_new("idx", &[3u32, 4, 0, u32::MAX])?;
    let mut dst = device.upload_new("dst", &[1.0f32; 12])?;
    run_one_op(&device, |s| k.gather_rows(s, &src, &idx, &mut dst, 3))?;
    let got = device.download(&dst)?;
    assert_eq!(got[..3], src_host[9..12]);
    assert!(got[3..6].iter().chain(&got[9..12]).all(|v| v.is_nan()));
    assert_eq!(got[6..9], src_host[..3]);
    Ok(())
}

/// A launch with a bad argument, given an output buffer and an index buffer.
type BadCall<'a> =
    dyn Fn(&CaptureStream<'_>, &mut DeviceBuffer<f32>, &mut DeviceBuffer<u32>) -> Result<()> + 'a;

#[test]
fn gpu_rng_and_gather_refuse_bad_sizes_naming_expected_and_found() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let rng = DeviceRng::new(&device, 1)?;
    let mut out = nan_buffer(&device, "out", 8)?;
    let mut idx = unwritten_indices(&device, 4)?;
    let src = nan_buffer(&device, "src", 10)?;
    let cases: [(&str, &BadCall<'_>); 6] = [
        ("expected finite bounds lo < hi", &|s, o, _| {
            k.rng_uniform(s, &rng, Substream(0), 1.0, 1.0, o)
        }),
        ("found [0, inf)", &|s, o, _| {
            k.rng_uniform(s, &rng, Substream(0), 0.0, f32::INFINITY, o)
        }),
        (
            "rng_indices: rows: expected at least 1, found 0",
            &|s, _, i| k.rng_indices(s, &rng, Substream(0), 0, i),
        ),
        ("found 10 elements", &|s, o, i| {
            k.gather_rows(s, &src, &*i, o, 4)
        }),
        (
            "gather_rows: row_len: expected at least 1, found 0",
            &|s, o, i| k.gather_rows(s, &src, &*i, o, 0),
        ),
        ("expected 20 elements, found 8", &|s, o, i| {
            k.gather_rows(s, &src, &*i, o, 5)
        }),
    ];
    for (want, call) in cases {
        let err = run_one_op(&device, |s| call(s, &mut out, &mut idx)).unwrap_err();
        let msg = err.chain();
        assert!(msg.contains(want), "wanted `{want}` in: {msg}");
    }
    Ok(())
}

/// The generator inside a struct of step buffers, as a model's noise would be held.
#[derive(StepBuffer)]
pub struct Noise {
    pub rng: DeviceRng,
    pub eps: DeviceBuffer<f32>,
}

/// Draws normals and indices, then advances the generator: each replay draws anew.
#[stepgraph::step(streams(main, side), kernels = Kernels)]
mod draws {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub noise: Noise,
        pub idx: DeviceBuffer<u32>,
        pub src: DeviceBuffer<f32>,
        pub rows: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub row_len: usize,
    }

    fn normals(s: &CaptureStream<'_>, k: &Kernels, noise: &mut Noise) -> Result<()> {
        let Noise { rng, eps } = noise;
        k.rng_normal(s, rng, Substream(0), eps)
    }

    #[stream(side)]
    fn batch(
        s: &CaptureStream<'_>,
        k: &Kernels,
        noise: &Noise,
        idx: &mut DeviceBuffer<u32>,
        src: &DeviceBuffer<f32>,
        rows: &mut DeviceBuffer<f32>,
        row_len: usize,
    ) -> Result<()> {
        let count = src.len() / row_len;
        k.rng_indices(s, &noise.rng, Substream(1), count, idx)?;
        k.gather_rows(s, src, idx, rows, row_len)
    }

    fn advance(s: &CaptureStream<'_>, k: &Kernels, noise: &mut Noise) -> Result<()> {
        k.rng_advance(s, &mut noise.rng)
    }
}

#[test]
fn gpu_a_captured_graph_draws_fresh_values_at_every_replay() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let (seed, start, n, batch, row_len) = (2024u64, 10u64, 1001, 33, 5);
    let src_host = Rng::new(62).vec_nonzero(97 * row_len, -1.0, 1.0);
    let buffers = draws::Buffers {
        noise: Noise {
            rng: DeviceRng::resume(&device, seed, start)?,
            eps: nan_buffer(&device, "eps", n)?,
        },
        idx: unwritten_indices(&device, batch)?,
        src: device.upload_new("src", &src_host)?,
        rows: nan_buffer(&device, "rows", batch * row_len)?,
    };
    let mut step = draws::Step::new(&device, k, buffers, draws::Config { row_len })?;
    // Capture recorded the launches without running them.
    assert_eq!(step.download(|b| b.noise.rng.counter())?, [start]);
    let mut previous: Option<Vec<f32>> = None;
    for replay in 0..4u64 {
        step.replay()?;
        let counter = start + replay;
        let [eps, rows] =
            <[Vec<f32>; 2]>::try_from(step.download_many(|b| vec![&b.noise.eps, &b.rows])?)
                .unwrap();
        let want = rng_normal_reference(seed, counter, Substream(0), n);
        let worst = eps
            .iter()
            .zip(&want)
            .map(|(&g, &w)| ulps(g, w))
            .max()
            .unwrap();
        assert!(
            worst <= u64::from(RNG_NORMAL_ULPS),
            "replay {replay}: {worst} ulps"
        );
        let idx = step.download(|b| &b.idx)?;
        assert_eq!(
            idx,
            rng_indices_reference(seed, counter, Substream(1), 97, batch)
        );
        assert_eq!(
            bits(&[&rows]),
            bits(&[&gather_rows_reference(&src_host, &idx, row_len)])
        );
        assert_eq!(step.download(|b| b.noise.rng.counter())?, [counter + 1]);
        if let Some(p) = &previous {
            assert_ne!(
                bits(&[p]),
                bits(&[&eps]),
                "replay {replay} drew the same normals"
            );
        }
        previous = Some(eps);
    }
    Ok(())
}
