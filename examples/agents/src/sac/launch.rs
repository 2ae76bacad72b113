//! The shape of a `sac_update` launch (`cuda/sac_update.cu`): its block, its shared
//! memory, and how many blocks an agent takes on the GPU at hand, so the kernel registry
//! can opt the update in when it loads.

use stepgraph::{Error, Kernel, Result};

use crate::kernels::has_clusters;

/// The largest batch `sac_update` takes (`SAC_MAX_BATCH` in `cuda/sac_update.cu`).
pub const SAC_MAX_BATCH: usize = 256;
/// Threads of a `sac_update` block (`SAC_UPDATE_THREADS`).
pub const SAC_UPDATE_THREADS: u32 = 256;
/// Rows of the batch a block puts through the networks at once (`CHUNK`).
pub const SAC_CHUNK: usize = 32;
/// Blocks per agent, one thread-block cluster, where the loaded image is for compute
/// capability 9.0 or newer (`SAC_CLUSTER`); older images take one block per agent.
pub const SAC_CLUSTER: u32 = 8;
/// Floats of `sac_update`'s shared memory, for any batch (`SAC_UPDATE_SMEM_FLOATS`).
const SAC_UPDATE_SMEM_FLOATS: usize = 37_108;

/// Bytes of dynamic shared memory a `sac_update` block takes: 145 KiB, whatever the batch
/// (`cuda/sac_update.cu` lists the regions).
pub const fn sac_update_smem_bytes() -> usize {
    4 * SAC_UPDATE_SMEM_FLOATS
}

/// Opts `update` (the registry's `sac_update`) in to [`sac_update_smem_bytes`] and says
/// how many blocks an agent takes, from the `target` of the image the driver loaded:
/// [`SAC_CLUSTER`] for compute capability 9.0 or newer (built with `__cluster_dims__`),
/// else 1. `None` where the device grants a block less shared memory (the 99 KiB of the
/// RTX 30 and 40 series), which leaves the DQN kernels usable there.
pub(crate) fn opt_in_sac_update(update: &Kernel, target: Option<&str>) -> Result<Option<u32>> {
    match update.set_max_dynamic_shared(sac_update_smem_bytes() as u32) {
        Ok(()) => {}
        Err(Error::DynamicShared { .. }) => return Ok(None),
        Err(other) => return Err(other),
    }
    Ok(Some(if target.is_some_and(has_clusters) {
        SAC_CLUSTER
    } else {
        1
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_update_sizes_agree_with_the_kernel_source() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda/sac_update.cu");
        let defines = stepgraph_testkit::cuda_defines(path).expect("sac_update.cu reads");
        let get = |name: &str| -> usize { defines[name].parse().expect(name) };
        assert_eq!(get("SAC_MAX_BATCH"), SAC_MAX_BATCH);
        assert_eq!(get("SAC_UPDATE_THREADS"), SAC_UPDATE_THREADS as usize);
        assert_eq!(get("CHUNK"), SAC_CHUNK);
        assert_eq!(get("SAC_UPDATE_SMEM_FLOATS"), SAC_UPDATE_SMEM_FLOATS);
        assert_eq!(get("SAC_CLUSTER"), SAC_CLUSTER as usize);
        // Within what the A100 grants a block (163 KiB), and rejax's batch fits.
        assert!(sac_update_smem_bytes() <= 163 * 1024);
        assert!(crate::sac::SacConfig::rejax_pendulum(0).batch_size <= SAC_MAX_BATCH);
    }
}
