"""`embodied.load_policy` against the run's own eval policy, in a process of
its own (tests/test_policy_page.py runs it on a logdir that trained on
gymnasium's CartPole-v1):

    python policy_parity.py LOGDIR ENVS

* The run's eval policy is built as `--script eval_only --run.envs ENVS`
  builds it (the run's config.yaml, `make_agent`, `load_agent`, one
  `init_policy`, then `policy(mode='eval')` on each batch). ENVS CartPole
  envs step with its actions, and `load_policy(LOGDIR)` acts on the same
  observations: every action must be the same.
* Both `load_policy` calls read a config.yaml rewritten as if the run had
  trained on 4 GPUs (`jax.platform cuda`, an FSDP mesh, `jax.prealloc`):
  they act on the CPU all the same.
* A second `load_policy`, of the save folder itself, sees the same
  observations except env 0's during its first episode (moved by 0.5): its
  carry row 0 differs then, and from env 0's second episode on (the agent
  starts a fresh state at `is_first`) its actions and carry equal the
  first's; env 1's are equal throughout.

* `load_policy(..., seed=7)` restarts the random streams: its agent's
  streams stand at seed 7 and count 0 where the save's were elsewhere.

Prints `parity: <steps> steps, env 0 reset at step <n>` when all held.
"""

import sys

import elements
import gymnasium as gym
import jax
import numpy as np

import embodied
from embodied import factories
from embodied.run import saving


def run_agent(logdir, count):
    """The agent as `--script eval_only --run.envs count` builds it on the
    run's config."""
    config = elements.Config.load(str(elements.Path(logdir) / 'config.yaml'))
    config = config.update({'script': 'eval_only', 'run.envs': count})
    agent = factories.make_agent(config)
    saving.load_agent(agent, logdir)
    return agent


def as_if_on_gpus(logdir):
    """Rewrites the run's config.yaml with the jax settings of a run on 4
    GPUs."""
    path = elements.Path(logdir) / 'config.yaml'
    config = elements.Config.load(str(path))
    config.update({
        'jax.platform': 'cuda', 'jax.prealloc': True,
        'jax.policy_devices': [0], 'jax.train_devices': [0, 1, 2, 3],
        'jax.train_mesh': '1,4,1'}).save(path)


def rows(carry, index):
    return [np.asarray(leaf)[index] for leaf in jax.tree.leaves(carry)]


def same_rows(a, b, index):
    return all(np.array_equal(x, y) for x, y in zip(
        rows(a, index), rows(b, index)))


def step_obs(obs, reward=0.0, first=False, terminated=False, truncated=False):
    return {'vector': np.asarray(obs, np.float32), 'reward': np.float32(reward),
            'is_first': first, 'is_last': terminated or truncated,
            'is_terminal': terminated}


def check_seed(logdir, count):
    saved = {}
    saving.load_agent(_Store(saved), logdir)
    assert saved['rng/seed'] != 7 and saved['rng/policy'] > 0, saved
    seeded = embodied.load_policy(logdir, batch_size=count, seed=7)
    streams = {k: int(v) for k, v in seeded.agent.save().items()
               if k.startswith('rng/')}
    assert streams['rng/seed'] == 7 and streams['rng/policy'] == 0, streams


class _Store:
    """Takes an agent save as it is, to read its random streams."""

    def __init__(self, target):
        self.target = target

    def load(self, data, regex=None):
        self.target.update(
            {k: int(v) for k, v in data.items() if k.startswith('rng/')})


def main(logdir, count):
    agent = run_agent(logdir, count)
    as_if_on_gpus(logdir)
    mine = embodied.load_policy(logdir, batch_size=count)
    save = saving.agent_save_folder(logdir)
    other = embodied.load_policy(save, batch_size=count)
    envs = [gym.make('CartPole-v1') for _ in range(count)]
    steps = [step_obs(env.reset(seed=i)[0], first=True)
             for i, env in enumerate(envs)]
    carry = agent.init_policy(count)
    episodes, differed, reset_at = [0] * count, False, None
    for step in range(600):
        batch = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
        carry, act, _ = agent.policy(carry, batch, mode='eval')
        ours = mine(batch)
        assert set(act) == set(ours) == {'action'}, (act, ours)
        assert np.array_equal(act['action'], ours['action']), (
            step, act, ours)
        moved = {k: v.copy() for k, v in batch.items()}
        if episodes[0] == 0:
            moved['vector'][0] += 0.5
        theirs = other(moved)
        assert same_rows(mine.carry, other.carry, 1), step
        assert theirs['action'][1] == ours['action'][1], step
        if episodes[0] == 0:
            differed |= not same_rows(mine.carry, other.carry, 0)
        else:
            reset_at = step if reset_at is None else reset_at
            assert same_rows(mine.carry, other.carry, 0), step
            assert theirs['action'][0] == ours['action'][0], step
        for i, env in enumerate(envs):
            if steps[i]['is_last']:
                steps[i] = step_obs(env.reset()[0], first=True)
                episodes[i] += 1
                continue
            obs, reward, terminated, truncated, _ = env.step(
                int(act['action'][i]))
            steps[i] = step_obs(obs, reward, False, terminated, truncated)
        if episodes[0] >= 2 and min(episodes) >= 1:
            break
    assert differed, 'the moved observations never changed the carry'
    assert episodes[0] >= 2 and min(episodes) >= 1, episodes
    check_seed(logdir, count)
    print(f'parity: {step + 1} steps, env 0 reset at step {reset_at}',
          flush=True)


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]))
