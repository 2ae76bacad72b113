//! Conditional ops: `#[every(k)]` work that runs at every k-th replay of one graph, and
//! `#[when(flag)]` work that runs at the replays where a device flag is set, each as a
//! CUDA conditional node, with no second graph and no re-capture.
//!
//! Captured, such an op is three things on its stream: a one-thread kernel
//! (`cuda/every.cu`) that sets the node's condition (`stepgraph_every` counts the replays
//! in the op's own counter, modulo k, and opens it at every k-th one; `stepgraph_when`
//! opens it when the flag is nonzero); the conditional (IF) node after it; and the op's
//! own work, captured into the node's body graph on a stream of the executor's own
//! (`cuStreamBeginCaptureToGraph`). The body may hold kernels, memsets and copies (and
//! conditionals), the driver's rule for conditional bodies, so cuBLASLt matmuls and kernel
//! launches are fine and collectives are not.
//!
//! An eager run of an `#[every]` op counts in the same counter, on the op's stream after
//! its waits (read, counted and written back, with the host waiting for each): replays
//! and eager runs keep one cadence. An eager run of a `#[when]` op reads the flag on the
//! op's stream, after its waits, and waits for that read. Both cost a synchronisation per
//! such op, acceptable in the eager baseline, which exists to be compared, not to be fast.
//!
//! The counters are the step's: [`ConditionalOps::counters`] reads them and
//! [`ConditionalOps::restore`] puts back what was read, so that what measures a step
//! (a profile, a work bound, timed replays, a verification) leaves its cadence as it was.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::driver::device::Device;
use crate::driver::memory::DeviceBuffer;
use crate::error::{Error, Result};
use crate::op::flag::DeviceFlag;
use crate::plan::PlanDesc;

/// `cuda/every.cu`, compiled to PTX (the driver JIT-compiles it when it loads it).
const PTX: &str = include_str!("every.ptx");

/// What a conditional node runs after: the kernel that sets its condition, and what for.
pub(crate) enum Condition<'a> {
    /// `#[every(k)]`: at every `k`-th replay.
    Every(u32),
    /// `#[when(flag)]`: when the flag is set.
    When(&'a DeviceFlag),
}

/// What a step with conditional ops needs, created with its executor.
pub(crate) struct ConditionalOps {
    every: CudaFunction,
    when: CudaFunction,
    /// Where each conditional op's work is captured, into its node's body.
    pub(crate) body_stream: Arc<CudaStream>,
    /// Per op: its replay counter (`None` for an op that runs at every replay).
    counters: Vec<Option<DeviceBuffer<u32>>>,
    /// Keeps the module loaded while the kernel is used.
    _module: Arc<cudarc::driver::CudaModule>,
}

impl ConditionalOps {
    /// Loads the kernels and allocates a counter per `#[every]` op of `plan`; `None` when
    /// the plan has no conditional op.
    pub(crate) fn new(device: &Device, plan: &PlanDesc) -> Result<Option<ConditionalOps>> {
        if plan
            .ops
            .iter()
            .all(|op| op.every.is_none() && op.when.is_none())
        {
            return Ok(None);
        }
        let ctx = device.context();
        let module = load_module(device)?;
        let (every, when) = (
            function(&module, "stepgraph_every")?,
            function(&module, "stepgraph_when")?,
        );
        let counters = plan
            .ops
            .iter()
            .map(|op| {
                op.every
                    .map(|_| {
                        device.alloc_zeros::<u32>(&format!("the replay count of `{}`", op.name), 1)
                    })
                    .transpose()
            })
            .collect::<Result<_>>()?;
        let body_stream = ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?;
        Ok(Some(ConditionalOps {
            every,
            when,
            body_stream,
            counters,
            _module: module,
        }))
    }

    /// Whether the eager run now starting runs op `op`'s work (its `k`-th, `2k`-th ..
    /// count): counts it in the op's counter on `stream`, after the op's waits, as the
    /// graph's kernel does at a replay.
    pub(crate) fn eager_turn(&self, stream: &CudaStream, op: usize, k: u32) -> Result<bool> {
        let counter = self.counter(op)?;
        let mut value = [0u32];
        bind(stream)?;
        // SAFETY: `value` has room for the counter's one u32, and the copy is waited for
        // below, before `value` is read.
        unsafe { crate::driver::transfer::copy_dtoh(stream, &mut value, counter.device_address()) }
            .map_err(Error::driver("cuMemcpyDtoHAsync"))?;
        sync(stream)?;
        let c = (value[0] + 1) % k;
        value[0] = c;
        // SAFETY: the counter holds one u32; `value` lives until the copy is waited for.
        unsafe { crate::driver::transfer::copy_htod(stream, counter.device_address(), &value) }
            .map_err(Error::driver("cuMemcpyHtoDAsync"))?;
        sync(stream)?;
        Ok(c == 0)
    }

    fn counter(&self, op: usize) -> Result<&DeviceBuffer<u32>> {
        self.counters
            .get(op)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Internal {
                what: format!("op #{op} is no #[every] op: it has no counter"),
            })
    }

    /// Every `#[every]` op's count of replays (and eager runs) since it last ran, modulo
    /// its k, by op index; the device must be idle (the caller waited).
    pub(crate) fn counters(&self, device: &Device) -> Result<Vec<(usize, u32)>> {
        self.counters
            .iter()
            .enumerate()
            .filter_map(|(op, c)| c.as_ref().map(|c| (op, c)))
            .map(|(op, c)| Ok((op, device.download(c)?[0])))
            .collect()
    }

    /// Sets every counter to zero, as when the step was built; the device must be idle.
    pub(crate) fn reset(&self, device: &Device) -> Result<()> {
        for c in self.counters.iter().flatten() {
            device.write_in_place(c, &[0])?;
        }
        Ok(())
    }

    /// Puts counts read by [`ConditionalOps::counters`] back; the device must be idle.
    pub(crate) fn restore(&self, device: &Device, counts: &[(usize, u32)]) -> Result<()> {
        for &(op, count) in counts {
            if let Some(Some(c)) = self.counters.get(op) {
                device.write_in_place(c, &[count])?;
            }
        }
        Ok(())
    }

    /// Whether the eager run now starting runs the work of a `#[when]` op on `stream`
    /// (after its waits): reads `flag` there and waits for the read.
    pub(crate) fn eager_flag(stream: &CudaStream, flag: &DeviceFlag) -> Result<bool> {
        let mut value = [0u32];
        bind(stream)?;
        // SAFETY: `value` has room for the flag's one u32, and the copy is synchronised
        // below, before `value` is read or released.
        unsafe { crate::driver::transfer::copy_dtoh(stream, &mut value, flag.device_address()) }
            .map_err(Error::driver("cuMemcpyDtoHAsync"))?;
        sync(stream)?;
        Ok(value[0] != 0)
    }

    /// Puts the condition's kernel and the conditional node on `stream` (capturing) and
    /// begins capturing the body on the body stream; the op's work goes there until
    /// [`ConditionalOps::end_body`]. Returns the body graph.
    pub(crate) fn begin_body(
        &self,
        stream: &CudaStream,
        op: usize,
        condition: Condition<'_>,
    ) -> Result<crate::driver::graph::CUgraph> {
        let ctx = stream.context();
        let graph = crate::driver::graph::capturing_graph(stream.cu_stream())?;
        let handle = crate::driver::graph::conditional_handle(graph, ctx)?;
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        match condition {
            Condition::Every(k) => {
                let counter = self.counters[op].as_ref().ok_or_else(|| Error::Internal {
                    what: "an #[every] op without a counter".into(),
                })?;
                let mut launch = stream.launch_builder(&self.every);
                launch.arg(&handle).arg(counter.slice()).arg(&k);
                // SAFETY: the kernel's parameters are a conditional handle (a u64), a
                // pointer to one u32 (the counter, alive as long as the executor and its
                // graphs) and a u32; one thread reads and writes the one counter.
                unsafe { launch.launch(config) }.map_err(Error::driver("cuLaunchKernel"))?;
            }
            Condition::When(flag) => {
                let address = flag.device_address();
                let mut launch = stream.launch_builder(&self.when);
                launch.arg(&handle).arg(&address);
                // SAFETY: the kernel's parameters are a conditional handle (a u64) and a
                // pointer to one u32 (the flag, a buffer of the step, alive as long as the
                // graphs that captured it: a step's buffers outlive its executor, and a
                // rebind captures again); one thread reads it.
                unsafe { launch.launch(config) }.map_err(Error::driver("cuLaunchKernel"))?;
            }
        }

        // The conditional node, after what the stream has issued so far (the kernel);
        // what the stream issues next follows it, and its body is captured on the body
        // stream.
        let (node, body) = crate::driver::graph::add_conditional(
            stream,
            graph,
            handle,
            crate::driver::graph::ConditionalKind::If,
        )?;
        crate::driver::graph::set_capture_dependencies(stream, node)?;
        crate::driver::graph::begin_capture_to_graph(&self.body_stream, body)?;
        Ok(body)
    }

    /// Ends the body's capture (also after a failed op, so that the body stream leaves
    /// capture mode).
    pub(crate) fn end_body(&self) -> Result<()> {
        // The node owns the body graph the capture returns.
        crate::driver::graph::end_capture(&self.body_stream).map(|_| ())
    }
}

/// The kernels of a step's device loop (`cuda/every.cu`): `stepgraph_loop_start` before its
/// WHILE node, `stepgraph_loop_next` at the end of its body.
pub(crate) struct LoopKernels {
    start: CudaFunction,
    next: CudaFunction,
    /// Keeps the module loaded while the kernels are used.
    _module: Arc<cudarc::driver::CudaModule>,
}

impl LoopKernels {
    pub(crate) fn load(device: &Device) -> Result<LoopKernels> {
        let module = load_module(device)?;
        Ok(LoopKernels {
            start: function(&module, "stepgraph_loop_start")?,
            next: function(&module, "stepgraph_loop_next")?,
            _module: module,
        })
    }

    /// Puts the kernel that opens the loop's node (unless the limit is 0) on `stream`.
    pub(crate) fn start(
        &self,
        stream: &CudaStream,
        handle: u64,
        counters: &DeviceBuffer<u32>,
    ) -> Result<()> {
        self.launch(&self.start, stream, handle, counters)
    }

    /// Puts the kernel that counts an iteration and closes the node after the last on
    /// `stream`.
    pub(crate) fn next(
        &self,
        stream: &CudaStream,
        handle: u64,
        counters: &DeviceBuffer<u32>,
    ) -> Result<()> {
        self.launch(&self.next, stream, handle, counters)
    }

    fn launch(
        &self,
        func: &CudaFunction,
        stream: &CudaStream,
        handle: u64,
        counters: &DeviceBuffer<u32>,
    ) -> Result<()> {
        if counters.len() < 2 {
            return Err(Error::Internal {
                what: format!("a loop's counters hold 2 values, found {}", counters.len()),
            });
        }
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(func);
        launch.arg(&handle).arg(counters.slice());
        // SAFETY: the kernels take a conditional handle (a u64) and a pointer to two u32
        // (checked above; the loop's counters, alive as long as the executor and its
        // graphs); one thread reads and writes them.
        unsafe { launch.launch(config) }.map_err(Error::driver("cuLaunchKernel"))?;
        Ok(())
    }
}

/// The runtime's own kernels (`cuda/every.cu`), loaded from their PTX.
fn load_module(device: &Device) -> Result<Arc<cudarc::driver::CudaModule>> {
    device
        .context()
        .load_module(cudarc::nvrtc::Ptx::from_src(PTX))
        .map_err(Error::driver("cuModuleLoadData"))
}

fn function(
    module: &Arc<cudarc::driver::CudaModule>,
    kernel: &'static str,
) -> Result<CudaFunction> {
    module
        .load_function(kernel)
        .map_err(|source| Error::KernelMissing {
            module: "stepgraph_every",
            kernel,
            source,
        })
}

fn bind(stream: &CudaStream) -> Result<()> {
    stream
        .context()
        .bind_to_thread()
        .map_err(Error::driver("cuCtxSetCurrent"))
}

fn sync(stream: &CudaStream) -> Result<()> {
    stream
        .synchronize()
        .map_err(Error::driver("cuStreamSynchronize"))
}

/// Refuses a count that never runs the op.
pub(crate) fn check_count(k: u32) -> Result<()> {
    if k == 0 {
        return Err(Error::Argument {
            what: "#[every] count".into(),
            expected: "at least 1 (the op runs at every k-th replay)".into(),
            found: "0".into(),
        });
    }
    Ok(())
}
