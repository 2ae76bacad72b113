//! The crate's one error type.

use cudarc::cublaslt::result::CublasError;
use cudarc::driver::DriverError;

mod kernel;

pub use kernel::{ArgMismatch, Param, SignatureMismatch};

/// Result alias used throughout stepgraph and by the ops users write.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong building, capturing or replaying a step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA driver call failed; the driver's status is the source.
    #[error("CUDA driver call `{call}` failed")]
    Driver {
        /// The driver entry point or stepgraph operation that failed.
        call: &'static str,
        /// The driver's status.
        #[source]
        source: DriverError,
    },
    /// A cuBLASLt call failed.
    #[error("cuBLASLt call `{call}` failed")]
    Blas {
        /// The cuBLASLt entry point that failed.
        call: &'static str,
        /// The library's status.
        #[source]
        source: CublasError,
    },
    /// A shared library stepgraph loads at run time is not on the loader's path.
    #[error("the CUDA library `{library}` was not found (looked for {candidates}); {hint}")]
    LibraryMissing {
        /// The library's short name (`cuda`, `cublasLt`, `nccl`).
        library: &'static str,
        /// The file names that were tried.
        candidates: String,
        /// How to install it or make it found.
        hint: &'static str,
    },
    /// An NCCL call failed.
    #[error("NCCL call `{call}` failed: {code} ({message})")]
    Nccl {
        /// The NCCL entry point that failed.
        call: &'static str,
        /// The `ncclResult_t` name.
        code: String,
        /// NCCL's own description of the code.
        message: String,
    },
    /// The driver sees no GPU with this ordinal.
    #[error("no CUDA device with ordinal {ordinal}: the driver sees {count} device(s)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: i32,
    },
    /// The GPU is older than the kernels' target.
    #[error(
        "GPU {ordinal} ({name}) has compute capability {major}.{minor}; stepgraph needs 8.0 or \
         newer (Ampere, Ada, Hopper and later): its kernels are built from compute_80 on"
    )]
    UnsupportedDevice {
        /// The ordinal.
        ordinal: usize,
        /// The device's name.
        name: String,
        /// Compute capability found.
        major: i32,
        /// Compute capability found.
        minor: i32,
    },
    /// An allocation failed for want of device memory.
    #[error(
        "out of device memory allocating {what} ({bytes} bytes requested, {free} of {total} bytes free)"
    )]
    OutOfMemory {
        /// What was being allocated (a buffer, a workspace, a scratch copy).
        what: String,
        /// The size asked for.
        bytes: usize,
        /// Free device memory at the time.
        free: usize,
        /// Total device memory.
        total: usize,
    },
    /// Two buffers that an operation pairs have different lengths.
    #[error("{what}: expected {expected} elements, found {found}")]
    LengthMismatch {
        /// The operation and operand.
        what: String,
        /// The length required.
        expected: usize,
        /// The length given.
        found: usize,
    },
    /// A range of elements outside the buffer it was taken from (a view, a declared
    /// view's span).
    #[error("{what}: expected elements within 0..{len}, found {start}..{end}")]
    OutOfBounds {
        /// The view or call, naming the buffer where known.
        what: String,
        /// The first element asked for.
        start: usize,
        /// One past the last element asked for.
        end: usize,
        /// The buffer's length.
        len: usize,
    },
    /// An op of a step returned an error.
    #[error("op `{op}` on stream `{stream}` failed")]
    Op {
        /// The op's name (`branch_fwd[2]`).
        op: &'static str,
        /// The stream it was issued on.
        stream: &'static str,
        /// What went wrong: an [`Error`] (boxed as a trait object, so that walking the
        /// chain with [`source`](std::error::Error::source) and downcasting finds it).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Capturing a step failed; the partial capture was discarded and the step keeps the
    /// graph it had before, if any.
    #[error("capturing step `{step}` failed")]
    Capture {
        /// The step.
        step: &'static str,
        /// What went wrong: an [`Error`], boxed as for [`Error::Op`].
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A matmul ran inside capture with a shape that was not planned before capture.
    #[error(
        "matmul {shape} was not planned before capture: plans are built and warmed in the dry \
         pass that precedes capture, so an op must issue the same matmuls on every pass"
    )]
    MatmulNotPlanned {
        /// The matmul's shape and types.
        shape: String,
    },
    /// cuBLASLt's heuristic offered no algorithm for a matmul.
    #[error("cuBLASLt has no algorithm for matmul {shape}")]
    NoMatmulAlgorithm {
        /// The matmul's shape and types.
        shape: String,
    },
    /// A kernel named by the registry is missing from its module.
    #[error("kernel `{kernel}` not found in module `{module}`")]
    KernelMissing {
        /// The module.
        module: &'static str,
        /// The kernel.
        kernel: &'static str,
        /// The driver's status.
        #[source]
        source: DriverError,
    },
    /// A kernel's declared parameter list (generated by `stepgraph-build` from its CUDA
    /// signature) differs from the loaded kernel's in count or in a parameter's size.
    #[error("kernel `{kernel}` in module `{module}`: {mismatch}")]
    KernelSignature {
        /// The module.
        module: &'static str,
        /// The kernel.
        kernel: &'static str,
        /// What differs.
        mismatch: SignatureMismatch,
    },
    /// A launch's arguments differ from its kernel's parameters in number or size; it was
    /// refused before reaching the driver.
    #[error("kernel `{kernel}` was not launched: {mismatch}")]
    LaunchArguments {
        /// The kernel.
        kernel: &'static str,
        /// What differs: the argument, what the kernel takes and what was passed.
        mismatch: ArgMismatch,
    },
    /// The driver refused a kernel's opt-in to more dynamic shared memory per block
    /// ([`Kernel::set_max_dynamic_shared`](crate::Kernel::set_max_dynamic_shared)).
    #[error(
        "kernel `{kernel}` in module `{module}`: the driver refused {bytes} bytes of dynamic \
         shared memory per block; {}",
        kernel::shared_limit(*.optin, *.static_bytes)
    )]
    DynamicShared {
        /// The module.
        module: &'static str,
        /// The kernel.
        kernel: &'static str,
        /// The bytes asked for.
        bytes: u32,
        /// The device's opt-in maximum per block
        /// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`), if it could be read.
        optin: Option<u32>,
        /// The kernel's static shared memory, which counts against the same maximum, if it
        /// could be read.
        static_bytes: Option<u32>,
        /// The driver's status.
        #[source]
        source: DriverError,
    },
    /// The captured graph does not match the plan (a race, a false serialisation, or an
    /// op whose nodes differ from what it issued); the message names the ops.
    #[error("the captured graph does not match the plan: {what}")]
    Verify {
        /// What differs, naming the ops and their streams.
        what: String,
    },
    /// A host-side call (a synchronise, an allocation, a copy to or from the host, a new
    /// stream or session, a replay of a step) made from inside an op while it was being
    /// issued: it would break the capture or escape it.
    #[error(
        "op `{op}` of step `{step}` called `{call}` while it was being issued: a host-side \
         call inside an op breaks or escapes the capture; make it before or after the \
         step's replay"
    )]
    HostCallInOp {
        /// The step.
        step: &'static str,
        /// The op.
        op: &'static str,
        /// The call (`Device::download`, `Step::replay`).
        call: &'static str,
    },
    /// Code an op called made a CUDA call that escapes the op's capture (work on another
    /// stream, a synchronisation, an allocation, a capture of its own), seen by the capture
    /// guard while the step was captured; the capture was discarded.
    #[error("op `{op}` of step `{step}` called `{call}` {what}{}", more_calls(*.more))]
    Escape {
        /// The step.
        step: &'static str,
        /// The op.
        op: &'static str,
        /// The CUDA entry point (`cuMemsetD8Async`, `cudaMemcpyAsync`).
        call: String,
        /// Where it went and why that escapes the capture.
        what: String,
        /// How many more of the op's calls escaped.
        more: usize,
    },
    /// An op wrote device memory that none of its `&mut` parameters holds (a buffer in a
    /// `static`, in the kernels type, in a global): the plan cannot order what it cannot
    /// see, so that write races with every other op that touches the memory.
    #[error(
        "op `{op}` of step `{step}` writes memory that none of its `&mut` parameters holds \
         ({what}: {bytes} bytes at {address:#x}): a buffer an op reaches another way (a \
         static, the kernels type, a global) is shared by every op and stream, unordered by \
         the plan; make it a buffer of the step and take it `&mut`"
    )]
    UngrantedWrite {
        /// The step.
        step: &'static str,
        /// The op.
        op: &'static str,
        /// The write (`copy destination`, `argument 2 of kernel `scale``).
        what: String,
        /// Where it writes.
        address: u64,
        /// How many bytes.
        bytes: usize,
    },
    /// An op swapped or assigned one of its `&mut` buffers while it was issued.
    #[error(
        "op `{op}` of step `{step}` replaced buffer `{buffer}` while it was issued (a \
         `std::mem::swap`, `replace` or assignment through its `&mut`): the graph keeps the \
         allocation of capture time and the host would see another; write the buffer in \
         place, or rebind the step's buffers between replays with Step::rebind"
    )]
    BufferReplaced {
        /// The step.
        step: &'static str,
        /// The op.
        op: &'static str,
        /// The parameter's buffer.
        buffer: &'static str,
    },
    /// The capture guard could not watch a capture (CUPTI missing, or held by another
    /// tool); nothing was captured.
    #[error(
        "the capture guard could not watch the capture: {why}. It refuses the CUDA calls an \
         op makes outside its capture stream; to capture without it (as under a profiler \
         that holds CUPTI), turn it off with Options::with_capture_guard(false) or \
         STEPGRAPH_CAPTURE_GUARD=0"
    )]
    CaptureGuard {
        /// What failed.
        why: String,
    },
    /// An op left its stream's capture invalidated or ended without a CUDA call that
    /// reported it (cudarc code that ignored an error, a call on another stream); the
    /// capture was discarded. Find what the op issues outside its capture stream.
    #[error(
        "the op left its stream's capture {state}: something it issued broke the capture (a \
         synchronisation, work on the legacy default stream, a wait on an event recorded \
         outside the capture, an end of capture)"
    )]
    CaptureBroken {
        /// `invalidated` or `ended`.
        state: &'static str,
    },
    /// A matmul description ([`Matmul`](crate::Matmul)) or the operands of a call that
    /// cuBLASLt cannot run: a zero or oversized dimension, a leading dimension below the
    /// stored columns, an epilogue that takes no batch, buffers of the wrong element type,
    /// a bias or aux missing or given where the epilogue takes none, an SM target beyond
    /// the GPU. Refused before anything runs; change the description or the arguments.
    #[error("matmul {shape}: {problem}")]
    Matmul {
        /// The matmul's shape and types, as [`Matmul`](crate::Matmul) displays them.
        shape: String,
        /// What is wrong, with what was expected and what was found.
        problem: String,
    },
    /// A setting stepgraph reads from text (an environment switch such as
    /// [`VERIFY`](crate::env::VERIFY), the text of
    /// [`Options::with_stream_priorities`](crate::Options::with_stream_priorities), an
    /// [`SmTarget`](crate::SmTarget), a DOT path) that does not parse or names nothing
    /// the step has. Fix the setting named by `name`.
    #[error("{name}: expected {expected}, found {found}")]
    Config {
        /// The environment variable or setting.
        name: &'static str,
        /// What it accepts.
        expected: String,
        /// What it was given.
        found: String,
    },
    /// An argument of a stepgraph call outside what the call accepts (a communicator's
    /// rank, an `#[every]` count, a kernel's name); nothing was done.
    #[error("{what}: expected {expected}, found {found}")]
    Argument {
        /// The call and argument.
        what: String,
        /// What the call accepts.
        expected: String,
        /// What it was given.
        found: String,
    },
    /// A size or count larger than the driver, a library or stepgraph takes: a value
    /// passed to the driver as a C `int`, a length whose size in bytes overflows, more
    /// replays than a profile keeps. Nothing was done; use a smaller one (split the work).
    #[error("{what}: expected at most {max}, found {found} ({why})")]
    TooLarge {
        /// The quantity, naming the call, kernel or buffer.
        what: String,
        /// The value given.
        found: u64,
        /// The largest value accepted.
        max: u64,
        /// Where the limit comes from (`the driver takes an int`).
        why: &'static str,
    },
    /// A declared module has no image this process may load: it declares none, or
    /// [`PORTABLE`](crate::env::PORTABLE) is set and it has no PTX image. Build the
    /// module with a `compute_` target (PTX), or unset the switch.
    #[error("module `{module}` ({origin}): {}", no_image(*.portable, .images))]
    NoModuleImage {
        /// The module.
        module: &'static str,
        /// The source it was built from.
        origin: &'static str,
        /// The targets of the images it declares (`sm_90a`, `compute_80`).
        images: Vec<&'static str>,
        /// Whether [`PORTABLE`](crate::env::PORTABLE) restricted loading to PTX images.
        portable: bool,
    },
    /// The CUDA driver lacks a call stepgraph uses: it is older than the release that
    /// added it. Update the driver.
    #[error(
        "the CUDA driver is {}; {feature} needs driver {} or newer",
        driver_version(*.found),
        driver_version(*.needed)
    )]
    DriverTooOld {
        /// What needs the newer driver.
        feature: &'static str,
        /// The driver's version, as `cuDriverGetVersion` reports it (12040 for 12.4).
        found: i32,
        /// The oldest version that has the feature.
        needed: i32,
    },
    /// A cudarc value handed to stepgraph (a context, a slice) that a capture cannot use:
    /// it belongs to another context, or its context tracks events. Hand over one of the
    /// device's context with event tracking off.
    #[error("{what}: {problem}")]
    Interop {
        /// The value and the call it was given to.
        what: String,
        /// What differs from what stepgraph needs, and why it matters.
        problem: String,
    },
    /// A step was replayed, or its graph inspected, before it was captured, or after its
    /// graph went stale (buffers rebound, orderings added) without a new capture. Capture
    /// it again and retry.
    #[error(
        "step `{step}` {}",
        if *.stale {
            "must be captured again before it is replayed: its graph is stale"
        } else {
            "has not been captured yet"
        }
    )]
    NotCaptured {
        /// The step.
        step: &'static str,
        /// Whether it had a graph that went stale (else it never had one).
        stale: bool,
    },
    /// A host input or output ([`HostInput`](crate::HostInput),
    /// [`HostOutput`](crate::HostOutput)) used where its ring cannot serve: empty, copied
    /// by two steps, not copied by any op of the step that reads it, or read back before
    /// any replay wrote it.
    #[error("`{buffer}` {problem}")]
    HostIo {
        /// The host buffer's name.
        buffer: String,
        /// What is wrong with it (`is copied by the graph of another step`), with what was
        /// expected.
        problem: String,
    },
    /// Work that must run at every replay (a host copy, an NCCL collective) issued from an
    /// `#[every]` or `#[when]` op, whose body runs only when its condition holds. Issue it
    /// from an op without a condition.
    #[error("{what} inside an #[every] or #[when] op: {why}")]
    InConditional {
        /// The work, naming its buffer.
        what: String,
        /// Why a conditional body cannot hold it.
        why: &'static str,
    },
    /// Timing a kernel of an op on its own (for
    /// [`Step::work_bound`](crate::Step::work_bound)) failed; the source says why.
    #[error("timing a kernel of op `{op}` alone failed")]
    Measure {
        /// The op.
        op: &'static str,
        /// What went wrong: an [`Error`], boxed as for [`Error::Op`].
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Work stepgraph waits for did not finish in time.
    #[error("{what} did not finish within {seconds} s: {why}")]
    Timeout {
        /// The work.
        what: &'static str,
        /// The deadline.
        seconds: u64,
        /// The likely cause.
        why: &'static str,
    },
    /// A step launched on shared memory ([`Shared`](crate::Shared)) that was replaced
    /// since the step was captured: its graph still refers to the old memory. Capture it
    /// again ([`Step::recapture`](crate::Step::recapture)) before launching it.
    #[error(
        "step `{step}` was captured with shared buffer `{buffer}` (field `{field}`), which {} \
         has since replaced with other memory: capture `{step}` again (`Step::recapture`) \
         before launching it",
        match by { Some(s) => format!("step `{s}`"), None => "the host".to_string() }
    )]
    SharedRebound {
        /// The step that would have run on the old memory.
        step: &'static str,
        /// The shared buffer's name ([`Shared::new`](crate::Shared::new)).
        buffer: String,
        /// The field of the step's buffers that holds it.
        field: &'static str,
        /// The step whose rebind replaced the memory (`None`: the host, outside any
        /// step's rebind).
        by: Option<&'static str>,
    },
    /// A shared buffer ([`Shared`](crate::Shared)) that another holder uses now: a step
    /// whose ops are being issued on another thread (a capture, an eager run), or the
    /// host through [`Shared::host`](crate::Shared::host).
    #[error(
        "{} needs shared buffer `{buffer}`, which {} holds now: {}",
        holder_text(step),
        holder_text(holder),
        if *holder == "the host" {
            "drop the host's hold (`Shared::host`) first"
        } else {
            "a step's capture or eager run holds its shared buffers until it ends; issue the \
             steps that share a buffer from one thread at a time"
        }
    )]
    SharedBusy {
        /// The step (or `the host`) that asked for it.
        step: &'static str,
        /// The shared buffer's name.
        buffer: String,
        /// Who holds it: a step, or `the host`.
        holder: &'static str,
    },
    /// An invariant of stepgraph's own does not hold: a bug in stepgraph (or a driver
    /// that behaves unlike its documentation), not in the program. Nothing the caller
    /// changes is expected to avoid it; report it with the message.
    #[error("internal error in stepgraph: {what}; this is a bug, please report it")]
    Internal {
        /// The invariant that failed.
        what: String,
    },
    /// A plan with an index out of range ([`PlanDesc::check`](crate::PlanDesc::check)).
    #[error(transparent)]
    Plan(#[from] stepgraph_plan::PlanError),
    /// An error of the program's own ops, told in a message: what an op returns when an
    /// argument is outside what it accepts (`Error::Invalid(format!("expected 4 rows,
    /// found {rows}"))`). stepgraph's own errors use the structured variants above, so a
    /// caller can match on them; this one it returns for none of them.
    #[error("{0}")]
    Invalid(String),
    /// An error of the program's own code, inside an op: an existing function that
    /// returns its own error type ([`Error::external`]). Walking the chain finds it.
    #[error(transparent)]
    External(Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// The message of this error and of every error under it, outermost first, joined by
    /// `: ` (what `anyhow`'s `{:#}` prints): for logs and tests that want the whole chain
    /// in one line.
    ///
    /// ```
    /// use stepgraph::Error;
    ///
    /// let e = Error::Op {
    ///     op: "trunk",
    ///     stream: "main",
    ///     source: Box::new(Error::Invalid("expected 4 rows, found 3".into())),
    /// };
    /// assert_eq!(e.to_string(), "op `trunk` on stream `main` failed");
    /// assert_eq!(e.chain(), "op `trunk` on stream `main` failed: expected 4 rows, found 3");
    /// ```
    pub fn chain(&self) -> String {
        let mut msg = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            source = s.source();
        }
        msg
    }

    /// This error and every [`Error`] under it, outermost first: the way to find, say,
    /// the [`Error::HostCallInOp`] under a failed capture.
    ///
    /// ```
    /// use stepgraph::Error;
    ///
    /// let e = Error::Capture {
    ///     step: "dqn",
    ///     source: Box::new(Error::Op {
    ///         op: "trunk",
    ///         stream: "main",
    ///         source: Box::new(Error::Invalid("expected 4 rows, found 3".into())),
    ///     }),
    /// };
    /// let innermost = e.errors().last().unwrap();
    /// assert!(matches!(innermost, Error::Invalid(m) if m.contains("4 rows")));
    /// ```
    pub fn errors(&self) -> impl Iterator<Item = &Error> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        std::iter::from_fn(move || {
            while let Some(e) = next {
                next = e.source();
                if let Some(ours) = e.downcast_ref::<Error>() {
                    return Some(ours);
                }
            }
            None
        })
    }

    /// Wraps an error of the program's own, for an op that calls existing code:
    /// `existing(..).map_err(Error::external)?`.
    ///
    /// ```
    /// use stepgraph::Error;
    ///
    /// #[derive(Debug)]
    /// struct Mine;
    /// impl std::fmt::Display for Mine {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         f.write_str("the trainer's own error")
    ///     }
    /// }
    /// impl std::error::Error for Mine {}
    ///
    /// let e = Error::external(Mine);
    /// assert_eq!(e.to_string(), "the trainer's own error");
    /// ```
    pub fn external(e: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::External(Box::new(e))
    }

    /// Wraps a driver error with the call that produced it.
    pub fn driver(call: &'static str) -> impl FnOnce(DriverError) -> Error {
        move |source| Error::Driver { call, source }
    }

    /// Wraps a cuBLASLt error with the call that produced it.
    pub fn blas(call: &'static str) -> impl FnOnce(CublasError) -> Error {
        move |source| Error::Blas { call, source }
    }
}

/// Why a declared module has no image to load.
/// How a holder of a shared buffer reads in a message: a step by name, or the host.
fn holder_text(who: &str) -> String {
    if who == "the host" {
        who.to_string()
    } else {
        format!("step `{who}`")
    }
}

fn no_image(portable: bool, images: &[&str]) -> String {
    if portable && !images.is_empty() {
        format!(
            "{}=1 loads PTX images only, and it has none (its images: {}); build it with a \
             compute_ target",
            crate::env::PORTABLE,
            images.join(", ")
        )
    } else {
        "declares no image to load".to_string()
    }
}

/// A driver version as `major.minor` (12040 is `12.4`).
fn driver_version(v: i32) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

/// ` (and N more such calls)`, or nothing.
fn more_calls(more: usize) -> String {
    match more {
        0 => String::new(),
        1 => " (and 1 more such call)".to_string(),
        n => format!(" (and {n} more such calls)"),
    }
}

/// `Ok` when `found` is `expected`, else [`Error::LengthMismatch`] naming `what`: the one
/// length check of the crate's operands.
pub(crate) fn check_len(what: impl Into<String>, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        return Ok(());
    }
    Err(Error::LengthMismatch {
        what: what.into(),
        expected,
        found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_without_a_loadable_image_says_why() {
        let portable = Error::NoModuleImage {
            module: "dqn",
            origin: "dqn.cu",
            images: vec!["sm_90a", "sm_80"],
            portable: true,
        };
        assert_eq!(
            portable.to_string(),
            "module `dqn` (dqn.cu): STEPGRAPH_PORTABLE=1 loads PTX images only, and it has \
             none (its images: sm_90a, sm_80); build it with a compute_ target"
        );
        let none = Error::NoModuleImage {
            module: "dqn",
            origin: "dqn.cu",
            images: Vec::new(),
            portable: false,
        };
        assert_eq!(
            none.to_string(),
            "module `dqn` (dqn.cu): declares no image to load"
        );
    }

    #[test]
    fn messages_name_the_driver_versions_and_whether_a_graph_went_stale() {
        let old = Error::DriverTooOld {
            feature: "checking kernel parameter lists with cuFuncGetParamInfo",
            found: 12030,
            needed: 12040,
        };
        assert_eq!(
            old.to_string(),
            "the CUDA driver is 12.3; checking kernel parameter lists with cuFuncGetParamInfo \
             needs driver 12.4 or newer"
        );
        let never = Error::NotCaptured {
            step: "dqn",
            stale: false,
        };
        assert_eq!(never.to_string(), "step `dqn` has not been captured yet");
        let stale = Error::NotCaptured {
            step: "dqn",
            stale: true,
        };
        assert!(stale.to_string().contains("captured again"), "{stale}");
    }

    #[test]
    fn an_internal_error_says_it_is_a_bug_and_a_measure_error_keeps_its_cause() {
        let e = Error::Internal {
            what: "a slot went missing".into(),
        };
        assert_eq!(
            e.to_string(),
            "internal error in stepgraph: a slot went missing; this is a bug, please report it"
        );
        let e = Error::Measure {
            op: "trunk",
            source: Box::new(Error::Timeout {
                what: "a kernel run alone",
                seconds: 30,
                why: "it waits for work of the step that is not copied with it",
            }),
        };
        assert!(matches!(
            e.errors().last(),
            Some(Error::Timeout { seconds: 30, .. })
        ));
        assert_eq!(
            e.chain(),
            "timing a kernel of op `trunk` alone failed: a kernel run alone did not finish \
             within 30 s: it waits for work of the step that is not copied with it"
        );
    }
}
