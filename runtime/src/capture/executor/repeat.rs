//! A step's device loop: the step captured into the body of a CUDA conditional WHILE node,
//! so that one launch runs it `n` times with no host round trip between iterations.
//!
//! The loop's graph is a second graph of the executor, beside the step's own:
//!
//! ```text
//! stepgraph_loop_start ──▶ WHILE ──▶ body: the step's ops (forks, joins, #[every] nodes)
//!                                          ──▶ stepgraph_loop_next
//! ```
//!
//! `n` lives in device memory (`[limit, remaining]`), set by a memset on the origin stream
//! before a launch whose `n` differs from the last one's, so that a new `n` needs no new
//! capture. The start kernel copies the limit to `remaining` and opens the node unless it
//! is 0; the body's last kernel, after the final joins, counts one iteration down and
//! closes the node after the last. Each iteration is a replay as far as the step's
//! `#[every(k)]` counters go, so an op with `#[every(4)]` runs at every 4th iteration.
//!
//! The outer graph is captured on a stream of the loop's own, while the origin stream
//! captures the step into the node's body (`cuStreamBeginCaptureToGraph`); the step's
//! other streams join that capture through its fork events as in any capture.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{Executor, Extras, Issue, Tracker};
use crate::driver::graph::{
    self as g, CUgraph, CapturedGraph, ConditionalHandle, ConditionalKind, Graph,
};
use crate::driver::memory::DeviceBuffer;
use crate::error::{Error, Result};
use crate::op::every::LoopKernels;
use crate::op::host_io::{IoKind, Patch};

/// What a step's device loop needs, created at its first launch.
pub(super) struct Repeat {
    /// Captures the outer graph (the start kernel and the WHILE node).
    stream: Arc<CudaStream>,
    kernels: LoopKernels,
    /// `[limit, remaining]`.
    counters: DeviceBuffer<u32>,
    /// The limit last set on the device, if any.
    limit: Cell<Option<u32>>,
    /// The WHILE node's handle in the capture under way.
    handle: Cell<ConditionalHandle>,
    /// The node's body graph in the capture under way (owned by the node).
    body: Cell<CUgraph>,
    graph: Option<Graph>,
    patches: RefCell<Vec<Patch>>,
}

impl Repeat {
    fn new(exec: &Executor) -> Result<Repeat> {
        let stream = exec
            .device
            .context()
            .new_stream()
            .map_err(Error::driver("cuStreamCreate"))?;
        Ok(Repeat {
            stream,
            kernels: LoopKernels::load(&exec.device)?,
            counters: exec
                .device
                .alloc_zeros::<u32>(&format!("the loop counters of `{}`", exec.plan.step), 2)?,
            limit: Cell::new(None),
            handle: Cell::new(0),
            body: Cell::new(std::ptr::null_mut()),
            graph: None,
            patches: RefCell::new(Vec::new()),
        })
    }

    /// Drops the loop's graph, so that the next launch captures it again (the step's
    /// buffers were rebound).
    pub(super) fn forget_graph(&mut self) {
        self.graph = None;
        self.patches.get_mut().clear();
    }

    /// Begins the loop's capture: the start kernel and the WHILE node on the loop's
    /// stream, then the origin stream capturing into the node's body. The loop's capture
    /// is ended again if a step of this fails.
    pub(super) fn begin(&self, origin: &CudaStream) -> Result<()> {
        g::begin_capture(&self.stream)?;
        let begun = (|| {
            let graph = g::capturing_graph(self.stream.cu_stream())?;
            let handle = g::conditional_handle(graph, self.stream.context())?;
            self.kernels.start(&self.stream, handle, &self.counters)?;
            let (node, body) =
                g::add_conditional(&self.stream, graph, handle, ConditionalKind::While)?;
            g::set_capture_dependencies(&self.stream, node)?;
            g::begin_capture_to_graph(origin, body)?;
            self.handle.set(handle);
            self.body.set(body);
            Ok(())
        })();
        if begun.is_err() {
            // The graph ended here is dropped with the error.
            let _ = self.end().map(|graph| self.owned(graph));
        }
        begun
    }

    /// The body's last node, on the origin stream after the final joins.
    pub(super) fn next(&self, origin: &CudaStream) -> Result<()> {
        self.kernels.next(origin, self.handle.get(), &self.counters)
    }

    /// Ends the loop's capture and returns its graph.
    pub(super) fn end(&self) -> Result<CUgraph> {
        g::end_capture(&self.stream)
    }

    pub(super) fn owned(&self, graph: CUgraph) -> Option<CapturedGraph> {
        // SAFETY: a graph just returned by the end of the loop's capture, owned by nobody
        // else.
        (!graph.is_null())
            .then(|| unsafe { CapturedGraph::new(graph, self.stream.context().clone()) })
    }
}

impl Executor {
    /// Launches the step's device loop, captured by [`Executor::capture_loop`]: one graph
    /// that runs the step `n` times, each iteration after the last, with no host round
    /// trip in between; another `n` needs no new capture. Returns once the launch is
    /// queued.
    ///
    /// Every iteration counts for the step's `#[every(k)]` ops as a replay does, and the
    /// launch counts as one replay for its host inputs and outputs. `n = 0` runs nothing.
    pub fn launch_loop(&self, n: u32) -> Result<()> {
        crate::scope::check("Step::replay_loop")?;
        let Some(repeat) = self
            .repeat
            .as_ref()
            .filter(|r| r.graph.is_some() && !self.stale)
        else {
            return Err(Error::NotCaptured {
                step: self.plan.step,
                stale: self.repeat.is_some(),
            });
        };
        let graph = repeat.graph.as_ref().ok_or_else(|| Error::Internal {
            what: "the loop was not captured".into(),
        })?;
        if repeat.limit.get() != Some(n) {
            let origin = self.origin();
            bind(origin)?;
            // SAFETY: the counters hold two u32 and live as long as the executor; the
            // memset is ordered on the origin stream after every earlier launch of the loop
            // and before this one.
            unsafe {
                crate::driver::transfer::memset_d32(origin, repeat.counters.device_address(), n, 1)
            }
            .map_err(Error::driver("cuMemsetD32Async"))?;
            repeat.limit.set(Some(n));
        }
        self.launch(graph, &repeat.patches)
    }

    /// Captures the step's device loop: the step inside a WHILE node's body (verified
    /// against the plan, as the step's own graph is, when verification is on), and
    /// instantiates and uploads it. A step whose ops issue NCCL collectives cannot loop:
    /// the driver allows none in a conditional node's body.
    pub fn capture_loop(&mut self, issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>) -> Result<()> {
        crate::scope::check("Step::replay_loop")?;
        if self.repeat.is_none() {
            self.repeat = Some(Repeat::new(self)?);
        }
        let step = self.plan.step;
        let wrap = |e: Error| Error::Capture {
            step,
            source: Box::new(e),
        };
        let repeat = self.repeat.as_ref().ok_or_else(|| Error::Internal {
            what: "the loop was not set up".into(),
        })?;
        let tracker = self.verify.then(|| Tracker::new(self.plan.ops.len()));
        let extras = Extras {
            tracker: tracker.as_ref(),
            timers: None,
        };
        let io = self.io_pass(Some(IoKind::Graph), self.clock.launched() + 1);
        let captured = self
            .capture_into(issue, extras, &io, Some(repeat))
            .map_err(wrap)?;
        let patches = io
            .captured
            .into_inner()
            .into_iter()
            .map(Patch::new)
            .collect::<Result<Vec<_>>>()
            .map_err(wrap)?;
        // The loop's graph beside the step's (`{step}.loop` for the step's name), its
        // WHILE node and the body in it.
        if tracker.is_some()
            && let Some(path) = self
                .options
                .graph_dot_path(&format!("{step}.loop"), self.device.ordinal())
        {
            captured.write_dot(&path).map_err(wrap)?;
        }
        if let Some(tracker) = &tracker {
            // The body is the step's graph and one more kernel, which follows all of it.
            let report = crate::capture::verify::verify_graph(
                self.plan,
                &self.extra.pairs,
                self.schedule == crate::capture::options::Schedule::OneStream,
                repeat.body.get(),
                &tracker.borrow().per_op,
            )
            .map_err(wrap)?;
            self.last_verify = Some(report);
        }
        let graph = Graph::instantiate(captured, self.node_priority).map_err(wrap)?;
        let origin = self.origin().clone();
        graph.upload(&origin).map_err(wrap)?;
        origin
            .synchronize()
            .map_err(|e| wrap(Error::driver("cuStreamSynchronize")(e)))?;
        let repeat = self.repeat.as_mut().ok_or_else(|| Error::Internal {
            what: "the loop was not set up".into(),
        })?;
        repeat.graph = Some(graph);
        *repeat.patches.get_mut() = patches;
        Ok(())
    }

    /// Whether the step's device loop is captured.
    pub fn loop_captured(&self) -> bool {
        self.repeat.as_ref().is_some_and(|r| r.graph.is_some())
    }
}

fn bind(stream: &CudaStream) -> Result<()> {
    stream
        .context()
        .bind_to_thread()
        .map_err(Error::driver("cuCtxSetCurrent"))
}
