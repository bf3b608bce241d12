"""The Crafter adapter: spaces, steps against crafter directly, and the
achievements as `log/` metrics that reach the logger but not the agent or the
replay."""

import json

import numpy as np
import pytest

crafter = pytest.importorskip('crafter')

from embodied.core.replay import Replay  # noqa: E402
from embodied.core.wrappers import check_values  # noqa: E402
from embodied.envs.crafter import Crafter  # noqa: E402
from embodied.run.episodes import EpisodeStats  # noqa: E402

ACHIEVEMENTS = crafter.constants.achievements


class Recorder:
    """Stands in for the logger: keeps what EpisodeStats writes."""

    def __init__(self):
        self.rows = []

    def add(self, metrics, prefix=None):
        self.rows.append((prefix, dict(metrics)))


def reset(env):
    return env.step({'action': np.int32(0), 'reset': True})


class Recording:
    """Wraps a crafter.Env and keeps what each step returned."""

    def __init__(self, env):
        self.env = env
        self.steps = []

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action):
        result = self.env.step(action)
        self.steps.append(result)
        return result


# Crafter keeps the objects of each world chunk in a set, so which creature
# it despawns depends on memory addresses: two envs of the same seed given
# the same actions can drift apart. The world a seed generates is fixed, so
# first frames are compared with a second env; steps are compared with what
# crafter returned to the adapter.


@pytest.mark.parametrize('task', ['reward', 'noreward'])
def test_spaces_and_fifty_steps_match_crafter(task):
    env = Crafter(task, logs=True, seed=3)
    assert env.obs_space['image'].shape == (64, 64, 3)
    assert env.obs_space['image'].dtype == np.uint8
    assert env.act_space['action'].high == 17
    keys = {f'log/achievement_{name}' for name in ACHIEVEMENTS}
    assert keys <= set(env.obs_space)
    direct = crafter.Env(size=(64, 64), reward=(task == 'reward'), seed=3)
    obs = reset(env)
    np.testing.assert_array_equal(obs['image'], direct.reset())
    env._env = recording = Recording(env._env)
    rng = np.random.default_rng(0)
    for _ in range(50):
        check_values('obs', obs, env.obs_space)
        assert set(obs) == set(env.obs_space)
        obs = env.step({'action': np.int32(rng.integers(17)),
                        'reset': False})
        image, reward, done, info = recording.steps[-1]
        np.testing.assert_array_equal(obs['image'], image)
        assert obs['reward'] == np.float32(reward)
        assert obs['is_last'] == done
        assert obs['log/reward'] == np.float32(info['reward'])
        for name in ACHIEVEMENTS:
            assert obs[f'log/achievement_{name}'] == info['achievements'][name]
        if task == 'noreward':
            assert reward == 0


def test_without_logs_only_the_reward_is_logged():
    env = Crafter('reward', seed=0)
    assert [k for k in env.obs_space if k.startswith('log/')] == ['log/reward']


def play_episode(seed, logdir=None):
    """Random actions until the episode ends; returns the transitions and
    crafter's own achievement counts at the end."""
    env = Crafter('reward', logs=True, seed=seed, logdir=logdir)
    rng = np.random.default_rng(seed)
    trans = [reset(env)]
    while not trans[-1]['is_last']:
        action = np.int32(rng.integers(17))
        trans[-1]['action'] = action
        trans.append(env.step({'action': action, 'reset': False}))
        assert len(trans) < 10002
    trans[-1]['action'] = np.int32(0)
    return trans, dict(env._env._player.achievements)


def test_achievements_reach_the_logger_as_episode_metrics(tmp_path):
    trans, achievements = play_episode(1, logdir=tmp_path)
    assert sum(achievements.values()) > 0
    logger = Recorder()
    stats = EpisodeStats(logger)
    for tran in trans:
        stats.add(tran)
    (prefix, episode), = logger.rows
    assert prefix == 'episode' and episode['length'] == len(trans) - 1
    result = stats.result()
    for name, count in achievements.items():
        assert result[f'log/achievement_{name}/max'] == count, name
    rewards = sum(float(t['log/reward']) for t in trans)
    assert result['log/reward/sum'] == pytest.approx(rewards)
    # The stats file that Crafter's own analysis tools read.
    line, = (tmp_path / 'stats.jsonl').read_text().splitlines()
    row = json.loads(line)
    assert row['length'] == len(trans) - 1
    assert {k[len('achievement_'):]: v for k, v in row.items()
            if k.startswith('achievement_')} == achievements


def test_log_keys_reach_neither_the_agent_nor_the_replay(tmp_path):
    from embodied import main
    config = main.parse([
        '--configs', 'crafter', 'debug', '--agent_impl', 'testing',
        '--logdir', str(tmp_path)])
    agent = main.make_agent(config)
    assert not [k for k in agent.obs_space if k.startswith('log/')]
    assert 'image' in agent.obs_space
    replay = Replay(length=4, capacity=100)
    trans, _ = play_episode(2)
    for tran in trans[:20]:
        replay.add(tran)
    batch = replay.sample(2)
    assert not [k for k in batch if k.startswith('log/')]
    assert batch['image'].shape == (2, 4, 64, 64, 3)


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match="Unknown Crafter task 'rewards'"):
        Crafter('rewards')
