//! stepgraph's generic CUDA kernels, for any step: elementwise ops, a fill, the
//! fork_join example's iterated affine map, an optimizer step over a whole model (the
//! global gradient norm, Adam with global-norm clipping over a [`ParamTable`] in one
//! launch, or both in two with [`Kernels::grad_norm_adam`], Adam's step count on the
//! device in an [`AdamClock`], deterministic column sums, whose first pass a kernel of
//! your own may form as it writes the tensor: [`ColumnSumsPlan`],
//! [`Kernels::column_sums_finish`]), multi-tensor ops over a [`PairTable`]
//! ([`Kernels::axpby_table`], a Polyak target update in one launch), and a counter-based
//! random generator whose state lives on the device ([`DeviceRng`]: normals, uniforms, row
//! indices, and [`Kernels::gather_rows`] of the drawn rows, or
//! [`Kernels::gather_rows_table`] of several arrays at the same rows in one launch over a
//! [`GatherTable`], a replay buffer's fields into a batch), so that a replayed graph draws
//! fresh values with nothing from the host. A model's own kernels
//! live with the model, built the same way (the DQN trainer in `examples/dqn` is one).
//!
//! `build.rs` is a few lines on `stepgraph-build`, which compiles `cuda/*.cu` with nvcc (a
//! cubin for each of sm_80, sm_86, sm_89 and sm_90, and compute_80 PTX the driver
//! JIT-compiles elsewhere), embeds the images, and
//! generates the registry: [`ModuleId`] (one per file), [`KernelId`] (one per kernel) and
//! one typed launcher per kernel. [`Kernels`] loads the modules once per device (checking
//! each kernel's parameters against the driver's) and has a safe wrapper per kernel, which
//! checks sizes before launching ([`launch`] holds those checks, for other kernel crates
//! too). Each kernel has a CPU reference, `reference::<kernel>_reference`, for tests.
//!
//! The headers in `cuda/stepgraph/` (a thread's index, fixed-order warp, block and column
//! reductions, the generator's mixing function [`splitmix`]) are exported to the kernel crates that depend on this one: their `.cu`
//! files `#include "stepgraph/reduce.cuh"`.
//!
//! Kernels are loaded as modules (`cuModuleLoadData`) and launched with `cuLaunchKernel`
//! on the op's capture stream, so a step needs only the driver API: no CUDA runtime is
//! linked, the build needs no CUDA libraries, and one binary built on a machine without a
//! GPU runs on the GPU host unchanged.
//!
//! ```no_run
//! use stepgraph_kernels::Kernels;
//!
//! let device = stepgraph::Device::new(0)?;
//! let kernels = Kernels::load(&device)?;
//! // In an op: `kernels.chain_step(stream, &mut x, 64, 0.999, 0.001)?;`
//! # let _ = kernels;
//! # Ok::<(), stepgraph::Error>(())
//! ```

use stepgraph::{
    CaptureStream, Device, DeviceMem, DeviceMemMut, DeviceScalars, Error, Kernel, LaunchConfig,
    Module, Result,
};

/// The registry stepgraph-build generated from `cuda/*.cu`: ids, declarations, and the
/// typed launchers that the wrappers of [`Kernels`] call.
mod raw {
    stepgraph::include_kernels!();
}
pub use raw::{KernelId, ModuleId, NVCC_RELEASE, NVCC_VERSION};

pub mod launch;
mod multi_tensor;
mod optim;
mod random;
pub mod reference;

pub use multi_tensor::*;
pub use optim::*;
pub use random::*;

use launch::{elementwise_config, len_u32, same_len};

/// Blocks of a [`Kernels::chain_step`] launch, whatever the buffer's length: a small grid
/// on purpose, so that four such chains fit side by side on the H100's 132 SMs.
pub const CHAIN_STEP_BLOCKS: u32 = 16;

/// Threads per block of a [`Kernels::chain_step`] launch.
pub const CHAIN_STEP_THREADS: u32 = 256;

/// The loaded modules and kernels of this crate, with a typed launch wrapper per kernel.
///
/// Load it once per device, before building a step, and share it (`&Kernels`) with the
/// ops: loading a module inside a stream capture is not allowed.
///
/// ```no_run
/// use stepgraph::{CaptureStream, DeviceBuffer, Result};
/// use stepgraph_kernels::Kernels;
///
/// fn advance(k: &Kernels, stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
///     k.chain_step(stream, x, 256, 0.999, 0.001)
/// }
/// ```
#[derive(Debug)]
pub struct Kernels {
    raw: raw::Kernels,
}

impl Kernels {
    /// Loads every module into `device`'s context and looks up every kernel.
    ///
    /// Each module's newest cubin that the driver accepts is loaded (sm_90 on Hopper, sm_86
    /// on an A10); where none fits (a GPU newer than Hopper), its PTX is JIT-compiled
    /// instead, as it is for every module in the [portable mode](stepgraph::env::PORTABLE).
    /// If every image fails, the first one's error is returned. Each kernel's parameter list, as the driver
    /// reports it, is checked against its CUDA signature ([`Error::KernelSignature`]).
    pub fn load(device: &Device) -> Result<Kernels> {
        raw::Kernels::load(device).map(|raw| Kernels { raw })
    }

    /// A loaded module.
    pub fn module(&self, id: ModuleId) -> &Module {
        self.raw.module(id)
    }

    /// A kernel, for launches without a wrapper (checked against its parameter list when
    /// launched).
    pub fn kernel(&self, id: KernelId) -> &Kernel {
        self.raw.kernel(id)
    }

    /// `x[i] <- x[i] * a + b`, repeated `iters` times per element (one fused multiply-add
    /// per step; [`chain_step_reference`](reference::chain_step_reference) computes the same bits on the CPU).
    ///
    /// Always launches [`CHAIN_STEP_BLOCKS`] × [`CHAIN_STEP_THREADS`] threads, which stride
    /// over `x`: the fork_join example's workload, small enough that several chains run
    /// side by side. Pick `|a| < 1` (for instance `a = 0.999, b = 0.001`, whose fixed
    /// point is 1) so values stay bounded however large `iters` is.
    pub fn chain_step(
        &self,
        stream: &CaptureStream<'_>,
        x: &mut impl DeviceMemMut<f32>,
        iters: u32,
        a: f32,
        b: f32,
    ) -> Result<()> {
        let n = len_u32("chain_step: x", x.len())?;
        // SAFETY: the grid-stride loop touches x[i] only for i < n = x.len().
        unsafe {
            self.raw
                .chain_step(stream, chain_step_config(), x, n, iters, a, b)
        }
    }

    /// `y <- a * x + b * y`, elementwise (`fmaf(a, x, b * y)`).
    ///
    /// Fails with [`Error::LengthMismatch`] unless `x` and `y` have the same length.
    pub fn axpby(
        &self,
        stream: &CaptureStream<'_>,
        x: &impl DeviceMem<f32>,
        y: &mut impl DeviceMemMut<f32>,
        a: f32,
        b: f32,
    ) -> Result<()> {
        same_len("axpby: y (the length of x)", x.len(), y.len())?;
        let n = len_u32("axpby: y", y.len())?;
        // SAFETY: threads with i >= n return, and x and y both hold n elements (checked
        // above).
        unsafe { self.raw.axpby(stream, elementwise_config(n), x, y, n, a, b) }
    }

    /// `y <- y * s`, elementwise, where `s` is device scalar `index` of `scalars`, read
    /// from device memory when the kernel runs (so a replay sees the value refreshed
    /// before it, not the one at capture).
    ///
    /// Fails with [`Error::Invalid`] if `index` is out of range.
    pub fn scale_by_scalar(
        &self,
        stream: &CaptureStream<'_>,
        scalars: &DeviceScalars<f32>,
        index: usize,
        y: &mut impl DeviceMemMut<f32>,
    ) -> Result<()> {
        if index >= scalars.len() {
            return Err(Error::Invalid(format!(
                "scale_by_scalar: device scalar index {index} is out of range: there are {} values",
                scalars.len()
            )));
        }
        // In range of a u32 because scalars.len() is: it is a buffer's length, checked here.
        let count = len_u32("scale_by_scalar: scalars", scalars.len())?;
        let index = index as u32;
        debug_assert!(index < count);
        let n = len_u32("scale_by_scalar: y", y.len())?;
        let config = elementwise_config(n);
        // SAFETY: index < scalars.len() (checked above) and threads with i >= n = y.len()
        // return.
        unsafe {
            self.raw
                .scale_by_scalar(stream, config, scalars.on_device(), index, y, n)
        }
    }

    /// `flag <- x[index] > threshold` (1 or 0), one thread: a condition the device decides
    /// from the data. `flag` is one `u32`, a [`DeviceFlag`](stepgraph::DeviceFlag) for a
    /// `#[when(flag)]` op (or any one-element buffer); a NaN is not above anything.
    ///
    /// Fails with [`Error::Invalid`] if `index` is out of range of `x`, and with
    /// [`Error::LengthMismatch`] unless `flag` holds one element.
    pub fn flag_above(
        &self,
        stream: &CaptureStream<'_>,
        x: &impl DeviceMem<f32>,
        index: usize,
        threshold: f32,
        flag: &mut impl DeviceMemMut<u32>,
    ) -> Result<()> {
        if index >= x.len() {
            return Err(Error::Invalid(format!(
                "flag_above: index {index} is out of range: x has {} elements",
                x.len()
            )));
        }
        same_len("flag_above: flag", 1, flag.len())?;
        // In range of a u32 because x.len() is, checked here.
        len_u32("flag_above: x", x.len())?;
        let index = index as u32;
        // SAFETY: one thread reads x[index], in range (checked above), and writes the
        // flag's one element.
        unsafe {
            self.raw
                .flag_above(stream, elementwise_config(1), x, index, threshold, flag)
        }
    }

    /// `y[i] <- start + i * step` (`fmaf(i, step, start)`).
    pub fn fill_affine(
        &self,
        stream: &CaptureStream<'_>,
        y: &mut impl DeviceMemMut<f32>,
        start: f32,
        step: f32,
    ) -> Result<()> {
        let n = len_u32("fill_affine: y", y.len())?;
        // SAFETY: threads with i >= n = y.len() return.
        unsafe {
            self.raw
                .fill_affine(stream, elementwise_config(n), y, n, start, step)
        }
    }
}

// The CPU references of the elementwise kernels are in `reference.rs`.

fn chain_step_config() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (CHAIN_STEP_BLOCKS, 1, 1),
        block_dim: (CHAIN_STEP_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::{BLOCK_THREADS, tile_config};
    use crate::optim::column_sums_plan;
    use crate::reference::{axpby_reference, chain_step_reference, fill_affine_reference};

    /// The PTX ISA version written by nvcc 13.0; a 13.0 driver refuses newer PTX.
    const MAX_PTX_ISA: (u32, u32) = (9, 0);

    #[test]
    fn registry_lists_every_cu_file_in_slot_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");
        let mut stems: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "cu"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        stems.sort();
        let names: Vec<&str> = ModuleId::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names, stems);
        assert_eq!(ModuleId::COUNT, ModuleId::ALL.len());
        for (slot, id) in ModuleId::ALL.iter().enumerate() {
            assert_eq!(id.index(), slot);
        }
        for (slot, id) in KernelId::ALL.iter().enumerate() {
            assert_eq!(id.index(), slot);
        }
    }

    /// The kernels the wrappers launch, module by module (the list this crate kept by hand
    /// before the registry was generated from the sources).
    #[test]
    fn the_generated_registry_has_every_kernel_in_source_order() {
        let names: Vec<(&str, &str)> = KernelId::ALL
            .iter()
            .map(|k| (k.module().name(), k.name()))
            .collect();
        let want = [
            ("chain", "chain_step"),
            ("elementwise", "axpby"),
            ("elementwise", "scale_by_scalar"),
            ("elementwise", "fill_affine"),
            ("elementwise", "flag_above"),
            ("multi_tensor", "axpby_table"),
            ("optim", "grad_sq_norm_partial"),
            ("optim", "grad_sq_norm_finish"),
            ("optim", "adam_clip_update"),
            ("optim", "adam_clip_update_partials"),
            ("optim", "adam_tick"),
            ("optim", "column_sums_partial"),
            ("optim", "column_sums_finish"),
            ("random", "rng_normal"),
            ("random", "rng_uniform"),
            ("random", "rng_indices"),
            ("random", "rng_advance"),
            ("random", "gather_rows"),
            ("random", "gather_rows_table"),
        ];
        assert_eq!(names, want);
        let axpby = KernelId::Axpby.decl();
        let params: Vec<(&str, &str, usize)> = axpby
            .params
            .iter()
            .map(|p| (p.name, p.c_type, p.size))
            .collect();
        assert_eq!(
            params,
            [
                ("x", "const float*", 8),
                ("y", "float*", 8),
                ("n", "unsigned", 4),
                ("a", "float", 4),
                ("b", "float", 4)
            ]
        );
        assert_eq!(NVCC_RELEASE, NVCC_VERSION[1..].rsplit_once('.').unwrap().0);
    }

    /// The embedded image of `kind` of a module.
    fn image(id: ModuleId, kind: stepgraph::kernel::ImageKind) -> &'static [u8] {
        id.decl()
            .images
            .iter()
            .find(|i| i.kind == kind)
            .unwrap_or_else(|| panic!("{id:?}: no {kind:?} image"))
            .bytes
    }

    #[test]
    fn every_cubin_is_a_cuda_elf_image() {
        for id in ModuleId::ALL {
            let cubin = image(id, stepgraph::kernel::ImageKind::Cubin);
            assert!(cubin.starts_with(b"\x7fELF"), "{id:?}: not an ELF image");
            // e_machine (little-endian u16 at offset 18) is EM_CUDA = 190.
            assert_eq!(u16::from_le_bytes([cubin[18], cubin[19]]), 190, "{id:?}");
            // A cubin for each generation from Ampere on, since none loads on an older one.
            let targets: Vec<&str> = id.decl().images.iter().map(|i| i.target).collect();
            for sm in ["sm_80", "sm_86", "sm_89", "sm_90"] {
                assert!(
                    targets.contains(&sm),
                    "{id:?}: no {sm} image in {targets:?}"
                );
            }
        }
    }

    #[test]
    fn every_ptx_targets_sm_80_with_an_isa_a_cuda_13_0_driver_reads() {
        for id in ModuleId::ALL {
            let bytes = image(id, stepgraph::kernel::ImageKind::Ptx);
            assert_eq!(bytes.last(), Some(&0), "{id:?}: PTX must be NUL-terminated");
            let text = std::str::from_utf8(&bytes[..bytes.len() - 1]).unwrap();
            assert!(
                text.lines().any(|l| l.trim() == ".target sm_80"),
                "{id:?}: no `.target sm_80` (the PTX is for every GPU from Ampere on)"
            );
            let version = text
                .lines()
                .find_map(|l| l.trim().strip_prefix(".version "))
                .unwrap_or_else(|| panic!("{id:?}: no .version"));
            let (major, minor) = version.trim().split_once('.').unwrap();
            let isa = (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap());
            assert!(
                isa <= MAX_PTX_ISA,
                "{id:?}: PTX ISA {version} is newer than 9.0"
            );
        }
    }

    #[test]
    fn every_kernel_is_an_entry_of_its_module() {
        for k in KernelId::ALL {
            let ptx = String::from_utf8_lossy(image(k.module(), stepgraph::kernel::ImageKind::Ptx));
            let entry = format!(".entry {}(", k.name());
            assert!(
                ptx.contains(&entry),
                "{k:?}: `{}` is not an entry of module `{}`",
                k.name(),
                k.module().name()
            );
        }
    }

    #[test]
    fn chain_step_reference_applies_fused_steps() {
        // Exact in binary: 0 -> 1 -> 1.5 -> 1.75, and 2 is the fixed point b / (1 - a).
        let mut x = [0.0f32, 1.0, 2.0, -2.0];
        chain_step_reference(&mut x, 3, 0.5, 1.0);
        assert_eq!(x, [1.75, 1.875, 2.0, 1.5]);

        let mut y = [5.0f32];
        chain_step_reference(&mut y, 0, 0.5, 1.0);
        assert_eq!(y, [5.0]);
    }

    #[test]
    fn chain_step_reference_stays_bounded_with_the_documented_coefficients() {
        let mut x = [-3.0f32, 0.0, 0.5, 1.0, 4.0];
        chain_step_reference(&mut x, 20_000, 0.999, 0.001);
        for v in x {
            assert!(
                (v - 1.0).abs() < 1e-3,
                "{v} did not approach the fixed point 1"
            );
        }
    }

    #[test]
    fn chain_step_reference_rounds_once_per_step() {
        // (1 + e)(1 - e) = 1 - e^2 rounds to 1 on its own, so `v * a + b` gives 0; one
        // rounding of the fused operation keeps -e^2, as the GPU's fmaf does.
        let e = f32::EPSILON;
        let (v, a, b) = (1.0 + e, 1.0 - e, -1.0);
        let mut x = [v];
        chain_step_reference(&mut x, 1, a, b);
        assert_eq!(x[0], -e * e);
        assert_eq!(v * a + b, 0.0);
    }

    #[test]
    fn elementwise_references() {
        let mut y = [1.0f32, 2.0, 3.0];
        axpby_reference(&[10.0, 20.0, 30.0], &mut y, 2.0, 0.5);
        assert_eq!(y, [20.5, 41.0, 61.5]);

        let mut z = [0.0f32; 4];
        fill_affine_reference(&mut z, 1.0, 0.25);
        assert_eq!(z, [1.0, 1.25, 1.5, 1.75]);
    }

    #[test]
    fn elementwise_grids_cover_every_element_with_at_least_one_block() {
        for (n, blocks) in [(0u32, 1u32), (1, 1), (256, 1), (257, 2), (1 << 20, 4096)] {
            let cfg = elementwise_config(n);
            assert_eq!(cfg.grid_dim, (blocks, 1, 1), "n = {n}");
            assert_eq!(cfg.block_dim, (BLOCK_THREADS, 1, 1));
        }
        // The last thread index of the largest grid still fits in 32 bits.
        let cfg = elementwise_config(u32::MAX);
        assert!(u64::from(cfg.grid_dim.0) * u64::from(BLOCK_THREADS) <= 1 << 32);
    }

    #[test]
    fn chain_step_grid_is_fixed() {
        let cfg = chain_step_config();
        assert_eq!(cfg.grid_dim, (16, 1, 1));
        assert_eq!(cfg.block_dim, (256, 1, 1));
    }

    #[test]
    fn sizes_are_checked_before_launch() {
        assert!(same_len("axpby", 4, 4).is_ok());
        let err = same_len("axpby: y (the length of x)", 4, 3).unwrap_err();
        assert!(matches!(
            err,
            Error::LengthMismatch {
                expected: 4,
                found: 3,
                ..
            }
        ));
        assert!(len_u32("x", u32::MAX as usize).is_ok());
        let err = len_u32("chain_step: x", u32::MAX as usize + 1).unwrap_err();
        assert!(err.to_string().contains("chain_step: x"), "{err}");
    }

    /// `#define NAME value` lines of a file in `cuda/`.
    fn cuda_defines(file: &str) -> std::collections::HashMap<String, String> {
        let path = format!("{}/cuda/{file}", env!("CARGO_MANIFEST_DIR"));
        stepgraph_testkit::cuda_defines(&path).unwrap()
    }

    #[test]
    fn table_constants_match_the_cuda_source() {
        let optim = cuda_defines("optim.cu");
        assert_eq!(optim["PARAM_TABLE_WORDS"], PARAM_TABLE_WORDS.to_string());
        assert_eq!(optim["OPTIM_CHUNK"], OPTIM_CHUNK.to_string());
        assert_eq!(optim["ADAM_LR"], ADAM_LR.to_string());
        assert_eq!(optim["ADAM_BIAS1"], ADAM_BIAS1.to_string());
        assert_eq!(optim["ADAM_BIAS2"], ADAM_BIAS2.to_string());
        let multi = cuda_defines("multi_tensor.cu");
        assert_eq!(multi["PAIR_TABLE_WORDS"], PAIR_TABLE_WORDS.to_string());
        assert_eq!(multi["PAIR_CHUNK"], PAIR_CHUNK.to_string());
        let random = cuda_defines("random.cu");
        assert_eq!(random["GATHER_TABLE_WORDS"], GATHER_TABLE_WORDS.to_string());
        assert_eq!(random["GATHER_CHUNK"], GATHER_CHUNK.to_string());
    }

    #[test]
    fn param_table_words_follow_the_documented_layout() {
        let entry = |base: u64, len: usize| ParamEntry {
            param: base,
            grad: base + 1,
            m: base + 2,
            v: base + 3,
            len,
        };
        let words = ParamTable::words(&[entry(100, 5), entry(200, 0), entry(300, 7)]).unwrap();
        assert_eq!(
            words,
            vec![
                100, 101, 102, 103, 5, 0, //
                200, 201, 202, 203, 0, 5, //
                300, 301, 302, 303, 7, 5,
            ]
        );
        assert_eq!(words.len(), 3 * PARAM_TABLE_WORDS);
        let e = ParamTable::words(&[entry(100, 5), entry(200, usize::MAX)])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "ParamTable: expected entry lengths that add up to at most {}, found a sum past \
                 it at entry 1 (length {})",
                u64::MAX,
                usize::MAX
            )
        );
    }

    #[test]
    fn adam_host_values_are_exact_in_f64_before_rounding() {
        let hyper = AdamHyper::default();
        let [max_norm, beta1, beta2, omb1, omb2, eps] = hyper.kernel_args();
        assert_eq!((max_norm, beta1, beta2, eps), (10.0, 0.9, 0.999, 1e-8));
        // 1 - beta in f64, then rounded: not 1 - 0.999f32 = 0.00099998713.
        assert_eq!((omb1, omb2), (0.1, 0.001));
        let s = AdamScalars::at_step(3e-4, &hyper, 2);
        assert_eq!(s.values(), [3e-4, 0.19, (1.0 - 0.999f64 * 0.999) as f32]);
        assert_eq!(ADAM_SCALARS, 3);
    }

    #[test]
    fn adam_powers_by_squaring_are_the_powi_values() {
        // at_step moved from f64::powi to a documented order the device repeats; on this
        // platform powi is compiler-rt's __powidf2, the same order, so no value changed.
        for beta in [0.9f64, 0.999, 0.99, 0.5, 0.999_999] {
            for t in (0..5000).chain([65_535, 1 << 20, 1 << 30, i32::MAX as u32]) {
                assert_eq!(
                    optim::pow_by_squaring(beta, t).to_bits(),
                    beta.powi(t as i32).to_bits(),
                    "{beta}^{t}"
                );
            }
        }
        let hyper = AdamHyper::default();
        assert_eq!(
            AdamScalars::at_step(1e-3, &hyper, u32::MAX),
            AdamScalars::at_step(1e-3, &hyper, i32::MAX as u32)
        );
    }

    #[test]
    fn column_reduction_plans_cover_every_row_once() {
        for (rows, cols) in [
            (1, 1),
            (33, 1),
            (1000, 70),
            (16384, 256),
            (524_288, 256),
            (524_288, 64),
            (7, 5000),
        ] {
            for target in [128, 256] {
                let (col_blocks, chunks, per) = launch::row_chunk_plan(rows, cols, target);
                assert_eq!(col_blocks, cols.div_ceil(32));
                assert!(
                    chunks * per >= rows && (chunks - 1) * per < rows,
                    "{rows} x {cols} in chunks of {target}"
                );
                assert!(
                    col_blocks * chunks <= 1024.max(col_blocks),
                    "{rows} x {cols} in chunks of {target}"
                );
            }
            assert_eq!(
                column_sums_plan(rows, cols),
                launch::row_chunk_plan(rows, cols, 256)
            );
            assert_eq!(column_sums_scratch_len(rows, cols), {
                let (_, chunks, _) = column_sums_plan(rows, cols);
                chunks * cols
            });
            // The public plan a fused first pass launches is the same split.
            let plan = ColumnSumsPlan::new(rows, cols);
            assert_eq!(
                (plan.col_blocks, plan.chunks, plan.rows_per_chunk),
                column_sums_plan(rows, cols)
            );
            assert_eq!(plan.partials_len(cols), column_sums_scratch_len(rows, cols));
            let grid = plan.launch().unwrap();
            assert_eq!(
                grid.grid_dim,
                (plan.col_blocks as u32, plan.chunks as u32, 1)
            );
            assert_eq!(grid.block_dim, (32, 32, 1));
        }
    }

    #[test]
    fn tile_grids_have_at_least_one_block_each_way() {
        assert_eq!(tile_config(0, 3).grid_dim, (1, 3, 1));
        assert_eq!(tile_config(2, 1).block_dim, (32, 32, 1));
    }
}
