//! GPU tests of the gather of several arrays at the same rows in one launch
//! (`GatherTable`, `Kernels::gather_rows_table`): it gives the bits of one
//! `Kernels::gather_rows` per entry and of the CPU reference, for rows of 1, 3, 8 and 64
//! floats (scalar and `float4` units, chunk boundaries inside rows and between entries),
//! batches of 1, 1001 and 16384 rows, indices in range and out of it, in a captured graph
//! as one kernel node; and the table refuses buffers that do not match. They need a CUDA
//! GPU of compute capability 9.0.

use super::{Rng, bits, nan_buffer, run_one_op};
use stepgraph::{CaptureStream, Device, DeviceBuffer, Error, Result, StepBuffer};
use stepgraph_kernels::reference::{
    gather_rows_reference, gather_rows_table_reference, rng_indices_reference,
};
use stepgraph_kernels::{DeviceRng, GatherTable, Kernels, Substream};

/// A replay buffer's fields (s, a, r, s2, done, as SAC's and DQN's), and an odd width.
const ROW_LENS: [usize; 6] = [64, 8, 1, 64, 1, 3];

/// Rows of every source: odd, so that no row count is a power of two.
const ROWS: usize = 4099;

/// One row, odd rows that end inside a chunk, and a training batch.
const BATCHES: [usize; 3] = [1, 1001, 16_384];

/// The sources, one per entry of `ROW_LENS`, on the host and on the device.
struct Sources {
    host: Vec<Vec<f32>>,
    dev: Vec<DeviceBuffer<f32>>,
}

fn sources(device: &Device, rng: &mut Rng) -> Result<Sources> {
    let host: Vec<Vec<f32>> = ROW_LENS
        .iter()
        .map(|&w| rng.vec_nonzero(ROWS * w, -4.0, 4.0))
        .collect();
    let dev = host
        .iter()
        .map(|h| device.upload_new("src", h))
        .collect::<Result<_>>()?;
    Ok(Sources { host, dev })
}

/// Destinations of `batch` rows, one per entry, every element NaN.
fn destinations(device: &Device, what: &str, batch: usize) -> Result<Vec<DeviceBuffer<f32>>> {
    ROW_LENS
        .iter()
        .map(|&w| nan_buffer(device, what, batch * w))
        .collect()
}

/// The table gathers `idx` into `table_dst`, then `gather_rows` into `each_dst` per entry,
/// and both must be the CPU reference bit for bit.
fn gather_both_ways(
    device: &Device,
    k: &Kernels,
    sources: &Sources,
    idx: &DeviceBuffer<u32>,
    case: &str,
) -> Result<Vec<Vec<f32>>> {
    let (src_host, src) = (&sources.host, &sources.dev);
    let batch = idx.len();
    let mut table_dst = destinations(device, "dst (table)", batch)?;
    let mut each_dst = destinations(device, "dst (each)", batch)?;
    let entries: Vec<_> = src
        .iter()
        .zip(&table_dst)
        .zip(ROW_LENS)
        .map(|((s, d), w)| (s, d, w))
        .collect();
    let table = GatherTable::new(device, ROWS, batch, &entries)?;
    assert_eq!(
        (table.len(), table.rows(), table.batch(), table.total()),
        (
            ROW_LENS.len(),
            ROWS,
            batch,
            batch * ROW_LENS.iter().sum::<usize>()
        )
    );
    let src_refs: Vec<&DeviceBuffer<f32>> = src.iter().collect();
    run_one_op(device, |s| {
        let mut dst_refs: Vec<&mut DeviceBuffer<f32>> = table_dst.iter_mut().collect();
        k.gather_rows_table(s, &table, idx, &src_refs, &mut dst_refs)?;
        for ((sb, db), w) in src.iter().zip(each_dst.iter_mut()).zip(ROW_LENS) {
            k.gather_rows(s, sb, idx, db, w)?;
        }
        Ok(())
    })?;
    let idx_host = device.download(idx)?;
    let refs: Vec<(&[f32], usize)> = src_host
        .iter()
        .zip(ROW_LENS)
        .map(|(h, w)| (h.as_slice(), w))
        .collect();
    let want = gather_rows_table_reference(&refs, &idx_host);
    let mut got = Vec::with_capacity(ROW_LENS.len());
    for (e, w) in ROW_LENS.iter().enumerate() {
        let table_e = device.download(&table_dst[e])?;
        let each_e = device.download(&each_dst[e])?;
        assert_eq!(
            bits(&[&table_e]),
            bits(&[&each_e]),
            "{case}: entry {e} (rows of {w}): table against gather_rows"
        );
        assert_eq!(
            bits(&[&table_e]),
            bits(&[&want[e]]),
            "{case}: entry {e} (rows of {w}): table against the CPU"
        );
        got.push(table_e);
    }
    Ok(got)
}

#[test]
fn gpu_gather_rows_table_equals_gather_rows_per_entry_bit_for_bit() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let src = sources(&device, &mut Rng::new(91))?;
    let draws = DeviceRng::new(&device, 17)?;
    for batch in BATCHES {
        let mut idx = device.upload_new("idx", &vec![u32::MAX; batch])?;
        run_one_op(&device, |s| {
            k.rng_indices(s, &draws, Substream(batch as u32), ROWS, &mut idx)
        })?;
        assert_eq!(
            device.download(&idx)?,
            rng_indices_reference(17, 0, Substream(batch as u32), ROWS as u32, batch)
        );
        let got = gather_both_ways(&device, &k, &src, &idx, &format!("batch {batch}"))?;
        // The sources have no NaN: every element of every destination was written.
        assert!(got.iter().flatten().all(|v| !v.is_nan()), "batch {batch}");
    }
    Ok(())
}

#[test]
fn gpu_gather_rows_table_gathers_nan_rows_for_indices_out_of_range_as_gather_rows_does()
-> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let src = sources(&device, &mut Rng::new(92))?;
    // The first and last rows, the first ones past the end, and the largest index.
    let mut idx_host: Vec<u32> = (0..1001u32)
        .map(|i| (i * 7919) % (ROWS as u32 + 50))
        .collect();
    idx_host[..5].copy_from_slice(&[0, ROWS as u32 - 1, ROWS as u32, ROWS as u32 + 1, u32::MAX]);
    let idx = device.upload_new("idx", &idx_host)?;
    let got = gather_both_ways(&device, &k, &src, &idx, "out of range")?;
    for (e, w) in ROW_LENS.iter().enumerate() {
        for (i, &row) in idx_host.iter().enumerate() {
            let out = &got[e][i * w..(i + 1) * w];
            if (row as usize) < ROWS {
                assert_eq!(
                    out,
                    gather_rows_reference(&src.host[e], &[row], *w),
                    "{e} {i}"
                );
            } else {
                assert!(
                    out.iter().all(|v| v.is_nan()),
                    "entry {e}, index {i}: {row}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn gpu_gather_table_refuses_mismatched_entries_and_foreign_buffers() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let up = |n: usize| device.upload_new("t", &vec![0.5f32; n]);
    let (rows, batch) = (10, 3);
    let (s0, d0, s1, d1) = (up(rows * 4)?, up(batch * 4)?, up(rows)?, up(batch)?);

    // At build: a source of other rows and a destination of another batch, by entry.
    let short_src = up(rows - 1)?;
    let err =
        GatherTable::new(&device, rows, batch, &[(&s0, &d0, 4), (&short_src, &d1, 1)]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LengthMismatch {
                expected: 10,
                found: 9,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("src of entry 1 (10 rows of 1)"),
        "{err}"
    );
    let long_dst = up(batch * 4 + 1)?;
    let err = GatherTable::new(&device, rows, batch, &[(&s0, &long_dst, 4)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GatherTable: dst of entry 0 (3 rows of 4): expected 12 elements, found 13"
    );
    let err = GatherTable::new(&device, rows, batch, &[(&s0, &d0, 4), (&s0, &d0, 4)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("expected entry 0's dst to be a buffer of its own, found entry 1's dst"),
        "{err}"
    );

    // At launch: the table's buffers, in its order, and an index per row of the batch.
    let table = GatherTable::new(&device, rows, batch, &[(&s0, &d0, 4), (&s1, &d1, 1)])?;
    let idx = device.upload_new("idx", &[0u32, 1, 2])?;
    let (mut d0, mut d1, mut other) = (d0, d1, up(batch)?);
    let launch = |srcs: &[&DeviceBuffer<f32>],
                  dsts: &mut [&mut DeviceBuffer<f32>],
                  idx: &DeviceBuffer<u32>| {
        run_one_op(&device, |s| k.gather_rows_table(s, &table, idx, srcs, dsts))
            .unwrap_err()
            .chain()
    };
    let err = launch(&[&s0, &s1], &mut [&mut d0, &mut other], &idx);
    assert!(
        err.contains("expected entry 1's dst to be the table's buffer (3 elements at"),
        "{err}"
    );
    let err = launch(&[&s1, &s0], &mut [&mut d0, &mut d1], &idx);
    assert!(
        err.contains("expected entry 0's src to be the table's buffer (40 elements at"),
        "{err}"
    );
    let err = launch(&[&s0], &mut [&mut d0, &mut d1], &idx);
    assert!(
        err.contains("srcs (one per table entry): expected 2 elements, found 1"),
        "{err}"
    );
    let short_idx = device.upload_new("idx", &[0u32, 1])?;
    let err = launch(&[&s0, &s1], &mut [&mut d0, &mut d1], &short_idx);
    assert!(
        err.contains("idx (the table's batch): expected 3 elements, found 2"),
        "{err}"
    );
    Ok(())
}

/// A replay buffer's fields, or a batch of them.
#[derive(StepBuffer)]
pub struct Fields {
    pub s: DeviceBuffer<f32>,
    pub a: DeviceBuffer<f32>,
    pub r: DeviceBuffer<f32>,
}

/// Widths of `Fields`' rows: s, a, r.
const FIELD_WIDTHS: [usize; 3] = [64, 8, 1];

impl Fields {
    fn upload(device: &Device, [s, a, r]: [&[f32]; 3]) -> Result<Fields> {
        Ok(Fields {
            s: device.upload_new("s", s)?,
            a: device.upload_new("a", a)?,
            r: device.upload_new("r", r)?,
        })
    }
}

/// Draws a batch's rows, gathers every field of them in one launch, advances the
/// generator: each replay gathers another batch.
#[stepgraph::step(streams(main), kernels = Kernels)]
mod sample {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub rng: DeviceRng,
        pub idx: DeviceBuffer<u32>,
        pub table: GatherTable,
        pub replay: Fields,
        pub batch: Fields,
    }

    fn draw(
        s: &CaptureStream<'_>,
        k: &Kernels,
        rng: &DeviceRng,
        table: &GatherTable,
        idx: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        k.rng_indices(s, rng, Substream(0), table.rows(), idx)
    }

    fn gather(
        s: &CaptureStream<'_>,
        k: &Kernels,
        table: &GatherTable,
        idx: &DeviceBuffer<u32>,
        replay: &Fields,
        batch: &mut Fields,
    ) -> Result<()> {
        let Fields {
            s: bs,
            a: ba,
            r: br,
        } = batch;
        let srcs = [&replay.s, &replay.a, &replay.r];
        k.gather_rows_table(s, table, idx, &srcs, &mut [bs, ba, br])
    }

    fn advance(s: &CaptureStream<'_>, k: &Kernels, rng: &mut DeviceRng) -> Result<()> {
        k.rng_advance(s, rng)
    }
}

#[test]
fn gpu_a_captured_gather_table_is_one_kernel_node_and_gathers_each_replays_rows() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let (seed, rows, batch) = (5u64, 1000, 256);
    let mut rng = Rng::new(93);
    let replay_host: Vec<Vec<f32>> = FIELD_WIDTHS
        .iter()
        .map(|&w| rng.vec_nonzero(rows * w, -1.0, 1.0))
        .collect();
    let nan: Vec<Vec<f32>> = FIELD_WIDTHS
        .iter()
        .map(|&w| vec![f32::NAN; batch * w])
        .collect();
    let replay = Fields::upload(&device, [&replay_host[0], &replay_host[1], &replay_host[2]])?;
    let out = Fields::upload(&device, [&nan[0], &nan[1], &nan[2]])?;
    let table = GatherTable::new(
        &device,
        rows,
        batch,
        &[
            (&replay.s, &out.s, 64),
            (&replay.a, &out.a, 8),
            (&replay.r, &out.r, 1),
        ],
    )?;
    let buffers = sample::Buffers {
        rng: DeviceRng::new(&device, seed)?,
        idx: device.upload_new("idx", &vec![u32::MAX; batch])?,
        table,
        replay,
        batch: out,
    };
    let mut step = sample::Step::new(&device, k, buffers, sample::Config {})?;
    // Three kernel nodes: the indices, one gather of all three fields, the advance.
    let counts = step.executor().node_counts()?;
    assert_eq!(counts.kernels, 3, "{counts:?}");
    for replay in 0..3u64 {
        step.replay()?;
        let idx = step.download(|b| &b.idx)?;
        assert_eq!(
            idx,
            rng_indices_reference(seed, replay, Substream(0), rows as u32, batch)
        );
        let got = step.download_many(|b| vec![&b.batch.s, &b.batch.a, &b.batch.r])?;
        for (f, w) in FIELD_WIDTHS.iter().enumerate() {
            assert_eq!(
                bits(&[&got[f]]),
                bits(&[&gather_rows_reference(&replay_host[f], &idx, *w)]),
                "replay {replay}, field {f}"
            );
        }
    }
    Ok(())
}
