"""Spaces and settings the agent cannot build for, refused at the start
(`factories.check_agent`, the agent's `check_spaces` hook; DreamerV3's
rules in embodied/agents/dreamerv3/spaces.py): one line naming the env
key, its space, the setting at fault and a value that works, exit 2,
before any worker starts and with a saved run left as it was; in every
script, in `load_policy` and for an agent of the user's own.

The envs are those of tests/support/fixtures/agent_spaces.py, and a dm_env
env in a module of the test's own folder, as a user's would be."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import launch
from embodied import factories
from embodied import main
from embodied.config import UsageError

SMALL = (
    "obs 'image' (Space(uint8, shape=(16, 16, 3), low=0, high=255)): "
    'agent.enc.simple.mults [2, 3, 4, 4] halves 16x16 images 4 times, to '
    '1x1, and the encoder must end between 2 and 16 pixels: set '
    '--agent.enc.simple.mults 2,3,4 (1 to 3 stages fit 16x16), or give '
    'images of 32 to 256 pixels a side in steps of 16 (e.g. 32x32).')

REFUSALS = [
    # id, --task (of fixtures.agent_spaces), flags, the line after the task
    ('image-too-small', 'images', [], SMALL),
    ('image-not-halved', 'images', ['--env.own.shape', '24,24,3'],
     "obs 'image' (Space(uint8, shape=(24, 24, 3), low=0, high=255)): "
     'agent.enc.simple.mults [2, 3, 4, 4] halves 24x24 images 4 times, '
     'which needs sides that 16 divides: set --agent.enc.simple.mults '
     '2,3,4 --agent.dec.simple.mults 2,3,4 (1 to 3 stages fit 24x24), or '
     'give images of 32 to 256 pixels a side in steps of 16 (e.g. '
     '32x32).'),
    ('decoder-stages', 'images',
     ['--env.own.shape', '24,24,3', '--agent.enc.simple.mults', '2,3,4'],
     "obs 'image' (Space(uint8, shape=(24, 24, 3), low=0, high=255)): "
     'agent.dec.simple.mults [2, 3, 4, 4] doubles the decoder 4 times up '
     'to the image, which needs sides that 16 divides: set '
     '--agent.dec.simple.mults 2,3,4, or give images whose sides 16 '
     'divides.'),
    ('decoder-bspace', 'images',
     ['--env.own.shape', '64,64,3', '--agent.dec.simple.bspace', '3'],
     "obs 'image' (Space(uint8, shape=(64, 64, 3), low=0, high=255)): "
     'agent.dec.simple.bspace 3 must divide agent.dyn.rssm.deter 8 and '
     "the decoder's last depth 8 (dec.simple.depth x the last of "
     'dec.simple.mults): set --agent.dec.simple.bspace 8.'),
    ('image-dtype', 'images',
     ['--env.own.shape', '64,64,3', '--env.own.dtype', 'float32'],
     "obs 'image' (Space(float32, shape=(64, 64, 3), low=-inf, high=inf)): "
     'DreamerV3 takes an observation of 3 dims as an image of uint8 (0 to '
     '255), not float32: give it as uint8, or as a vector of shape '
     '(12288,).'),
    ('image-without-channels', 'images', ['--env.own.shape', '64,64'],
     "obs 'image' (Space(uint8, shape=(64, 64), low=0, high=255)): "
     'DreamerV3 takes uint8 arrays of 2 dims for images without a channel '
     'axis, which it cannot encode: give it shape (64, 64, 1), or another '
     'dtype for a vector.'),
    ('image-channels', 'images', ['--env.own.shape', '64,64,4'],
     "obs 'image' (Space(uint8, shape=(64, 64, 4), low=0, high=255)) has 4 "
     "channels, and the report's open-loop videos (agent.report_openloop "
     'True) draw images of 1 or 3: set --agent.report_openloop False, or '
     'split it into images of 1 or 3 channels.'),
    ('image-sizes', 'two_sizes', [],
     "obs 'image' (Space(uint8, shape=(64, 64, 3), low=0, high=255)) is "
     "64x64 and obs 'depth' (Space(uint8, shape=(32, 32, 1), low=0, "
     'high=255)) 32x32; DreamerV3 stacks its images, which need one size: '
     'resize one to the other (embodied.wrappers.ResizeImage).'),
    ('four-dims', 'deep', [],
     "obs 'grid' (Space(float32, shape=(2, 3, 4, 5), low=-inf, high=inf)) "
     'has 4 dims; DreamerV3 takes vectors of up to 2 dims and images of 3 '
     '(height, width, channels): give it a shape of 3 dims, e.g. '
     '(2, 3, 20).'),
    ('obs-classes', 'uneven_obs', [],
     "obs 'item' (Space(int32, shape=(2,), low=0, high=3)) has entries of "
     '3, 5 classes; DreamerV3 reads a discrete observation with one class '
     'count for all its entries: give every entry high 5.'),
    ('obs-low', 'shifted_obs', [],
     "obs 'level' (Space(int32, shape=(), low=-2, high=3)) starts at -2; "
     'DreamerV3 reads a discrete observation as class indices from 0: give '
     'it low 0 and high 5, and shift its values by 2.'),
    ('action-low', 'shifted_action', [],
     "act 'action' (Space(int32, shape=(), low=1, high=4)) starts at 1; "
     'DreamerV3 gives a discrete action as class indices from 0: give it '
     'low 0 and high 3, and add 1 to it in the env.'),
    ('action-classes', 'uneven_action', [],
     "act 'action' (Space(int32, shape=(2,), low=0, high=3)) has entries of "
     '3, 5 classes; DreamerV3 gives a discrete action with one class count '
     'for all its entries: give every entry high 5.'),
    ('action-unbounded', 'unbounded_action', [],
     "act 'action' (Space(int32, shape=(), low=-2147483648, "
     'high=2147483647)) has no bounds; DreamerV3 gives a discrete action as '
     'one of its high - low classes: give it low 0 and high the number of '
     'choices.'),
    ('agent-setting', 'images', ['--env.own.shape', '64,64,3',
                                 '--agent.dyn.typ', 'transformer'],
     "Unsupported agent config: agent.dyn.typ is 'transformer'; supported: "
     "'rssm'."),
    ('own-agent-hook', 'push',
     ['--agent_impl', 'fixtures.agent_spaces:PickyAgent'],
     "act 'push' (Space(float32, shape=(), low=-1, high=1)): PickyAgent acts "
     'in discrete actions only; make it discrete (e.g. '
     'embodied.wrappers.DiscretizeAction).'),
]


@pytest.fixture
def saved_run(tmp_path):
    """A logdir as an earlier run left it, and a snapshot of its files."""
    logdir = tmp_path / 'run'
    save = logdir / 'ckpt' / 'agent' / '000000000100'
    save.mkdir(parents=True)
    (save / 'done').write_text('')
    (logdir / 'metrics.jsonl').write_text('{"step": 100}\n')
    (logdir / 'config.yaml').write_text('task: earlier\n')
    return logdir, snapshot(logdir)


def snapshot(folder):
    return sorted(
        (str(p), p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b'')
        for p in folder.rglob('*'))


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fails the test if the script would run: its workers start there."""
    def run(config):
        raise AssertionError(f'--script {config.script} started')
    monkeypatch.setattr(main, 'run', run)


def refused(capsys, argv):
    with pytest.raises(SystemExit) as exit:
        main.main(argv)
    captured = capsys.readouterr()
    assert 'Logdir:' not in captured.out, captured.out
    return exit.value.code, captured.err


@pytest.mark.parametrize(
    'task, flags, says', [r[1:] for r in REFUSALS],
    ids=[r[0] for r in REFUSALS])
def test_the_start_refuses_it_in_one_line(
        capsys, saved_run, nothing_starts, task, flags, says):
    logdir, before = saved_run
    task = f'fixtures.agent_spaces:{task}'
    code, error = refused(capsys, [
        '--configs', 'debug', '--script', 'parallel', '--task', task,
        '--logdir', str(logdir), *flags])
    assert code == 2
    assert error == f'error: --task {task}: {says}\n', error
    assert snapshot(logdir) == before


@pytest.mark.parametrize('script', [
    'train', 'eval_only', 'parallel_env', 'parallel_envs', 'parallel_replay'])
def test_every_script_refuses_it(capsys, saved_run, nothing_starts, script):
    """The scripts of one process and those that start one role of the
    parallel runner, env commands included, check the agent too."""
    logdir, before = saved_run
    task = 'fixtures.agent_spaces:images'
    code, error = refused(capsys, [
        '--configs', 'debug', '--script', script, '--task', task,
        '--logdir', str(logdir)])
    assert code == 2 and error == f'error: --task {task}: {SMALL}\n', error
    assert snapshot(logdir) == before


@pytest.mark.parametrize('flags', [
    ['--agent.enc.simple.mults', '2,3,4'],  # The setting the line names.
    ['--env.own.shape', '32,32,3'],         # The image size it names.
])
def test_the_value_the_line_names_passes(flags):
    config = main.parse([
        '--configs', 'debug', '--script', 'parallel',
        '--task', 'fixtures.agent_spaces:images', *flags])
    main.check_start(config)


def test_an_agent_of_your_own_is_asked_only_through_its_hook():
    """PickyAgent takes discrete actions; an agent without the hook (the
    test agent) is not asked; a random agent takes anything."""
    config = main.parse([
        '--configs', 'debug', '--task', 'fixtures.agent_spaces:push',
        '--agent_impl', 'fixtures.agent_spaces:PickyAgent'])
    spaces = factories.env_spaces(config)
    with pytest.raises(UsageError, match="act 'push'"):
        factories.check_agent(config, *spaces)
    discrete = config.update(task='fixtures.own_envs:Spaces')
    factories.check_agent(discrete, *factories.env_spaces(discrete))
    for other in ({'agent_impl': 'testing'}, {'random_agent': True}):
        factories.check_agent(config.update(other), *spaces)


def test_load_policy_refuses_it_before_building_the_agent(tmp_path):
    import embodied
    from embodied import config as configlib
    from embodied.core import checkpoint as cplib
    from embodied.run import saving
    logdir = tmp_path / 'run'
    logdir.mkdir()
    config = configlib.build(['debug']).update(
        task='fixtures.agent_spaces:images', logdir=str(logdir))
    config.save(logdir / 'config.yaml')
    cplib.write(saving.directory(logdir, 'agent') / f'{100:012d}',
                {'agent': lambda: {'x': np.zeros(1)}})
    with pytest.raises(UsageError) as refusal:
        embodied.load_policy(logdir)
    assert str(refusal.value) == (
        f'--task fixtures.agent_spaces:images: {SMALL}')


PIXELS = '''
    import dm_env
    import numpy as np
    from dm_env import specs


    class Pixels(dm_env.Environment):
        """A dm_env env of 16x16 images, too small for DreamerV3's CNN."""

        def observation_spec(self):
            return {'image': specs.BoundedArray(
                (16, 16, 3), np.uint8, 0, 255, name='image')}

        def action_spec(self):
            return specs.DiscreteArray(3, name='action')

        def reset(self):
            return dm_env.restart({'image': np.zeros((16, 16, 3), np.uint8)})

        def step(self, action):
            return dm_env.transition(
                0.0, {'image': np.zeros((16, 16, 3), np.uint8)})
'''


def test_a_run_on_16x16_images_ends_in_one_line(tmp_path):
    """The user's path: `--script parallel` on a dm_env env of a module in
    the working directory, resuming a saved run. It ends with the one line
    and exit 2 before any worker starts (the launcher prints nothing of
    theirs), and the saves are untouched."""
    pytest.importorskip('dm_env')
    (tmp_path / 'pixels.py').write_text(textwrap.dedent(PIXELS))
    logdir = tmp_path / 'run'
    (logdir / 'ckpt' / 'agent' / '000000000100').mkdir(parents=True)
    (logdir / 'ckpt' / 'agent' / '000000000100' / 'done').write_text('')
    (logdir / 'metrics.jsonl').write_text('{"step": 100}\n')
    before = snapshot(logdir)
    result = subprocess.run(
        [sys.executable, '-m', 'embodied.main', '--configs', 'debug',
         '--script', 'parallel', '--task', 'pixels:Pixels',
         '--logdir', str(logdir)],
        cwd=tmp_path, env=launch.env(), capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    # dm_env's inclusive maximum 255 is embodied's exclusive high 256.
    says = SMALL.replace('high=255', 'high=256')
    assert result.stderr.splitlines() == [
        f'error: --task pixels:Pixels: {says}'], result.stderr
    assert result.stdout == '', result.stdout
    assert snapshot(logdir) == before
