//! Captured CUDA graphs: instantiate, upload, launch, update in place.

use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUgraphExecUpdateResult};
use cudarc::driver::{CudaContext, CudaStream, result};

use crate::error::{Error, Result};

/// What `Graph::update` did with a newly captured graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    /// `cuGraphExecUpdate` patched the executable graph in place.
    Updated,
    /// The driver refused the update (the topology changed, say); the graph was
    /// instantiated anew.
    Reinstantiated,
}

/// A captured graph and its executable instance.
///
/// Owned by a step next to the buffers it captured, and dropped before them (see the
/// generated `Step`), so the addresses baked into its nodes never dangle.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
    /// Instantiated to run each kernel at the priority it was captured with.
    node_priority: bool,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph").finish_non_exhaustive()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by this value and are destroyed once; Drop
        // records a failure on the context instead of panicking.
        unsafe {
            if !self.exec.is_null() {
                self.ctx.record_err(result::graph::exec_destroy(self.exec));
            }
            if !self.graph.is_null() {
                self.ctx.record_err(result::graph::destroy(self.graph));
            }
        }
    }
}

/// Owns a `CUgraph` fresh from `cuStreamEndCapture` until it is handed to a [`Graph`].
pub(crate) struct CapturedGraph {
    graph: sys::CUgraph,
    ctx: Arc<CudaContext>,
}

impl CapturedGraph {
    /// # Safety
    /// `graph` must be a valid graph that nothing else owns.
    pub(crate) unsafe fn new(graph: sys::CUgraph, ctx: Arc<CudaContext>) -> Self {
        CapturedGraph { graph, ctx }
    }

    pub(crate) fn raw(&self) -> sys::CUgraph {
        self.graph
    }

    /// Writes the graph as Graphviz DOT with every node's parameters
    /// ([`cuGraphDebugDotPrint`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html),
    /// verbose), for reading what a library added to a capture.
    pub(crate) fn write_dot(&self, path: &str) -> Result<()> {
        let c_path = std::ffi::CString::new(path)
            .map_err(|_| Error::Invalid(format!("graph DOT path {path:?} contains a NUL byte")))?;
        let verbose = sys::CUgraphDebugDot_flags::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE as u32;
        // SAFETY: the graph is valid while self lives; the path is a NUL-terminated string
        // that outlives the call.
        unsafe { sys::cuGraphDebugDotPrint(self.graph, c_path.as_ptr(), verbose) }
            .result()
            .map_err(|e| {
                Error::Invalid(format!(
                    "writing the captured graph as DOT to {path:?}: cuGraphDebugDotPrint failed: {e:?}"
                ))
            })
    }

    fn into_raw(self) -> sys::CUgraph {
        let g = self.graph;
        std::mem::forget(self);
        g
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        // SAFETY: this value owns the graph and nothing else destroys it.
        self.ctx
            .record_err(unsafe { result::graph::destroy(self.graph) });
    }
}

impl Graph {
    /// Instantiates a captured graph; with `node_priority`, each kernel runs at the
    /// priority of the stream it was captured on (capture copies the stream's priority
    /// into the node), else at the priority of the stream the graph is launched into.
    pub(crate) fn instantiate(captured: CapturedGraph, node_priority: bool) -> Result<Graph> {
        let flags = if node_priority {
            sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
        } else {
            sys::CUgraphInstantiate_flags(0)
        };
        // SAFETY: `captured` holds a valid graph (from a successful end of capture).
        let exec = unsafe { result::graph::instantiate(captured.graph, flags) }
            .map_err(Error::driver("cuGraphInstantiateWithFlags"))?;
        let ctx = captured.ctx.clone();
        Ok(Graph {
            graph: captured.into_raw(),
            exec,
            ctx,
            node_priority,
        })
    }

    /// Replaces this graph by a newly captured one of the same step: patches the
    /// executable instance with `cuGraphExecUpdate` when the driver accepts it (same
    /// topology, new buffer addresses or parameters), else instantiates anew.
    pub(crate) fn update(&mut self, captured: CapturedGraph) -> Result<Refresh> {
        let mut info = MaybeUninit::<sys::CUgraphExecUpdateResultInfo>::zeroed();
        // SAFETY: both handles are valid; `info` is a valid out-pointer.
        let status =
            unsafe { sys::cuGraphExecUpdate_v2(self.exec, captured.graph, info.as_mut_ptr()) };
        // SAFETY: zero-initialised and possibly written by the driver; all-zero is a
        // valid value of the struct.
        let info = unsafe { info.assume_init() };
        if status == sys::CUresult::CUDA_SUCCESS
            && info.result == CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS
        {
            let old = std::mem::replace(&mut self.graph, captured.into_raw());
            // SAFETY: `old` was owned by self and is replaced; the exec does not refer to it.
            self.ctx.record_err(unsafe { result::graph::destroy(old) });
            return Ok(Refresh::Updated);
        }
        let fresh = Graph::instantiate(captured, self.node_priority)?;
        *self = fresh;
        Ok(Refresh::Reinstantiated)
    }

    /// Uploads the executable graph so that the first launch pays no setup.
    pub(crate) fn upload(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: exec and stream are valid handles of one context.
        unsafe { result::graph::upload(self.exec, stream.cu_stream()) }
            .map_err(Error::driver("cuGraphUpload"))
    }

    /// Launches one replay on `stream`.
    pub(crate) fn launch(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: exec and stream are valid handles of one context; the buffers the graph
        // refers to outlive it (see the type's docs).
        unsafe { result::graph::launch(self.exec, stream.cu_stream()) }
            .map_err(Error::driver("cuGraphLaunch"))
    }

    /// The executable instance, for patching its nodes.
    pub(crate) fn exec(&self) -> sys::CUgraphExec {
        self.exec
    }

    /// The captured graph, for reading its nodes and edges back.
    pub fn raw(&self) -> sys::CUgraph {
        self.graph
    }

    /// The priority attribute of every kernel node (capture copies the stream's priority
    /// into it; lower numbers run first), with the number of nodes at each value, lowest
    /// value (highest priority) first.
    pub fn kernel_priorities(&self) -> Result<Vec<(i32, usize)>> {
        let mut seen: Vec<(i32, usize)> = Vec::new();
        for node in crate::verify::graph_nodes(self.graph)? {
            if crate::verify::node_type(node)? != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                continue;
            }
            let mut value = MaybeUninit::<sys::CUkernelNodeAttrValue>::zeroed();
            // SAFETY: a kernel node of this live graph; `value` is a valid out-pointer.
            unsafe {
                sys::cuGraphKernelNodeGetAttribute(
                    node,
                    sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PRIORITY,
                    value.as_mut_ptr(),
                )
            }
            .result()
            .map_err(Error::driver("cuGraphKernelNodeGetAttribute"))?;
            // SAFETY: the call wrote the union's priority member (zeroed otherwise).
            let p = unsafe { value.assume_init().priority };
            match seen.iter_mut().find(|(v, _)| *v == p) {
                Some((_, n)) => *n += 1,
                None => seen.push((p, 1)),
            }
        }
        seen.sort();
        Ok(seen)
    }

    /// Counts the graph's nodes by type: (kernel, memcpy, memset, other).
    pub fn node_counts(&self) -> Result<NodeCounts> {
        let mut counts = NodeCounts::default();
        for node in crate::verify::graph_nodes(self.graph)? {
            match crate::verify::node_type(node)? {
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => counts.kernels += 1,
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => counts.memcpys += 1,
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => counts.memsets += 1,
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY => counts.empty += 1,
                _ => counts.other += 1,
            }
        }
        Ok(counts)
    }
}

/// Node counts of a captured graph by type.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// Kernel launches (cuBLASLt matmuls included).
    pub kernels: usize,
    /// Copies.
    pub memcpys: usize,
    /// Memsets.
    pub memsets: usize,
    /// Empty nodes (joins the driver inserted).
    pub empty: usize,
    /// Anything else (event nodes, child graphs).
    pub other: usize,
}
