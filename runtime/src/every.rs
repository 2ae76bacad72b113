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

use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::flag::DeviceFlag;
use crate::memory::DeviceBuffer;
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
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(PTX))
            .map_err(Error::driver("cuModuleLoadData"))?;
        let load = |kernel: &'static str| {
            module
                .load_function(kernel)
                .map_err(|source| Error::KernelMissing {
                    module: "stepgraph_every",
                    kernel,
                    source,
                })
        };
        let (every, when) = (load("stepgraph_every")?, load("stepgraph_when")?);
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
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut value,
                counter.device_address(),
                stream.cu_stream(),
            )
        }
        .map_err(Error::driver("cuMemcpyDtoHAsync"))?;
        sync(stream)?;
        let c = (value[0] + 1) % k;
        value[0] = c;
        // SAFETY: the counter holds one u32; `value` lives until the copy is waited for.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                counter.device_address(),
                &value,
                stream.cu_stream(),
            )
        }
        .map_err(Error::driver("cuMemcpyHtoDAsync"))?;
        sync(stream)?;
        Ok(c == 0)
    }

    fn counter(&self, op: usize) -> Result<&DeviceBuffer<u32>> {
        self.counters
            .get(op)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Invalid(format!("op #{op} is no #[every] op: it has no counter")))
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
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut value,
                flag.device_address(),
                stream.cu_stream(),
            )
        }
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
    ) -> Result<sys::CUgraph> {
        let ctx = stream.context();
        let graph = crate::verify::capturing_graph(stream.cu_stream())?;
        let mut handle: sys::CUgraphConditionalHandle = 0;
        // SAFETY: `graph` is the graph being captured on `stream`; the handle belongs to
        // it and is used only by the node added to it below. Default 0 and no flags: the
        // condition is what the condition's kernel sets at each replay.
        unsafe { sys::cuGraphConditionalHandleCreate(&mut handle, graph, ctx.cu_ctx(), 0, 0) }
            .result()
            .map_err(Error::driver("cuGraphConditionalHandleCreate"))?;
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        match condition {
            Condition::Every(k) => {
                let counter = self.counters[op]
                    .as_ref()
                    .ok_or_else(|| Error::Invalid("an #[every] op without a counter".into()))?;
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

        // The conditional node, after what the stream has issued so far (the kernel).
        let deps = capture_dependencies(stream)?;
        // SAFETY: zeroed node parameters are a valid start; the conditional arm is set
        // whole below, as cuGraphAddNode documents for a conditional node.
        let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
        params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
            handle,
            type_: sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
            size: 1,
            phGraph_out: std::ptr::null_mut(),
            ctx: ctx.cu_ctx(),
        };
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: the dependencies are nodes of `graph` (the capture's current ones), the
        // parameters are a conditional node's, and `node` receives the new node.
        unsafe {
            sys::cuGraphAddNode_v2(
                &mut node,
                graph,
                deps.as_ptr(),
                std::ptr::null(),
                deps.len(),
                &mut params,
            )
        }
        .result()
        .map_err(Error::driver("cuGraphAddNode"))?;
        // SAFETY: the driver filled the union's conditional arm with its body graphs.
        let body = unsafe {
            let out = params.__bindgen_anon_1.conditional.phGraph_out;
            if out.is_null() {
                return Err(Error::Invalid(
                    "the driver returned no body graph for a conditional node".into(),
                ));
            }
            *out
        };
        // What the stream issues next follows the node.
        // SAFETY: `node` is a node of the graph `stream` is capturing.
        unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(
                stream.cu_stream(),
                &mut node,
                std::ptr::null(),
                1,
                sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES
                    as u32,
            )
        }
        .result()
        .map_err(Error::driver("cuStreamUpdateCaptureDependencies"))?;
        // SAFETY: `body` is the node's body graph, empty, owned by the node; the body
        // stream captures nothing else.
        unsafe {
            sys::cuStreamBeginCaptureToGraph(
                self.body_stream.cu_stream(),
                body,
                std::ptr::null(),
                std::ptr::null(),
                0,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .result()
        .map_err(Error::driver("cuStreamBeginCaptureToGraph"))?;
        Ok(body)
    }

    /// Ends the body's capture (also after a failed op, so that the body stream leaves
    /// capture mode).
    pub(crate) fn end_body(&self) -> Result<()> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the body stream is capturing into a node's body (begun by
        // `begin_body`); ending it returns that body graph, which the node owns.
        unsafe { sys::cuStreamEndCapture(self.body_stream.cu_stream(), &mut graph) }
            .result()
            .map_err(Error::driver("cuStreamEndCapture"))
    }
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

/// The nodes the next work captured on `stream` will depend on.
pub(crate) fn capture_dependencies(stream: &CudaStream) -> Result<Vec<sys::CUgraphNode>> {
    let mut status = MaybeUninit::uninit();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut n = 0usize;
    // SAFETY: valid stream; the dependency array stays valid until the next capture call
    // on the stream, and is copied out right away.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            status.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut deps,
            std::ptr::null_mut(),
            &mut n,
        )
    }
    .result()
    .map_err(Error::driver("cuStreamGetCaptureInfo"))?;
    if n == 0 || deps.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: the driver returned `n` valid node handles at `deps`.
    Ok(unsafe { std::slice::from_raw_parts(deps, n) }.to_vec())
}

/// Refuses a count that never runs the op.
pub(crate) fn check_count(k: u32) -> Result<()> {
    if k == 0 {
        return Err(Error::Invalid(
            "#[every] count is 0: expected at least 1 (the op runs at every k-th replay)".into(),
        ));
    }
    Ok(())
}
