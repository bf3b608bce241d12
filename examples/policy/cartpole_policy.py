"""Plays gymnasium's CartPole-v1 with an agent a run trained on it, in a
script of your own (docs/your-policy.md):

    python examples/policy/cartpole_policy.py LOGDIR [ENVS]

LOGDIR is the run's logdir, or the one file `python -m embodied.export`
wrote from it.
Steps ENVS envs (default 2) side by side with one policy, until each has
finished an episode, and prints each env's first episode.
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
    print('The agent takes', sorted(policy.obs_space), 'and gives',
          sorted(policy.act_space))
    envs = [gym.make('CartPole-v1') for _ in range(count)]
    steps = [step_obs(env.reset(seed=i)[0], first=True)
             for i, env in enumerate(envs)]
    returns, lengths, episodes = [0.0] * count, [0] * count, [None] * count
    while any(e is None for e in episodes):
        act = policy(stack(steps))
        for i, env in enumerate(envs):
            if steps[i]['is_last']:  # Its action is ignored; a new episode.
                steps[i] = step_obs(env.reset()[0], first=True)
                returns[i], lengths[i] = 0.0, 0
                continue
            obs, reward, terminated, truncated, _ = env.step(
                int(act['action'][i]))
            steps[i] = step_obs(obs, reward, False, terminated, truncated)
            returns[i] += reward
            lengths[i] += 1
            if steps[i]['is_last'] and episodes[i] is None:
                episodes[i] = (returns[i], lengths[i])
    for i, (score, length) in enumerate(episodes):
        print(f'env {i}: return {score:.0f} in {length} steps')


if __name__ == '__main__':
    main(sys.argv[1], *map(int, sys.argv[2:]))
