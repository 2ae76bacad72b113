//! GPU tests of the environments' kernels against the CPU reference
//! (`stepgraph_envs::reference`), for 1 to 4096 environments: the reset, one step from
//! random states, actions and statistics (terminations, truncations, auto-resets and
//! invalid actions among them), many steps in a row, and a rollout captured as a step's
//! graph. They need a CUDA GPU and run only with the `gpu-tests` feature.
//!
//! Each step is compared from the same state on both sides: after a step the reference
//! takes the GPU's state, so a `sin` or `cos` that CUDA rounds differently from the
//! host's libm (within 2 ulp) shows as that ulp, not as an unstable trajectory's growth
//! of it. States must agree within 1e-12 (relative, absolute below 1), observations
//! within 1e-6 (the same), and everything else (rewards, flags, statistics) exactly.
#![cfg(feature = "gpu-tests")]

use stepgraph::{CaptureStream, Device, DeviceBuffer, DeviceRepr, Error, Result};
use stepgraph_envs::reference::{self, Batch, Outputs, Physics};
use stepgraph_envs::{CartPole, Kernels, Pendulum, Transitions};
use stepgraph_testkit::Rng;

/// Sizes around a block of 256 threads, and a large one.
const SIZES: [usize; 7] = [1, 2, 3, 255, 256, 257, 4096];

fn device() -> Device {
    Device::new(0).expect("these tests need a CUDA GPU")
}

fn run(device: &Device, body: impl FnOnce(&CaptureStream<'_>) -> Result<()>) {
    stepgraph::exec::run_once(device, body).expect("the kernel runs");
}

/// An environment batch of this crate and its reference, for the generic tests.
trait GpuEnv: Sized {
    type Ref: Physics<Action = Self::Action>;
    type Action: DeviceRepr + Copy + Default + std::fmt::Debug;
    const NAME: &'static str;

    fn alloc(device: &Device, n: usize, seed: u64, max_steps: u32) -> Result<Self>;
    fn reset(&mut self, k: &Kernels, s: &CaptureStream<'_>, out: &mut Transitions) -> Result<()>;
    fn step(
        &mut self,
        k: &Kernels,
        s: &CaptureStream<'_>,
        actions: &DeviceBuffer<Self::Action>,
        out: &mut Transitions,
    ) -> Result<()>;
    fn parts(&mut self) -> (&mut DeviceBuffer<f64>, &mut stepgraph_envs::EpisodeStats);
    /// A random state, some of them past a termination threshold after a step.
    fn random_state(rng: &mut Rng) -> Vec<f64>;
    /// A random action, now and then an invalid one.
    fn random_action(rng: &mut Rng) -> Self::Action;
}

impl GpuEnv for CartPole {
    type Ref = reference::CartPole;
    type Action = i32;
    const NAME: &'static str = "CartPole";

    fn alloc(device: &Device, n: usize, seed: u64, max_steps: u32) -> Result<Self> {
        CartPole::with_max_steps(device, n, seed, max_steps)
    }
    fn reset(&mut self, k: &Kernels, s: &CaptureStream<'_>, out: &mut Transitions) -> Result<()> {
        k.cartpole_reset(s, self, out)
    }
    fn step(
        &mut self,
        k: &Kernels,
        s: &CaptureStream<'_>,
        actions: &DeviceBuffer<i32>,
        out: &mut Transitions,
    ) -> Result<()> {
        k.cartpole_step(s, self, actions, out)
    }
    fn parts(&mut self) -> (&mut DeviceBuffer<f64>, &mut stepgraph_envs::EpisodeStats) {
        (&mut self.state, &mut self.stats)
    }
    fn random_state(rng: &mut Rng) -> Vec<f64> {
        vec![
            rng.next_f64() * 5.0 - 2.5,
            rng.next_f64() * 6.0 - 3.0,
            rng.next_f64() * 0.5 - 0.25,
            rng.next_f64() * 6.0 - 3.0,
        ]
    }
    fn random_action(rng: &mut Rng) -> i32 {
        match rng.below(100) {
            0 => 2,
            1 => -1,
            k => (k % 2) as i32,
        }
    }
}

impl GpuEnv for Pendulum {
    type Ref = reference::Pendulum;
    type Action = f32;
    const NAME: &'static str = "Pendulum";

    fn alloc(device: &Device, n: usize, seed: u64, max_steps: u32) -> Result<Self> {
        Pendulum::with_max_steps(device, n, seed, max_steps)
    }
    fn reset(&mut self, k: &Kernels, s: &CaptureStream<'_>, out: &mut Transitions) -> Result<()> {
        k.pendulum_reset(s, self, out)
    }
    fn step(
        &mut self,
        k: &Kernels,
        s: &CaptureStream<'_>,
        actions: &DeviceBuffer<f32>,
        out: &mut Transitions,
    ) -> Result<()> {
        k.pendulum_step(s, self, actions, out)
    }
    fn parts(&mut self) -> (&mut DeviceBuffer<f64>, &mut stepgraph_envs::EpisodeStats) {
        (&mut self.state, &mut self.stats)
    }
    fn random_state(rng: &mut Rng) -> Vec<f64> {
        // Unwrapped angles and speeds past the clip.
        vec![rng.next_f64() * 40.0 - 20.0, rng.next_f64() * 20.0 - 10.0]
    }
    fn random_action(rng: &mut Rng) -> f32 {
        if rng.below(200) == 0 {
            f32::NAN
        } else {
            (rng.next_f64() * 6.0 - 3.0) as f32
        }
    }
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got.is_nan() && want.is_nan()) || (got - want).abs() <= tol * want.abs().max(1.0)
}

fn check_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(close(g, w, tol), "{what}[{i}]: GPU {g:e}, reference {w:e}");
    }
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    let bits = |x: &[f32]| {
        x.iter()
            .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(got), bits(want), "{what}");
}

/// The GPU batch's contents as a reference batch.
fn download<E: GpuEnv>(device: &Device, env: &mut E, seed: u64, max_steps: u32) -> Batch<E::Ref>
where
    for<'a> <E::Ref as Physics>::State: TryFrom<&'a [f64]>,
{
    let (state, stats) = env.parts();
    let flat = device.download(&*state).unwrap();
    let width = flat.len() / stats.length.len();
    let state = flat
        .chunks_exact(width)
        .map(|c| match <E::Ref as Physics>::State::try_from(c) {
            Ok(s) => s,
            Err(_) => unreachable!("chunks of the state's width"),
        })
        .collect();
    Batch {
        state,
        length: device.download(&stats.length).unwrap(),
        ret: device.download(&stats.ret).unwrap(),
        episodes: device.download(&stats.episodes).unwrap(),
        last_return: device.download(&stats.last_return).unwrap(),
        last_length: device.download(&stats.last_length).unwrap(),
        seed,
        max_steps,
    }
}

/// Everything the GPU holds after a step against the reference's, as the module docs
/// say.
fn check_step<P: Physics>(
    what: &str,
    gpu: &Batch<P>,
    want: &Batch<P>,
    out: &Outputs,
    want_out: &Outputs,
) {
    let flat = |b: &Batch<P>| {
        b.state
            .iter()
            .flat_map(|s| s.as_ref().to_vec())
            .collect::<Vec<f64>>()
    };
    check_close(&format!("{what}: state"), &flat(gpu), &flat(want), 1e-12);
    check_close(
        &format!("{what}: obs"),
        &widen(&out.obs),
        &widen(&want_out.obs),
        1e-6,
    );
    check_close(
        &format!("{what}: final_obs"),
        &widen(&out.final_obs),
        &widen(&want_out.final_obs),
        1e-6,
    );
    same_bits(&format!("{what}: reward"), &out.reward, &want_out.reward);
    assert_eq!(out.terminated, want_out.terminated, "{what}: terminated");
    assert_eq!(out.truncated, want_out.truncated, "{what}: truncated");
    assert_eq!(gpu.length, want.length, "{what}: length");
    same_bits(&format!("{what}: ret"), &gpu.ret, &want.ret);
    assert_eq!(gpu.episodes, want.episodes, "{what}: episodes");
    same_bits(
        &format!("{what}: last_return"),
        &gpu.last_return,
        &want.last_return,
    );
    assert_eq!(gpu.last_length, want.last_length, "{what}: last_length");
}

fn outputs(device: &Device, out: &Transitions) -> Outputs {
    Outputs {
        obs: device.download(&out.obs).unwrap(),
        final_obs: device.download(&out.final_obs).unwrap(),
        reward: device.download(&out.reward).unwrap(),
        terminated: device.download(&out.terminated).unwrap(),
        truncated: device.download(&out.truncated).unwrap(),
    }
}

fn reset_matches<E: GpuEnv>()
where
    for<'a> <E::Ref as Physics>::State: TryFrom<&'a [f64]>,
{
    let device = device();
    let k = Kernels::load(&device).unwrap();
    for n in SIZES {
        let seed = 1000 + n as u64;
        let max = <E::Ref as Physics>::MAX_EPISODE_STEPS;
        let mut env = E::alloc(&device, n, seed, max).unwrap();
        let mut out = Transitions::new(&device, n, <E::Ref as Physics>::OBS).unwrap();
        // Statistics and state that the reset must overwrite.
        {
            let (state, stats) = env.parts();
            let len = state.len();
            device.upload(state, &vec![f64::NAN; len]).unwrap();
            device.upload(&mut stats.length, &vec![7; n]).unwrap();
            device.upload(&mut stats.ret, &vec![3.0; n]).unwrap();
            device.upload(&mut stats.episodes, &vec![9; n]).unwrap();
            device
                .upload(&mut stats.last_return, &vec![-1.0; n])
                .unwrap();
            device.upload(&mut stats.last_length, &vec![5; n]).unwrap();
        }
        run(&device, |s| env.reset(&k, s, &mut out));
        let gpu = download(&device, &mut env, seed, max);
        let mut want = Batch::<E::Ref>::new(n, seed);
        let want_obs = want.reset();
        let what = format!("{} reset, n = {n}", E::NAME);
        // The generator is integer arithmetic and one rounded multiply-add: bit for bit.
        assert_eq!(gpu.state, want.state, "{what}: state");
        check_close(
            &format!("{what}: obs"),
            &widen(&device.download(&out.obs).unwrap()),
            &widen(&want_obs),
            1e-6,
        );
        assert_eq!(gpu.length, vec![0; n], "{what}");
        assert_eq!(gpu.ret, vec![0.0; n], "{what}");
        assert_eq!(gpu.episodes, vec![0; n], "{what}");
        assert_eq!(gpu.last_return, vec![0.0; n], "{what}");
        assert_eq!(gpu.last_length, vec![0; n], "{what}");
    }
}

#[test]
fn gpu_cartpole_reset_matches_the_reference() {
    reset_matches::<CartPole>();
}

#[test]
fn gpu_pendulum_reset_matches_the_reference() {
    reset_matches::<Pendulum>();
}

/// One step from random states, lengths (some one short of the limit), returns and
/// episode counts, with random actions.
fn random_step_matches<E: GpuEnv>()
where
    for<'a> <E::Ref as Physics>::State: TryFrom<&'a [f64]>,
{
    let device = device();
    let k = Kernels::load(&device).unwrap();
    let mut rng = Rng::new(17);
    let mut ended = 0;
    for n in SIZES {
        let seed = 7 * n as u64;
        let max = <E::Ref as Physics>::MAX_EPISODE_STEPS;
        let mut env = E::alloc(&device, n, seed, max).unwrap();
        let mut out = Transitions::new(&device, n, <E::Ref as Physics>::OBS).unwrap();
        let state: Vec<f64> = (0..n).flat_map(|_| E::random_state(&mut rng)).collect();
        let length: Vec<u32> = (0..n)
            .map(|_| {
                if rng.below(4) == 0 {
                    max - 1
                } else {
                    rng.below(max as usize - 1) as u32
                }
            })
            .collect();
        let ret: Vec<f32> = (0..n).map(|_| rng.next_f32() * 100.0).collect();
        let episodes: Vec<u32> = (0..n).map(|_| rng.below(1000) as u32).collect();
        {
            let (s, stats) = env.parts();
            device.upload(s, &state).unwrap();
            device.upload(&mut stats.length, &length).unwrap();
            device.upload(&mut stats.ret, &ret).unwrap();
            device.upload(&mut stats.episodes, &episodes).unwrap();
        }
        let actions: Vec<E::Action> = (0..n).map(|_| E::random_action(&mut rng)).collect();
        let actions_dev = device.upload_new("actions", &actions).unwrap();
        let mut want = download(&device, &mut env, seed, max);
        run(&device, |s| env.step(&k, s, &actions_dev, &mut out));
        let want_out = want.step(&actions).unwrap();
        let gpu = download(&device, &mut env, seed, max);
        let got = outputs(&device, &out);
        check_step(
            &format!("{} random step, n = {n}", E::NAME),
            &gpu,
            &want,
            &got,
            &want_out,
        );
        ended += got
            .terminated
            .iter()
            .zip(&got.truncated)
            .filter(|(a, b)| **a + **b > 0)
            .count();
    }
    assert!(ended > 100, "{}: only {ended} episodes ended", E::NAME);
}

#[test]
fn gpu_cartpole_step_matches_the_reference_from_random_states() {
    random_step_matches::<CartPole>();
}

#[test]
fn gpu_pendulum_step_matches_the_reference_from_random_states() {
    random_step_matches::<Pendulum>();
}

/// `steps` steps from a reset with random actions and a short time limit, so that
/// episodes end by both rules and the statistics roll over many times; each step
/// compared from the GPU's state.
fn many_steps_match<E: GpuEnv>(steps: usize, max_steps: u32)
where
    for<'a> <E::Ref as Physics>::State: TryFrom<&'a [f64]>,
{
    let device = device();
    let k = Kernels::load(&device).unwrap();
    let mut rng = Rng::new(5);
    for n in [1, 257, 4096] {
        let seed = 99;
        let mut env = E::alloc(&device, n, seed, max_steps).unwrap();
        let mut out = Transitions::new(&device, n, <E::Ref as Physics>::OBS).unwrap();
        run(&device, |s| env.reset(&k, s, &mut out));
        let mut actions_dev = device
            .upload_new("actions", &vec![E::Action::default(); n])
            .unwrap();
        let mut finished = 0u64;
        for t in 0..steps {
            let actions: Vec<E::Action> = (0..n).map(|_| E::random_action(&mut rng)).collect();
            device.upload(&mut actions_dev, &actions).unwrap();
            let mut want = download(&device, &mut env, seed, max_steps);
            run(&device, |s| env.step(&k, s, &actions_dev, &mut out));
            let want_out = want.step(&actions).unwrap();
            let gpu = download(&device, &mut env, seed, max_steps);
            check_step(
                &format!("{} step {t}, n = {n}", E::NAME),
                &gpu,
                &want,
                &outputs(&device, &out),
                &want_out,
            );
            finished = gpu.episodes.iter().map(|&e| u64::from(e)).sum();
        }
        assert!(
            finished >= n as u64 * (steps as u64 / u64::from(max_steps)),
            "{}: {finished} episodes",
            E::NAME
        );
    }
}

#[test]
fn gpu_cartpole_many_steps_match_the_reference() {
    many_steps_match::<CartPole>(120, 40);
}

#[test]
fn gpu_pendulum_many_steps_match_the_reference() {
    many_steps_match::<Pendulum>(120, 25);
}

#[test]
fn gpu_buffers_of_the_wrong_length_are_refused() {
    let device = device();
    let k = Kernels::load(&device).unwrap();
    let mut env = CartPole::new(&device, 64, 1).unwrap();
    let mut out = Transitions::new(&device, 64, CartPole::OBS).unwrap();
    let actions = device.alloc_zeros::<i32>("actions", 63).unwrap();
    let err = stepgraph::exec::run_once(&device, |s| {
        k.cartpole_step(s, &mut env, &actions, &mut out)
    })
    .unwrap_err();
    assert!(format!("{err:?}").contains("LengthMismatch"), "{err:?}");
    let mut short = Transitions::new(&device, 64, Pendulum::OBS).unwrap();
    let err = stepgraph::exec::run_once(&device, |s| k.cartpole_reset(s, &mut env, &mut short))
        .unwrap_err();
    assert!(format!("{err:?}").contains("LengthMismatch"), "{err:?}");
    assert!(matches!(
        CartPole::new(&device, 0, 1),
        Err(Error::Argument { .. })
    ));
}

#[stepgraph::step(streams(main), kernels = Kernels)]
mod rollout {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub env: Pendulum,
        /// The torques of every replay, `[replays, N]`, and the replay's row.
        pub torques: DeviceBuffer<f32>,
        pub actions: DeviceBuffer<f32>,
        pub out: Transitions,
    }

    fn act(
        stream: &CaptureStream<'_>,
        torques: &DeviceBuffer<f32>,
        actions: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        // The same torques every replay: a policy's stand-in.
        stream.copy(torques, actions)
    }

    fn env_step(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        actions: &DeviceBuffer<f32>,
        env: &mut Pendulum,
        out: &mut Transitions,
    ) -> Result<()> {
        k.pendulum_step(stream, env, actions, out)
    }
}

/// A rollout captured as a graph and replayed past two time limits gives what the
/// reference gives for the same actions (compared at the end; each replay starts from
/// the GPU's own state, so the comparison tolerates the trajectory's growth of ulps).
#[test]
fn gpu_a_rollout_in_a_graph_matches_the_reference() {
    let device = device();
    let k = Kernels::load(&device).unwrap();
    let n = 1000;
    let seed = 31;
    let mut env = Pendulum::with_max_steps(&device, n, seed, 30).unwrap();
    let mut out = Transitions::new(&device, n, Pendulum::OBS).unwrap();
    run(&device, |s| k.pendulum_reset(s, &mut env, &mut out));
    let mut rng = Rng::new(3);
    let torques: Vec<f32> = (0..n)
        .map(|_| (rng.next_f64() * 4.0 - 2.0) as f32)
        .collect();
    let buffers = rollout::Buffers {
        env,
        torques: device.upload_new("torques", &torques).unwrap(),
        actions: device.alloc_zeros("actions", n).unwrap(),
        out,
    };
    let mut step = rollout::Step::new(&device, k, buffers, rollout::Config {}).unwrap();
    let mut want = Batch::<reference::Pendulum>::with_max_steps(n, seed, 30);
    for _ in 0..75 {
        step.replay().unwrap();
        want.step(&torques).unwrap();
    }
    let episodes = step.download(|b| &b.env.stats.episodes).unwrap();
    let length = step.download(|b| &b.env.stats.length).unwrap();
    let last_length = step.download(|b| &b.env.stats.last_length).unwrap();
    assert_eq!(episodes, want.episodes);
    assert_eq!(length, want.length);
    assert_eq!(last_length, want.last_length);
    assert_eq!(episodes, vec![2; n]);
    let obs = step.download(|b| &b.out.obs).unwrap();
    let last_return = step.download(|b| &b.env.stats.last_return).unwrap();
    check_close(
        "graph rollout: obs",
        &widen(&obs),
        &widen(&want.observations()),
        1e-4,
    );
    check_close(
        "graph rollout: last_return",
        &widen(&last_return),
        &widen(&want.last_return),
        1e-4,
    );
}
