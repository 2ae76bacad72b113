//! The capture stream an op receives, and kernel launches on it.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{
    CudaStream, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};

use crate::blas::{Blas, BlasHandle, SmTarget};
use crate::driver::memory::{DeviceMem, DeviceMemMut};
use crate::driver::module::{ArgCheck, Kernel};
use crate::error::{Error, Result};
use crate::op::flag::DeviceFlag;
use crate::op::host_io::{self, Captured, HostInput, HostOutput, IoKind, IoPass};
use crate::op::scalars::DeviceScalars;
pub use crate::scope::{Mode, OpCounts};

/// The stream an op is issued on, during capture.
///
/// It can launch kernels, run cuBLASLt matmuls (through [`Blas`]), copy device to device,
/// memset and refresh device scalars. It has no way to synchronise, to allocate or to copy
/// to the host: each of those breaks or stalls a stream capture, so an op that tries one
/// does not compile.
///
/// ```compile_fail
/// fn bad(stream: &stepgraph::CaptureStream<'_>) {
///     stream.synchronize(); // no such method: a capture cannot wait for the host
/// }
/// ```
pub struct CaptureStream<'a> {
    pub(crate) stream: &'a Arc<CudaStream>,
    pub(crate) mode: Mode,
    pub(crate) name: &'static str,
    pub(crate) blas: &'a BlasHandle,
    /// What the op issued on this stream, for the verifier.
    pub(crate) counts: Cell<OpCounts>,
    /// The pass's copies to and from host rings; `None` inside a conditional op, whose
    /// copies could not be pointed at a new slot per replay.
    pub(crate) io: Option<&'a IoPass>,
    /// The op runs under a condition (`#[every]`, `#[when]`): its work is a conditional
    /// node's body.
    pub(crate) conditional: bool,
}

impl fmt::Debug for CaptureStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureStream")
            .field("name", &self.name)
            .field("mode", &self.mode)
            .finish()
    }
}

impl<'a> CaptureStream<'a> {
    /// The plan's name of the stream this op is placed on (`main`, `branch[2]`). In a
    /// one-stream baseline capture the op still reports its planned stream.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// How this pass treats issued work.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// This stream's cuBLASLt handle and workspace.
    pub fn blas(&self) -> Blas<'_> {
        Blas {
            handle: self.blas,
            stream: self.stream,
            mode: self.mode,
            counts: Some(&self.counts),
            sm_target: SmTarget::Whole,
        }
    }

    /// Starts a kernel launch; add arguments in the kernel's parameter order, then call
    /// [`Launch::launch`], which checks them against the kernel's parameter list.
    ///
    /// A crate's kernels built with `stepgraph-build` have typed launchers that do this
    /// for each kernel (see [`include_kernels!`](crate::include_kernels)); this is the way
    /// for a kernel without one.
    pub fn launch<'b>(&'b self, kernel: &'b Kernel) -> Launch<'b> {
        Launch {
            args: self.stream.launch_builder(kernel.function()),
            mode: self.mode,
            kernel,
            check: ArgCheck::default(),
            counts: &self.counts,
            refused: None,
        }
    }

    pub(crate) fn count(&self, f: impl FnOnce(&mut OpCounts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }

    /// Sets every element of `buf` (a buffer or a view) to zero bits.
    pub fn memset_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        buf: &mut impl DeviceMemMut<T>,
    ) -> Result<()> {
        crate::driver::memory::check_write_mem(buf, || "memset".into())?;
        if self.mode.enqueues() {
            let bytes = buf.len() * size_of::<T>();
            self.bind()?;
            // SAFETY: the address and length are those of live device memory borrowed
            // mutably for this call (a captured memset's memory is kept alive by the step
            // that owns the graph).
            unsafe {
                crate::driver::transfer::memset_d8(self.stream, buf.device_address(), 0, bytes)
            }
            .map_err(Error::driver("cuMemsetD8Async"))?;
        }
        self.count(|c| c.memsets += 1);
        Ok(())
    }

    /// Sets or clears `flag` (a captured memset), for a `#[when(flag)]` op later in the
    /// step or in a later replay. A kernel of the op's own may write it instead, to decide
    /// from the data.
    pub fn set_flag(&self, flag: &mut DeviceFlag, set: bool) -> Result<()> {
        crate::driver::memory::check_write_mem(flag, || "set_flag".into())?;
        if self.mode.enqueues() {
            self.bind()?;
            // SAFETY: the address is that of the flag's one live u32, borrowed mutably for
            // this call (a captured memset's memory is kept alive by the step that owns
            // the graph).
            unsafe {
                crate::driver::transfer::memset_d32(
                    self.stream,
                    flag.device_address(),
                    u32::from(set),
                    1,
                )
            }
            .map_err(Error::driver("cuMemsetD32Async"))?;
        }
        self.count(|c| c.memsets += 1);
        Ok(())
    }

    /// Copies `src` into `dst` (buffers or views); both must have the same length.
    pub fn copy<T: DeviceRepr>(
        &self,
        src: &impl DeviceMem<T>,
        dst: &mut impl DeviceMemMut<T>,
    ) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                what: "device-to-device copy destination".into(),
                expected: src.len(),
                found: dst.len(),
            });
        }
        crate::driver::memory::check_write_mem(dst, || "copy destination".into())?;
        if self.mode.enqueues() {
            self.bind()?;
            // SAFETY: both are live device memory of `len` elements (checked above),
            // borrowed for this call; they cannot overlap, as `dst` is borrowed mutably.
            unsafe {
                crate::driver::transfer::copy_dtod(
                    self.stream,
                    dst.device_address(),
                    src.device_address(),
                    src.len() * size_of::<T>(),
                )
            }
            .map_err(Error::driver("cuMemcpyDtoDAsync"))?;
        }
        self.count(|c| c.copies += 1);
        Ok(())
    }

    fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))
    }

    /// The stream as cudarc's, for existing code that issues its own work: kernels
    /// launched with cudarc, cuBLASLt called with a stream and a workspace (see
    /// [`Blas::workspace`]). `None` in a [`Mode::Dry`] pass, which enqueues nothing: the
    /// dry pass runs before every capture, and work issued then would run for real.
    ///
    /// The verifier checks that an op that took the stream put work into the graph, and
    /// at least what it issued through this type.
    ///
    /// # Safety
    ///
    /// Only capture-legal work may be issued on it, and only work on it:
    /// - no synchronisation of it, of the context or of an event recorded on it, no
    ///   query of its work, no copy to or from pageable host memory (each fails the
    ///   capture, or stalls it);
    /// - no allocation or free in the middle of the step's work (use the step's
    ///   buffers and scratch);
    /// - no work on any other stream (one of the program's own, cudarc's default
    ///   stream): it runs once, while the step is built, and never in a replay;
    /// - no wait on an event recorded outside the capture;
    /// - only the memory the op's parameters grant, read or written as their `&` and
    ///   `&mut` say: the plan orders the op by its parameters and nothing else.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use stepgraph::cudarc::driver::{CudaSlice, CudaStream, DriverError};
    /// use stepgraph::{CaptureStream, DeviceBuffer, Error, Result};
    ///
    /// // An existing function of a cudarc trainer, unchanged.
    /// fn zero_grads(stream: &Arc<CudaStream>, g: &mut CudaSlice<f32>) -> Result<(), DriverError> {
    ///     stream.memset_zeros(g)
    /// }
    ///
    /// // The op that wraps it.
    /// fn zero(s: &CaptureStream<'_>, grads: &mut DeviceBuffer<f32>) -> Result<()> {
    ///     // SAFETY: `zero_grads` issues one memset on the stream it is given, the capture
    ///     // stream, of `grads`, which it writes in place.
    ///     unsafe {
    ///         if let Some(stream) = s.cuda_stream() {
    ///             zero_grads(stream, grads.cuda_slice_mut()).map_err(Error::driver("zero_grads"))?;
    ///         }
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub unsafe fn cuda_stream(&self) -> Option<&'a Arc<CudaStream>> {
        if !self.mode.enqueues() {
            return None;
        }
        self.count(|c| c.raw += 1);
        Some(self.stream)
    }

    /// Copies the scalars' pinned host values to their device copy. Captured, this is a
    /// memcpy node that reads the host values at every replay, so kernels that read the
    /// device copy see the values set before that replay without a re-capture.
    pub fn refresh<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        scalars: &mut DeviceScalars<T>,
    ) -> Result<()> {
        crate::driver::memory::check_write_mem(scalars.on_device(), || {
            "refresh of device scalars".into()
        })?;
        if self.mode.enqueues() {
            scalars.enqueue_refresh(self.stream)?;
        }
        self.count(|c| c.copies += 1);
        Ok(())
    }

    /// Copies the host input's slot that the host filled last into `dst` (a buffer or a
    /// view of the same length). Captured, this is a memcpy node from pinned memory that
    /// is pointed at the newest slot before each replay ([`HostInput`] says how the slots
    /// turn), so the copy runs on a copy engine inside the graph and the host fills the
    /// next batch while the replay runs.
    ///
    /// Fails inside an `#[every]` or `#[when]` op (the copy runs at every replay, or its slots could
    /// not be told apart), and for a length mismatch.
    pub fn stage<T: DeviceRepr>(
        &self,
        input: &HostInput<T>,
        dst: &mut impl DeviceMemMut<T>,
    ) -> Result<()> {
        crate::error::check_len(
            format!("the device side of the staged copy of `{}`", input.name()),
            input.len(),
            dst.len(),
        )?;
        crate::driver::memory::check_write_mem(dst, || {
            format!("staged copy of `{}`", input.name())
        })?;
        self.host_copy(&input.ring, dst.device_address())
    }

    /// Copies `src` (a buffer or a view) into the next slot of a host output. Captured,
    /// this is a memcpy node to pinned memory that is pointed at the next slot before
    /// each replay; the host reads the newest finished replay's values with
    /// [`Step::read_back`](crate::Step::read_back), without waiting for the GPU.
    ///
    /// Fails inside an `#[every]` or `#[when]` op, and for a length mismatch.
    pub fn read_back<T: DeviceRepr>(
        &self,
        src: &impl DeviceMem<T>,
        out: &mut HostOutput<T>,
    ) -> Result<()> {
        crate::error::check_len(
            format!("the device side of the read-back into `{}`", out.name()),
            out.len(),
            src.len(),
        )?;
        self.host_copy(&out.ring, src.device_address())
    }

    fn host_copy(&self, ring: &std::sync::Arc<host_io::Ring>, device: u64) -> Result<()> {
        let Some(io) = self.io else {
            return Err(Error::InConditional {
                what: format!("a copy of host buffer `{}`", ring.what),
                why: "host inputs and outputs are copied at every replay, in an op without \
                      #[every] or #[when]",
            });
        };
        if self.mode.enqueues() {
            ring.bind(io.owner)?;
            let slot = {
                let mut st = ring.state();
                // A graph's copy is pointed at its slot before each replay; until then it
                // refers to the slot replay `io.seq` would use.
                let slot = st.slot_for(ring.direction, io.seq);
                if io.kind == Some(IoKind::Eager) {
                    st.mark(slot, io.seq);
                }
                slot
            };
            self.bind()?;
            host_io::enqueue(
                ring.direction,
                ring.slot_ptr(slot),
                device,
                ring.bytes,
                self.stream,
            )?;
            if self.mode == Mode::Capture && io.kind == Some(IoKind::Graph) {
                let node = match crate::driver::graph::capture_dependencies(self.stream)?.as_slice()
                {
                    [node] => *node,
                    found => {
                        return Err(Error::Internal {
                            what: format!(
                                "after the copy of `{}` the capture expected one new node, \
                                 found {} dependencies",
                                ring.what,
                                found.len()
                            ),
                        });
                    }
                };
                io.captured.borrow_mut().push(Captured {
                    ring: ring.clone(),
                    slot,
                    node,
                });
            }
        }
        self.count(|c| c.copies += 1);
        Ok(())
    }
}

/// A kernel launch being assembled. Arguments are pushed in the kernel's parameter order;
/// the size of each is recorded, and [`Launch::launch`] refuses a launch whose arguments
/// differ from the kernel's parameters in number or size, before the driver sees it.
pub struct Launch<'b> {
    args: LaunchArgs<'b>,
    mode: Mode,
    kernel: &'b Kernel,
    check: ArgCheck,
    counts: &'b Cell<OpCounts>,
    /// A write argument outside what the op may write: the launch is refused.
    refused: Option<Error>,
}

impl fmt::Debug for Launch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("kernel", &self.kernel.name())
            .finish()
    }
}

/// What a buffer argument is to the kernel: a device address (`CUdeviceptr`).
use crate::driver::transfer::DEVICE_POINTER_BYTES;

impl<'b> Launch<'b> {
    /// Passes a buffer or a view the kernel only reads, as a `const T*`.
    pub fn buf<T>(&mut self, buf: &'b impl DeviceMem<T>) -> &mut Self {
        self.check.push(self.kernel.params(), DEVICE_POINTER_BYTES);
        buf.push_arg(&mut self.args);
        self
    }

    /// Passes a buffer or a view the kernel writes, as a `T*`.
    pub fn buf_mut<T>(&mut self, buf: &'b mut impl DeviceMemMut<T>) -> &mut Self {
        if self.refused.is_none() {
            let (kernel, index) = (self.kernel.name(), self.check.pushed());
            self.refused = crate::driver::memory::check_write_mem(&*buf, || {
                format!("argument {index} of kernel `{kernel}`")
            })
            .err();
        }
        self.check.push(self.kernel.params(), DEVICE_POINTER_BYTES);
        buf.push_arg_mut(&mut self.args);
        self
    }

    /// Passes a value by copy.
    pub fn arg<T: DeviceRepr>(&mut self, value: &'b T) -> &mut Self {
        self.check.push(self.kernel.params(), size_of::<T>());
        self.args.arg(value);
        self
    }

    /// Enqueues the launch (nothing happens in a dry pass), with
    /// [`cuLaunchKernel`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html).
    ///
    /// Fails with [`Error::LaunchArguments`], naming the kernel and the argument, if the
    /// arguments differ from the kernel's parameter list in number or in any argument's
    /// size, and inside an op with [`Error::UngrantedWrite`] if a `buf_mut` argument lies
    /// outside every buffer the op takes `&mut`; nothing is launched (or counted) then.
    ///
    /// # Safety
    /// The arguments must have the types the kernel reads (the check sees sizes: a `u32`
    /// where it reads a `float`, or a buffer of the wrong element type, passes it), and
    /// the grid and the size arguments must keep every access inside the buffers passed.
    /// Typed launchers generated by `stepgraph-build` discharge the first obligation.
    pub unsafe fn launch(&mut self, config: LaunchConfig) -> Result<()> {
        if let Some(refused) = self.refused.take() {
            return Err(refused);
        }
        self.check
            .finish(self.kernel.params())
            .map_err(|mismatch| Error::LaunchArguments {
                kernel: self.kernel.name(),
                mismatch,
            })?;
        let mut c = self.counts.get();
        c.launches += 1;
        self.counts.set(c);
        if !self.mode.enqueues() {
            return Ok(());
        }
        // SAFETY: the count and sizes match the kernel's parameters (checked above); the
        // caller upholds the types and the bounds (see above).
        unsafe { self.args.launch(config) }
            .map(|_| ())
            .map_err(Error::driver("cuLaunchKernel"))
    }
}
