//! Multi-tensor ops: one launch over every `(x, y)` pair of a [`PairTable`]
//! (`cuda/multi_tensor.cu`), for updates that touch a whole network, such as a Polyak
//! (soft) target update `target ← τ θ + (1 − τ) target`.

use stepgraph::{CaptureStream, Device, DeviceBuffer, Error, LaunchConfig, Result};

use crate::Kernels;
use crate::launch::{BLOCK_THREADS, len_u32};

/// Words (`u64`) per entry of the device pair table (`PAIR_TABLE_WORDS` in
/// `cuda/multi_tensor.cu`).
pub const PAIR_TABLE_WORDS: usize = 4;

/// Elements of the concatenated pairs that one block of a multi-tensor kernel takes
/// (`PAIR_CHUNK`): two per thread, as the optimizer's [`OPTIM_CHUNK`](crate::OPTIM_CHUNK).
pub const PAIR_CHUNK: usize = 512;

/// A table of `(x, y)` tensor pairs, each pair of one length: built once on the host,
/// uploaded once, read by [`Kernels::axpby_table`], which then covers every pair in one
/// launch.
///
/// Device layout: `T` entries of [`PAIR_TABLE_WORDS`] `u64`s, entry `k` at words
/// `4k .. 4k + 4`: `[x, y, len, start]`, the two addresses, the pair's length, and
/// `start`, the sum of the lengths of entries `0..k`.
///
/// As with [`ParamTable`](crate::ParamTable), the kernels reach the buffers through these
/// addresses, so the launch wrappers take the buffers too and check them against the
/// table: a launch only touches buffers its caller holds borrows of.
///
/// ```no_run
/// use stepgraph::DeviceBuffer;
/// use stepgraph_kernels::PairTable;
///
/// # fn build(device: &stepgraph::Device, online: &[DeviceBuffer<f32>], target: &[DeviceBuffer<f32>]) -> stepgraph::Result<()> {
/// // The online network's tensors are x, the target network's y.
/// let pairs: Vec<_> = online.iter().zip(target).collect();
/// let polyak = PairTable::new(device, &pairs)?;
/// // In an op, with `online: &[&DeviceBuffer<f32>]` and `target: &mut [&mut DeviceBuffer<f32>]`:
/// // k.axpby_table(stream, &polyak, online, target, tau, 1.0 - tau)?;
/// # let _ = polyak;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PairTable {
    table: DeviceBuffer<u64>,
    /// `(x address, y address, len)` per entry, in table order.
    entries: Vec<(u64, u64, usize)>,
    total: usize,
}

// SAFETY: device memory (the table's words) and the host's copy of the entries, plain
// data that only `new` writes; an op reaches the table through the borrow it is given.
unsafe impl stepgraph::StepBuffer for PairTable {}

impl PairTable {
    /// Builds and uploads the table of `pairs` (blocking: call it when building the
    /// step, not in an op).
    ///
    /// Fails with [`Error::LengthMismatch`] naming the pair whose `x` and `y` differ in
    /// length, and with [`Error::Invalid`] if there are no elements at all or too many
    /// for the kernels' 32-bit block and entry counts.
    pub fn new(
        device: &Device,
        pairs: &[(&DeviceBuffer<f32>, &DeviceBuffer<f32>)],
    ) -> Result<PairTable> {
        let mut entries = Vec::with_capacity(pairs.len());
        for (k, (x, y)) in pairs.iter().enumerate() {
            // A longer y would keep its tail; a shorter one would be written past its end.
            if x.len() != y.len() {
                return Err(Error::LengthMismatch {
                    what: format!("PairTable: y of pair {k} (the length of its x)"),
                    expected: x.len(),
                    found: y.len(),
                });
            }
            entries.push((x.device_address(), y.device_address(), x.len()));
        }
        let words = PairTable::words(&entries)?;
        let total = entries.iter().map(|e| e.2).sum::<usize>();
        if total == 0 {
            return Err(Error::Invalid(
                "PairTable: expected at least one element, found none".into(),
            ));
        }
        len_u32("PairTable: entries", entries.len())?;
        len_u32("PairTable: blocks", total.div_ceil(PAIR_CHUNK))?;
        let table = device.upload_new("pair table", &words)?;
        Ok(PairTable {
            table,
            entries,
            total,
        })
    }

    /// The table's words (see the layout above). Fails when the lengths add up past
    /// `usize::MAX`: a wrapped `start` would send the kernel to the wrong element.
    fn words(entries: &[(u64, u64, usize)]) -> Result<Vec<u64>> {
        let mut start = 0usize;
        let mut words = Vec::with_capacity(entries.len() * PAIR_TABLE_WORDS);
        for (k, &(x, y, len)) in entries.iter().enumerate() {
            words.extend_from_slice(&[x, y, len as u64, start as u64]);
            start = start.checked_add(len).ok_or_else(|| {
                Error::Invalid(format!(
                    "PairTable: expected pair lengths that add up to at most {}, found a sum \
                     past it at pair {k} (length {len})",
                    usize::MAX
                ))
            })?;
        }
        Ok(words)
    }

    /// Pairs in the table.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no pairs (never, for a built one; for symmetry with `len`).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Elements of all pairs together.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The table as the kernels read it ([`PAIR_TABLE_WORDS`] words per entry), for a
    /// crate's own multi-tensor kernels.
    pub fn on_device(&self) -> &DeviceBuffer<u64> {
        &self.table
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.total.div_ceil(PAIR_CHUNK) as u32, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Checks that `xs` and `ys` are the table's buffers, in table order.
    fn check(
        &self,
        what: &str,
        xs: &[&DeviceBuffer<f32>],
        ys: &[&mut DeviceBuffer<f32>],
    ) -> Result<()> {
        let recorded: Vec<[(u64, usize); 2]> = self
            .entries
            .iter()
            .map(|&(x, y, len)| [(x, len), (y, len)])
            .collect();
        let xs = xs.iter().map(|b| (b.device_address(), b.len())).collect();
        let ys = ys.iter().map(|b| (b.device_address(), b.len())).collect();
        check_table_buffers(
            what,
            "pair",
            [("xs", "x"), ("ys", "y")],
            &recorded,
            [xs, ys],
        )
    }
}

/// The buffers a launch over a table of tensors is given, against the table's record of
/// them: on each of the two sides one buffer per entry, in table order, each at the
/// address and of the length recorded (a launch then writes only buffers its caller
/// borrowed). `item` names an entry in the errors ("pair", "entry"), `sides` each side's
/// name in the plural (the count) and in the singular (one buffer); `found` holds each
/// side's `(address, length)`s.
pub(crate) fn check_table_buffers(
    what: &str,
    item: &str,
    sides: [(&str, &str); 2],
    recorded: &[[(u64, usize); 2]],
    found: [Vec<(u64, usize)>; 2],
) -> Result<()> {
    for ((plural, _), side) in sides.iter().zip(&found) {
        if side.len() != recorded.len() {
            return Err(Error::LengthMismatch {
                what: format!("{what}: {plural} (one per table {item})"),
                expected: recorded.len(),
                found: side.len(),
            });
        }
    }
    for (k, entry) in recorded.iter().enumerate() {
        for (s, &(addr, len)) in entry.iter().enumerate() {
            let (got_addr, got_len) = found[s][k];
            if got_addr != addr || got_len != len {
                return Err(Error::Invalid(format!(
                    "{what}: expected {item} {k}'s {} to be the table's buffer ({len} \
                     elements at {addr:#x}), found {got_len} elements at {got_addr:#x}",
                    sides[s].1
                )));
            }
        }
    }
    Ok(())
}

impl Kernels {
    /// `y ← a·x + b·y` over every pair of `table` in one launch, each element as
    /// [`Kernels::axpby`] computes it (`fmaf(a, x, b * y)`), so the same bits as one
    /// `axpby` per pair ([`axpby_reference`](crate::reference::axpby_reference) per pair is the CPU
    /// version). For a Polyak update, `x` the online network, `y` the target, `a = τ`,
    /// `b = 1 − τ`.
    ///
    /// `xs` and `ys` must be the table's buffers, in table order (checked by address and
    /// length). One block of 256 per [`PAIR_CHUNK`] elements.
    pub fn axpby_table(
        &self,
        stream: &CaptureStream<'_>,
        table: &PairTable,
        xs: &[&DeviceBuffer<f32>],
        ys: &mut [&mut DeviceBuffer<f32>],
        a: f32,
        b: f32,
    ) -> Result<()> {
        table.check("axpby_table", xs, ys)?;
        let count = table.entries.len() as u32;
        let total = table.total as u64;
        // SAFETY: every address in the table is one of the buffers of `xs` and `ys`
        // (checked above, with its length), which this call borrows (`ys` mutably, so no
        // y is another pair's x or y), and block b touches elements [b PAIR_CHUNK, ..) <
        // total only.
        unsafe {
            self.raw
                .axpby_table(stream, table.config(), &table.table, count, total, a, b)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_table_buffers;

    /// The check names the side and the entry that differ, as the GPU tests expect.
    #[test]
    fn a_launch_is_refused_buffers_that_are_not_the_tables() {
        let recorded = [[(0x100, 4), (0x200, 4)], [(0x300, 2), (0x400, 2)]];
        let sides = [("xs", "x"), ("ys", "y")];
        let good = || [vec![(0x100, 4), (0x300, 2)], vec![(0x200, 4), (0x400, 2)]];
        check_table_buffers("t", "pair", sides, &recorded, good()).unwrap();
        let mut wrong = good();
        wrong[1][0] = (0x208, 4);
        let e = check_table_buffers("t", "pair", sides, &recorded, wrong).unwrap_err();
        assert!(
            e.to_string()
                .contains("expected pair 0's y to be the table's buffer (4 elements at 0x200), found 4 elements at 0x208"),
            "{e}"
        );
        let mut short = good();
        short[0].pop();
        let e = check_table_buffers("t", "pair", sides, &recorded, short).unwrap_err();
        assert!(
            e.to_string()
                .contains("xs (one per table pair): expected 2 elements, found 1"),
            "{e}"
        );
        let mut longer = good();
        longer[0][1] = (0x300, 3);
        let e = check_table_buffers(
            "t",
            "entry",
            [("srcs", "src"), ("dsts", "dst")],
            &recorded,
            longer,
        )
        .unwrap_err();
        assert!(e.to_string().contains("entry 1's src"), "{e}");
    }

    use super::*;

    #[test]
    fn pair_table_words_follow_the_documented_layout() {
        let words = PairTable::words(&[(10, 11, 3), (20, 21, 0), (30, 31, 5)]).unwrap();
        assert_eq!(words, [10, 11, 3, 0, 20, 21, 0, 3, 30, 31, 5, 3]);
        let err = PairTable::words(&[(1, 2, usize::MAX), (3, 4, 1)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("at pair 1"), "{err}");
    }
}
