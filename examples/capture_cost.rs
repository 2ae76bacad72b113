//! Host-side cost of a large step: capture plus instantiate of a 500-op step, and the
//! host cost of one replay, through the runtime's low-level API (a plan built at run
//! time, the same executor the macro's `Step` uses).
//!
//! 4 chains x 125 ops of one small kernel each, every chain on its own stream, forked
//! from capture begin and joined at the end.
//!
//! `cargo run --release --example capture_cost`

use std::time::Instant;

use stepgraph::exec::{Executor, Issue};
use stepgraph::plan::{
    AccessDesc, BufId, BufKind, BufferDesc, EventDesc, EventId, OpDesc, OpId, PlanDesc, StreamDesc,
    StreamId,
};
use stepgraph::stats::median;
use stepgraph::{Device, DeviceBuffer, Result, Schedule};
use stepgraph_kernels::Kernels;

const CHAINS: usize = 4;
const OPS_PER_CHAIN: usize = 125;

fn leak<T>(v: Vec<T>) -> &'static [T] {
    Vec::leak(v)
}

/// The plan the macro would produce for this shape: chain c's first op waits on the
/// capture-begin event (0), its last op records event c + 1, the origin joins all four.
fn plan() -> &'static PlanDesc {
    let streams = leak(
        std::iter::once("main".to_string())
            .chain((0..CHAINS).map(|c| format!("chain[{c}]")))
            .map(|n| StreamDesc::named(Box::leak(n.into_boxed_str())))
            .collect(),
    );
    let buffers = leak(
        (0..CHAINS)
            .map(|_| BufferDesc::new("lane", BufKind::Shared))
            .collect(),
    );
    let mut ops = Vec::new();
    let mut events = vec![EventDesc::at_capture_begin()];
    for c in 0..CHAINS {
        for i in 0..OPS_PER_CHAIN {
            let id = ops.len();
            let last = i + 1 == OPS_PER_CHAIN;
            let stream = StreamId(c as u16 + 1);
            let name = Box::leak(format!("step[{c}][{i}]").into_boxed_str());
            let mut op = OpDesc::new(name, stream)
                .with_func("step")
                .with_accesses(leak(vec![AccessDesc::write(BufId(c as u16), 0)]));
            if i == 0 {
                op = op.with_waits(&[EventId(0)]);
            }
            if last {
                events.push(EventDesc::after(stream, OpId(id as u32)));
                op = op.with_record(EventId(c as u16 + 1));
            }
            ops.push(op);
        }
    }
    let final_waits = leak((1..=CHAINS as u16).map(EventId).collect());
    Box::leak(Box::new(
        PlanDesc::new("capture_cost")
            .with_streams(streams)
            .with_buffers(buffers)
            .with_ops(leak(ops))
            .with_events(leak(events))
            .with_final_waits(final_waits),
    ))
}

fn main() -> std::process::ExitCode {
    // `--print-plan dot|svg`: how `cargo xtask plan capture_cost` draws the plan.
    if let Some(code) = stepgraph_picture::print_plan_if_asked(plan()) {
        return code;
    }
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!(
                "capture_cost needs a CUDA GPU of compute capability 8.0 or newer: {}",
                e.chain()
            );
            return std::process::ExitCode::SUCCESS;
        }
    };
    match run(&device) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("capture_cost failed: {}", e.chain());
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(device: &Device) -> Result<()> {
    let plan = plan();
    let kernels = Kernels::load(device)?;
    let init: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut lanes: Vec<DeviceBuffer<f32>> = (0..CHAINS)
        .map(|_| device.upload_new("lane", &init))
        .collect::<Result<_>>()?;

    // Every op: eight chain steps on its lane.
    let mut issue_all = |issue: &Issue<'_>| {
        for (i, op) in plan.ops.iter().enumerate() {
            let lane = &mut lanes[op.accesses[0].buf.index()];
            issue.op(OpId(i as u32), |s| {
                kernels.chain_step(s, lane, 8, 0.999, 0.001)
            })?;
        }
        Ok(())
    };
    let mut capture_ms = Vec::new();
    let mut exec = None;
    for _ in 0..7 {
        // A fresh executor each time: the first capture of a step instantiates its graph.
        let mut e = Executor::new(device, plan, Schedule::Planned)?;
        let t = Instant::now();
        e.capture(&mut issue_all)?;
        capture_ms.push(t.elapsed().as_secs_f64() * 1e3);
        exec = Some(e);
    }
    let Some(mut exec) = exec else { return Ok(()) };
    // Read the graph back and check it against the plan (on by default in debug builds).
    let report = exec.verify(&mut issue_all)?;
    println!("{report}");
    let counts = exec.node_counts()?;
    let device_ms = median(&mut exec.time_replays(20, 200)?);

    let mut host_us = Vec::new();
    for i in 0..2048 {
        if i % 64 == 0 {
            exec.wait()?;
        }
        let t = Instant::now();
        exec.replay()?;
        host_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    exec.wait()?;

    println!("device: {}", device.name());
    println!(
        "capture_cost: {} ops on {} streams, {} kernel nodes, {} waits",
        plan.ops.len(),
        plan.streams.len(),
        counts.kernels,
        plan.wait_count()
    );
    println!(
        "  dry pass + capture + instantiate + upload: {:.2} ms (median of {}), min {:.2} ms",
        median(&mut capture_ms.clone()),
        capture_ms.len(),
        capture_ms.iter().copied().fold(f64::INFINITY, f64::min)
    );
    println!(
        "  host cost of one replay: {:.2} us (median of {})",
        median(&mut host_us.clone()),
        host_us.len()
    );
    println!("  device time of one replay: {device_ms:.3} ms (median of 200)");
    Ok(())
}
