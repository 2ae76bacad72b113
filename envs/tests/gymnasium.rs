//! The CPU reference against gymnasium itself: `gymnasium_trace.py` runs gymnasium
//! (the pinned version, [`GYMNASIUM`]) with a fixed seed for at least 1,000 steps of
//! each environment, over whole episodes that end by termination and by truncation, and
//! the reference replays the same actions.
//!
//! Two comparisons, each for a reason:
//!
//! - **One step at a time** from gymnasium's own float64 state: the reference's step of
//!   that state must reach gymnasium's next state within 1e-12 (relative, absolute
//!   below 1), its observation within the tolerance below, its reward bit for bit and
//!   its `terminated` exactly. An error shows at the step that makes it, whatever the
//!   dynamics do with it afterwards.
//! - **Along the trajectory**, as a user runs it: a one-environment reference batch
//!   starts each episode from gymnasium's reset state (injected: the reset generators
//!   differ) and steps on from its own states with gymnasium's actions; every final
//!   observation must be within the tolerance, every reward within it too, both flags
//!   equal at every step, and the statistics must give each episode's length and
//!   return. The reference computes in float64 in numpy's order, and numpy's float64
//!   `sin` and `cos` are the C library's, as Rust's are, so its trajectory is
//!   gymnasium's bit for bit. This half is the stricter: replaying a long balanced
//!   CartPole episode's actions without the policy's feedback grows even a 1-ulp
//!   difference (a libm that rounds otherwise) until termination may move, which the
//!   one-step half would not suffer; float32 arithmetic would move it in most such
//!   episodes.
//!
//! Observation tolerance: `|got - want| <= 1e-5 max(|want|, 0.1)`, 1e-5 relative, and
//! 1e-6 absolute below 0.1, where a value near zero (a cart at rest, a pendulum at
//! theta = 0) has no relative scale; 1e-6 is ten times the float32 spacing at 0.1 and
//! far below the observations' scale of 0.01 to 10.
//!
//! The test installs nothing: the Python that runs gymnasium is `STEPGRAPH_PYTHON`,
//! which `cargo xtask test` sets after installing gymnasium into a virtual environment
//! under `target/`. Without it the test fails, naming what is missing and that command.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use stepgraph_envs::reference::{Batch, CartPole, Pendulum, Physics};

/// The gymnasium release the environments match; `cargo xtask test` installs it.
const GYMNASIUM: &str = "1.2.3";

/// Steps of each environment, at least (the trace finishes the running episode).
const STEPS: usize = 1000;

const SEED: u64 = 20_251_205;

/// `|got - want| <= REL max(|want|, FLOOR)`.
const REL: f64 = 1e-5;
const FLOOR: f64 = 0.1;

fn within(got: f64, want: f64) -> bool {
    (got - want).abs() <= REL * want.abs().max(FLOOR)
}

/// gymnasium's trace of `env`, run by `STEPGRAPH_PYTHON`.
fn trace(env: &str) -> Value {
    let Some(python) = std::env::var_os("STEPGRAPH_PYTHON") else {
        panic!(
            "the gymnasium comparison needs a Python with gymnasium {GYMNASIUM}, named by \
             STEPGRAPH_PYTHON, which is not set: run `cargo xtask test`, which installs \
             gymnasium=={GYMNASIUM} into target/gymnasium and sets it"
        );
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gymnasium_trace.py");
    let out = Command::new(&python)
        .arg(&script)
        .args([env, &SEED.to_string(), &STEPS.to_string()])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "could not run STEPGRAPH_PYTHON={}: {e}; run `cargo xtask test`, which \
                 installs gymnasium=={GYMNASIUM} into target/gymnasium and sets it",
                Path::new(&python).display()
            )
        });
    assert!(
        out.status.success(),
        "{} {} failed ({}): {}\nThe comparison needs gymnasium=={GYMNASIUM} and numpy in that \
         Python: run `cargo xtask test`, which installs them into target/gymnasium",
        Path::new(&python).display(),
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let trace: Value = serde_json::from_slice(&out.stdout).expect("the trace is JSON");
    assert_eq!(
        trace["gymnasium"].as_str(),
        Some(GYMNASIUM),
        "STEPGRAPH_PYTHON has another gymnasium than the pinned one: run `cargo xtask test`"
    );
    trace
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

/// An action as the trace writes it.
trait FromTrace: Sized {
    fn from_trace(v: &Value) -> Self;
}

impl FromTrace for i32 {
    fn from_trace(v: &Value) -> i32 {
        i32::try_from(v.as_i64().expect("an integer action")).expect("a small action")
    }
}

impl FromTrace for f32 {
    fn from_trace(v: &Value) -> f32 {
        // The trace holds the float32 action widened, so this is exact.
        v.as_f64().expect("a number") as f32
    }
}

/// A state of `P` from the trace's float64 list.
fn state_of<P: Physics>(v: &Value) -> P::State
where
    P::State: TryFrom<Vec<f64>>,
{
    match P::State::try_from(f64s(v)) {
        Ok(s) => s,
        Err(_) => panic!("a state of the wrong length: {v}"),
    }
}

fn observe<P: Physics>(s: &P::State) -> Vec<f32> {
    let mut obs = vec![0.0; P::OBS];
    P::observe(s, &mut obs);
    obs
}

fn check_obs(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: observation length");
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            within(f64::from(g), w),
            "{what}: observation[{k}] {g} against gymnasium's {w}\n  got  {got:?}\n  want {want:?}"
        );
    }
}

/// What the trace held, counted, so a test can say that it saw every kind of ending.
#[derive(Debug, Default)]
struct Seen {
    steps: usize,
    episodes: usize,
    terminated: usize,
    truncated: usize,
}

/// Both comparisons of the module docs over `trace`.
fn compare<P: Physics>(trace: &Value) -> Seen
where
    P::State: TryFrom<Vec<f64>>,
    P::Action: FromTrace,
{
    let mut seen = Seen::default();
    let mut batch = Batch::<P>::new(1, SEED);
    for (e, episode) in trace["episodes"]
        .as_array()
        .expect("episodes")
        .iter()
        .enumerate()
    {
        let reset = state_of::<P>(&episode["reset_state"]);
        check_obs(
            &format!("episode {e}, reset"),
            &observe::<P>(&reset),
            &f64s(&episode["reset_obs"]),
        );
        // The reference's own reset (after the previous episode) replaced by gymnasium's.
        assert_eq!(
            batch.length[0], 0,
            "episode {e} starts with a running length of 0"
        );
        batch.state[0] = reset;
        let mut prev = reset;
        let mut gym_return = 0.0f32;
        let steps = episode["steps"].as_array().expect("steps");
        for (t, step) in steps.iter().enumerate() {
            let at = format!("episode {e}, step {t}");
            let action = P::Action::from_trace(&step["action"]);
            let gym_state = f64s(&step["state"]);
            let gym_obs = f64s(&step["obs"]);
            let gym_reward = step["reward"].as_f64().expect("a reward");
            let terminated = step["terminated"].as_bool().expect("a flag");
            let truncated = step["truncated"].as_bool().expect("a flag");
            gym_return += gym_reward as f32;

            // One step from gymnasium's state.
            let (next, reward, term) = P::step(prev, action);
            for (k, (&g, &w)) in next.as_ref().iter().zip(&gym_state).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                    "{at}, one step: state[{k}] {g:e} against gymnasium's {w:e}"
                );
            }
            check_obs(&format!("{at}, one step"), &observe::<P>(&next), &gym_obs);
            assert_eq!(
                reward.to_bits(),
                (gym_reward as f32).to_bits(),
                "{at}, one step: reward {reward} against gymnasium's {gym_reward}"
            );
            assert_eq!(term, terminated, "{at}, one step: terminated");
            prev = state_of::<P>(&step["state"]);

            // Along the trajectory.
            let out = batch.step_env(0, action);
            check_obs(&format!("{at}, trajectory"), &out.final_obs, &gym_obs);
            assert!(
                within(f64::from(out.reward), gym_reward),
                "{at}, trajectory: reward {} against gymnasium's {gym_reward}",
                out.reward
            );
            assert_eq!(
                (out.terminated, out.truncated),
                (terminated, truncated),
                "{at}, trajectory: (terminated, truncated)"
            );
            let ended = terminated || truncated;
            assert_eq!(
                ended,
                t + 1 == steps.len(),
                "{at}: episodes in the trace are whole"
            );
            if ended {
                // The same-step auto-reset: the reference's own next episode.
                let own = P::reset_state(SEED, 0, e as u64 + 1);
                assert_eq!(
                    out.obs,
                    observe::<P>(&own),
                    "{at}: the auto-reset observation"
                );
                assert_eq!(batch.episodes[0] as usize, e + 1, "{at}: episodes finished");
                assert_eq!(
                    batch.last_length[0] as usize,
                    steps.len(),
                    "{at}: episode length"
                );
                assert!(
                    within(f64::from(batch.last_return[0]), f64::from(gym_return)),
                    "{at}: episode return {} against gymnasium's {gym_return}",
                    batch.last_return[0]
                );
                seen.terminated += usize::from(terminated);
                seen.truncated += usize::from(truncated);
            } else {
                assert_eq!(out.obs, out.final_obs, "{at}: no reset, one observation");
            }
            seen.steps += 1;
        }
        seen.episodes += 1;
    }
    seen
}

#[test]
fn cartpole_matches_gymnasium() {
    let trace = trace("CartPole-v1");
    let seen = compare::<CartPole>(&trace);
    assert!(
        seen.steps >= STEPS && seen.terminated >= 3 && seen.truncated >= 2,
        "the trace should hold terminations and truncations: {seen:?}"
    );
}

#[test]
fn pendulum_matches_gymnasium() {
    let trace = trace("Pendulum-v1");
    let seen = compare::<Pendulum>(&trace);
    assert!(
        seen.steps >= STEPS && seen.truncated >= 5 && seen.terminated == 0,
        "the trace should hold five truncated episodes and no termination: {seen:?}"
    );
}
