//! Compiles a crate's CUDA C kernels when it builds, and generates a typed registry for
//! them that the [stepgraph](https://docs.rs/stepgraph) runtime loads and checks.
//!
//! A crate with kernels in `cuda/*.cu` adds `stepgraph-build` as a build-dependency and
//! a `build.rs` of a few lines:
//!
//! ```no_run
//! fn main() {
//!     stepgraph_build::Builder::new().run();
//! }
//! ```
//!
//! and includes the generated registry in a module of its choosing:
//!
//! ```ignore
//! mod kernels {
//!     stepgraph::include_kernels!();
//! }
//! use kernels::Kernels;
//!
//! let kernels = Kernels::load(&device)?;
//! // In an op: one typed launcher per kernel, named after it.
//! // SAFETY: one thread per element; the kernel returns for i >= n = x.len().
//! unsafe { kernels.scale(stream, LaunchConfig::for_num_elems(n), x, n, 2.0)? };
//! ```
//!
//! # What it does
//!
//! - Compiles every `cuda/*.cu` (the folder is [`Builder::kernel_dir`]) with nvcc, by
//!   default to sm_80, sm_86, sm_89 and sm_90 cubins (Ampere, Ada and Hopper) and to
//!   compute_80 PTX, which the driver JIT-compiles on GPUs that none of the cubins fits
//!   ([`DEFAULT_TARGETS`]; [`Builder::targets`], [`Builder::target`], or
//!   `STEPGRAPH_CUDA_ARCH`). Flags:
//!   `-O3 -lineinfo`, `-I` the kernel folder, then [`Builder::include_dir`]s and the headers
//!   that dependencies export (below), [`Builder::nvcc_arg`]s, and `-ccbin $NVCC_CCBIN` when
//!   that is set. nvcc's warnings become cargo warnings; its errors fail the build.
//! - Emits `cargo::rerun-if-changed` for the folder (so a new file reruns the script),
//!   every source and every header it includes (from nvcc's own dependency output), and
//!   `rerun-if-env-changed` for every variable it reads.
//! - Reads the signature of every `extern "C" __global__` kernel of each file, maps each
//!   parameter to a Rust type, and checks the sizes against the `.param` list that nvcc
//!   wrote into the PTX.
//! - Writes `$OUT_DIR/stepgraph_kernels.rs` ([`Builder::out_file`]): `ModuleId` and
//!   `KernelId` (with `ALL`, `COUNT`, `index`, `name`, `module`), the module declarations
//!   (embedded images, kernels, parameters: name, C type, size), the constants
//!   `NVCC_RELEASE` and `NVCC_VERSION`, and a `Kernels` struct: `Kernels::load(&device)`
//!   loads every module once into fixed slots (each image in turn; the first image's error
//!   if the driver refuses them all) and compares each kernel's parameter list, as the
//!   driver reports it, with its declaration. `kernel(KernelId)` gives the loaded kernel for
//!   a launch built by hand.
//! - One launcher per kernel: `unsafe fn <kernel>(&self, stream, config, <one argument per
//!   CUDA parameter>)`. `const T*` becomes `&impl DeviceMem<T>` (a buffer or a view), `T*`
//!   `&mut impl DeviceMemMut<T>`, a pointer table (below) a slice of them, scalars and
//!   mapped structs are passed by value. A view at
//!   an odd offset is aligned to its element only: a kernel with wider loads must not be
//!   given one. The number, order and types of the arguments are the compiler's business; what stays `unsafe` is the kernel's own
//!   contract: that the grid and the size arguments keep every access inside the buffers.
//!
//! # Size contracts: safe launchers
//!
//! A kernel may declare, in the comment just above its signature, the lengths its buffers
//! must have and the grid it runs on. The builder then also generates a **safe**
//! `<launcher>_checked` method, which checks every length against the sizes it is given,
//! computes the grid, and calls the unsafe launcher:
//!
//! ```text
//! // y[i] <- a x[i] for i < n.
//! // stepgraph(unsafe): x[n], y[n], grid = elementwise(n)
//! extern "C" __global__ void scale(const float* x, float* y, unsigned n, float a) {..}
//! ```
//!
//! ```ignore
//! // Generated: pub fn scale_checked(&self, stream, x, y, n: usize, a: f32) -> Result<()>
//! kernels.scale_checked(stream, &x, &mut y, x.len(), 2.0)?;
//! ```
//!
//! Items, separated by commas; several `stepgraph(unsafe):` lines add up (a line may end
//! in a comma):
//!
//! - `x[size]`: buffer `x` holds exactly `size` elements (and at most `u32::MAX`, as the
//!   kernels index with 32-bit integers); `x[>= size]`: at least `size` (a scratch buffer
//!   that serves several sizes). Every buffer parameter needs one.
//! - `t[count][size]`: pointer table `t` (a struct of one array of pointers, one buffer
//!   per branch) gets exactly `count` buffers, no more than its array holds, each of
//!   exactly `size` elements (`t[count][>= size]`: at least). The safe method takes it as
//!   `&[&DeviceBuffer<T>]`, or `&mut [&mut DeviceBuffer<T>]` where the kernel writes
//!   through it, whose every buffer must lie within what the op may write.
//! - `n > 0`: integer parameter `n` is at least 1.
//! - `a <= b`, `a >= b`, `a == b`: a condition on sizes the kernel relies on, such as the
//!   most units its register arrays hold (`H <= 32 * MAX_UNITS`) or the width of its
//!   vector loads (`S % 4 == 0`).
//! - `grid = elementwise(count)`: one thread per item in blocks of 256 threads, at least
//!   one block; `grid = tiles(x, y)`: `(x, y)` blocks of 32 × 32 threads, at least one each
//!   way; `grid = blocks(count, threads)`: `count` blocks (at least one) of `threads`;
//!   `grid = launch((x, y, z), (tx, ty, tz))`: any grid and block, each a size or a tuple
//!   of one to three sizes (missing ones are 1, a grid's counts at least 1), such as
//!   `launch((cdiv(B, rows_per_chunk), cdiv(H, 128)), 256)`.
//!   Without a grid, the safe method takes the caller's `config` after `stream`.
//! - A size is an expression over the kernel's integer parameters, decimal literals and
//!   the integer `#define`s of the source and the headers it includes with quotes
//!   (`#define LOSS_SLOTS 8`; a parameter of the same name wins), with `+`, `-`, `*`, `%`,
//!   parentheses, `cdiv(a, b)` (division rounded up), `min(a, b)` and `max(a, b)`. It is
//!   computed in `usize` with overflow checked.
//!
//! The safe method takes the arguments of the launcher, except that buffers are whole
//! `DeviceBuffer`s (a view is aligned to its element only, and a contract says nothing of
//! the kernel's vector widths) and the integer parameters a contract names are `usize`,
//! converted to the kernel's type with a check.
//! Its checks, in order: the positive sizes, the conditions, the buffers in declaration
//! order, the grid, the conversions. A buffer of another length is `Error::LengthMismatch`
//! whose `what` is `"<kernel>: <buffer> ([<size>])"`, one past 32-bit indices
//! `Error::TooLarge`; a zero, a condition that does not hold, an overflow or a size that
//! does not fit its parameter is `Error::Argument` naming the kernel and the argument. The generated `contract` module
//! holds these checks and the grid rules (`contract::elementwise(n)` and so on), so a crate
//! can test its grids against them.
//!
//! **Why `unsafe` is in the comment.** The builder checks the declaration against the
//! signature (every buffer has a length, every size names an integer parameter; a mistake
//! fails the build at the comment's file and line), but it cannot read the kernel's body:
//! that the kernel keeps every access inside those lengths on that grid (or on any grid,
//! when none is declared: a grid-stride loop or a bound check on each index) is its
//! author's promise, as `unsafe impl Send` is. The launcher stays `unsafe fn`, like
//! cudarc's `LaunchAsync::launch`; the contract moves the one promise next to the code it
//! is about, where a reviewer of the kernel sees it, instead of a `// SAFETY:` at every
//! call. So a `_checked` method is exactly as sound as its contract: reviewing a change to
//! a kernel's indexing includes its `stepgraph(unsafe):` line. A kernel that takes a
//! mapped struct by value cannot have a contract (what its fields address is not a length
//! the builder can check; a pointer table's is, above); nor can one whose bounds depend on
//! the device (shared memory, occupancy): keep those launches hand-written. The safe method is named
//! `<launcher>_checked`, beside the launcher rather than in its place, so that adding a
//! contract changes no existing call.
//!
//! # Finding nvcc
//!
//! In order: `NVCC` (an explicit choice: if it is not a file, the build fails rather than
//! use another nvcc), `$CUDA_HOME/bin/nvcc`, `$CUDA_PATH/bin/nvcc`, `nvcc` on `PATH`, then
//! `/usr/local/cuda/bin/nvcc` (where CUDA's installers put it, often left off `PATH`). A
//! project that installs its own nvcc names it in `NVCC`, in the environment of the cargo
//! that builds. If none is found, the error lists every place tried. Its version must be at
//! least [`Builder::min_nvcc_version`] (12.0 unless raised); which release a deployment's
//! driver accepts is for the deployment to check.
//!
//! # Parameter types
//!
//! | CUDA | Rust |
//! |---|---|
//! | `float`, `double` | `f32`, `f64` |
//! | `int`, `unsigned`, `unsigned int`, `short`, `long long`, `unsigned long long`, ... | `i32`, `u32`, `u32`, `i16`, `i64`, `u64`, ... |
//! | `long`, `unsigned long`, `char` | `c_long`, `c_ulong`, `c_char` (the host's) |
//! | `signed char`, `unsigned char`, `bool` | `i8`, `u8`, `bool` |
//! | `size_t`, `int8_t` ... `uint64_t` | `usize`, `i8` ... `u64` |
//! | `__half`, `__nv_bfloat16` | `stepgraph::kernel::f16`, `bf16` (the `half` crate's, re-exported) |
//! | a typedef of one of these, in the source or a quoted include | that type |
//! | `const T*` / `T*` | `&impl DeviceMem<T>` / `&mut impl DeviceMemMut<T>`: a `DeviceBuffer<T>`, or a `View`/`ViewMut` of one |
//! | a pointer table: a struct of one array of `N` pointers, `struct BranchIn { const float* p[8]; }` | `&[&impl DeviceMem<T>]` / `&mut [&mut impl DeviceMemMut<T>]`, at most `N`, passed as a [`PtrTable<N>`](https://docs.rs/stepgraph/latest/stepgraph/struct.PtrTable.html) |
//! | anything else (a struct by value) | what [`Builder::rust_type`] maps it to |
//!
//! `__restrict__`, `volatile`, `__grid_constant__` and a `const` on the pointer itself
//! change nothing. A pointer table lets one launch serve several branches while each
//! branch's tensor stays a buffer of its own (which the schedule orders apart); its
//! length is a literal or an integer `#define`, and entries past the buffers given are
//! null. Any other struct passed by value needs a Rust type with the same layout (a
//! mapping also overrides the pointer-table reading):
//!
//! ```no_run
//! // cuda/attn.cu: struct Dims { unsigned b, w, e, heads; };
//! //   extern "C" __global__ void attend(const Dims d, float* out) {..}
//! // src/lib.rs: #[repr(C)] #[derive(Clone, Copy)] pub struct Dims { b: u32, w: u32, e: u32, heads: u32 }
//! //             unsafe impl stepgraph::DeviceRepr for Dims {}
//! fn main() {
//!     stepgraph_build::Builder::new()
//!         .rust_type("Dims", "crate::Dims")
//!         .run();
//! }
//! ```
//!
//! The generated code asserts at compile time that the Rust type has the size the compiled
//! kernel gives the parameter. Without a mapping the build fails with an error that names
//! the file, line, kernel and parameter, and shows this fix.
//!
//! # What is not read
//!
//! Kernels without C linkage (`__global__` outside `extern "C"`) are ignored: their names
//! are mangled, and a template cannot have C linkage. The scan does not run the
//! preprocessor: kernels declared through a macro are not seen (a warning names any
//! unmangled kernel of the PTX that the scan missed), and a kernel that nvcc leaves out
//! (inside `#if 0`) gets no launcher, with a warning. Look the unseen ones up with
//! `Module::kernel` and launch them with `CaptureStream::launch`, which checks the argument
//! count and sizes against the driver's parameter list.
//!
//! Names: a kernel called `load`, `module` or `kernel` (the methods `Kernels` has besides
//! its launchers) or a Rust keyword gets the launcher `launch_<name>`; a parameter called
//! `stream`, `config` or a Rust keyword gets a trailing `_`, and an unnamed one `arg<i>`
//! (each launcher's docs list what was renamed). Kernel names must be unique across a
//! crate's modules, since they name `KernelId` variants and launchers.
//!
//! # Sharing headers
//!
//! A kernel crate with a `links` key (`links = "my_kernels"` in its Cargo.toml) exports its
//! kernel folder to the build scripts of crates that depend on it (Cargo's
//! `DEP_MY_KERNELS_CUDA_INCLUDE`), and every `Builder` adds each such folder to nvcc's
//! include path: a dependent's `.cu` files can `#include "helpers.cuh"` from it.
//!
//! # Environment
//!
//! - `NVCC`, `CUDA_HOME`, `CUDA_PATH`, `PATH`: where nvcc is (above).
//! - `NVCC_CCBIN`: the host compiler nvcc uses (`-ccbin`).
//! - `STEPGRAPH_CUDA_ARCH`: the targets, replacing the build script's
//!   ([`Builder::targets`]): `sm_90,compute_80` builds faster where only Hopper matters.

// The examples are build scripts: their `fn main` is what a user writes.
#![allow(clippy::needless_doctest_main)]

mod codegen;
mod contract;
mod deps;
mod env;
mod lex;
mod nvcc;
mod parse;
mod ptx;
mod types;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::{fs, thread};

use codegen::{ImageModel, KernelModel, ModuleModel, ParamModel, Registry};
use env::Cargo;
use nvcc::{Compiler, Job, Kind, Target};
use parse::{KernelSig, ParamSig, Typedef};
use types::{Pass, RustParam, TypeEnv};

/// The environment variable that replaces the build script's targets.
pub const ARCH_ENV: &str = "STEPGRAPH_CUDA_ARCH";

/// The targets when neither [`Builder::targets`] nor [`ARCH_ENV`] says otherwise: a
/// cubin for each GPU generation that users train on from Ampere on (A100 is 8.0, A10 and
/// the RTX 30s 8.6, L4, L40S and the RTX 40s 8.9, H100 and H200 9.0), and compute_80 PTX
/// for the driver to JIT-compile on any other GPU of compute capability 8.0 or newer.
/// A cubin runs on its own generation only (an sm_86 cubin does not load on an A100), so
/// each gets its own; the loader takes the newest one the driver accepts.
pub const DEFAULT_TARGETS: &[&str] = &["sm_80", "sm_86", "sm_89", "sm_90", "compute_80"];

/// The oldest nvcc accepted unless [`Builder::min_nvcc_version`] says otherwise: the
/// first major release that builds sm_90 with `__launch_bounds__` and friends as today.
pub const DEFAULT_MIN_NVCC: (u32, u32) = (12, 0);

/// Compiles a crate's CUDA kernels and writes their registry. See the [crate] docs.
#[derive(Clone, Debug)]
pub struct Builder {
    kernel_dir: PathBuf,
    targets: Vec<String>,
    min_nvcc: (u32, u32),
    flags: Vec<String>,
    nvcc_args: Vec<String>,
    include_dirs: Vec<PathBuf>,
    rust_types: BTreeMap<String, String>,
    stepgraph_path: String,
    out_file: String,
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// The defaults: `cuda/*.cu`, [`DEFAULT_TARGETS`], nvcc [`DEFAULT_MIN_NVCC`] or newer,
    /// `-O3 -lineinfo`, the runtime at `::stepgraph`, `$OUT_DIR/stepgraph_kernels.rs`.
    pub fn new() -> Builder {
        Builder {
            kernel_dir: PathBuf::from("cuda"),
            targets: DEFAULT_TARGETS.iter().map(|t| t.to_string()).collect(),
            min_nvcc: DEFAULT_MIN_NVCC,
            flags: vec!["-O3".into(), "-lineinfo".into()],
            nvcc_args: Vec::new(),
            include_dirs: Vec::new(),
            rust_types: BTreeMap::new(),
            stepgraph_path: "::stepgraph".into(),
            out_file: "stepgraph_kernels.rs".into(),
        }
    }

    /// The folder of the `.cu` files, relative to the crate's root (default `cuda`). Each
    /// file is one module, named after its stem, which must be a letter followed by
    /// letters, digits and `_`.
    pub fn kernel_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.kernel_dir = dir.into();
        self
    }

    /// What to compile each file to: `sm_<NN>` for a cubin (machine code for that GPU
    /// generation), `compute_<NN>` for PTX (JIT-compiled by the driver, on that generation
    /// or a newer one), either with an `a` or `f` suffix. All are embedded; the loader tries
    /// cubins before PTX, newest first. [`ARCH_ENV`], when set, replaces this list.
    ///
    /// ```no_run
    /// stepgraph_build::Builder::new()
    ///     .targets(["sm_80", "sm_90", "compute_90"])
    ///     .run();
    /// ```
    pub fn targets<I, S>(mut self, targets: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.targets = targets.into_iter().map(Into::into).collect();
        self
    }

    /// One more target besides those already set ([`DEFAULT_TARGETS`] unless
    /// [`Builder::targets`] replaced them): typically an architecture-specific one, such as
    /// `sm_90a` for a kernel on Hopper's `wgmma`, which the loader then prefers on the GPU
    /// it was built for. [`ARCH_ENV`], when set, replaces the whole list.
    ///
    /// ```no_run
    /// stepgraph_build::Builder::new().target("sm_90a").run();
    /// ```
    pub fn target(mut self, target: impl Into<String>) -> Builder {
        self.targets.push(target.into());
        self
    }

    /// The oldest nvcc release the kernels build with (default [`DEFAULT_MIN_NVCC`]): an
    /// older one fails the build with an error that names it.
    pub fn min_nvcc_version(mut self, major: u32, minor: u32) -> Builder {
        self.min_nvcc = (major, minor);
        self
    }

    /// One more argument for every nvcc run (`--use_fast_math`, `-DBLOCK=256`), after the
    /// defaults (`-O3 -lineinfo`) and include directories.
    pub fn nvcc_arg(mut self, arg: impl Into<String>) -> Builder {
        self.nvcc_args.push(arg.into());
        self
    }

    /// One more include directory, relative to the crate's root, after the kernel folder.
    pub fn include_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.include_dirs.push(dir.into());
        self
    }

    /// Maps a C type that stepgraph-build cannot map itself (a struct passed by value, a
    /// typedef it cannot see) to a Rust type path, as the generated code will name it: a
    /// `#[repr(C)]` type with the same layout that implements `stepgraph::DeviceRepr`.
    /// Pointers to it become `DeviceBuffer`s of it. A mapping also overrides the built-in
    /// one for the same spelling (`"long"`).
    pub fn rust_type(mut self, c_type: &str, rust: &str) -> Builder {
        let key = c_type.split_whitespace().collect::<Vec<_>>().join(" ");
        self.rust_types.insert(key, rust.trim().to_string());
        self
    }

    /// The path the generated code names the stepgraph runtime by (default
    /// `::stepgraph`), for a crate that depends on it through a re-export
    /// (`::my_framework::stepgraph`).
    pub fn stepgraph_path(mut self, path: &str) -> Builder {
        self.stepgraph_path = path.trim().to_string();
        self
    }

    /// The generated file's name in `OUT_DIR` (default `stepgraph_kernels.rs`): a crate
    /// with two kernel folders runs two builders with two names, and includes each with
    /// `stepgraph::include_kernels!("name.rs")`.
    pub fn out_file(mut self, name: &str) -> Builder {
        self.out_file = name.to_string();
        self
    }

    /// Compiles, checks and writes the registry; prints Cargo's directives. Problems are
    /// printed as `cargo::error` lines, which fail the build without a panic's noise.
    pub fn run(self) {
        let cargo = Cargo::from_process();
        let result = self.run_with(&cargo);
        for line in cargo.directives() {
            println!("{line}");
        }
        if let Err(errors) = result {
            for error in errors {
                for line in error.lines() {
                    println!("cargo::error={line}");
                }
            }
        }
    }

    /// The stages in turn: read the sources (no nvcc needed to reject a signature), find
    /// and check nvcc, compile, check the signatures against the PTX, write the registry.
    fn run_with(&self, cargo: &Cargo<'_>) -> Result<(), Vec<String>> {
        let dir = |key: &str| {
            cargo.cargo_var(key).map(PathBuf::from).ok_or_else(|| {
                vec![format!(
                    "{key} is not set: run stepgraph-build from a build script"
                )]
            })
        };
        let manifest_dir = dir("CARGO_MANIFEST_DIR")?;
        let out_dir = dir("OUT_DIR")?;
        self.check_settings().map_err(|e| vec![e])?;
        let kernel_dir = manifest_dir.join(&self.kernel_dir);
        let names = Names {
            manifest_dir: &manifest_dir,
        };
        // The folder itself, so that an added file reruns the script.
        cargo.rerun_if_changed(&kernel_dir);
        let sources = list_sources(&kernel_dir, &names).map_err(|e| vec![e])?;
        let mut include_dirs = vec![kernel_dir.clone()];
        include_dirs.extend(self.include_dirs.iter().map(|d| manifest_dir.join(d)));
        include_dirs.extend(
            cargo
                .vars_matching("DEP_", "_CUDA_INCLUDE")
                .into_iter()
                .map(|(_, v)| PathBuf::from(v)),
        );

        let pending = self.scan(&sources, &include_dirs, &names, cargo)?;

        let nvcc = nvcc::find(cargo, self.min_nvcc).map_err(|e| vec![e])?;
        cargo.rerun_if_changed(&nvcc.path);
        let version = nvcc::version(&nvcc, self.min_nvcc).map_err(|e| vec![e])?;
        let targets = match cargo.var(ARCH_ENV) {
            Some(spec) => nvcc::targets(&[spec.to_string_lossy()])
                .map_err(|e| vec![format!("{ARCH_ENV}: {e}")])?,
            None => {
                nvcc::targets(&self.targets).map_err(|e| vec![format!("Builder::targets: {e}")])?
            }
        };
        let compiler = Compiler {
            nvcc: nvcc.path.clone(),
            flags: self.flags.clone(),
            include_dirs,
            extra: self.nvcc_args.clone(),
            ccbin: cargo.var("NVCC_CCBIN"),
        };
        let image_dir = out_dir.join(self.out_file.trim_end_matches(".rs"));
        fs::create_dir_all(&image_dir)
            .map_err(|e| vec![format!("creating {}: {e}", image_dir.display())])?;
        let plan = plan_jobs(&sources, &targets, &image_dir);
        compile(&compiler, &plan, sources.len(), cargo)?;

        let mut modules = Vec::new();
        let mut errors = Vec::new();
        for (i, (source, kernels)) in sources.iter().zip(pending).enumerate() {
            let ptx_path = &plan.jobs[plan.check_ptx[i]].output;
            let ptx = fs::read(ptx_path)
                .map_err(|e| vec![format!("reading {}: {e}", ptx_path.display())])?;
            let ptx = String::from_utf8_lossy(&ptx);
            let entries = ptx::entries(ptx.trim_end_matches('\0'))
                .map_err(|e| vec![format!("the PTX nvcc wrote for {}: {e}", source.name)])?;
            match module_model(source, kernels, &entries, &plan, i, &out_dir, cargo) {
                Ok(m) => modules.push(m),
                Err(e) => errors.extend(e),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let registry = Registry {
            rt: self.stepgraph_path.clone(),
            kernel_dir: self.kernel_dir.display().to_string(),
            nvcc_release: version.release_text,
            nvcc_version: version.full,
            modules,
        };
        let out = out_dir.join(&self.out_file);
        fs::write(&out, codegen::generate(&registry))
            .map_err(|e| vec![format!("writing {}: {e}", out.display())])?;
        if cargo.cargo_var("CARGO_MANIFEST_LINKS").is_some() {
            cargo.metadata("cuda_include", &kernel_dir.display().to_string());
        }
        Ok(())
    }

    /// Reads every source's kernels and maps their parameters; every problem of every
    /// file, or the kernels of each source.
    fn scan(
        &self,
        sources: &[Source],
        include_dirs: &[PathBuf],
        names: &Names<'_>,
        cargo: &Cargo<'_>,
    ) -> Result<Vec<Vec<Pending>>, Vec<String>> {
        let long_bytes = match cargo.cargo_var("CARGO_CFG_TARGET_OS") {
            Some(os) if os == "windows" => 4,
            _ => 8,
        };
        let mut errors = Vec::new();
        let mut parsed = Vec::new();
        for source in sources {
            match read_source(source, include_dirs, names, cargo) {
                Ok(p) => parsed.push(p),
                Err(e) => errors.push(e),
            }
        }
        let mut pending = Vec::new();
        for p in &parsed {
            let env = TypeEnv {
                mappings: &self.rust_types,
                typedefs: &p.typedefs,
                structs: &p.structs,
                tables: &p.tables,
                defines: &p.defines,
                rt: &self.stepgraph_path,
                long_bytes,
            };
            for e in &p.errors {
                errors.push(format!("{}:{}: {}", p.source.name, e.line, e.message));
            }
            let mut kernels = Vec::new();
            for k in &p.kernels {
                let mut params = Vec::new();
                for (i, param) in k.params.iter().enumerate() {
                    match types::rust_param(param, &env) {
                        Ok(r) => params.push((param.clone(), r)),
                        Err(why) => errors.push(format!(
                            "{}:{}: kernel `{}`, parameter {i}{} (`{}`): {why}",
                            p.source.name,
                            param.line,
                            k.name,
                            param
                                .name
                                .as_ref()
                                .map(|n| format!(" `{n}`"))
                                .unwrap_or_default(),
                            param.text
                        )),
                    }
                }
                let contract = if params.len() == k.params.len() {
                    read_contract(k, &params, &p.defines).map_err(|e| {
                        errors.extend(
                            e.into_iter()
                                .map(|e| format!("{}:{}: {}", p.source.name, e.line, e.message)),
                        );
                    })
                } else {
                    Ok(None)
                };
                kernels.push(Pending {
                    sig: k.clone(),
                    params,
                    contract: contract.unwrap_or(None),
                });
            }
            pending.push(kernels);
        }
        errors.extend(check_names(&parsed));
        errors.extend(check_checked_names(&parsed, &pending));
        if errors.is_empty() {
            Ok(pending)
        } else {
            Err(errors)
        }
    }

    fn check_settings(&self) -> Result<(), String> {
        let file_ok = !self.out_file.is_empty()
            && !self.out_file.contains(['/', '\\'])
            && self.out_file.ends_with(".rs");
        if !file_ok {
            return Err(format!(
                "Builder::out_file: `{}` must be a file name ending in `.rs`, without a folder",
                self.out_file
            ));
        }
        if self.stepgraph_path.is_empty() {
            return Err("Builder::stepgraph_path: the path is empty".into());
        }
        Ok(())
    }
}

/// Shortens paths for messages and docs: relative to the crate's root when inside it.
struct Names<'a> {
    manifest_dir: &'a Path,
}

impl Names<'_> {
    fn of(&self, path: &Path) -> String {
        path.strip_prefix(self.manifest_dir)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}

/// A `.cu` file.
#[derive(Clone, Debug)]
struct Source {
    path: PathBuf,
    /// `elementwise`: the module's name.
    stem: String,
    /// `cuda/elementwise.cu`, for messages.
    name: String,
}

fn list_sources(dir: &Path, names: &Names<'_>) -> Result<Vec<Source>, String> {
    let entries = fs::read_dir(dir).map_err(|e| {
        format!(
            "reading the kernel folder {}: {e} (set it with Builder::kernel_dir)",
            dir.display()
        )
    })?;
    let mut sources = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_none_or(|e| e != "cu") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let ok = stem.starts_with(|c: char| c.is_ascii_alphabetic())
            && stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(format!(
                "{}: a kernel file's name must be a letter followed by letters, digits and `_` \
                 (it names the module and its ModuleId variant)",
                names.of(&path)
            ));
        }
        sources.push(Source {
            name: names.of(&path),
            path,
            stem,
        });
    }
    sources.sort_by(|a, b| a.stem.cmp(&b.stem));
    if sources.is_empty() {
        return Err(format!("no .cu files in {}", dir.display()));
    }
    Ok(sources)
}

/// A source, read.
#[derive(Debug)]
struct Parsed {
    source: Source,
    kernels: Vec<KernelSig>,
    errors: Vec<parse::ParseError>,
    typedefs: BTreeMap<String, (Typedef, String)>,
    structs: BTreeMap<String, (String, u32)>,
    /// The structs that hold one array of device pointers.
    tables: BTreeMap<String, parse::PtrTableDecl>,
    /// Integer `#define`s of the source and its headers, for the contracts.
    defines: BTreeMap<String, u64>,
}

/// Reads a source, and the typedefs and structs of the headers it includes with quotes.
fn read_source(
    source: &Source,
    include_dirs: &[PathBuf],
    names: &Names<'_>,
    cargo: &Cargo<'_>,
) -> Result<Parsed, String> {
    cargo.rerun_if_changed(&source.path);
    let text =
        fs::read_to_string(&source.path).map_err(|e| format!("reading {}: {e}", source.name))?;
    let lexed = lex::lex(&text);
    let (kernels, errors) = parse::kernels(&lexed.tokens);
    let mut defines = BTreeMap::new();
    integer_defines(&text, &mut defines);
    let mut typedefs = BTreeMap::new();
    let mut structs = BTreeMap::new();
    let mut tables = BTreeMap::new();
    let mut add = |file: &str, d: parse::Declared| {
        for (name, t) in d.typedefs {
            typedefs.entry(name).or_insert((t, file.to_string()));
        }
        for (name, line) in d.structs {
            structs.entry(name).or_insert((file.to_string(), line));
        }
        for (name, table) in d.tables {
            tables.entry(name).or_insert(table);
        }
    };
    add(&source.name, parse::declared(&lexed.tokens));
    let mut queue: Vec<(PathBuf, String)> = lexed
        .includes
        .into_iter()
        .map(|(name, _)| (source.path.clone(), name))
        .collect();
    let mut seen: Vec<PathBuf> = Vec::new();
    while let Some((from, name)) = queue.pop() {
        let here = from.parent().map(|d| d.join(&name));
        let found = here
            .into_iter()
            .chain(include_dirs.iter().map(|d| d.join(&name)))
            .find(|p| p.is_file());
        let Some(path) = found else {
            // nvcc reports it, with the include path it searched.
            continue;
        };
        if seen.contains(&path) {
            continue;
        }
        seen.push(path.clone());
        cargo.rerun_if_changed(&path);
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let header = lex::lex(&text);
        add(&names.of(&path), parse::declared(&header.tokens));
        integer_defines(&text, &mut defines);
        queue.extend(header.includes.into_iter().map(|(n, _)| (path.clone(), n)));
    }
    Ok(Parsed {
        source: source.clone(),
        kernels,
        errors,
        typedefs,
        structs,
        tables,
        defines,
    })
}

/// A kernel whose parameters all mapped, before the PTX check.
#[derive(Debug)]
struct Pending {
    sig: KernelSig,
    params: Vec<(ParamSig, RustParam)>,
    contract: Option<contract::Contract>,
}

/// The contract in the comment above `k`, if it has one.
fn read_contract(
    k: &KernelSig,
    params: &[(ParamSig, RustParam)],
    constants: &BTreeMap<String, u64>,
) -> Result<Option<contract::Contract>, Vec<contract::ContractError>> {
    let views: Vec<contract::ParamView<'_>> = params
        .iter()
        .map(|(p, r)| contract::ParamView {
            c_name: p.name.as_deref().unwrap_or_default(),
            rust: &r.rust,
            pass: r.pass,
            mapped_value: r.size.is_none() && r.pass == Pass::Value,
        })
        .collect();
    contract::read(
        &k.name,
        k.comment.as_deref(),
        k.comment_end,
        &views,
        constants,
    )
}

/// The integer `#define`s of a file (`#define LOSS_SLOTS 8`, a decimal value with an
/// optional `u`/`l` suffix, in parentheses or not), for the contracts' sizes.
fn integer_defines(text: &str, out: &mut BTreeMap<String, u64>) {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        if name.contains('(') {
            continue;
        }
        let value = value
            .trim_start_matches('(')
            .trim_end_matches(')')
            .trim_end_matches(['u', 'U', 'l', 'L']);
        if let Ok(v) = value.parse::<u64>() {
            out.entry(name.to_string()).or_insert(v);
        }
    }
}

/// A kernel with a contract gets `<launcher>_checked` besides its launcher: no other
/// kernel's launcher may have that name.
fn check_checked_names(parsed: &[Parsed], pending: &[Vec<Pending>]) -> Vec<String> {
    let launchers: BTreeMap<String, &str> = pending
        .iter()
        .flatten()
        .map(|k| (codegen::launcher_name(&k.sig.name), k.sig.name.as_str()))
        .collect();
    let mut errors = Vec::new();
    for (p, kernels) in parsed.iter().zip(pending) {
        for k in kernels.iter().filter(|k| k.contract.is_some()) {
            let safe = codegen::checked_name(&k.sig.name);
            if let Some(other) = launchers.get(&safe) {
                errors.push(format!(
                    "{}:{}: kernel `{}` has a contract, so it gets the safe method `{safe}`, \
                     which is kernel `{other}`'s launcher: rename one",
                    p.source.name, k.sig.line, k.sig.name
                ));
            }
        }
    }
    errors
}

/// Kernel names unique across modules; every generated name distinct.
fn check_names(parsed: &[Parsed]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut modules: BTreeMap<String, &str> = BTreeMap::new();
    for p in parsed {
        let v = codegen::camel(&p.source.stem, "Module");
        if let Some(other) = modules.insert(v.clone(), &p.source.name) {
            errors.push(format!(
                "{} and {} both become `ModuleId::{v}`: rename one",
                other, p.source.name
            ));
        }
    }
    let mut kernels: BTreeMap<String, String> = BTreeMap::new();
    let mut variants: BTreeMap<String, String> = BTreeMap::new();
    let mut launchers: BTreeMap<String, String> = BTreeMap::new();
    for p in parsed {
        for k in &p.kernels {
            let at = format!("{}:{}", p.source.name, k.line);
            if let Some(other) = kernels.insert(k.name.clone(), at.clone()) {
                errors.push(format!(
                    "{at}: kernel `{}` is also defined at {other}: kernel names must be unique \
                     across a crate's modules (they name KernelId variants and launchers)",
                    k.name
                ));
                continue;
            }
            let v = codegen::camel(&k.name, "Kernel");
            if let Some(other) = variants.insert(v.clone(), k.name.clone()) {
                errors.push(format!(
                    "{at}: kernels `{other}` and `{}` both become `KernelId::{v}`: rename one",
                    k.name
                ));
            }
            let l = codegen::launcher_name(&k.name);
            if let Some(other) = launchers.insert(l.clone(), k.name.clone()) {
                errors.push(format!(
                    "{at}: kernels `{other}` and `{}` both get the launcher `{l}`: rename one",
                    k.name
                ));
            }
        }
    }
    errors
}

/// Every nvcc run, and which of them give each source's PTX for the check.
#[derive(Debug)]
struct Plan {
    jobs: Vec<Job>,
    /// The source of each job.
    source_of: Vec<usize>,
    /// For each source: the job whose PTX the parameters are checked against.
    check_ptx: Vec<usize>,
    /// For each source: the jobs whose outputs are embedded, in loading order.
    embedded: Vec<Vec<usize>>,
}

fn plan_jobs(sources: &[Source], targets: &[Target], image_dir: &Path) -> Plan {
    let mut plan = Plan {
        jobs: Vec::new(),
        source_of: Vec::new(),
        check_ptx: Vec::new(),
        embedded: Vec::new(),
    };
    for (i, s) in sources.iter().enumerate() {
        let mut embedded = Vec::new();
        for (t, target) in targets.iter().enumerate() {
            let ext = match target.kind {
                Kind::Cubin => "cubin",
                Kind::Ptx => "ptx",
            };
            embedded.push(plan.jobs.len());
            plan.jobs.push(Job {
                source: s.path.clone(),
                source_name: s.name.clone(),
                target: target.clone(),
                output: image_dir.join(format!("{}.{}.{ext}", s.stem, target.arch)),
                deps: (t == 0).then(|| image_dir.join(format!("{}.d", s.stem))),
            });
            plan.source_of.push(i);
        }
        let check = match embedded
            .iter()
            .find(|&&j| plan.jobs[j].target.kind == Kind::Ptx)
        {
            Some(&j) => j,
            None => {
                // Only cubins embedded: PTX of the first target, for the check alone.
                let twin = targets[0].ptx_twin();
                plan.jobs.push(Job {
                    source: s.path.clone(),
                    source_name: s.name.clone(),
                    output: image_dir.join(format!("{}.{}.check.ptx", s.stem, twin.arch)),
                    target: twin,
                    deps: None,
                });
                plan.source_of.push(i);
                plan.jobs.len() - 1
            }
        };
        plan.check_ptx.push(check);
        plan.embedded.push(embedded);
    }
    plan
}

/// A job's warnings, or its error.
type JobResult = Result<Vec<String>, String>;

/// Runs the jobs on `NUM_JOBS` threads (nvcc is single-threaded).
fn run_jobs(compiler: &Compiler, jobs: &[Job], cargo: &Cargo<'_>) -> Vec<JobResult> {
    let workers = cargo
        .cargo_var("NUM_JOBS")
        .and_then(|n| n.to_str()?.parse::<usize>().ok())
        .or_else(|| thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .clamp(1, jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<JobResult>>> = Mutex::new(vec![None; jobs.len()]);
    thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else {
                        break;
                    };
                    let r = compiler.run(job);
                    if let Ok(mut all) = results.lock() {
                        all[i] = Some(r);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("an nvcc job did not finish".into())))
        .collect()
}

/// Runs every job; forwards nvcc's warnings (once per source, though each target's run
/// repeats them) and tracks every file nvcc read; NUL-terminates the PTX.
fn compile(
    compiler: &Compiler,
    plan: &Plan,
    sources: usize,
    cargo: &Cargo<'_>,
) -> Result<(), Vec<String>> {
    let results = run_jobs(compiler, &plan.jobs, cargo);
    let mut errors = Vec::new();
    let mut warnings: Vec<Vec<String>> = vec![Vec::new(); sources];
    for ((job, &source), result) in plan.jobs.iter().zip(&plan.source_of).zip(results) {
        match result {
            Ok(lines) => {
                for line in lines {
                    if !warnings[source].contains(&line) {
                        warnings[source].push(line);
                    }
                }
            }
            Err(e) => errors.push(e),
        }
        if let Some(deps) = &job.deps
            && let Ok(text) = fs::read_to_string(deps)
        {
            for path in deps::prerequisites(&text) {
                cargo.rerun_if_changed(&path);
            }
        }
    }
    for line in warnings.iter().flatten() {
        cargo.warning(&format!("nvcc: {line}"));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    // cuModuleLoadData reads PTX as a C string: terminate it.
    for job in plan.jobs.iter().filter(|j| j.target.kind == Kind::Ptx) {
        let mut bytes = fs::read(&job.output)
            .map_err(|e| vec![format!("reading {}: {e}", job.output.display())])?;
        if bytes.last() != Some(&0) {
            bytes.push(0);
            fs::write(&job.output, bytes)
                .map_err(|e| vec![format!("writing {}: {e}", job.output.display())])?;
        }
    }
    Ok(())
}

/// Checks a source's kernels against its PTX and builds its part of the registry.
fn module_model(
    source: &Source,
    kernels: Vec<Pending>,
    entries: &BTreeMap<String, Vec<usize>>,
    plan: &Plan,
    index: usize,
    out_dir: &Path,
    cargo: &Cargo<'_>,
) -> Result<ModuleModel, Vec<String>> {
    let mut errors = Vec::new();
    let mut models = Vec::new();
    let scanned: Vec<String> = kernels.iter().map(|k| k.sig.name.clone()).collect();
    for k in kernels {
        let at = format!("{}:{}", source.name, k.sig.line);
        let Some(sizes) = entries.get(&k.sig.name) else {
            // The scan does not run the preprocessor; nvcc does.
            cargo.warning(&format!(
                "{at}: kernel `{}` is not in the module nvcc compiled (inside an `#if` that is \
                 off?): it gets no KernelId or launcher",
                k.sig.name
            ));
            continue;
        };
        if sizes.len() != k.params.len() {
            errors.push(format!(
                "{at}: kernel `{}` has {} parameters in the source as stepgraph-build reads it, \
                 and {} in the PTX nvcc wrote (a macro in the parameter list?)",
                k.sig.name,
                k.params.len(),
                sizes.len()
            ));
            continue;
        }
        let names = codegen::param_names(
            &k.params
                .iter()
                .map(|(p, _)| p.name.clone())
                .collect::<Vec<_>>(),
        );
        let mut params = Vec::new();
        for (i, (((p, r), &size), rust_name)) in k.params.iter().zip(sizes).zip(names).enumerate() {
            if let Some(expected) = r.size
                && expected != size
            {
                errors.push(format!(
                    "{}:{}: kernel `{}`, parameter {i}{} (`{}`): stepgraph-build reads `{}` as \
                     {expected} bytes, and the PTX nvcc wrote has {size}. Map the type to a Rust \
                     type of {size} bytes with `Builder::rust_type`.",
                    source.name,
                    p.line,
                    k.sig.name,
                    p.name
                        .as_ref()
                        .map(|n| format!(" `{n}`"))
                        .unwrap_or_default(),
                    p.text,
                    p.c_type
                ));
                continue;
            }
            params.push(ParamModel {
                c_name: p.name.clone().unwrap_or_default(),
                rust_name,
                c_type: p.c_type.clone(),
                size,
                rust: r.rust.clone(),
                pass: r.pass,
                mapped_value: r.size.is_none() && r.pass == Pass::Value,
            });
        }
        models.push(KernelModel {
            variant: codegen::camel(&k.sig.name, "Kernel"),
            launcher: codegen::launcher_name(&k.sig.name),
            line: k.sig.line,
            signature: k.sig.signature(),
            comment: k.sig.comment.clone(),
            name: k.sig.name,
            params,
            contract: k.contract,
        });
    }
    // Mangled names (`_Z...`) are kernels without C linkage, which are not for the registry.
    for name in entries.keys() {
        if !scanned.contains(name) && !name.starts_with("_Z") {
            cargo.warning(&format!(
                "{}: the compiled module has a kernel `{name}` that stepgraph-build did not find \
                 in the source (declared through a macro?): it has no KernelId or launcher; look \
                 it up with `Module::kernel`",
                source.name
            ));
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let images = plan.embedded[index]
        .iter()
        .map(|&j| {
            let job = &plan.jobs[j];
            let rel = job
                .output
                .strip_prefix(out_dir)
                .unwrap_or(&job.output)
                .display()
                .to_string()
                .replace('\\', "/");
            ImageModel {
                kind: job.target.kind,
                target: job.target.arch.clone(),
                file: format!("/{rel}"),
            }
        })
        .collect();
    Ok(ModuleModel {
        name: source.stem.clone(),
        variant: codegen::camel(&source.stem, "Module"),
        source: source.name.clone(),
        images,
        kernels: models,
    })
}

#[cfg(test)]
mod tests;
