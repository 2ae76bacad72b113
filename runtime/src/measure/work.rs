//! The work bound of a step: how long the GPU must be busy to do all of the step's
//! kernels, however they are scheduled.
//!
//! The critical-path bound (the longest chain of ops, each costed alone) assumes that
//! ops on parallel streams cost nothing extra. That is false when each of them fills the
//! GPU by itself: two kernels that each occupy every SM cannot run side by side, they
//! take turns. The work bound charges every kernel its time alone multiplied by the share
//! of the GPU its grid occupies while it runs; summed over the step, that is GPU-time a
//! schedule cannot overlap away. A step can be no faster than the larger of the two.
//!
//! The share of a kernel is counted from its launch, read back from the captured graph:
//! the blocks of its grid over the blocks the GPU holds at once
//! (`cuOccupancyMaxActiveBlocksPerMultiprocessor` × SMs). Two bounds come out:
//! - the grid bound takes that ratio capped at 1: a kernel whose grid fills the GPU
//!   holds all of it for its time;
//! - the wave bound averages it over the kernel's waves: a grid of 1.5 waves occupies
//!   the whole GPU for one wave and half of it for the other, so its share is 0.75, not 1,
//!   since the idle half of its tail is room another stream can use. It is the lower,
//!   tighter of the two, and [`WorkBound::bound_ms`].
//!
//! Each kernel's time alone comes from a graph of [`COPIES`] copies of its node in a
//! chain (same function, arguments and launch attributes), launched [`LAUNCHES`] times:
//! the median launch over the copies. A chain keeps a short kernel's figure free of the
//! graph launch's own latency. The copies run on the step's buffers, so a kernel that
//! updates in place (an optimiser) is applied many times: measure on a step whose
//! values are no longer needed.

use std::fmt;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::driver::device::Device;
use crate::driver::event::{elapsed_ms, event};
use crate::driver::graph::{
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEMSET_NODE_PARAMS, CUgraphNode, CUgraphNodeType, Graph, OpNodes,
    blocks_per_sm, function_name, kernel_params, node_function, node_type, preceding_memsets,
};
use crate::error::{Error, Result};
use crate::measure::timing::median;
use crate::plan::{OpCost, OpCosts, PlanDesc};

/// Copies of a kernel node chained in one timing graph.
pub const COPIES: usize = 20;
/// Timed launches of a timing graph (after one warm-up launch); the median is kept.
pub const LAUNCHES: usize = 11;

/// One kernel node of the step, as launched and as timed alone.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct KernelWork {
    /// The kernel's (mangled) name, as the driver reports it.
    pub name: String,
    /// Blocks in its grid.
    pub blocks: u64,
    /// Threads per block.
    pub threads: u32,
    /// Blocks of this kernel the whole GPU holds at once (per-SM occupancy × SMs).
    pub resident: u64,
    /// Share of the GPU its grid occupies, averaged over its waves (0..=1).
    pub share: f64,
    /// Share of the GPU its grid occupies, `min(1, blocks / resident)`.
    pub grid_share: f64,
    /// Its time alone, in milliseconds; 0 for the counting kernel of an `#[every]` op,
    /// which sets a condition of the step's graph and so is not launched outside it.
    pub alone_ms: f64,
}

impl KernelWork {
    /// GPU-time it cannot share: `alone_ms × share`.
    pub fn work_ms(&self) -> f64 {
        self.alone_ms * self.share
    }
}

/// One op's kernels.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct OpWork {
    /// The op's name in the plan.
    pub name: String,
    /// Its kernel nodes in capture order.
    pub kernels: Vec<KernelWork>,
    /// Its nodes that are not kernels (memsets, copies, event records): not timed, not
    /// counted in the bound.
    pub other_nodes: usize,
}

impl OpWork {
    /// Sum of its kernels' times alone.
    pub fn alone_ms(&self) -> f64 {
        self.kernels.iter().map(|k| k.alone_ms).sum()
    }

    /// Sum of its kernels' work.
    pub fn work_ms(&self) -> f64 {
        self.kernels.iter().map(KernelWork::work_ms).sum()
    }

    /// Sum of its kernels' time alone × grid share.
    pub fn grid_work_ms(&self) -> f64 {
        self.kernels.iter().map(|k| k.alone_ms * k.grid_share).sum()
    }
}

/// The work bound of a step.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct WorkBound {
    /// The step's name.
    pub step: String,
    /// The device (its name as the driver reports it).
    pub device: String,
    /// Its streaming multiprocessors.
    pub sms: u32,
    /// Ops in program order.
    pub ops: Vec<OpWork>,
}

impl WorkBound {
    /// The bound: every kernel's time alone weighted by its share, summed.
    pub fn bound_ms(&self) -> f64 {
        self.ops.iter().map(OpWork::work_ms).sum()
    }

    /// The grid bound: every kernel's time alone weighted by `min(1, blocks / resident)`,
    /// summed (at least [`WorkBound::bound_ms`]).
    pub fn grid_bound_ms(&self) -> f64 {
        self.ops.iter().map(OpWork::grid_work_ms).sum()
    }

    /// Every kernel's time alone, summed: what a schedule that overlaps nothing costs,
    /// less launch gaps and the non-kernel nodes.
    pub fn alone_ms(&self) -> f64 {
        self.ops.iter().map(OpWork::alone_ms).sum()
    }

    /// Kernel nodes measured.
    pub fn kernels(&self) -> usize {
        self.ops.iter().map(|o| o.kernels.len()).sum()
    }
}

impl WorkBound {
    /// Each op's measured cost, for the costs file automatic placement reads
    /// (`#[step(costs = "..")]`): its kernels' time alone, and the share of the GPU they
    /// hold over that time (their work over their time alone). An op with no kernels
    /// (memsets and copies only) costs 0.
    pub fn op_costs(&self) -> OpCosts {
        OpCosts {
            step: self.step.clone(),
            measured_on: format!("{} ({} SMs)", self.device, self.sms),
            ops: self
                .ops
                .iter()
                .map(|o| {
                    let alone = o.alone_ms();
                    OpCost {
                        op: o.name.clone(),
                        alone_us: alone * 1e3,
                        share: if alone > 0.0 {
                            (o.work_ms() / alone).clamp(0.0, 1.0)
                        } else {
                            0.0
                        },
                    }
                })
                .collect(),
        }
    }

    /// One line per kernel of the op named `op`: name, grid, resident blocks, share,
    /// time alone. For finding where an op's time goes.
    pub fn kernel_table(&self, op: &str) -> String {
        let mut out = String::new();
        for o in self.ops.iter().filter(|o| o.name == op) {
            for k in &o.kernels {
                let name: String = k.name.chars().take(60).collect();
                out.push_str(&format!(
                    "  {op} {name:<60} {:>7} blocks x {:>4} ({:>5} resident) share {:.2}  {:.4} ms\n",
                    k.blocks, k.threads, k.resident, k.share, k.alone_ms
                ));
            }
        }
        out
    }
}

/// A planned step's time against its bounds: the critical path with every op at its time
/// alone (d), and the work bound with shares averaged over waves (w) and with grid shares
/// (w'). A step can be no faster than the larger of (d) and (w); how far above it the
/// step runs is what its schedule leaves. [`of_plan`](Self::of_plan) also gives (p),
/// which joins the two: where a step begins and ends with chains and its middle fills
/// the GPU, no execution reaches max((d), (w)), and (p) says how close one can come.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// The planned graph's replay, (c).
    pub planned_ms: f64,
    /// (d).
    pub critical_path_ms: f64,
    /// (w): [`WorkBound::bound_ms`].
    pub work_ms: f64,
    /// (w'): [`WorkBound::grid_bound_ms`].
    pub grid_work_ms: f64,
    /// (p), when [`of_plan`](Self::of_plan) computed the bounds.
    pub chains: Option<ChainsBound>,
    /// (c-auto): the same ops placed wholly by the planner (`compare(auto)`,
    /// [`Schedule::Automatic`](crate::Schedule::Automatic)), where measured
    /// ([`with_automatic`](Self::with_automatic)).
    pub automatic_ms: Option<f64>,
}

/// (p), the chains-and-work bound of a step ([`PlanDesc::chain_work_bound`]): the
/// longest chain of ops (each at its time alone) to the op `head`, the work (w) of every
/// op between `head` and `tail`, and the longest chain from `tail` to the end; the
/// largest such sum over pairs of ops. At least max((d), (w)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChainsBound {
    /// The bound, in milliseconds.
    pub ms: f64,
    /// The op that ends the head chain; `None`: the work runs from the start.
    pub head: Option<&'static str>,
    /// The op that starts the tail chain; `None`: the work runs to the end.
    pub tail: Option<&'static str>,
}

impl Bounds {
    /// (c) against (d) and the work bound `work`'s two readings.
    pub fn new(planned_ms: f64, critical_path_ms: f64, work: &WorkBound) -> Bounds {
        Bounds {
            planned_ms,
            critical_path_ms,
            work_ms: work.bound_ms(),
            grid_work_ms: work.grid_bound_ms(),
            chains: None,
            automatic_ms: None,
        }
    }

    /// (c) against every bound of the step of `plan`, from one set of measurements:
    /// `alone_ms` holds each op's time alone in plan order (the one-stream step's
    /// profile's durations), `work` the work bound measured on the same step. (d) is the
    /// plan's longest path at those times ([`PlanDesc::longest_path`]); (p) joins those
    /// chains with each op's work (matched to the plan's ops by name; an op `work` does
    /// not list counts none).
    pub fn of_plan(planned_ms: f64, plan: &PlanDesc, alone_ms: &[f64], work: &WorkBound) -> Bounds {
        let (_, critical_path_ms) = plan.longest_path(alone_ms);
        let per_op: Vec<f64> = plan
            .ops
            .iter()
            .map(|op| {
                work.ops
                    .iter()
                    .find(|w| w.name == op.name)
                    .map_or(0.0, OpWork::work_ms)
            })
            .collect();
        let b = plan.chain_work_bound(alone_ms, &per_op);
        let name = |id: Option<crate::plan::OpId>| {
            id.and_then(|o| plan.ops.get(o.index())).map(|o| o.name)
        };
        Bounds {
            chains: Some(ChainsBound {
                ms: b.total,
                head: name(b.head),
                tail: name(b.tail),
            }),
            ..Bounds::new(planned_ms, critical_path_ms, work)
        }
    }

    /// These bounds with the planner's placement of the same ops measured too: the
    /// automatic plan against the hand plan and the bounds.
    pub fn with_automatic(self, automatic_ms: f64) -> Bounds {
        Bounds {
            automatic_ms: Some(automatic_ms),
            ..self
        }
    }

    /// max((d), (w)).
    pub fn larger_ms(&self) -> f64 {
        self.critical_path_ms.max(self.work_ms)
    }

    /// max((d), (w')).
    pub fn larger_grid_ms(&self) -> f64 {
        self.critical_path_ms.max(self.grid_work_ms)
    }
}

impl fmt::Display for Bounds {
    /// Rows of a benchmark's markdown table: (d), (w), (w'), then (c) against the larger
    /// bound with each reading of the work bound.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.planned_ms;
        let (d, w, wg) = (self.critical_path_ms, self.work_ms, self.grid_work_ms);
        writeln!(
            f,
            "| (d) critical-path bound | {d:.3} | (c)/(d) = {:.3} |",
            c / d
        )?;
        writeln!(f, "| (w) work bound | {w:.3} | (c)/(w) = {:.3} |", c / w)?;
        writeln!(
            f,
            "| (w') work bound, grid shares not averaged over waves | {wg:.3} | (c)/(w') = {:.3} |",
            c / wg
        )?;
        writeln!(
            f,
            "| larger bound, max((d), (w)) | {:.3} | (c)/max = {:.3} |",
            self.larger_ms(),
            c / self.larger_ms()
        )?;
        writeln!(
            f,
            "| larger bound with grid shares, max((d), (w')) | {:.3} | (c)/max = {:.3} |",
            self.larger_grid_ms(),
            c / self.larger_grid_ms()
        )?;
        if let Some(p) = &self.chains {
            let head = p.head.map_or("the start".to_string(), |h| format!("`{h}`"));
            let tail = p.tail.map_or("the end".to_string(), |t| format!("`{t}`"));
            writeln!(
                f,
                "| (p) chains and the work between: to {head}, work, from {tail} | {:.3} | (c)/(p) = {:.3} |",
                p.ms,
                c / p.ms
            )?;
        }
        if let Some(a) = self.automatic_ms {
            writeln!(
                f,
                "| (c-auto) every op placed by the planner | {a:.3} | (c-auto)/(c) = {:.3}, (c-auto)/max = {:.3} |",
                a / c,
                a / self.larger_ms()
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for WorkBound {
    /// One row per op (its kernels, time alone, share range, work), then the totals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "work bound `{}` on {} ({} SMs): {} kernels, {:.3} ms alone, {:.3} ms of work",
            self.step,
            self.device,
            self.sms,
            self.kernels(),
            self.alone_ms(),
            self.bound_ms()
        )?;
        let nw = self.ops.iter().map(|o| o.name.len()).max().unwrap_or(2);
        writeln!(
            f,
            "  {:<nw$}  {:>7}  {:>9}  {:>11}  {:>9}",
            "op", "kernels", "alone ms", "share", "work ms"
        )?;
        for op in &self.ops {
            let (lo, hi) = op
                .kernels
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(lo, hi), k| {
                    (lo.min(k.share), hi.max(k.share))
                });
            let share = if op.kernels.is_empty() {
                "-".to_string()
            } else if (hi - lo).abs() < 0.005 {
                format!("{hi:.2}")
            } else {
                format!("{lo:.2}..{hi:.2}")
            };
            writeln!(
                f,
                "  {:<nw$}  {:>7}  {:>9.4}  {:>11}  {:>9.4}",
                op.name,
                op.kernels.len(),
                op.alone_ms(),
                share,
                op.work_ms()
            )?;
        }
        write!(
            f,
            "  work bound: {:.3} ms ({:.0}% of the kernels' {:.3} ms alone); with grid shares not averaged over waves: {:.3} ms",
            self.bound_ms(),
            100.0 * self.bound_ms() / self.alone_ms().max(f64::MIN_POSITIVE),
            self.alone_ms(),
            self.grid_bound_ms()
        )
    }
}

/// The share of the GPU a grid of `blocks` occupies when `resident` of its blocks fit
/// at once, averaged over its waves: `blocks / (waves × resident)`.
pub fn wave_share(blocks: u64, resident: u64) -> f64 {
    if blocks == 0 || resident == 0 {
        return 0.0;
    }
    let waves = blocks.div_ceil(resident);
    // Whole waves can hold up to `resident - 1` more blocks than were launched, which
    // for a grid near u64::MAX does not fit a u64.
    blocks as f64 / (u128::from(waves) * u128::from(resident)) as f64
}

/// `min(1, blocks / resident)`: the share of the GPU a grid occupies while its first wave
/// runs.
pub fn grid_share(blocks: u64, resident: u64) -> f64 {
    if resident == 0 {
        return 0.0;
    }
    (blocks as f64 / resident as f64).min(1.0)
}

/// How long one timing of a kernel alone may take before it is given up: a chain of
/// [`COPIES`] launched [`LAUNCHES`] + 1 times of a kernel of the step, milliseconds each.
pub const ALONE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Median time of one copy of `src` alone, in milliseconds, from a chain of [`COPIES`],
/// each after the memsets `src` depends on (`clears`, timed with it: tiny); `marks` are
/// [`LAUNCHES`] + 1 timing events, recorded between the launches. Fails, rather than
/// waiting for ever, if the chain runs past [`ALONE_DEADLINE`].
fn time_alone(
    device: &Device,
    stream: &CudaStream,
    marks: &[CudaEvent],
    src: CUgraphNode,
    params: &CUDA_KERNEL_NODE_PARAMS,
    clears: &[CUDA_MEMSET_NODE_PARAMS],
) -> Result<f64> {
    let ctx = device.context();
    let graph = crate::driver::graph::chain_of_copies(ctx, src, params, clears, COPIES)?;
    // The copies carry the source's priority attribute; timed alone, it does not matter.
    let exec = Graph::instantiate(graph, false)?;
    exec.launch(stream)?;
    for (i, mark) in marks.iter().enumerate() {
        mark.record(stream)
            .map_err(Error::driver("cuEventRecord"))?;
        if i < LAUNCHES {
            exec.launch(stream)?;
        }
    }
    let started = std::time::Instant::now();
    let last = marks.last().ok_or_else(|| Error::Internal {
        what: "no timing marks".into(),
    })?;
    while !last
        .try_is_complete()
        .map_err(Error::driver("cuEventQuery"))?
    {
        if started.elapsed() > ALONE_DEADLINE {
            return Err(Error::Timeout {
                what: "a kernel run alone",
                seconds: ALONE_DEADLINE.as_secs(),
                why: "it waits for work of the step that is not copied with it",
            });
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let mut each = marks
        .windows(2)
        .map(|w| elapsed_ms(&w[0], &w[1]).map(|ms| ms / COPIES as f64))
        .collect::<Result<Vec<f64>>>()?;
    Ok(median(&mut each))
}

/// Measures every kernel node of a captured step (`per_op`: each op's nodes, from a
/// tracked capture) on `stream`.
pub(crate) fn measure(
    plan: &PlanDesc,
    device: &Device,
    stream: &CudaStream,
    per_op: &[OpNodes],
) -> Result<WorkBound> {
    let sms = u32::try_from(device.sm_count()?).unwrap_or(0);
    // One set of marks serves every kernel: each timing waits for its own launches.
    let marks: Vec<CudaEvent> = (0..=LAUNCHES)
        .map(|_| event(device, true))
        .collect::<Result<_>>()?;
    let mut ops = Vec::with_capacity(per_op.len());
    for (i, op) in per_op.iter().enumerate() {
        let name = plan.ops.get(i).map_or("?", |o| o.name);
        let mut work = OpWork {
            name: name.to_string(),
            kernels: Vec::new(),
            other_nodes: 0,
        };
        // A collective's kernels cannot run alone: with more than one rank an NCCL kernel
        // launched without its peers waits for them forever. They are not timed (a world
        // of one captures a copy, no kernel, so nothing is lost there).
        if op.counts.collectives > 0 {
            work.other_nodes += op.nodes.len();
            ops.push(work);
            continue;
        }
        // An `#[every]` op's one kernel counts its replays and sets its conditional node's
        // condition through a handle of the step's graph: copied into a graph of its own
        // that handle is foreign, so it is listed (one thread, nothing to share) but not
        // launched alone. Its body, which runs at every k-th replay only, is not counted.
        let conditional = plan.ops.get(i).is_some_and(|o| o.every.is_some());
        for &node in &op.nodes {
            if node_type(node)? != CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                work.other_nodes += 1;
                continue;
            }
            let what = |e: Error| Error::Measure {
                op: name,
                source: Box::new(e),
            };
            let p = kernel_params(node).map_err(what)?;
            let threads = p.blockDimX * p.blockDimY * p.blockDimZ;
            let func = node_function(&p).map_err(what)?;
            let per_sm = blocks_per_sm(func, threads, p.sharedMemBytes).map_err(what)?;
            let blocks = u64::from(p.gridDimX) * u64::from(p.gridDimY) * u64::from(p.gridDimZ);
            let resident = per_sm * u64::from(sms);
            work.kernels.push(KernelWork {
                name: function_name(func),
                blocks,
                threads,
                resident,
                share: wave_share(blocks, resident),
                grid_share: grid_share(blocks, resident),
                alone_ms: if conditional {
                    0.0
                } else {
                    let clears = preceding_memsets(node).map_err(what)?;
                    time_alone(device, stream, &marks, node, &p, &clears).map_err(what)?
                },
            });
        }
        ops.push(work);
    }
    Ok(WorkBound {
        step: plan.step.to_string(),
        device: device.name().to_string(),
        sms,
        ops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_set_the_planned_step_against_the_larger_of_its_bounds() {
        let b = Bounds {
            planned_ms: 0.74,
            critical_path_ms: 0.5,
            work_ms: 0.4,
            grid_work_ms: 0.6,
            chains: None,
            automatic_ms: None,
        };
        assert_eq!((b.larger_ms(), b.larger_grid_ms()), (0.5, 0.6));
        let rows = b.to_string();
        assert_eq!(rows.lines().count(), 5, "{rows}");
        // The planner's placement, where measured, against the hand plan and the bound.
        let auto = b.with_automatic(0.76).to_string();
        assert!(
            auto.ends_with(
                "| (c-auto) every op placed by the planner | 0.760 | (c-auto)/(c) = 1.027, (c-auto)/max = 1.520 |\n"
            ),
            "{auto}"
        );
        assert!(
            rows.contains("| larger bound, max((d), (w)) | 0.500 | (c)/max = 1.480 |"),
            "{rows}"
        );
        assert!(
            rows.contains(
                "| larger bound with grid shares, max((d), (w')) | 0.600 | (c)/max = 1.233 |"
            ),
            "{rows}"
        );
    }

    #[test]
    fn a_grid_shares_the_gpu_by_blocks_over_its_waves() {
        // Fewer blocks than fit: that fraction of the GPU.
        assert_eq!(wave_share(66, 264), 0.25);
        // Exactly full waves: all of it.
        assert_eq!(wave_share(264, 264), 1.0);
        assert_eq!(wave_share(528, 264), 1.0);
        // One and a half waves: full for one, half for the other.
        assert_eq!(wave_share(396, 264), 0.75);
        // Nothing resident or nothing launched occupies nothing.
        assert_eq!(wave_share(10, 0), 0.0);
        assert_eq!(wave_share(0, 10), 0.0);
        // Whole waves past u64::MAX blocks: a share just below 1, not an overflow.
        let share = wave_share(u64::MAX, 1 << 32);
        assert!(share > 0.999_999 && share <= 1.0, "{share}");
        // The grid share does not average: 1.5 waves are the whole GPU.
        assert_eq!(grid_share(396, 264), 1.0);
        assert_eq!(grid_share(66, 264), 0.25);
        assert_eq!(grid_share(10, 0), 0.0);
    }

    fn kernel(share: f64, alone_ms: f64) -> KernelWork {
        KernelWork {
            name: "k".into(),
            blocks: 1,
            threads: 256,
            resident: 1,
            share,
            grid_share: 1.0,
            alone_ms,
        }
    }

    /// A work bound of step `s` on a test device of 132 SMs: each op's name, kernels
    /// and nodes other than kernels.
    fn work_of(ops: Vec<(&str, Vec<KernelWork>, usize)>) -> WorkBound {
        WorkBound {
            step: "s".into(),
            device: "test".into(),
            sms: 132,
            ops: ops
                .into_iter()
                .map(|(name, kernels, other_nodes)| OpWork {
                    name: name.into(),
                    kernels,
                    other_nodes,
                })
                .collect(),
        }
    }

    #[test]
    fn the_bound_weights_each_kernel_by_its_share_and_the_table_shows_it() {
        let w = work_of(vec![
            ("wide", vec![kernel(1.0, 0.5), kernel(0.5, 0.2)], 1),
            ("narrow", vec![kernel(0.1, 1.0)], 0),
        ]);
        assert!((w.bound_ms() - (0.5 + 0.1 + 0.1)).abs() < 1e-12);
        assert!((w.alone_ms() - 1.7).abs() < 1e-12);
        assert_eq!(w.kernels(), 3);
        let text = w.to_string();
        assert!(text.contains("0.50..1.00"), "{text}");
        assert!((w.grid_bound_ms() - 1.7).abs() < 1e-12);
        assert!(
            text.contains("work bound: 0.700 ms (41% of the kernels' 1.700 ms alone); with grid shares not averaged over waves: 1.700 ms"),
            "{text}"
        );
    }

    #[test]
    fn the_chains_bound_joins_the_plans_chains_with_the_work_between() {
        use crate::plan::{
            AccessDesc, BufId, BufKind, BufferDesc, EventDesc, EventId, OpDesc, OpId, StreamDesc,
            StreamId,
        };
        // `head` writes x; `left` on `side` and `right` on `main` read it; `tail` waits
        // for `left`. `left` and `right` fill the GPU; `head` and `tail` are small.
        static PLAN: PlanDesc = PlanDesc::new("s")
            .with_streams(&[StreamDesc::named("main"), StreamDesc::named("side")])
            .with_buffers(&[
                BufferDesc::new("x", BufKind::Shared),
                BufferDesc::new("y", BufKind::Shared),
            ])
            .with_events(&[
                EventDesc::after(StreamId(0), OpId(0)),
                EventDesc::after(StreamId(1), OpId(1)),
            ])
            .with_ops(&[
                OpDesc::new("head", StreamId(0))
                    .with_accesses(&[AccessDesc::write(BufId(0), 0)])
                    .with_record(EventId(0)),
                OpDesc::new("left", StreamId(1))
                    .with_accesses(&[AccessDesc::read(BufId(0), 0)])
                    .with_waits(&[EventId(0)])
                    .with_record(EventId(1)),
                OpDesc::new("right", StreamId(0)).with_accesses(&[AccessDesc::read(BufId(0), 0)]),
                OpDesc::new("tail", StreamId(0))
                    .with_accesses(&[AccessDesc::write(BufId(1), 0)])
                    .with_waits(&[EventId(1)]),
            ]);
        // `head` is missing: it counts no work.
        let w = work_of(vec![
            ("left", vec![kernel(1.0, 0.5), kernel(0.5, 0.2)], 0),
            ("right", vec![kernel(1.0, 0.6)], 0),
            ("tail", vec![kernel(0.05, 0.2)], 0),
        ]);
        let alone = [0.1, 0.8, 0.7, 0.3];
        let (_, d) = PLAN.longest_path(&alone);
        let b = Bounds::of_plan(2.0, &PLAN, &alone, &w);
        // (d): head, left, tail = 1.2; (w): 0.6 + 0.6 + 0.01 = 1.21. (p): to `head` (0.1),
        // the work of `left` and `right` (1.2), from `tail` (0.3).
        assert!(
            (d - 1.2).abs() < 1e-12 && (b.work_ms - 1.21).abs() < 1e-12,
            "{b:?}"
        );
        let p = b.chains.unwrap();
        assert!((p.ms - 1.6).abs() < 1e-12, "{p:?}");
        assert_eq!((p.head, p.tail), (Some("head"), Some("tail")));
        let rows = b.to_string();
        assert_eq!(rows.lines().count(), 6, "{rows}");
        assert!(
            rows.contains("| (p) chains and the work between: to `head`, work, from `tail` | 1.600 | (c)/(p) = 1.250 |"),
            "{rows}"
        );
        // Without the plan's chains, no row.
        assert_eq!(Bounds::new(2.0, d, &w).to_string().lines().count(), 5);
    }
}
