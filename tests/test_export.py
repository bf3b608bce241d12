"""`python -m embodied.export LOGDIR FILE` and `embodied.load_policy(FILE)`:
the trained agent in one file, acting in a fresh process that has neither
the logdir nor the env's package, as it acts from the logdir.

The env is a module of the test's own (`--task i61_robot:Robot`, written
to a folder that only the processes which train and export see): a
continuous `push` in [-2, 2] (the agent's space is [-1, 1]) and a discrete
gear. The steps run in processes of their own, `tests/support/policy_file.py`."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import launch
from embodied import export as exportlib
from embodied.core import tensorfile

SCRIPT = launch.SUPPORT / 'policy_file.py'
ROBOT = '''"""A robot of a lab's own: a push in [-2, 2] and a gear."""

import elements
import numpy as np

import embodied


class Robot(embodied.Env):

    @property
    def obs_space(self):
        return {
            'vector': elements.Space(np.float32, (3,)),
            'reward': elements.Space(np.float32),
            'is_first': elements.Space(bool),
            'is_last': elements.Space(bool),
            'is_terminal': elements.Space(bool),
        }

    @property
    def act_space(self):
        return {
            'push': elements.Space(np.float32, (1,), -2.0, 2.0),
            'gear': elements.Space(np.int32, (), 0, 3),
            'reset': elements.Space(bool),
        }

    def step(self, action):
        return {'vector': np.zeros(3, np.float32), 'reward': np.float32(0),
                'is_first': bool(action['reset']), 'is_last': False,
                'is_terminal': False}
'''


def run(args, module_folder=None, cwd=None, timeout=300):
    env = launch.env()
    if module_folder:
        env['PYTHONPATH'] = os.pathsep.join(
            [str(module_folder), env['PYTHONPATH']])
    result = subprocess.run(
        [sys.executable, *map(str, args)], env=env, cwd=cwd,
        capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def acts(path, seed, module_folder, cwd):
    lines = [json.loads(x) for x in run(
        [SCRIPT, 'act', path, seed], module_folder, cwd).splitlines()
        if x.startswith('{')]
    return lines[0]['env_module_importable'], lines[1:-1], lines[-1]


@pytest.mark.parametrize('agent, seed', [
    ('testing', 'none'),
    pytest.param('dreamerv3', '3', marks=pytest.mark.slow)])
def test_exported_policy_acts_without_the_logdir_or_the_env_package(
        tmp_path, agent, seed):
    modules = tmp_path / 'modules'
    modules.mkdir()
    (modules / 'i61_robot.py').write_text(ROBOT)
    logdir, file = tmp_path / 'run', tmp_path / 'shared' / 'robot.safetensors'
    elsewhere = tmp_path / 'elsewhere'  # A folder without the module.
    elsewhere.mkdir()
    run([SCRIPT, 'save', logdir, 'i61_robot:Robot', agent], modules)
    out = run(['-m', 'embodied.export', logdir, file], modules)
    assert f'Wrote {file}' in out, out

    arrays, metadata = tensorfile.read(file)
    meta = json.loads(metadata['embodied'])
    assert meta['format'] == 'embodied.policy' and meta['version'] == 1
    assert meta['agent'] == agent and meta['step'] == 7
    assert meta['config']['task'] == 'i61_robot:Robot'
    assert meta['env_act_space']['push'] == {
        'dtype': 'float32', 'shape': [1], 'low': -2.0, 'high': 2.0}
    assert meta['act_space']['push']['high'] == 1.0
    exported = exportlib.read(file)
    assert exported.env_act_space['push'].high.tolist() == [2.0]
    save = logdir / 'ckpt' / 'agent' / f'{7:012d}'
    if agent == 'dreamerv3':
        # The policy's parameters and random streams only: no optimizer
        # state, no decoder, reward or value heads.
        assert {k.split('/')[0] for k in arrays} == {'enc', 'dyn', 'pol', 'rng'}
        assert os.path.getsize(file) < os.path.getsize(
            save / 'agent.safetensors')

    with_logdir = acts(logdir, seed, modules, elsewhere)
    os.rename(logdir, tmp_path / 'moved')  # The logdir is gone.
    from_file = acts(file, seed, None, elsewhere)
    assert with_logdir[0] and not from_file[0]  # The module is absent.
    assert len(from_file[1]) == 4
    assert from_file[1] == with_logdir[1]
    assert from_file[2] == {'env_act_space': {
        'push': [-2.0, 2.0], 'gear': [0.0, 3.0]}}


def test_file_that_is_not_a_policy_is_named(tmp_path):
    import embodied
    other = tmp_path / 'weights.safetensors'
    tensorfile.save(other, {'w': np.zeros(2, np.float32)})
    with pytest.raises(exportlib.NotAnExport, match='not a policy'):
        embodied.load_policy(other)
    text = tmp_path / 'notes.txt'
    text.write_text('hello')
    with pytest.raises(exportlib.NotAnExport, match=str(text)):
        embodied.load_policy(text)


def test_export_of_a_folder_without_a_save_ends_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, '-m', 'embodied.export', str(tmp_path / 'none'),
         str(tmp_path / 'x.safetensors')], env=launch.env(),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and 'No complete checkpoint' in lines[0], lines
