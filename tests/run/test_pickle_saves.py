"""Saves written as pickles by an earlier version: refused at the start in
one line naming `run.trust_pickle`, nothing changed; with the key, resumed
once, and saved in the new format from then on.

The fixture is a logdir that main at 20df691 wrote (a `--configs debug`
DreamerV3 run of `--script parallel` on cartpole_balance, its newest save
at step 171: `tests/support/fixtures/save_20df691/README.md`)."""

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

import launch
from embodied.core import checkpoint as cplib
from embodied.run import saving

FIXTURE = launch.SUPPORT / 'fixtures' / 'save_20df691'
TAG = 171
# The flags of the run that wrote the fixture.
FLAGS = ('--configs', 'debug', '--task', 'cartpole_balance', '--run.envs',
         '1', '--run.actor_batch', '1', '--run.eval_envs', '0',
         '--logger.outputs', 'jsonl', '--run.log_every', '1')


@pytest.fixture
def old_logdir(tmp_path):
    logdir = tmp_path / 'run'
    shutil.copytree(FIXTURE, logdir)
    (logdir / 'README.md').unlink()
    return logdir


def contents(folder):
    """{relative path: sha256} of every file under `folder`."""
    result = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, 'rb') as f:
                result[os.path.relpath(path, folder)] = hashlib.sha256(
                    f.read()).hexdigest()
    return result


def run_main(*flags, timeout=120):
    return subprocess.run(
        launch.command(*FLAGS, *flags), cwd=launch.ROOT, env=launch.env(),
        capture_output=True, text=True, timeout=timeout)


def test_fixture_is_an_earlier_versions_pickle_save():
    for role in saving.ROLES:
        folder = FIXTURE / 'ckpt' / role / f'{TAG:012d}'
        assert cplib.pickle_files(folder), folder
        assert cplib.damage(folder) is None, folder
    assert saving.resume_tag(FIXTURE, report=False) == TAG


@pytest.mark.parametrize('script', ['parallel', 'train', 'eval_only'])
def test_pickle_save_ends_the_start_in_one_line_and_changes_nothing(
        old_logdir, script):
    before = contents(old_logdir)
    result = run_main('--script', script, '--run.steps', '300',
                      '--logdir', old_logdir)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith('error: ') and 'is a pickle save' in line, line
    assert '--run.trust_pickle True' in line, line
    assert str(old_logdir / 'ckpt') in line, line
    assert 'Launching' not in result.stdout  # No worker started.
    assert contents(old_logdir) == before


def test_pickle_save_of_from_checkpoint_ends_the_start_in_one_line(
        tmp_path, old_logdir):
    fresh = tmp_path / 'fresh'
    result = run_main('--script', 'parallel', '--run.steps', '300',
                      '--run.from_checkpoint', old_logdir, '--logdir', fresh)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and '--run.trust_pickle True' in lines[0], lines
    assert str(old_logdir / 'ckpt' / 'agent' / f'{TAG:012d}') in lines[0]
    assert not fresh.exists()


@pytest.mark.slow
def test_pickle_save_resumes_with_the_key_then_saves_the_new_format(
        old_logdir):
    from tests.run.parallel.test_parallel import Tree, finish
    first = launch.Launch(
        '--script', 'parallel', *FLAGS, '--run.steps', str(TAG + 40),
        '--run.trust_pickle', 'True', '--logdir', old_logdir,
        logfile=old_logdir.parent / 'first.log')
    code, output = finish(first, Tree(first.proc), 300)
    assert code == 0 and 'Traceback' not in output, output[-4000:]
    for role in saving.ROLES:
        folder = old_logdir / 'ckpt' / role / f'{TAG:012d}'
        assert (f'Read {folder} as a pickle save (--run.trust_pickle True); '
                f'the next save is in the new format.') in output
    assert f'Learner resumed the agent from the save at step {TAG}' in output
    assert f'Replay resumed from the save at step {TAG}' in output
    assert f'Logger resumed at step {TAG}' in output
    newest = saving.resume_tag(old_logdir, report=False)
    assert newest > TAG
    for role in saving.ROLES:
        folder = old_logdir / 'ckpt' / role / f'{newest:012d}'
        assert cplib.pickle_files(folder) == [], os.listdir(folder)
        assert any(n.endswith('.json') for n in os.listdir(folder))
    # The next start needs no key: it resumes from the new save.
    second = launch.Launch(
        '--script', 'parallel', *FLAGS, '--run.steps', str(newest + 20),
        '--logdir', old_logdir, logfile=old_logdir.parent / 'second.log')
    code, output = finish(second, Tree(second.proc), 300)
    assert code == 0 and 'Traceback' not in output, output[-4000:]
    assert f'Learner resumed the agent from the save at step {newest}' in (
        output)
    assert 'as a pickle' not in output


LOAD = '''
import sys, numpy as np, embodied
from embodied.core import checkpoint
try:
    embodied.load_policy(sys.argv[1])
except checkpoint.PickleSave as e:
    print('refused:', e)
policy = embodied.load_policy(sys.argv[1], trust_pickle=True, seed=0)
obs = {k: np.zeros((1, *v.shape), v.dtype)
       for k, v in policy.obs_space.items()}
obs['is_first'][:] = True
print('acted:', policy(obs)['action'].shape)
'''


@pytest.mark.slow
def test_load_policy_and_export_read_a_pickle_save_only_when_trusted(
        tmp_path, old_logdir):
    result = subprocess.run(
        [sys.executable, '-c', LOAD, str(old_logdir)], env=launch.env(),
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    agent_pkl = old_logdir / 'ckpt' / 'agent' / f'{TAG:012d}' / 'agent.pkl'
    assert f'refused: {agent_pkl} is a pickle save' in result.stdout
    assert 'trust_pickle=True' in result.stdout
    assert 'as a pickle save (trust_pickle=True).' in result.stdout
    assert 'acted: (1,)' in result.stdout

    file = tmp_path / 'policy.safetensors'
    export = [sys.executable, '-m', 'embodied.export', str(old_logdir),
              str(file)]
    result = subprocess.run(export, env=launch.env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and not file.exists(), result.stderr
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and '--trust_pickle' in lines[0], lines
    result = subprocess.run(export + ['--trust_pickle'], env=launch.env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and file.exists(), result.stderr[-2000:]


SET_AGENT = '''
from embodied.agents.testing import TestAgent


class KeepsASet(TestAgent):

    def save(self):
        data = super().save()
        data['counters']['seen'] = {1, 2}
        return data
'''


@pytest.mark.parametrize('script', [
    'train', pytest.param('parallel', marks=pytest.mark.slow)])
def test_agent_whose_save_needs_a_pickle_ends_the_run_in_one_line(
        tmp_path, script):
    (tmp_path / 'i61_agents.py').write_text(SET_AGENT)
    env = launch.env()
    env['PYTHONPATH'] = os.pathsep.join([str(tmp_path), env['PYTHONPATH']])
    logdir = tmp_path / 'run'
    result = subprocess.run(launch.command(
        '--configs', 'debug', '--task', 'dummy_disc', '--agent_impl',
        'i61_agents:KeepsASet', '--script', script, '--run.steps', '200',
        '--run.envs', '2', '--run.actor_batch', '1', '--run.eval_envs', '0',
        '--logdir', logdir), cwd=launch.ROOT, env=env, capture_output=True,
        text=True, timeout=300)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert lines == [
        "error: Cannot save 'agent' entry 'counters/seen': it is a "
        "builtins.set, which a save holds only as a pickle. save() may "
        "return numpy arrays, numbers, strings, bytes, None, and lists, "
        "tuples and dicts of them."], result.stderr
    assert 'Traceback' not in result.stdout
    assert saving.resume_tag(logdir, report=False) is None  # No save.
