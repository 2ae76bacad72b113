//! What `sac --check DIR` writes for `reference.py check`: the config, every state tensor
//! before the first step, and for each step its inputs and outputs, as `.npy` files
//! (`stepgraph_testkit::npy`). The layout is described at the top of `reference.py`.
//!
//! All knowledge of where a tensor sits in [`sac::Buffers`] is in `critics`,
//! [`state`], [`outputs`] and [`inputs`]; everything else goes by the names they give.
//! Critics are numbered from 0 and every per-critic name is built in one loop, so the
//! number of critics is whatever `critics` returns.

use std::path::Path;

use stepgraph::{Device, Result, Schedule};

use crate::host::{DEFAULT_REPLAY, Trainer, losses_line};
use crate::kernels::{Buf, Kernels, LOG_STD_MAX, LOG_STD_MIN, TANH_EPS};
use crate::layers::{Linear, Mlp, Sizes};
use crate::model::{Optim, sac};

/// One tensor of the dump: its file name (without `.npy`), its shape and its buffer.
#[derive(Debug)]
pub struct Tensor<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub buf: &'a Buf,
}

impl<'a> Tensor<'a> {
    fn new(name: impl Into<String>, shape: Vec<usize>, buf: &'a Buf) -> Tensor<'a> {
        Tensor {
            name: name.into(),
            shape,
            buf,
        }
    }
}

/// One critic's buffers.
#[derive(Debug)]
struct Critic<'a> {
    net: &'a Mlp,
    target: &'a Mlp,
    grad: &'a Mlp,
    optim: &'a Optim,
    /// `[1]`: `L_Qi`.
    loss: &'a Buf,
    /// `[B]`: `Qi([s, â])` with Qi as updated in this step, the actor loss's input.
    at_policy: &'a Buf,
}

/// Every critic, in order: the one place that knows the critics' fields.
fn critics(b: &sac::Buffers) -> Vec<Critic<'_>> {
    (0..b.critic.len())
        .map(|i| Critic {
            net: &b.critic[i],
            target: &b.critic_target[i],
            grad: &b.critic_grad[i],
            optim: &b.critic_optim[i],
            loss: &b.critic_pass[i].loss,
            at_policy: &b.critic_actor[i].act.out,
        })
        .collect()
}

/// The number of critics the step trains.
pub fn critic_count(b: &sac::Buffers) -> usize {
    critics(b).len()
}

/// `prefix.l{1,2,3}.{w,b}suffix` of `net`, weights `[out, in]`, biases `[out]`.
fn mlp<'a>(prefix: &str, suffix: &str, net: &'a Mlp) -> Vec<Tensor<'a>> {
    layers(prefix, suffix, [&net.l1, &net.l2, &net.l3])
}

/// Three layers' tensors, named as [`mlp`] names an MLP's.
fn layers<'a>(prefix: &str, suffix: &str, net: [&'a Linear; 3]) -> Vec<Tensor<'a>> {
    let mut out = Vec::new();
    for (l, layer) in net.into_iter().enumerate() {
        let (rows, cols) = (layer.b.len(), layer.w.len() / layer.b.len().max(1));
        let l = l + 1;
        out.push(Tensor::new(
            format!("{prefix}.l{l}.w{suffix}"),
            vec![rows, cols],
            &layer.w,
        ));
        out.push(Tensor::new(
            format!("{prefix}.l{l}.b{suffix}"),
            vec![rows],
            &layer.b,
        ));
    }
    out
}

/// A trained network's parameters and Adam's moments (`NAME.adam_m`, `NAME.adam_v`).
fn trained<'a>(prefix: &str, net: &'a Mlp, optim: &'a Optim) -> Vec<Tensor<'a>> {
    let mut out = mlp(prefix, "", net);
    out.extend(mlp(prefix, ".adam_m", &optim.m));
    out.extend(mlp(prefix, ".adam_v", &optim.v));
    out
}

/// Every tensor a step reads from the step before and writes for the next: for each
/// critic `i` `critic{i}.*` (with its moments) and `critic{i}_target.*`, `actor.*` (with
/// its moments), `log_alpha` (with its moments).
pub fn state(b: &sac::Buffers) -> Vec<Tensor<'_>> {
    let mut out = Vec::new();
    for (i, c) in critics(b).into_iter().enumerate() {
        out.extend(trained(&format!("critic{i}"), c.net, c.optim));
        out.extend(mlp(&format!("critic{i}_target"), "", c.target));
    }
    out.extend(trained("actor", &b.actor_net, &b.actor_optim));
    let t = &b.temperature;
    out.push(Tensor::new("log_alpha", vec![1], &b.log_alpha));
    out.push(Tensor::new("log_alpha.adam_m", vec![1], &t.m));
    out.push(Tensor::new("log_alpha.adam_v", vec![1], &t.v));
    out
}

/// What a step computes besides the state: the losses, every gradient (`NAME.grad`, before
/// clipping), the soft target `y` and each critic's value at the actor's sample
/// (`critic{i}.q_pi`, whose smallest routes the actor's gradient), then the state after it.
pub fn outputs<'a>(b: &'a sac::Buffers, sizes: &Sizes) -> Vec<Tensor<'a>> {
    let mut out = Vec::new();
    for (i, c) in critics(b).into_iter().enumerate() {
        out.push(Tensor::new(format!("critic{i}.loss"), vec![1], c.loss));
        out.extend(mlp(&format!("critic{i}"), ".grad", c.grad));
        out.push(Tensor::new(
            format!("critic{i}.q_pi"),
            vec![sizes.batch],
            c.at_policy,
        ));
    }
    out.push(Tensor::new("actor.loss", vec![1], &b.actor_loss.loss));
    out.extend(layers(
        "actor",
        ".grad",
        [&b.actor_grad_l1, &b.actor_grad_l2, &b.actor_grad_l3],
    ));
    out.push(Tensor::new("alpha.loss", vec![1], &b.alpha_grad.loss));
    out.push(Tensor::new("log_alpha.grad", vec![1], &b.alpha_grad.grad));
    out.push(Tensor::new("y", vec![sizes.batch], &b.y));
    out.extend(state(b));
    out
}

/// What a step read: the batch and the normals it drew (as they are after the replay).
pub fn inputs<'a>(b: &'a sac::Buffers, sizes: &Sizes) -> Vec<Tensor<'a>> {
    let (n, s, a) = (sizes.batch, sizes.obs, sizes.action);
    vec![
        Tensor::new("s", vec![n, s], &b.batch.s),
        Tensor::new("a", vec![n, a], &b.batch.a),
        Tensor::new("r", vec![n], &b.batch.r),
        Tensor::new("s2", vec![n, s], &b.batch.s2),
        Tensor::new("done", vec![n], &b.batch.done),
        Tensor::new("eps", vec![n, a], &b.noise.cur),
        Tensor::new("eps_next", vec![n, a], &b.noise.next),
    ]
}

/// `config.json`: the sizes, the number of critics, MODEL.md's constants as the step uses
/// them, and how the dump was made.
pub fn config_json(
    config: &sac::Config,
    seed: u64,
    critics: usize,
    steps: usize,
    schedule: Schedule,
) -> serde_json::Value {
    let s = config.sizes;
    let h = config.hyper;
    serde_json::json!({
        "batch": s.batch,
        "obs": s.obs,
        "action": s.action,
        "hidden": s.hidden,
        "critics": critics,
        "gamma": config.gamma,
        "tau": config.tau,
        "target_entropy": config.target_entropy,
        "lr": config.lr,
        "beta1": h.beta1,
        "beta2": h.beta2,
        "eps": h.eps,
        "max_norm": h.max_norm,
        "log_std_min": LOG_STD_MIN,
        "log_std_max": LOG_STD_MAX,
        "tanh_eps": TANH_EPS,
        "seed": seed,
        "steps": steps,
        "schedule": schedule_name(schedule),
        "critic_sms": config.critic_sms.to_string(),
    })
}

fn schedule_name(schedule: Schedule) -> &'static str {
    match schedule {
        Schedule::Planned => "planned",
        Schedule::OneStream => "one-stream",
        Schedule::PlannedEqualPriority => "planned-equal-priority",
        Schedule::Automatic => "automatic",
    }
}

fn io_error(e: impl std::fmt::Display) -> stepgraph::Error {
    stepgraph::Error::Invalid(e.to_string())
}

/// Downloads every tensor of `tensors` (after the last replay, one wait) into
/// `dir/NAME.npy`.
fn write(step: &sac::Step, dir: &Path, tensors: &[Tensor<'_>]) -> Result<()> {
    let bufs: Vec<&Buf> = tensors.iter().map(|t| t.buf).collect();
    let values = step.executor().download_many(&bufs)?;
    for (t, v) in tensors.iter().zip(&values) {
        stepgraph_testkit::npy::write(&dir.join(format!("{}.npy", t.name)), &t.shape, v)
            .map_err(|e| io_error(format!("--check: {e}")))?;
    }
    Ok(())
}

/// The seeded step of `config` under `schedule`, replayed `steps` times, each step's
/// inputs and outputs written under `dir` for `reference.py check`.
pub fn run(
    device: &Device,
    kernels: std::sync::Arc<Kernels>,
    config: sac::Config,
    seed: u64,
    schedule: Schedule,
    steps: usize,
    dir: &Path,
) -> Result<()> {
    let sizes = config.sizes;
    let mut trainer =
        Trainer::with_config(device, kernels, config, DEFAULT_REPLAY, seed, schedule)?;
    std::fs::create_dir_all(dir).map_err(|e| io_error(format!("{}: {e}", dir.display())))?;
    let critics = critic_count(trainer.step.buffers());
    let json = config_json(trainer.step.config(), seed, critics, steps, schedule);
    let path = dir.join("config.json");
    std::fs::write(&path, format!("{json:#}\n"))
        .map_err(|e| io_error(format!("{}: {e}", path.display())))?;
    write(
        &trainer.step,
        &dir.join("init"),
        &state(trainer.step.buffers()),
    )?;
    for k in 1..=steps {
        trainer.update()?;
        let b = trainer.step.buffers();
        let at = dir.join(format!("step{k}"));
        write(&trainer.step, &at.join("in"), &inputs(b, &sizes))?;
        write(&trainer.step, &at.join("out"), &outputs(b, &sizes))?;
        println!("check step {k}: {}", losses_line(&trainer.losses()?));
    }
    println!(
        "wrote {}; check it with: python3 examples/sac/reference.py check {}",
        dir.display(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys `reference.py` requires of `config.json` (its `CONFIG_KEYS`).
    #[test]
    fn the_config_has_every_key_the_reference_reads() {
        let c = crate::host::config(Sizes::small());
        let json = config_json(&c, 7, 2, 3, Schedule::OneStream);
        let src = include_str!("../reference.py");
        let at = src
            .find("\nCONFIG_KEYS = (")
            .expect("reference.py defines CONFIG_KEYS");
        let tuple = &src[at..at + src[at..].find(')').expect("the tuple ends")];
        let keys: Vec<&str> = tuple.split('"').skip(1).step_by(2).collect();
        assert!(keys.len() > 10, "{tuple}");
        for k in keys {
            assert!(json.get(k).is_some(), "config.json lacks {k}");
        }
        assert_eq!(json["schedule"], "one-stream");
        assert_eq!(json["critics"], 2);
        assert_eq!(json["target_entropy"], -3.0);
    }
}
