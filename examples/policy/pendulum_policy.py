"""Swings gymnasium's Pendulum-v1 with an agent a run trained on it, in a
script of your own (docs/your-policy.md):

    python examples/policy/pendulum_policy.py LOGDIR [ENVS]

Steps ENVS envs (default 2) side by side with one policy, until each has
finished an episode, and prints each env's first episode with the lowest
and highest torque it received. The policy's actions are what the run's
env received: clipped and mapped to the env's bounds ([-2, 2] for
Pendulum's torque), so they go to `env.step` as they are.
"""

import sys

import gymnasium as gym
import numpy as np

import embodied


def step_obs(obs, reward=0.0, first=False, terminated=False, truncated=False):
    """One env's step in the agent's keys: the gym suite names a flat
    observation `vector`, and every step carries the four step keys."""
    return {
        'vector': np.asarray(obs, np.float32),
        'reward': np.float32(reward),
        'is_first': first,
        'is_last': terminated or truncated,
        'is_terminal': terminated,
    }


def stack(steps):
    """The steps of all envs as one batch: one row per env."""
    return {key: np.stack([s[key] for s in steps]) for key in steps[0]}


def main(logdir, count=2):
    policy = embodied.load_policy(logdir, batch_size=count)  # on the CPU
    space = policy.act_space['action']
    print(f'The agent gives torques in [{space.low[0]:g}, {space.high[0]:g}]')
    envs = [gym.make('Pendulum-v1') for _ in range(count)]
    steps = [step_obs(env.reset(seed=i)[0], first=True)
             for i, env in enumerate(envs)]
    returns, torques = [0.0] * count, [[] for _ in range(count)]
    episodes = [None] * count
    while any(e is None for e in episodes):
        act = policy(stack(steps))
        for i, env in enumerate(envs):
            if steps[i]['is_last']:  # Its action is ignored; a new episode.
                steps[i] = step_obs(env.reset()[0], first=True)
                returns[i], torques[i] = 0.0, []
                continue
            torque = act['action'][i]  # In the env's bounds: no mapping.
            obs, reward, terminated, truncated, _ = env.step(torque)
            steps[i] = step_obs(obs, reward, False, terminated, truncated)
            returns[i] += reward
            torques[i].append(float(torque[0]))
            if steps[i]['is_last'] and episodes[i] is None:
                episodes[i] = (returns[i], torques[i])
    for i, (score, done) in enumerate(episodes):
        print(f'env {i}: return {score:.1f} in {len(done)} steps, torques '
              f'from {min(done):.2f} to {max(done):.2f}')


if __name__ == '__main__':
    main(sys.argv[1], *map(int, sys.argv[2:]))
