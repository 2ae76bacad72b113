//! Loaded kernel modules: images, each kernel's parameter list as the driver reports it,
//! and the declarations that `stepgraph-build` generates (the public face is `crate::kernel`).

use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DriverError};

/// The half-precision types of the `half` crate, which launchers take for `__half` and
/// `__nv_bfloat16` parameters (re-exported so that a kernel crate needs no `half` of its
/// own).
pub use half::{bf16, f16};

use crate::driver::device::Device;
use crate::error::{ArgMismatch, Error, Param, Result, SignatureMismatch};

/// What an image holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageKind {
    /// Machine code for one GPU generation (an ELF cubin).
    Cubin,
    /// PTX, NUL-terminated, that the driver JIT-compiles for the GPU it loads on.
    Ptx,
}

/// Environment variable that, set to `1`, loads every declared module from its PTX image
/// alone: the driver JIT-compiles the portable PTX (compute_80 by default) and no
/// arch-specific cubin is used, so that a Hopper GPU runs the code an Ampere GPU runs
/// (kernels chosen at run time, such as one on wgmma, take their portable path). For
/// testing that path on the GPU at hand; off by default.
pub const PORTABLE: &str = "STEPGRAPH_PORTABLE";

/// Whether [`PORTABLE`] is set to `1`: modules load from PTX alone, so a kernel chosen by
/// the image the driver took (a Hopper-only one, say) must expect its portable fallback.
pub fn portable() -> bool {
    std::env::var_os(PORTABLE).is_some_and(|v| v == "1")
}

/// A compiled image of a module, embedded in the binary.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Image {
    /// A cubin or PTX.
    pub kind: ImageKind,
    /// The target it was compiled for: `sm_90`, `compute_90`.
    pub target: &'static str,
    /// The bytes `cuModuleLoadData` reads.
    pub bytes: &'static [u8],
}

impl Image {
    /// A cubin for `target` (`sm_90`).
    pub const fn cubin(target: &'static str, bytes: &'static [u8]) -> Image {
        Image {
            kind: ImageKind::Cubin,
            target,
            bytes,
        }
    }

    /// PTX for `target` (`compute_90`), NUL-terminated.
    pub const fn ptx(target: &'static str, bytes: &'static [u8]) -> Image {
        Image {
            kind: ImageKind::Ptx,
            target,
            bytes,
        }
    }
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Image")
            .field("kind", &self.kind)
            .field("target", &self.target)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// A declared kernel parameter: its name and C type as written, and its size in bytes as
/// compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParamDecl {
    /// The name in the CUDA signature; empty for an unnamed parameter.
    pub name: &'static str,
    /// The C type: `const float*`, `unsigned`.
    pub c_type: &'static str,
    /// Bytes in the kernel's parameter buffer.
    pub size: usize,
}

impl ParamDecl {
    /// A parameter `c_type name` of `size` bytes.
    pub const fn new(name: &'static str, c_type: &'static str, size: usize) -> ParamDecl {
        ParamDecl { name, c_type, size }
    }
}

/// A declared kernel: its `extern "C"` name and its parameters in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KernelDecl {
    /// The name the module exports.
    pub name: &'static str,
    /// Its parameters, in order.
    pub params: &'static [ParamDecl],
}

impl KernelDecl {
    /// A kernel `name(params)`.
    pub const fn new(name: &'static str, params: &'static [ParamDecl]) -> KernelDecl {
        KernelDecl { name, params }
    }
}

/// A declared module: one `.cu` file, its images and its kernels.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ModuleDecl {
    /// The module's name (the file's stem).
    pub name: &'static str,
    /// The source, for messages: `cuda/elementwise.cu`.
    pub source: &'static str,
    /// The images, in the order they are tried.
    pub images: &'static [Image],
    /// The kernels.
    pub kernels: &'static [KernelDecl],
}

impl ModuleDecl {
    /// A module `name` compiled from `source`.
    pub const fn new(
        name: &'static str,
        source: &'static str,
        images: &'static [Image],
        kernels: &'static [KernelDecl],
    ) -> ModuleDecl {
        ModuleDecl {
            name,
            source,
            images,
            kernels,
        }
    }
}

/// A loaded module (a cubin or PTX image).
#[derive(Clone)]
pub struct Module {
    name: &'static str,
    ctx: Arc<CudaContext>,
    inner: Arc<CudaModule>,
    /// The declared image the driver accepted; None when loaded from bytes.
    image: Option<&'static Image>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module").field("name", &self.name).finish()
    }
}

impl Module {
    /// Loads a cubin (or PTX text, NUL-terminated) image, with
    /// [`cuModuleLoadData`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html).
    pub fn load(device: &Device, name: &'static str, image: &[u8]) -> Result<Module> {
        crate::scope::check("Module::load")?;
        let ctx = device.context().clone();
        let inner = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec()))
            .map_err(Error::driver("cuModuleLoadData"))?;
        Ok(Module {
            name,
            ctx,
            inner,
            image: None,
        })
    }

    /// Loads a declared module: its images in turn until the driver accepts one (a cubin
    /// is refused on a GPU it was not built for; PTX is then JIT-compiled). If the driver
    /// refuses every image, the error is the first one's. The image it accepted is
    /// [`Module::image`]. With [`PORTABLE`] set, only its PTX images are tried.
    pub fn load_declared(device: &Device, decl: &'static ModuleDecl) -> Result<Module> {
        crate::scope::check("Module::load")?;
        let ptx_only = portable();
        let images: Vec<&'static Image> = decl
            .images
            .iter()
            .filter(|i| !ptx_only || i.kind == ImageKind::Ptx)
            .collect();
        let no_image = || Error::NoModuleImage {
            module: decl.name,
            origin: decl.source,
            images: decl.images.iter().map(|i| i.target).collect(),
            portable: ptx_only,
        };
        if images.is_empty() {
            return Err(no_image());
        }
        let (mut module, image) = first_accepted(
            &images,
            |image| Module::load(device, decl.name, image.bytes),
            no_image,
        )?;
        module.image = Some(image);
        Ok(module)
    }

    /// The module's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The image the driver accepted ([`Module::load_declared`]), so that a caller can
    /// choose a code path that needs an arch-specific cubin: one built for `sm_90a`, say,
    /// whose wgmma instructions the PTX fallback lacks. None for a module
    /// loaded from bytes ([`Module::load`]).
    pub fn image(&self) -> Option<&'static Image> {
        self.image
    }

    /// Looks up a kernel by its (`extern "C"`) name. Its parameter list is read from the
    /// driver, so that launches are checked against it; without a declaration it has sizes
    /// but no names or types.
    ///
    /// On a driver older than CUDA 13.2 the count is found by asking for the parameter
    /// past the last one, which the driver refuses: compute-sanitizer reports that refusal
    /// as an API error. Declared kernels ([`Module::declared_kernel`]) need no such query.
    pub fn kernel(&self, name: &'static str) -> Result<Kernel> {
        let func = self.function(name)?;
        let params = driver_params(&self.ctx, &func, None)?
            .into_iter()
            .map(|(offset, size)| Param {
                offset,
                size,
                name: None,
                c_type: None,
            })
            .collect();
        Ok(Kernel {
            name,
            module: self.name,
            ctx: self.ctx.clone(),
            func,
            params,
        })
    }

    /// Looks up a declared kernel and checks its declaration against the driver's
    /// parameter list: a different count or size is [`Error::KernelSignature`].
    pub fn declared_kernel(&self, decl: &'static KernelDecl) -> Result<Kernel> {
        let func = self.function(decl.name)?;
        let loaded = driver_params(&self.ctx, &func, Some(decl.params.len()))?;
        let params = check_declared(self.name, decl, &loaded)?;
        Ok(Kernel {
            name: decl.name,
            module: self.name,
            ctx: self.ctx.clone(),
            func,
            params,
        })
    }

    fn function(&self, name: &'static str) -> Result<CudaFunction> {
        check_kernel_name(self.name, name)?;
        self.inner
            .load_function(name)
            .map_err(|source| Error::KernelMissing {
                module: self.name,
                kernel: name,
                source,
            })
    }
}

/// The first of `images`, in order, that `load` accepts, with the image; if `load` refuses
/// every one, the first refusal (a cubin for another GPU is refused before the PTX that
/// would have been JIT-compiled, and the first error says most); `none()` if there are no
/// images.
fn first_accepted<T>(
    images: &[&'static Image],
    mut load: impl FnMut(&'static Image) -> Result<T>,
    none: impl FnOnce() -> Error,
) -> Result<(T, &'static Image)> {
    let mut first = None;
    for &image in images {
        match load(image) {
            Ok(loaded) => return Ok((loaded, image)),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_else(none))
}

/// The driver takes the name as a C string: cudarc makes one with
/// `CString::new(..).unwrap()`, which panics on a NUL byte inside the name.
fn check_kernel_name(module: &str, name: &str) -> Result<()> {
    match name.find('\0') {
        Some(at) => Err(Error::Argument {
            what: format!("kernel name {name:?} in module `{module}`"),
            expected: "a name without NUL bytes (the driver takes a C string)".into(),
            found: format!("one at byte {at}"),
        }),
        None => Ok(()),
    }
}

/// The most parameters a kernel can have: its parameter buffer holds 32764 bytes.
const MAX_PARAMS: usize = 32_764;

/// The oldest driver with `cuFuncGetParamInfo`.
const PARAM_INFO_DRIVER: i32 = 12_040;

/// `cuFuncGetParamCount`, where the driver has it (CUDA 13.2 and newer): cudarc binds it
/// only for those versions, and on the 13.0 drivers this crate targets it is absent, so it
/// is looked up in the driver library at run time.
type ParamCountFn = unsafe extern "C" fn(sys::CUfunction, *mut usize) -> CUresult;

fn param_count_fn() -> Option<ParamCountFn> {
    static FOUND: OnceLock<Option<ParamCountFn>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        cudarc::get_lib_name_candidates("cuda")
            .iter()
            .find_map(|name| {
                // SAFETY: the CUDA driver library is loaded already (the context exists);
                // opening it again runs no initialiser. The handle is leaked, so the
                // symbol stays valid for the life of the process.
                let lib = unsafe { libloading::Library::new(name) }.ok()?;
                let lib: &'static libloading::Library = Box::leak(Box::new(lib));
                // SAFETY: the symbol, where the driver has it, has this signature
                // (cuda.h of CUDA 13.2).
                let f = unsafe { lib.get::<ParamCountFn>(b"cuFuncGetParamCount\0") }.ok()?;
                Some(*f)
            })
    })
}

/// Each parameter's offset and size, from
/// [`cuFuncGetParamInfo`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html).
///
/// The count comes from `cuFuncGetParamCount` where the driver has it. Otherwise, for a
/// declared kernel (`declared`: its count) the declared parameters are read and no
/// further: stepgraph-build checked the count against the PTX that the loaded image was
/// compiled from, and asking for one past the end would be a refused call, which
/// compute-sanitizer reports as an error. For a kernel looked up by name alone, the count
/// is the first index the driver refuses.
fn driver_params(
    ctx: &CudaContext,
    func: &CudaFunction,
    declared: Option<usize>,
) -> Result<Vec<(usize, usize)>> {
    let mut version = 0;
    // SAFETY: cuDriverGetVersion writes one int through a pointer to a local.
    let status = unsafe { sys::cuDriverGetVersion(&mut version) };
    if status != CUresult::CUDA_SUCCESS {
        return Err(Error::Driver {
            call: "cuDriverGetVersion",
            source: DriverError(status),
        });
    }
    // cudarc panics on a symbol the driver lacks: refuse an old driver by name instead.
    if version < PARAM_INFO_DRIVER {
        return Err(Error::DriverTooOld {
            feature: "checking kernel parameter lists with cuFuncGetParamInfo",
            found: version,
            needed: PARAM_INFO_DRIVER,
        });
    }
    ctx.bind_to_thread()
        .map_err(Error::driver("cuCtxSetCurrent"))?;
    let f = func.cu_function();
    let count = match param_count_fn() {
        Some(count_fn) => {
            let mut n = 0usize;
            // SAFETY: `f` belongs to a module that `func` keeps loaded; `n` is a local.
            let status = unsafe { count_fn(f, &mut n) };
            if status != CUresult::CUDA_SUCCESS {
                return Err(Error::Driver {
                    call: "cuFuncGetParamCount",
                    source: DriverError(status),
                });
            }
            Some(n)
        }
        None => declared,
    };
    let limit = count.unwrap_or(MAX_PARAMS + 1).min(MAX_PARAMS + 1);
    let mut params = Vec::new();
    while params.len() < limit {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `f` belongs to a module that `func` keeps loaded, and the out-pointers
        // point at locals that outlive the call.
        let status = unsafe { sys::cuFuncGetParamInfo(f, params.len(), &mut offset, &mut size) };
        match status {
            CUresult::CUDA_SUCCESS => params.push((offset, size)),
            // The index is one past the last parameter: fewer than declared, or the end
            // of a kernel looked up by name.
            CUresult::CUDA_ERROR_INVALID_VALUE => return Ok(params),
            other => {
                return Err(Error::Driver {
                    call: "cuFuncGetParamInfo",
                    source: DriverError(other),
                });
            }
        }
    }
    if params.len() > MAX_PARAMS {
        return Err(Error::TooLarge {
            what: "parameters of a kernel, as cuFuncGetParamInfo reports them".into(),
            found: params.len() as u64,
            max: MAX_PARAMS as u64,
            why: "stepgraph reads a parameter list no further than one past its limit",
        });
    }
    Ok(params)
}

/// The declared parameters, if they agree with the driver's in count and size.
fn check_declared(
    module: &'static str,
    decl: &'static KernelDecl,
    loaded: &[(usize, usize)],
) -> Result<Arc<[Param]>> {
    let mismatch = |mismatch| Error::KernelSignature {
        module,
        kernel: decl.name,
        mismatch,
    };
    if loaded.len() != decl.params.len() {
        return Err(mismatch(SignatureMismatch::Count {
            declared: decl.params.len(),
            loaded: loaded.len(),
        }));
    }
    let mut params = Vec::with_capacity(loaded.len());
    for (index, (p, &(offset, size))) in decl.params.iter().zip(loaded).enumerate() {
        if p.size != size {
            return Err(mismatch(SignatureMismatch::Size {
                index,
                name: p.name,
                c_type: p.c_type,
                declared: p.size,
                loaded: size,
            }));
        }
        params.push(Param {
            offset,
            size,
            name: Some(p.name).filter(|n| !n.is_empty()),
            c_type: Some(p.c_type),
        });
    }
    Ok(params.into())
}

/// A kernel function of a loaded module, with its parameter list. It keeps its module
/// loaded, so a graph that captured a launch of it stays valid while the kernel is alive.
#[derive(Clone)]
pub struct Kernel {
    name: &'static str,
    module: &'static str,
    /// The module's context: current for the calls that need one, and the device whose
    /// limits an error reports.
    ctx: Arc<CudaContext>,
    func: CudaFunction,
    params: Arc<[Param]>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("module", &self.module)
            .field("params", &self.params.len())
            .finish()
    }
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The name of its module.
    pub fn module(&self) -> &'static str {
        self.module
    }

    /// Its parameters, in order, as the driver reports them (names and types where
    /// declared).
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The cudarc function, the way down.
    pub fn function(&self) -> &CudaFunction {
        &self.func
    }

    /// Opts the kernel in to `bytes` of dynamic shared memory per block, which a launch
    /// needs to ask for more than 48 KB: the driver refuses such a launch otherwise. It sets
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` with
    /// [`cuFuncSetAttribute`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html).
    ///
    /// Call it before the kernel's launches are captured, as part of loading: it is a
    /// host-side call, refused inside an op ([`Error::HostCallInOp`]) like the others. The
    /// setting belongs to the function, so it holds for every clone of this kernel. It is a
    /// ceiling, not a request: each launch still asks for its own `shared_mem_bytes`
    /// ([`LaunchConfig`](crate::LaunchConfig)), which must be at most `bytes`.
    ///
    /// `bytes` above `i32::MAX` is [`Error::TooLarge`], before the driver is asked. The
    /// driver refuses more than the device's opt-in maximum less the kernel's static shared
    /// memory; that refusal is [`Error::DynamicShared`], naming both where they can be read.
    pub fn set_max_dynamic_shared(&self, bytes: u32) -> Result<()> {
        crate::scope::check("Kernel::set_max_dynamic_shared")?;
        let value = dynamic_shared_arg(self.module, self.name, bytes)?;
        self.ctx
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        self.func
            .set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                value,
            )
            .map_err(|source| Error::DynamicShared {
                module: self.module,
                kernel: self.name,
                bytes,
                optin: readable(self.ctx.attribute(SHARED_OPTIN)),
                static_bytes: readable(self.func.shared_size_bytes()),
                source,
            })
    }
}

/// The device's most shared memory per block, with a kernel's opt-in.
const SHARED_OPTIN: sys::CUdevice_attribute =
    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;

/// A limit read for an error's message, or None if it cannot be read: the message leaves
/// it out rather than hide the refusal it explains behind a second error.
fn readable(value: Result<i32, DriverError>) -> Option<u32> {
    value.ok().and_then(|v| u32::try_from(v).ok())
}

/// `bytes` as the `int` that `cuFuncSetAttribute` takes, or [`Error::TooLarge`] naming the
/// kernel.
fn dynamic_shared_arg(module: &str, kernel: &str, bytes: u32) -> Result<i32> {
    i32::try_from(bytes).map_err(|_| Error::TooLarge {
        what: format!(
            "kernel `{kernel}` in module `{module}`: bytes of dynamic shared memory per block"
        ),
        found: u64::from(bytes),
        max: i32::MAX as u64,
        why: "the driver takes an int",
    })
}

/// What a launch has pushed so far, against the kernel's parameters: the count, and the
/// first argument whose size differs from its parameter's.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ArgCheck {
    pushed: usize,
    first_wrong: Option<(usize, usize)>,
}

impl ArgCheck {
    /// How many arguments were pushed: the index of the next.
    pub(crate) fn pushed(&self) -> usize {
        self.pushed
    }

    pub(crate) fn push(&mut self, params: &[Param], size: usize) {
        if self.first_wrong.is_none() && params.get(self.pushed).is_some_and(|p| p.size != size) {
            self.first_wrong = Some((self.pushed, size));
        }
        self.pushed += 1;
    }

    pub(crate) fn finish(&self, params: &[Param]) -> Result<(), ArgMismatch> {
        if let Some((index, found)) = self.first_wrong
            && let Some(&param) = params.get(index)
        {
            return Err(ArgMismatch::Size {
                index,
                param,
                found,
            });
        }
        if self.pushed != params.len() {
            return Err(ArgMismatch::Count {
                expected: params.len(),
                found: self.pushed,
                missing: params.get(self.pushed).copied(),
            });
        }
        Ok(())
    }
}

/// A crate's modules loaded into fixed slots: `M` modules and `K` kernels, in declaration
/// order (module by module, kernels in each module's order). The generated `Kernels`
/// wraps one, and indexes it with its `ModuleId` and `KernelId`.
pub struct Registry<const M: usize, const K: usize> {
    modules: [Module; M],
    kernels: [Kernel; K],
}

impl<const M: usize, const K: usize> fmt::Debug for Registry<M, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field(
                "modules",
                &self.modules.iter().map(Module::name).collect::<Vec<_>>(),
            )
            .field("kernels", &K)
            .finish()
    }
}

impl<const M: usize, const K: usize> Registry<M, K> {
    /// Loads every declared module ([`Module::load_declared`]) and looks up every kernel
    /// with its declaration checked ([`Module::declared_kernel`]); the first failure is
    /// the error.
    pub fn load(device: &Device, decls: &'static [ModuleDecl; M]) -> Result<Self> {
        let total: usize = decls.iter().map(|m| m.kernels.len()).sum();
        if total != K {
            return Err(Error::Argument {
                what: "kernel registry".into(),
                expected: format!("declarations of {K} kernels, one for each of its slots"),
                found: format!("{total} kernels declared"),
            });
        }
        let mut modules = Vec::with_capacity(M);
        let mut kernels = Vec::with_capacity(K);
        for decl in decls {
            let module = Module::load_declared(device, decl)?;
            for k in decl.kernels {
                kernels.push(module.declared_kernel(k)?);
            }
            modules.push(module);
        }
        // The counts were checked above, so neither conversion fails; the error keeps the
        // library free of a panic path all the same.
        let slots = || Error::Internal {
            what: "kernel registry: a slot went missing".into(),
        };
        Ok(Registry {
            modules: modules.try_into().map_err(|_| slots())?,
            kernels: kernels.try_into().map_err(|_| slots())?,
        })
    }

    /// Module `index`, in declaration order.
    ///
    /// # Panics
    /// If `index >= M`; a generated `ModuleId::index` never is.
    pub fn module(&self, index: usize) -> &Module {
        &self.modules[index]
    }

    /// Kernel `index`, in declaration order.
    ///
    /// # Panics
    /// If `index >= K`; a generated `KernelId::index` never is.
    pub fn kernel(&self, index: usize) -> &Kernel {
        &self.kernels[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static AXPBY: KernelDecl = KernelDecl::new(
        "axpby",
        &[
            ParamDecl::new("x", "const float*", 8),
            ParamDecl::new("y", "float*", 8),
            ParamDecl::new("n", "unsigned", 4),
            ParamDecl::new("a", "float", 4),
            ParamDecl::new("b", "float", 4),
        ],
    );

    const LOADED: [(usize, usize); 5] = [(0, 8), (8, 8), (16, 4), (20, 4), (24, 4)];

    #[test]
    fn a_kernel_name_with_a_nul_byte_is_refused_before_the_driver() {
        check_kernel_name("dqn", "adam_update").unwrap();
        let e = check_kernel_name("dqn", "adam\0update").unwrap_err();
        assert!(
            matches!(&e, Error::Argument { what, found, .. }
                if what.contains("`dqn`") && found == "one at byte 4"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "kernel name \"adam\\0update\" in module `dqn`: expected a name without NUL \
             bytes (the driver takes a C string), found one at byte 4"
        );
    }

    #[test]
    fn a_declaration_that_matches_the_driver_gives_named_parameters() {
        let params = check_declared("elementwise", &AXPBY, &LOADED).unwrap();
        assert_eq!(params.len(), 5);
        assert_eq!(
            params[2],
            Param {
                offset: 16,
                size: 4,
                name: Some("n"),
                c_type: Some("unsigned")
            }
        );
    }

    #[test]
    fn a_declaration_of_another_count_or_size_is_an_error_naming_kernel_and_parameter() {
        let mut loaded = LOADED.to_vec();
        loaded[2] = (16, 8);
        let e = check_declared("elementwise", &AXPBY, &loaded).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel `axpby` in module `elementwise`: parameter 2 `n` is declared unsigned (4 \
             bytes), the loaded kernel takes 8 bytes"
        );
        let e = check_declared("elementwise", &AXPBY, &LOADED[..4]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel `axpby` in module `elementwise`: declared with 5 parameters, the loaded \
             kernel takes 4"
        );
        assert!(matches!(
            e,
            Error::KernelSignature {
                mismatch: SignatureMismatch::Count {
                    declared: 5,
                    loaded: 4
                },
                ..
            }
        ));
    }

    static IMAGES: [Image; 2] = [
        Image::cubin("sm_90a", b"cubin"),
        Image::ptx("compute_90", b"ptx\0"),
    ];
    static IMAGE_REFS: [&Image; 2] = [&IMAGES[0], &IMAGES[1]];

    fn refused(image: &Image) -> Error {
        Error::Invalid(format!("refused {}", image.target))
    }

    fn no_image() -> Error {
        Error::Invalid("no image".into())
    }

    #[test]
    fn the_first_image_the_driver_accepts_is_the_one_recorded() {
        let mut tried = Vec::new();
        let (_, image) = first_accepted(
            &IMAGE_REFS,
            |image| {
                tried.push(image.target);
                Ok(())
            },
            no_image,
        )
        .unwrap();
        assert_eq!((image.kind, image.target), (ImageKind::Cubin, "sm_90a"));
        assert_eq!(tried, ["sm_90a"]);

        // The sm_90a cubin refused (another GPU): the PTX fallback is the one kept.
        let (_, image) = first_accepted(
            &IMAGE_REFS,
            |image| match image.kind {
                ImageKind::Cubin => Err(refused(image)),
                ImageKind::Ptx => Ok(()),
            },
            no_image,
        )
        .unwrap();
        assert_eq!((image.kind, image.target), (ImageKind::Ptx, "compute_90"));
    }

    #[test]
    fn when_every_image_is_refused_the_error_is_the_first_refusal() {
        let e = first_accepted(&IMAGE_REFS, |image| Err::<(), _>(refused(image)), no_image)
            .unwrap_err();
        assert_eq!(e.to_string(), "refused sm_90a");
        let e = first_accepted(&[], |_| Ok(()), no_image).unwrap_err();
        assert_eq!(e.to_string(), "no image");
    }

    #[test]
    fn dynamic_shared_memory_past_an_int_is_refused_before_the_driver() {
        assert_eq!(
            dynamic_shared_arg("gemm", "wgmma_tile", 200 * 1024).unwrap(),
            204_800
        );
        assert_eq!(
            dynamic_shared_arg("gemm", "wgmma_tile", i32::MAX as u32).unwrap(),
            i32::MAX
        );
        let e = dynamic_shared_arg("gemm", "wgmma_tile", u32::MAX).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooLarge {
                    found: 4_294_967_295,
                    max: 2_147_483_647,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "kernel `wgmma_tile` in module `gemm`: bytes of dynamic shared memory per block: \
             expected at most 2147483647, found 4294967295 (the driver takes an int)"
        );
    }

    #[test]
    fn a_refused_dynamic_shared_opt_in_names_the_kernel_the_request_and_the_limit() {
        let refusal = |optin, static_bytes| Error::DynamicShared {
            module: "gemm",
            kernel: "wgmma_tile",
            bytes: 240 * 1024,
            optin,
            static_bytes,
            source: DriverError(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        let head = "kernel `wgmma_tile` in module `gemm`: the driver refused 245760 bytes of \
                    dynamic shared memory per block; ";
        assert_eq!(
            refusal(Some(232_448), Some(0)).to_string(),
            format!("{head}the device allows at most 232448 (its opt-in maximum)")
        );
        assert_eq!(
            refusal(Some(232_448), Some(1024)).to_string(),
            format!(
                "{head}the device allows at most 231424 (its opt-in maximum of 232448 less \
                 the kernel's 1024 bytes of static shared memory)"
            )
        );
        assert_eq!(
            refusal(Some(232_448), None).to_string(),
            format!(
                "{head}the device's opt-in maximum is 232448, less the kernel's static shared \
                 memory (which could not be read)"
            )
        );
        assert_eq!(
            refusal(None, Some(0)).to_string(),
            format!("{head}the device's opt-in maximum could not be read")
        );
        // The driver's status stays the source, for the chain.
        assert!(std::error::Error::source(&refusal(None, None)).is_some());
    }

    fn launch_error(sizes: &[usize], params: &[Param]) -> Option<String> {
        let mut check = ArgCheck::default();
        for &s in sizes {
            check.push(params, s);
        }
        check.finish(params).err().map(|mismatch| {
            Error::LaunchArguments {
                kernel: "axpby",
                mismatch,
            }
            .to_string()
        })
    }

    #[test]
    fn launches_are_checked_in_count_and_size() {
        let declared = check_declared("elementwise", &AXPBY, &LOADED).unwrap();
        assert_eq!(launch_error(&[8, 8, 4, 4, 4], &declared), None);
        assert_eq!(
            launch_error(&[8, 8, 4, 4], &declared).unwrap(),
            "kernel `axpby` was not launched: it takes 5 arguments, the launch passed 4 (the \
             first missing is argument 4 `b`, float)"
        );
        assert_eq!(
            launch_error(&[8, 8, 8, 4, 4], &declared).unwrap(),
            "kernel `axpby` was not launched: argument 2 `n` is unsigned (4 bytes), the launch \
             passed 8 bytes"
        );
        assert_eq!(
            launch_error(&[8, 8, 4, 4, 4, 4], &declared).unwrap(),
            "kernel `axpby` was not launched: it takes 5 arguments, the launch passed 6"
        );
        // Looked up by name only: sizes from the driver, no names.
        let bare: Vec<Param> = LOADED
            .iter()
            .map(|&(offset, size)| Param {
                offset,
                size,
                name: None,
                c_type: None,
            })
            .collect();
        assert_eq!(
            launch_error(&[8, 4, 4, 4, 4], &bare).unwrap(),
            "kernel `axpby` was not launched: argument 1 takes 8 bytes, the launch passed 4"
        );
        assert_eq!(
            launch_error(&[8, 8, 4], &bare).unwrap(),
            "kernel `axpby` was not launched: it takes 5 arguments, the launch passed 3 (the \
             first missing is argument 3)"
        );
    }
}
