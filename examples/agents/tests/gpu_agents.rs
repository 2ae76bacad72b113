//! GPU tests of the agents' kernels, each against its CPU reference
//! (`stepgraph_agents::reference`) on random data: random parameters, ring contents,
//! counters and Adam state. They need a CUDA GPU and run only with the `gpu-tests`
//! feature.
//!
//! Exact where the kernel's result is an integer or a mirrored f32 operation (actions,
//! ring contents, counters, Polyak); the update within tolerances stated at its test.
#![cfg(feature = "gpu-tests")]

use stepgraph::{CaptureStream, Device, DeviceBuffer, Result};
use stepgraph_agents::reference::{self, Adam, AgentState, HostReplay, HostTransitions};
use stepgraph_agents::{
    ACTIONS, AdamState, COUNTERS, Counter, DqnConfig, DuelingLayout, Kernels, OBS, Replay,
    init_params,
};
use stepgraph_envs::Transitions;
use stepgraph_testkit::Rng;

const P: usize = DuelingLayout::PARAMS;

fn device() -> Device {
    Device::new(0).expect("these tests need a CUDA GPU")
}

fn run(device: &Device, body: impl FnOnce(&CaptureStream<'_>) -> Result<()>) {
    stepgraph::exec::run_once(device, body).expect("the kernel runs");
}

fn up<T: stepgraph::DeviceRepr>(device: &Device, what: &str, data: &[T]) -> DeviceBuffer<T> {
    device.upload_new(what, data).expect("upload")
}

fn down<T: stepgraph::DeviceRepr + Clone + Default>(
    device: &Device,
    b: &DeviceBuffer<T>,
) -> Vec<T> {
    device.download(b).expect("download")
}

/// flax's initial parameters of each agent, moved off them by noise of `scale` (biases
/// included), so no parameter is 0 and the agents differ.
fn random_params(rng: &mut Rng, seed: u64, agents: usize, scale: f32) -> Vec<f32> {
    (0..agents as u32)
        .flat_map(|a| init_params(seed, a))
        .map(|p| p + (rng.next_f32() * 2.0 - 1.0) * scale)
        .collect()
}

fn random_replay(rng: &mut Rng, agents: usize, capacity: usize) -> HostReplay {
    let rows = agents * capacity;
    HostReplay {
        agents,
        capacity,
        obs: rng.vec(rows * OBS, -1.5, 1.5),
        action: (0..rows).map(|_| rng.below(ACTIONS) as i32).collect(),
        reward: rng.vec(rows, 0.0, 1.0),
        next_obs: rng.vec(rows * OBS, -1.5, 1.5),
        done: (0..rows).map(|_| u8::from(rng.below(5) == 0)).collect(),
    }
}

fn upload_replay(device: &Device, host: &HostReplay) -> Replay {
    let mut r = Replay::new(device, host.agents, host.capacity).expect("replay");
    r.upload(device, host).expect("upload");
    r
}

fn download_replay(device: &Device, r: &Replay) -> HostReplay {
    r.download(device).expect("download")
}

/// Actions equal the reference's (same generator), except where the reference acted
/// greedily on Q values closer than the f32 network's rounding (counted, and expected
/// rare: random Q values differ by about 0.1).
fn check_actions(case: &str, got: &[i32], acted: &reference::Acted) {
    let mut near_ties = 0;
    for (i, (&g, &w)) in got.iter().zip(&acted.actions).enumerate() {
        if g == w {
            continue;
        }
        let q = &acted.q[i * ACTIONS..(i + 1) * ACTIONS];
        let gap = (q[0] - q[1]).abs();
        assert!(
            gap < 1e-4,
            "{case}: env {i}: action {g}, expected {w} (Q {q:?})"
        );
        near_ties += 1;
    }
    eprintln!(
        "{case}: {} actions equal, {near_ties} near-ties differ",
        got.len() - near_ties
    );
    assert!(
        near_ties <= got.len() / 100,
        "{case}: {near_ties} near-ties"
    );
}

#[test]
fn gpu_act_matches_the_reference_before_during_and_after_the_schedule() {
    let device = device();
    let k = Kernels::load(&device).expect("kernels load");
    let mut rng = Rng::new(1);
    let (agents, envs) = (3, 37);
    let cfg = DqnConfig {
        num_envs: envs,
        ..DqnConfig::rejax_cartpole(77)
    };
    let params = random_params(&mut rng, 77, agents, 0.05);
    let obs = rng.vec(agents * envs * OBS, -1.0, 1.0);
    let params_d = up(&device, "params", &params);
    let obs_d = up(&device, "obs", &obs);
    // Uniform, at the fill's edge, on the schedule, past it, and a random step.
    let random_step = cfg.fill_buffer + 1 + rng.below(60_000) as u32;
    for step in [
        0,
        cfg.fill_buffer,
        cfg.fill_buffer + 1,
        25_000,
        50_000,
        99_990,
        random_step,
    ] {
        let mut counters = [0u32; COUNTERS];
        counters[Counter::Step.index()] = step;
        for c in [Counter::StepBefore, Counter::Pos, Counter::Size] {
            counters[c.index()] = rng.next_u64() as u32;
        }
        let counters_d = up(&device, "counters", &counters);
        let mut actions = up(&device, "actions", &vec![-7i32; agents * envs]);
        run(&device, |s| {
            k.dqn_act(s, &cfg, &params_d, &obs_d, &counters_d, &mut actions)
        });
        let want = reference::act(&cfg, &params, &obs, agents, envs, &counters, None);
        check_actions(&format!("step {step}"), &down(&device, &actions), &want);
    }
    // Evaluation: its own clock and epsilon (large, so both branches are taken).
    for (clock, epsilon) in [(0u32, 0.005f32), (12_345, 0.3), (7, 0.0)] {
        let cfg = DqnConfig {
            eval_epsilon: epsilon,
            ..cfg
        };
        let clock_d = up(&device, "clock", &[clock]);
        let mut actions = up(&device, "actions", &vec![-7i32; agents * envs]);
        run(&device, |s| {
            k.dqn_act_eval(s, &cfg, &params_d, &obs_d, &clock_d, &mut actions, envs)
        });
        let want = reference::act(
            &cfg,
            &params,
            &obs,
            agents,
            envs,
            &[0; COUNTERS],
            Some((clock, epsilon)),
        );
        check_actions(&format!("eval {clock}"), &down(&device, &actions), &want);
    }
    let mut clock_d = up(&device, "clock", &[41u32]);
    run(&device, |s| k.eval_tick(s, &mut clock_d));
    assert_eq!(down(&device, &clock_d), [42]);
}

#[test]
fn gpu_insert_and_count_fill_and_wrap_the_rings_as_the_reference() {
    let device = device();
    let k = Kernels::load(&device).expect("kernels load");
    let mut rng = Rng::new(2);
    let (agents, envs, capacity) = (3, 10, 23);
    for truncation_is_terminal in [true, false] {
        let cfg = DqnConfig {
            num_envs: envs,
            buffer_size: capacity,
            truncation_is_terminal,
            ..DqnConfig::rejax_cartpole(5)
        };
        let mut host = random_replay(&mut rng, agents, capacity);
        let mut replay = upload_replay(&device, &host);
        // Random counters, a position past the capacity among them (read modulo C).
        let mut counters = [
            rng.next_u64() as u32 % 100_000,
            rng.next_u64() as u32,
            capacity as u32 + 5,
            rng.below(capacity) as u32,
        ];
        let mut counters_d = up(&device, "counters", &counters);
        let n = agents * envs;
        let mut out = Transitions::new(&device, n, OBS).unwrap();
        // Seven steps of 10 wrap a ring of 23 three times.
        for step in 0..7 {
            let obs = rng.vec(n * OBS, -1.0, 1.0);
            let final_obs = rng.vec(n * OBS, -1.0, 1.0);
            let actions: Vec<i32> = (0..n).map(|_| rng.below(ACTIONS) as i32).collect();
            let reward = rng.vec(n, -1.0, 1.0);
            let terminated: Vec<u8> = (0..n).map(|_| u8::from(rng.below(3) == 0)).collect();
            let truncated: Vec<u8> = (0..n).map(|_| u8::from(rng.below(3) == 0)).collect();
            let obs_d = up(&device, "obs", &obs);
            let actions_d = up(&device, "actions", &actions);
            device.upload(&mut out.final_obs, &final_obs).unwrap();
            device.upload(&mut out.reward, &reward).unwrap();
            device.upload(&mut out.terminated, &terminated).unwrap();
            device.upload(&mut out.truncated, &truncated).unwrap();
            run(&device, |s| {
                k.replay_insert(s, &cfg, &obs_d, &actions_d, &out, &counters_d, &mut replay)?;
                k.dqn_count(s, &cfg, &mut counters_d)
            });
            let tr = HostTransitions {
                obs: &obs,
                final_obs: &final_obs,
                actions: &actions,
                reward: &reward,
                terminated: &terminated,
                truncated: &truncated,
            };
            reference::replay_insert(&mut host, &tr, envs, &counters, truncation_is_terminal);
            reference::dqn_count(&mut counters, envs as u32, capacity as u32);
            assert_eq!(down(&device, &counters_d), counters, "step {step}");
            assert!(
                download_replay(&device, &replay) == host,
                "step {step}: the rings differ from the reference's"
            );
        }
        assert_eq!(counters[Counter::Size.index()], capacity as u32);
    }
}

#[test]
fn gpu_polyak_matches_the_reference_bit_for_bit() {
    let device = device();
    let k = Kernels::load(&device).expect("kernels load");
    let mut rng = Rng::new(3);
    let cfg = DqnConfig::rejax_cartpole(0);
    let n = 5 * P;
    let online = rng.vec(n, -1.0, 1.0);
    let mut target = rng.vec(n, -1.0, 1.0);
    let online_d = up(&device, "online", &online);
    let mut target_d = up(&device, "target", &target);
    run(&device, |s| k.polyak(s, &cfg, &online_d, &mut target_d));
    let (keep, mix) = cfg.polyak_coefficients();
    reference::polyak(&online, &mut target, keep, mix);
    let got = down(&device, &target_d);
    assert!(
        got.iter()
            .zip(&target)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}

/// A valid, warm Adam state: `t` steps in, moments of a gradient scale `g`, `v >= m^2`.
fn warm_adam(rng: &mut Rng, g: f32) -> (Vec<f32>, Vec<f32>) {
    let m: Vec<f32> = (0..P).map(|_| (rng.next_f32() * 2.0 - 1.0) * g).collect();
    let v: Vec<f32> = m
        .iter()
        .map(|&m| m * m + (rng.next_f32() + 0.1) * g * g)
        .collect();
    (m, v)
}

/// Five fused updates of three agents against five reference updates each.
///
/// Tolerances: the kernel computes in f32, the reference in f64 from the same inputs.
/// Gradients are sums of 100 rows of products of f32 activations, relatively within
/// about 1e-5 of the f64 ones; with a warm Adam state (v well above the new g^2 c2) a
/// parameter's step, lr m / sqrt(v), moves by lr times that relative error, about 1e-8;
/// storing each new parameter in f32 adds half an ulp, 6e-8 at |p| < 1, per step. Five
/// steps: under 5e-7. The bound is 2e-6 absolute. The warm moments (scale 0.01, below
/// the random data's gradients) leave the new gradient a large part of each step (a step
/// is at most about lr), so a wrong term of the gradient (a wrong sign, the wrong network
/// in the target, a layer's gradient missing) moves parameters by far more than the
/// bound; the test also checks that the parameters moved by more than 1e-3. Moments: within
/// 1e-4 of their scale. The loss: 1e-4 relative.
#[test]
fn gpu_update_with_five_epochs_matches_five_reference_updates() {
    update_matches_the_reference(100, 1000, 1e-3);
}

/// The same with a batch of 3: on Hopper, where an agent's update is a cluster of 4
/// blocks each taking a share of the rows, one block has no rows and adds zeros to the
/// cluster's sums. A step moves a parameter by at most about lr whatever the batch; with
/// 3 rows fewer gradients are large, hence the smaller least move.
#[test]
fn gpu_update_with_a_batch_smaller_than_the_cluster_matches_the_reference() {
    update_matches_the_reference(3, 2000, 1e-5);
}

/// `cfg.epochs` fused updates of three agents at batch `batch` against the reference's,
/// on data drawn from the first well-conditioned seed after `first_seed`; the parameters
/// must have moved by more than `min_move` somewhere.
fn update_matches_the_reference(batch: usize, first_seed: u64, min_move: f64) {
    let device = device();
    let k = Kernels::load(&device).expect("kernels load");
    let (agents, capacity) = (3, 400);
    let mut seed = first_seed;
    // Data whose double-DQN argmax is well-conditioned: every online best action beats
    // the second by more than the f32 rounding (the reference says so before the GPU
    // runs; see UpdateReport::min_argmax_gap).
    let (cfg, params, target, m, v, t, counters, host, want) = loop {
        seed += 1;
        let mut rng = Rng::new(seed);
        let cfg = DqnConfig {
            buffer_size: capacity,
            batch_size: batch,
            ..DqnConfig::rejax_cartpole(seed)
        };
        let params = random_params(&mut rng, seed, agents, 0.05);
        let target = random_params(&mut rng, seed, agents, 0.05);
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for _ in 0..agents {
            let (ma, va) = warm_adam(&mut rng, 0.01);
            m.extend(ma);
            v.extend(va);
        }
        let t: Vec<u32> = (0..agents).map(|_| 40 + rng.below(400) as u32).collect();
        let size = cfg.batch_size as u32 + rng.below(capacity - cfg.batch_size + 1) as u32;
        let counters = [
            cfg.fill_buffer + 10 + rng.below(10_000) as u32,
            cfg.fill_buffer + rng.below(10_000) as u32 + 1,
            rng.below(capacity) as u32,
            size,
        ];
        let host = random_replay(&mut rng, agents, capacity);
        let mut want = Vec::new();
        let mut conditioned = true;
        for (a, &t_a) in t.iter().enumerate() {
            let r = a * P..(a + 1) * P;
            let mut state = AgentState {
                params: reference::widen(&params[r.clone()]),
                adam: Adam {
                    m: reference::widen(&m[r.clone()]),
                    v: reference::widen(&v[r.clone()]),
                    t: t_a,
                },
            };
            let target_a = reference::widen(&target[r]);
            let report = reference::dqn_update(
                &cfg, a as u32, &mut state, &target_a, &counters, &host, cfg.epochs,
            )
            .expect("the update runs");
            conditioned &= report.min_argmax_gap > 1e-4;
            want.push((state, report));
        }
        if conditioned {
            break (cfg, params, target, m, v, t, counters, host, want);
        }
        assert!(
            seed < first_seed + 20,
            "no well-conditioned data in 20 seeds"
        );
    };
    eprintln!("seed {seed}, counters {counters:?}, adam t {t:?}");

    let mut params_d = up(&device, "params", &params);
    let target_d = up(&device, "target", &target);
    let mut adam = AdamState::new(&device, agents).unwrap();
    device.upload(&mut adam.m, &m).unwrap();
    device.upload(&mut adam.v, &v).unwrap();
    device.upload(&mut adam.t, &t).unwrap();
    let counters_d = up(&device, "counters", &counters);
    let replay = upload_replay(&device, &host);
    let mut loss = up(&device, "loss", &vec![f32::NAN; agents]);
    run(&device, |s| {
        k.dqn_update(
            s,
            &cfg,
            &mut params_d,
            &target_d,
            &mut adam,
            &counters_d,
            &replay,
            &mut loss,
        )
    });
    let (got_p, got_m, got_v) = (
        down(&device, &params_d),
        down(&device, &adam.m),
        down(&device, &adam.v),
    );
    let got_t = down(&device, &adam.t);
    let got_loss = down(&device, &loss);
    for (a, (state, report)) in want.iter().enumerate() {
        let r = a * P..(a + 1) * P;
        assert_eq!(got_t[a], t[a] + cfg.epochs, "agent {a}: Adam's count");
        let moved = |i: usize| (f64::from(params[a * P + i]) - state.params[i]).abs();
        let max_move = (0..P).map(moved).fold(0.0, f64::max);
        let p_err = got_p[r.clone()]
            .iter()
            .zip(&state.params)
            .map(|(&g, &w)| (f64::from(g) - w).abs())
            .fold(0.0, f64::max);
        eprintln!("agent {a}: params within {p_err:.2e} (they moved up to {max_move:.2e})");
        assert!(p_err < 2e-6, "agent {a}: parameters off by {p_err:e}");
        assert!(
            max_move > min_move,
            "agent {a}: the update barely moved ({max_move:e})"
        );
        for (what, got, want) in [("m", &got_m, &state.adam.m), ("v", &got_v, &state.adam.v)] {
            let scale = want.iter().fold(0.0f64, |s, w| s.max(w.abs()));
            let err = got[r.clone()]
                .iter()
                .zip(want)
                .map(|(&g, &w)| (f64::from(g) - w).abs())
                .fold(0.0, f64::max);
            eprintln!("agent {a}: {what} within {:.2e} of its scale", err / scale);
            assert!(
                err <= 1e-4 * scale,
                "agent {a}: {what} off by {err:e} (scale {scale:e})"
            );
        }
        let l = f64::from(got_loss[a]);
        assert!(
            (l - report.loss).abs() <= 1e-4 * report.loss,
            "agent {a}: loss {l}, expected {}",
            report.loss
        );
    }
}

#[test]
fn gpu_update_does_nothing_before_the_fill_and_refuses_oversized_batches() {
    let device = device();
    let k = Kernels::load(&device).expect("kernels load");
    let mut rng = Rng::new(9);
    let (agents, capacity) = (2, 200);
    let cfg = DqnConfig {
        buffer_size: capacity,
        ..DqnConfig::rejax_cartpole(9)
    };
    let params = random_params(&mut rng, 9, agents, 0.05);
    let mut params_d = up(&device, "params", &params);
    let target_d = up(&device, "target", &params);
    let mut adam = AdamState::new(&device, agents).unwrap();
    let replay = upload_replay(&device, &random_replay(&mut rng, agents, capacity));
    let mut loss = up(&device, "loss", &[-1.0f32; 2]);
    // The step before this iteration is at the fill: rejax does not train yet.
    let counters_d = up(
        &device,
        "counters",
        &[cfg.fill_buffer + 10, cfg.fill_buffer, 0, capacity as u32],
    );
    run(&device, |s| {
        k.dqn_update(
            s,
            &cfg,
            &mut params_d,
            &target_d,
            &mut adam,
            &counters_d,
            &replay,
            &mut loss,
        )
    });
    assert!(
        down(&device, &params_d)
            .iter()
            .zip(&params)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    assert_eq!(down(&device, &adam.t), [0, 0]);
    assert_eq!(down(&device, &loss), [-1.0, -1.0]);
    // One past the fill trains.
    let counters_d = up(
        &device,
        "counters",
        &[
            cfg.fill_buffer + 10,
            cfg.fill_buffer + 1,
            0,
            capacity as u32,
        ],
    );
    run(&device, |s| {
        k.dqn_update(
            s,
            &cfg,
            &mut params_d,
            &target_d,
            &mut adam,
            &counters_d,
            &replay,
            &mut loss,
        )
    });
    assert_eq!(down(&device, &adam.t), [cfg.epochs, cfg.epochs]);
    assert!(
        down(&device, &loss)
            .iter()
            .all(|l| l.is_finite() && *l > 0.0)
    );
    // A batch past what the block's shared memory holds, or past the ring, is refused
    // before anything is launched.
    let small = upload_replay(&device, &random_replay(&mut rng, agents, 50));
    for (batch, ring) in [(k.max_batch() + 1, &replay), (51, &small)] {
        let big = DqnConfig {
            batch_size: batch,
            buffer_size: ring.capacity(),
            ..cfg
        };
        let err = stepgraph::exec::run_once(&device, |s| {
            k.dqn_update(
                s,
                &big,
                &mut params_d,
                &target_d,
                &mut adam,
                &counters_d,
                ring,
                &mut loss,
            )
        });
        assert!(
            err.is_err(),
            "batch {batch} of a ring of {} was accepted",
            ring.capacity()
        );
    }
}
