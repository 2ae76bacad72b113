//! GPU tests of the CartPole agent as a whole loop (`stepgraph_agents::cartpole`): its
//! steps over shared buffers, captured once and run as device loops. They need a CUDA GPU
//! and run only with the `gpu-tests` feature.
//!
//! Every comparison is bit for bit: the same seed on the same device and build launches the
//! same kernels on the same data, and the update sums in a fixed order.
#![cfg(feature = "gpu-tests")]

use std::sync::Arc;

use stepgraph::Device;
use stepgraph_agents::DqnConfig;
use stepgraph_agents::cartpole::{Agent, AgentKernels};

/// Iterations (of 10 environment steps each) past rejax's fill of 5,000 steps, so that
/// updates and Polyak targets have run: 5,000 / 10 = 500 without updates, then 100 with.
const ITERATIONS: u32 = 600;
const EVAL_ENVS: usize = 16;

fn device_and_kernels() -> (Device, Arc<AgentKernels>) {
    let device = Device::new(0).expect("these tests need a CUDA GPU");
    let kernels = Arc::new(AgentKernels::load(&device).expect("the agents' kernels load"));
    (device, kernels)
}

fn agent(device: &Device, kernels: &Arc<AgentKernels>, seed: u64, agents: usize) -> Agent {
    Agent::new(
        device,
        kernels.clone(),
        DqnConfig::rejax_cartpole(seed),
        agents,
        EVAL_ENVS,
    )
    .expect("the agent's steps capture")
}

/// Trains in `chunks` device loops of the given lengths, evaluates, and returns the
/// parameters and the evaluation's mean returns.
fn train(agent: &mut Agent, chunks: &[u32]) -> (Vec<f32>, Vec<f64>) {
    for &n in chunks {
        agent.train(n).expect("the training loop launches");
    }
    agent.evaluate().expect("the evaluation launches");
    let returns = agent.eval_returns().expect("the evaluation finishes");
    (agent.params().expect("the parameters download"), returns)
}

#[test]
fn gpu_same_seed_same_agent_and_one_loop_equals_many() {
    let (device, kernels) = device_and_kernels();
    let mut one = agent(&device, &kernels, 7, 2);
    let initial = one.params().expect("the parameters download");
    let (params, returns) = train(&mut one, &[ITERATIONS]);
    assert_eq!(one.steps(), u64::from(ITERATIONS) * 10);
    assert!(
        params.iter().zip(&initial).any(|(a, b)| a != b),
        "{ITERATIONS} iterations past the fill left the parameters unchanged"
    );
    assert!(params.iter().all(|p| p.is_finite()));
    assert!(
        returns.iter().all(|r| (1.0..=500.0).contains(r)),
        "an evaluation return outside CartPole's [1, 500]: {returns:?}"
    );

    // The same seed again, the loop cut into pieces of other lengths (one of a single
    // iteration): each launch picks up where the last left off, on the device.
    let mut again = agent(&device, &kernels, 7, 2);
    let (params_again, returns_again) = train(&mut again, &[1, 299, 150, 150]);
    assert_eq!(again.steps(), one.steps());
    let differing = params
        .iter()
        .zip(&params_again)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(
        differing, 0,
        "one loop of {ITERATIONS} and four loops adding to it differ in {differing} parameters"
    );
    assert_eq!(returns, returns_again);
}

#[test]
fn gpu_agents_side_by_side_are_independent_and_seeds_differ() {
    let (device, kernels) = device_and_kernels();
    let mut pair = agent(&device, &kernels, 11, 2);
    let (pair_params, _) = train(&mut pair, &[ITERATIONS]);
    let p = Agent::PARAMS;
    assert_ne!(
        pair_params[..p],
        pair_params[p..],
        "two agents of one run drew the same numbers"
    );

    // Agent 0 of a run of one is agent 0 of a run of two: agents share no state.
    let mut alone = agent(&device, &kernels, 11, 1);
    let (alone_params, _) = train(&mut alone, &[ITERATIONS]);
    assert_eq!(alone_params[..], pair_params[..p]);

    let mut other = agent(&device, &kernels, 12, 1);
    let (other_params, _) = train(&mut other, &[ITERATIONS]);
    assert_ne!(
        other_params[..],
        alone_params[..],
        "seeds 11 and 12 trained alike"
    );
}
