//! The kernels of `cuda/watch.cu`: the step's health, latched on the device for the host
//! to read back late.

use super::*;

/// The words of the step's watch buffer (`cuda/watch.cu`, which has the same numbers), and
/// what the host reads back from it: the latest replay's losses and, latched at the first
/// replay that was not finite, that replay's number, losses and the non-finite elements of
/// every gradient. From that replay on no update is applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Watch {
    /// Replays the watch has seen (the step's replays, eager runs included).
    pub replays: u32,
    /// The latest replay's seven losses (L, L_td, L_iql, L_iqn, L_attn, L_cql, L_conf).
    pub losses: [f32; 7],
    /// The latest replay's sum of squares of the gradients.
    pub sq_norm: f32,
    /// The first replay that was not finite, with what it found; `None` while all are.
    pub bad: Option<BadReplay>,
}

/// What the watch latched at the first replay that was not finite.
#[derive(Clone, Debug, PartialEq)]
pub struct BadReplay {
    /// Its number (1 for the first replay the watch saw).
    pub replay: u32,
    pub losses: [f32; 7],
    pub sq_norm: f32,
    /// Per gradient tensor, in the parameter table's order: NaN and Inf elements.
    pub non_finite: Vec<(u32, u32)>,
}

impl Watch {
    /// Words before the per-tensor counts.
    pub const HEADER: usize = 18;
    pub(super) const REPLAYS: usize = 0;
    pub(super) const BAD_REPLAY: usize = 1;
    pub(super) const LOSSES: usize = 2;
    pub(super) const SQ_NORM: usize = 9;
    pub(super) const BAD_LOSSES: usize = 10;
    pub(super) const BAD_SQ_NORM: usize = 17;

    /// Words of the watch buffer for `tensors` gradient tensors.
    pub fn words(tensors: usize) -> usize {
        Self::HEADER + 2 * tensors
    }

    /// The watch as read back (`words(tensors)` words); fails for another length.
    pub fn parse(words: &[u32], tensors: usize) -> Result<Watch> {
        check_len(
            "watch: the words read back",
            words.len(),
            Self::words(tensors),
        )?;
        let f = |i: usize| f32::from_bits(words[i]);
        let seven = |at: usize| std::array::from_fn(|i| f(at + i));
        let bad = match words[Self::BAD_REPLAY] {
            0 => None,
            replay => Some(BadReplay {
                replay,
                losses: seven(Self::BAD_LOSSES),
                sq_norm: f(Self::BAD_SQ_NORM),
                non_finite: words[Self::HEADER..]
                    .chunks_exact(2)
                    .map(|c| (c[0], c[1]))
                    .collect(),
            }),
        };
        Ok(Watch {
            replays: words[Self::REPLAYS],
            losses: seven(Self::LOSSES),
            sq_norm: f(Self::SQ_NORM),
            bad,
        })
    }
}

impl Kernels {
    /// The step's watch (`cuda/watch.cu`), between the gradients' sum of squares and Adam:
    /// counts the replay, keeps its losses (from the three loss buffers, [`LOSS_SLOTS`]
    /// each) and `sq_norm[0]`, latches the first replay that is not finite (with the
    /// non-finite elements of every gradient of `table`), and from that replay on sets
    /// `sq_norm[0]` to NaN so that `adam_clip_update` applies no update. `watch` holds
    /// [`Watch::words`] words, zeroed before the first replay.
    pub fn watch_step(
        &self,
        stream: &CaptureStream<'_>,
        table: &stepgraph_kernels::ParamTable,
        losses: [&DeviceBuffer<f32>; 3],
        sq_norm: &mut DeviceBuffer<f32>,
        watch: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        let tensors = table.entries().len();
        for (what, l) in ["losses", "iqn_losses", "attn_losses"].iter().zip(losses) {
            check_len(
                &format!("watch_step: {what} ([LOSS_SLOTS])"),
                l.len(),
                LOSS_SLOTS,
            )?;
        }
        check_len("watch_step: sq_norm ([1])", sq_norm.len(), 1)?;
        check_len("watch_step: watch", watch.len(), Watch::words(tensors))?;
        let t = len_u32("watch_step: the table's tensors", tensors)?;
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block; thread 0 reads slots below LOSS_SLOTS of each loss buffer and
        // sq_norm[0] (lengths checked above), the counts land at words below
        // Watch::words(T) = watch.len(), and every gradient read is an element of a table
        // entry (its address and length, checked when the table was built).
        unsafe {
            self.raw.watch_step(
                stream,
                config,
                table.on_device(),
                t,
                losses[0],
                losses[1],
                losses[2],
                sq_norm,
                watch,
            )
        }
    }
}
