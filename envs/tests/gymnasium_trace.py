"""Writes a trace of gymnasium's CartPole-v1 or Pendulum-v1 as JSON on stdout, for the
comparison test (tests/gymnasium.rs) to replay through the CPU reference.

    python gymnasium_trace.py CartPole-v1 SEED STEPS

Each episode starts with `reset` (seeded for the first) and records, for every step,
the action, gymnasium's internal float64 state after the step (`env.unwrapped.state`),
the float32 observation, the reward and both flags; the episode's reset state and
observation come first. The trace goes on past STEPS until the running episode ends, so
that every episode is whole.

CartPole's actions are, every sixth episode, a noisy balancing policy, whose
episodes reach the time limit of 500 (truncation), and otherwise uniform random actions, whose
episodes end within a few dozen steps (termination). Pendulum's torques are uniform in
[-2.5, 2.5], so some fall outside the action space and are clipped; each episode is
truncated at 200.
"""

import json
import sys

import gymnasium as gym
import numpy as np


def state_of(env):
    return [float(v) for v in np.asarray(env.unwrapped.state, dtype=np.float64)]


def floats(a):
    return [float(v) for v in np.asarray(a)]


def cartpole_action(rng, obs, episode):
    if episode % 6 == 0 and rng.random() > 0.1:
        x, x_dot, theta, theta_dot = (float(v) for v in obs)
        return int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)
    return int(rng.integers(2))


def pendulum_action(rng, obs, episode):
    return np.array([rng.uniform(-2.5, 2.5)], dtype=np.float32)


def main():
    name, seed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    policy = {"CartPole-v1": cartpole_action, "Pendulum-v1": pendulum_action}[name]
    env = gym.make(name)
    rng = np.random.default_rng(seed)
    episodes = []
    taken = 0
    while taken < steps:
        obs, _ = env.reset(seed=seed if not episodes else None)
        episode = {"reset_state": state_of(env), "reset_obs": floats(obs), "steps": []}
        done = False
        while not done:
            action = policy(rng, obs, len(episodes))
            obs, reward, terminated, truncated, _ = env.step(action)
            episode["steps"].append(
                {
                    "action": floats(action)[0] if name == "Pendulum-v1" else action,
                    "state": state_of(env),
                    "obs": floats(obs),
                    "reward": float(reward),
                    "terminated": bool(terminated),
                    "truncated": bool(truncated),
                }
            )
            taken += 1
            done = terminated or truncated
        episodes.append(episode)
    json.dump(
        {
            "gymnasium": gym.__version__,
            "numpy": np.__version__,
            "env": name,
            "seed": seed,
            "episodes": episodes,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
