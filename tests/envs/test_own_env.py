"""Your own env by `--task module:attr` (embodied/envs/own.py): how a task is
read, the `env.own` keys a factory gets, the examples of
docs/own-environment.md built through `make_env`, and the one line a broken
env ends a run with (exit 2, before any worker starts, nothing saved lost).
The runs that train on the examples are in tests/test_own_env_page.py."""

import subprocess
import sys

import numpy as np
import pytest

import launch
from embodied import factories
from embodied import main
from embodied.config import UsageError
from embodied.envs import own

EXAMPLES = launch.ROOT / 'examples' / 'own_env'
CORRIDORS = [
    # --task, env.own (None: the gym suite's task)
    ('corridor:Corridor', {'length': 6}),
    ('corridor_gym:Corridor', {'length': 6}),
    ('corridor_dm:Corridor', {'length': 6}),
    ('gym_corridor_gym:Corridor-v0', None),
]


@pytest.fixture
def examples(monkeypatch):
    """The examples' folder on sys.path, as PYTHONPATH puts it there."""
    monkeypatch.syspath_prepend(str(EXAMPLES))


# How a task is read


@pytest.mark.parametrize('task, is_own', [
    ('corridor:Corridor', True),
    ('my_envs:Corridor', True),             # 'my' is no suite
    ('pkg.sub.envs:make_env', True),
    ('envs:Factory.create', True),           # a dotted attribute
    ('gym_mypkg.envs:Maze-v0', False),      # gymnasium's id, with a version
    ('gym_nosuchmodule:Maze', False),       # no module gym_nosuchmodule
    ('gym_CartPole-v1', False),
    ('cartpole_balance', False),
    ('mypkg.envs:Maze-v0', False),          # no Python name after ':'
    ('corridor:', False),
])
def test_which_tasks_name_your_own_env(task, is_own):
    assert main.is_own_task(task) == is_own


def test_a_module_named_like_a_suite_is_yours_when_python_finds_it(
        tmp_path, monkeypatch):
    """`gym_tools:Maze` is the gym suite's gymnasium id `tools:Maze` until a
    module `gym_tools` is on the path (here: the working directory)."""
    assert not main.is_own_task('gym_tools:Maze')
    (tmp_path / 'gym_tools.py').write_text(
        'from corridor import Corridor as Maze\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, 'path', [
        p for p in sys.path if p not in ('', str(tmp_path))])
    assert main.is_own_task('gym_tools:Maze')
    assert str(tmp_path) in sys.path  # Put there for spawned workers too.
    config = main.parse(['--task', 'gym_tools:Maze', '--env.own.length', '3'])
    env = main.make_env(config, 0)
    assert env.act_space['action'].high == 2
    env.close()


# The env.own keys


def test_factory_keys_are_its_defaults(monkeypatch):
    keys = own.config_keys(
        __import__('fixtures.own_envs').own_envs.keywords, 'x:keywords')
    assert keys == {
        'length': 6, 'name': 'a', 'rate': 0.5, 'flag': True,
        'shape': [2, 3], 'use_seed': True, 'use_logdir': True}
    with pytest.raises(UsageError, match="parameter 'size' has no default"):
        main.parse(['--task', 'fixtures.own_envs:needs_size'])


def test_flags_set_the_factory_keys_typed_by_their_defaults(tmp_path):
    config = main.parse([
        '--task', 'fixtures.own_envs:keywords', '--env.own.length', '4',
        '--env.own.shape', '5,6', '--env.own.flag', 'False',
        '--logdir', str(tmp_path)])
    assert dict(config.env.own) == {
        'length': 4, 'name': 'a', 'rate': 0.5, 'flag': False,
        'shape': (5, 6), 'use_seed': True, 'use_logdir': True}
    kwargs = factories.env_kwargs(config, 'own', 3, {})
    assert str(kwargs['logdir']) == str(tmp_path / 'env3')
    assert kwargs['seed'] != factories.env_kwargs(config, 'own', 2, {})['seed']
    with pytest.raises(UsageError, match="known key is 'env.own.length'"):
        main.parse(['--task', 'fixtures.own_envs:keywords',
                    '--env.own.lenght', '4'])
    with pytest.raises(UsageError, match="int.*'4.5'.*env.own.length"):
        main.parse(['--task', 'fixtures.own_envs:keywords',
                    '--env.own.length', '4.5'])
    # The keys exist only for a task of your own.
    with pytest.raises(UsageError, match="Unknown flag '--env.own.length'"):
        main.parse(['--task', 'dummy_disc', '--env.own.length', '4'])


# The page's examples through make_env


@pytest.mark.parametrize('task, keys', CORRIDORS)
def test_each_example_walks_to_the_goal(examples, task, keys):
    """The corridor written three ways, and by its gymnasium id, has the
    same spaces, and walking right reaches the goal with reward 1."""
    config = main.parse(['--configs', 'debug', '--task', task])
    assert config.env.get('own') == keys
    env = main.make_env(config, 0)
    assert {k: (v.dtype, v.shape) for k, v in env.obs_space.items()} == {
        'vector': (np.float32, (4,)), 'reward': (np.float32, ()),
        'is_first': (bool, ()), 'is_last': (bool, ()),
        'is_terminal': (bool, ())}
    assert env.act_space['action'].high == 2
    obs = env.step({'action': np.int32(1), 'reset': True})
    assert obs['is_first']
    for _ in range(5):
        obs = env.step({'action': np.int32(1), 'reset': False})
    assert obs['reward'] == 1 and obs['is_terminal'] and obs['is_last']
    env.close()


def test_a_flag_reaches_the_factory(examples):
    config = main.parse([
        '--task', 'corridor_dm:Corridor', '--env.own.length', '3'])
    env = main.make_env(config, 0)
    env.step({'action': np.int32(1), 'reset': True})
    env.step({'action': np.int32(1), 'reset': False})
    assert env.step({'action': np.int32(1), 'reset': False})['is_terminal']
    env.close()


# Broken envs: one line, exit 2, before anything starts


FAILURES = [
    # --task, what the line says
    ('nosuchmodule:Corridor', "no module 'nosuchmodule' in the working "
                              "directory"),
    ('gym_nosuchmodule:Maze-v0', "(gymnasium's 'nosuchmodule:Maze-v0'): no "
                                 "module 'nosuchmodule'"),
    ('fixtures.own_envs:Corridr', "own_envs.py has no attribute 'Corridr'"),
    ('fixtures.own_envs:failing', "failing(length=3) raised ValueError: no "
                                  "corridor of length 3 (tests/support/"
                                  "fixtures/own_envs.py:11)"),
    ('fixtures.own_envs:number', 'number returned an object of type int'),
    ('fixtures.own_envs:gym_text', "observation 'note' has a Text space"),
    ('fixtures.own_envs:dm_strings', "observation 'word' has a spec of "
                                     "dtype object (StringArray)"),
    ('fixtures.own_envs:runner_key', "obs 'envid' (Space(int32"),
    ('fixtures.own_envs:int_reward', "obs 'reward' has Space(int32, "
                                     "shape=(3,)"),
    ('fixtures.own_envs:NoReset', "act has no 'reset'"),
    ('fixtures.own_envs:log_action', "act 'log/x'"),
    ('fixtures.own_envs:shared_key', "key 'vector' is in both"),
]


@pytest.mark.parametrize('task, says', FAILURES, ids=[t for t, _ in FAILURES])
def test_a_broken_env_ends_the_run_with_one_line(tmp_path, capsys, task, says):
    """`--script parallel` refuses it while main builds its first env, so
    no worker starts; the logdir is not even made."""
    logdir = tmp_path / 'run'
    with pytest.raises(SystemExit) as exit:
        main.main(['--configs', 'debug', '--script', 'parallel',
                   '--task', task, '--logdir', str(logdir)])
    assert exit.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f'error: --task {task}'), error
    assert error.count('\n') == 1 and says in error, error
    assert not logdir.exists()


@pytest.mark.parametrize('script', ['eval_only', 'parallel_envs'])
def test_scripts_without_a_replay_check_the_env_too(tmp_path, capsys, script):
    with pytest.raises(SystemExit) as exit:
        main.main(['--configs', 'debug', '--script', script, '--task',
                   'fixtures.own_envs:failing', '--logdir', str(tmp_path)])
    assert exit.value.code == 2
    assert 'failing(length=3) raised ValueError' in capsys.readouterr().err


def test_a_broken_env_leaves_a_saved_run_as_it_was(tmp_path):
    """The user's path: a run resumed with a factory that now raises ends
    at once with the one line, and its saves are untouched."""
    logdir = tmp_path / 'run'
    (logdir / 'ckpt' / 'agent' / '000000000100').mkdir(parents=True)
    (logdir / 'ckpt' / 'agent' / '000000000100' / 'done').write_text('')
    (logdir / 'metrics.jsonl').write_text('{"step": 100}\n')
    before = sorted((p, p.stat().st_mtime_ns) for p in logdir.rglob('*'))
    result = subprocess.run(
        launch.command('--configs', 'debug', '--script', 'parallel',
                       '--task', 'fixtures.own_envs:failing',
                       '--logdir', logdir),
        cwd=launch.ROOT, env=launch.env(), capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        'error: --task fixtures.own_envs:failing: failing(length=3) raised '
        'ValueError: no corridor of length 3 '
        '(tests/support/fixtures/own_envs.py:11)'], result.stderr
    assert sorted((p, p.stat().st_mtime_ns)
                  for p in logdir.rglob('*')) == before


# Where the run finds your module: its working directory, in every process


def working_directory(tmp_path):
    """A project folder holding a module of the user's own (the corridor
    as `my_corridor`, on no path) and `embodied_cli.py` elsewhere: a
    launcher like the `embodied` command, whose folder, not the working
    directory, is `sys.path[0]`."""
    project = tmp_path / 'project'
    project.mkdir()
    (project / 'my_corridor.py').write_text(
        (EXAMPLES / 'corridor.py').read_text())
    (tmp_path / 'bin').mkdir()
    cli = tmp_path / 'bin' / 'embodied_cli.py'
    cli.write_text(  # As pip writes the `embodied` command.
        'import sys\nfrom embodied.main import main\n'
        'if __name__ == "__main__":\n    sys.exit(main())\n')
    return project, cli


def start(argv, cwd, logfile):
    return subprocess.Popen(
        argv, cwd=cwd, env=launch.env(), stdout=open(logfile, 'w'),
        stderr=subprocess.STDOUT)


def finish(procs, logs, timeout=300):
    try:
        codes = [proc.wait(timeout) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    outputs = [log.read_text() for log in logs]
    for code, output in zip(codes, outputs):
        assert code == 0 and 'Traceback' not in output, output[-3000:]
    return outputs


@pytest.mark.slow
def test_workers_and_env_commands_import_a_module_of_the_working_directory(
        tmp_path):
    """A `parallel` launch through the launcher (the working directory is
    not sys.path[0]) and its envs as a separate `parallel_envs` command,
    both started in the project folder: the launch builds env 0 and the
    command's spawned env workers step the module's envs."""
    from embodied.rpc import addresses
    project, cli = working_directory(tmp_path)
    ports = addresses.free_ports(3)
    common = [
        '--configs', 'debug', '--task', 'my_corridor:Corridor',
        '--env.own.length', '3', '--random_agent', 'True',
        '--run.steps', '150', '--logdir', str(tmp_path / 'run'),
        # One env: the run steps only once the command's worker is there.
        '--run.envs', '1', '--run.eval_envs', '0', '--run.actor_batch', '1',
        '--run.actor_addr', f'localhost:{ports[0]}',
        '--run.replay_addr', f'localhost:{ports[1]}',
        '--run.logger_addr', f'localhost:{ports[2]}']
    logs = [tmp_path / 'main.log', tmp_path / 'envs.log']
    procs = [
        start([sys.executable, str(cli), '--script', 'parallel',
               '--run.remote_envs', 'True', *common], project, logs[0]),
        start([sys.executable, '-m', 'embodied.main', '--script',
               'parallel_envs', *common], project, logs[1])]
    outputs = finish(procs, logs)
    assert 'Reached run.steps (150)' in outputs[0], outputs[0][-3000:]
    scores = launch.metrics(tmp_path / 'run', 'scores.jsonl')
    # Length 3: walking right twice reaches the goal; a random walk in
    # 4 * 3 steps mostly does too.
    assert any(row.get('episode/score') == 1 for row in scores), scores


@pytest.mark.slow
def test_replicas_import_a_module_of_the_working_directory(tmp_path):
    """Two replicas on loopback (`--script train`, whose envs step in
    spawned processes), each started through the launcher in the project
    folder; the testing agent keeps it short."""
    import socket
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    project, cli = working_directory(tmp_path)
    logs = [tmp_path / f'replica{i}.log' for i in range(2)]
    procs = [start([
        sys.executable, str(cli), '--configs', 'debug', '--script', 'train',
        '--task', 'my_corridor:Corridor', '--agent_impl', 'testing',
        '--run.steps', '60', '--run.envs', '2', '--run.eval_envs', '0',
        '--logdir', str(tmp_path / 'run'), '--replica', str(i),
        '--replicas', '2', '--jax.coordinator_address', f'127.0.0.1:{port}'],
        project, log) for i, log in enumerate(logs)]
    outputs = finish(procs, logs)
    for output in outputs:
        assert '[Summary] steps=60' in output, output[-3000:]
    assert launch.metrics(tmp_path / 'run', 'scores.jsonl')
