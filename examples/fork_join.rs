//! Four independent chains of small kernels and a join, written with `#[step]`.
//!
//! Each chain runs `kernels_per_chain` launches of a 16-block kernel: too small to fill
//! the GPU alone, so four chains on four streams overlap. Prints the one-stream graph
//! time, the stepgraph graph time and the ratio (CUDA events around graph replays, after
//! warm-up, medians), the host cost of one replay, and checks the result against a CPU
//! reference computed with the same f32 operations.
//!
//! `cargo run --release --example fork_join [-- --quick]`; with no GPU it prints the
//! plan and says what it would need. `-- --print-plan dot|svg` prints the plan as a
//! picture and exits (`cargo xtask plan fork_join`).

use std::sync::Arc;
use std::time::Instant;

use stepgraph::stats::median;
use stepgraph::{CaptureStream, Device, DeviceBuffer, Result, Schedule};
use stepgraph_kernels::Kernels;
use stepgraph_picture::{print_plan_if_asked, record, timeline_svg, trace_json};

/// Elements per chain: 16 blocks of 256 threads, one element per thread.
const N: usize = 16 * 256;
const CHAINS: usize = 4;

#[stepgraph::step(streams(main, chain[4]), kernels = Kernels)]
mod fork_join {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub seed: DeviceBuffer<f32>,
        #[per_branch]
        pub lanes: [DeviceBuffer<f32>; CHAIN_WIDTH],
        pub total: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub iters: u32,
        pub kernels_per_chain: u32,
    }

    fn seed(stream: &CaptureStream<'_>, k: &Kernels, seed: &mut DeviceBuffer<f32>) -> Result<()> {
        k.fill_affine(stream, seed, 0.25, 1.0 / N as f32)
    }

    /// One chain: start from the seed scaled by the chain's index, then a run of small
    /// kernels, each depending on the last.
    #[stream(chain[d])]
    fn chain(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        d: usize,
        seed: &DeviceBuffer<f32>,
        lanes: &mut DeviceBuffer<f32>,
        iters: u32,
        kernels_per_chain: u32,
    ) -> Result<()> {
        stream.copy(seed, lanes)?;
        k.axpby(stream, seed, lanes, d as f32, 1.0)?;
        for _ in 0..kernels_per_chain {
            k.chain_step(stream, lanes, iters, 0.999, 0.001)?;
        }
        Ok(())
    }

    #[join(chain)]
    fn total(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        lanes: &[DeviceBuffer<f32>; 4],
        total: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.copy(&lanes[0], total)?;
        for lane in &lanes[1..] {
            k.axpby(stream, lane, total, 1.0, 1.0)?;
        }
        Ok(())
    }
}

/// The same computation on the CPU, with the kernels' f32 operation order.
fn reference(iters: u32, kernels_per_chain: u32) -> Vec<f32> {
    let mut seed = vec![0.0f32; N];
    stepgraph_kernels::reference::fill_affine_reference(&mut seed, 0.25, 1.0 / N as f32);
    let mut total = vec![0.0f32; N];
    for d in 0..CHAINS {
        let mut lane = seed.clone();
        stepgraph_kernels::reference::axpby_reference(&seed, &mut lane, d as f32, 1.0);
        for _ in 0..kernels_per_chain {
            stepgraph_kernels::reference::chain_step_reference(&mut lane, iters, 0.999, 0.001);
        }
        if d == 0 {
            total.copy_from_slice(&lane);
        } else {
            stepgraph_kernels::reference::axpby_reference(&lane, &mut total, 1.0, 1.0);
        }
    }
    total
}

fn buffers(device: &Device) -> Result<fork_join::Buffers> {
    // Poisoned with NaN so an element no kernel wrote cannot pass the check.
    let nan = vec![f32::NAN; N];
    Ok(fork_join::Buffers {
        seed: device.upload_new("seed", &nan)?,
        lanes: [
            device.upload_new("lane 0", &nan)?,
            device.upload_new("lane 1", &nan)?,
            device.upload_new("lane 2", &nan)?,
            device.upload_new("lane 3", &nan)?,
        ],
        total: device.upload_new("total", &nan)?,
    })
}

fn main() -> std::process::ExitCode {
    // `--print-plan dot|svg`: how `cargo xtask plan fork_join` draws the plan, no GPU used.
    if let Some(code) = print_plan_if_asked(&fork_join::PLAN) {
        return code;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    println!("{}", fork_join::PLAN);
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!(
                "the timed run needs a CUDA GPU of compute capability 8.0 or newer: {}",
                e.chain()
            );
            return std::process::ExitCode::SUCCESS;
        }
    };
    match run(&device, quick) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fork_join failed: {}", e.chain());
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(device: &Device, quick: bool) -> Result<()> {
    let config = fork_join::Config {
        // About 45 us a kernel on an H100: long enough that four 16-block chains are
        // bound by their own latency, not by the graph's per-node launch cost.
        iters: if quick { 64 } else { 16384 },
        kernels_per_chain: 8,
    };
    let (warmup, reps) = if quick { (2, 5) } else { (50, 500) };
    println!("device: {}", device.name());
    let kernels = Arc::new(Kernels::load(device)?);

    let mut serial = fork_join::Step::with_schedule(
        device,
        kernels.clone(),
        buffers(device)?,
        config,
        Schedule::OneStream,
    )?;
    let mut parallel = fork_join::Step::new(device, kernels, buffers(device)?, config)?;

    let expected = reference(config.iters, config.kernels_per_chain);
    for (name, step) in [("one-stream", &mut serial), ("stepgraph", &mut parallel)] {
        step.replay()?;
        step.wait()?;
        let got = device.download(&step.buffers().total)?;
        let worst = got
            .iter()
            .zip(&expected)
            .map(|(g, e)| {
                if g.is_finite() {
                    (g - e).abs() / e.abs().max(1e-6)
                } else {
                    f32::INFINITY
                }
            })
            .fold(0.0f32, f32::max);
        if worst > 1e-5 {
            return Err(stepgraph::Error::Invalid(format!(
                "{name} graph result differs from the CPU reference: worst relative error {worst:e}"
            )));
        }
        println!("{name:>10} graph matches the CPU reference (worst relative error {worst:.1e})");
    }

    // Read both graphs back from the driver and check them against the plan.
    println!("stepgraph graph: {}", parallel.verify()?);
    println!("one-stream graph: {}", serial.verify()?);

    let one = median(&mut serial.executor().time_replays(warmup, reps)?);
    let many = median(&mut parallel.executor().time_replays(warmup, reps)?);

    // Host cost of one replay: each launch call timed alone, draining the queue every 64
    // launches (untimed) so that a full launch queue never stalls a timed call.
    let launches = if quick { 16 } else { 2048 };
    let mut host_us = Vec::with_capacity(launches);
    for i in 0..launches {
        if i % 64 == 0 {
            parallel.wait()?;
        }
        let t = Instant::now();
        parallel.replay()?;
        host_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    parallel.wait()?;
    let host_us = median(&mut host_us);

    println!(
        "fork_join ({CHAINS} chains x {} kernels of 16 blocks, {} iters each; {} events, {} waits)",
        config.kernels_per_chain,
        config.iters,
        fork_join::PLAN.events.len(),
        fork_join::PLAN.wait_count()
    );
    println!("  one-stream graph : {one:.3} ms (median of {reps})");
    println!("  stepgraph graph  : {many:.3} ms (median of {reps})");
    println!("  speedup          : {:.2}x", one / many);
    println!("  host cost of one replay: {host_us:.2} us (median of {launches} launches)");

    // Where the time went: a second graph with timing events around every op.
    let profile = parallel.profile(if quick { 3 } else { 100 })?;
    println!("{profile}");
    println!(
        "  critical path {:.3} ms vs measured step {many:.3} ms: {:.1}%",
        profile.critical_path_ms(),
        100.0 * profile.critical_path_ms() / many
    );
    // The profile as a record (re-renderable without a GPU), a timeline and a trace, into
    // $OUT when set (as the bench scripts set it), else the current folder.
    if !quick {
        let dir = std::path::PathBuf::from(std::env::var_os("OUT").unwrap_or_else(|| ".".into()));
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            match std::fs::write(&path, text) {
                Ok(()) => println!("  wrote {}", path.display()),
                Err(e) => eprintln!("  could not write {}: {e}", path.display()),
            }
        };
        match record::to_string(&profile) {
            Ok(text) => write("fork_join.profile.json", text),
            Err(e) => eprintln!("  could not record the profile: {e}"),
        }
        write("fork_join.timeline.svg", timeline_svg(&profile));
        match trace_json(&profile) {
            Ok(text) => write("fork_join.trace.json", text),
            Err(e) => eprintln!("  could not write the trace: {e}"),
        }
    }
    Ok(())
}
