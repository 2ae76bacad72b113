use super::*;
use crate::sac::layout::{init_actor, init_critics, initial_rms};
use stepgraph_testkit::Rng;

fn random(rng: &mut Rng, n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|_| (rng.next_f64() * 2.0 - 1.0) * scale)
        .collect()
}

/// The largest difference between `grad` and central differences of `loss` at `params`,
/// relative to the largest gradient, over every `stride`-th parameter and all of `also`.
fn fd_worst(
    params: &[f64],
    grad: &[f64],
    stride: usize,
    also: &[std::ops::Range<usize>],
    loss: impl Fn(&[f64]) -> f64,
) -> f64 {
    let h = 1e-6;
    let scale = grad.iter().fold(0.0f64, |m, g| m.max(g.abs()));
    assert!(scale > 0.0, "a zero gradient checks nothing");
    let mut worst = 0.0f64;
    let picked = (0..params.len())
        .step_by(stride)
        .chain(also.iter().flat_map(|r| r.clone()));
    for p in picked {
        let (mut up, mut down) = (params.to_vec(), params.to_vec());
        up[p] += h;
        down[p] -= h;
        let fd = (loss(&up) - loss(&down)) / (2.0 * h);
        worst = worst.max((fd - grad[p]).abs() / scale);
    }
    worst
}

// Central differences err by O(h^2) and the losses' rounding by 1e-16 / h: both far below
// 1e-6 of the largest gradient (the DQN reference's bound is 1e-7; the actor's loss goes
// through tanh and exp, whose third derivatives are larger).
const FD_BOUND: f64 = 1e-6;

#[test]
fn the_actor_gradient_matches_finite_differences() {
    let mut rng = Rng::new(21);
    let rows = 6;
    let actor = random(&mut rng, AL::PARAMS, 0.3);
    let critics = random(&mut rng, NUM_CRITICS * CL::PARAMS, 0.3);
    let x = random(&mut rng, rows * SAC_OBS, 1.5);
    let eps = random(&mut rng, rows, 1.5);
    let alpha = 0.7;
    let l = actor_loss_and_grad(&actor, &critics, &x, &eps, alpha);
    assert!(
        l.min_critic_gap > 1e-3,
        "a near tie would make the loss kinked"
    );
    let heads = [
        AL::B1.range(),
        AL::B2.range(),
        AL::WMU.offset..AL::PARAMS,
        AL::W1.range(),
    ];
    let worst = fd_worst(&actor, &l.grad, 7, &heads, |p| {
        actor_loss_and_grad(p, &critics, &x, &eps, alpha).loss
    });
    assert!(
        worst < FD_BOUND,
        "largest difference {worst:e} of the largest gradient"
    );
}

#[test]
fn the_critic_gradient_matches_finite_differences() {
    let mut rng = Rng::new(22);
    let rows = 6;
    let critics = random(&mut rng, NUM_CRITICS * CL::PARAMS, 0.3);
    let xa = random(&mut rng, rows * SAC_IN, 1.5);
    let y = random(&mut rng, rows, 2.0);
    let (_, grad) = critic_loss_and_grad(&critics, &xa, &y);
    let second = CL::PARAMS;
    let heads = [
        CL::W1.range(),
        CL::B1.range(),
        CL::B2.range(),
        CL::WQ.offset..CL::PARAMS,
        second + CL::WQ.offset..second + CL::PARAMS,
        second..second + CL::B1.offset + HIDDEN,
    ];
    let worst = fd_worst(&critics, &grad, 5, &heads, |p| {
        critic_loss_and_grad(p, &xa, &y).0
    });
    assert!(
        worst < FD_BOUND,
        "largest difference {worst:e} of the largest gradient"
    );
}

#[test]
fn the_critic_action_gradient_and_the_alpha_gradient_match_finite_differences() {
    let mut rng = Rng::new(23);
    let rows = 5;
    let critic = random(&mut rng, CL::PARAMS, 0.3);
    let xa = random(&mut rng, rows * SAC_IN, 1.5);
    let dq = critic_action_grad(&critic, &xa, rows);
    let h = 1e-6;
    for i in 0..rows {
        let (mut up, mut down) = (xa.clone(), xa.clone());
        up[i * SAC_IN + SAC_OBS] += h;
        down[i * SAC_IN + SAC_OBS] -= h;
        let fd = (critic_forward(&critic, &up, rows).1[i]
            - critic_forward(&critic, &down, rows).1[i])
            / (2.0 * h);
        assert!(
            (fd - dq[i]).abs() < 1e-7 * (1.0 + dq[i].abs()),
            "row {i}: {fd} vs {}",
            dq[i]
        );
    }
    let logp = random(&mut rng, 9, 3.0);
    for la in [-1.3, 0.0, 0.4] {
        let (_, g) = alpha_loss_and_grad(la, &logp, -1.0);
        let fd = (alpha_loss_and_grad(la + h, &logp, -1.0).0
            - alpha_loss_and_grad(la - h, &logp, -1.0).0)
            / (2.0 * h);
        assert!((fd - g).abs() < 1e-8 * (1.0 + g.abs()), "{fd} vs {g}");
    }
}

#[test]
fn the_squashed_gaussian_is_rejaxs() {
    for (mu, ls_raw, eps) in [
        (0.3, -0.5, 0.8),
        (-1.2, 1.0, -0.3),
        (2.0, 5.0, 1.1),
        (0.0, -20.0, 0.5),
    ] {
        let s = squash(mu, ls_raw, eps);
        let ls = f64::clamp(ls_raw, -10.0, 2.0);
        let u: f64 = mu + ls.exp() * eps;
        // log N(u; mu, sigma) - log(1 - tanh(u)^2), written another way.
        let sigma = ls.exp();
        let normal = -0.5 * ((u - mu) / sigma).powi(2)
            - sigma.ln()
            - 0.5 * (2.0 * std::f64::consts::PI).ln();
        // 1 - tanh(u)^2 = 1 / cosh(u)^2, without the cancellation at large u.
        let want = normal + 2.0 * u.cosh().ln();
        assert!(
            (s.logp - want).abs() < 1e-9,
            "{mu} {ls_raw} {eps}: {} vs {want}",
            s.logp
        );
        assert_eq!(s.action, 2.0 * u.tanh());
        assert!(s.action.abs() <= 2.0);
    }
    assert_eq!(squash(0.0, 3.0, 0.0).clip, 0.0);
    assert_eq!(squash(0.0, 2.0, 0.0).clip, 0.5);
    assert_eq!(squash(0.0, 1.9, 0.0).clip, 1.0);
}

#[test]
fn normals_have_mean_zero_and_variance_one() {
    let key = agent_key(5, 0, PURPOSE_SAC_ACTOR, 3);
    let n = 40_000;
    let z: Vec<f64> = (0..n).map(|i| normal(key, i)).collect();
    let mean = z.iter().sum::<f64>() / f64::from(n);
    let var = z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / f64::from(n);
    // Standard errors 0.005 and 0.007; five of them.
    assert!(mean.abs() < 0.025, "mean {mean}");
    assert!((var - 1.0).abs() < 0.035, "variance {var}");
}

#[test]
fn the_statistics_follow_rejaxs_running_mean_and_variance() {
    let mut rng = Rng::new(3);
    let mut rms = initial_rms();
    let envs = 4;
    let mut all = Vec::new();
    for _ in 0..50 {
        let batch = rng.vec(envs * SAC_OBS, -2.0, 3.0);
        update_rms(&mut rms, &batch, envs);
        all.extend(batch);
    }
    // With the initial count 1e-4, the running values are the data's mean and population
    // variance to about 1e-4 / 200 relative, plus f32 rounding.
    let n = all.len() / SAC_OBS;
    for c in 0..SAC_OBS {
        let col: Vec<f64> = (0..n).map(|i| f64::from(all[i * SAC_OBS + c])).collect();
        let mean = col.iter().sum::<f64>() / n as f64;
        let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            (f64::from(rms[RMS_MEAN + c]) - mean).abs() < 1e-4,
            "mean {c}"
        );
        assert!(
            (f64::from(rms[RMS_VAR + c]) - var).abs() < 1e-3 * var,
            "var {c}"
        );
    }
    assert!((rms[RMS_COUNT] - 200.0).abs() < 1e-3);
    // One observation: variance 0 of the batch, so the variance shrinks towards 0.
    let mut one = initial_rms();
    update_rms(&mut one, &[0.5, -0.5, 2.0], 1);
    assert!((one[RMS_MEAN] - 0.5).abs() < 1e-3 && one[RMS_VAR] < 1e-3);
}

#[test]
fn store_writes_the_ring_the_statistics_and_the_next_observations() {
    let (agents, envs, capacity) = (2, 3, 4);
    let rows = agents * capacity;
    let mut replay = HostSacReplay {
        agents,
        capacity,
        obs: vec![0.0; rows * SAC_OBS],
        action: vec![-9.0; rows],
        reward: vec![0.0; rows],
        next_obs: vec![0.0; rows * SAC_OBS],
        done: vec![0; rows],
    };
    let n = agents * envs;
    let mut obs: Vec<f32> = (0..n * SAC_OBS).map(|i| i as f32).collect();
    let before = obs.clone();
    let next: Vec<f32> = (0..n * SAC_OBS).map(|i| 100.0 + i as f32).collect();
    let fin: Vec<f32> = (0..n * SAC_OBS).map(|i| -(i as f32)).collect();
    let actions: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let reward = vec![-1.0; n];
    let step = HostSacStep {
        next_obs: &next,
        final_obs: &fin,
        actions: &actions,
        reward: &reward,
        terminated: &[0; 6],
        truncated: &[0, 0, 1, 0, 1, 0],
    };
    let mut rms: Vec<f32> = (0..agents).flat_map(|_| initial_rms()).collect();
    let mut counters = [5, 0, 3, 0];
    store(
        &mut replay,
        &mut rms,
        &mut obs,
        &step,
        envs,
        &mut counters,
        true,
    );
    assert_eq!(counters, [8, 5, 2, 3]);
    assert_eq!(obs, next);
    // Slots 3, 0, 1 of each ring.
    assert_eq!(replay.action, [0.25, 0.5, -9.0, 0.0, 1.0, 1.25, -9.0, 0.75]);
    assert_eq!(replay.done, [0, 1, 0, 0, 1, 0, 0, 0]);
    assert_eq!(&replay.obs[3 * SAC_OBS..4 * SAC_OBS], &before[0..SAC_OBS]);
    assert_eq!(&replay.next_obs[3 * SAC_OBS..4 * SAC_OBS], &fin[0..SAC_OBS]);
    assert!(rms[RMS_MEAN] > 100.0 && rms[RMS_FLOATS + RMS_MEAN] > 109.0);
}

fn small_problem(seed: u64) -> (SacConfig, SacAgentState, HostSacReplay, Vec<f32>) {
    let cfg = SacConfig {
        batch_size: 16,
        buffer_size: 16,
        ..SacConfig::rejax_pendulum(seed)
    };
    let mut rng = Rng::new(seed);
    let capacity = 16;
    let replay = HostSacReplay {
        agents: 1,
        capacity,
        obs: rng.vec(capacity * SAC_OBS, -1.0, 1.0),
        action: rng.vec(capacity, -2.0, 2.0),
        reward: rng.vec(capacity, -3.0, 0.0),
        next_obs: rng.vec(capacity * SAC_OBS, -1.0, 1.0),
        done: (0..capacity).map(|_| u8::from(rng.below(4) == 0)).collect(),
    };
    let critics = widen(&init_critics(seed, 0));
    let state = SacAgentState {
        actor: widen(&init_actor(seed, 0)),
        targets: critics.clone(),
        critics,
        log_alpha: 0.0,
        actor_m: vec![0.0; AL::PARAMS],
        actor_v: vec![0.0; AL::PARAMS],
        critic_m: vec![0.0; NUM_CRITICS * CL::PARAMS],
        critic_v: vec![0.0; NUM_CRITICS * CL::PARAMS],
        alpha_m: 0.0,
        alpha_v: 0.0,
        t: 0,
    };
    let mut rms = initial_rms().to_vec();
    update_rms(&mut rms, &replay.obs, capacity);
    (cfg, state, replay, rms)
}

#[test]
fn updates_lower_the_critic_loss_and_wait_for_the_fill_and_polyak_always_runs() {
    let (cfg, mut state, replay, rms) = small_problem(5);
    let start = state.clone();
    // The step after this iteration's environments is at the fill: no training yet, but
    // the targets move towards the critics (equal at the start: they stay).
    let gated = [cfg.fill_buffer, cfg.fill_buffer - 1, 0, 16];
    assert_eq!(
        sac_update(&cfg, 0, &mut state, &gated, &rms, &replay, 1),
        None
    );
    assert_eq!(state, start);
    let counters = [cfg.fill_buffer + 1, cfg.fill_buffer, 0, 16];
    let first = sac_update(&cfg, 0, &mut state, &counters, &rms, &replay, 1).expect("trains");
    assert_eq!(state.t, 1);
    assert_ne!(state.actor, start.actor);
    assert_ne!(state.log_alpha, 0.0);
    // The targets took 2 % of the critics' step.
    let k = 100;
    let moved = state.critics[k] - start.critics[k];
    let target_moved = state.targets[k] - start.targets[k];
    assert!((target_moved - f64::from(1.0 - cfg.polyak) * moved).abs() < 1e-12);
    let later = sac_update(&cfg, 0, &mut state, &counters, &rms, &replay, 30).expect("trains");
    assert!(
        later.losses[1] < first.losses[1],
        "critic loss {} then {}",
        first.losses[1],
        later.losses[1]
    );
    assert_eq!(state.t, 31);
    assert!(later.losses.iter().all(|l| l.is_finite()));
}

#[test]
fn acting_samples_in_range_and_draws_by_clock() {
    let cfg = SacConfig::rejax_pendulum(4);
    let (agents, envs) = (2, 20);
    let actor: Vec<f32> = (0..agents as u32).flat_map(|a| init_actor(4, a)).collect();
    let rms: Vec<f32> = (0..agents).flat_map(|_| initial_rms()).collect();
    let mut rng = Rng::new(6);
    let obs = rng.vec(agents * envs * SAC_OBS, -1.0, 1.0);
    let a = act(&cfg, &actor, &rms, &obs, agents, envs, &[7, 0, 0, 0], None);
    assert_eq!(
        a,
        act(&cfg, &actor, &rms, &obs, agents, envs, &[7, 0, 0, 0], None)
    );
    assert_ne!(
        a,
        act(&cfg, &actor, &rms, &obs, agents, envs, &[8, 0, 0, 0], None)
    );
    assert_ne!(
        a,
        act(
            &cfg,
            &actor,
            &rms,
            &obs,
            agents,
            envs,
            &[7, 0, 0, 0],
            Some(7)
        )
    );
    assert!(a.iter().all(|x| x.abs() <= 2.0));
    // An initial policy has a log-std near 0: the actions spread over the range.
    let spread = a.iter().map(|x| x * x).sum::<f64>() / a.len() as f64;
    assert!(spread > 0.2, "{spread}");
}
