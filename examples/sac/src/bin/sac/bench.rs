//! `sac --bench DIR`: the step's variants and its bounds, timed on one GPU in one run.
//!
//! (a) eager on one stream, (b) the one-stream graph, (c) the planned graph, (d) the
//! critical path of the plan with every op at its time alone, (w) the work bound (every
//! kernel alone, weighted by the share of the GPU its grid occupies), and (c) A/B against
//! the critics' matmuls planned for another SM target (`--critic-sms`). Medians of CUDA
//! event timings over `replays` replays after warm-up; (a) is timed on the host around
//! each eager step and its wait, as a training loop would see it. The planned step's
//! profile is written as a record (`cargo xtask render-profile` draws it), a timeline SVG
//! and a Chrome trace; the figures as `sac_bench.json`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use stepgraph::stats::{Bounds, median};
use stepgraph::{Device, Error, Result, Schedule, SmTarget};
use stepgraph_sac::host::Trainer;
use stepgraph_sac::kernels::Kernels;
use stepgraph_sac::model::{CRITICS, sac};

/// Warm-up replays before each timing.
const WARMUP: usize = 30;

/// Writes `text` to `dir/name`, saying which file could not be written.
fn write(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text)
        .map_err(|e| Error::Invalid(format!("could not write {}: {e}", path.display())))
}

/// The critics' SM target the A/B compares `sms` with: their share against the whole
/// GPU, the whole GPU against anything else.
fn other_sms(sms: SmTarget) -> SmTarget {
    match sms {
        SmTarget::Whole => SmTarget::Share(CRITICS as u32),
        _ => SmTarget::Whole,
    }
}

/// Times every variant and bound of `config` over `replays` replays; writes the records
/// into `dir`.
pub fn run(
    device: &Device,
    kernels: &Arc<Kernels>,
    config: sac::Config,
    replay: usize,
    seed: u64,
    replays: usize,
    dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Invalid(format!("could not create {}: {e}", dir.display())))?;
    let sizes = config.sizes;
    let trainer = |config, schedule| {
        Trainer::with_config(device, kernels.clone(), config, replay, seed, schedule)
    };
    let mut planned = trainer(config, Schedule::Planned)?;
    let mut serial = trainer(config, Schedule::OneStream)?;
    // A few real updates first, so that the timed state is a trained one (the values
    // replayed below do not change the kernels' work: every size is fixed).
    for _ in 0..10 {
        planned.update()?;
        serial.update()?;
    }
    let c = median(&mut planned.step.executor().time_replays(WARMUP, replays)?);
    let b = median(&mut serial.step.executor().time_replays(WARMUP, replays)?);
    // The planned step with the declared stream priorities ignored: what they buy.
    let c_flat = {
        let mut flat = trainer(config, Schedule::PlannedEqualPriority)?;
        flat.update()?;
        median(&mut flat.step.executor().time_replays(WARMUP, replays)?)
    };
    // The same ops placed wholly by the planner (`compare(auto)`), from the costs file.
    let c_auto = {
        let mut auto = trainer(config, Schedule::Automatic)?;
        auto.update()?;
        median(&mut auto.step.executor().time_replays(WARMUP, replays)?)
    };
    // A/B in this call: the planned step with the critics' matmuls planned the other way,
    // alternated with this one twice.
    let other = other_sms(config.critic_sms);
    // A step the other target cannot build (cuBLASLt may have no algorithm planned for
    // it) leaves the A/B out with the reason; the figures of this target stand.
    let alt = trainer(
        sac::Config {
            critic_sms: other,
            ..config
        },
        Schedule::Planned,
    )
    .and_then(|mut alt| alt.update().map(|()| alt));
    let (c_this, c_other) = match alt {
        Err(e) => {
            println!(
                "A/B against the critics planned for {other} SMs left out: {}",
                e.chain()
            );
            (Vec::new(), Vec::new())
        }
        Ok(alt) => {
            let mut this = Vec::new();
            let mut that = Vec::new();
            for _ in 0..2 {
                that.push(median(
                    &mut alt.step.executor().time_replays(WARMUP, replays)?,
                ));
                this.push(median(
                    &mut planned.step.executor().time_replays(WARMUP, replays)?,
                ));
            }
            (this, that)
        }
    };
    for _ in 0..WARMUP {
        serial.update_eager()?;
    }
    serial.step.wait()?;
    let mut eager = Vec::with_capacity(replays);
    for _ in 0..replays {
        let t = Instant::now();
        serial.update_eager()?;
        serial.step.wait()?;
        eager.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let a = median(&mut eager);
    // Each op alone: the one-stream profile runs one op at a time.
    let alone = serial.step.profile(50)?;
    let (path, d) = sac::PLAN.longest_path(&alone.durations_ms());
    let path: Vec<&str> = path.iter().map(|o| sac::PLAN.ops[o.index()].name).collect();
    let profile = planned.step.profile(50)?;
    println!("{profile}");
    println!("critical path (ops alone): {}", path.join(" -> "));
    print!("{}", profile.contention_table(&alone));
    // The work bound last: it runs every kernel many times over on the one-stream step's
    // buffers, whose values are not used again.
    let work = serial.step.work_bound()?;
    println!("{work}");
    // The measured costs, as the file `compare(auto)` reads (`examples/sac/src/sac.costs`).
    write(dir, "sac.costs", &work.op_costs().to_string())?;
    // Where the heavier ops' time goes, kernel by kernel.
    for op in work.ops.iter().filter(|o| o.alone_ms() >= 0.02) {
        print!("{}", work.kernel_table(&op.name));
    }
    let bounds =
        Bounds::of_plan(c, &sac::PLAN, &alone.durations_ms(), &work).with_automatic(c_auto);
    println!(
        "sac bench: batch {} obs {} action {} hidden {}, {CRITICS} critics planned for {} SMs, \
         {replays} replays",
        sizes.batch, sizes.obs, sizes.action, sizes.hidden, config.critic_sms
    );
    println!("| variant | median ms | ratio |");
    println!("| --- | --- | --- |");
    println!(
        "| (a) eager, one stream | {a:.3} | (a)/(c) = {:.3} |",
        a / c
    );
    println!("| (b) one-stream graph | {b:.3} | (b)/(c) = {:.3} |", b / c);
    println!("| (c) stepgraph graph | {c:.3} | |");
    println!(
        "| (c') stepgraph graph, equal stream priorities | {c_flat:.3} | (c)/(c') = {:.3} |",
        c / c_flat
    );
    println!(
        "(c-auto) saves {:.0}% of what (c) saves over (b)",
        100.0 * (b - c_auto) / (b - c)
    );
    let pair = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !c_this.is_empty() {
        println!(
            "| A/B: (c) with the critics planned for {} SMs, then for {other} SMs, twice | {} against {} | |",
            config.critic_sms,
            pair(&c_this),
            pair(&c_other)
        );
    }
    print!("{bounds}");
    let (w, wg) = (bounds.work_ms, bounds.grid_work_ms);
    let p = bounds.chains.map_or(0.0, |p| p.ms);
    let json = format!(
        "{{\"batch\": {}, \"obs\": {}, \"action\": {}, \"hidden\": {}, \"critics\": {CRITICS}, \
         \"critic_sms\": \"{}\", \"other_critic_sms\": \"{other}\", \"planned_ab_ms\": [{}], \
         \"planned_other_sms_ab_ms\": [{}], \"replays\": {replays}, \"eager_ms\": {a}, \"one_stream_graph_ms\": {b}, \
         \"planned_ms\": {c}, \"planned_equal_priority_ms\": {c_flat}, \"auto_ms\": {c_auto}, \"critical_path_ms\": {d}, \"work_bound_ms\": {w}, \"grid_work_bound_ms\": {wg}, \"chains_bound_ms\": {p}, \
         \"planned_over_bound\": {}, \"critical_path\": [{}]}}\n",
        sizes.batch,
        sizes.obs,
        sizes.action,
        sizes.hidden,
        config.critic_sms,
        pair(&c_this),
        pair(&c_other),
        c / bounds.larger_ms(),
        path.iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    write(dir, "sac_bench.json", &json)?;
    let record = stepgraph_picture::record::to_string(&profile)
        .map_err(|e| Error::Invalid(format!("could not record the profile: {e}")))?;
    write(dir, "sac.profile.json", &record)?;
    write(
        dir,
        "sac.timeline.svg",
        &stepgraph_picture::timeline_svg(&profile),
    )?;
    let trace = stepgraph_picture::trace_json(&profile)
        .map_err(|e| Error::Invalid(format!("could not write the trace: {e}")))?;
    write(dir, "sac.trace.json", &trace)
}
