"""Every runner accepts `args` built the original's way (its `run` block and
nine globals); the keys this package adds get their defaults.

The tests marked PARALLEL ENTRY POINTS cover the roles of the parallel
runner; they must keep passing when the runner's roles move into modules of
their own (each role's entry must pass `args` through
`embodied.run.arguments.with_defaults`).
"""

import ast
import pathlib
from functools import partial as bind

import elements
import pytest
import ruamel.yaml as yaml

import embodied
import launch
from embodied import main as mainlib
from embodied.run import arguments
from original_main import ORIGINAL_GLOBALS, ORIGINAL_RUN_KEYS, original_args

ROOT = pathlib.Path(__file__).resolve().parents[3]

FLAGS = (
    '--configs', 'debug', '--agent_impl', 'testing', '--task', 'dummy_disc',
    '--run.log_every', '1', '--run.envs', '2', '--run.eval_envs', '1',
    '--replay.size', '3000', '--logger.outputs', 'jsonl')


def yaml_defaults():
    """The `defaults` block read straight from the YAML file."""
    text = (ROOT / 'configs' / 'defaults.yaml').read_text()
    return yaml.YAML(typ='safe').load(text)['defaults']


def config_for(logdir, *flags):
    """The config our main parses from flags; like main.py, makes the logdir."""
    config = mainlib.parse([*FLAGS, '--logdir', str(logdir), *flags])
    if not str(logdir).startswith('/tmp/unused'):
        pathlib.Path(logdir).mkdir(parents=True, exist_ok=True)
    return config


# --- with_defaults ---------------------------------------------------------

def test_original_args_lack_our_keys():
    args = original_args(config_for('/tmp/unused'))
    ours = ('from_checkpoint_regex', 'envs_per_worker', 'env_restarts',
            'wait_report', 'connect_timeout', 'shared_batches', 'seed')
    assert not [key for key in ours if key in args]
    assert len(args) == len(ORIGINAL_RUN_KEYS) + len(ORIGINAL_GLOBALS)


def test_with_defaults_fills_our_keys_and_keeps_the_given_ones():
    config = config_for('/tmp/somewhere', '--run.envs', '3')
    given = original_args(config)
    args = arguments.with_defaults(given)
    # The same keys as the args our own main builds from the full config.
    assert set(args.flat) == set(mainlib.make_args(config).flat)
    for key, value in given.flat.items():
        assert args.flat[key] == value, key
    assert args.envs == 3 and args.logdir == '/tmp/somewhere'
    run = yaml_defaults()['run']
    added = set(args.flat) - set(given.flat)
    assert 'from_checkpoint_regex' in added and 'seed' in added
    for key in added - {'seed', 'coordinator_address'}:
        assert args[key] == run[key], key
    assert args.seed == yaml_defaults()['seed']
    assert args.coordinator_address == (
        yaml_defaults()['jax']['coordinator_address'])


def test_with_defaults_keeps_values_of_our_keys_when_given():
    given = elements.Config(
        logdir='/x', connect_timeout=7, from_checkpoint_regex='^enc/')
    args = arguments.with_defaults(given)
    assert args.connect_timeout == 7
    assert args.from_checkpoint_regex == '^enc/'
    assert args.env_restarts == yaml_defaults()['run']['env_restarts']
    assert arguments.with_defaults(args) == args  # Idempotent.


def test_with_defaults_fills_nested_keys_one_by_one():
    args = arguments.with_defaults(
        {'logdir': '/x', 'usage': {'psutil': False, 'gc': True}})
    usage = yaml_defaults()['run']['usage']
    assert args.usage.psutil is False and args.usage.gc is True
    assert args.usage.malloc == usage['malloc']
    assert set(args.usage) == set(usage)


def _args_reads(path):
    """Names read as `args.NAME`, `self.args.NAME` or `args['NAME']`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            target = node.value
        elif isinstance(node, ast.Subscript) and isinstance(
                node.slice, ast.Constant) and isinstance(
                node.slice.value, str):
            target = node.value
        else:
            continue
        is_args = (
            isinstance(target, ast.Name) and target.id == 'args' or
            isinstance(target, ast.Attribute) and target.attr == 'args')
        if not is_args:
            continue
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        else:
            names.add(node.slice.value)
    return names


def test_every_key_a_runner_reads_has_a_default():
    methods = {'update', 'get', 'flat', 'items', 'keys', 'values'}
    args = arguments.with_defaults(original_args(config_for('/tmp/unused')))
    runners = sorted((ROOT / 'embodied' / 'run').rglob('*.py'))
    assert len(runners) > 5
    unknown = {}
    for path in runners:
        reads = _args_reads(path) - methods
        missing = sorted(name for name in reads if name not in args)
        if missing:
            unknown[path.name] = missing
    assert not unknown, (
        f'runners read args keys that neither the original sets nor '
        f'configs/defaults.yaml run block defaults: {unknown}')


# --- single-process scripts, called as the original's main.py calls them ---

def _train(config, args):
    embodied.run.train(
        bind(mainlib.make_agent, config),
        bind(mainlib.make_replay, config, 'replay'),
        bind(mainlib.make_env, config),
        bind(mainlib.make_stream, config),
        bind(mainlib.make_logger, config),
        args)


def test_train_and_eval_only_with_original_args(tmp_path, capsys):
    config = config_for(tmp_path / 'train', '--run.steps', '200',
                        '--run.debug', 'True')
    _train(config, original_args(config))
    tags = launch.saved_tags(tmp_path / 'train', 'agent')
    assert tags and tags[-1] >= 200

    # Evaluate from the trained agent's checkpoint in a new logdir, as the
    # original's eval_only does: no run.from_checkpoint_regex in its args.
    source = tmp_path / 'train'
    config = config_for(
        tmp_path / 'eval', '--run.steps', '300', '--run.debug', 'True',
        '--run.from_checkpoint', str(source))
    args = original_args(config)
    assert 'from_checkpoint_regex' not in args
    embodied.run.eval_only(
        bind(mainlib.make_agent, config),
        bind(mainlib.make_env, config),
        bind(mainlib.make_logger, config),
        args)
    assert launch.saved_tags(tmp_path / 'eval', 'eval')[-1] >= 300
    assert 'Reached run.steps' in capsys.readouterr().out
    scores = launch.metrics(tmp_path / 'eval')
    assert any('episode/score' in row for row in scores), scores[-3:]


def test_train_eval_with_original_args(tmp_path):
    config = config_for(tmp_path, '--script', 'train_eval', '--run.steps',
                        '200', '--run.debug', 'True', '--run.report_every',
                        '1')
    args = original_args(config)
    embodied.run.train_eval(
        bind(mainlib.make_agent, config),
        bind(mainlib.make_replay, config, 'replay'),
        bind(mainlib.make_replay, config, 'replay_eval', 'eval'),
        bind(mainlib.make_env, config),
        bind(mainlib.make_env, config),
        bind(mainlib.make_stream, config),
        bind(mainlib.make_logger, config),
        args)
    assert launch.saved_tags(tmp_path, 'logger')[-1] >= 200
    rows = launch.metrics(tmp_path)
    assert any('eval_episode/score' in row for row in rows)


# --- PARALLEL ENTRY POINTS -------------------------------------------------

class Entered(Exception):
    pass


ROLES = {
    'combined': lambda p, args: p.combined(*[None] * 7, args),
    'parallel_agent': lambda p, args: p.parallel_agent(None, args),
    'parallel_actor': lambda p, args: p.parallel_actor(None, None, args),
    'parallel_learner': lambda p, args: p.parallel_learner(None, None, args),
    'parallel_replay': lambda p, args: p.parallel_replay(
        None, None, None, args),
    'parallel_logger': lambda p, args: p.parallel_logger(None, args),
    'parallel_env': lambda p, args: p.parallel_env(None, 0, args, False),
    'parallel_envs': lambda p, args: p.parallel_envs(None, None, args),
}


@pytest.mark.parametrize('role', sorted(ROLES))
def test_parallel_role_passes_args_through_normalize(role, monkeypatch):
    # PARALLEL ENTRY POINTS: each role hands its args to `normalize` before
    # it reads any key, so calling any of them directly works.
    seen = []

    def spy(args):
        seen.append(args)
        raise Entered

    monkeypatch.setattr(arguments, 'normalize', spy)
    args = original_args(config_for('/tmp/unused'))
    with pytest.raises(Entered):
        ROLES[role](embodied.run.parallel, args)
    assert seen and seen[0] == args


def test_normalize_resolves_the_original_actor_batch():
    """The original's `run.actor_batch: -1` (half the envs) resolves in
    `normalize`, which every entry point calls, not only in `combined`; a
    second pass changes nothing."""
    for envs, expected in ((16, 8), (4, 2), (1, 1)):
        args = original_args(config_for(
            '/tmp/unused', '--run.envs', str(envs), '--run.actor_batch',
            '-1'))
        assert args.actor_batch == -1
        args = arguments.normalize(args)
        assert args.actor_batch == expected
        assert arguments.normalize(args) == args
        assert arguments.policy_calls(args, 'parallel') == {
            'train': [expected]}
    args = original_args(config_for('/tmp/unused', '--run.actor_batch', '3'))
    assert arguments.normalize(args).actor_batch == 3


def test_original_clock_flags_are_known_keys():
    config = config_for(
        '/tmp/unused', '--clock_addr', 'localhost:7000', '--clock_port',
        '7000')
    assert config.clock_addr == 'localhost:7000'
    assert config.clock_port == '7000'
