//! The compile-time plan of a step, as the `#[step]` macro emits it: a `const`
//! [`PlanDesc`] that names every op, stream, buffer access, dependency edge and event,
//! and the critical path. The executor issues ops by reading it; tests and tools print it.

use std::fmt;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamDesc {
    /// `main`, `aux_iqn`, `branch[2]`.
    pub name: &'static str,
    /// Its priority, `streams(.., aux_attn(low))`.
    pub priority: StreamPriority,
}

impl StreamDesc {
    /// A stream of normal priority.
    pub const fn named(name: &'static str) -> StreamDesc {
        StreamDesc {
            name,
            priority: StreamPriority::Normal,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferDesc {
    /// The field name.
    pub name: &'static str,
    /// How it is shared.
    pub kind: BufKind,
}

/// One access of an op to a buffer; `copy` says which copy of a per-branch or scratch
/// buffer (0 for shared buffers).
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
}

/// An event: recorded on `stream` after op `after`, or at capture begin when `after`
/// is `None` (the fork point every side stream first waits on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventDesc {
    /// The stream it is recorded on.
    pub stream: StreamId,
    /// The op it follows; `None` for the capture-begin fork event on the origin stream.
    pub after: Option<OpId>,
}

/// A dependency the planner inferred (or an explicit ordering).
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

/// The whole plan of a step.
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
}

impl PlanDesc {
    /// Number of cross-stream waits, the final joins included.
    pub fn wait_count(&self) -> usize {
        self.ops.iter().map(|o| o.waits.len()).sum::<usize>() + self.final_waits.len()
    }

    /// Every happens-before edge of the schedule: stream order between consecutive ops
    /// of a stream, and each wait (from the op the event follows to the waiting op).
    /// Waits on the capture-begin event order nothing and are left out.
    pub fn schedule_edges(&self) -> Vec<(OpId, OpId)> {
        let mut edges = Vec::new();
        let mut last_on: Vec<Option<OpId>> = vec![None; self.streams.len()];
        for (i, op) in self.ops.iter().enumerate() {
            let id = OpId(i as u32);
            if let Some(prev) = last_on[op.stream.index()] {
                edges.push((prev, id));
            }
            last_on[op.stream.index()] = Some(id);
            for ev in op.waits {
                if let Some(from) = self.events[ev.index()].after {
                    edges.push((from, id));
                }
            }
        }
        edges
    }

    /// The longest path through the schedule with the given per-op costs (for example
    /// times measured in isolation): its ops and its total. `costs` has one entry per op.
    pub fn longest_path(&self, costs: &[f64]) -> (Vec<OpId>, f64) {
        let n = self.ops.len().min(costs.len());
        let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (a, b) in self.schedule_edges() {
            if a.index() < n && b.index() < n {
                preds[b.index()].push(a.index());
            }
        }
        // Ops are in program order, which is a topological order of the schedule.
        let mut best = vec![0.0f64; n];
        let mut from = vec![usize::MAX; n];
        for i in 0..n {
            let mut start = 0.0;
            for &p in &preds[i] {
                if best[p] > start {
                    start = best[p];
                    from[i] = p;
                }
            }
            best[i] = start + costs[i];
        }
        let Some(end) = (0..n).max_by(|&a, &b| best[a].total_cmp(&best[b])) else {
            return (Vec::new(), 0.0);
        };
        let mut path = vec![OpId(end as u32)];
        let mut at = end;
        while from[at] != usize::MAX {
            at = from[at];
            path.push(OpId(at as u32));
        }
        path.reverse();
        (path, best[end])
    }
}

impl fmt::Display for PlanDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |ids: &[OpId]| {
            ids.iter()
                .map(|o| self.ops[o.index()].name)
                .collect::<Vec<_>>()
                .join(" -> ")
        };
        let event = |e: &EventId| {
            let ev = self.events[e.index()];
            match ev.after {
                Some(op) => format!("e{}({})", e.0, self.ops[op.index()].name),
                None => format!("e{}(begin)", e.0),
            }
        };
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
        let width = self.streams.iter().map(|s| s.name.len()).max().unwrap_or(4);
        for (i, op) in self.ops.iter().enumerate() {
            let stream = self.streams[op.stream.index()].name;
            write!(f, "  {i:>3} [{stream:<width$}] {}", op.name)?;
            let (mut reads, mut writes) = (Vec::new(), Vec::new());
            for a in op.accesses {
                let buf = self.buffers[a.buf.index()];
                let name = match buf.kind {
                    BufKind::Shared => buf.name.to_string(),
                    _ => format!("{}#{}", buf.name, a.copy),
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
                let w: Vec<_> = op.waits.iter().map(event).collect();
                write!(f, "  waits {}", w.join(", "))?;
            }
            if let Some(e) = op.record {
                write!(f, "  records e{}", e.0)?;
            }
            writeln!(f)?;
        }
        if !self.final_waits.is_empty() {
            let w: Vec<_> = self.final_waits.iter().map(event).collect();
            writeln!(
                f,
                "  end [{:<width$}] joins {}",
                self.streams[0].name,
                w.join(", ")
            )?;
        }
        writeln!(
            f,
            "  critical path ({} ops): {}",
            self.critical_path.len(),
            names(self.critical_path)
        )?;
        if self.critical_path_by_cost != self.critical_path {
            let cost: f64 = self
                .critical_path_by_cost
                .iter()
                .map(|o| self.ops[o.index()].cost)
                .sum();
            writeln!(
                f,
                "  critical path by cost ({cost}): {}",
                names(self.critical_path_by_cost)
            )?;
        }
        Ok(())
    }
}
