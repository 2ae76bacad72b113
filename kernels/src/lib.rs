//! stepgraph's CUDA kernels: CUDA C in `cuda/*.cu`, compiled by nvcc 13.0 when this crate
//! builds, embedded in the binary, and loaded once per device by [`Kernels::load`].
//!
//! # Why embedded cubins
//!
//! `build.rs` compiles each `.cu` file to a cubin for sm_90 (and to PTX as a fallback) and
//! embeds the bytes; at run time the driver loads them with `cuModuleLoadData`. The other
//! route, compiling the kernels with `<<<…>>>` launchers into a static library through the
//! `cc` crate, was rejected:
//!
//! - **No cudart link.** Triple-chevron launches go through the CUDA runtime, which would
//!   have to be linked (statically: the wheel toolkit has no unversioned `libcudart.so`).
//!   Loaded modules need only the driver API.
//! - **It fits cudarc's dynamic loading.** The workspace loads `libcuda` at run time
//!   (`dynamic-loading`), so the build needs no CUDA libraries and the binary none at link
//!   time; a module loaded through that same driver keeps it that way.
//! - **One binary, unchanged on the host.** Built on a development machine without a GPU
//!   (glibc 2.36), it runs on the H100 host as is: the kernels travel inside it, compiled
//!   by the same nvcc 13.0 that matches the host's driver.
//! - **Graph capture works directly.** Launches are `cuLaunchKernel` on the capture stream
//!   of [`stepgraph::CaptureStream`], which stream capture records as kernel nodes; no
//!   runtime-API launcher stands between the op and the stream.
//!
//! # Layout
//!
//! A registry in the style of candle-kernels: [`ModuleId`] (generated, one per `.cu`
//! file), [`KernelId`] (one per kernel, with its module and `extern "C"` name), and
//! [`Kernels`], which holds the loaded modules and kernels in fixed slots and has a typed
//! launch wrapper per kernel. Each wrapper checks sizes before launching and states, in
//! its `SAFETY` comment, why its arguments match the kernel's signature.
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
    CaptureStream, Device, DeviceBuffer, DeviceScalars, Error, Kernel, LaunchConfig, Module, Result,
};

mod registry {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}
pub use registry::*;

/// Threads per block of the elementwise kernels.
pub const BLOCK_THREADS: u32 = 256;

/// Blocks of a [`Kernels::chain_step`] launch, whatever the buffer's length: a small grid
/// on purpose, so that four such chains fit side by side on the H100's 132 SMs.
pub const CHAIN_STEP_BLOCKS: u32 = 16;

/// Threads per block of a [`Kernels::chain_step`] launch.
pub const CHAIN_STEP_THREADS: u32 = 256;

/// A kernel of this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelId {
    /// `chain_step` in `cuda/chain.cu`.
    ChainStep,
    /// `axpby` in `cuda/elementwise.cu`.
    Axpby,
    /// `scale_by_scalar` in `cuda/elementwise.cu`.
    ScaleByScalar,
    /// `fill_affine` in `cuda/elementwise.cu`.
    FillAffine,
}

impl KernelId {
    /// Every kernel, in slot order.
    pub const ALL: [KernelId; 4] = [
        KernelId::ChainStep,
        KernelId::Axpby,
        KernelId::ScaleByScalar,
        KernelId::FillAffine,
    ];

    /// How many kernels there are.
    pub const COUNT: usize = KernelId::ALL.len();

    /// The kernel's slot in [`KernelId::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The module that defines it.
    pub const fn module(self) -> ModuleId {
        match self {
            KernelId::ChainStep => ModuleId::Chain,
            KernelId::Axpby | KernelId::ScaleByScalar | KernelId::FillAffine => {
                ModuleId::Elementwise
            }
        }
    }

    /// Its `extern "C"` name in the `.cu` file.
    pub const fn name(self) -> &'static str {
        match self {
            KernelId::ChainStep => "chain_step",
            KernelId::Axpby => "axpby",
            KernelId::ScaleByScalar => "scale_by_scalar",
            KernelId::FillAffine => "fill_affine",
        }
    }
}

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
    modules: [Module; ModuleId::COUNT],
    kernels: [Kernel; KernelId::COUNT],
}

impl Kernels {
    /// Loads every module into `device`'s context and looks up every kernel.
    ///
    /// Each module's sm_90 cubin is loaded; if the driver refuses it (a GPU newer than
    /// Hopper cannot run sm_90 machine code), its PTX is JIT-compiled instead. If both
    /// fail, the cubin's error is returned.
    pub fn load(device: &Device) -> Result<Kernels> {
        let modules = fixed_slots(ModuleId::ALL.map(|id| {
            Module::load(device, id.name(), id.image()).or_else(|cubin_err| {
                Module::load(device, id.name(), id.ptx()).map_err(|_| cubin_err)
            })
        }))?;
        let kernels =
            fixed_slots(KernelId::ALL.map(|k| modules[k.module().index()].kernel(k.name())))?;
        Ok(Kernels { modules, kernels })
    }

    /// A loaded module.
    pub fn module(&self, id: ModuleId) -> &Module {
        &self.modules[id.index()]
    }

    /// A kernel, for launches without a wrapper.
    pub fn kernel(&self, id: KernelId) -> &Kernel {
        &self.kernels[id.index()]
    }

    /// `x[i] <- x[i] * a + b`, repeated `iters` times per element (one fused multiply-add
    /// per step; [`chain_step_reference`] computes the same bits on the CPU).
    ///
    /// Always launches [`CHAIN_STEP_BLOCKS`] × [`CHAIN_STEP_THREADS`] threads, which stride
    /// over `x`: the fork_join example's workload, small enough that several chains run
    /// side by side. Pick `|a| < 1` (for instance `a = 0.999, b = 0.001`, whose fixed
    /// point is 1) so values stay bounded however large `iters` is.
    pub fn chain_step(
        &self,
        stream: &CaptureStream<'_>,
        x: &mut DeviceBuffer<f32>,
        iters: u32,
        a: f32,
        b: f32,
    ) -> Result<()> {
        let n = len_u32("chain_step: x", x.len())?;
        let mut launch = stream.launch(self.kernel(KernelId::ChainStep));
        launch.buf_mut(x).arg(&n).arg(&iters).arg(&a).arg(&b);
        // SAFETY: the arguments match `chain_step(float* x, unsigned n, unsigned iters,
        // float a, float b)` in cuda/chain.cu in number, order and type; its grid-stride
        // loop touches x[i] only for i < n = x.len().
        unsafe { launch.launch(chain_step_config()) }
    }

    /// `y <- a * x + b * y`, elementwise (`fmaf(a, x, b * y)`).
    ///
    /// Fails with [`Error::LengthMismatch`] unless `x` and `y` have the same length.
    pub fn axpby(
        &self,
        stream: &CaptureStream<'_>,
        x: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
        a: f32,
        b: f32,
    ) -> Result<()> {
        same_len("axpby: y (the length of x)", x.len(), y.len())?;
        let n = len_u32("axpby: y", y.len())?;
        let mut launch = stream.launch(self.kernel(KernelId::Axpby));
        launch.buf(x).buf_mut(y).arg(&n).arg(&a).arg(&b);
        // SAFETY: the arguments match `axpby(const float* x, float* y, unsigned n, float a,
        // float b)` in cuda/elementwise.cu; threads with i >= n return, and x and y both
        // hold n elements (checked above).
        unsafe { launch.launch(elementwise_config(n)) }
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
        y: &mut DeviceBuffer<f32>,
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
        let mut launch = stream.launch(self.kernel(KernelId::ScaleByScalar));
        launch
            .buf(scalars.on_device())
            .arg(&index)
            .buf_mut(y)
            .arg(&n);
        // SAFETY: the arguments match `scale_by_scalar(const float* scalars, unsigned
        // index, float* y, unsigned n)` in cuda/elementwise.cu; index < scalars.len()
        // (checked above) and threads with i >= n = y.len() return.
        unsafe { launch.launch(elementwise_config(n)) }
    }

    /// `y[i] <- start + i * step` (`fmaf(i, step, start)`).
    pub fn fill_affine(
        &self,
        stream: &CaptureStream<'_>,
        y: &mut DeviceBuffer<f32>,
        start: f32,
        step: f32,
    ) -> Result<()> {
        let n = len_u32("fill_affine: y", y.len())?;
        let mut launch = stream.launch(self.kernel(KernelId::FillAffine));
        launch.buf_mut(y).arg(&n).arg(&start).arg(&step);
        // SAFETY: the arguments match `fill_affine(float* y, unsigned n, float start, float
        // step)` in cuda/elementwise.cu; threads with i >= n = y.len() return.
        unsafe { launch.launch(elementwise_config(n)) }
    }
}

/// What [`Kernels::chain_step`] computes, on the CPU, bit for bit.
///
/// The kernel does one `fmaf(v, a, b)` per step, rounded once; `f32::mul_add` rounds the
/// same way, whereas `v * a + b` here would round twice and drift from the GPU's result.
pub fn chain_step_reference(x: &mut [f32], iters: u32, a: f32, b: f32) {
    for v in x {
        for _ in 0..iters {
            *v = v.mul_add(a, b);
        }
    }
}

/// What [`Kernels::axpby`] computes, on the CPU, bit for bit (`a.mul_add(x, b * y)`).
///
/// # Panics
/// If `x` and `y` differ in length.
pub fn axpby_reference(x: &[f32], y: &mut [f32], a: f32, b: f32) {
    assert_eq!(
        x.len(),
        y.len(),
        "axpby_reference: x and y differ in length"
    );
    for (y, x) in y.iter_mut().zip(x) {
        *y = a.mul_add(*x, b * *y);
    }
}

/// What [`Kernels::fill_affine`] computes, on the CPU, bit for bit.
pub fn fill_affine_reference(y: &mut [f32], start: f32, step: f32) {
    for (i, y) in y.iter_mut().enumerate() {
        *y = (i as f32).mul_add(step, start);
    }
}

/// Collects one result per slot into a fixed array, stopping at the first error.
fn fixed_slots<T, const N: usize>(results: [Result<T>; N]) -> Result<[T; N]> {
    let items = results.into_iter().collect::<Result<Vec<T>>>()?;
    Ok(items
        .try_into()
        .unwrap_or_else(|_| unreachable!("N results give N items")))
}

/// The kernels index with 32-bit unsigned integers.
fn len_u32(what: &str, len: usize) -> Result<u32> {
    u32::try_from(len).map_err(|_| {
        Error::Invalid(format!(
            "{what} has {len} elements; the kernels index with 32-bit unsigned integers, so at \
             most {} fit",
            u32::MAX
        ))
    })
}

fn same_len(what: &str, expected: usize, found: usize) -> Result<()> {
    if expected != found {
        return Err(Error::LengthMismatch {
            what: what.to_string(),
            expected,
            found,
        });
    }
    Ok(())
}

fn chain_step_config() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (CHAIN_STEP_BLOCKS, 1, 1),
        block_dim: (CHAIN_STEP_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread per element. An empty buffer still gets one (idle) block, so a step's
/// graph has the same nodes whatever the sizes.
fn elementwise_config(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(BLOCK_THREADS).max(1), 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn every_cubin_is_a_cuda_elf_image() {
        for id in ModuleId::ALL {
            let cubin = id.image();
            assert!(cubin.starts_with(b"\x7fELF"), "{id:?}: not an ELF image");
            // e_machine (little-endian u16 at offset 18) is EM_CUDA = 190.
            assert_eq!(u16::from_le_bytes([cubin[18], cubin[19]]), 190, "{id:?}");
        }
    }

    #[test]
    fn every_ptx_targets_sm_90_with_an_isa_a_cuda_13_0_driver_reads() {
        for id in ModuleId::ALL {
            let bytes = id.ptx();
            assert_eq!(bytes.last(), Some(&0), "{id:?}: PTX must be NUL-terminated");
            let text = std::str::from_utf8(&bytes[..bytes.len() - 1]).unwrap();
            assert!(
                text.lines().any(|l| l.trim() == ".target sm_90"),
                "{id:?}: no `.target sm_90`"
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
            let ptx = String::from_utf8_lossy(k.module().ptx());
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
}
