//! stepgraph: a training step written as annotated ops, captured as one multi-stream
//! CUDA graph.
//!
//! The [`step`] attribute reads a module that declares a step's buffers, its streams and
//! its ops in program order. Each op's signature says what it reads (`&T`) and writes
//! (`&mut T`); attributes say where it runs (`#[stream(aux_iqn)]`) and where it waits for
//! other streams (`#[join(main)]`). At compile time the macro plans the schedule, rejects
//! schedule mistakes with errors at the offending token, and emits the module's `PLAN`
//! and a `Spec` that [`Step`] runs: `module::Step` creates its streams, events,
//! per-stream cuBLASLt workspaces and scratch copies once, captures the ops in RELAXED
//! mode, and replays the graph.
//!
//! This crate is the runtime those steps call, over cudarc:
//! - the step: [`Step`], [`Options`], [`Schedule`], [`Profile`], [`VerifyReport`],
//!   [`WorkBound`];
//! - what ops receive: [`CaptureStream`] (which has no way to synchronise, allocate or
//!   copy to the host), [`Blas`] for cuBLASLt ([`Matmul`], [`MatmulArgs`]),
//!   [`DeviceBuffer`] and its [`View`]s and [`ViewMut`]s (all [`DeviceMem`]),
//!   [`DeviceScalars`], [`DeviceFlag`] (what `#[when]` ops run on), [`Communicator`] for
//!   NCCL collectives, and kernels ([`Module`], [`Kernel`], [`kernel::Launch`]);
//! - data in and out at the step's speed: [`HostInput`] (a batch the host fills while the
//!   previous replay runs, copied in by [`CaptureStream::stage`]) and [`HostOutput`]
//!   (values copied out by [`CaptureStream::read_back`] and read a replay or more late
//!   with [`Step::read_back`], without waiting), both double-buffered in pinned memory
//!   and copied inside the graph; `#[every(k)]` and `#[when(flag)]` ops for work at
//!   every k-th replay or while a device flag is set;
//! - a whole training loop: [`Shared`] buffers that several steps use (act, update,
//!   evaluate), ordered by their launches, and device loops ([`Step::replay_loop`]) that
//!   run a step n times in one launch, in a CUDA conditional WHILE node;
//! - the device: [`Device`], [`Error`];
//! - what keeps work in the graph beyond the types: the capture guard
//!   ([`Options::capture_guard`]), which refuses, naming the op and the call, every CUDA
//!   call an op's code makes off its capture stream while the step is captured; the op's
//!   grant, which holds the runtime's writes for an op to the buffers it takes `&mut`
//!   and refuses a buffer swapped inside it; plain data in the config ([`ConfigValue`]);
//! - a trainer's existing cudarc code: [`Device::from_context`], `CudaSlice` buffers
//!   ([`DeviceBuffer::from_cuda_slice`], and `CudaSlice` is a [`StepBuffer`] itself),
//!   [`CaptureStream::cuda_stream`], [`DeviceBuffer::cuda_slice`] and
//!   [`Blas::workspace`] for existing functions inside an op, and [`cudarc`] itself,
//!   re-exported;
//! - the layer below: [`exec`] (the executor that runs a hand-built [`PlanDesc`], the
//!   captured graph), [`plan`] (the plan's data and graph algorithms), [`stats`],
//!   [`preflight`] and [`env`](mod@env).
//!
//! GPUs and CUDA releases: compute capability 8.0 and newer
//! ([`preflight::REQUIRED_COMPUTE_CAPABILITY`]); the runtime's own kernels are compute_80
//! PTX with CUDA 12.4's ISA. The CUDA API that cudarc binds is one feature of this crate:
//! `cuda-12040`, `cuda-12050`, `cuda-12060`, `cuda-12080`, `cuda-12090` or `cuda-13000`
//! (the default); exactly one may be on. 12.4 is the floor, since `#[every]` and `#[when]`
//! are conditional graph nodes. [`env::PORTABLE`] loads every module from its PTX, so that
//! a Hopper GPU runs the code an Ampere GPU runs.

// The layers, bottom up; each uses only those below it (`cargo xtask test` checks):
// the error enum and the op being issued on this thread; the driver layer, the only one
// that calls the CUDA driver's raw API; cuBLASLt; what an op receives and the step
// features; measurement; capture and replay.
mod error;
mod scope;

mod driver;

mod blas;

mod op;

mod measure;

mod capture;

pub use blas::Blas;
pub use blas::{BlasElem, Epilogue, Matmul, MatmulArgs, Precision, SmTarget};
pub use capture::options::{Options, Schedule};
pub use capture::step::{Step, StepSpec};
pub use capture::verify::VerifyReport;
pub use cudarc::driver::{DeviceRepr, LaunchConfig};
pub use driver::device::{AllocLike, Device};
pub use driver::memory::{DeviceBuffer, DeviceMem, DeviceMemMut, PtrTable, Span, View, ViewMut};
pub use driver::module::{Kernel, Module};
pub use error::{Error, Result};
pub use measure::work::WorkBound;
pub use op::buffer::{ConfigValue, StepBuffer, ViewSpans};
pub use op::comm::{CollectiveElem, CommId, Communicator, ReduceOp};
pub use op::flag::DeviceFlag;
pub use op::host_io::{HostInput, HostOutput, INPUT_SLOTS, MAX_IN_FLIGHT, OUTPUT_SLOTS, ReadBack};
pub use op::scalars::{DeviceScalars, HostAccess};
pub use op::shared::{Shared, SharedHost};
pub use op::stream::CaptureStream;
/// `#[derive(ConfigValue)]`: a struct or enum whose fields are all config values is one.
/// See [`ConfigValue`](trait@ConfigValue).
pub use stepgraph_macros::ConfigValue;
/// `#[derive(StepBuffer)]`: a struct whose fields are step buffers, or plain data that
/// describes them, is one. See [`StepBuffer`](trait@StepBuffer).
pub use stepgraph_macros::StepBuffer;
/// Plans a step's multi-stream capture at compile time.
///
/// It goes on an inline module that holds the step's buffers, its config and its ops in
/// program order:
///
/// ```
/// #[stepgraph::step(streams(main, side))]
/// mod two_heads {
///     use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///     #[buffers]
///     pub struct Buffers {
///         pub features: DeviceBuffer<f32>,
///         pub a: DeviceBuffer<f32>,
///         pub b: DeviceBuffer<f32>,
///     }
///
///     // Runs on the origin stream (the first one declared).
///     fn trunk(s: &CaptureStream<'_>, features: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.memset_zeros(features)
///     }
///
///     // Reads what `trunk` wrote: the planner makes `side` wait for it.
///     #[stream(side)]
///     fn head_a(s: &CaptureStream<'_>, features: &DeviceBuffer<f32>, a: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.copy(features, a)
///     }
///
///     // Independent of `head_a`: it runs beside it, on `main`.
///     fn head_b(s: &CaptureStream<'_>, features: &DeviceBuffer<f32>, b: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.copy(features, b)
///     }
/// }
///
/// let plan = two_heads::Step::plan();
/// assert_eq!(plan.ops[1].waits.len(), 1); // head_a waits once, for trunk
/// assert_eq!(plan.final_waits.len(), 1); // side is joined back at the end
/// println!("{plan}");
/// ```
///
/// The module keeps its items (uses, helper types, consts) and gains `PLAN` (the
/// [`PlanDesc`]), `Spec` (its [`StepSpec`]) and `Step` (`Step<Spec>`, built with
/// [`Step::new`]); no item of its own may use those names.
///
/// # Arguments
///
/// - `streams(main, aux, branch[4], attn(high))`: the streams, origin first (capture
///   begins and ends there, so it is a single stream). `name[N]` is a group of `N`
///   streams, `name[0]` to `name[N-1]`; `(low)`, `(normal)` or `(high)` sets a stream's
///   priority, which the graph keeps per kernel: where streams compete for the GPU, the
///   blocks of higher-priority kernels are dispatched first. Every declared stream must
///   run an op.
/// - `kernels = path::Type`: the type of the loaded kernels that ops take as `&Type`;
///   [`Step::new`] takes its value (or an `Arc` of it). Without it, pass `()`.
/// - `crate = path`: where this crate is, for a crate that re-exports stepgraph; the
///   generated code names the runtime only through `path::__rt_v1`.
/// - `auto` or `auto(N)` in `streams(..)`, after the origin: the planner places every op
///   without a `#[stream]`, on the declared streams or on at most `N` streams of its own
///   (8 without `N`), named `auto[0]`, `auto[1]`... It schedules the DAG by each op's
///   earliest start in program order, from the op costs (below); keeps a chain on one
///   stream, so that it needs few events; prefers a stream already in use to a new one;
///   and runs an added stream at low priority where every op on it has a quarter of the
///   step's time to spare. A hand-placed op never moves, and every rule holds for the
///   placed step as for one placed by hand: the placed step is checked again.
/// - `compare(auto)`: beside the step as written, the macro plans the same ops placed
///   wholly by the planner (groups, joins and priorities set aside) as `AUTO_PLAN`;
///   [`Schedule::Automatic`] captures that plan over the same buffers, for an A/B in one
///   run. [`Bounds::with_automatic`](stats::Bounds::with_automatic) sets it against the
///   hand plan and the bounds.
/// - `costs = "file"`: the op costs the planner places by, measured on a GPU, from a
///   file beside this source file (a path from its folder, as `include_str!` takes).
///   [`Step::op_costs`] measures them (each op's kernels timed alone, and the share of
///   the GPU they hold) and its `Display` is the file's text; commit it. The step is
///   built again when the file changes. Without the file, or where it cannot be read,
///   does not parse or was measured for other ops (an op renamed, added or removed
///   since), the planner places by the `#[cost]` hints and the build warns at the
///   file's name, saying what differs. The printed plan says which ops the planner
///   placed and the cost of each.
///
///   ```
///   #[stepgraph::step(streams(main, auto(2)))]
///   mod heads {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///       #[buffers]
///       pub struct Buffers {
///           pub x: DeviceBuffer<f32>,
///           pub a: DeviceBuffer<f32>,
///           pub b: DeviceBuffer<f32>,
///       }
///
///       fn input(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.memset_zeros(x)
///       }
///
///       #[cost(4.0)]
///       fn head_a(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, a: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(x, a)
///       }
///
///       #[cost(4.0)]
///       fn head_b(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, b: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(x, b)
///       }
///   }
///
///   let plan = heads::Step::plan();
///   // The two heads run side by side: one continues the origin, one gets a stream.
///   assert_ne!(plan.ops[1].stream, plan.ops[2].stream);
///   assert!(plan.ops.iter().all(|o| o.automatic));
///   assert_eq!(plan.streams[1].name, "auto[0]");
///   ```
///
/// # Items
///
/// - `#[buffers] struct`: the device memory the ops use, one field per buffer (a
///   [`DeviceBuffer`], a struct of them, an array of them, [`DeviceScalars`], a
///   [`Communicator`]). A field's sharing attribute:
///   - none: one copy, shared by every op;
///   - `#[per_branch]`: an array `[T; N]` with one element per member of the stream
///     group of the ops that use it; a replicated op gets its own element, an op off the
///     group the whole array. For each group `name[N]` the module defines
///     `NAME_WIDTH: usize = N`, so the arrays can be `[T; NAME_WIDTH]` and the width is
///     written once (a mismatch is a compile error naming the array);
///   - `#[scratch(per_stream)]`: scratch that holds nothing between steps; each stream
///     that uses it gets a copy of its own (the struct holds the first, the step
///     allocates the others with [`AllocLike`]), so that streams never share it;
///   - `#[scratch(per_branch)]`: the same, one copy per branch of a group.
///
///   Scratch holds nothing between steps, so the first op to use each copy, in program
///   order, writes all of it before reading any, and says so by marking its `&mut`
///   parameter `#[out]`. A later op may read the copy (`&`) or update it (`&mut`, which
///   may read what is there: an accumulation). A first use by `&` or by plain `&mut`
///   would read what the last replay left, and is a compile error at the parameter,
///   naming the copy (each stream or branch has its own). So is a read of a copy that
///   only `#[every]` or `#[when]` ops wrote, by an op that can run where they did not:
///   see those attributes.
///
///   ```
///   #[stepgraph::step(streams(main, branch[2]))]
///   mod partial_sums {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///       #[buffers]
///       pub struct Buffers {
///           pub x: DeviceBuffer<f32>,
///           #[scratch(per_branch)]
///           pub partial: DeviceBuffer<f32>,
///           #[per_branch]
///           pub sums: [DeviceBuffer<f32>; BRANCH_WIDTH],
///       }
///
///       // The first use of each branch's copy writes all of it: `#[out]`.
///       #[stream(branch[d])]
///       fn start(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, #[out] partial: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(x, partial)
///       }
///
///       // Adds into what `start` wrote on the same branch: plain `&mut`.
///       #[stream(branch[d])]
///       fn accumulate(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, partial: &mut DeviceBuffer<f32>) -> Result<()> {
///           let _ = x;
///           s.memset_zeros(partial) // stands for a kernel computing `partial += x`
///       }
///
///       #[stream(branch[d])]
///       fn finish(s: &CaptureStream<'_>, partial: &DeviceBuffer<f32>, sums: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(partial, sums)
///       }
///   }
///
///   assert_eq!(partial_sums::Step::plan().ops.len(), 6);
///   ```
///
///   ```compile_fail
///   #[stepgraph::step(streams(main))]
///   mod stale {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///       #[buffers]
///       pub struct Buffers {
///           pub x: DeviceBuffer<f32>,
///           #[scratch(per_stream)]
///           pub sum: DeviceBuffer<f32>,
///       }
///
///       // error: op `accumulate` takes scratch buffer `sum` by `&mut` before any op of
///       // the step wrote it: `&mut` may read what is there (to accumulate, say), and
///       // scratch holds nothing between steps
///       fn accumulate(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, sum: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(x, sum)
///       }
///   }
///   ```
///
///   A field marked `#[view(of = parent)]` holds no memory: it is a [`Span`] of the
///   shared buffer `parent` (or, with `#[per_branch]`, an array of spans, one per
///   branch), and an op that names it receives a [`View`] (`&View<'_, T>`) or a
///   [`ViewMut`] (`&mut ViewMut<'_, T>`) of `parent` over those elements. A view is
///   ordered against every op that uses its parent; views of one parent are planned as
///   disjoint, and where their spans overlap [`Step::new`] orders the ops as for one
///   buffer ([`Step::view_orderings`]). An op takes a parent or one of its views, not
///   both, when it writes any of them.
///
///   ```
///   #[stepgraph::step(streams(main, branch[2]))]
///   mod regions {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, ViewMut};
///
///       #[buffers]
///       pub struct Buffers {
///           pub q_all: DeviceBuffer<f32>,
///           #[view(of = q_all)]
///           #[per_branch]
///           pub q: [Span; 2], // branch d's region of `q_all`
///           pub total: DeviceBuffer<f32>,
///       }
///
///       #[stream(branch[d])]
///       fn fill(s: &CaptureStream<'_>, q: &mut ViewMut<'_, f32>) -> Result<()> {
///           s.memset_zeros(q)
///       }
///
///       fn sum(s: &CaptureStream<'_>, q_all: &DeviceBuffer<f32>, total: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(&q_all.view(..total.len())?, total)
///       }
///   }
///
///   let plan = regions::Step::plan();
///   // The two regions are written side by side: neither branch waits for the other.
///   assert!(plan.ops[0].waits.iter().chain(plan.ops[1].waits).all(|e| plan.events[e.index()].after.is_none()));
///   // `sum` reads all of `q_all`, so it waits for both.
///   assert_eq!(plan.ops[2].waits.len(), 2);
///   ```
///
///   A field marked `#[shared]` holds a [`Shared`]`<T>`: memory that other steps use too
///   (the parameters an act step reads and an update step writes, a replay buffer,
///   environment state). Each step's buffers hold a clone of one `Shared`; an op takes
///   the `T` inside as any buffer (`&T`, `&mut T`, or a view of it). Each step is still
///   its own graph, captured once, and the steps run in the order the host launches them:
///   a launch waits on the device for the last launch of another step that writes what
///   it uses (and, when it writes, for the reads since), so an update is seen whole by
///   the next act and never by the one before. A step refuses to run on memory that
///   another step's [`Step::rebind`] replaced since it was captured, naming both
///   ([`Error::SharedRebound`]; [`Step::recapture`] takes the new memory). `#[shared]`
///   on a `#[per_branch]` array, on scratch or on a view is a compile error, and a
///   `Shared` field without it is refused as a buffer.
///
///   ```
///   #[stepgraph::step(streams(main))]
///   mod act {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};
///
///       #[buffers]
///       pub struct Buffers {
///           #[shared]
///           pub params: Shared<DeviceBuffer<f32>>,
///           pub actions: DeviceBuffer<f32>,
///       }
///
///       fn policy(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, actions: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(params, actions) // stands for a forward pass
///       }
///   }
///
///   #[stepgraph::step(streams(main))]
///   mod update {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};
///
///       #[buffers]
///       pub struct Buffers {
///           #[shared]
///           pub params: Shared<DeviceBuffer<f32>>,
///       }
///
///       fn sgd(s: &CaptureStream<'_>, params: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.memset_zeros(params) // stands for an optimiser step
///       }
///   }
///
///   // Each plan is its own; the order between them is kept at launch (see `Shared`).
///   assert_eq!(act::Step::plan().ops[0].name, "policy");
///   assert_eq!(update::Step::plan().ops[0].name, "sgd");
///   ```
///
///   ```compile_fail
///   #[stepgraph::step(streams(main))]
///   mod scratchy {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};
///
///       #[buffers]
///       pub struct Buffers {
///           // error: buffer `tmp` cannot be #[shared]: scratch holds nothing between
///           // launches, and this step allocates its copies
///           #[shared]
///           #[scratch(per_stream)]
///           pub tmp: Shared<DeviceBuffer<f32>>,
///       }
///
///       fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.memset_zeros(tmp)
///       }
///   }
///   ```
/// - `#[config] struct`: values the ops take by value (sizes, coefficients), cloned into
///   each op.
/// - ops, in program order: every `fn` that takes the capture stream or its cuBLASLt
///   handle, or carries an op attribute (`#[op]` alone marks one). Any other `fn` is a
///   helper the ops may call. An op's parameters, by name or by `#[buf(field)]`:
///   - `&CaptureStream<'_>`: the stream it runs on; `&Blas<'_>`: that stream's cuBLASLt
///     handle and workspace (both also under a `use .. as ..` alias made in the module);
///     `&Type`: the declared kernels;
///   - `&T` reads the buffer of the same name, `&mut T` writes it. One buffer may be
///     bound to two `&` parameters (one read); with `&mut`, to one parameter only;
///   - `#[out] name: &mut T`: the op writes every element of the scratch buffer before it
///     reads any (see scratch above); on anything but a `&mut` scratch parameter the
///     marker is a compile error;
///   - any other `&T`, whose `T` is no device memory ([`DeviceBuffer`], [`View`],
///     [`ViewMut`], [`DeviceScalars`], [`DeviceFlag`], [`Communicator`], `CudaSlice`,
///     [`HostInput`], [`HostOutput`] or an array) and whose name is no buffer's or config
///     field's: the stream, its handle or the kernels, picked by its type. That is how an
///     op takes them under an alias declared outside the module, which the macro cannot
///     see; such an op has no parameter the macro recognises as the stream, so `#[op]`
///     marks it. A type that is none of the three is a compile error at the type;
///   - `#[all_branches] name: &[T; N]`: an op on a stream group reads a `#[per_branch]`
///     array whole, every branch's element, where it would get its own; each replica
///     then waits for every branch's writer, on its own stream. An ensemble member that
///     needs the minimum over all members' outputs computes it where it runs, with no op
///     on another stream between. A replicated op only reads it so: its replicas would
///     write every element at once, so `&mut` there is a compile error (an op on one
///     member, `#[stream(group[0])]`, may write it whole), as is the attribute on a
///     buffer that is not a `#[per_branch]` array, on a per-branch view (take its parent
///     whole), or on an op off the group (it takes the array whole already);
///   - a plain value is the config field of the same name;
///   - in a replicated op, the index parameter named in `#[stream(group[d])]`.
///
///   Ops may name lifetimes, and may be generic over types and consts that their
///   parameters' types mention: the step calls each op with its buffers and config, and
///   rustc infers the rest (`fn clear<T: DeviceRepr + ValidAsZeroBits>(s: &CaptureStream<'_>,
///   x: &mut DeviceBuffer<T>)`, `fn sum<const N: usize>(.., lanes: &[DeviceBuffer<f32>; N])`).
///   A type or const parameter no parameter mentions is a compile error naming it.
///
///   ```
///   mod trainer {
///       use stepgraph::{Blas, CaptureStream};
///
///       // Aliases the trainer declared for its own code, outside the step module.
///       pub type Stream<'a> = CaptureStream<'a>;
///       pub type Lt<'a> = Blas<'a>;
///
///       #[stepgraph::step(streams(main))]
///       pub mod aliased {
///           use super::{Lt, Stream};
///           use stepgraph::{DeviceBuffer, Result};
///
///           #[buffers]
///           pub struct Buffers {
///               pub x: DeviceBuffer<f32>,
///               pub y: DeviceBuffer<f32>,
///           }
///
///           // `Stream` could be anything to the macro: `#[op]` says this is an op, and
///           // `s` and `lt`, which name no buffer, are picked by their types.
///           #[op]
///           fn copy(s: &Stream<'_>, lt: &Lt<'_>, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
///               let _ = lt;
///               s.copy(x, y)
///           }
///       }
///   }
///
///   assert_eq!(trainer::aliased::PLAN.ops[0].accesses.len(), 2); // reads x, writes y
///   ```
///
///   ```
///   #[stepgraph::step(streams(main, member[2]))]
///   mod ensemble {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///       #[buffers]
///       pub struct Buffers {
///           pub input: DeviceBuffer<f32>,
///           #[per_branch]
///           pub out: [DeviceBuffer<f32>; MEMBER_WIDTH],
///           #[per_branch]
///           pub target: [DeviceBuffer<f32>; MEMBER_WIDTH],
///       }
///
///       #[stream(member[d])]
///       fn forward(s: &CaptureStream<'_>, input: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(input, out)
///       }
///
///       // Each member's target from every member's output, on the member's own stream.
///       #[stream(member[d])]
///       fn member_target(
///           s: &CaptureStream<'_>,
///           #[all_branches] out: &[DeviceBuffer<f32>; MEMBER_WIDTH],
///           target: &mut DeviceBuffer<f32>,
///       ) -> Result<()> {
///           s.copy(&out[1], target) // stands for a kernel reading every element
///       }
///   }
///
///   let plan = ensemble::Step::plan();
///   // member_target[0] waits for forward[1] (forward[0] ran before it on its stream).
///   assert_eq!(plan.ops[2].name, "member_target[0]");
///   assert_eq!(plan.ops[2].waits.len(), 1);
///   assert_eq!(plan.ops[2].stream, plan.ops[0].stream);
///   ```
///
/// # Op attributes
///
/// - `#[op]`: marks a `fn` as an op, for one the macro would not recognise (its stream
///   type is an alias declared outside the module); it takes no arguments.
/// - `#[stream(aux)]`: the op runs on `aux` (without it, on the origin).
///   `#[stream(branch[d])]` replicates it over the group, `d` being the index parameter;
///   `#[stream(branch[2])]` places it on one member.
/// - `#[join(a, branch)]`: the op also waits for everything issued so far on `a` and on
///   every member of `branch`, even what it shares no buffer with.
/// - `#[after(op)]`: the op runs after the (earlier) op `op`.
/// - `#[cost(3.0)]`: a relative cost hint for the critical path by cost, and for the
///   planner's placement where no costs file gives a measured one.
/// - `#[every(k)]`: the op runs at every `k`-th replay only (`k` a `u32` config field or
///   a number): a target network synced every K steps, a report every N. The graph holds a
///   one-thread kernel that counts the replays and a conditional node whose body is the
///   op's work, so nothing is captured again; the plan orders the op as if it always ran.
///   The body may hold kernels, matmuls, copies and memsets, not collectives: an op that
///   takes a [`Communicator`] is a compile error. An eager run counts eager runs.
///
///   What the op writes stays as it is at the replays where it does not run: a shared
///   buffer written every k-th replay keeps its value between (the target network above
///   is read at every replay, and holds the weights of the last sync). Scratch does not
///   keep its value, so a scratch copy that only conditional ops wrote may be read only by
///   ops with the same condition (the same `#[every(k)]`, field or count, or the same
///   `#[when(flag)]`); another reader is a compile error naming the writer. An
///   unconditional `#[out]` write before it covers every reader.
///
///   ```
///   #[stepgraph::step(streams(main))]
///   mod dqn_like {
///       use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///       #[buffers]
///       pub struct Buffers {
///           pub online: DeviceBuffer<f32>,
///           pub target: DeviceBuffer<f32>,
///       }
///
///       #[config]
///       #[derive(Clone, Copy)]
///       pub struct Config {
///           pub target_sync: u32,
///       }
///
///       fn train(s: &CaptureStream<'_>, target: &DeviceBuffer<f32>, online: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(target, online) // stands for a training step that reads the target
///       }
///
///       #[every(target_sync)]
///       fn sync_target(s: &CaptureStream<'_>, online: &DeviceBuffer<f32>, target: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(online, target)
///       }
///   }
///
///   assert_eq!(dqn_like::PLAN.ops[1].every, Some("target_sync"));
///   ```
/// - `#[when(flag)]`: the op runs only at the replays where `flag`, a [`DeviceFlag`]
///   field of the buffers, is set when the op's turn comes: work the GPU decides on from
///   the data (a reset after a divergence, a log of an outlier). The graph holds a
///   one-thread kernel that reads the flag and a conditional node whose body is the op's
///   work, so nothing is captured again. The op reads the flag without naming it among
///   its parameters: the plan orders it after the op that set it, and an op that writes
///   the flag later after it. The flag is a shared buffer (not scratch, per-branch or a
///   view), and an op has one condition (`#[every]` or `#[when]`). The body's rules, and
///   those for what the op writes, are `#[every]`'s; for scratch, the same flag covers
///   a reader only while no op writes the flag between the writer and it. An eager run
///   reads the flag on the op's stream and waits for the read.
///
///   ```
///   #[stepgraph::step(streams(main))]
///   mod guarded {
///       use stepgraph::{CaptureStream, DeviceBuffer, DeviceFlag, Result};
///
///       #[buffers]
///       pub struct Buffers {
///           pub loss: DeviceBuffer<f32>,
///           pub diverged: DeviceFlag,
///           pub params: DeviceBuffer<f32>,
///           pub backup: DeviceBuffer<f32>,
///       }
///
///       fn check(s: &CaptureStream<'_>, loss: &DeviceBuffer<f32>, diverged: &mut DeviceFlag) -> Result<()> {
///           // Stands for a kernel that sets it when `loss` is not finite.
///           s.set_flag(diverged, loss.is_empty())
///       }
///
///       #[when(diverged)]
///       fn restore(s: &CaptureStream<'_>, backup: &DeviceBuffer<f32>, params: &mut DeviceBuffer<f32>) -> Result<()> {
///           s.copy(backup, params)
///       }
///   }
///
///   let plan = guarded::Step::plan();
///   assert_eq!(plan.ops[1].when, Some(stepgraph::plan::BufId(1)));
///   assert!(plan.to_string().contains("when diverged"));
///   assert_eq!(plan.ops[1].waits.len(), 0); // after `check` on one stream: stream order
///   ```
///
/// ```
/// #[stepgraph::step(streams(main, branch[2], log(low)))]
/// mod attributes {
///     use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///     #[buffers]
///     pub struct Buffers {
///         pub x: DeviceBuffer<f32>,
///         #[per_branch]
///         pub lanes: [DeviceBuffer<f32>; 2],
///         #[scratch(per_branch)]
///         pub tmp: DeviceBuffer<f32>,
///         pub total: DeviceBuffer<f32>,
///         pub note: DeviceBuffer<f32>,
///     }
///
///     #[config]
///     #[derive(Clone, Copy)]
///     pub struct Config {
///         pub scale: f32,
///     }
///
///     #[cost(2.0)]
///     fn seed(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.memset_zeros(x)
///     }
///
///     #[stream(branch[d])]
///     fn lane(s: &CaptureStream<'_>, d: usize, scale: f32, x: &DeviceBuffer<f32>,
///             #[out] tmp: &mut DeviceBuffer<f32>, lanes: &mut DeviceBuffer<f32>) -> Result<()> {
///         let _ = (d, scale);
///         s.copy(x, tmp)?;
///         s.copy(tmp, lanes)
///     }
///
///     #[join(branch)]
///     fn total(s: &CaptureStream<'_>, lanes: &[DeviceBuffer<f32>; 2],
///              #[buf(total)] out: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.copy(&lanes[1], out)
///     }
///
///     #[stream(log)]
///     #[after(total)]
///     fn log(s: &CaptureStream<'_>, note: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.memset_zeros(note)
///     }
/// }
///
/// let plan = attributes::Step::plan();
/// assert_eq!(plan.ops.iter().map(|o| o.name).collect::<Vec<_>>(),
///            ["seed", "lane[0]", "lane[1]", "total", "log"]);
/// assert_eq!(plan.ops[3].waits.len(), 2); // one per branch
/// ```
///
/// Mistakes are compile errors at the token, all of them in one build: an unknown
/// stream or buffer, a buffer written from two streams with nothing else ordering them,
/// a replicated op writing a shared buffer, scratch read before it is written, a join
/// that waits for nothing, a stream no op runs on, an attribute argument the macro would
/// not use, and more.
///
/// An op's body runs once, while the step is captured; the graph replays only the GPU
/// work it issued. So the macro reads op bodies for host state they reach, and refuses
/// at the token: a `static` of the module (a value fixed at capture, or device memory
/// outside the step's buffers, which streams would race on unseen); `Device::new`,
/// `Device::from_context`, `Device::count` or `CudaContext::new` (a device outside the
/// step); `mem::swap`, `mem::replace` or `mem::take` on a buffer parameter (the buffers
/// would no longer hold the addresses the graph captured); `get` on a [`DeviceScalars`]
/// parameter (its host value, frozen at capture); and the safe accessors
/// `as_cuda_slice()`, `as_cuda_slice_mut()`, `as_cuda_view()` and `as_cuda_view_mut()`,
/// whose cudarc types carry a stream and context out of the capture (inside an op, the
/// `unsafe` `cuda_slice()` and its kin state what the op must keep to). The runtime
/// refuses the same things where the reading cannot see them, in helper functions, and
/// the capture guard ([`Options::capture_guard`]) every CUDA call an op's code makes off
/// its capture stream.
///
/// ```compile_fail
/// #[stepgraph::step(streams(main, a, b))]
/// mod racy {
///     use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///     #[buffers]
///     pub struct Buffers {
///         pub tmp: DeviceBuffer<f32>,
///     }
///
///     #[stream(a)]
///     fn one(s: &CaptureStream<'_>, tmp: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.memset_zeros(tmp)
///     }
///
///     // error: ops `one` (stream `a`) and `two` (stream `b`) both write the shared
///     // buffer `tmp` and nothing else orders them
///     #[stream(b)]
///     fn two(s: &CaptureStream<'_>, tmp: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.memset_zeros(tmp)
///     }
/// }
/// ```
pub use stepgraph_macros::step;
pub use stepgraph_plan::{OpCosts, PlanDesc, Profile};

pub mod kernel {
    //! Modules and kernels: loading images, each kernel's parameter list as the driver reports
    //! it, and the declarations that `stepgraph-build` generates for a crate's kernels.
    //!
    //! A crate's build script runs `stepgraph_build::Builder` (see that crate), which compiles
    //! its `cuda/*.cu` and writes a registry that [`include_kernels!`](crate::include_kernels)
    //! includes: a [`ModuleDecl`] per file, with its [`Image`]s and a [`KernelDecl`] (name and
    //! [`ParamDecl`]s) per kernel, loaded into a [`Registry`] by the generated
    //! `Kernels::load`. Loading compares every declared parameter list with the loaded
    //! kernel's; every launch through [`CaptureStream::launch`](crate::CaptureStream::launch)
    //! is compared with the kernel's [`Param`]s before the driver sees it.

    pub use crate::driver::module::*;
    pub use crate::error::{ArgMismatch, Param, SignatureMismatch};
    /// A launch assembled by hand, argument by argument
    /// ([`CaptureStream::launch`](crate::CaptureStream::launch)).
    pub use crate::op::stream::Launch;
}

/// The cudarc stepgraph is built on, so that code that goes down to it names the same
/// version and features: `stepgraph::cudarc::driver::CudaSlice`.
pub use cudarc;

/// The plan's data types and graph algorithms ([`stepgraph_plan`]): what `#[step]`
/// emits as a module's `PLAN`, and what tools read from it.
pub use stepgraph_plan as plan;

/// The layer under [`Step`]: the executor that issues a plan's ops through a closure,
/// the captured graph, per-op issue counts, cuBLASLt handles outside a step.
pub mod exec {
    pub use crate::blas::{BlasHandle, BlasSession, WORKSPACE_BYTES};
    pub use crate::capture::executor::{
        EveryCounter, Executor, Issue, MAX_PROFILE_REPLAYS, run_once,
    };
    pub use crate::driver::graph::{Graph, NodeCounts, Refresh};
    pub use crate::scope::Mode;
    pub use crate::scope::OpCounts;
}

/// The environment switches [`Options::from_env`] reads.
pub mod env {
    pub use crate::capture::options::{CAPTURE_GUARD, GRAPH_DOT, STREAM_PRIORITIES, VERIFY};
    pub use crate::driver::module::{PORTABLE, portable};
}

/// Figures read off measurements: medians, the work bound's per-kernel and per-op parts
/// and the grid shares it weights kernels by, and floors counted from a model at the GPU's
/// measured ceilings.
pub mod stats {
    pub use crate::measure::floor::{CEILING_COPY_BYTES, CEILING_MATMUL, Ceilings, Floor};
    pub use crate::measure::timing::median;
    pub use crate::measure::work::{
        Bounds, ChainsBound, KernelWork, OpWork, grid_share, wave_share,
    };
}

/// Checks a program runs before it touches a GPU: the CUDA libraries stepgraph loads at
/// run time, and the compute capability its kernels are built for.
pub mod preflight {
    pub use crate::driver::device::{
        REQUIRED_COMPUTE_CAPABILITY, check_compute_capability, check_libraries, require_library,
    };
}

/// What generated code calls. Hidden and versioned: a macro expansion from another
/// version of stepgraph fails to resolve it instead of calling the wrong shapes.
#[doc(hidden)]
pub mod __rt_v1 {
    pub use crate::blas::Blas;
    pub use crate::capture::executor::Issue;
    pub use crate::capture::step::{Step, StepSpec};
    pub use crate::driver::device::{AllocLike, Device};
    pub use crate::driver::memory::{
        DeviceBuffer, DeviceMem, DeviceMemMut, PtrTable, Span, declared_view, declared_view_mut,
    };
    pub use crate::error::{Error, Result};
    pub use crate::kernel::{
        Image, Kernel, KernelDecl, Module, ModuleDecl, ParamDecl, Registry, bf16, f16,
    };
    pub use crate::op::buffer::{
        BufferField, ConfigValue, StepBuffer, ViewSpans, assert_buffer, assert_config, assert_view,
        field_regions,
    };
    pub use crate::op::context::OpContext;
    pub use crate::op::flag::{DeviceFlag, WhenFlag, when_flag};
    pub use crate::op::grant::{Grant, Granted, granted, granted_view};
    pub use crate::op::shared::{
        Shared, SharedRead, SharedUse, SharedWrite, assert_shared, shared_read, shared_use,
        shared_write,
    };
    pub use crate::op::stream::CaptureStream;
    pub use crate::plan::{
        AccessDesc, BufId, BufKind, BufferDesc, EdgeDesc, EdgeKind, EventDesc, EventId, OpDesc,
        OpId, PlanDesc, StreamDesc, StreamId, StreamPriority,
    };
    pub use cudarc::driver::{DeviceRepr, LaunchConfig};

    /// Allocates `count` more copies shaped like `first` (per-stream or per-branch
    /// scratch), naming each in an out-of-memory error.
    pub fn scratch_copies<T: AllocLike>(
        first: &T,
        device: &Device,
        buffer: &'static str,
        count: usize,
    ) -> Result<std::vec::Vec<T>> {
        crate::capture::step::scratch_copies(first, device, buffer, count)
    }

    /// A stream of the plan.
    pub const fn stream(name: &'static str, priority: StreamPriority) -> StreamDesc {
        StreamDesc::named(name).with_priority(priority)
    }

    /// Op `name` (an instance of `func`) on stream `stream` with its accesses.
    pub const fn op(
        name: &'static str,
        func: &'static str,
        stream: u16,
        accesses: &'static [AccessDesc],
    ) -> OpDesc {
        OpDesc::new(name, StreamId(stream))
            .with_func(func)
            .with_accesses(accesses)
    }

    /// A config field's value for an op (a copy of it).
    pub fn cfg<T: Clone>(value: &T) -> T {
        value.clone()
    }

    /// A read of copy `copy` of buffer `buf`.
    pub const fn read(buf: u16, copy: u16) -> AccessDesc {
        AccessDesc::read(BufId(buf), copy)
    }

    /// A write of copy `copy` of buffer `buf`.
    pub const fn write(buf: u16, copy: u16) -> AccessDesc {
        AccessDesc::write(BufId(buf), copy)
    }

    /// Read after write of buffer `buf`: `to` after `from`.
    pub const fn raw(from: u32, to: u32, buf: u16) -> EdgeDesc {
        EdgeDesc::new(
            OpId(from),
            OpId(to),
            EdgeKind::ReadAfterWrite,
            Some(BufId(buf)),
        )
    }

    /// Write after read of buffer `buf`.
    pub const fn war(from: u32, to: u32, buf: u16) -> EdgeDesc {
        EdgeDesc::new(
            OpId(from),
            OpId(to),
            EdgeKind::WriteAfterRead,
            Some(BufId(buf)),
        )
    }

    /// Write after write of buffer `buf`.
    pub const fn waw(from: u32, to: u32, buf: u16) -> EdgeDesc {
        EdgeDesc::new(
            OpId(from),
            OpId(to),
            EdgeKind::WriteAfterWrite,
            Some(BufId(buf)),
        )
    }

    /// An explicit `#[join(..)]`.
    pub const fn join(from: u32, to: u32) -> EdgeDesc {
        EdgeDesc::new(OpId(from), OpId(to), EdgeKind::Join, None)
    }

    /// An explicit `#[after(..)]`.
    pub const fn after(from: u32, to: u32) -> EdgeDesc {
        EdgeDesc::new(OpId(from), OpId(to), EdgeKind::After, None)
    }

    /// An event recorded on `stream` after op `op`.
    pub const fn event(stream: u16, op: u32) -> EventDesc {
        EventDesc::after(StreamId(stream), OpId(op))
    }

    /// The capture-begin fork event.
    pub const fn begin() -> EventDesc {
        EventDesc::at_capture_begin()
    }

    /// Event ids, for waits.
    pub const fn events<const N: usize>(ids: [u16; N]) -> [EventId; N] {
        let mut out = [EventId(0); N];
        let mut i = 0;
        while i < N {
            out[i] = EventId(ids[i]);
            i += 1;
        }
        out
    }

    /// Op ids, for the critical paths.
    pub const fn ops<const N: usize>(ids: [u32; N]) -> [OpId; N] {
        let mut out = [OpId(0); N];
        let mut i = 0;
        while i < N {
            out[i] = OpId(ids[i]);
            i += 1;
        }
        out
    }
}

/// Includes the kernel registry that `stepgraph-build` wrote for this crate (the file
/// `$OUT_DIR/stepgraph_kernels.rs`, or the name given, for a build script that set
/// `Builder::out_file`).
///
/// Put it in a module of its own: it defines `ModuleId`, `KernelId`, `MODULES`,
/// `NVCC_RELEASE`, `NVCC_VERSION` and `Kernels`, whose `load` loads every module once per
/// device (checking each kernel's declared parameters against the loaded module) and which
/// has one typed launcher per kernel. A kernel `scale(float* x, unsigned n, float s)`:
///
/// ```ignore
/// // build.rs: fn main() { stepgraph_build::Builder::new().run(); }
/// mod kernels {
///     stepgraph::include_kernels!();
/// }
/// use kernels::Kernels;
/// use stepgraph::{CaptureStream, DeviceBuffer, Error, LaunchConfig, Result};
///
/// fn double(k: &Kernels, stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
///     let n = u32::try_from(x.len()).map_err(|_| Error::Invalid("x: too long".into()))?;
///     // SAFETY: one thread per element, and the kernel returns for i >= n = x.len().
///     unsafe { k.scale(stream, LaunchConfig::for_num_elems(n), x, n, 2.0) }
/// }
/// ```
///
/// (Not compiled here, for want of a build script's output: `stepgraph-build`'s tests build
/// a crate outside the workspace that does exactly this.) The kernels' own obligations
/// (that the grid and the size arguments keep accesses in bounds) are all that keeps the
/// launchers `unsafe`: the arguments' number, order and types are the compiler's to check.
#[macro_export]
macro_rules! include_kernels {
    () => {
        include!(concat!(env!("OUT_DIR"), "/stepgraph_kernels.rs"));
    };
    ($file:literal) => {
        include!(concat!(env!("OUT_DIR"), "/", $file));
    };
}
