//! The DQN step's kernels (`cuda/*.cu`, MODEL.md), built by stepgraph-build like any
//! user crate's, with a safe wrapper each that checks sizes before it launches; the
//! optimizer's and the elementwise kernels come from `stepgraph-kernels`.

use std::sync::Arc;

use stepgraph::{CaptureStream, Device, DeviceBuffer, Error, LaunchConfig, Result};
use stepgraph_kernels::launch::{
    BLOCK_THREADS, check_len, check_scratch, len_u32, positive, product, row_chunk_plan, same_len,
    tile_config,
};

/// The registry stepgraph-build generated from `cuda/*.cu`.
mod raw {
    stepgraph::include_kernels!();
}
pub use raw::{KernelId, ModuleId};

/// The DQN step's kernels and the generic ones it uses, loaded once per device.
#[derive(Debug)]
pub struct Kernels {
    raw: raw::Kernels,
    /// The optimizer's and the elementwise kernels (`stepgraph-kernels`).
    pub generic: Arc<stepgraph_kernels::Kernels>,
    /// Whether the driver loaded `cuda/iqn.cu`'s sm_90a cubin, whose `iqn_wgmma` runs on
    /// Hopper's warpgroup MMA (elsewhere, the PTX fallback has only its trap).
    wgmma: bool,
    /// Whether the driver granted `attention_fused` its shared memory.
    attention_fused: bool,
}

impl Kernels {
    /// Loads this crate's modules and the generic kernels into `device`'s context; each
    /// kernel's parameter list is checked against its CUDA signature. Where the driver took
    /// the sm_90a cubin of `cuda/iqn.cu`, `iqn_wgmma` is also opted in to the shared memory
    /// it needs ([`IQN_WGMMA_SHARED_BYTES`]); if the driver refuses that, the load fails
    /// with [`Error::DynamicShared`] rather than quietly run the slower kernel.
    /// `attention_fused` is opted in to [`ATTENTION_FUSED_SHARED_BYTES`] on any GPU; where
    /// the driver refuses, [`Kernels::has_attention_fused`] says so and the step takes the
    /// unfused attention path.
    pub fn load(device: &Device) -> Result<Kernels> {
        let raw = raw::Kernels::load(device)?;
        let wgmma = raw
            .module(ModuleId::Iqn)
            .image()
            .is_some_and(|image| image.target == WGMMA_TARGET);
        if wgmma {
            raw.kernel(KernelId::IqnWgmma)
                .set_max_dynamic_shared(IQN_WGMMA_SHARED_BYTES)?;
        }
        // A GPU with less shared memory a block than Hopper refuses the opt-in: the step
        // then takes the unfused attention path, so the refusal is an answer, not an error.
        let attention_fused = match raw
            .kernel(KernelId::AttentionFused)
            .set_max_dynamic_shared(ATTENTION_FUSED_SHARED_BYTES)
        {
            Ok(()) => true,
            Err(Error::DynamicShared { .. }) => false,
            Err(other) => return Err(other),
        };
        Ok(Kernels {
            raw,
            generic: Arc::new(stepgraph_kernels::Kernels::load(device)?),
            wgmma,
            attention_fused,
        })
    }

    /// Whether `iqn_wgmma` can run here: the driver loaded the sm_90a cubin (a Hopper GPU
    /// and a build whose targets include `sm_90a`, as this crate's build.rs asks).
    pub fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    /// A kernel of this crate, for launches without a wrapper (checked against its
    /// parameter list when launched).
    pub fn kernel(&self, id: KernelId) -> &stepgraph::Kernel {
        self.raw.kernel(id)
    }
}

// The DQN step's kernels (MODEL.md), one module per `cuda/*.cu` file, re-exported here.
// Shapes are row-major (`[B, X]` puts row b at offset b X); the branches' tensors are packed
// as `[D, B, X]`. Every wrapper checks each buffer's length against the sizes it is given
// and fails with [`Error::LengthMismatch`] (or [`Error::Invalid`] for a size the kernel
// cannot take) before anything is launched. Buffers must be whole allocations, as every
// `DeviceBuffer` is: the kernels' 16-byte accesses rely on their alignment.
// A kernel whose bounds follow from its sizes declares them above its signature
// (`// stepgraph(unsafe): ...`: lengths, per-branch pointer tables, conditions, grid),
// and its wrapper calls the `_checked` method stepgraph-build generates from that; the
// others (the watch's table of tensors, a nullable output, plans that choose a path and
// size dynamic shared memory at run time) launch by hand with a `SAFETY:` comment.

/// A slot of the DQN step's loss buffer: [`LOSS_SLOTS`] floats, zeroed by a memset op at
/// the start of the step. Each loss kernel adds its term's value into the term's slot and
/// coefficient × value into [`LossSlot::Total`].
///
/// The same numbers are `#define`d in `cuda/dqn.cuh`; a unit test checks that the
/// two agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossSlot {
    /// `L`, the weighted total of the terms.
    Total = 0,
    /// `L_td` ([`Kernels::dueling_losses`]).
    Td = 1,
    /// `L_iql`, high and low heads together ([`Kernels::expectile_loss`], called twice).
    Iql = 2,
    /// `L_iqn` ([`Kernels::iqn_fused`], or [`Kernels::iqn_forward_backward`]).
    Iqn = 3,
    /// `L_attn` ([`Kernels::attn_pool_loss`]).
    Attn = 4,
    /// `L_cql` ([`Kernels::dueling_losses`]).
    Cql = 5,
    /// `L_conf` ([`Kernels::dueling_losses`]).
    Conf = 6,
}

impl LossSlot {
    /// Every slot that a kernel writes (slot 7 is spare).
    pub const ALL: [LossSlot; 7] = [
        LossSlot::Total,
        LossSlot::Td,
        LossSlot::Iql,
        LossSlot::Iqn,
        LossSlot::Attn,
        LossSlot::Cql,
        LossSlot::Conf,
    ];

    /// Its index in the loss buffer.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its term's name in `examples/dqn/MODEL.md` (`L`, `L_td`, ...).
    pub const fn model_name(self) -> &'static str {
        match self {
            LossSlot::Total => "L",
            LossSlot::Td => "L_td",
            LossSlot::Iql => "L_iql",
            LossSlot::Iqn => "L_iqn",
            LossSlot::Attn => "L_attn",
            LossSlot::Cql => "L_cql",
            LossSlot::Conf => "L_conf",
        }
    }

    /// Its `#define` in `cuda/dqn.cuh`.
    pub const fn macro_name(self) -> &'static str {
        match self {
            LossSlot::Total => "LOSS_TOTAL",
            LossSlot::Td => "LOSS_TD",
            LossSlot::Iql => "LOSS_IQL",
            LossSlot::Iqn => "LOSS_IQN",
            LossSlot::Attn => "LOSS_ATTN",
            LossSlot::Cql => "LOSS_CQL",
            LossSlot::Conf => "LOSS_CONF",
        }
    }
}

/// Length of the loss buffer that the loss kernels add into (see [`LossSlot`]).
pub const LOSS_SLOTS: usize = 8;

fn check_losses(what: &str, losses: &DeviceBuffer<f32>) -> Result<()> {
    same_len(what, LOSS_SLOTS, losses.len())
}

/// Dynamic shared memory a block may use without opting in to more.
const MAX_DYNAMIC_SMEM: usize = 48 * 1024;

/// The most branches the per-branch kernels take (`MAX_BRANCHES` in dqn.cuh, the length
/// of its pointer tables `BranchIn` and `BranchOut`).
pub const MAX_BRANCHES: usize = 8;

mod attention;
mod heads;
mod iqn;
mod replay;
mod watch;

pub use attention::*;
pub use heads::*;
pub use iqn::*;
pub use replay::*;
pub use watch::*;

#[cfg(test)]
mod tests;
