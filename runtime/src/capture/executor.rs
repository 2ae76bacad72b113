//! The executor behind every generated step: the streams, events and cuBLASLt handles a
//! plan needs, created once; the dry pass, the capture, the replay.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::blas::BlasHandle;
use crate::capture::options::{Options, Schedule};
use crate::capture::verify::VerifyReport;
use crate::driver::device::Device;
use crate::driver::event::{elapsed_ms, event};
use crate::driver::graph::{CaptureState, OpNodes, capture_state};
use crate::driver::graph::{CapturedGraph, Graph, NodeCounts, Refresh};
use crate::driver::memory::Span;
use crate::error::{Error, Result};
use crate::measure::timing::median;
use crate::op::every::Condition;
use crate::op::flag::DeviceFlag;
use crate::op::host_io::{HostInput, HostOutput, IoKind, IoPass, ReadBack};
use crate::op::scalars::HostAccess;
use crate::op::stream::{CaptureStream, Mode};
use crate::plan::{BufId, OpDesc, OpId, PlanDesc, StreamDesc, StreamId, StreamPriority};
use crate::plan::{OpTiming, Profile, WaitEdge};

/// The most replays [`Executor::profile`] takes: it keeps two times per op per replay,
/// and a profile of more replays than this takes minutes and says nothing more.
pub const MAX_PROFILE_REPLAYS: usize = 100_000;

/// The replays a profile runs: `replays`, at least one, at most [`MAX_PROFILE_REPLAYS`].
fn profile_replays(replays: usize) -> Result<usize> {
    if replays > MAX_PROFILE_REPLAYS {
        return Err(Error::TooLarge {
            what: "replays of a profile".into(),
            found: replays as u64,
            max: MAX_PROFILE_REPLAYS as u64,
            why: "it keeps two times per op per replay, and more say nothing more",
        });
    }
    Ok(replays.max(1))
}

/// Streams, events and per-stream cuBLASLt handles of one step, and its graph: the layer
/// under [`Step`](crate::Step), which owns one, and the way to run a hand-built
/// [`PlanDesc`] whose ops are issued by a closure.
///
/// Dropping it waits for a replay in flight and destroys the graph, so it must be dropped
/// before any buffer the graph refers to is freed ([`Step`](crate::Step) declares it
/// first for that reason).
pub struct Executor {
    graph: Option<Graph>,
    /// Streams have priorities: graphs are instantiated to keep each kernel's.
    node_priority: bool,
    /// A rebind changed buffers since the last capture: capture again before replaying.
    stale: bool,
    plan: &'static PlanDesc,
    schedule: Schedule,
    device: Device,
    /// One per plan stream (one in all for [`Schedule::OneStream`]); index 0 is the origin.
    streams: Vec<Arc<CudaStream>>,
    blas: Vec<BlasHandle>,
    /// One per plan event, timing disabled.
    events: Vec<CudaEvent>,
    /// One per stream: joins a side stream back if an op fails mid-capture, so the
    /// capture can be ended and discarded cleanly.
    abort_joins: Vec<CudaEvent>,
    last_refresh: Option<Refresh>,
    /// Orderings beyond the plan's: views of one buffer that overlap once the buffers are
    /// known ([`Executor::order_overlapping_views`]).
    extra: ExtraOrderings,
    /// The kernels, counters and body stream of conditional ops (`#[every]`, `#[when]`),
    /// if the plan has any.
    conditional: Option<crate::op::every::ConditionalOps>,
    /// Whether captures are read back and checked against the plan.
    verify: bool,
    last_verify: Option<VerifyReport>,
    options: Options,
    /// Identifies this executor to the host inputs and outputs its graph copies.
    id: u64,
    /// The step's device loop ([`Executor::replay_loop`]), once one was launched.
    repeat: Option<repeat::Repeat>,
    /// Replay numbers and completion events, for host inputs and outputs.
    clock: crate::op::host_io::Clock,
    /// The graph's copies from and to host inputs and outputs, re-pointed before each
    /// replay at the slots it uses. Empty: replays record no event.
    patches: RefCell<Vec<crate::op::host_io::Patch>>,
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("step", &self.plan.step)
            .field("schedule", &self.schedule)
            .field("streams", &self.streams.len())
            .field("events", &self.events.len())
            .field("captured", &self.graph.is_some())
            .finish()
    }
}

mod repeat;

impl Drop for Executor {
    fn drop(&mut self) {
        // A replay may still read the buffers dropped right after this value.
        if let Some(origin) = self.streams.first() {
            self.device.context().record_err(origin.synchronize());
        }
    }
}

/// The driver priority of each plan stream when the step is built with any stream other
/// than the normal one (`None` otherwise, and for the baselines). The driver's range is
/// `(least, greatest)`, `(0, -5)` on an H100, lower numbers first: low gets the least,
/// high the greatest, normal the middle.
fn stream_priorities(
    device: &Device,
    plan: &PlanDesc,
    options: &Options,
) -> Result<Option<Vec<i32>>> {
    if !matches!(options.schedule, Schedule::Planned | Schedule::Automatic) {
        return Ok(None);
    }
    let wanted = options.priorities(plan)?;
    if wanted.iter().all(|&p| p == StreamPriority::Normal) {
        return Ok(None);
    }
    // The range is the current context's.
    device
        .context()
        .bind_to_thread()
        .map_err(Error::driver("cuCtxSetCurrent"))?;
    let (least, greatest) = crate::driver::device::stream_priority_range()?;
    Ok(Some(
        wanted
            .iter()
            .map(|p| match p {
                StreamPriority::Low => least,
                StreamPriority::Normal => (least + greatest) / 2,
                StreamPriority::High => greatest,
            })
            .collect(),
    ))
}

impl Executor {
    /// Creates every stream, event and cuBLASLt handle (with its workspace) the plan
    /// needs under `schedule`, with the other options the environment sets
    /// ([`Options::from_env`]). Nothing is created later, in particular not during capture.
    pub fn new(device: &Device, plan: &'static PlanDesc, schedule: Schedule) -> Result<Executor> {
        Self::with_options(device, plan, Options::from_env()?.with_schedule(schedule))
    }

    /// [`Executor::new`] with explicit options.
    ///
    /// The plan is checked first ([`PlanDesc::check`]): every index in it must be in range,
    /// since issuing it indexes the streams, events and ops by them.
    pub fn with_options(
        device: &Device,
        plan: &'static PlanDesc,
        options: Options,
    ) -> Result<Executor> {
        crate::scope::check("Executor::new")?;
        plan.check()?;
        let schedule = options.schedule;
        let n_streams = if schedule.parallel() {
            plan.streams.len().max(1)
        } else {
            1
        };
        let mut streams = Vec::with_capacity(n_streams);
        let mut blas = Vec::with_capacity(n_streams);
        let priorities = stream_priorities(device, plan, &options)?;
        for i in 0..n_streams {
            let stream = match priorities.as_ref().and_then(|p| p.get(i)) {
                Some(&p) => device
                    .context()
                    .new_stream_with_priority(p)
                    .map_err(Error::driver("cuStreamCreateWithPriority"))?,
                None => device
                    .context()
                    .new_stream()
                    .map_err(Error::driver("cuStreamCreate"))?,
            };
            let name = plan.streams.get(i).map_or("origin", |s| s.name);
            blas.push(BlasHandle::new(
                device,
                &stream,
                &format!("cuBLASLt workspace of stream `{name}`"),
            )?);
            streams.push(stream);
        }
        // The one-stream baseline orders everything by stream order: no events.
        let events = if schedule.parallel() {
            (0..plan.events.len())
                .map(|_| event(device, false))
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let abort_joins = (0..n_streams)
            .map(|_| event(device, false))
            .collect::<Result<_>>()?;
        Ok(Executor {
            graph: None,
            node_priority: priorities.is_some(),
            stale: false,
            plan,
            schedule,
            device: device.clone(),
            streams,
            blas,
            events,
            abort_joins,
            last_refresh: None,
            extra: ExtraOrderings::none(plan.ops.len()),
            conditional: crate::op::every::ConditionalOps::new(device, plan)?,
            verify: options.verify,
            last_verify: None,
            options,
            repeat: None,
            id: crate::op::host_io::next_executor_id(),
            clock: crate::op::host_io::Clock::new(device)?,
            patches: RefCell::new(Vec::new()),
        })
    }

    /// The plan this executor follows.
    pub fn plan(&self) -> &'static PlanDesc {
        self.plan
    }

    /// Orders the ops that the plan leaves unordered but that conflict through views of
    /// one buffer whose spans overlap: `views` gives, for each view buffer of the plan
    /// ([`BufferDesc::view_of`](crate::plan::BufferDesc::view_of)), where each of its
    /// copies lies in the parent. The compile-time plan treats two views of one buffer as
    /// disjoint; for every pair of ops that it leaves unordered and that reach an
    /// overlapping element (a write among them), the later op's stream waits for the
    /// earlier op, as if the views were one buffer. Returns the orderings added (also in
    /// [`view_orderings`](Self::view_orderings)); call before the first capture.
    ///
    /// ```no_run
    /// use stepgraph::exec::Executor;
    /// use stepgraph::plan::{AccessDesc, BufId, BufKind, BufferDesc, OpDesc, PlanDesc, StreamDesc, StreamId};
    /// use stepgraph::{Device, Schedule, Span};
    ///
    /// // Two ops on two streams write views 1 and 2 of buffer 0.
    /// static PLAN: PlanDesc = PlanDesc::new("views")
    ///     .with_streams(&[StreamDesc::named("main"), StreamDesc::named("side")])
    ///     .with_buffers(&[
    ///         BufferDesc::new("all", BufKind::Shared),
    ///         BufferDesc::new("a", BufKind::Shared).with_view_of(BufId(0)),
    ///         BufferDesc::new("b", BufKind::Shared).with_view_of(BufId(0)),
    ///     ])
    ///     .with_ops(&[
    ///         OpDesc::new("fill_a", StreamId(0)).with_accesses(&[AccessDesc::write(BufId(1), 0)]),
    ///         OpDesc::new("fill_b", StreamId(1)).with_accesses(&[AccessDesc::write(BufId(2), 0)]),
    ///     ]);
    /// let device = Device::new(0)?;
    /// let mut exec = Executor::new(&device, &PLAN, Schedule::Planned)?;
    /// let (a, b) = ([Span::new(0, 10)], [Span::new(5, 10)]);
    /// let added = exec.order_overlapping_views(&[(BufId(1), &a), (BufId(2), &b)])?;
    /// assert_eq!(added.len(), 1); // fill_b after fill_a: elements 5..10 are both's
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn order_overlapping_views(
        &mut self,
        views: &[(BufId, &[Span])],
    ) -> Result<Vec<(OpId, OpId)>> {
        let plan = self.plan;
        let edges: Vec<(usize, usize)> = if self.parallel() {
            plan.schedule_edges()
                .into_iter()
                .map(|(a, b)| (a.index(), b.index()))
                .collect()
        } else {
            // One stream orders everything already.
            (1..plan.ops.len()).map(|b| (b - 1, b)).collect()
        };
        let place = |buf: BufId, copy: u16| {
            let (_, spans) = views.iter().find(|(b, _)| *b == buf)?;
            spans.get(usize::from(copy)).map(|s| s.start()..s.end())
        };
        let added = plan.view_orderings(&edges, place);
        self.extra = ExtraOrderings::new(&self.device, plan.ops.len(), &added)?;
        self.stale = true;
        Ok(added)
    }

    /// The orderings added by [`order_overlapping_views`](Self::order_overlapping_views).
    pub fn view_orderings(&self) -> &[(OpId, OpId)] {
        &self.extra.pairs
    }

    /// The schedule it was built for.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// The options it was built with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The captured graph, once captured.
    pub fn graph(&self) -> Option<&Graph> {
        self.graph.as_ref()
    }

    /// What the last capture did to an existing graph (`None` after the first).
    pub fn last_refresh(&self) -> Option<Refresh> {
        self.last_refresh
    }

    /// Node counts of the captured graph.
    pub fn node_counts(&self) -> Result<NodeCounts> {
        match &self.graph {
            Some(g) => g.node_counts(),
            None => Err(Error::NotCaptured {
                step: self.plan.step,
                stale: false,
            }),
        }
    }

    fn physical(&self, stream: StreamId) -> usize {
        if self.schedule.parallel() {
            stream.index()
        } else {
            0
        }
    }

    /// How a stream handle reads in a message: one of this step's streams by its plan
    /// name, any other as the guard describes it.
    fn stream_text(&self, handle: usize) -> String {
        let mine = self
            .streams
            .iter()
            .position(|s| s.cu_stream() as usize == handle);
        match mine {
            Some(i) if self.parallel() => {
                format!("stream `{}` of the step", self.plan.streams[i].name)
            }
            Some(_) => "the step's one stream".to_string(),
            None => crate::capture::guard::stream_text(handle),
        }
    }

    /// The stream where capture begins and ends and every graph is launched.
    pub(crate) fn origin(&self) -> &Arc<CudaStream> {
        &self.streams[0]
    }

    fn parallel(&self) -> bool {
        self.schedule.parallel()
    }

    /// Records the capture-begin fork events on the origin stream.
    fn record_fork_events(&self) -> Result<()> {
        if !self.parallel() {
            return Ok(());
        }
        for (i, ev) in self.plan.events.iter().enumerate() {
            if ev.after.is_none() {
                self.events[i]
                    .record(self.origin())
                    .map_err(Error::driver("cuEventRecord"))?;
            }
        }
        Ok(())
    }

    /// Makes the origin stream wait for the final joins of the plan.
    fn final_joins(&self) -> Result<()> {
        if !self.parallel() {
            return Ok(());
        }
        for ev in self.plan.final_waits {
            self.origin()
                .wait(&self.events[ev.index()])
                .map_err(Error::driver("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Runs the ops once, in `mode`, through `issue` (generated code).
    fn pass(
        &self,
        mode: Mode,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
        extras: Extras<'_>,
        io: &IoPass,
    ) -> Result<()> {
        issue(&Issue {
            exec: self,
            mode,
            extras,
            io,
        })
    }

    /// What a pass tells the copies to and from host inputs and outputs: `kind` says
    /// whose copies they are, `seq` which replay they serve.
    fn io_pass(&self, kind: Option<IoKind>, seq: u64) -> IoPass {
        IoPass {
            owner: self.id,
            seq,
            kind,
            captured: RefCell::new(Vec::new()),
        }
    }

    fn sync_all(&self) -> Result<()> {
        for s in &self.streams {
            s.synchronize()
                .map_err(Error::driver("cuStreamSynchronize"))?;
        }
        Ok(())
    }

    /// The dry pass, then a RELAXED-mode capture of the ops on the origin stream, then
    /// instantiate (or update in place) and upload. On any failure the capture is ended
    /// and discarded and the previous graph, if any, is kept.
    ///
    /// With verification on (the default in debug builds, see [`Executor::set_verify`])
    /// the captured graph is read back and checked against the plan before it is
    /// instantiated.
    pub fn capture(&mut self, issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>) -> Result<()> {
        crate::scope::check("Step::capture")?;
        let tracker = self.verify.then(|| Tracker::new(self.plan.ops.len()));
        self.capture_tracked(issue, tracker.as_ref()).map(|_| ())
    }

    /// [`Executor::capture`], with the capture checked against the plan when `tracker`
    /// records each op's nodes; returns the check's report then.
    fn capture_tracked(
        &mut self,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
        tracker: Option<&RefCell<Tracker>>,
    ) -> Result<Option<VerifyReport>> {
        let step = self.plan.step;
        let wrap = |e: Error| Error::Capture {
            step,
            source: Box::new(e),
        };
        let extras = Extras {
            tracker,
            timers: None,
        };
        let io = self.io_pass(Some(IoKind::Graph), self.clock.launched() + 1);
        let captured = self.capture_graph(issue, extras, &io).map_err(wrap)?;
        // The copies from and to host rings, found in the new graph; they make it be
        // instantiated anew, since a patched node is one of the instantiated graph's.
        let patches = io
            .captured
            .into_inner()
            .into_iter()
            .map(crate::op::host_io::Patch::new)
            .collect::<Result<Vec<_>>>()
            .map_err(wrap)?;
        if tracker.is_some()
            && let Some(path) = self.options.graph_dot_path(step, self.device.ordinal())
        {
            captured.write_dot(&path).map_err(wrap)?;
        }
        let report = match tracker {
            Some(tracker) => Some(
                crate::capture::verify::verify_graph(
                    self.plan,
                    &self.extra.pairs,
                    self.schedule == Schedule::OneStream,
                    captured.raw(),
                    &tracker.borrow().per_op,
                )
                .map_err(wrap)?,
            ),
            None => None,
        };
        if report.is_some() {
            self.last_verify = report;
        }
        match &mut self.graph {
            // A conditional node's handle is the capture's own: a new capture has new
            // handles, which an in-place update would pair with the old nodes, so a graph
            // with conditional ops, or with host rings' patched copies, is instantiated anew.
            Some(graph) if self.conditional.is_none() && patches.is_empty() => {
                self.last_refresh = Some(graph.update(captured).map_err(wrap)?)
            }
            Some(_) => {
                self.graph = Some(Graph::instantiate(captured, self.node_priority).map_err(wrap)?);
                self.last_refresh = Some(Refresh::Reinstantiated);
            }
            None => {
                self.graph = Some(Graph::instantiate(captured, self.node_priority).map_err(wrap)?)
            }
        }
        *self.patches.get_mut() = patches;
        self.stale = false;
        // The loop's graph was captured from the same buffers: capture it again too.
        if let Some(r) = &mut self.repeat {
            r.forget_graph();
        }
        let origin = self.origin().clone();
        if let Some(graph) = &self.graph {
            graph.upload(&origin).map_err(wrap)?;
        }
        origin
            .synchronize()
            .map_err(|e| wrap(Error::driver("cuStreamSynchronize")(e)))?;
        Ok(report)
    }

    /// Turns verification of every capture on or off (on by default in debug builds).
    pub fn set_verify(&mut self, on: bool) {
        self.verify = on;
    }

    /// The report of the last verified capture.
    pub fn last_verify(&self) -> Option<VerifyReport> {
        self.last_verify
    }

    /// Captures the step again with verification on, whatever the build, and returns
    /// what was checked. The graph is updated in place with the new capture.
    pub fn verify(
        &mut self,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
    ) -> Result<VerifyReport> {
        crate::scope::check("Step::verify")?;
        // The `#[every]` cadence is the step's, not the verification's.
        let counts = self.cadence()?;
        let tracker = Tracker::new(self.plan.ops.len());
        let report = self.capture_tracked(issue, Some(&tracker)).and_then(|r| {
            r.ok_or_else(|| Error::Internal {
                what: "verification produced no report".into(),
            })
        });
        self.restore_cadence(&counts)?;
        report
    }

    /// The `#[every]` counts, after the last replay.
    fn cadence(&self) -> Result<Vec<(usize, u32)>> {
        match &self.conditional {
            Some(ops) => {
                self.wait()?;
                ops.counters(&self.device)
            }
            None => Ok(Vec::new()),
        }
    }

    /// Puts counts [`Executor::cadence`] read back, once the device is idle.
    fn restore_cadence(&self, counts: &[(usize, u32)]) -> Result<()> {
        match &self.conditional {
            Some(ops) if !counts.is_empty() => {
                self.wait()?;
                ops.restore(&self.device, counts)
            }
            _ => Ok(()),
        }
    }

    /// The dry pass and a capture, with the extras (node tracking, timing events), ending
    /// with the captured graph. The capture is always ended, also when an op fails.
    fn capture_graph(
        &self,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
        extras: Extras<'_>,
        io: &IoPass,
    ) -> Result<CapturedGraph> {
        self.capture_into(issue, extras, io, None)
    }

    /// [`Executor::capture_graph`], or with `looped`, the graph of the step's device
    /// loop: the ops are captured into the body of the loop's WHILE node.
    fn capture_into(
        &self,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
        extras: Extras<'_>,
        io: &IoPass,
        looped: Option<&repeat::Repeat>,
    ) -> Result<CapturedGraph> {
        // The capture guard watches both passes: what an op's code calls outside the
        // runtime is checked from the dry pass on.
        let _watching = if self.options.capture_guard {
            Some(crate::capture::guard::watch_capture()?)
        } else {
            None
        };
        // Dry pass: checks arguments and builds and warms matmul plans, so that nothing
        // is created inside the capture.
        let dry = self.pass(Mode::Dry, issue, Extras::default(), io);
        crate::scope::free_deferred();
        dry?;
        self.sync_all()?;

        let origin = self.origin().clone();
        match looped {
            None => crate::driver::graph::begin_capture(&origin)?,
            Some(r) => r.begin(&origin)?,
        }
        let issued = extras
            .timers
            .as_ref()
            .map_or(Ok(()), |t| {
                crate::driver::event::record_external(&t.begin, &origin)
            })
            .and_then(|()| self.record_fork_events())
            .and_then(|()| self.pass(Mode::Capture, issue, extras, io))
            .and_then(|()| self.final_joins())
            .and_then(|()| looped.map_or(Ok(()), |r| r.next(&origin)));
        if issued.is_err() {
            self.abort_join();
        }
        // The origin stream is capturing (begun above); ending it returns the graph,
        // which CapturedGraph owns from here on. In a loop it returns the WHILE node's
        // body, which the node owns, and the loop's own capture holds the graph.
        let ended = match looped {
            None => crate::driver::graph::end_capture(&origin),
            Some(r) => {
                let body = crate::driver::graph::end_capture(&origin);
                let outer = r.end();
                match (body, outer) {
                    (Ok(_), outer) => outer,
                    (Err(e), Ok(graph)) => {
                        drop(r.owned(graph));
                        Err(e)
                    }
                    (Err(e), Err(_)) => Err(e),
                }
            }
        };
        crate::scope::free_deferred();
        let captured = match ended {
            Ok(g) if !g.is_null() => {
                // SAFETY: fresh graph from a successful end of capture, owned by nobody else.
                Some(unsafe { CapturedGraph::new(g, self.device.context().clone()) })
            }
            Ok(_) => None,
            Err(e) => {
                issued?;
                return Err(e);
            }
        };
        issued?;
        captured.ok_or_else(|| Error::Internal {
            what: "the driver returned no graph for the capture".into(),
        })
    }

    /// Captures a second graph of the step with timing events around every op, replays
    /// it `replays` times (after two warm-up replays) and returns the median of each
    /// op's start and end. The normal graph is untouched and carries no timing events.
    /// At most [`MAX_PROFILE_REPLAYS`] replays.
    pub fn profile(
        &self,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
        replays: usize,
    ) -> Result<Profile> {
        crate::scope::check("Step::profile")?;
        let replays = profile_replays(replays)?;
        self.keeping_cadence(|exec| exec.profile_kept(issue, replays))
    }

    fn profile_kept(
        &self,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
        replays: usize,
    ) -> Result<Profile> {
        let timing = || event(&self.device, true);
        let n = self.plan.ops.len();
        let timers = Timers {
            begin: timing()?,
            start: (0..n).map(|_| timing()).collect::<Result<_>>()?,
            end: (0..n).map(|_| timing()).collect::<Result<_>>()?,
        };
        let extras = Extras {
            tracker: None,
            timers: Some(&timers),
        };
        // Its copies from and to host rings use the slots the next replay uses: ones no
        // read-back refers to, and inputs the host cannot write while this runs.
        let io = self.io_pass(None, self.clock.launched() + 1);
        let captured = self.capture_graph(issue, extras, &io)?;
        let graph = Graph::instantiate(captured, self.node_priority)?;
        let origin = self.origin();
        graph.upload(origin)?;
        let mut starts = vec![Vec::with_capacity(replays); n];
        let mut ends = vec![Vec::with_capacity(replays); n];
        let mut totals = Vec::with_capacity(replays);
        for r in 0..replays + 2 {
            graph.launch(origin)?;
            origin
                .synchronize()
                .map_err(Error::driver("cuStreamSynchronize"))?;
            if r < 2 {
                continue;
            }
            let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
            for i in 0..n {
                let since = |e: &CudaEvent| elapsed_ms(&timers.begin, e);
                let (s, e) = (since(&timers.start[i])?, since(&timers.end[i])?);
                first = first.min(s);
                last = last.max(e);
                starts[i].push(s);
                ends[i].push(e);
            }
            totals.push(last - first);
        }
        let ops: Vec<OpTiming> = self
            .plan
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let start_ms = median(&mut starts[i]);
                OpTiming {
                    name: op.name.to_string(),
                    func: op.func.to_string(),
                    stream: op.stream.index(),
                    start_ms,
                    end_ms: median(&mut ends[i]).max(start_ms),
                }
            })
            .collect();
        let durations: Vec<f64> = ops.iter().map(OpTiming::duration_ms).collect();
        let (path, _) = self.plan.longest_path(&durations);
        let waits = self
            .plan
            .ops
            .iter()
            .enumerate()
            .flat_map(|(to, op)| {
                op.waits.iter().filter_map(move |ev| {
                    self.plan.events[ev.index()].after.map(|a| WaitEdge {
                        from: a.index(),
                        to,
                    })
                })
            })
            .collect();
        // Shift so the profile starts at zero.
        let t0 = ops.iter().map(|o| o.start_ms).fold(f64::INFINITY, f64::min);
        let t0 = if t0.is_finite() { t0 } else { 0.0 };
        Ok(Profile {
            step: self.plan.step.to_string(),
            device: self.device.name().to_string(),
            streams: self
                .plan
                .streams
                .iter()
                .map(|s| s.name.to_string())
                .collect(),
            ops: ops
                .into_iter()
                .map(|o| OpTiming {
                    start_ms: o.start_ms - t0,
                    end_ms: o.end_ms - t0,
                    ..o
                })
                .collect(),
            waits,
            critical_path: path.iter().map(|o| o.index()).collect(),
            total_ms: median(&mut totals),
        })
    }

    /// Captures the step once more (tracking each op's nodes) and measures its work
    /// bound: every kernel node timed alone, weighted by the share of the GPU its grid
    /// occupies (see [`crate::WorkBound`]). The kernels run many times on the step's
    /// buffers: in-place updates are applied again and again, so call this when the
    /// values no longer matter. The normal graph is untouched.
    pub fn work_bound(
        &self,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
    ) -> Result<crate::WorkBound> {
        crate::scope::check("Step::work_bound")?;
        self.keeping_cadence(|exec| exec.work_bound_kept(issue))
    }

    fn work_bound_kept(
        &self,
        issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>,
    ) -> Result<crate::WorkBound> {
        let tracker = Tracker::new(self.plan.ops.len());
        let extras = Extras {
            tracker: Some(&tracker),
            timers: None,
        };
        // The captured graph owns the nodes measured; it lives to the end of this call.
        let io = self.io_pass(None, self.clock.launched() + 1);
        let captured = self.capture_graph(issue, extras, &io)?;
        let bound = crate::measure::work::measure(
            self.plan,
            &self.device,
            self.origin(),
            &tracker.borrow().per_op,
        );
        drop(captured);
        bound
    }

    /// After a failed op mid-capture: joins every side stream back into the origin, so
    /// that ending the capture does not fail with unjoined work and leave streams in
    /// capture mode. Errors here are recorded, the op's error is the one reported.
    fn abort_join(&self) {
        let origin = self.origin();
        for (i, s) in self.streams.iter().enumerate().skip(1) {
            // Only streams that joined the capture can be joined back.
            if matches!(capture_state(s), Ok(CaptureState::Active)) {
                let ev = &self.abort_joins[i];
                self.device.context().record_err(ev.record(s));
                self.device.context().record_err(origin.wait(ev));
            }
        }
    }

    /// Runs the ops once without capture, as they are issued: the eager baseline. Uses
    /// the same streams and events as the capture.
    pub fn run_eager(&self, issue: &mut dyn FnMut(&Issue<'_>) -> Result<()>) -> Result<()> {
        crate::scope::check("Step::run_eager")?;
        // An eager run is numbered like a replay: its copies from and to host rings use
        // the slots a replay would, and the host waits for it the same way.
        let seq = self.clock.next()?;
        self.record_fork_events()?;
        let io = self.io_pass(Some(IoKind::Eager), seq);
        let ran = self.pass(Mode::Eager, issue, Extras::default(), &io);
        crate::scope::free_deferred();
        ran?;
        self.final_joins()?;
        self.clock.launched_on(seq, self.origin())
    }

    /// Whether a rebind has invalidated the graph.
    pub fn is_stale(&self) -> bool {
        self.stale || self.graph.is_none()
    }

    /// Marks the graph stale after buffers were rebound; the next replay captures again.
    pub fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// Launches one replay of the graph on the origin stream.
    pub fn replay(&self) -> Result<()> {
        crate::scope::check("Step::replay")?;
        let Some(graph) = self.graph.as_ref().filter(|_| !self.stale) else {
            return Err(Error::NotCaptured {
                step: self.plan.step,
                stale: self.graph.is_some(),
            });
        };
        self.launch(graph, &self.patches)
    }

    /// Launches `graph` (the step's, or its loop's) on the origin stream, with its copies
    /// from and to host inputs and outputs pointed at this replay's slots.
    fn launch(
        &self,
        graph: &Graph,
        patches: &RefCell<Vec<crate::op::host_io::Patch>>,
    ) -> Result<()> {
        let mut patches = patches.borrow_mut();
        if patches.is_empty() {
            // One driver call and a count: a completion event recorded per replay would
            // cost about another microsecond of host time on every step.
            graph.launch(self.origin())?;
            self.clock.count_unrecorded();
            return Ok(());
        }
        // Host inputs and outputs: each copy points at this replay's slot, and the
        // replay's completion is recorded, so the host knows when its slots are free.
        let seq = self.clock.next()?;
        let ctx = self.device.context();
        for patch in patches.iter_mut() {
            patch.prepare(graph.exec(), ctx, seq)?;
        }
        graph.launch(self.origin())?;
        self.clock.launched_on(seq, self.origin())
    }

    /// The number of replays and eager runs launched so far, all of them (timed replays
    /// included; a profile's or work bound's runs of graphs of their own are not the
    /// step's replays). A [`ReadBack`](crate::ReadBack) names a replay by this number.
    pub fn replays_launched(&self) -> u64 {
        self.clock.launched()
    }

    /// Every `#[every(k)]` op's count of replays (and eager runs) since its work last
    /// ran, modulo its `k`: at a count of `k - 1` the next replay runs it. Waits for the
    /// last replay first.
    pub fn every_counters(&self) -> Result<Vec<EveryCounter>> {
        crate::scope::check("Step::every_counters")?;
        Ok(self
            .cadence()?
            .into_iter()
            .map(|(i, counted)| EveryCounter {
                op: self.plan.ops[i].name,
                counted,
            })
            .collect())
    }

    /// Sets every `#[every(k)]` op's count back to zero, as when the step was built: the
    /// `k`-th replay from now is the next that runs each one. Waits for the last replay
    /// first.
    pub fn reset_every_counters(&self) -> Result<()> {
        crate::scope::check("Step::reset_every_counters")?;
        self.wait()?;
        match &self.conditional {
            Some(ops) => ops.reset(&self.device),
            None => Ok(()),
        }
    }

    /// Runs `f`, a measurement, and puts the `#[every]` counts back as they were: what
    /// measures a step (a profile, a work bound, timed replays, a verification) runs the
    /// counting kernels too, and would shift the step's cadence.
    fn keeping_cadence<R>(&self, f: impl FnOnce(&Self) -> Result<R>) -> Result<R> {
        let counts = self.cadence()?;
        let out = f(self);
        self.restore_cadence(&counts)?;
        out
    }

    /// Waits until the replay that last read `input`'s next slot has finished, then lets
    /// `write` fill that slot; the next replay copies it.
    pub(crate) fn fill<T, R>(
        &self,
        input: &HostInput<T>,
        write: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R> {
        crate::scope::check("Step::fill")?;
        input.ring.check_owner(self.id, self.plan.step)?;
        let (slot, reader) = {
            let st = input.ring.state();
            let slot = st.next_fill();
            (slot, st.used_by[slot])
        };
        self.clock.wait(reader)?;
        // SAFETY: the replay that last read the slot has finished, and no later one reads
        // it: replays launched since read the other slot, and none can be launched while
        // the step is borrowed for this call. The slice does not outlive `write`.
        let out = write(unsafe { input.slot_mut(slot) });
        input.ring.state().current = slot;
        Ok(out)
    }

    /// The newest values that a finished replay copied into `out`, without waiting;
    /// `None` if no replay that wrote it has finished.
    pub(crate) fn read_back<'s, T>(
        &'s self,
        out: &'s HostOutput<T>,
    ) -> Result<Option<ReadBack<'s, T>>> {
        crate::scope::check("Step::read_back")?;
        out.ring.check_owner(self.id, self.plan.step)?;
        let used = out.ring.state().newest_first();
        for (seq, slot) in used {
            if self.clock.is_finished(seq)? {
                // SAFETY: replay `seq` has finished writing the slot, and the replays in
                // flight (at most MAX_IN_FLIGHT, all later) write other slots; no replay
                // can be launched while the read-back borrows the step.
                let values = unsafe { out.slot(slot) };
                return Ok(Some(ReadBack {
                    values,
                    replay: seq,
                }));
            }
        }
        Ok(None)
    }

    /// The values the latest replay that wrote `out` copied, waiting for it.
    pub(crate) fn read_back_latest<'s, T>(
        &'s self,
        out: &'s HostOutput<T>,
    ) -> Result<ReadBack<'s, T>> {
        crate::scope::check("Step::read_back_latest")?;
        out.ring.check_owner(self.id, self.plan.step)?;
        let newest = out.ring.state().newest_first().first().copied();
        let Some((seq, slot)) = newest else {
            return Err(Error::HostIo {
                buffer: out.name().to_string(),
                problem: format!(
                    "has not been written yet: no replay of step `{}` has run",
                    self.plan.step
                ),
            });
        };
        self.clock.wait(seq)?;
        // SAFETY: as in `read_back`: replay `seq` has finished and later ones write other
        // slots.
        let values = unsafe { out.slot(slot) };
        Ok(ReadBack {
            values,
            replay: seq,
        })
    }

    /// Waits until the last replay (or eager run) has finished. Every side stream is
    /// joined into the origin stream at the end of a step, so the origin stream's
    /// completion is the step's.
    pub fn wait(&self) -> Result<()> {
        crate::scope::check("Step::wait")?;
        self.origin()
            .synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))?;
        self.clock.all_finished();
        Ok(())
    }

    /// Waits for the last replay and returns the proof host-side values may be written.
    pub fn host_access(&self) -> Result<HostAccess<'_>> {
        self.wait()?;
        Ok(HostAccess {
            _step: std::marker::PhantomData,
        })
    }

    /// Waits for the last replay, then copies `data` into `buf` in place.
    pub fn upload<T: cudarc::driver::DeviceRepr>(
        &self,
        buf: &impl crate::DeviceMem<T>,
        data: &[T],
    ) -> Result<()> {
        crate::scope::check("Step::upload")?;
        self.wait()?;
        self.device.write_in_place(buf, data)
    }

    /// Waits for the last replay, then copies `buf` to the host.
    pub fn download<T: cudarc::driver::DeviceRepr + Clone + Default>(
        &self,
        buf: &impl crate::DeviceMem<T>,
    ) -> Result<Vec<T>> {
        crate::scope::check("Step::download")?;
        self.wait()?;
        self.device.download(buf)
    }

    /// Waits for the last replay once, then copies every buffer of `bufs` to the host, in
    /// order.
    pub fn download_many<
        T: cudarc::driver::DeviceRepr + Clone + Default,
        M: crate::DeviceMem<T>,
    >(
        &self,
        bufs: &[&M],
    ) -> Result<Vec<Vec<T>>> {
        crate::scope::check("Step::download_many")?;
        self.wait()?;
        self.device.download_many(bufs)
    }

    /// Device time of `iters` replays after `warmup` unmeasured ones, in milliseconds
    /// each, from timing events recorded around each replay on the origin stream.
    /// The `#[every]` counts are put back afterwards: timing leaves the step's cadence as
    /// it found it.
    pub fn time_replays(&self, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        crate::scope::check("Step::time_replays")?;
        self.keeping_cadence(|exec| exec.time_replays_kept(warmup, iters))
    }

    fn time_replays_kept(&self, warmup: usize, iters: usize) -> Result<Vec<f64>> {
        for _ in 0..warmup {
            self.replay()?;
        }
        self.wait()?;
        let timing = |_| event(&self.device, true);
        let starts: Vec<CudaEvent> = (0..iters).map(timing).collect::<Result<_>>()?;
        let ends: Vec<CudaEvent> = (0..iters).map(timing).collect::<Result<_>>()?;
        for i in 0..iters {
            starts[i]
                .record(self.origin())
                .map_err(Error::driver("cuEventRecord"))?;
            self.replay()?;
            ends[i]
                .record(self.origin())
                .map_err(Error::driver("cuEventRecord"))?;
        }
        self.wait()?;
        starts
            .iter()
            .zip(&ends)
            .map(|(s, e)| elapsed_ms(s, e))
            .collect()
    }
}

/// An `#[every(k)]` op's place in its cadence ([`Executor::every_counters`]).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EveryCounter {
    /// The op (`sync_target`).
    pub op: &'static str,
    /// Replays and eager runs since its work last ran, modulo its `k`.
    pub counted: u32,
}

/// The plan [`run_once`] runs: one op on one stream.
static ONE_OP: PlanDesc = PlanDesc::new("run_once")
    .with_streams(&[StreamDesc::named("main")])
    .with_ops(&[OpDesc::new("run_once", StreamId::ORIGIN)])
    .with_critical_paths(&[OpId(0)], &[OpId(0)]);

/// Runs `body` once, eagerly (not captured), on a fresh stream with its own cuBLASLt
/// workspace, and waits for it to finish: for checking kernels and matmuls against a
/// reference outside any step. Errors come wrapped as those of an op named `run_once`.
///
/// ```no_run
/// use stepgraph::Device;
///
/// let device = Device::new(0)?;
/// let mut x = device.upload_new("x", &[1.0f32; 256])?;
/// stepgraph::exec::run_once(&device, |stream| stream.memset_zeros(&mut x))?;
/// assert!(device.download(&x)?.iter().all(|&v| v == 0.0));
/// # Ok::<(), stepgraph::Error>(())
/// ```
pub fn run_once(
    device: &Device,
    body: impl FnOnce(&CaptureStream<'_>) -> Result<()>,
) -> Result<()> {
    crate::scope::check("exec::run_once")?;
    let exec = Executor::with_options(device, &ONE_OP, Options::default())?;
    let mut body = Some(body);
    exec.run_eager(&mut |issue| {
        issue.op(OpId(0), |stream| body.take().map_or(Ok(()), |b| b(stream)))
    })?;
    exec.wait()
}

/// One pass over a step's ops; generated code calls [`Issue::op`] for each op in program
/// order.
pub struct Issue<'a> {
    exec: &'a Executor,
    mode: Mode,
    extras: Extras<'a>,
    io: &'a IoPass,
}

/// What a capture records besides the ops; the caller owns both.
#[derive(Clone, Copy, Default)]
struct Extras<'a> {
    /// Each op's nodes and counts, for verification and the work bound.
    tracker: Option<&'a RefCell<Tracker>>,
    /// Timing events around each op, for a profile.
    timers: Option<&'a Timers>,
}

/// Which nodes each op added to the capture graph.
struct Tracker {
    per_op: Vec<OpNodes>,
    /// Every node attributed so far, so each op's query keeps only what is new.
    seen: HashSet<usize>,
}

impl Tracker {
    fn new(ops: usize) -> RefCell<Tracker> {
        RefCell::new(Tracker {
            per_op: vec![OpNodes::default(); ops],
            seen: HashSet::new(),
        })
    }
}

struct Timers {
    begin: CudaEvent,
    start: Vec<CudaEvent>,
    end: Vec<CudaEvent>,
}

impl fmt::Debug for Issue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issue").field("mode", &self.mode).finish()
    }
}

impl Issue<'_> {
    /// The mode of this pass.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Issues op `id`: its stream waits on the planned events, the op body runs with its
    /// capture stream, and the planned event is recorded after it. Errors name the op.
    pub fn op(&self, id: OpId, body: impl FnOnce(&CaptureStream<'_>) -> Result<()>) -> Result<()> {
        self.issue(id, None, body)
    }

    /// Issues op `id` of an `#[every(k)]`: as [`Issue::op`], with its work inside a
    /// conditional node that runs at every `k`-th replay (in an eager run, at every `k`-th
    /// run). Fails for `k = 0`, or if the plan does not mark the op `every`.
    pub fn op_every(
        &self,
        id: OpId,
        k: u32,
        body: impl FnOnce(&CaptureStream<'_>) -> Result<()>,
    ) -> Result<()> {
        self.issue(id, Some(Condition::Every(k)), body)
    }

    /// Issues op `id` of a `#[when(flag)]`: as [`Issue::op`], with its work inside a
    /// conditional node that runs only at the replays where `flag` is set when the op's
    /// turn comes (the plan orders the op after the flag's writer, as a read). An eager
    /// run reads the flag on the op's stream and waits for that read before it runs the
    /// work or skips it. Fails if the plan does not mark the op `when`.
    pub fn op_when(
        &self,
        id: OpId,
        flag: &DeviceFlag,
        body: impl FnOnce(&CaptureStream<'_>) -> Result<()>,
    ) -> Result<()> {
        self.issue(id, Some(Condition::When(flag)), body)
    }

    fn issue(
        &self,
        id: OpId,
        condition: Option<Condition<'_>>,
        body: impl FnOnce(&CaptureStream<'_>) -> Result<()>,
    ) -> Result<()> {
        let exec = self.exec;
        // The plan was checked when the executor was built; the id comes from the caller.
        let op = exec.plan.op(id)?;
        let phys = exec.physical(op.stream);
        let stream = &exec.streams[phys];
        let stream_name = exec.plan.streams[op.stream.index()].name;
        let named = |e: Error| Error::Op {
            op: op.name,
            stream: stream_name,
            source: Box::new(e),
        };
        // The conditional machinery of an `#[every]` or `#[when]` op, and its condition.
        let conditional = match (condition, op.every, op.when, exec.conditional.as_ref()) {
            (None, None, None, _) => None,
            (Some(Condition::Every(k)), Some(_), None, Some(ops)) => {
                crate::op::every::check_count(k).map_err(named)?;
                Some((Condition::Every(k), ops))
            }
            (Some(Condition::When(flag)), None, Some(_), Some(ops)) => {
                Some((Condition::When(flag), ops))
            }
            _ => {
                return Err(named(Error::Internal {
                    what: "the op is issued with a condition (#[every], #[when]) the plan does \
                           not give it, or without the one it does"
                        .into(),
                }));
            }
        };
        let ordered = self.mode.enqueues() && exec.parallel();
        if ordered {
            let extra = exec.extra.waits[id.index()]
                .iter()
                .map(|&e| &exec.extra.events[e]);
            for ev in op
                .waits
                .iter()
                .map(|ev| &exec.events[ev.index()])
                .chain(extra)
            {
                stream
                    .wait(ev)
                    .map_err(|e| named(Error::driver("cuStreamWaitEvent")(e)))?;
            }
        }
        let capturing = self.mode == Mode::Capture;
        if let (true, Some(t)) = (capturing, self.extras.timers) {
            crate::driver::event::record_external(&t.start[id.index()], stream).map_err(named)?;
        }
        // Where the op's work goes: its stream, or the body of its conditional node. An
        // eager run of a conditional op skips the work when its condition does not hold:
        // not its turn, or its flag clear (read after the waits above).
        let (work_stream, body_graph) = match (conditional, self.mode) {
            (Some((condition, ops)), Mode::Capture) => {
                let body = ops
                    .begin_body(stream, id.index(), condition)
                    .map_err(named)?;
                (&ops.body_stream, Some((body, ops)))
            }
            (Some((Condition::Every(k), ops)), Mode::Eager)
                if !ops.eager_turn(stream, id.index(), k).map_err(named)? =>
            {
                return self.finish(id, op, stream, ordered, &named);
            }
            (Some((Condition::When(flag), _)), Mode::Eager)
                if !crate::op::every::ConditionalOps::eager_flag(stream, flag)
                    .map_err(named)? =>
            {
                return self.finish(id, op, stream, ordered, &named);
            }
            _ => (stream, None),
        };
        let cs = CaptureStream {
            stream: work_stream,
            mode: self.mode,
            name: stream_name,
            blas: &exec.blas[phys],
            counts: Default::default(),
            // A conditional op's copies may not run at every replay: no host rings.
            io: (op.every.is_none() && op.when.is_none()).then_some(self.io),
            conditional: op.every.is_some() || op.when.is_some(),
        };
        // The capture guard watches the dry pass and the capture; an eager run is no
        // capture to escape.
        let watch = (self.mode != Mode::Eager && exec.options.capture_guard).then(|| {
            crate::capture::guard::Watch {
                own: work_stream.cu_stream() as usize,
                dry: self.mode == Mode::Dry,
            }
        });
        // Host-side calls from the body fail, naming the op, until it returns.
        let issuing = crate::scope::IssuingOp::enter(exec.plan.step, op.name);
        let watching = crate::capture::guard::WatchingOp::enter(watch);
        let issued = body(&cs);
        let escaped = watching.leave();
        drop(issuing);
        // The body's capture ends whatever happened, so that its stream leaves capture.
        let body_ended = body_graph
            .map(|(_, ops)| check_still_capturing(work_stream).and_then(|()| ops.end_body()));
        // An escape first: it explains whatever else failed after it.
        if let Some((escaped, more)) = escaped {
            let what = escaped.explain(|s| exec.stream_text(s));
            return Err(named(Error::Escape {
                step: exec.plan.step,
                op: op.name,
                call: escaped.call,
                what,
                more,
            }));
        }
        // A host-side call that could not return its error (a buffer dropped) fails the
        // op all the same.
        if let Some(e) = crate::scope::take_pending() {
            return Err(named(e));
        }
        issued.map_err(named)?;
        if let Some(ended) = body_ended {
            ended.map_err(named)?;
        }
        if capturing {
            check_still_capturing(stream).map_err(named)?;
            if let Some(t) = self.extras.timers {
                crate::driver::event::record_external(&t.end[id.index()], stream).map_err(named)?;
            }
            if let Some(tracker) = self.extras.tracker {
                // The op's nodes: those that appeared in the capture graph while it was issued.
                let graph =
                    crate::driver::graph::capturing_graph(stream.cu_stream()).map_err(named)?;
                let nodes = crate::driver::graph::graph_nodes(graph).map_err(named)?;
                let Tracker { per_op, seen } = &mut *tracker.borrow_mut();
                let entry = &mut per_op[id.index()];
                entry
                    .nodes
                    .extend(nodes.into_iter().filter(|&n| seen.insert(n as usize)));
                entry.counts = cs.counts.get();
                entry.body = body_graph.map(|(body, _)| body);
            }
        }
        self.finish(id, op, stream, ordered, &named)
    }

    /// Records the events that other streams wait on after op `id`.
    fn finish(
        &self,
        id: OpId,
        op: &OpDesc,
        stream: &CudaStream,
        ordered: bool,
        named: &dyn Fn(Error) -> Error,
    ) -> Result<()> {
        let exec = self.exec;
        if ordered {
            let extra = exec.extra.records[id.index()].map(|e| &exec.extra.events[e]);
            for ev in op
                .record
                .map(|ev| &exec.events[ev.index()])
                .into_iter()
                .chain(extra)
            {
                ev.record(stream)
                    .map_err(|e| named(Error::driver("cuEventRecord")(e)))?;
            }
        }
        Ok(())
    }
}

/// Orderings the plan lacks, with their events: one event per earlier op, recorded after
/// it, waited on before each later op.
struct ExtraOrderings {
    pairs: Vec<(OpId, OpId)>,
    events: Vec<CudaEvent>,
    /// Per op: the extra event recorded after it.
    records: Vec<Option<usize>>,
    /// Per op: the extra events its stream waits on before it.
    waits: Vec<Vec<usize>>,
}

impl ExtraOrderings {
    fn none(ops: usize) -> ExtraOrderings {
        ExtraOrderings {
            pairs: Vec::new(),
            events: Vec::new(),
            records: vec![None; ops],
            waits: vec![Vec::new(); ops],
        }
    }

    fn new(device: &Device, ops: usize, pairs: &[(OpId, OpId)]) -> Result<ExtraOrderings> {
        let mut extra = ExtraOrderings::none(ops);
        for &(a, b) in pairs {
            let ev = match extra.records[a.index()] {
                Some(ev) => ev,
                None => {
                    extra.events.push(event(device, false)?);
                    extra.records[a.index()] = Some(extra.events.len() - 1);
                    extra.events.len() - 1
                }
            };
            extra.waits[b.index()].push(ev);
        }
        extra.pairs = pairs.to_vec();
        Ok(extra)
    }
}

/// Fails unless `stream` is still capturing after an op: work the driver refuses inside
/// a capture (a synchronisation, work on the legacy default stream, a wait on an event
/// recorded outside it) invalidates the capture, and an op whose own calls do not report
/// it (cudarc code that ignored an error, a call on another stream) is found here.
fn check_still_capturing(stream: &CudaStream) -> Result<()> {
    match capture_state(stream)? {
        CaptureState::Active => Ok(()),
        status => Err(Error::CaptureBroken {
            state: match status {
                CaptureState::Invalidated => "invalidated",
                _ => "ended",
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_replays_are_capped_and_at_least_one() {
        assert_eq!(profile_replays(0).unwrap(), 1);
        assert_eq!(profile_replays(100_000).unwrap(), 100_000);
        let e = profile_replays(100_001).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooLarge {
                    found: 100_001,
                    max: 100_000,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "replays of a profile: expected at most 100000, found 100001 (it keeps two times \
             per op per replay, and more say nothing more)"
        );
    }
}
