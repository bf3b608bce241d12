"""The paths a user runs, as a user runs them: the default DreamerV3 agent on
CPU at the `debug` size with few steps. Every `--script`, every suite block
under `train` and `parallel`, and every shell command of README.md and of the
pages under docs/, read from the pages themselves, so a documented command
that stops working fails here.

Every DreamerV3 run also checks that the agent compiled ahead and never
traced again mid-run ('Agent: tracing ...' is printed when it does).
"""

import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

import helpers
import launch
import metrics_reference
from tests.run.parallel import test_parallel

os.environ.setdefault('MUJOCO_GL', 'egl')

README = launch.ROOT / 'README.md'
STEPS = 300  # env steps of the script runs below (enough for an eval episode)
QUICK = ('--run.steps', str(STEPS), '--run.log_every', '5')
TIMEOUT = 600
SUITES = {
    # block: (import, the loss of the input the block selects)
    'atari': ('ale_py', 'train/loss/image'),          # 96x96x1 gray images
    'atari100k': ('ale_py', 'train/loss/image'),
    'crafter': ('crafter', 'train/loss/image'),
    'dmc_vision': ('dm_control.suite', 'train/loss/image'),
    'dmc_proprio': ('dm_control.suite', 'train/loss/orientations'),
}
# Env steps of a suite run: the replay fills a batch (debug: 8 x 12 steps),
# then the agent trains every 3 env steps at train ratio 32, so a few
# updates run before the final save.
SUITE_STEPS = 120


def check_output(code, output, dreamer=True):
    assert code == 0, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    if dreamer:
        assert 'Compiled the agent in' in output, output[-4000:]
        assert 'Agent: tracing' not in output, output[-4000:]


def run(*flags, module='embodied.main', dreamer=True):
    result = launch.run(*flags, module=module, timeout=TIMEOUT)
    check_output(result.returncode, result.stdout, dreamer)
    return result.stdout


# Scripts


@pytest.mark.slow
def test_train_then_eval_only_from_its_checkpoint(tmp_path):
    logdir = tmp_path / 'train'
    output = run('--configs', 'debug', '--script', 'train', *QUICK,
                 '--logdir', logdir)
    assert 'Reached run.steps' in output
    assert launch.saved_tags(logdir, 'agent')
    output = run('--configs', 'debug', '--script', 'eval_only',
                 '--run.from_checkpoint', logdir, '--run.steps', '100',
                 '--logdir', tmp_path / 'eval')
    assert launch.saved_tags(tmp_path / 'eval', 'eval')[-1] >= 100
    # eval_only never trains: the agent compiles its eval policy alone.
    compiled = re.search(r'Compiled the agent in .*', output).group(0)
    assert compiled.endswith('(policy at batch sizes eval [4]).'), compiled


@pytest.mark.slow
def test_train_eval(tmp_path):
    logdir = tmp_path / 'run'
    # Metrics on every round of env steps (log_every < 0): the periodic
    # ones (replay_eval, usage) are written however fast the run goes.
    run('--configs', 'debug', '--script', 'train_eval',
        '--run.steps', str(STEPS), '--run.log_every', '-1',
        '--run.report_every', '-1', '--logdir', logdir)
    rows = launch.metrics(logdir)
    assert any('eval_episode/score' in row for row in rows)
    # DreamerV3's train, report and eval metrics and the loop's: every key
    # is on docs/metrics.md.
    keys = metrics_reference.logged(logdir)
    assert {'train/loss/policy', 'report/loss/dyn', 'eval/loss/rew',
            'replay_eval/items', 'usage/psutil/proc_ram_gb'} <= keys, keys
    metrics_reference.check(keys)


REMOTE = {
    # role script: (flags of the main command, flags of the role command)
    'parallel_envs': (('--run.remote_envs', 'True'), ()),
    'parallel_env': (
        ('--run.remote_envs', 'True', '--run.eval_envs', '0',
         '--run.envs', '1', '--run.actor_batch', '1'),
        ('--run.eval_envs', '0', '--run.envs', '1', '--replica', '0')),
    'parallel_replay': (('--run.remote_replay', 'True'), ()),
}


@pytest.mark.slow
@pytest.mark.parametrize('script', sorted(REMOTE))
def test_parallel_with_a_role_as_its_own_command(tmp_path, script):
    """`--script parallel` with one role started as a separate command, as
    on another machine."""
    from embodied.rpc import addresses
    ports = addresses.free_ports(3)
    logdir = tmp_path / 'run'
    common = (
        '--configs', 'debug', *QUICK, '--logdir', logdir,
        '--run.actor_addr', f'localhost:{ports[0]}',
        '--run.replay_addr', f'localhost:{ports[1]}',
        '--run.logger_addr', f'localhost:{ports[2]}')
    main_flags, role_flags = REMOTE[script]
    runs = [
        launch.Launch('--script', 'parallel', *common, *main_flags,
                      logfile=tmp_path / 'main.log'),
        launch.Launch('--script', script, *common, *role_flags,
                      logfile=tmp_path / 'role.log'),
    ]
    outputs = test_parallel.finish_all(runs, timeout=TIMEOUT)
    check_output(0, outputs[0])
    assert f'Reached run.steps ({STEPS})' in outputs[0]


# Suites


def suite_flags(block):
    """The block at the debug size with 2 envs; a train ratio of 32 instead
    of the block's (up to 1024) keeps the few updates quick."""
    pytest.importorskip(SUITES[block][0])
    return ('--configs', block, 'debug', '--run.steps', str(SUITE_STEPS),
            '--run.log_every', '5', '--run.envs', '2', '--run.eval_envs', '0',
            '--run.train_ratio', '32')


@pytest.mark.slow
@pytest.mark.parametrize('block', sorted(SUITES))
def test_suite_trains(tmp_path, block):
    """The block's envs with DreamerV3 under `--script train`: it trains on
    the input the block selects (the image or the vectors), and on no
    `log/` key (dmc_proprio renders its frames to `log/image`)."""
    logdir = tmp_path / 'run'
    outputs = ('--logger.outputs', 'jsonl', 'tensorboard',
               '--run.report_every', '1')
    output = run(*suite_flags(block), '--script', 'train', '--logdir', logdir,
                 *(outputs if block == OPENLOOP_BLOCK else ()))
    assert f'Reached run.steps ({SUITE_STEPS})' in output
    rows = launch.metrics(logdir)
    loss = SUITES[block][1]
    assert any(np.isfinite(row.get(loss, np.nan)) for row in rows), (
        output[-3000:])
    keys = {key for row in rows for key in row}
    assert not [k for k in keys if k.startswith('train/loss/log')], keys
    metrics_reference.check(keys)
    if block == 'dmc_proprio':
        assert 'train/loss/image' not in keys
    if block == OPENLOOP_BLOCK:
        check_openloop_video(logdir, keys)


# The suite run whose reports are read from TensorBoard for their
# open-loop video.
OPENLOOP_BLOCK = 'dmc_vision'


def check_openloop_video(logdir, keys):
    """DreamerV3's reports hold the original's open-loop video of the
    64x64 `image`: the debug block's 8 report steps and 10 black frames,
    truth, prediction and error stacked (3 x 64 + 4 rows), 6 of its 8
    sequences side by side (6 x (64 + 4) columns)."""
    assert 'report/loss/image' in keys, sorted(keys)
    from tensorboard.backend.event_processing import event_accumulator as ea
    events = ea.EventAccumulator(str(logdir), size_guidance={ea.IMAGES: 0})
    events.Reload()
    videos = events.Images('report/openloop/image')
    assert videos, events.Tags()['images']
    assert (videos[0].height, videos[0].width) == (196, 408)
    frames = helpers.gif_frames(io.BytesIO(videos[0].encoded_image_string))
    # GIF merges the identical black frames at the end into one (its
    # palette may shift colors a little).
    assert 2 <= len(frames) <= 8 + 10 and frames[-1].max() < 20
    assert frames[0].shape == (196, 408, 3)
    green, red = (0, 255, 0), (255, 0, 0)  # Observed, then imagined.
    assert np.abs(frames[0][0, 0].astype(int) - green).max() < 40
    assert np.abs(frames[-2][0, 0].astype(int) - red).max() < 40


# The suite commands of docs/suites.md run the parallel runner on atari100k,
# crafter and dmc_vision at size1m; the other two blocks run here.
@pytest.mark.slow
@pytest.mark.parametrize('block', ['atari', 'dmc_proprio'])
def test_suite_parallel(tmp_path, block):
    output = run(*suite_flags(block), '--script', 'parallel',
                 '--logdir', tmp_path / 'run')
    assert f'Reached run.steps ({SUITE_STEPS})' in output


# README.md and docs/*.md


# Pages whose commands a test of their own runs, checking more than this
# file does, and that test.
RUN_ELSEWHERE = {
    'own-environment.md': 'tests/test_own_env_page.py (each run trained)',
    'your-policy.md': 'tests/test_policy_page.py (trains, then acts in '
                      'a fresh process)',
}
# Pages whose shell commands run below, README.md first: a command that
# stands on several pages runs once.
PAGES = [README, *sorted(
    page for page in (launch.ROOT / 'docs').rglob('*.md')
    if page.name not in RUN_ELSEWHERE)]

# Commands of those pages that are not runs of this package, and why they
# are not run here.
NOT_RUN = {
    'python3 -m venv': 'creates the environment this test runs in',
    '.': 'activates that environment',
    'pip install': 'installs into that environment',
    'python -m pytest': 'the test suite itself',
    'tensorboard': 'a server that runs until stopped',
    'wandb': "W&B's own command, which talks to W&B's servers",
    'python -m embodied.main --configs cartpole --logdir logdir/cartpole --logger.outputs jsonl wandb --logger.wandb.project cartpole --logger.wandb.group dreamer':
        'needs a W&B account (the offline command below it runs here; '
        'tests/outputs/test_wandb.py runs the output offline)',
    'git clone': 'fetches the original for the tests that compare with it',
    # docs/hosts.md: replicas need several commands at once (or a cluster);
    # tests/run/test_replicas.py runs two replicas on loopback and reads
    # both recipes.
    'sbatch': 'needs a Slurm cluster (tests/test_slurm.py runs both recipes on one)',
    'kubectl': 'needs a Kubernetes cluster',
    'python -m embodied.main --configs cartpole --script train --logdir /shared/logdir/run1 --replica 0 --replicas 2 --jax.coordinator_address host0:8476':
        'one of several replicas started together',
    'python -m embodied.main --configs cartpole --script train --logdir /shared/logdir/run1 --replica 1 --replicas 2 --jax.coordinator_address host0:8476':
        'one of several replicas started together',
    'python -m embodied.main --configs debug --task dummy_disc --logdir ~/logdir/replicas --replica 0 --replicas 2 --jax.coordinator_address 127.0.0.1:8476 --jax.mock_devices 2 --jax.train_devices 0 1 &':
        'one of several replicas started together',
    'python -m embodied.main --configs debug --task dummy_disc --logdir ~/logdir/replicas --replica 1 --replicas 2 --jax.coordinator_address 127.0.0.1:8476 --jax.mock_devices 2 --jax.train_devices 0 1':
        'one of several replicas started together',
    'mkdocs build': 'tests/test_docs.py builds the site',
    # docs/sweeps.md
    'python -m embodied.sweep --logdir ~/logdir/sweep --configs debug --task dummy_disc cartpole_balance --seed 0 1 --run.steps 1000 --sweep.parallel 2':
        'tests/sweep/test_sweep.py runs it with the numpy test agent '
        '(stopped by Ctrl-C, resumed, skipped): 4 DreamerV3 runs here would '
        'test the agent, not the sweep',
    'docker': 'needs a Docker daemon (tests/test_examples.py reads the Dockerfile)',
    'nvidia-smi': 'needs an NVIDIA driver',
    'python -m embodied.reproduce':
        'hours of training on a GPU (tests/test_reproduce.py runs the '
        "command at the debug size with a tiny budget, and the page's "
        'commands with --dry)',
}

ASSIGNMENTS = r'^((?:[A-Z_][A-Z0-9_]*=\S+\s+)+)'


def without_env(command):
    """The command without its leading `NAME=value` assignments."""
    return re.sub(ASSIGNMENTS, '', command)


def env_of(command):
    """The command's leading `NAME=value` assignments as a dict."""
    match = re.match(ASSIGNMENTS, command)
    return dict(x.split('=', 1) for x in match.group(1).split()) if match else {}


def page_commands(text):
    """The shell commands of one page: the lines of its ```sh blocks (split
    at `&&`) and the commands in its tables, in order."""
    commands = []
    for block in re.findall(r'```sh\n(.*?)```', text, re.S):
        for line in block.splitlines():
            commands.extend(x.strip() for x in line.split('&&') if x.strip())
    commands.extend(re.findall(r'\| `(python -m [^`]+)` \|', text))
    return commands


def doc_commands():
    """The shell commands of README.md and the docs pages, each once."""
    commands = []
    for page in PAGES:
        for command in page_commands(page.read_text()):
            if command not in commands:
                commands.append(command)
    return commands


def page_scripts():
    """The Python scripts the pages define: ```python blocks that open with
    a `# name.py` line, by name."""
    scripts = {}
    for page in PAGES:
        for code in re.findall(r'```python\n(.*?)```', page.read_text(), re.S):
            name = re.match(r'# (\w+\.py)\n', code)
            if name:
                assert name.group(1) not in scripts, (page, name.group(1))
                scripts[name.group(1)] = code
    return scripts


def needs_gpu(command):
    """Runs on an NVIDIA GPU: the `gpu` block or `--jax.platform cuda`.
    test_gpu_doc_commands_parse checks these commands on the CPU."""
    argv = shlex.split(without_env(command))
    if '--jax.platform' in argv and argv[argv.index('--jax.platform') + 1] == 'cuda':
        return True
    if '--configs' not in argv:
        return False
    blocks = argv[argv.index('--configs') + 1:]
    blocks = blocks[:next(
        (i for i, x in enumerate(blocks) if x.startswith('-')), len(blocks))]
    return 'gpu' in blocks


def is_not_run(command):
    command = without_env(command)
    return needs_gpu(command) or any(
        command == p or command.startswith(p + ' ') for p in NOT_RUN)


def doc_runs():
    runs = [c for c in doc_commands() if not is_not_run(c)]
    assert len(runs) >= 10, runs
    return runs


def test_doc_commands_are_all_known():
    """Every command of the pages either runs below or is named in NOT_RUN:
    `python -m embodied.*`, `python -c`, or `python <script>.py` for a
    script a page defines."""
    scripts = page_scripts()
    commands = doc_commands()
    for command in commands:
        argv = shlex.split(without_env(command))
        assert is_not_run(command) or argv[:2] == ['python', '-c'] or (
            argv[:2] == ['python', '-m'] and argv[2].startswith('embodied.')
        ) or (argv[0] == 'python' and argv[1] in scripts), command
    assert any(c.startswith('python -m embodied.plot') for c in commands)


# A page's DreamerV3 command runs until it has compiled the agent, stepped
# its envs (the policy at the page's model size), saved and ended: the
# updates themselves run in test_suite_trains and the script tests. Its
# replay holds those steps; the block's (up to 5e6 steps) is not allocated.
DOC_STEPS = 100
DOC_REPLAY = 1e4
# A command at a model size block (`size1m` ... `size400m`, and `cartpole`,
# which sets the sizes of its own model) compiles with XLA's optimizations
# off, as `--configs debug` does (`--jax.debug True`):
# XLA still compiles train and report at the page's size and the policy
# acts at it, but the crafter command then takes 19 CPU-s instead of 49
# (train and report compile in 9.1 s instead of 17.8 s on 2 cores), for a
# run that ends before any update would use what the optimizations make.
SIZE_BLOCK = re.compile(r'size\d+m$|cartpole$')


def as_test(command, tmp_path):
    """The command's entry (`-m module`, or a script of a page written to
    `tmp_path`) and flags, with its logdirs under `tmp_path` and, for
    DreamerV3 runs, at most DOC_STEPS env steps and DOC_REPLAY replay
    steps."""
    argv = shlex.split(without_env(command))
    if argv[1].endswith('.py'):
        script = tmp_path / argv[1]
        script.write_text(page_scripts()[argv[1]])
        entry, flags = dict(script=script), argv[2:]
    else:
        assert argv[:2] == ['python', '-m'], command
        entry, flags = dict(module=argv[2]), argv[3:]
    mapped = []
    for index, flag in enumerate(flags):
        if re.match(r'(~/)?logdir(/|$)', flag) or (
                index and flags[index - 1] == '--outdir'):
            flag = str(tmp_path / flag.removeprefix('~/'))
        mapped.append(flag)
    flags = mapped
    if entry.get('module') == 'embodied.plot':
        return entry, flags
    if '--logdir' not in flags:
        flags += ['--logdir', str(tmp_path / 'logdir' / 'default')]
    dreamer = '--agent_impl' not in flags
    if dreamer:
        cap(flags, '--run.steps', DOC_STEPS)
        cap(flags, '--replay.size', DOC_REPLAY)
        if any(SIZE_BLOCK.match(block) for block in configs(flags)) and (
                '--jax.debug' not in flags):
            flags += ['--jax.debug', 'True']
    return entry, flags


def configs(flags):
    """The config blocks that `--configs` names in `flags`."""
    if '--configs' not in flags:
        return []
    blocks = []
    for flag in flags[flags.index('--configs') + 1:]:
        if flag.startswith('--'):
            break
        blocks.append(flag)
    return blocks


def cap(flags, flag, most):
    """Sets `flag` to at most `most`, in place."""
    if flag in flags:
        index = flags.index(flag) + 1
        flags[index] = str(min(float(flags[index]), most))
    else:
        flags += [flag, str(most)]


def run_entry(entry, flags, extra_env=None, dreamer=True):
    """Runs `python -m module` or `python script` as the pages do, with the
    command's own `NAME=value` assignments added to the test environment
    (a PYTHONPATH is put in front of the test's)."""
    env = launch.env()
    for name, value in (extra_env or {}).items():
        env[name] = (os.pathsep.join([value, env[name]])
                     if name == 'PYTHONPATH' else value)
    result = subprocess.run(
        launch.command(*flags, **entry), cwd=launch.ROOT, env=env,
        timeout=TIMEOUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    check_output(result.returncode, result.stdout, dreamer)
    return result.stdout


def write_scores(folder, scores):
    """A run folder as the JSONL output writes it, for the plot commands."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / 'scores.jsonl', 'w') as f:
        for i, score in enumerate(scores):
            f.write(json.dumps({
                'step': 100 * (i + 1), 'time': 2.0 * (i + 1),
                'episode/score': float(score)}) + '\n')


def check_published_plot(entry, flags):
    """A page's `embodied.plot [LOGDIR] --published SUITE`: each LOGDIR is
    made as a sweep of two seeds of the suite's first published task; the
    command prints the aggregates and, with a LOGDIR, the verdict, the
    markdown and the plot."""
    from embodied.plot import published, tasks
    from tests.plot import sweeps
    logdirs = flags[:flags.index('--published')]
    suite = flags[flags.index('--published') + 1]
    first = min(r.task for r in published.load(suite))
    for logdir in logdirs:
        sweeps.write_sweep(pathlib.Path(logdir),
                           [tasks.run_task(first, suite)], [0, 1])
    output = run_entry(entry, flags, dreamer=False)
    assert 'Aggregates at env step' in output, output[-3000:]
    if logdirs:
        assert 'Verdict:' in output, output[-3000:]
        outdir = pathlib.Path(
            flags[flags.index('--outdir') + 1] if '--outdir' in flags
            else logdirs[0])
        for name in ('reproduction.md', 'bands.png'):
            assert (outdir / name).exists(), list(outdir.iterdir())
    if '--write' in flags:
        assert pathlib.Path(flags[flags.index('--write') + 1]).exists()


def slug(command):
    """A short test id for a command."""
    words = shlex.split(without_env(command))[1:]
    if words[0] == '-m':
        words = words[1:]
    return re.sub(r'[^A-Za-z0-9_.]+', '-', ' '.join(words))[:70].strip('-')


@pytest.mark.slow
@pytest.mark.parametrize('command', doc_runs(), ids=slug)
def test_doc_command(tmp_path, command):
    argv = shlex.split(without_env(command))
    if argv[:2] == ['python', '-c']:
        result = subprocess.run(
            [sys.executable, *argv[1:]], cwd=launch.ROOT, env=launch.env(),
            timeout=TIMEOUT, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        return
    entry, flags = as_test(command, tmp_path)
    if entry.get('module') == 'embodied.plot' and '--published' in flags:
        check_published_plot(entry, flags)
        return
    if entry.get('module') == 'embodied.plot':
        pytest.importorskip('matplotlib')
        logdir = tmp_path / 'logdir'
        # Runs as the page names them; a --label sweep gets runs whose
        # paths its regex matches.
        names = ('lr1e-4/seed0', 'lr3e-4/seed0') if '--label' in flags else (
            'cartpole', 'dreamer/seed0', 'dreamer/seed1', 'random/seed0')
        for name in names:
            write_scores(logdir / name, range(10))
        run_entry(entry, flags, dreamer=False)
        outdir = pathlib.Path(
            flags[flags.index('--outdir') + 1] if '--outdir' in flags
            else flags[0])
        name = flags[flags.index('--name') + 1] if '--name' in flags else (
            'curves')
        assert (outdir / f'{name}.png').exists(), list(outdir.iterdir())
        return
    if '--run.from_checkpoint' in flags:
        # Watches the run of the page's command before it, made here.
        source = flags[flags.index('--run.from_checkpoint') + 1]
        before = doc_runs()[doc_runs().index(command) - 1]
        first_entry, first = as_test(before, tmp_path)
        assert str(source) == first[first.index('--logdir') + 1], before
        run_entry(first_entry, first, env_of(before), dreamer=False)
    dreamer = '--agent_impl' not in flags
    output = run_entry(entry, flags, env_of(command), dreamer=dreamer)
    assert re.search(r'Reached run\.steps|\[Summary\]', output), output[-3000:]
    if '--logger.outputs' in flags and 'tensorboard' in flags:
        logdir = pathlib.Path(flags[flags.index('--logdir') + 1])
        assert list(logdir.glob('events.out.tfevents.*')), list(logdir.iterdir())
    if '--logger.outputs' in flags and 'wandb' in flags:
        logdir = pathlib.Path(flags[flags.index('--logdir') + 1])
        runs = helpers.wandb_offline_runs(logdir, launch.env())  # Finished.
        scores = [row['episode/score'] for row in runs[-1][1].values()
                  if 'episode/score' in row]
        assert scores, runs
    if '--run.eval_video' in flags:
        logdir = pathlib.Path(flags[flags.index('--logdir') + 1])
        assert list((logdir / 'videos').glob('*.gif')), output[-3000:]


def test_gpu_doc_commands_parse(monkeypatch):
    """The pages' GPU commands, which CI cannot run, parse into configs
    that ask for the GPU."""
    from embodied import main
    for key in ('SLURM_PROCID', 'SLURM_NTASKS', 'JOB_COMPLETION_INDEX'):
        monkeypatch.delenv(key, raising=False)
    commands = [c for c in doc_commands() if needs_gpu(c)
                and shlex.split(without_env(c))[0] == 'python']
    assert any('--configs atari gpu' in c for c in commands), commands
    for command in commands:
        argv = shlex.split(without_env(command))
        if argv[:3] == ['python', '-m', 'embodied.sweep']:
            # docs/sweeps.md: every run of the sweep, as it would start.
            from embodied.sweep import grid
            runs = grid.expand(grid.split(argv[3:]))
            assert all(main.parse(run.argv).jax.platform == 'cuda'
                       for run in runs), command
            continue
        assert argv[:3] in (['python', '-m', 'embodied.main'],
                            ['python', '-m', 'embodied.run.parallel']), command
        config = main.parse(argv[3:])
        assert config.jax.platform == 'cuda', command


# docs/devices.md: its mesh commands run in test_doc_command; its memory
# benchmark at debug runs here (written inline, as benchmarks are).


DEVICES = launch.ROOT / 'docs' / 'devices.md'


def test_devices_page_trains_on_a_mesh():
    commands = page_commands(DEVICES.read_text())
    assert any(
        '--script train' in c and '--jax.train_mesh 2,2,2' in c and
        '--jax.mock_devices 8' in c for c in commands), commands
    assert any('--script parallel' in c for c in commands), commands


@pytest.mark.slow
def test_devices_memory_benchmark(tmp_path):
    """The page's `agent_speed` command at `debug` reports a row per mesh,
    and on the FSDP mesh '1,8,1' each device holds less of the state than
    on '8,1,1', as the page says. The command runs with `--jax.debug True`
    (XLA's optimizations off: 22 CPU-s instead of 55): the state per device
    does not depend on them (0.016 and 0.006 MiB either way, 2026-11-28)."""
    command = re.search(
        r'`(python -m embodied\.perf\.agent_speed --configs debug [^`]+)`',
        DEVICES.read_text()).group(1)
    argv = shlex.split(command) + ['--jax.debug', 'True']
    result = launch.run(*argv[3:], module=argv[2], timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.splitlines()
    header = next(line for line in lines if 'state MiB/device' in line)
    column = [cell.strip() for cell in header.split('|')].index(
        'state MiB/device')
    state = {}
    for mesh in ('8,1,1', '1,8,1'):
        row = next((line for line in lines
                    if line.startswith(f'| ours {mesh} |')), None)
        assert row, result.stdout[-3000:]
        state[mesh] = float(row.split('|')[column])
    assert 0 < state['1,8,1'] < state['8,1,1'], state


if __name__ == '__main__':
    for line in doc_commands():
        print(line)
    sys.exit(0)
