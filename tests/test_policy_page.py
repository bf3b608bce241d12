"""`embodied.load_policy` and docs/your-policy.md as a user reads it.

The page's commands run exactly as written, from a folder that holds the
checkout's `examples/`: the `debug` DreamerV3 trains on gymnasium's
CartPole (its spaces are those of `cartpole_balance`, so its programs come
from the compilation cache the suite's other debug runs fill) and on
Pendulum (a continuous action in [-2, 2]), then each example script loads
its policy in a process of its own and plays an episode in each of two
envs (CartPole's again from the one file that the page's `python -m
embodied.export` writes). `tests/support/policy_parity.py` then checks, in
another process, that what reaches each gymnasium env from the policy is
what reached it from the run's own eval policy through the run's env
wrappers, step by step (for Pendulum: in the Box's bounds, with actions the
clip had to bring back), that each env's state starts afresh at
`is_first`, and that a config of a run on GPUs loads on the CPU.

The quick tests load the numpy test agent (`agent_impl testing`), saved
the way a run saves it, without JAX."""

import re
import subprocess
import sys

import elements
import numpy as np
import pytest

import launch
from tests.test_own_env_page import run_as_written
from tests.test_user_paths import page_commands

PAGE = launch.ROOT / 'docs' / 'your-policy.md'
PARITY = launch.SUPPORT / 'policy_parity.py'
# What each example prints of an env's first episode.
EPISODES = {
    'cartpole': r'env (\d): return (\d+) in (\d+) steps',
    'pendulum': (r'env (\d): return (-?[\d.]+) in (\d+) steps, torques from '
                 r'(-?[\d.]+) to (-?[\d.]+)'),
}


def commands():
    """{example: (train, play)}: the page's commands, two an example (the
    export's two follow: `export_commands`)."""
    found = page_commands(PAGE.read_text())[:2 * len(EPISODES)]
    pairs = dict(zip(EPISODES, zip(found[::2], found[1::2])))
    for name, (train, play) in pairs.items():
        assert f'{name}_policy.py' in play and name in train.lower(), pairs
    return pairs


def export_commands():
    """(export, play): the page's export of the CartPole run, then the
    CartPole example on the file it wrote."""
    found = page_commands(PAGE.read_text())
    assert len(found) == 2 * len(EPISODES) + 2, found
    export, play = found[-2:]
    assert 'embodied.export' in export and play.endswith('.safetensors')
    return export, play


def test_page_excerpts_are_the_example_files():
    excerpts = re.findall(
        r'```python\n# (\S+) \(.*?\)\n(.*?)```', PAGE.read_text(), re.S)
    assert [path for path, _ in excerpts] == [
        f'examples/policy/{name}_policy.py' for name in EPISODES], excerpts
    for path, code in excerpts:
        assert code in (launch.ROOT / path).read_text(), path


def check_episodes(name, output):
    episodes = re.findall(EPISODES[name], output)
    assert [e[0] for e in episodes] == ['0', '1'], output[-3000:]
    if name == 'cartpole':
        assert all(int(ret) == int(length) > 0 for _, ret, length in episodes)
    else:  # Pendulum's episodes end at 200 steps, torques within its Box.
        assert 'The agent gives torques in [-2, 2]' in output, output[-3000:]
        for _, ret, length, low, high in episodes:
            assert int(length) == 200 and float(ret) < 0, episodes
            assert -2 <= float(low) <= float(high) <= 2, episodes


@pytest.mark.slow
@pytest.mark.parametrize('name', list(EPISODES))
def test_page_trains_then_a_fresh_process_gives_what_the_runs_env_received(
        tmp_path, name):
    train, play = commands()[name]
    (tmp_path / 'examples').symlink_to(launch.ROOT / 'examples')
    code, output = run_as_written(train, tmp_path)
    assert code == 0 and 'Reached run.steps (200)' in output, output[-3000:]
    code, output = run_as_written(play, tmp_path)
    assert code == 0 and 'Traceback' not in output, output[-3000:]
    check_episodes(name, output)
    logdir = tmp_path / re.search(r'--logdir (\S+)', train).group(1)
    result = subprocess.run(
        [sys.executable, str(PARITY), str(logdir), '2'], env=launch.env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    found = re.search(
        r'parity: \d+ steps, env 0 reset at step \d+, (\d+) actions '
        r'clipped', result.stdout)
    assert found, result.stdout[-3000:]
    if name == 'pendulum':
        assert int(found.group(1)) > 0, result.stdout[-3000:]
        return
    # The one file of `embodied.export`, played by the same script.
    export, play_file = export_commands()
    code, output = run_as_written(export, tmp_path)
    assert code == 0 and 'Wrote logdir/cartpole-policy.safetensors' in output
    code, output = run_as_written(play_file, tmp_path)
    assert code == 0 and 'Traceback' not in output, output[-3000:]
    check_episodes(name, output)


def test_load_policy_is_reached_from_embodied_without_importing_jax():
    code = ('import sys, embodied; f = embodied.load_policy; '
            'assert callable(f) and "jax" not in sys.modules, f')
    result = subprocess.run(
        [sys.executable, '-c', code], env=launch.env(), capture_output=True,
        text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def testing_run(tmp_path):
    """A logdir as a run of the numpy test agent on the dummy env leaves
    it: config.yaml and one agent save."""
    from embodied import config as configlib
    from embodied import factories
    from embodied.core import checkpoint as cplib
    from embodied.run import saving
    logdir = tmp_path / 'run'
    config = configlib.build(['debug']).update(
        agent_impl='testing', task='dummy_disc', logdir=str(logdir))
    config = config.update({
        'env.dummy.size': [8, 8], 'testing.check_content': False})
    logdir.mkdir()
    config.save(logdir / 'config.yaml')
    agent = factories.make_agent(config)
    cplib.write(saving.directory(logdir, 'agent') / f'{12:012d}',
                {'agent': agent.save})
    return logdir


def dummy_obs(policy, rows, count, first):
    """Step `count` of `rows` dummy envs (the test agent checks that each
    row's count follows the last one's)."""
    obs = {k: np.zeros((rows, *v.shape), v.dtype)
           for k, v in policy.obs_space.items()}
    obs['count'] += count
    obs['is_first'] |= first
    return obs


def test_policy_keeps_one_state_per_env_and_names_bad_input(testing_run):
    import embodied
    policy = embodied.load_policy(testing_run, batch_size=2)
    assert set(policy.act_space) == {'action'}, policy.act_space
    for count in range(3):  # The test agent checks each row's order.
        act = policy(dummy_obs(policy, 2, count, first=count == 0))
        assert act['action'].shape == (2,), act
        assert policy.carry['count'].tolist() == [count, count]
    with pytest.raises(ValueError, match='a new batch of 3 envs'):
        policy(dummy_obs(policy, 3, 3, first=False))
    policy(dummy_obs(policy, 3, 0, first=True))  # A new batch starts episodes.
    bad = dummy_obs(policy, 3, 1, first=False)
    del bad['vector']
    with pytest.raises(KeyError, match='observations lack vector'):
        policy(bad)
    bad = dummy_obs(policy, 3, 1, first=False)
    bad['vector'] = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"'vector' has shape \(3, 4\); "
                       r"expected \(envs, \*\(7,\)\)"):
        policy(bad)


def test_load_policy_names_what_is_missing(tmp_path, testing_run):
    import embodied
    with pytest.raises(FileNotFoundError, match='load_policy: No complete'):
        embodied.load_policy(tmp_path / 'nothing')
    save = next(elements.Path(testing_run / 'ckpt' / 'agent').glob('*'))
    (testing_run / 'config.yaml').unlink()
    with pytest.raises(FileNotFoundError, match='no config.yaml in'):
        embodied.load_policy(save)
    with pytest.raises(ValueError, match='mode must be one of'):
        embodied.load_policy(testing_run, mode='greedy')
