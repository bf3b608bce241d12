"""bsuite: the env against bsuite's own, its CSV results against those of
bsuite's own CSV logging, and the results continued across a resume (one
env after another on the same folder, and a run of the command line
stopped and rerun)."""

import csv
import json

import numpy as np
import pytest

import launch

pytest.importorskip('bsuite')

import bsuite  # noqa: E402

from embodied.core.wrappers import check_values  # noqa: E402
from embodied.envs.bsuite import BSuite, logged  # noqa: E402


def seeded(env, seed=5):
    """bsuite's catch and cartpole draw from an unseeded RandomState."""
    raw = getattr(env, '_raw', None) or getattr(env, 'raw_env', env)
    if hasattr(raw, '_rng'):
        raw._rng = np.random.RandomState(seed)
    return env


def play(env, episodes, rng, partial=0):
    """Steps `env` through whole episodes at random, then `partial` steps
    of one more; returns the last observation."""
    n = env.act_space['action'].high
    obs = env.step({'action': np.int32(0), 'reset': True})
    done = 0
    while done < episodes or partial:
        obs = env.step({'action': np.int32(rng.integers(n)), 'reset': False})
        if done >= episodes:
            partial -= 1
        if obs['is_last']:
            done += 1
            obs = env.step({'action': np.int32(0), 'reset': False})
    return obs


def rows(folder):
    path, = (folder / 'bsuite').glob('bsuite_id_-_*.csv')
    with path.open() as f:
        return list(csv.DictReader(f))


def test_spaces_flatten_the_observation():
    env = BSuite('catch')
    assert env.bsuite_id == 'catch/0'
    assert env.obs_space['observation'].shape == (50,)
    assert env.obs_space['observation'].dtype == np.float32
    assert env.act_space['action'].dtype == np.int32
    assert env.act_space['action'].high == 3
    obs = env.step({'action': np.int32(0), 'reset': True})
    check_values('obs', obs, env.obs_space)
    assert obs['observation'].sum() == 2  # The ball and the paddle.


@pytest.mark.parametrize('task', ['catch/0', 'deep_sea/2', 'cartpole/0'])
def test_results_are_those_of_bsuites_own_logging(task, tmp_path):
    ours = seeded(BSuite(task, logdir=tmp_path / 'ours'))
    theirs = seeded(bsuite.load_and_record_to_csv(task, str(tmp_path / 'b')))
    n = ours.act_space['action'].high
    rng = np.random.default_rng(0)
    ours.step({'action': np.int32(0), 'reset': True})
    theirs.reset()
    episodes = 0
    while episodes < 60:
        action = int(rng.integers(n))
        obs = ours.step({'action': np.int32(action), 'reset': False})
        step = theirs.step(action)
        np.testing.assert_allclose(
            obs['observation'], np.asarray(step.observation).reshape(-1))
        assert obs['reward'] == np.float32(step.reward or 0.0)
        if obs['is_last']:
            episodes += 1
            ours.step({'action': np.int32(0), 'reset': False})
            theirs.reset()
    theirs_path, = (tmp_path / 'b').glob('*.csv')
    ours_rows = rows(tmp_path / 'ours')
    with theirs_path.open() as f:
        theirs_rows = list(csv.DictReader(f))
    assert (tmp_path / 'ours' / 'bsuite' / theirs_path.name).exists()
    assert len(ours_rows) == len(theirs_rows) == 19  # 1..10, 12, ..., 60
    for a, b in zip(ours_rows, theirs_rows):
        assert list(a) == list(b)
        np.testing.assert_allclose(
            [float(v) for v in a.values()], [float(v) for v in b.values()])


def test_logging_episodes_are_bsuites():
    episodes = [e for e in range(1, 400) if logged(e)]
    assert episodes[:12] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14]
    assert episodes[10:] == [
        12, 14, 17, 20, 25, 30, 40, 50, 60, 70, 80, 90, 100, 120, 140, 170,
        200, 250, 300]


def test_a_new_env_continues_the_results_of_a_stopped_one(tmp_path, capsys):
    rng = np.random.default_rng(1)
    first = seeded(BSuite('catch/0', logdir=tmp_path))
    # 23 episodes and 4 steps of a 24th, then the run stops.
    play(first, 23, rng, partial=4)
    state = json.loads((tmp_path / 'bsuite' / 'state.json').read_text())
    assert state['episode'] == 23 and state['steps'] == 23 * 9
    regret = first._raw._total_regret
    assert state['info'] == {'total_regret': regret}

    second = seeded(BSuite('catch/0', logdir=tmp_path), seed=6)
    assert second._raw._total_regret == regret
    play(second, 10, rng)
    assert 'continuing the results at episode 23' in capsys.readouterr().out
    table = rows(tmp_path)
    episodes = [int(r['episode']) for r in table]
    assert episodes == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 17, 20, 25, 30]
    # The cut episode's 4 steps are not counted; the totals go on.
    assert [int(r['steps']) for r in table] == [9 * e for e in episodes]
    regrets = [float(r['total_regret']) for r in table]
    assert regrets == sorted(regrets) and regrets[-1] >= regret


def test_rows_past_the_saved_state_are_dropped(tmp_path):
    env = seeded(BSuite('catch/0', logdir=tmp_path))
    play(env, 5, np.random.default_rng(2))
    path, = (tmp_path / 'bsuite').glob('*.csv')
    with path.open('a') as f:  # A row whose state was never saved.
        f.write('54,6,0.0,9,1.0,3.0\n')
    BSuite('catch/0', logdir=tmp_path)
    assert [int(r['episode']) for r in rows(tmp_path)] == [1, 2, 3, 4, 5]


def test_no_results_without_logdir_or_with_results_off(tmp_path):
    play(BSuite('catch/0'), 2, np.random.default_rng(0))
    play(BSuite('catch/0', results=False, logdir=tmp_path), 2,
         np.random.default_rng(0))
    assert not (tmp_path / 'bsuite').exists()


def test_unknown_task_names_close_ones():
    with pytest.raises(ValueError, match="Unknown bsuite task 'cartpol/0'.*"
                       "cartpole/0"):
        BSuite('cartpol/0')


def steps_of(logdir):
    return max(int(r['steps']) for r in rows(logdir / 'env0'))


@pytest.mark.slow
def test_trains_under_parallel_and_a_rerun_continues_the_results(tmp_path):
    """`--configs bsuite` at the debug size with DreamerV3 (catch/0: the
    block's mnist downloads its data), stopped at run.steps and rerun on
    the same logdir with more steps: the results go on from the episode
    the first run finished last."""
    logdir = tmp_path / 'run'
    flags = ('--configs', 'bsuite', 'debug', '--task', 'bsuite_catch/0',
             '--script', 'parallel', '--run.envs', '1', '--run.actor_batch', '1',
             '--run.eval_envs', '0',
             '--run.train_ratio', '32', '--run.log_every', '5',
             '--logdir', logdir)
    result = launch.run(*flags, '--run.steps', '150', timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    assert 'Compiled the agent in' in result.stdout
    first = rows(logdir / 'env0')
    state = json.loads(
        (logdir / 'env0' / 'bsuite' / 'state.json').read_text())
    assert state['episode'] >= 10
    result = launch.run(*flags, '--run.steps', '300', timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    assert (f'continuing the results at episode {state["episode"]}'
            in result.stdout), result.stdout[-4000:]
    table = rows(logdir / 'env0')
    assert table[:len(first)] == first
    episodes = [int(r['episode']) for r in table]
    assert episodes == sorted(set(episodes)) and episodes[-1] >= 20
    assert [int(r['steps']) for r in table] == [9 * e for e in episodes]
