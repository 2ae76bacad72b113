//! The compile-time plan of a step, as the `#[step]` macro emits it: a `const`
//! [`PlanDesc`] that names every op, stream, buffer access, dependency edge and event,
//! and the critical path. The executor issues ops by reading it; tests and tools print it.

use std::fmt;

use crate::dag;

/// A plan that fails [`PlanDesc::check`], or an id outside it: the message names every
/// index out of range and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError(String);

impl PlanError {
    /// The message, one line per problem.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlanError {}

/// Index of a stream in [`PlanDesc::streams`]; stream 0 is the origin stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u16);

/// Index of an op in [`PlanDesc::ops`] (program order, replicas expanded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u32);

/// Index of a buffer in [`PlanDesc::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BufId(pub u16);

/// Index of an event in [`PlanDesc::events`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(pub u16);

impl StreamId {
    /// The origin stream: capture begins and ends on it.
    pub const ORIGIN: StreamId = StreamId(0);
    /// Position as an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}
impl OpId {
    /// Position as an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}
impl BufId {
    /// Position as an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}
impl EventId {
    /// Position as an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// How a buffer is shared between streams.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufKind {
    /// One copy, shared by every op.
    Shared,
    /// An array with one element per branch index of the replicated ops.
    PerBranch,
    /// Scratch with one copy per stream that uses it.
    ScratchPerStream,
    /// Scratch with one copy per branch index.
    ScratchPerBranch,
}

/// Read (`&T`) or write (`&mut T`) access of an op to a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `&T` in the op's signature.
    Read,
    /// `&mut T` in the op's signature.
    Write,
}

/// Why one op must run after another.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdgeKind {
    /// Read after write of the buffer.
    ReadAfterWrite,
    /// Write after read of the buffer.
    WriteAfterRead,
    /// Write after write of the buffer.
    WriteAfterWrite,
    /// An explicit `#[join(..)]`.
    Join,
    /// An explicit `#[after(..)]`.
    After,
}

/// A stream of the step.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamDesc {
    /// `main`, `aux_iqn`, `branch[2]`.
    pub name: &'static str,
    /// Its priority, `streams(.., aux_attn(low))`, or the planner's choice.
    pub priority: StreamPriority,
    /// The planner added it (`streams(.., auto)`): no declaration names it.
    pub automatic: bool,
}

impl StreamDesc {
    /// A stream of normal priority.
    pub const fn named(name: &'static str) -> StreamDesc {
        StreamDesc {
            name,
            priority: StreamPriority::Normal,
            automatic: false,
        }
    }

    /// The same stream at `priority`.
    pub const fn with_priority(self, priority: StreamPriority) -> StreamDesc {
        StreamDesc { priority, ..self }
    }

    /// The same stream, added by the planner.
    pub const fn automatic(self) -> StreamDesc {
        StreamDesc {
            automatic: true,
            ..self
        }
    }
}

/// Where streams compete for the GPU, the pending blocks of higher-priority kernels are
/// dispatched first. The graph keeps each kernel's priority from the stream it was
/// captured on. A head with slack marked `low` fills what the critical chain leaves idle
/// instead of slowing it down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StreamPriority {
    /// Below every other stream of the step.
    Low,
    /// The default.
    Normal,
    /// Above every other stream of the step.
    High,
}

/// A buffer (a field of the step's buffers struct).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferDesc {
    /// The field name.
    pub name: &'static str,
    /// How it is shared.
    pub kind: BufKind,
    /// For a `#[view(of = parent)]` field: the parent, a shared buffer. A view conflicts
    /// with every access to its parent; two views of one parent conflict only where
    /// their elements overlap, which is known once the step's buffers are
    /// ([`overlap_orderings`](crate::views::overlap_orderings)).
    pub view_of: Option<BufId>,
    /// A `#[shared]` field: a `Shared<T>` that other steps use too. Launches of the steps
    /// that share it are ordered on the device by what each reads and writes; a picture of
    /// several steps ([`PlanDesc::step`]s launched in turn) links them through it.
    pub across_steps: bool,
}

/// One access of an op to a buffer; `copy` says which copy of a per-branch or scratch
/// buffer (0 for shared buffers).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessDesc {
    /// The buffer.
    pub buf: BufId,
    /// Which copy of it.
    pub copy: u16,
    /// Read or write.
    pub access: Access,
}

/// An op instance (a replicated op appears once per index).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpDesc {
    /// `trunk_fwd`, `branch_fwd[2]`.
    pub name: &'static str,
    /// The function name shared by all replicas (`branch_fwd`).
    pub func: &'static str,
    /// The stream it is issued on.
    pub stream: StreamId,
    /// Its buffer accesses, from its signature.
    pub accesses: &'static [AccessDesc],
    /// Events its stream waits on before it is issued.
    pub waits: &'static [EventId],
    /// The event recorded on its stream right after it, if another stream waits on it.
    pub record: Option<EventId>,
    /// The cost hint from `#[cost(..)]`, 1.0 without one.
    pub cost: f64,
    /// `#[every(k)]`: the op runs at every k-th replay only (a conditional node of the
    /// graph); `k` as written, a config field or a count.
    pub every: Option<&'static str>,
    /// `#[when(flag)]`: the op runs only at the replays where the device flag `flag` (a
    /// buffer of the step, which the op's accesses read) is set (a conditional node of
    /// the graph).
    pub when: Option<BufId>,
    /// The planner chose its stream (`streams(.., auto)`), from `cost`.
    pub automatic: bool,
}

impl BufferDesc {
    /// Buffer `name`, shared as `kind` says.
    pub const fn new(name: &'static str, kind: BufKind) -> BufferDesc {
        BufferDesc {
            name,
            kind,
            view_of: None,
            across_steps: false,
        }
    }

    /// The same buffer, shared with other steps (`#[shared]`).
    pub const fn with_across_steps(self) -> BufferDesc {
        BufferDesc {
            across_steps: true,
            ..self
        }
    }

    /// The same buffer as a view of `parent`.
    pub const fn with_view_of(self, parent: BufId) -> BufferDesc {
        BufferDesc {
            view_of: Some(parent),
            ..self
        }
    }
}

impl AccessDesc {
    /// A read (`&T`) of copy `copy` of `buf`.
    pub const fn read(buf: BufId, copy: u16) -> AccessDesc {
        AccessDesc {
            buf,
            copy,
            access: Access::Read,
        }
    }

    /// A write (`&mut T`) of copy `copy` of `buf`.
    pub const fn write(buf: BufId, copy: u16) -> AccessDesc {
        AccessDesc {
            buf,
            copy,
            access: Access::Write,
        }
    }
}

impl OpDesc {
    /// Op `name` on `stream`, its own function, with no accesses, waits or record, and a
    /// cost of 1.
    pub const fn new(name: &'static str, stream: StreamId) -> OpDesc {
        OpDesc {
            name,
            func: name,
            stream,
            accesses: &[],
            waits: &[],
            record: None,
            cost: 1.0,
            every: None,
            when: None,
            automatic: false,
        }
    }

    /// The function shared by the replicas of a replicated op.
    pub const fn with_func(self, func: &'static str) -> OpDesc {
        OpDesc { func, ..self }
    }

    /// Its buffer accesses.
    pub const fn with_accesses(self, accesses: &'static [AccessDesc]) -> OpDesc {
        OpDesc { accesses, ..self }
    }

    /// The events its stream waits on before it.
    pub const fn with_waits(self, waits: &'static [EventId]) -> OpDesc {
        OpDesc { waits, ..self }
    }

    /// The event recorded on its stream after it.
    pub const fn with_record(self, record: EventId) -> OpDesc {
        OpDesc {
            record: Some(record),
            ..self
        }
    }

    /// Its cost hint.
    pub const fn with_cost(self, cost: f64) -> OpDesc {
        OpDesc { cost, ..self }
    }

    /// The same op, placed by the planner.
    pub const fn placed_automatically(self) -> OpDesc {
        OpDesc {
            automatic: true,
            ..self
        }
    }

    /// The same op, run at every `k`-th replay only (`k` as the step wrote it).
    pub const fn with_every(self, k: &'static str) -> OpDesc {
        OpDesc {
            every: Some(k),
            ..self
        }
    }

    /// The same op, run only at the replays where the device flag `flag` is set. The op
    /// must read `flag` among its accesses, so that it is ordered after the op that set
    /// it.
    pub const fn with_when(self, flag: BufId) -> OpDesc {
        OpDesc {
            when: Some(flag),
            ..self
        }
    }
}

/// An event: recorded on `stream` after op `after`, or at capture begin when `after`
/// is `None` (the fork point every side stream first waits on).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventDesc {
    /// The stream it is recorded on.
    pub stream: StreamId,
    /// The op it follows; `None` for the capture-begin fork event on the origin stream.
    pub after: Option<OpId>,
}

impl EventDesc {
    /// The capture-begin fork event, recorded on the origin stream.
    pub const fn at_capture_begin() -> EventDesc {
        EventDesc {
            stream: StreamId::ORIGIN,
            after: None,
        }
    }

    /// An event recorded on `stream` right after op `op`.
    pub const fn after(stream: StreamId, op: OpId) -> EventDesc {
        EventDesc {
            stream,
            after: Some(op),
        }
    }
}

/// A schedule's chains-and-work bound ([`PlanDesc::chain_work_bound`]): its value and the
/// ops whose chains bound it.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChainBound {
    /// The bound, in the units of the costs it was given.
    pub total: f64,
    /// The op that ends the head chain; `None`: the bound's work runs from the start.
    pub head: Option<OpId>,
    /// The op that starts the tail chain; `None`: the bound's work runs to the end.
    pub tail: Option<OpId>,
}

/// A dependency the planner inferred (or an explicit ordering).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeDesc {
    /// The earlier op.
    pub from: OpId,
    /// The later op.
    pub to: OpId,
    /// Why.
    pub kind: EdgeKind,
    /// The buffer involved, for data edges.
    pub buf: Option<BufId>,
}

impl EdgeDesc {
    /// `to` runs after `from`, for `kind`, through `buf` for a data edge.
    pub const fn new(from: OpId, to: OpId, kind: EdgeKind, buf: Option<BufId>) -> EdgeDesc {
        EdgeDesc {
            from,
            to,
            kind,
            buf,
        }
    }
}

/// The whole plan of a step.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanDesc {
    /// The step's name (its module).
    pub step: &'static str,
    /// Streams; index 0 is the origin.
    pub streams: &'static [StreamDesc],
    /// Buffers.
    pub buffers: &'static [BufferDesc],
    /// Ops in program order.
    pub ops: &'static [OpDesc],
    /// Dependency edges, including those between ops of one stream.
    pub edges: &'static [EdgeDesc],
    /// Events; each is recorded once per capture.
    pub events: &'static [EventDesc],
    /// Events the origin stream waits on after the last op, joining every side stream.
    pub final_waits: &'static [EventId],
    /// The longest path through the schedule by op count.
    pub critical_path: &'static [OpId],
    /// The longest path through the schedule weighted by cost hints.
    pub critical_path_by_cost: &'static [OpId],
    /// Where the planner placed ops: how, and from which costs.
    pub placement: Option<&'static str>,
}

impl PlanDesc {
    /// The plan of step `step` with no streams, buffers, ops, edges or events yet: add
    /// them with the `with_` methods, in a `const`.
    ///
    /// ```
    /// use stepgraph_plan::{OpDesc, PlanDesc, StreamDesc, StreamId};
    ///
    /// const PLAN: PlanDesc = PlanDesc::new("one")
    ///     .with_streams(&[StreamDesc::named("main")])
    ///     .with_ops(&[OpDesc::new("a", StreamId::ORIGIN)]);
    /// assert!(PLAN.check().is_ok());
    /// ```
    pub const fn new(step: &'static str) -> PlanDesc {
        PlanDesc {
            step,
            streams: &[],
            buffers: &[],
            ops: &[],
            edges: &[],
            events: &[],
            final_waits: &[],
            critical_path: &[],
            critical_path_by_cost: &[],
            placement: None,
        }
    }

    /// Its streams, origin first.
    pub const fn with_streams(self, streams: &'static [StreamDesc]) -> PlanDesc {
        PlanDesc { streams, ..self }
    }

    /// Its buffers.
    pub const fn with_buffers(self, buffers: &'static [BufferDesc]) -> PlanDesc {
        PlanDesc { buffers, ..self }
    }

    /// Its ops, in program order.
    pub const fn with_ops(self, ops: &'static [OpDesc]) -> PlanDesc {
        PlanDesc { ops, ..self }
    }

    /// Its dependency edges.
    pub const fn with_edges(self, edges: &'static [EdgeDesc]) -> PlanDesc {
        PlanDesc { edges, ..self }
    }

    /// Its events.
    pub const fn with_events(self, events: &'static [EventDesc]) -> PlanDesc {
        PlanDesc { events, ..self }
    }

    /// The events the origin stream waits on after the last op.
    pub const fn with_final_waits(self, final_waits: &'static [EventId]) -> PlanDesc {
        PlanDesc {
            final_waits,
            ..self
        }
    }

    /// What the planner said of the ops it placed.
    pub const fn with_placement(self, placement: &'static str) -> PlanDesc {
        PlanDesc {
            placement: Some(placement),
            ..self
        }
    }

    /// Its critical paths, by op count and by cost.
    pub const fn with_critical_paths(
        self,
        critical_path: &'static [OpId],
        critical_path_by_cost: &'static [OpId],
    ) -> PlanDesc {
        PlanDesc {
            critical_path,
            critical_path_by_cost,
            ..self
        }
    }
}

/// What [`PlanDesc::audit`] checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Audit {
    /// Pairs of ops whose accesses conflict, each found ordered by the schedule.
    pub conflicts_ordered: usize,
    /// Pairs of ops on different streams that nothing requires to be ordered, each found
    /// unordered.
    pub independent_pairs: usize,
}

/// Two ops that run in turn only because both take `&mut` of one buffer: neither reads
/// (`&`) what the other writes, no `#[join]` or `#[after]` orders them, and no chain of
/// such dependencies does. The `#[step]` macro refuses such a pair on two streams (a
/// compile error that names the buffer); on one stream it is legal, and often a scratch
/// buffer shared by ops that could run side by side on streams of their own, given one
/// buffer each.
/// [`PlanDesc::shared_writes`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedWrite {
    /// The earlier op, in program order.
    pub first: OpId,
    /// The later op.
    pub second: OpId,
    /// A buffer both write (the first such in the later op's accesses).
    pub buf: BufId,
}

/// How many problems [`PlanDesc::check`] lists before it says how many more there are.
const PROBLEMS_LISTED: usize = 20;

impl PlanDesc {
    /// Checks that every stream, buffer, event and op index the plan refers to (in its
    /// ops, their accesses, waits and records, the edges, the events, the final joins and
    /// both critical paths) is in range, and that there is at least the origin stream.
    ///
    /// The `#[step]` macro only emits plans that pass; the fields are public, so a
    /// hand-built plan may not. The runtime's executor calls this when it is built, so
    /// that issuing a plan never indexes past its own tables. Every problem is listed,
    /// up to twenty.
    ///
    /// ```
    /// use stepgraph_plan::{OpDesc, PlanDesc, StreamDesc, StreamId};
    ///
    /// const PLAN: PlanDesc = PlanDesc::new("one")
    ///     .with_streams(&[StreamDesc::named("main")])
    ///     .with_ops(&[OpDesc::new("a", StreamId(1))]);
    /// let e = PLAN.check().unwrap_err().to_string();
    /// assert_eq!(e, "plan `one`: op 0 `a` is on stream 1; expected a stream index below 1");
    /// ```
    pub fn check(&self) -> Result<(), PlanError> {
        let mut problems: Vec<String> = Vec::new();
        // Capture begins and ends on stream 0: a plan without it has nowhere to run.
        if self.streams.is_empty() {
            problems.push("no streams; expected at least one (the origin stream)".into());
        }
        for (i, op) in self.ops.iter().enumerate() {
            self.check_op_indices(i, op, &mut problems);
            self.check_op_condition(i, op, &mut problems);
        }
        self.check_views(&mut problems);
        self.check_edges(&mut problems);
        self.check_events(&mut problems);
        self.check_paths(&mut problems);
        self.report(problems)
    }

    /// Op `i`'s stream, buffers and events are in the plan.
    fn check_op_indices(&self, i: usize, op: &OpDesc, problems: &mut Vec<String>) {
        let (streams, buffers, events) =
            (self.streams.len(), self.buffers.len(), self.events.len());
        let name = op.name;
        if op.stream.index() >= streams {
            problems.push(format!(
                "op {i} `{name}` is on stream {}; expected a stream index below {streams}",
                op.stream.0
            ));
        }
        for a in op.accesses {
            if a.buf.index() >= buffers {
                problems.push(format!(
                    "op {i} `{name}` accesses buffer {}; expected a buffer index below {buffers}",
                    a.buf.0
                ));
            }
        }
        for e in op.waits {
            if e.index() >= events {
                problems.push(format!(
                    "op {i} `{name}` waits on event {}; expected an event index below {events}",
                    e.0
                ));
            }
        }
        if let Some(e) = op.record.filter(|e| e.index() >= events) {
            problems.push(format!(
                "op {i} `{name}` records event {}; expected an event index below {events}",
                e.0
            ));
        }
    }

    /// Op `i`'s `#[when]` flag is a buffer it reads, and it has one condition.
    fn check_op_condition(&self, i: usize, op: &OpDesc, problems: &mut Vec<String>) {
        let name = op.name;
        let buffers = self.buffers.len();
        if let Some(flag) = op.when {
            // The conditional node reads the flag when it runs: unless the op's
            // accesses say so, nothing orders it after the op that set the flag.
            if flag.index() >= buffers {
                problems.push(format!(
                    "op {i} `{name}` runs when buffer {} is set; expected a buffer index below {buffers}",
                    flag.0
                ));
            } else if !op
                .accesses
                .iter()
                .any(|a| a.buf == flag && a.access == Access::Read)
            {
                problems.push(format!(
                    "op {i} `{name}` runs when `{}` is set but does not read it; expected a read of the flag among its accesses",
                    self.buffers[flag.index()].name
                ));
            }
            // One conditional node per op: two conditions would need two.
            if op.every.is_some() {
                problems.push(format!(
                    "op {i} `{name}` has both #[every] and #[when]; expected one condition"
                ));
            }
        }
    }

    /// Each view lies in a whole buffer of the plan.
    fn check_views(&self, problems: &mut Vec<String>) {
        let buffers = self.buffers.len();
        for (k, buf) in self.buffers.iter().enumerate() {
            let Some(parent) = buf.view_of else { continue };
            match self.buffers.get(parent.index()) {
                None => problems.push(format!(
                    "buffer {k} `{}` is a view of buffer {}; expected a buffer index below {buffers}",
                    buf.name, parent.0
                )),
                Some(p) if p.view_of.is_some() || parent.index() == k => problems.push(format!(
                    "buffer {k} `{}` is a view of `{}`, itself a view; expected a view of a whole buffer",
                    buf.name, p.name
                )),
                Some(_) => {}
            }
        }
    }

    /// Each edge joins ops of the plan, through a buffer of the plan.
    fn check_edges(&self, problems: &mut Vec<String>) {
        let (buffers, ops) = (self.buffers.len(), self.ops.len());
        for (k, edge) in self.edges.iter().enumerate() {
            for (end, op) in [("from", edge.from), ("to", edge.to)] {
                if op.index() >= ops {
                    problems.push(format!(
                        "edge {k} runs {end} op {}; expected an op index below {ops}",
                        op.0
                    ));
                }
            }
            if let Some(b) = edge.buf.filter(|b| b.index() >= buffers) {
                problems.push(format!(
                    "edge {k} names buffer {}; expected a buffer index below {buffers}",
                    b.0
                ));
            }
        }
    }

    /// Each event is recorded on a stream of the plan after an op of it, and the final
    /// joins wait on events of it.
    fn check_events(&self, problems: &mut Vec<String>) {
        let (streams, ops, events) = (self.streams.len(), self.ops.len(), self.events.len());
        for (k, ev) in self.events.iter().enumerate() {
            if ev.stream.index() >= streams {
                problems.push(format!(
                    "event {k} is recorded on stream {}; expected a stream index below {streams}",
                    ev.stream.0
                ));
            }
            if let Some(op) = ev.after.filter(|op| op.index() >= ops) {
                problems.push(format!(
                    "event {k} follows op {}; expected an op index below {ops}",
                    op.0
                ));
            }
        }
        for e in self.final_waits {
            if e.index() >= events {
                problems.push(format!(
                    "the final joins wait on event {}; expected an event index below {events}",
                    e.0
                ));
            }
        }
    }

    /// The critical paths name ops of the plan.
    fn check_paths(&self, problems: &mut Vec<String>) {
        let ops = self.ops.len();
        for (what, path) in [
            ("critical path", self.critical_path),
            ("critical path by cost", self.critical_path_by_cost),
        ] {
            for op in path {
                if op.index() >= ops {
                    problems.push(format!(
                        "the {what} names op {}; expected an op index below {ops}",
                        op.0
                    ));
                }
            }
        }
    }

    /// The problems found, the first `PROBLEMS_LISTED` of them listed.
    fn report(&self, mut problems: Vec<String>) -> Result<(), PlanError> {
        if problems.is_empty() {
            return Ok(());
        }
        let more = problems.len().saturating_sub(PROBLEMS_LISTED);
        problems.truncate(PROBLEMS_LISTED);
        let mut msg = problems
            .iter()
            .map(|p| format!("plan `{}`: {p}", self.step))
            .collect::<Vec<_>>()
            .join("\n");
        if more > 0 {
            msg.push_str(&format!("\n(and {more} more problems)"));
        }
        Err(PlanError(msg))
    }

    /// The name of buffer `id`, `?` for an index outside the plan.
    pub fn buffer_name(&self, id: BufId) -> &'static str {
        self.buffers.get(id.index()).map_or("?", |b| b.name)
    }

    /// Op `id`, or an error saying how many ops there are.
    pub fn op(&self, id: OpId) -> Result<&OpDesc, PlanError> {
        self.ops.get(id.index()).ok_or_else(|| {
            PlanError(format!(
                "plan `{}`: expected an op id below {}, found {}",
                self.step,
                self.ops.len(),
                id.0
            ))
        })
    }

    /// Checks the schedule against the accesses it was planned from, without a GPU: every
    /// two ops whose accesses conflict ([`same_memory`](Self::same_memory), a write among
    /// them) are
    /// ordered by the schedule (stream order and waits), every dependency edge is, and
    /// the schedule orders nothing that the edges and stream order do not (no false
    /// serialisation). Returns how many conflicting pairs and independent cross-stream
    /// pairs it checked; an error names the first two ops at fault.
    ///
    /// ```
    /// use stepgraph_plan::{AccessDesc, BufId, BufKind, BufferDesc, OpDesc, PlanDesc, StreamDesc, StreamId};
    ///
    /// // Two ops on two streams write one buffer, and nothing orders them: a race.
    /// const RACY: PlanDesc = PlanDesc::new("racy")
    ///     .with_streams(&[StreamDesc::named("main"), StreamDesc::named("side")])
    ///     .with_buffers(&[BufferDesc::new("x", BufKind::Shared)])
    ///     .with_ops(&[
    ///         OpDesc::new("a", StreamId(0)).with_accesses(&[AccessDesc::write(BufId(0), 0)]),
    ///         OpDesc::new("b", StreamId(1)).with_accesses(&[AccessDesc::write(BufId(0), 0)]),
    ///     ]);
    /// let e = RACY.audit().unwrap_err().to_string();
    /// assert!(e.contains("`a` and `b` both access `x`"), "{e}");
    /// ```
    pub fn audit(&self) -> Result<Audit, PlanError> {
        self.check()?;
        let n = self.ops.len();
        let ordered = dag::closure(n, &self.schedule_edges_ix());
        let before = |a: usize, b: usize| ordered[b].contains(a);
        let name = |i: usize| self.ops[i].name;
        let mut audit = Audit::default();
        for b in 0..n {
            for a in 0..b {
                let conflict = self.ops[a].accesses.iter().find(|x| {
                    self.ops[b].accesses.iter().any(|y| {
                        self.same_memory(x, y)
                            && (x.access == Access::Write || y.access == Access::Write)
                    })
                });
                if let Some(x) = conflict {
                    if !before(a, b) {
                        let buf = self.buffers[x.buf.index()].name;
                        return Err(PlanError(format!(
                            "plan `{}`: ops `{}` and `{}` both access `{buf}` (a write among them), but the schedule does not order them",
                            self.step,
                            name(a),
                            name(b)
                        )));
                    }
                    audit.conflicts_ordered += 1;
                }
            }
        }
        let mut required: Vec<(usize, usize)> = self
            .edges
            .iter()
            .map(|e| (e.from.index(), e.to.index()))
            .collect();
        for e in self.edges {
            let (a, b) = (e.from.index(), e.to.index());
            if a >= b || !before(a, b) {
                return Err(PlanError(format!(
                    "plan `{}`: op `{}` depends on `{}` ({:?}), but the schedule does not order them",
                    self.step,
                    name(b),
                    name(a),
                    e.kind
                )));
            }
        }
        // What may be ordered: the dependencies and each stream's order.
        let stream_order = dag::schedule_edges(
            self.ops
                .iter()
                .map(|op| (Some(op.stream.index()), std::iter::empty())),
        );
        required.extend(stream_order);
        let allowed = dag::closure(n, &required);
        for (b, may_precede) in allowed.iter().enumerate() {
            for a in 0..b {
                if before(a, b) && !may_precede.contains(a) {
                    return Err(PlanError(format!(
                        "plan `{}`: the schedule orders `{}` before `{}`, which no dependency and no stream order requires",
                        self.step,
                        name(a),
                        name(b)
                    )));
                }
                if !may_precede.contains(a) && self.ops[a].stream != self.ops[b].stream {
                    audit.independent_pairs += 1;
                }
            }
        }
        Ok(audit)
    }

    /// The pairs of ops that are ordered only because both take `&mut` of one buffer
    /// ([`SharedWrite`]), in program order of the later op, then of the earlier. A read of
    /// what the earlier op wrote, a write of what it read (a state updated after its use),
    /// `#[join]` and `#[after]` are real orderings: a pair that one of them, or a chain of
    /// them, orders is not listed; nor is one that a chain through a third op orders
    /// (a listed pair among its links, so that splitting that pair's buffer may show it). A pair is
    /// a hint, not an error: `&mut` may read, and an op that adds to what the earlier one
    /// wrote (an accumulated loss), or a communicator whose collectives must keep their
    /// order, is rightly ordered. Ids out of range (a plan that fails
    /// [`check`](Self::check)) are skipped.
    ///
    /// ```
    /// use stepgraph_plan::{AccessDesc, BufId, BufKind, BufferDesc, OpDesc, OpId, PlanDesc, StreamDesc, StreamId};
    ///
    /// // Two gradients that each use `sums` as scratch, and an update that reads both.
    /// static PLAN: PlanDesc = PlanDesc::new("grads")
    ///     .with_streams(&[StreamDesc::named("main"), StreamDesc::named("side")])
    ///     .with_buffers(&[
    ///         BufferDesc::new("sums", BufKind::Shared),
    ///         BufferDesc::new("g1", BufKind::Shared),
    ///         BufferDesc::new("g2", BufKind::Shared),
    ///     ])
    ///     .with_ops(&[
    ///         OpDesc::new("grad1", StreamId(0))
    ///             .with_accesses(&[AccessDesc::write(BufId(1), 0), AccessDesc::write(BufId(0), 0)]),
    ///         OpDesc::new("grad2", StreamId(1))
    ///             .with_accesses(&[AccessDesc::write(BufId(2), 0), AccessDesc::write(BufId(0), 0)]),
    ///         OpDesc::new("update", StreamId(0))
    ///             .with_accesses(&[AccessDesc::read(BufId(1), 0), AccessDesc::read(BufId(2), 0)]),
    ///     ]);
    /// let shared = PLAN.shared_writes();
    /// assert_eq!(shared.len(), 1);
    /// assert_eq!((shared[0].first, shared[0].second, shared[0].buf), (OpId(0), OpId(1), BufId(0)));
    /// ```
    pub fn shared_writes(&self) -> Vec<SharedWrite> {
        let n = self.ops.len();
        let in_range = |a: &AccessDesc| a.buf.index() < self.buffers.len();
        // Whether an access of `a` of kind `first` and one of `b` of kind `then` reach the
        // same memory.
        let meet = |a: usize, first: Access, b: usize, then: Access| {
            self.ops[a]
                .accesses
                .iter()
                .filter(|x| in_range(x))
                .any(|x| {
                    x.access == first
                        && self.ops[b]
                            .accesses
                            .iter()
                            .any(|y| in_range(y) && y.access == then && self.same_memory(x, y))
                })
        };
        // True dependencies: b reads what a wrote, b writes what a read (a state updated
        // after its use), and the explicit orderings.
        let mut true_edges: Vec<(usize, usize)> = self
            .edges
            .iter()
            .filter(|e| matches!(e.kind, EdgeKind::Join | EdgeKind::After))
            .map(|e| (e.from.index(), e.to.index()))
            .filter(|&(a, b)| a < b && b < n)
            .collect();
        for b in 0..n {
            for a in 0..b {
                if meet(a, Access::Write, b, Access::Read)
                    || meet(a, Access::Read, b, Access::Write)
                {
                    true_edges.push((a, b));
                }
            }
        }
        let ordered = dag::closure(n, &true_edges);
        let mut found = Vec::new();
        for (b, before_b) in ordered.iter().enumerate() {
            for a in 0..b {
                if before_b.contains(a) {
                    continue;
                }
                let shared = self.ops[b].accesses.iter().find(|y| {
                    in_range(y)
                        && y.access == Access::Write
                        && self.ops[a].accesses.iter().any(|x| {
                            in_range(x) && x.access == Access::Write && self.same_memory(x, y)
                        })
                });
                if let Some(y) = shared {
                    found.push((a, b, y.buf));
                }
            }
        }
        // Leave out a pair that a chain through a third op orders anyway (a -> c -> b, by
        // true dependencies and listed pairs): naming a -> c and c -> b says it.
        let mut all = true_edges;
        all.extend(found.iter().map(|&(a, b, _)| (a, b)));
        let chained = dag::closure(n, &all);
        found
            .into_iter()
            .filter(|&(a, b, _)| {
                !((a + 1)..b).any(|c| chained[c].contains(a) && chained[b].contains(c))
            })
            .map(|(a, b, buf)| SharedWrite {
                first: OpId(a as u32),
                second: OpId(b as u32),
                buf,
            })
            .collect()
    }

    /// Whether two accesses reach the same memory whatever the buffers hold: one copy of
    /// one buffer, or a view and its parent. (Two views of one parent may overlap too;
    /// that is decided once their spans are known.)
    pub fn same_memory(&self, x: &AccessDesc, y: &AccessDesc) -> bool {
        let view_of = |b: BufId| self.buffers.get(b.index()).and_then(|d| d.view_of);
        (x.buf == y.buf && x.copy == y.copy)
            || view_of(x.buf) == Some(y.buf)
            || view_of(y.buf) == Some(x.buf)
    }

    /// Number of cross-stream waits, the final joins included.
    pub fn wait_count(&self) -> usize {
        self.ops.iter().map(|o| o.waits.len()).sum::<usize>() + self.final_waits.len()
    }

    /// Every happens-before edge of the schedule: stream order between consecutive ops
    /// of a stream, and each wait (from the op the event follows to the waiting op).
    /// Waits on the capture-begin event order nothing and are left out.
    pub fn schedule_edges(&self) -> Vec<(OpId, OpId)> {
        // A stream or event index out of range (a hand-built plan that would fail
        // `check`) orders nothing, so that pictures of such a plan still draw.
        let ops = self.ops.iter().map(|op| {
            let stream = (op.stream.index() < self.streams.len()).then_some(op.stream.index());
            let waited = op.waits.iter().filter_map(|ev| {
                let after = self.events.get(ev.index()).and_then(|e| e.after)?;
                (after.index() < self.ops.len()).then_some(after.index())
            });
            (stream, waited)
        });
        dag::schedule_edges(ops)
            .into_iter()
            .map(|(a, b)| (OpId(a as u32), OpId(b as u32)))
            .collect()
    }

    /// Whether the schedule orders op `a` before op `b` (by stream order and waits,
    /// transitively): what a step's own tests ask of its plan ("the actor's update comes
    /// after both critics'"). False for `a == b` and for ids outside the plan.
    ///
    /// ```
    /// use stepgraph_plan::{AccessDesc, BufId, BufKind, BufferDesc, OpDesc, OpId, PlanDesc, StreamDesc, StreamId};
    ///
    /// static PLAN: PlanDesc = PlanDesc::new("two")
    ///     .with_streams(&[StreamDesc::named("main")])
    ///     .with_buffers(&[BufferDesc::new("x", BufKind::Shared)])
    ///     .with_ops(&[
    ///         OpDesc::new("fill", StreamId(0)).with_accesses(&[AccessDesc::write(BufId(0), 0)]),
    ///         OpDesc::new("use", StreamId(0)).with_accesses(&[AccessDesc::read(BufId(0), 0)]),
    ///     ]);
    /// assert!(PLAN.orders(OpId(0), OpId(1)));
    /// assert!(!PLAN.orders(OpId(1), OpId(0)));
    /// ```
    pub fn orders(&self, a: OpId, b: OpId) -> bool {
        let n = self.ops.len();
        if a.index() >= n || b.index() >= n || a == b {
            return false;
        }
        dag::closure(n, &self.schedule_edges_ix())[b.index()].contains(a.index())
    }

    fn schedule_edges_ix(&self) -> Vec<(usize, usize)> {
        self.schedule_edges()
            .into_iter()
            .map(|(a, b)| (a.index(), b.index()))
            .collect()
    }

    /// The longest path through the schedule with the given per-op costs (for example
    /// times measured in isolation): its ops and its total. `costs` has one entry per op;
    /// ties go to the earliest op ([`dag::longest_path`]).
    pub fn longest_path(&self, costs: &[f64]) -> (Vec<OpId>, f64) {
        let n = self.ops.len().min(costs.len());
        let (path, total) = dag::longest_path(n, &self.schedule_edges_ix(), |i| costs[i]);
        (path.into_iter().map(|o| OpId(o as u32)).collect(), total)
    }

    /// The chains-and-work bound of the schedule ([`dag::chain_work_bound`]) with each op's
    /// time alone and its work (the share of that time no other op can use), one entry
    /// per op each: the longest chain to an op `head`, the work of every op between
    /// `head` and an op `tail`, and the longest chain from `tail` to the end. Never below
    /// [`longest_path`](Self::longest_path) with the same times or the summed work; above
    /// both where the schedule begins and ends with chains and its middle fills the GPU.
    /// Ops past either slice's length count 0.
    ///
    /// ```
    /// use stepgraph_plan::{
    ///     AccessDesc, BufId, BufKind, BufferDesc, EventDesc, EventId, OpDesc, OpId, PlanDesc,
    ///     StreamDesc, StreamId,
    /// };
    ///
    /// // `head` writes x; `left` (on `side`) and `right` read it; `tail` waits for both.
    /// static PLAN: PlanDesc = PlanDesc::new("diamond")
    ///     .with_streams(&[StreamDesc::named("main"), StreamDesc::named("side")])
    ///     .with_buffers(&[BufferDesc::new("x", BufKind::Shared), BufferDesc::new("y", BufKind::Shared)])
    ///     .with_events(&[
    ///         EventDesc::after(StreamId(0), OpId(0)),
    ///         EventDesc::after(StreamId(1), OpId(1)),
    ///     ])
    ///     .with_ops(&[
    ///         OpDesc::new("head", StreamId(0))
    ///             .with_accesses(&[AccessDesc::write(BufId(0), 0)])
    ///             .with_record(EventId(0)),
    ///         OpDesc::new("left", StreamId(1))
    ///             .with_accesses(&[AccessDesc::read(BufId(0), 0)])
    ///             .with_waits(&[EventId(0)])
    ///             .with_record(EventId(1)),
    ///         OpDesc::new("right", StreamId(0)).with_accesses(&[AccessDesc::read(BufId(0), 0)]),
    ///         OpDesc::new("tail", StreamId(0))
    ///             .with_accesses(&[AccessDesc::write(BufId(1), 0)])
    ///             .with_waits(&[EventId(1)]),
    ///     ]);
    /// // `left` and `right` fill the GPU; `head` and `tail` are small.
    /// let (alone, work) = ([1.0, 4.0, 4.0, 1.0], [0.0, 4.0, 4.0, 0.0]);
    /// assert_eq!(PLAN.longest_path(&alone).1, 6.0);
    /// let b = PLAN.chain_work_bound(&alone, &work);
    /// assert_eq!((b.total, b.head, b.tail), (10.0, Some(OpId(0)), Some(OpId(3))));
    /// ```
    pub fn chain_work_bound(&self, alone: &[f64], work: &[f64]) -> ChainBound {
        let at = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0);
        let b = dag::chain_work_bound(
            self.ops.len(),
            &self.schedule_edges_ix(),
            |i| at(alone, i),
            |i| at(work, i),
        );
        let id = |i: Option<usize>| i.map(|i| OpId(i as u32));
        ChainBound {
            total: b.total,
            head: id(b.head),
            tail: id(b.tail),
        }
    }

    /// Each op's level in the schedule: 0 for an op nothing orders before, otherwise one
    /// more than the highest level among the ops that [`schedule_edges`](Self::schedule_edges)
    /// orders before it.
    pub fn levels(&self) -> Vec<usize> {
        dag::levels(self.ops.len(), &self.schedule_edges_ix())
    }
}

impl fmt::Display for PlanDesc {
    /// Indices out of range (a hand-built plan that would fail [`PlanDesc::check`]) are
    /// printed as `?`, so that the plan can still be read to find them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan `{}`: {} ops on {} streams, {} events, {} waits",
            self.step,
            self.ops.len(),
            self.streams.len(),
            self.events.len(),
            self.wait_count()
        )?;
        let ranked: Vec<String> = self
            .streams
            .iter()
            .filter(|s| s.priority != StreamPriority::Normal)
            .map(|s| format!("{}={:?}", s.name, s.priority).to_lowercase())
            .collect();
        if !ranked.is_empty() {
            writeln!(
                f,
                "  stream priorities (others normal): {}",
                ranked.join(" ")
            )?;
        }
        if let Some(placement) = self.placement {
            writeln!(f, "  {placement}")?;
        }
        let width = self.streams.iter().map(|s| s.name.len()).max().unwrap_or(4);
        for (i, op) in self.ops.iter().enumerate() {
            self.fmt_op(f, i, op, width)?;
        }
        self.fmt_views(f)?;
        if !self.final_waits.is_empty() {
            let w: Vec<_> = self
                .final_waits
                .iter()
                .map(|e| self.event_label(e))
                .collect();
            writeln!(
                f,
                "  end [{:<width$}] joins {}",
                self.streams.first().map_or("?", |s| s.name),
                w.join(", ")
            )?;
        }
        self.fmt_critical_paths(f)?;
        self.fmt_shared_writes(f)
    }
}

/// The parts of the plan's `Display`.
impl PlanDesc {
    /// Op `o`'s name, `?` for an index outside the plan.
    fn display_op_name(&self, o: OpId) -> &'static str {
        self.ops.get(o.index()).map_or("?", |o| o.name)
    }

    /// The names of `ids`, joined by arrows.
    fn display_op_names(&self, ids: &[OpId]) -> String {
        ids.iter()
            .map(|&o| self.display_op_name(o))
            .collect::<Vec<_>>()
            .join(" -> ")
    }

    /// `e3(op)`: an event with the op it follows.
    fn event_label(&self, e: &EventId) -> String {
        match self.events.get(e.index()) {
            Some(EventDesc {
                after: Some(op), ..
            }) => format!("e{}({})", e.0, self.display_op_name(*op)),
            // Two words, so that no op's name (an identifier) can read the same.
            Some(EventDesc { after: None, .. }) => format!("e{}(capture begin)", e.0),
            None => format!("e{}(?)", e.0),
        }
    }

    /// Op `i`'s line: its stream, what it reads and writes, its events and condition.
    fn fmt_op(
        &self,
        f: &mut fmt::Formatter<'_>,
        i: usize,
        op: &OpDesc,
        width: usize,
    ) -> fmt::Result {
        let stream = self.streams.get(op.stream.index()).map_or("?", |s| s.name);
        write!(f, "  {i:>3} [{stream:<width$}] {}", op.name)?;
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for a in op.accesses {
            let name = match self.buffers.get(a.buf.index()) {
                Some(b) if b.kind == BufKind::Shared => b.name.to_string(),
                Some(b) => format!("{}#{}", b.name, a.copy),
                None => "?".to_string(),
            };
            match a.access {
                Access::Read => reads.push(name),
                Access::Write => writes.push(name),
            }
        }
        if !reads.is_empty() {
            write!(f, "  reads {}", reads.join(", "))?;
        }
        if !writes.is_empty() {
            write!(f, "  writes {}", writes.join(", "))?;
        }
        if !op.waits.is_empty() {
            let w: Vec<_> = op.waits.iter().map(|e| self.event_label(e)).collect();
            write!(f, "  waits {}", w.join(", "))?;
        }
        if let Some(e) = op.record {
            write!(f, "  records e{}", e.0)?;
        }
        if let Some(k) = op.every {
            write!(f, "  every {k} replays")?;
        }
        if let Some(flag) = op.when {
            write!(f, "  when {}", self.buffer_name(flag))?;
        }
        if op.automatic {
            write!(f, "  placed by the planner (cost {})", op.cost)?;
        }
        writeln!(f)?;
        Ok(())
    }

    /// The views, each with the buffer it lies in.
    fn fmt_views(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let views: Vec<String> = self
            .buffers
            .iter()
            .filter_map(|b| {
                let parent = self.buffers.get(b.view_of?.index()).map_or("?", |p| p.name);
                Some(format!("{} in {parent}", b.name))
            })
            .collect();
        if !views.is_empty() {
            writeln!(
                f,
                "  views (disjoint unless their spans overlap): {}",
                views.join(", ")
            )?;
        }
        Ok(())
    }

    /// The critical path, and the one by cost where it differs.
    fn fmt_critical_paths(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  critical path ({} ops): {}",
            self.critical_path.len(),
            self.display_op_names(self.critical_path)
        )?;
        if self.critical_path_by_cost != self.critical_path {
            let cost: f64 = self
                .critical_path_by_cost
                .iter()
                .filter_map(|o| self.ops.get(o.index()))
                // Not `sum`, whose empty sum is -0.
                .fold(0.0, |total, o| total + o.cost);
            writeln!(
                f,
                "  critical path by cost ({cost}): {}",
                self.display_op_names(self.critical_path_by_cost)
            )?;
        }
        Ok(())
    }

    /// The pairs of ops ordered only by writing one buffer.
    fn fmt_shared_writes(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = self.shared_writes();
        if !shared.is_empty() {
            let pairs: Vec<String> = shared
                .iter()
                .map(|w| {
                    format!(
                        "{} -> {} ({})",
                        self.display_op_name(w.first),
                        self.display_op_name(w.second),
                        self.buffers.get(w.buf.index()).map_or("?", |b| b.name)
                    )
                })
                .collect();
            writeln!(
                f,
                "  ordered only by `&mut` of one buffer (unless the later op reads what the earlier wrote, one buffer each would let them run side by side): {}",
                pairs.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn op(
        name: &'static str,
        stream: u16,
        accesses: &'static [AccessDesc],
        waits: &'static [EventId],
        record: Option<EventId>,
    ) -> OpDesc {
        OpDesc {
            name,
            func: name,
            stream: StreamId(stream),
            accesses,
            waits,
            record,
            cost: 1.0,
            every: None,
            when: None,
            automatic: false,
        }
    }

    const fn access(buf: u16, copy: u16, access: Access) -> AccessDesc {
        AccessDesc {
            buf: BufId(buf),
            copy,
            access,
        }
    }

    /// `a` (main) writes x and forks `b` (side), which reads it; `c` (other) starts from
    /// the capture-begin event; `d` (main) joins `b`; `c` is joined at capture end.
    const GOOD: PlanDesc = PlanDesc {
        step: "t",
        streams: &[
            StreamDesc::named("main"),
            StreamDesc::named("side"),
            StreamDesc::named("other"),
        ],
        buffers: &[
            BufferDesc::new("x", BufKind::Shared),
            BufferDesc::new("s", BufKind::ScratchPerStream),
        ],
        ops: &[
            op(
                "a",
                0,
                &[access(0, 0, Access::Write)],
                &[],
                Some(EventId(1)),
            ),
            op(
                "b",
                1,
                &[access(0, 0, Access::Read), access(1, 1, Access::Write)],
                &[EventId(1)],
                Some(EventId(2)),
            ),
            op("c", 2, &[], &[EventId(0)], Some(EventId(3))),
            op("d", 0, &[], &[EventId(2)], None),
        ],
        edges: &[
            EdgeDesc {
                from: OpId(0),
                to: OpId(1),
                kind: EdgeKind::ReadAfterWrite,
                buf: Some(BufId(0)),
            },
            EdgeDesc {
                from: OpId(1),
                to: OpId(3),
                kind: EdgeKind::Join,
                buf: None,
            },
        ],
        events: &[
            EventDesc {
                stream: StreamId(0),
                after: None,
            },
            EventDesc {
                stream: StreamId(0),
                after: Some(OpId(0)),
            },
            EventDesc {
                stream: StreamId(1),
                after: Some(OpId(1)),
            },
            EventDesc {
                stream: StreamId(2),
                after: Some(OpId(2)),
            },
        ],
        final_waits: &[EventId(3)],
        critical_path: &[OpId(0), OpId(1), OpId(3)],
        critical_path_by_cost: &[OpId(0), OpId(1), OpId(3)],
        placement: None,
    };

    const BAD_ACCESS: AccessDesc = access(2, 0, Access::Read);

    /// A `'static` slice for a hand-built bad plan.
    fn leak<T>(items: Vec<T>) -> &'static [T] {
        Box::leak(items.into_boxed_slice())
    }

    /// `GOOD` with op `i` replaced.
    fn with_op(i: usize, new: OpDesc) -> &'static [OpDesc] {
        let mut ops = GOOD.ops.to_vec();
        ops[i] = new;
        leak(ops)
    }

    fn check_err(plan: &PlanDesc) -> String {
        match plan.check() {
            Err(e) => e.message().to_string(),
            Ok(()) => panic!("expected the check to fail"),
        }
    }

    #[test]
    fn a_sound_schedule_passes_the_audit_and_a_racy_or_serialised_one_does_not() {
        // GOOD: a writes x, b (side) reads it after a wait; c is independent of both.
        let audit = GOOD.audit().unwrap();
        assert_eq!(audit.conflicts_ordered, 1);
        // c is on its own stream: independent of a, b and d; b and d are joined.
        assert_eq!(audit.independent_pairs, 3);
        // Without b's wait the read of x races the write.
        const READ_X: &[AccessDesc] = &[access(0, 0, Access::Read)];
        let racy = PlanDesc {
            ops: with_op(1, op("b", 1, READ_X, &[EventId(0)], None)),
            ..GOOD
        };
        let e = racy.audit().unwrap_err().to_string();
        assert!(e.contains("`a` and `b` both access `x`"), "{e}");
        // c waiting on a orders what nothing requires.
        let serialised = PlanDesc {
            ops: with_op(2, op("c", 2, &[], &[EventId(1)], Some(EventId(3)))),
            ..GOOD
        };
        let e = serialised.audit().unwrap_err().to_string();
        assert!(e.contains("orders `a` before `c`"), "{e}");
    }

    #[test]
    fn a_planned_fork_join_passes_the_check() {
        GOOD.check().unwrap();
        assert_eq!(GOOD.op(OpId(3)).unwrap().name, "d");
    }

    #[test]
    fn each_index_out_of_range_is_named_with_what_was_expected() {
        let cases: Vec<(PlanDesc, &str)> = vec![
            (
                PlanDesc {
                    ops: with_op(1, op("b", 3, &[], &[EventId(1)], None)),
                    ..GOOD
                },
                "plan `t`: op 1 `b` is on stream 3; expected a stream index below 3",
            ),
            (
                PlanDesc {
                    ops: with_op(0, op("a", 0, &[BAD_ACCESS], &[], None)),
                    ..GOOD
                },
                "plan `t`: op 0 `a` accesses buffer 2; expected a buffer index below 2",
            ),
            (
                PlanDesc {
                    ops: with_op(3, op("d", 0, &[], &[EventId(4)], None)),
                    ..GOOD
                },
                "plan `t`: op 3 `d` waits on event 4; expected an event index below 4",
            ),
            (
                PlanDesc {
                    ops: with_op(3, op("d", 0, &[], &[], Some(EventId(7)))),
                    ..GOOD
                },
                "plan `t`: op 3 `d` records event 7; expected an event index below 4",
            ),
            (
                PlanDesc {
                    edges: leak(vec![EdgeDesc {
                        from: OpId(9),
                        to: OpId(1),
                        kind: EdgeKind::After,
                        buf: None,
                    }]),
                    ..GOOD
                },
                "plan `t`: edge 0 runs from op 9; expected an op index below 4",
            ),
            (
                PlanDesc {
                    edges: leak(vec![EdgeDesc {
                        from: OpId(0),
                        to: OpId(4),
                        kind: EdgeKind::WriteAfterWrite,
                        buf: Some(BufId(5)),
                    }]),
                    ..GOOD
                },
                "plan `t`: edge 0 runs to op 4; expected an op index below 4\n\
                 plan `t`: edge 0 names buffer 5; expected a buffer index below 2",
            ),
            (
                PlanDesc {
                    events: leak(
                        [EventDesc {
                            stream: StreamId(3),
                            after: Some(OpId(4)),
                        }]
                        .into_iter()
                        .chain(GOOD.events[1..].iter().copied())
                        .collect(),
                    ),
                    ..GOOD
                },
                "plan `t`: event 0 is recorded on stream 3; expected a stream index below 3\n\
                 plan `t`: event 0 follows op 4; expected an op index below 4",
            ),
            (
                PlanDesc {
                    final_waits: &[EventId(3), EventId(4)],
                    ..GOOD
                },
                "plan `t`: the final joins wait on event 4; expected an event index below 4",
            ),
            (
                PlanDesc {
                    critical_path: &[OpId(0), OpId(4)],
                    critical_path_by_cost: &[OpId(5)],
                    ..GOOD
                },
                "plan `t`: the critical path names op 4; expected an op index below 4\n\
                 plan `t`: the critical path by cost names op 5; expected an op index below 4",
            ),
        ];
        for (plan, expected) in cases {
            assert_eq!(check_err(&plan), expected);
        }
    }

    #[test]
    fn a_when_op_reads_its_flag_in_range_and_has_no_second_condition() {
        // `b` reads x: it may run when x is set, and prints so.
        let b = GOOD.ops[1].with_when(BufId(0));
        let plan = PlanDesc {
            ops: with_op(1, b),
            ..GOOD
        };
        plan.check().unwrap();
        assert!(plan.to_string().contains("  when x\n"), "{plan}");
        let cases: Vec<(OpDesc, &str)> = vec![
            (
                GOOD.ops[1].with_when(BufId(2)),
                "plan `t`: op 1 `b` runs when buffer 2 is set; expected a buffer index below 2",
            ),
            (
                // `a` writes x and does not read it: nothing orders it after x's writer.
                GOOD.ops[0].with_when(BufId(0)),
                "plan `t`: op 0 `a` runs when `x` is set but does not read it; expected a read of the flag among its accesses",
            ),
            (
                b.with_every("4"),
                "plan `t`: op 1 `b` has both #[every] and #[when]; expected one condition",
            ),
        ];
        for (op, expected) in cases {
            let i = if op.name == "a" { 0 } else { 1 };
            let plan = PlanDesc {
                ops: with_op(i, op),
                ..GOOD
            };
            assert_eq!(check_err(&plan), expected);
        }
    }

    #[test]
    fn a_plan_without_streams_is_refused() {
        let plan = PlanDesc {
            streams: &[],
            ops: &[],
            edges: &[],
            events: &[],
            final_waits: &[],
            critical_path: &[],
            critical_path_by_cost: &[],
            ..GOOD
        };
        assert_eq!(
            check_err(&plan),
            "plan `t`: no streams; expected at least one (the origin stream)"
        );
    }

    #[test]
    fn a_long_list_of_problems_is_cut_short_with_a_count() {
        let ops = leak(vec![op("z", 9, &[], &[], None); PROBLEMS_LISTED + 5]);
        let msg = check_err(&PlanDesc { ops, ..GOOD });
        assert_eq!(msg.lines().count(), PROBLEMS_LISTED + 1, "{msg}");
        assert!(msg.ends_with("\n(and 5 more problems)"), "{msg}");
    }

    #[test]
    fn an_op_id_past_the_ops_is_an_error_not_a_panic() {
        let e = GOOD.op(OpId(4)).unwrap_err().to_string();
        assert_eq!(e, "plan `t`: expected an op id below 4, found 4");
    }

    #[test]
    fn a_plan_that_fails_the_check_still_prints_and_plans() {
        let plan = PlanDesc {
            streams: &GOOD.streams[..1],
            buffers: &[],
            final_waits: &[EventId(9)],
            events: &[EventDesc {
                stream: StreamId(0),
                after: Some(OpId(8)),
            }],
            critical_path: &[OpId(0), OpId(7)],
            critical_path_by_cost: &[OpId(6)],
            ..GOOD
        };
        assert!(plan.check().is_err());
        // Only stream 0 is known: a then d in stream order. b waits on a missing event, c
        // on one that follows a missing op: neither orders anything.
        assert_eq!(plan.schedule_edges(), [(OpId(0), OpId(3))]);
        assert_eq!(plan.levels(), [0, 0, 0, 1]);
        let (path, total) = plan.longest_path(&[1.0; 4]);
        assert_eq!((path, total), (vec![OpId(0), OpId(3)], 2.0));
        let text = plan.to_string();
        for part in [
            "[?   ] b  reads ?  writes ?  waits e1(?)",
            "[?   ] c  waits e0(?)",
            "end [main] joins e9(?)",
            "critical path (2 ops): a -> ?",
            "critical path by cost (0): ?",
        ] {
            assert!(text.contains(part), "missing {part:?} in\n{text}");
        }
    }

    /// A plan of one buffer `x` (scratch or state), `y` and `z`, each op on its own
    /// stream, with the given accesses and edges.
    fn shared_plan(ops: &'static [OpDesc], edges: &'static [EdgeDesc], kind: BufKind) -> PlanDesc {
        static STREAMS: [StreamDesc; 4] = [
            StreamDesc::named("s0"),
            StreamDesc::named("s1"),
            StreamDesc::named("s2"),
            StreamDesc::named("s3"),
        ];
        static SHARED: [BufferDesc; 3] = [
            BufferDesc::new("x", BufKind::Shared),
            BufferDesc::new("y", BufKind::Shared),
            BufferDesc::new("z", BufKind::Shared),
        ];
        static PER_STREAM: [BufferDesc; 3] = [
            BufferDesc::new("x", BufKind::ScratchPerStream),
            BufferDesc::new("y", BufKind::Shared),
            BufferDesc::new("z", BufKind::Shared),
        ];
        let buffers: &'static [BufferDesc] = match kind {
            BufKind::ScratchPerStream => &PER_STREAM,
            _ => &SHARED,
        };
        PlanDesc::new("shared")
            .with_streams(&STREAMS)
            .with_buffers(buffers)
            .with_ops(ops)
            .with_edges(edges)
    }

    fn pairs(plan: &PlanDesc) -> Vec<(u32, u32, u16)> {
        plan.shared_writes()
            .iter()
            .map(|w| (w.first.0, w.second.0, w.buf.0))
            .collect()
    }

    const W: Access = Access::Write;
    const R: Access = Access::Read;

    #[test]
    fn ops_that_only_share_a_written_buffer_are_named_once_along_a_chain() {
        // Three ops each write scratch x: a -> b and b -> c are named, a -> c is implied.
        const OPS: [OpDesc; 3] = [
            op("a", 0, &[access(0, 0, W)], &[], None),
            op("b", 1, &[access(0, 0, W)], &[], None),
            op("c", 2, &[access(0, 0, W)], &[], None),
        ];
        let plan = shared_plan(&OPS, &[], BufKind::Shared);
        assert_eq!(pairs(&plan), [(0, 1, 0), (1, 2, 0)]);
        let text = plan.to_string();
        assert!(
            text.contains("ordered only by `&mut` of one buffer")
                && text.contains("a -> b (x), b -> c (x)"),
            "{text}"
        );
        // One copy per stream (the copy index is the stream's): nothing is shared.
        const COPIES: [OpDesc; 3] = [
            op("a", 0, &[access(0, 0, W)], &[], None),
            op("b", 1, &[access(0, 1, W)], &[], None),
            op("c", 2, &[access(0, 2, W)], &[], None),
        ];
        let plan = shared_plan(&COPIES, &[], BufKind::ScratchPerStream);
        assert!(pairs(&plan).is_empty());
        assert!(!plan.to_string().contains("ordered only"));
    }

    #[test]
    fn data_a_join_or_a_later_write_of_read_state_are_real_orderings() {
        // b reads what a wrote (y) and both write x: ordered by the data.
        const DATA: [OpDesc; 2] = [
            op("a", 0, &[access(0, 0, W), access(1, 0, W)], &[], None),
            op("b", 1, &[access(0, 0, W), access(1, 0, R)], &[], None),
        ];
        assert!(pairs(&shared_plan(&DATA, &[], BufKind::Shared)).is_empty());
        // A chain of reads orders them: a writes y, m reads y and writes z, b reads z.
        const CHAIN: [OpDesc; 3] = [
            op("a", 0, &[access(0, 0, W), access(1, 0, W)], &[], None),
            op("m", 1, &[access(1, 0, R), access(2, 0, W)], &[], None),
            op("b", 2, &[access(0, 0, W), access(2, 0, R)], &[], None),
        ];
        assert!(pairs(&shared_plan(&CHAIN, &[], BufKind::Shared)).is_empty());
        // An explicit join orders them.
        const JOINED: [OpDesc; 2] = [
            op("a", 0, &[access(0, 0, W)], &[], None),
            op("b", 1, &[access(0, 0, W)], &[], None),
        ];
        const JOIN: [EdgeDesc; 1] = [EdgeDesc::new(OpId(0), OpId(1), EdgeKind::Join, None)];
        assert!(pairs(&shared_plan(&JOINED, &JOIN, BufKind::Shared)).is_empty());
        assert_eq!(
            pairs(&shared_plan(&JOINED, &[], BufKind::Shared)),
            [(0, 1, 0)]
        );
        // A state read, then updated: a write after a read is not listed.
        const UPDATE: [OpDesc; 2] = [
            op("use", 0, &[access(0, 0, R), access(1, 0, W)], &[], None),
            op("update", 1, &[access(0, 0, W)], &[], None),
        ];
        assert!(pairs(&shared_plan(&UPDATE, &[], BufKind::Shared)).is_empty());
        // The same with a scratch x both take: the update waits for the use anyway.
        const UPDATE_SCRATCH: [OpDesc; 2] = [
            op("use", 0, &[access(1, 0, R), access(0, 0, W)], &[], None),
            op("update", 1, &[access(1, 0, W), access(0, 0, W)], &[], None),
        ];
        assert!(pairs(&shared_plan(&UPDATE_SCRATCH, &[], BufKind::Shared)).is_empty());
    }
}
