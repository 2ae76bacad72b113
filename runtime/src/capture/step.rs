//! The step type every `#[step]` module runs: [`Step`], generic over the [`StepSpec`] the
//! macro emits for the module.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::DeviceRepr;

use crate::capture::executor::{EveryCounter, Executor, Issue};
use crate::capture::options::{Options, Schedule};
use crate::capture::verify::VerifyReport;
use crate::driver::device::Device;
use crate::driver::memory::{DeviceMem, Span};
use crate::error::{Error, Result};
use crate::measure::work::WorkBound;
use crate::op::host_io::{HostInput, HostOutput, ReadBack};
use crate::op::scalars::HostAccess;
use crate::op::shared::{SharedUse, Sharing, rebinding};
use crate::plan::{BufId, OpCosts, OpId, PlanDesc, Profile};

/// What `#[step]` emits for a step module, and all [`Step`] needs to run it: the plan, the
/// types of the step's buffers, config and kernels, how to allocate its scratch copies
/// and how to issue its ops.
///
/// Implemented by the macro for the module's `Spec` type; not meant to be implemented by
/// hand (a hand-written plan runs on an [`Executor`](crate::exec::Executor) instead).
pub trait StepSpec: 'static {
    /// The module's `#[buffers]` struct.
    type Buffers;
    /// The module's `#[config]` struct.
    type Config;
    /// The type named by `kernels = ..`, or `()`.
    type Kernels;
    /// The scratch copies beyond the one in the buffers, one per extra stream or branch
    /// that uses a scratch buffer.
    #[doc(hidden)]
    type Scratch;
    /// The compile-time plan.
    const PLAN: &'static PlanDesc;

    /// The planner's placement of every op, which `compare(auto)` adds: the same ops, in
    /// the same order, over the same buffer copies, on the planner's streams.
    const AUTO_PLAN: Option<&'static PlanDesc> = None;

    /// Allocates the scratch copies, shaped like the buffers' own.
    #[doc(hidden)]
    fn scratch(buffers: &Self::Buffers, device: &Device) -> Result<Self::Scratch>;

    /// Where each declared view (`#[view(of = ..)]` field) lies in its parent, one span
    /// per copy.
    #[doc(hidden)]
    fn views(buffers: &Self::Buffers) -> Vec<(BufId, &[Span])> {
        let _ = buffers;
        Vec::new()
    }

    /// The shared buffers (`#[shared]` fields) and whether an op writes each.
    #[doc(hidden)]
    fn shared(buffers: &Self::Buffers) -> Vec<SharedUse> {
        let _ = buffers;
        Vec::new()
    }

    /// Issues every op once, in program order.
    #[doc(hidden)]
    fn issue(
        issue: &Issue<'_>,
        buffers: &mut Self::Buffers,
        scratch: &mut Self::Scratch,
        config: &Self::Config,
        kernels: &Self::Kernels,
    ) -> Result<()>;
}

/// A captured step: its buffers, config and kernels, its streams, events and cuBLASLt
/// workspaces, and the graph.
///
/// Each `#[step]` module names its own as `module::Step` (`Step<module::Spec>`), built
/// with [`Step::new`]; every stream, event, workspace and scratch copy is created there,
/// before the first capture, and never during one.
///
/// ```no_run
/// #[stepgraph::step(streams(main))]
/// mod zero {
///     use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
///     #[buffers]
///     pub struct Buffers {
///         pub x: DeviceBuffer<f32>,
///     }
///
///     fn clear(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
///         stream.memset_zeros(x)
///     }
/// }
///
/// let device = stepgraph::Device::new(0)?;
/// let buffers = zero::Buffers { x: device.alloc_zeros("x", 1024)? };
/// let mut step = zero::Step::new(&device, (), buffers, zero::Config {})?;
/// step.replay()?;
/// let x = step.download(|b| &b.x)?;
/// assert!(x.iter().all(|&v| v == 0.0));
/// # Ok::<(), stepgraph::Error>(())
/// ```
pub struct Step<S: StepSpec> {
    /// First, so that it is dropped first: dropping it waits for a replay in flight and
    /// destroys the graph before any buffer the graph refers to is freed.
    exec: Executor,
    buffers: S::Buffers,
    scratch: S::Scratch,
    config: S::Config,
    kernels: Arc<S::Kernels>,
    /// Where its launches stand with the other steps that use its shared buffers.
    sharing: Sharing,
}

impl<S: StepSpec> fmt::Debug for Step<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Step")
            .field("step", &S::PLAN.step)
            .field("exec", &self.exec)
            .finish_non_exhaustive()
    }
}

impl<S: StepSpec> Step<S> {
    /// Builds the step with the planned multi-stream schedule and the options the
    /// environment sets ([`Options::from_env`]), and captures it.
    ///
    /// `kernels` is the value of the type the step declares with `kernels = ..` (or an
    /// `Arc` of it, to share it between steps), or `()` for a step that declares none.
    pub fn new(
        device: &Device,
        kernels: impl Into<Arc<S::Kernels>>,
        buffers: S::Buffers,
        config: S::Config,
    ) -> Result<Self> {
        Self::with_options(device, kernels, buffers, config, Options::from_env()?)
    }

    /// [`Step::new`] with another schedule: [`Schedule::OneStream`] is the one-stream
    /// baseline that every comparison needs.
    pub fn with_schedule(
        device: &Device,
        kernels: impl Into<Arc<S::Kernels>>,
        buffers: S::Buffers,
        config: S::Config,
        schedule: Schedule,
    ) -> Result<Self> {
        let options = Options::from_env()?.with_schedule(schedule);
        Self::with_options(device, kernels, buffers, config, options)
    }

    /// [`Step::new`] with explicit options (schedule, verification, graph dumps, stream
    /// priorities), whatever the environment says.
    pub fn with_options(
        device: &Device,
        kernels: impl Into<Arc<S::Kernels>>,
        buffers: S::Buffers,
        config: S::Config,
        options: Options,
    ) -> Result<Self> {
        let plan = match options.schedule {
            Schedule::Automatic => S::AUTO_PLAN.ok_or_else(|| Error::Config {
                name: "Schedule::Automatic",
                expected: format!(
                    "a step with the planner's plan: `compare(auto)` in the #[step] of `{}`",
                    S::PLAN.step
                ),
                found: "a step with its hand placement only".into(),
            })?,
            _ => S::PLAN,
        };
        let mut exec = Executor::with_options(device, plan, options)?;
        order_views::<S>(&mut exec, &buffers)?;
        let scratch = S::scratch(&buffers, device)?;
        let mut step = Step {
            exec,
            buffers,
            scratch,
            config,
            kernels: kernels.into(),
            sharing: Sharing::new(S::PLAN.step),
        };
        step.capture()?;
        Ok(step)
    }

    /// The compile-time plan (the module's `PLAN`).
    pub const fn plan() -> &'static PlanDesc {
        S::PLAN
    }

    /// The planner's placement of every op (the module's `AUTO_PLAN`), where the step
    /// says `compare(auto)`; [`Schedule::Automatic`] captures it.
    pub const fn auto_plan() -> Option<&'static PlanDesc> {
        S::AUTO_PLAN
    }

    /// The orderings this step adds to its plan because views of one buffer overlap
    /// (`(earlier op, later op)`, op ids of [`Step::plan`]): the plan treats a buffer's
    /// views as disjoint, and where their spans overlap the later op waits for the
    /// earlier one, as for one buffer. Empty when the views are disjoint.
    ///
    /// ```no_run
    /// #[stepgraph::step(streams(main, side))]
    /// mod two {
    ///     use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, ViewMut};
    ///
    ///     #[buffers]
    ///     pub struct Buffers {
    ///         pub all: DeviceBuffer<f32>,
    ///         #[view(of = all)]
    ///         pub a: Span,
    ///         #[view(of = all)]
    ///         pub b: Span,
    ///     }
    ///
    ///     fn fill_a(s: &CaptureStream<'_>, a: &mut ViewMut<'_, f32>) -> Result<()> {
    ///         s.memset_zeros(a)
    ///     }
    ///
    ///     #[stream(side)]
    ///     fn fill_b(s: &CaptureStream<'_>, b: &mut ViewMut<'_, f32>) -> Result<()> {
    ///         s.memset_zeros(b)
    ///     }
    /// }
    ///
    /// use stepgraph::Span;
    ///
    /// let device = stepgraph::Device::new(0)?;
    /// let buffers = |a, b| -> stepgraph::Result<two::Buffers> {
    ///     Ok(two::Buffers { all: device.alloc_zeros("all", 100)?, a, b })
    /// };
    /// // Disjoint: side by side.
    /// let step = two::Step::new(&device, (), buffers(Span::new(0, 50), Span::new(50, 50))?, two::Config {})?;
    /// assert!(step.view_orderings().is_empty());
    /// // Overlapping at element 49: `fill_b` waits for `fill_a`.
    /// let step = two::Step::new(&device, (), buffers(Span::new(0, 50), Span::new(49, 51))?, two::Config {})?;
    /// assert_eq!(step.view_orderings().len(), 1);
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn view_orderings(&self) -> &[(OpId, OpId)] {
        self.exec.view_orderings()
    }

    /// Launches one replay of the graph (capturing it again first if buffers were
    /// rebound). Returns once the launch is queued; [`Step::wait`] waits for it.
    pub fn replay(&mut self) -> Result<()> {
        if self.exec.is_stale() {
            self.capture()?;
        }
        let uses = S::shared(&self.buffers);
        let exec = &self.exec;
        self.sharing.launch(&uses, exec.origin(), || exec.replay())
    }

    /// Launches one graph that runs the step `n` times in a row on the device: a CUDA
    /// conditional WHILE node whose body is the step, with no host round trip between
    /// iterations. Returns once the launch is queued; [`Step::wait`] waits for it.
    ///
    /// The loop's graph is captured at the first call (and again after a
    /// [`rebind`](Step::rebind)); another `n` needs no new capture. Each iteration
    /// counts as a replay for the `#[every(k)]` ops, so an update marked `#[every(4)]` in
    /// an acting step runs at every 4th iteration. The launch counts as one replay for
    /// host inputs and outputs: [`Step::read_back`] gives what the last iteration copied,
    /// without waiting. A step whose ops issue NCCL collectives cannot loop: the driver
    /// allows none in a conditional node's body.
    ///
    /// ```no_run
    /// #[stepgraph::step(streams(main))]
    /// mod count {
    ///     use stepgraph::{CaptureStream, DeviceBuffer, Result};
    ///
    ///     #[buffers]
    ///     pub struct Buffers {
    ///         pub steps: DeviceBuffer<u32>,
    ///         pub syncs: DeviceBuffer<u32>,
    ///     }
    ///
    ///     fn env_step(s: &CaptureStream<'_>, steps: &mut DeviceBuffer<u32>) -> Result<()> {
    ///         s.memset_zeros(steps) // stands for an environment step
    ///     }
    ///
    ///     #[every(4)]
    ///     fn update(s: &CaptureStream<'_>, syncs: &mut DeviceBuffer<u32>) -> Result<()> {
    ///         s.memset_zeros(syncs) // stands for an update, at every 4th iteration
    ///     }
    /// }
    ///
    /// let device = stepgraph::Device::new(0)?;
    /// let buffers = count::Buffers {
    ///     steps: device.alloc_zeros("steps", 1)?,
    ///     syncs: device.alloc_zeros("syncs", 1)?,
    /// };
    /// let mut step = count::Step::new(&device, (), buffers, count::Config {})?;
    /// step.replay_loop(128)?; // 128 iterations, 32 updates, one launch
    /// step.wait()?;
    /// assert_eq!(step.every_counters()?[0].counted, 0); // 128 is a multiple of 4
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn replay_loop(&mut self, n: u32) -> Result<()> {
        if self.exec.is_stale() {
            self.capture()?;
        }
        if !self.exec.loop_captured() {
            self.with_ops(|exec, issue| exec.capture_loop(issue))?;
        }
        let uses = S::shared(&self.buffers);
        let exec = &self.exec;
        self.sharing
            .launch(&uses, exec.origin(), || exec.launch_loop(n))
    }

    /// Runs the ops once without a graph, issued as they come (the eager baseline), on
    /// the same streams and events.
    pub fn run_eager(&mut self) -> Result<()> {
        let uses = S::shared(&self.buffers);
        self.with_launch(&uses, |exec, issue| exec.run_eager(issue))
    }

    /// Waits for the last replay or eager run.
    pub fn wait(&self) -> Result<()> {
        self.exec.wait()
    }

    /// Replays and eager runs launched so far (timed replays included).
    pub fn replays_launched(&self) -> u64 {
        self.exec.replays_launched()
    }

    /// Each `#[every(k)]` op's count of replays (and eager runs) since its work last ran,
    /// modulo its `k`: the op runs at the replay that brings it back to zero. Profiles,
    /// work bounds, verifications and timed replays leave the counts as they found them.
    /// Waits for the last replay.
    ///
    /// ```no_run
    /// #[stepgraph::step(streams(main))]
    /// mod sync {
    ///     use stepgraph::{CaptureStream, DeviceBuffer, Result};
    ///
    ///     #[buffers]
    ///     pub struct Buffers {
    ///         pub online: DeviceBuffer<f32>,
    ///         pub target: DeviceBuffer<f32>,
    ///     }
    ///
    ///     #[every(4)]
    ///     fn sync_target(s: &CaptureStream<'_>, online: &DeviceBuffer<f32>, target: &mut DeviceBuffer<f32>) -> Result<()> {
    ///         s.copy(online, target)
    ///     }
    /// }
    ///
    /// let device = stepgraph::Device::new(0)?;
    /// let buffers = sync::Buffers {
    ///     online: device.upload_new("online", &[1.0f32; 64])?,
    ///     target: device.alloc_zeros("target", 64)?,
    /// };
    /// let mut step = sync::Step::new(&device, (), buffers, sync::Config {})?;
    /// let _warm = step.time_replays(5, 20)?; // leaves the cadence as it was
    /// for _ in 0..3 {
    ///     step.replay()?;
    /// }
    /// let counters = step.every_counters()?;
    /// assert_eq!((counters[0].op, counters[0].counted), ("sync_target", 3));
    /// step.replay()?; // the 4th: the sync runs, and the count is back to 0
    /// assert_eq!(step.every_counters()?[0].counted, 0);
    /// step.reset_every_counters()?; // as when built
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn every_counters(&self) -> Result<Vec<EveryCounter>> {
        self.exec.every_counters()
    }

    /// Sets every `#[every(k)]` op's count back to zero, as when the step was built: the
    /// `k`-th replay from now runs each one. Waits for the last replay.
    pub fn reset_every_counters(&mut self) -> Result<()> {
        self.exec.reset_every_counters()
    }

    /// Waits for the last replay and returns the proof that host values the graph reads
    /// (device scalars) may be written; while it lives the step cannot be replayed.
    pub fn host_access(&self) -> Result<HostAccess<'_>> {
        self.exec.host_access()
    }

    /// Lets `write` fill the next staging slot of the host input `select` picks; the next
    /// replay copies it to the device. Waits only for the replay that last read that slot
    /// (two replays back when the host fills every step), so the host fills batch n+1
    /// while replay n runs. While `write` runs the step is borrowed, so nothing can
    /// replay it: a slot a replay is reading is never written.
    ///
    /// Fails unless an op of this step copies the input (`CaptureStream::stage`).
    pub fn fill<T, R>(
        &mut self,
        select: impl FnOnce(&S::Buffers) -> &HostInput<T>,
        write: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R> {
        self.exec.fill(select(&self.buffers), write)
    }

    /// [`Step::fill`] with a copy of `data`, which must have the input's length.
    pub fn stage<T: Copy>(
        &mut self,
        select: impl FnOnce(&S::Buffers) -> &HostInput<T>,
        data: &[T],
    ) -> Result<()> {
        let input = select(&self.buffers);
        crate::error::check_len(
            format!("the data staged into `{}`", input.name()),
            input.len(),
            data.len(),
        )?;
        self.exec.fill(input, |slot| slot.copy_from_slice(data))
    }

    /// The newest values a finished replay copied into the host output `select` picks
    /// (`CaptureStream::read_back`), without waiting for the GPU: `None` until a replay
    /// that wrote it has finished. [`ReadBack::replay`] says which replay wrote them.
    /// While the read-back lives the step cannot be replayed, so the values stay put.
    pub fn read_back<T>(
        &self,
        select: impl FnOnce(&S::Buffers) -> &HostOutput<T>,
    ) -> Result<Option<ReadBack<'_, T>>> {
        self.exec.read_back(select(&self.buffers))
    }

    /// The values the latest replay copied into the host output `select` picks, waiting
    /// for that replay to finish. Fails if no replay has run.
    pub fn read_back_latest<T>(
        &self,
        select: impl FnOnce(&S::Buffers) -> &HostOutput<T>,
    ) -> Result<ReadBack<'_, T>> {
        self.exec.read_back_latest(select(&self.buffers))
    }

    /// The buffers. Reading them on the host needs [`Step::wait`] first.
    pub fn buffers(&self) -> &S::Buffers {
        &self.buffers
    }

    /// The config values.
    pub fn config(&self) -> &S::Config {
        &self.config
    }

    /// The kernels the ops receive.
    pub fn kernels(&self) -> &Arc<S::Kernels> {
        &self.kernels
    }

    /// Waits for the last replay and copies `data` into the buffer `select` picks (a
    /// `DeviceBuffer` or a `CudaSlice`), in place: its address does not change, so the
    /// graph stays valid.
    pub fn upload<T: DeviceRepr, M: DeviceMem<T>>(
        &mut self,
        select: impl FnOnce(&S::Buffers) -> &M,
        data: &[T],
    ) -> Result<()> {
        self.exec.upload(select(&self.buffers), data)
    }

    /// Waits for the last replay and copies the buffer `select` picks (a `DeviceBuffer` or
    /// a `CudaSlice`) to the host. The selector may also return a reference it was given
    /// from outside, borrowed from [`Step::buffers`] (its lifetime is the step's borrow).
    pub fn download<'s, T: DeviceRepr + Clone + Default, M: DeviceMem<T> + 's>(
        &'s self,
        select: impl FnOnce(&'s S::Buffers) -> &'s M,
    ) -> Result<Vec<T>> {
        self.exec.download(select(&self.buffers))
    }

    /// Waits for the last replay once and copies every buffer `select` picks to the host,
    /// in the order picked: a whole network's tensors with one wait, where
    /// [`Step::download`] per tensor would wait for each.
    ///
    /// ```no_run
    /// #[stepgraph::step(streams(main))]
    /// mod net {
    ///     use stepgraph::{CaptureStream, DeviceBuffer, Result, StepBuffer};
    ///
    ///     #[derive(StepBuffer)]
    ///     pub struct Linear {
    ///         pub w: DeviceBuffer<f32>,
    ///         pub b: DeviceBuffer<f32>,
    ///     }
    ///
    ///     #[buffers]
    ///     pub struct Buffers {
    ///         pub layers: [Linear; 2],
    ///     }
    ///
    ///     fn clear(stream: &CaptureStream<'_>, layers: &mut [Linear; 2]) -> Result<()> {
    ///         for l in layers {
    ///             stream.memset_zeros(&mut l.w)?;
    ///             stream.memset_zeros(&mut l.b)?;
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let device = stepgraph::Device::new(0)?;
    /// let layer = |n| -> stepgraph::Result<net::Linear> {
    ///     Ok(net::Linear { w: device.alloc_zeros("w", n * n)?, b: device.alloc_zeros("b", n)? })
    /// };
    /// let buffers = net::Buffers { layers: [layer(8)?, layer(4)?] };
    /// let mut step = net::Step::new(&device, (), buffers, net::Config {})?;
    /// step.replay()?;
    /// let tensors = step.download_many(|b| b.layers.iter().flat_map(|l| [&l.w, &l.b]).collect())?;
    /// let lens: Vec<usize> = tensors.iter().map(Vec::len).collect();
    /// assert_eq!(lens, [64, 8, 16, 4]);
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn download_many<'s, T: DeviceRepr + Clone + Default, M: DeviceMem<T> + 's>(
        &'s self,
        select: impl FnOnce(&'s S::Buffers) -> Vec<&'s M>,
    ) -> Result<Vec<Vec<T>>> {
        self.exec.download_many(&select(&self.buffers))
    }

    /// The executor: streams, events, the graph. The way down to the layer below.
    pub fn executor(&self) -> &Executor {
        &self.exec
    }

    /// Device time of `iters` replays after `warmup` unmeasured ones, in milliseconds
    /// each, from CUDA events recorded around each replay.
    pub fn time_replays(&mut self, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        if self.exec.is_stale() {
            self.capture()?;
        }
        let uses = S::shared(&self.buffers);
        let exec = &self.exec;
        self.sharing
            .launch(&uses, exec.origin(), || exec.time_replays(warmup, iters))
    }

    /// Waits for the last replay, lets `f` change the buffers (swap one for another of
    /// the same shape, say), and captures again: the executable graph is updated in place
    /// when the driver accepts it, instantiated anew otherwise.
    pub fn rebind<R>(&mut self, f: impl FnOnce(&mut S::Buffers) -> R) -> Result<R> {
        self.exec.wait()?;
        let out = rebinding::within(S::PLAN.step, || f(&mut self.buffers));
        self.exec.mark_stale();
        order_views::<S>(&mut self.exec, &self.buffers)?;
        self.capture()?;
        Ok(out)
    }

    /// Waits for the last replay, drops the graph, and returns the buffers and config.
    pub fn into_parts(self) -> Result<(S::Buffers, S::Config)> {
        self.exec.wait()?;
        let Step {
            exec,
            buffers,
            config,
            ..
        } = self;
        drop(exec);
        Ok((buffers, config))
    }

    /// Captures a second graph of the step with timing events around every op, replays
    /// it `replays` times and returns the median timeline: per-op durations, per-stream
    /// busy time, the measured critical path, the overlap. The normal graph is untouched.
    pub fn profile(&mut self, replays: usize) -> Result<Profile> {
        let uses = S::shared(&self.buffers);
        self.with_launch(&uses, |exec, issue| exec.profile(issue, replays))
    }

    /// Captures the step once more and measures its work bound: every kernel timed alone,
    /// weighted by the share of the GPU its grid occupies. The kernels run many times on
    /// this step's buffers (in-place updates included): measure when the values no longer
    /// matter.
    pub fn work_bound(&mut self) -> Result<WorkBound> {
        let uses = S::shared(&self.buffers);
        self.with_launch(&uses, |exec, issue| exec.work_bound(issue))
    }

    /// Measures each op's cost for automatic placement: [`work_bound`](Self::work_bound)
    /// read as [`OpCosts`], whose text is the file `#[step(costs = "..")]` reads. Like the
    /// work bound, it runs the kernels many times on this step's buffers.
    pub fn op_costs(&mut self) -> Result<OpCosts> {
        Ok(self.work_bound()?.op_costs())
    }

    /// Captures the step again, reads the graph back from the driver and checks it
    /// against the plan: every dependency ordered, nothing independent ordered, each op's
    /// nodes what it issued. Debug builds do this at every capture.
    pub fn verify(&mut self) -> Result<VerifyReport> {
        self.with_ops(|exec, issue| exec.verify(issue))
    }

    /// Runs `f` with the executor and the closure that issues this step's ops, which the
    /// executor's passes (capture, eager run, profile, verify, work bound) take.
    fn with_ops<R>(
        &mut self,
        f: impl FnOnce(&mut Executor, &mut dyn FnMut(&Issue<'_>) -> Result<()>) -> R,
    ) -> R {
        let Step {
            exec,
            buffers,
            scratch,
            config,
            kernels,
            ..
        } = self;
        f(exec, &mut |issue| {
            S::issue(issue, buffers, scratch, config, kernels)
        })
    }

    /// [`Step::with_ops`] for work that runs the ops (an eager run, a profile, a work
    /// bound): ordered with the other steps that use this step's shared buffers.
    fn with_launch<R>(
        &mut self,
        uses: &[SharedUse],
        f: impl FnOnce(&mut Executor, &mut dyn FnMut(&Issue<'_>) -> Result<()>) -> Result<R>,
    ) -> Result<R> {
        let Step {
            exec,
            buffers,
            scratch,
            config,
            kernels,
            sharing,
        } = self;
        let origin = exec.origin().clone();
        sharing.launch(uses, &origin, || {
            f(exec, &mut |issue| {
                S::issue(issue, buffers, scratch, config, kernels)
            })
        })
    }

    /// Captures the step again with its buffers as they are: after another step's
    /// [`rebind`](Step::rebind) (or the host, through [`Shared::host`](crate::Shared::host))
    /// replaced a shared buffer's memory, which this step refuses to run on until then
    /// ([`Error::SharedRebound`](crate::Error::SharedRebound)).
    pub fn recapture(&mut self) -> Result<()> {
        self.exec.wait()?;
        self.exec.mark_stale();
        order_views::<S>(&mut self.exec, &self.buffers)?;
        self.capture()
    }

    fn capture(&mut self) -> Result<()> {
        self.with_ops(|exec, issue| exec.capture(issue))?;
        self.sharing.captured(&S::shared(&self.buffers));
        Ok(())
    }
}

/// Adds the orderings overlapping views need, for a step that declares views.
fn order_views<S: StepSpec>(exec: &mut Executor, buffers: &S::Buffers) -> Result<()> {
    let views = S::views(buffers);
    if !views.is_empty() {
        exec.order_overlapping_views(&views)?;
    }
    Ok(())
}

/// Allocates `count` more copies shaped like `first` (per-stream or per-branch scratch),
/// naming each in an out-of-memory error.
pub(crate) fn scratch_copies<T: crate::driver::device::AllocLike>(
    first: &T,
    device: &Device,
    buffer: &'static str,
    count: usize,
) -> Result<Vec<T>> {
    (1..=count)
        .map(|i| first.alloc_like(device, &format!("scratch copy {i} of `{buffer}`")))
        .collect()
}
