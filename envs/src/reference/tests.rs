use std::f64::consts::PI;

use super::*;

#[test]
fn reset_states_lie_in_gymnasium_ranges_and_differ_by_env_and_episode() {
    let mut cart = Vec::new();
    let mut pend = Vec::new();
    for env in 0..64 {
        for episode in 0..64 {
            cart.push(CartPole::reset_state(3, env, episode));
            pend.push(Pendulum::reset_state(3, env, episode));
        }
    }
    for s in &cart {
        assert!(s.iter().all(|v| (-0.05..0.05).contains(v)), "{s:?}");
    }
    for s in &pend {
        assert!(
            (-PI..PI).contains(&s[0]) && (-1.0..1.0).contains(&s[1]),
            "{s:?}"
        );
    }
    // Spread over the range, not bunched: both halves and the edges are reached.
    let thetas: Vec<f64> = pend.iter().map(|s| s[0]).collect();
    let lo = thetas.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = thetas.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    assert!(lo < -3.0 && hi > 3.0, "theta from {lo} to {hi}");
    let mean = cart.iter().map(|s| s[0]).sum::<f64>() / cart.len() as f64;
    assert!(mean.abs() < 0.003, "mean x {mean}");
    // Every (env, episode) its own state.
    let mut xs: Vec<u64> = cart.iter().map(|s| s[0].to_bits()).collect();
    xs.sort_unstable();
    xs.dedup();
    assert_eq!(xs.len(), cart.len());
    // Reproducible for a seed, and another seed gives others.
    assert_eq!(CartPole::reset_state(3, 5, 7), cart[5 * 64 + 7]);
    assert_ne!(CartPole::reset_state(4, 5, 7), cart[5 * 64 + 7]);
}

#[test]
fn uniform_draws_follow_numpys_formula() {
    let key = episode_key(1, 2, 3);
    for d in 0..16 {
        let bits = mix(key.wrapping_add(u64::from(d).wrapping_mul(GAMMA)));
        let u = (bits >> 11) as f64 / 9_007_199_254_740_992.0;
        assert_eq!(episode_uniform(key, d, -2.0, 6.0), -2.0 + 8.0 * u);
    }
    // splitmix64's first output for seed 0 (Vigna's reference implementation).
    assert_eq!(mix(0), 0xE220_A839_7B1D_CDAF);
}

#[test]
fn angle_normalize_maps_to_minus_pi_to_pi_as_numpy_does() {
    let cases = [
        (0.0, 0.0),
        (1.0, 1.0),
        (-1.0, -1.0),
        (PI, -PI),
        (-PI, -PI),
        (3.0 * PI / 2.0, -PI / 2.0),
        (-3.0 * PI / 2.0, PI / 2.0),
        (2.0 * PI + 0.5, 0.5),
        (-2.0 * PI - 0.5, -0.5),
        (101.0, 101.0 - 32.0 * PI),
        (-101.0, -101.0 + 32.0 * PI),
    ];
    for (x, want) in cases {
        let got = angle_normalize(x);
        assert!(
            (got - want).abs() < 1e-12,
            "angle_normalize({x}) = {got}, want {want}"
        );
        assert!((-PI..PI).contains(&got), "angle_normalize({x}) = {got}");
    }
    assert!(angle_normalize(f64::NAN).is_nan());
}

#[test]
fn cartpole_terminates_past_its_thresholds_with_reward_one() {
    let theta = cartpole::THETA_THRESHOLD;
    // Inside and moving out: x reaches 2.4 + tau * 1 > 2.4.
    let (_, r, term) = CartPole::step([2.39, 1.0, 0.0, 0.0], 1);
    assert!(term && r == 1.0);
    // Exactly on the threshold is still alive (gymnasium tests `x > 2.4`).
    let (next, _, term) = CartPole::step([2.4, 0.0, 0.0, 0.0], 0);
    assert_eq!(next[0], 2.4);
    assert!(!term);
    let (_, _, term) = CartPole::step([0.0, 0.0, -theta + 1e-4, -1.0], 0);
    assert!(term);
    let (_, r, term) = CartPole::step([0.0, 0.0, 0.0, 0.0], 0);
    assert!(!term && r == 1.0);
    assert!((theta - 12f64.to_radians()).abs() < 1e-15);
}

#[test]
fn cartpole_pushes_left_on_0_and_right_on_1() {
    let (left, ..) = CartPole::step([0.0; 4], 0);
    let (right, ..) = CartPole::step([0.0; 4], 1);
    assert!(left[1] < 0.0 && right[1] > 0.0, "{left:?} {right:?}");
    assert_eq!(left[1], -right[1]);
}

#[test]
fn an_invalid_cartpole_action_ends_the_episode_with_nan() {
    for action in [-1, 2, i32::MAX] {
        let (next, r, term) = CartPole::step([0.01; 4], action);
        assert!(term && r.is_nan() && next.iter().all(|v| v.is_nan()));
    }
    let mut b = Batch::<CartPole>::new(1, 9);
    let out = b.step(&[2]).unwrap();
    assert!(out.reward[0].is_nan() && out.final_obs.iter().all(|v| v.is_nan()));
    assert_eq!((out.terminated[0], out.truncated[0]), (1, 0));
    // The environment goes on from its next episode.
    assert_eq!(out.obs, {
        let mut o = vec![0.0; 4];
        CartPole::observe(&CartPole::reset_state(9, 0, 1), &mut o);
        o
    });
    assert!(b.last_return[0].is_nan());
}

#[test]
fn pendulum_clips_the_torque_and_the_speed() {
    let s = [0.3, 0.2];
    assert_eq!(Pendulum::step(s, 2.5), Pendulum::step(s, 2.0));
    assert_eq!(Pendulum::step(s, -7.0), Pendulum::step(s, -2.0));
    assert_ne!(Pendulum::step(s, 1.9), Pendulum::step(s, 2.0));
    let (next, ..) = Pendulum::step([PI / 2.0, 7.9], 2.0);
    assert_eq!(next[1], pendulum::MAX_SPEED);
    assert_eq!(next[0], PI / 2.0 + 8.0 * pendulum::DT);
    let (next, ..) = Pendulum::step([-PI / 2.0, -7.9], -2.0);
    assert_eq!(next[1], -pendulum::MAX_SPEED);
    let (next, r, term) = Pendulum::step(s, f32::NAN);
    assert!(next[1].is_nan() && r.is_nan() && !term);
}

#[test]
fn pendulum_reward_is_the_cost_of_the_starting_state() {
    // Upright and still, no torque: no cost.
    assert_eq!(Pendulum::step([0.0, 0.0], 0.0).1, 0.0);
    // Hanging down (theta = pi normalizes to -pi), speed 2, torque 2.
    let (_, r, _) = Pendulum::step([PI, 2.0], 2.0);
    let want = -(PI * PI + 0.1 * 4.0 + 0.001 * 4.0);
    assert!((f64::from(r) - want).abs() < 1e-5, "{r} against {want}");
    // Theta is not wrapped in the state, only in the cost.
    let (a, ra, _) = Pendulum::step([0.5 + 2.0 * PI, 0.0], 0.0);
    let (b, rb, _) = Pendulum::step([0.5, 0.0], 0.0);
    assert!((a[0] - b[0] - 2.0 * PI).abs() < 1e-12);
    assert!((ra - rb).abs() < 1e-6);
}

#[test]
fn pendulum_observes_cos_sin_and_speed() {
    let mut obs = [0.0; 3];
    Pendulum::observe(&[PI / 3.0, -1.5], &mut obs);
    assert!((obs[0] - 0.5).abs() < 1e-7 && (obs[1] - 0.866_025_4).abs() < 1e-6);
    assert_eq!(obs[2], -1.5);
}

#[test]
fn time_limits_truncate_at_500_and_200_steps() {
    // Pendulum never terminates: every episode is truncated at exactly 200.
    let mut b = Batch::<Pendulum>::new(3, 1);
    let mut truncations = Vec::new();
    for t in 1..=1000 {
        let out = b.step(&[0.5, -2.0, 1.0]).unwrap();
        assert_eq!(out.terminated, [0, 0, 0]);
        if out.truncated.contains(&1) {
            assert_eq!(out.truncated, [1, 1, 1], "step {t}");
            truncations.push(t);
        }
    }
    assert_eq!(truncations, [200, 400, 600, 800, 1000]);
    assert_eq!(b.episodes, [5, 5, 5]);
    assert_eq!(b.last_length, [200, 200, 200]);
    assert_eq!(b.length, [0, 0, 0]);

    // CartPole balanced by a linear policy on its observation stays within the
    // thresholds and is truncated by the 500th step.
    let mut b = Batch::<CartPole>::new(1, 1);
    for t in 1..=500 {
        let [x, x_dot, theta, theta_dot] = b.state[0];
        let push = theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0.0;
        let out = b.step(&[i32::from(push)]).unwrap();
        assert_eq!(out.terminated, [0], "step {t}");
        assert_eq!(out.truncated, [u8::from(t == 500)], "step {t}");
    }
    assert_eq!(
        (b.episodes[0], b.last_length[0], b.last_return[0]),
        (1, 500, 500.0)
    );
}

#[test]
fn terminated_and_truncated_on_the_same_step_are_both_set() {
    let mut b = Batch::<CartPole>::with_max_steps(1, 5, 3);
    b.state[0] = [0.0; 4];
    b.step(&[0]).unwrap();
    b.step(&[1]).unwrap();
    b.state[0] = [2.39, 1.0, 0.0, 0.0];
    let out = b.step(&[1]).unwrap();
    assert_eq!((out.terminated[0], out.truncated[0]), (1, 1));
    assert_eq!((b.episodes[0], b.last_length[0]), (1, 3));
}

#[test]
fn auto_reset_keeps_the_final_observation_and_starts_the_next_episode() {
    let seed = 11;
    let mut b = Batch::<CartPole>::new(4, seed);
    let first = b.reset();
    assert_eq!(first.len(), 16);
    let mut returns = [0.0f32; 4];
    let mut lengths = [0u32; 4];
    let mut ended = 0;
    for t in 0..400u32 {
        let actions: Vec<i32> = (0..4).map(|i| ((t * 7 + i * 3) % 5 < 2) as i32).collect();
        let before = b.clone();
        let out = b.step(&actions).unwrap();
        for i in 0..4 {
            returns[i] += out.reward[i];
            lengths[i] += 1;
            let (want_next, ..) = CartPole::step(before.state[i], actions[i]);
            let mut want_final = [0.0f32; 4];
            CartPole::observe(&want_next, &mut want_final);
            assert_eq!(out.final_obs[4 * i..4 * i + 4], want_final);
            if out.terminated[i] == 1 || out.truncated[i] == 1 {
                ended += 1;
                let episode = before.episodes[i] + 1;
                assert_eq!(b.episodes[i], episode);
                assert_eq!(
                    b.state[i],
                    CartPole::reset_state(seed, i as u64, u64::from(episode))
                );
                let mut want_obs = [0.0f32; 4];
                CartPole::observe(&b.state[i], &mut want_obs);
                assert_eq!(out.obs[4 * i..4 * i + 4], want_obs);
                assert_ne!(out.obs[4 * i..4 * i + 4], out.final_obs[4 * i..4 * i + 4]);
                assert_eq!(
                    (b.last_return[i], b.last_length[i]),
                    (returns[i], lengths[i])
                );
                assert_eq!((b.ret[i], b.length[i]), (0.0, 0));
                returns[i] = 0.0;
                lengths[i] = 0;
            } else {
                assert_eq!(out.obs[4 * i..4 * i + 4], out.final_obs[4 * i..4 * i + 4]);
                assert_eq!((b.ret[i], b.length[i]), (returns[i], lengths[i]));
                assert_eq!(b.episodes[i], before.episodes[i]);
            }
        }
    }
    assert!(ended >= 8, "only {ended} episodes ended");
    // A reset starts over: episode 0, statistics zeroed, the same first observations.
    assert_eq!(b.reset(), first);
    assert_eq!(
        (b.episodes.clone(), b.last_return.clone()),
        (vec![0; 4], vec![0.0; 4])
    );
}

#[test]
fn a_step_with_the_wrong_number_of_actions_is_an_error() {
    let mut b = Batch::<Pendulum>::new(2, 0);
    let err = b.step(&[0.0; 3]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LengthMismatch {
                expected: 2,
                found: 3,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(b.length, [0, 0], "nothing moved");
}
