"""`embodied.load_policy` against the run's own eval policy, in a process of
its own (tests/test_policy_page.py runs it on logdirs that trained on
gymnasium's CartPole-v1 and Pendulum-v1):

    python policy_parity.py LOGDIR ENVS

* What reaches the env, step by step. The run's eval policy is built as
  `--script eval_only --run.envs ENVS` builds it (the run's config.yaml,
  `make_agent`, `load_agent`, one `init_policy`, then `policy(mode='eval')`
  on each batch), and its actions step ENVS envs as the run builds them
  (`factories.make_env`: the gym suite's adapter and the run's action
  wrappers), each around a gymnasium env that records the action it
  receives. `load_policy(LOGDIR)`'s actions step ENVS bare gymnasium envs,
  as a script of yours does, recorded the same way. Both sets see the same
  observations, and every action their gymnasium envs receive must be the
  same. For a `Box` action, each received value lies in the Box's bounds,
  and some of the agent's own actions lay outside [-1, 1]: the clip to the
  act space was needed (a policy without it fails here).
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

Prints `parity: <steps> steps, env 0 reset at step <n>, <k> actions
clipped` when all held.
"""

import sys

import elements
import gymnasium as gym
import jax
import numpy as np

import embodied
from embodied import factories
from embodied.run import saving

MAX_STEPS = 1000


class Recorded(gym.Wrapper):
    """A gymnasium env that keeps every action its `step` receives."""

    def __init__(self, env):
        super().__init__(env)
        self.received = []

    def step(self, action):
        self.received.append(np.array(action, copy=True))
        return self.env.step(action)


def run_config(logdir, count):
    config = elements.Config.load(str(elements.Path(logdir) / 'config.yaml'))
    return config.update({'script': 'eval_only', 'run.envs': count})


def run_agent(config, logdir):
    """The agent as `--script eval_only --run.envs count` builds it on the
    run's config."""
    agent = factories.make_agent(config)
    saving.load_agent(agent, logdir)
    return agent


def run_envs(config, count):
    """The run's envs 0..count-1 as `factories.make_env` builds them (env i
    seeded with i), and the recorded gymnasium env inside each."""
    inner, make = [], gym.make

    def recorded(*args, **kwargs):
        inner.append(Recorded(make(*args, **kwargs)))
        return inner[-1]
    gym.make = recorded  # The gym suite calls gymnasium.make.
    try:
        envs = [factories.make_env(config, i, use_seed=False, seed=i)
                for i in range(count)]
    finally:
        gym.make = make
    assert len(inner) == count, inner
    return envs, inner


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


def stack(steps):
    return {k: np.stack([s[k] for s in steps]) for k in steps[0]}


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
    config = run_config(logdir, count)
    agent = run_agent(config, logdir)
    runs, run_gyms = run_envs(config, count)
    as_if_on_gpus(logdir)
    mine = embodied.load_policy(logdir, batch_size=count)
    other = embodied.load_policy(
        saving.agent_save_folder(logdir), batch_size=count)
    gyms = [Recorded(gym.make(config.task.split('_', 1)[1]))
            for _ in range(count)]
    box = gyms[0].action_space
    box = box if isinstance(box, gym.spaces.Box) else None
    # The run's envs start with a reset; a script of yours resets its own.
    zeros = {k: np.zeros(v.shape, v.dtype)
             for k, v in runs[0].act_space.items()}
    run_obs = [env.step({**zeros, 'reset': True}) for env in runs]
    steps = [step_obs(env.reset(seed=i)[0], first=True)
             for i, env in enumerate(gyms)]
    carry = agent.init_policy(count)
    episodes, differed, reset_at, clipped = [0] * count, False, None, 0
    for step in range(MAX_STEPS):
        batch = stack(steps)
        theirs_obs = stack([{k: o[k] for k in batch} for o in run_obs])
        for key, value in batch.items():
            assert np.array_equal(value, theirs_obs[key]), (step, key)
        carry, act, _ = agent.policy(carry, batch, mode='eval')
        ours = mine(batch)
        assert set(act) == set(ours) == {'action'}, (act, ours)
        if box is not None:
            clipped += int((np.abs(act['action']) > 1).any(-1).sum())
        moved = {k: v.copy() for k, v in batch.items()}
        if episodes[0] == 0:
            moved['vector'][0] += 0.5
        theirs = other(moved)
        assert same_rows(mine.carry, other.carry, 1), step
        assert np.array_equal(theirs['action'][1], ours['action'][1]), step
        if episodes[0] == 0:
            differed |= not same_rows(mine.carry, other.carry, 0)
        else:
            reset_at = step if reset_at is None else reset_at
            assert same_rows(mine.carry, other.carry, 0), step
            assert np.array_equal(
                theirs['action'][0], ours['action'][0]), step
        for i, env in enumerate(runs):  # The run's env: the agent's action.
            run_obs[i] = env.step({
                **{k: v[i] for k, v in act.items()},
                'reset': bool(batch['is_last'][i])})
        for i, env in enumerate(gyms):  # Yours: the policy's action.
            if steps[i]['is_last']:
                steps[i] = step_obs(env.reset()[0], first=True)
                episodes[i] += 1
                continue
            obs, reward, terminated, truncated, _ = env.step(
                ours['action'][i] if box else int(ours['action'][i]))
            steps[i] = step_obs(obs, reward, False, terminated, truncated)
        for i, (run_gym, env) in enumerate(zip(run_gyms, gyms)):
            assert len(run_gym.received) == len(env.received), (step, i)
            if env.received and not steps[i]['is_first']:
                sent, got = run_gym.received[-1], env.received[-1]
                assert np.array_equal(sent, got) and np.asarray(
                    sent).dtype == np.asarray(got).dtype, (step, i, sent, got)
                if box is not None:
                    assert ((box.low <= got) & (got <= box.high)).all(), (
                        step, i, got, box)
        if episodes[0] >= 2 and min(episodes) >= 1:
            break
    assert differed, 'the moved observations never changed the carry'
    assert episodes[0] >= 2 and min(episodes) >= 1, episodes
    if box is not None:
        assert clipped, 'the agent never acted outside [-1, 1]'
    check_seed(logdir, count)
    print(f'parity: {step + 1} steps, env 0 reset at step {reset_at}, '
          f'{clipped} actions clipped', flush=True)


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]))
