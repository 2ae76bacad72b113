//! CUDA graphs: captures, and the graphs they make read node by node; executable
//! graphs instantiated, uploaded, launched and updated in place.

use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUgraphExecUpdateResult};
use cudarc::driver::{CudaContext, CudaStream, result};

use crate::error::{Error, Result};

/// The driver's handles and node kinds, for the layers above, which read graphs through
/// this module's functions.
pub(crate) use cudarc::driver::sys::{
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS, CUgraph, CUgraphExec,
    CUgraphNode, CUgraphNodeType,
};

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
        let c_path = std::ffi::CString::new(path).map_err(|_| Error::Config {
            name: "graph DOT path",
            expected: "a path without NUL bytes".into(),
            found: format!("{path:?}"),
        })?;
        let verbose = sys::CUgraphDebugDot_flags::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE as u32;
        // SAFETY: the graph is valid while self lives; the path is a NUL-terminated string
        // that outlives the call.
        unsafe { sys::cuGraphDebugDotPrint(self.graph, c_path.as_ptr(), verbose) }
            .result()
            .map_err(|e| Error::Config {
                name: "graph DOT path",
                expected: "a path the captured graph can be written to as DOT".into(),
                found: format!("{path:?} (cuGraphDebugDotPrint failed: {e:?})"),
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
        for node in graph_nodes(self.graph)? {
            if node_type(node)? != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
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
        for node in graph_nodes(self.graph)? {
            match node_type(node)? {
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

/// An op's nodes in the captured graph and what it issued.
#[derive(Debug, Default, Clone)]
pub(crate) struct OpNodes {
    pub nodes: Vec<sys::CUgraphNode>,
    pub counts: crate::scope::OpCounts,
    /// A conditional op's (`#[every]`, `#[when]`) body graph, where its work is (its own
    /// nodes in the step's graph are the condition's kernel and the conditional node).
    pub body: Option<sys::CUgraph>,
}

/// The graph being captured on `stream`.
pub(crate) fn capturing_graph(stream: sys::CUstream) -> Result<sys::CUgraph> {
    let mut status = MaybeUninit::uninit();
    let mut graph = std::ptr::null_mut();
    // SAFETY: valid stream; optional out-pointers are null; the graph handle returned is
    // only queried, never modified, while the capture is in progress.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            status.as_mut_ptr(),
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(Error::driver("cuStreamGetCaptureInfo"))?;
    Ok(graph)
}

/// Every node of `graph`.
pub(crate) fn graph_nodes(graph: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>> {
    let mut n = 0usize;
    // SAFETY: a null array asks for the count only.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }
        .result()
        .map_err(Error::driver("cuGraphGetNodes"))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` has room for `n` handles.
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }
        .result()
        .map_err(Error::driver("cuGraphGetNodes"))?;
    nodes.truncate(n);
    Ok(nodes)
}

pub(crate) fn graph_edges(
    graph: sys::CUgraph,
) -> Result<Vec<(sys::CUgraphNode, sys::CUgraphNode)>> {
    let mut n = 0usize;
    // SAFETY: null arrays ask for the count only.
    unsafe {
        sys::cuGraphGetEdges_v2(
            graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut n,
        )
    }
    .result()
    .map_err(Error::driver("cuGraphGetEdges"))?;
    if n == 0 {
        // The driver refuses arrays with a count of zero.
        return Ok(Vec::new());
    }
    let mut from = vec![std::ptr::null_mut(); n];
    let mut to = vec![std::ptr::null_mut(); n];
    // Edges may carry data (cuBLASLt's kernels use programmatic-launch edges on Hopper),
    // and the driver refuses to drop it, so it is read too. Either kind orders the two
    // nodes: a programmatic edge lets the second kernel start early, but only up to the
    // point where it waits for the first one's results.
    // SAFETY: CUgraphEdgeData is plain data, valid when zeroed.
    let mut data = vec![unsafe { std::mem::zeroed::<sys::CUgraphEdgeData>() }; n];
    // SAFETY: all three arrays have room for `n` entries.
    unsafe {
        sys::cuGraphGetEdges_v2(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut n,
        )
    }
    .result()
    .map_err(Error::driver("cuGraphGetEdges"))?;
    Ok(from.into_iter().zip(to).take(n).collect())
}

pub(crate) fn node_type(node: sys::CUgraphNode) -> Result<sys::CUgraphNodeType> {
    let mut ty = MaybeUninit::uninit();
    // SAFETY: `node` is a node of a live graph; `ty` is a valid out-pointer.
    unsafe { sys::cuGraphNodeGetType(node, ty.as_mut_ptr()) }
        .result()
        .map_err(Error::driver("cuGraphNodeGetType"))?;
    // SAFETY: written by the successful call.
    Ok(unsafe { ty.assume_init() })
}

/// The nodes the next work captured on `stream` will depend on.
pub(crate) fn capture_dependencies(stream: &CudaStream) -> Result<Vec<CUgraphNode>> {
    let mut status = MaybeUninit::uninit();
    let mut deps: *const CUgraphNode = std::ptr::null();
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

/// A conditional handle of `graph` (being captured), with default 0: the condition is
/// what a kernel sets at each replay.
pub(crate) fn conditional_handle(
    graph: CUgraph,
    ctx: &CudaContext,
) -> Result<sys::CUgraphConditionalHandle> {
    let mut handle: sys::CUgraphConditionalHandle = 0;
    // SAFETY: `graph` is a live graph of `ctx`; the handle belongs to it and is used only
    // by a node added to it. Default 0 and no flags.
    unsafe { sys::cuGraphConditionalHandleCreate(&mut handle, graph, ctx.cu_ctx(), 0, 0) }
        .result()
        .map_err(Error::driver("cuGraphConditionalHandleCreate"))?;
    Ok(handle)
}

/// A conditional node's handle, which a kernel sets to open or close the node.
pub(crate) type ConditionalHandle = sys::CUgraphConditionalHandle;

/// Which conditional node [`add_conditional`] adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConditionalKind {
    /// Runs its body once when the condition is set.
    If,
    /// Runs its body while the condition is set, checked before each iteration.
    While,
}

/// Adds a conditional node of `kind` on `handle` to `graph`, the graph `stream` is
/// capturing, after what the stream has issued so far; returns the node and its body
/// graph (empty, owned by the node).
pub(crate) fn add_conditional(
    stream: &CudaStream,
    graph: CUgraph,
    handle: sys::CUgraphConditionalHandle,
    kind: ConditionalKind,
) -> Result<(CUgraphNode, CUgraph)> {
    let deps = capture_dependencies(stream)?;
    // SAFETY: zeroed node parameters are a valid start; the conditional arm is set
    // whole below, as cuGraphAddNode documents for a conditional node.
    let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
    params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
    params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
        handle,
        type_: match kind {
            ConditionalKind::If => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
            ConditionalKind::While => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
        },
        size: 1,
        phGraph_out: std::ptr::null_mut(),
        ctx: stream.context().cu_ctx(),
    };
    let mut node: CUgraphNode = std::ptr::null_mut();
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
    let out = unsafe { params.__bindgen_anon_1.conditional.phGraph_out };
    if out.is_null() {
        return Err(Error::Internal {
            what: "the driver returned no body graph for a conditional node".into(),
        });
    }
    // SAFETY: `out` points at the node's one body graph (size 1).
    Ok((node, unsafe { *out }))
}

/// Makes what `stream` issues next in its capture follow `node` alone.
pub(crate) fn set_capture_dependencies(stream: &CudaStream, mut node: CUgraphNode) -> Result<()> {
    // SAFETY: `node` is a node of the graph `stream` is capturing.
    unsafe {
        sys::cuStreamUpdateCaptureDependencies_v2(
            stream.cu_stream(),
            &mut node,
            std::ptr::null(),
            1,
            sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32,
        )
    }
    .result()
    .map_err(Error::driver("cuStreamUpdateCaptureDependencies"))
}

/// Begins a RELAXED capture on `stream` into `graph` (a conditional node's empty body).
pub(crate) fn begin_capture_to_graph(stream: &CudaStream, graph: CUgraph) -> Result<()> {
    // SAFETY: `graph` is a live, empty graph owned by a node; `stream` captures nothing
    // else.
    unsafe {
        sys::cuStreamBeginCaptureToGraph(
            stream.cu_stream(),
            graph,
            std::ptr::null(),
            std::ptr::null(),
            0,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    }
    .result()
    .map_err(Error::driver("cuStreamBeginCaptureToGraph"))
}

/// Ends the capture on `stream` and returns its graph (the caller's to destroy, unless a
/// node owns it, as a conditional body does).
pub(crate) fn end_capture(stream: &CudaStream) -> Result<CUgraph> {
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: `stream` is capturing; ending it returns the graph.
    unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) }
        .result()
        .map_err(Error::driver("cuStreamEndCapture"))?;
    Ok(graph)
}

/// Where a stream stands with stream capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CaptureState {
    /// Not capturing.
    None,
    /// Capturing.
    Active,
    /// Capturing, but something it issued broke the capture; ending it fails.
    Invalidated,
}

/// Where `stream` stands with stream capture.
pub(crate) fn capture_state(stream: &CudaStream) -> Result<CaptureState> {
    use sys::CUstreamCaptureStatus as S;
    Ok(
        match stream
            .capture_status()
            .map_err(Error::driver("cuStreamGetCaptureInfo"))?
        {
            S::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureState::Active,
            S::CU_STREAM_CAPTURE_STATUS_INVALIDATED => CaptureState::Invalidated,
            S::CU_STREAM_CAPTURE_STATUS_NONE => CaptureState::None,
        },
    )
}

/// Begins a RELAXED capture on `stream`: other threads may make calls that are unsafe
/// during a capture (the step's own checks, not the driver's, keep ops to their streams).
pub(crate) fn begin_capture(stream: &CudaStream) -> Result<()> {
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(Error::driver("cuStreamBeginCapture"))
}

/// The parameters of `node`, a memcpy node of a live graph.
pub(crate) fn memcpy_node_params(node: CUgraphNode) -> Result<CUDA_MEMCPY3D> {
    let mut params = MaybeUninit::<CUDA_MEMCPY3D>::zeroed();
    // SAFETY: `node` is a memcpy node of a live graph (the caller's); `params` is a valid
    // out-pointer.
    unsafe { sys::cuGraphMemcpyNodeGetParams(node, params.as_mut_ptr()) }
        .result()
        .map_err(Error::driver("cuGraphMemcpyNodeGetParams"))?;
    // SAFETY: zeroed, then written by the driver; all-zero is a valid value.
    Ok(unsafe { params.assume_init() })
}

/// Sets the parameters of `node`'s copy in the executable graph `exec`.
///
/// # Safety
/// `node` is a memcpy node of the graph `exec` was instantiated from, `exec` is live, and
/// `params` names memory of `ctx` that lives as long as `exec` may replay it.
pub(crate) unsafe fn set_memcpy_node_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_MEMCPY3D,
    ctx: &CudaContext,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { sys::cuGraphExecMemcpyNodeSetParams(exec, node, params, ctx.cu_ctx()) }
        .result()
        .map_err(Error::driver("cuGraphExecMemcpyNodeSetParams"))
}

/// Reads a kernel node's launch.
pub(crate) fn kernel_params(node: sys::CUgraphNode) -> Result<sys::CUDA_KERNEL_NODE_PARAMS> {
    let mut p = MaybeUninit::<sys::CUDA_KERNEL_NODE_PARAMS>::zeroed();
    // SAFETY: `node` is a kernel node of a live graph; `p` is a valid out-pointer. The
    // argument pointers it returns stay owned by the graph, which outlives their use.
    unsafe { sys::cuGraphKernelNodeGetParams_v2(node, p.as_mut_ptr()) }
        .result()
        .map_err(Error::driver("cuGraphKernelNodeGetParams"))?;
    // SAFETY: written by the successful call (and all-zero is a valid value).
    Ok(unsafe { p.assume_init() })
}

/// The function a kernel node launches: its `func`, or for a library kernel given as a
/// `CUkernel` (cuBLASLt's), that kernel's function in the current context.
pub(crate) fn node_function(p: &sys::CUDA_KERNEL_NODE_PARAMS) -> Result<sys::CUfunction> {
    if !p.func.is_null() {
        return Ok(p.func);
    }
    if p.kern.is_null() {
        return Err(Error::Internal {
            what: "a kernel node names neither a function nor a kernel".into(),
        });
    }
    let mut f = std::ptr::null_mut();
    // SAFETY: `kern` is a valid kernel handle read from a live node; `f` is a valid
    // out-pointer; the context is current on this thread (the executor's).
    unsafe { sys::cuKernelGetFunction(&mut f, p.kern) }
        .result()
        .map_err(Error::driver("cuKernelGetFunction"))?;
    Ok(f)
}

/// The name the driver knows a function by (empty if it will not say).
pub(crate) fn function_name(func: sys::CUfunction) -> String {
    let mut p = std::ptr::null();
    // SAFETY: valid function handle and out-pointer; the string is owned by the driver
    // and lives as long as the function.
    let ok = unsafe { sys::cuFuncGetName(&mut p, func) }.result().is_ok();
    if !ok || p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string from the driver (checked non-null above).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Blocks of `func` one SM holds at once with this launch's block and shared memory.
pub(crate) fn blocks_per_sm(func: sys::CUfunction, threads: u32, shared: u32) -> Result<u64> {
    let mut n = 0i32;
    let threads = i32::try_from(threads).map_err(|_| Error::TooLarge {
        what: "threads per block of a kernel node".into(),
        found: u64::from(threads),
        max: i32::MAX as u64,
        why: "the occupancy query takes an int",
    })?;
    // SAFETY: valid function handle, valid out-pointer.
    unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, func, threads, shared as usize)
    }
    .result()
    .map_err(Error::driver("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The memsets that kernel node `node` depends on directly: cuBLASLt clears a counter in
/// its workspace before some Hopper kernels (a persistent tile scheduler's), and such a
/// kernel run again without the clear waits for arrivals that never come, so its copies
/// alone are preceded by the same clears.
pub(crate) fn preceding_memsets(
    node: sys::CUgraphNode,
) -> Result<Vec<sys::CUDA_MEMSET_NODE_PARAMS>> {
    let mut n = 0usize;
    // SAFETY: a node of a live graph; null arrays ask for the count only.
    unsafe {
        sys::cuGraphNodeGetDependencies_v2(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut n)
    }
    .result()
    .map_err(Error::driver("cuGraphNodeGetDependencies"))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut deps = vec![std::ptr::null_mut(); n];
    // SAFETY: CUgraphEdgeData is plain data, valid when zeroed; the driver refuses to drop
    // an edge's data, so it is read too.
    let mut data = vec![unsafe { std::mem::zeroed::<sys::CUgraphEdgeData>() }; n];
    // SAFETY: both arrays have room for `n` entries.
    unsafe {
        sys::cuGraphNodeGetDependencies_v2(node, deps.as_mut_ptr(), data.as_mut_ptr(), &mut n)
    }
    .result()
    .map_err(Error::driver("cuGraphNodeGetDependencies"))?;
    let mut memsets = Vec::new();
    for &dep in deps.iter().take(n) {
        if node_type(dep)? != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET {
            continue;
        }
        let mut p = MaybeUninit::<sys::CUDA_MEMSET_NODE_PARAMS>::zeroed();
        // SAFETY: a memset node of the live graph; `p` is a valid out-pointer.
        unsafe { sys::cuGraphMemsetNodeGetParams(dep, p.as_mut_ptr()) }
            .result()
            .map_err(Error::driver("cuGraphMemsetNodeGetParams"))?;
        // SAFETY: zeroed, then written by the driver.
        memsets.push(unsafe { p.assume_init() });
    }
    Ok(memsets)
}

/// A graph of `copies` copies of kernel node `src` (launched with `params`) in a chain,
/// each after copies of the memsets `clears`: the kernel alone, as the step launched it.
pub(crate) fn chain_of_copies(
    ctx: &Arc<CudaContext>,
    src: sys::CUgraphNode,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
    clears: &[sys::CUDA_MEMSET_NODE_PARAMS],
    copies: usize,
) -> Result<CapturedGraph> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flags must be 0.
    unsafe { sys::cuGraphCreate(&mut raw, 0) }
        .result()
        .map_err(Error::driver("cuGraphCreate"))?;
    // SAFETY: a fresh graph owned by nothing else.
    let graph = unsafe { CapturedGraph::new(raw, ctx.clone()) };
    let mut prev: Option<sys::CUgraphNode> = None;
    for _ in 0..copies {
        for clear in clears {
            let mut node = std::ptr::null_mut();
            let deps: &[sys::CUgraphNode] = prev.as_slice();
            // SAFETY: the graph is live; `clear` was read from a live memset node of the
            // same context, whose memory outlives this call.
            unsafe {
                sys::cuGraphAddMemsetNode(
                    &mut node,
                    raw,
                    deps.as_ptr(),
                    deps.len(),
                    clear,
                    ctx.cu_ctx(),
                )
            }
            .result()
            .map_err(Error::driver("cuGraphAddMemsetNode"))?;
            prev = Some(node);
        }
        let mut node = std::ptr::null_mut();
        let deps: &[sys::CUgraphNode] = prev.as_slice();
        // SAFETY: the graph is live; `params` was read from a live kernel node of the same
        // context, its argument values are copied by the driver here.
        unsafe { sys::cuGraphAddKernelNode_v2(&mut node, raw, deps.as_ptr(), deps.len(), params) }
            .result()
            .map_err(Error::driver("cuGraphAddKernelNode"))?;
        // The copy must launch as the original did: cluster shape, priority and the
        // other launch attributes cuBLASLt sets live on the node, not in its params.
        // SAFETY: both are kernel nodes of one context.
        unsafe { sys::cuGraphKernelNodeCopyAttributes(node, src) }
            .result()
            .map_err(Error::driver("cuGraphKernelNodeCopyAttributes"))?;
        prev = Some(node);
    }
    Ok(graph)
}
