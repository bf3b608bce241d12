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
    rng = np.random.default_rng(0)
    for _ in range(50):
        check_values('obs', obs, env.obs_space)
        assert set(obs) == set(env.obs_space)
        action = int(rng.integers(17))
        obs = env.step({'action': np.int32(action), 'reset': False})
        image, reward, done, info = direct.step(action)
        np.testing.assert_array_equal(obs['image'], image)
        assert obs['reward'] == np.float32(reward)
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
    crafter's own final achievement counts for the same seed and actions."""
    env = Crafter('reward', logs=True, seed=seed, logdir=logdir)
    direct = crafter.Env(size=(64, 64), reward=True, seed=seed)
    direct.reset()
    rng = np.random.default_rng(seed)
    trans = [reset(env)]
    while not trans[-1]['is_last']:
        action = int(rng.integers(17))
        trans[-1]['action'] = np.int32(action)
        trans.append(env.step({'action': np.int32(action), 'reset': False}))
        _, _, done, info = direct.step(action)
        assert len(trans) < 10001
    trans[-1]['action'] = np.int32(0)
    assert done
    return trans, info['achievements']


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
