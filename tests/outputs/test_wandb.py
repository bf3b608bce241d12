"""The W&B output with the real wandb package in offline mode: what a run
sends is read back from the offline run's `.wandb` file with wandb's own
reader (`wandb leet inspect --json`). docs/getting-started.md's offline
command (`--script parallel`, where the logger process owns the W&B run)
runs in tests/test_user_paths.py::test_doc_command."""

import json
import sys

import elements
import numpy as np
import pytest
import wandb

import helpers
import launch
from embodied import main
from embodied import outputs
from embodied.outputs import wandb as wandb_output
from embodied.run import validation


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, its settings and caches in `tmp_path`; for this process
    and the commands it starts. Stops wandb's service afterwards."""
    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_CONSOLE', 'off')
    for name in ('CONFIG', 'CACHE', 'DATA', 'ARTIFACT'):
        monkeypatch.setenv(f'WANDB_{name}_DIR', str(tmp_path / 'wandb-home'))
    monkeypatch.delenv('WANDB_DIR', raising=False)
    yield
    wandb.teardown()


def offline_runs(logdir):
    return helpers.wandb_offline_runs(logdir, launch.env())


def test_scalars_histograms_images_videos_and_text_arrive(tmp_path, offline):
    frames = np.arange(5 * 8 * 8 * 3, dtype=np.uint8).reshape(5, 8, 8, 3)
    output = outputs.WandBOutput(
        tmp_path, {'run': {'steps': 7}}, project='proj', group='grp',
        name='a/b', fps=10, parallel=False)
    output([(1, 'loss', np.float32(0.5)),
            (1, 'values', np.arange(10.0)),
            (2, 'image', np.zeros((8, 8, 3), np.float32)),
            (2, 'gray', np.zeros((8, 8), np.uint8)),
            (2, 'eval_epstats/policy_image', frames),
            (2, 'note', 'hello')])
    output.close()
    (run, history, folder), = offline_runs(tmp_path)
    assert run['project'] == 'proj' and run['display_name'] == 'a/b'
    assert run['config']['update']['run'] == {'steps': 7}
    assert json.loads((tmp_path / 'wandb.json').read_text()) == {
        'id': run['run_id'], 'step': 2}
    assert history[1]['loss'] == 0.5
    assert history[1]['values._type'] == 'histogram'
    assert sum(history[1]['values.values']) == 10
    assert history[2]['image._type'] == 'image-file'
    assert history[2]['gray._type'] == 'image-file'
    assert history[2]['note'] == 'hello'
    video = history[2]['eval_epstats/policy_image.path']
    decoded = helpers.gif_frames(folder / 'files' / video)
    assert [f[0, 0].tolist() for f in decoded] == [
        f[0, 0].tolist() for f in frames]


def test_relaunch_continues_the_run_after_its_sent_steps(
        tmp_path, offline, capsys):
    first = outputs.WandBOutput(tmp_path, parallel=False)
    first([(10, 'x', np.float64(1)), (20, 'x', np.float64(2))])
    first.close()
    # A resumed run retakes the steps after its save (here 15).
    second = outputs.WandBOutput(tmp_path, parallel=False)
    second([(15, 'x', np.float64(3)), (20, 'x', np.float64(4))])
    second([(30, 'x', np.float64(5))])
    second.close()
    assert second.run_id == first.run_id
    (run1, history1, _), (run2, history2, _) = offline_runs(tmp_path)
    assert run1['run_id'] == run2['run_id'] == first.run_id
    assert {s: r['x'] for s, r in history1.items()} == {10: 1, 20: 2}
    assert {s: r['x'] for s, r in history2.items()} == {30: 5}
    assert f'run {first.run_id} has the steps up to 20' in (
        capsys.readouterr().out)


def test_a_damaged_state_file_is_named(tmp_path, offline):
    (tmp_path / 'wandb.json').write_text('{"id": ')
    with pytest.raises(ValueError, match='wandb.json is not the JSON'):
        outputs.WandBOutput(tmp_path, parallel=False)


def test_missing_wandb_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'wandb', None)
    with pytest.raises(ImportError, match=r"embodied\[wandb\]"):
        outputs.WandBOutput(tmp_path)


def test_run_config_hides_the_secret():
    config = elements.Config(run={'secret': 'abc', 'steps': 5}, seed=1)
    assert wandb_output.run_config(config) == {
        'run': {'secret': '(hidden)', 'steps': 5}, 'seed': 1}


REPLICA_1 = ('--replica', 1, '--replicas', 2, '--jax.coordinator_address',
             'localhost:1234')


def config_of(*flags):
    return main.parse(['--configs', 'debug', *map(str, flags)])


def test_outputs_checked_before_the_run(monkeypatch):
    with pytest.raises(main.UsageError, match=r"logger.outputs = 'wandbb'"):
        config_of('--logger.outputs', 'jsonl', 'wandbb')
    real = validation.importlib.util.find_spec
    monkeypatch.setattr(
        validation.importlib.util, 'find_spec',
        lambda name, *a: None if name == 'wandb' else real(name, *a))
    with pytest.raises(
            main.UsageError, match=r"pip install 'embodied\[wandb\]'"):
        config_of('--logger.outputs', 'wandb')
    # A replica other than 0, or an env command, writes no metrics.
    config_of('--logger.outputs', 'wandb', *REPLICA_1)
    config_of('--logger.outputs', 'wandb', '--script', 'parallel_env')


def test_only_replica_0_writes_to_wandb(tmp_path, offline):
    from embodied import factories
    config = config_of(
        '--logger.outputs', 'wandb', *REPLICA_1, '--logdir', tmp_path)
    logger = factories.make_logger(config)
    assert not any(isinstance(o, outputs.WandBOutput) for o in logger.outputs)
    logger.close()
    assert not (tmp_path / 'wandb').exists()


RUN = ('--configs', 'debug', '--agent_impl', 'testing', '--task',
       'dummy_disc', '--env.dummy.length', 20, '--env.dummy.size', 16, 16,
       '--run.envs', 2, '--run.eval_envs', 1, '--logger.outputs', 'jsonl',
       'wandb', '--logger.wandb.project', 'demo', '--logger.wandb.group',
       'seeds')


@pytest.mark.slow
def test_train_eval_sends_metrics_eval_video_and_config_then_resumes(
        tmp_path, offline):
    """A user's run with `--logger.outputs jsonl wandb`: the episode scores
    of scores.jsonl, an eval episode's video and the run's config are in
    the offline run; a relaunch on the logdir appends to the same run."""
    logdir = tmp_path / 'run'
    for steps in (200, 400):
        result = launch.run(
            '--script', 'train_eval', *RUN, '--run.steps', steps,
            '--run.log_every', -1, '--logdir', logdir)
        assert result.returncode == 0, result.stdout[-3000:]
    (run1, history1, folder1), (run2, history2, _) = offline_runs(logdir)
    assert run1['run_id'] == run2['run_id']
    assert run1['project'] == 'demo' and run1['run_group'] == 'seeds'
    assert run1['display_name'] == '/'.join(str(logdir).split('/')[-4:])
    config = run1['config']['update']
    assert config['run']['steps'] == 200 and config['task'] == 'dummy_disc'
    assert max(history1) <= 200 < min(history2) and max(history2) >= 400
    # W&B keeps one value per name and step: the last of scores.jsonl's.
    scores = {}
    for row in launch.metrics(logdir, 'scores.jsonl'):
        if 'episode/score' in row:
            scores[row['step']] = row['episode/score']
    sent = {step: row['episode/score']
            for history in (history1, history2)
            for step, row in history.items() if 'episode/score' in row}
    assert sent == scores and len(sent) >= 4
    videos = [row['eval_epstats/policy_image.path']
              for row in history1.values()
              if 'eval_epstats/policy_image.path' in row]
    assert videos
    frames = helpers.gif_frames(folder1 / 'files' / videos[0])
    assert len(frames) % 21 == 0 and frames[0].shape == (16, 16, 3)


@pytest.mark.slow
def test_parallel_sends_the_eval_envs_video(tmp_path, offline):
    """Under `--script parallel` the logger process sends the videos of
    env 0 and of the first eval env (env 2 here), not of train envs only."""
    logdir = tmp_path / 'run'
    result = launch.run(
        '--script', 'parallel', *RUN, '--run.steps', 150, '--logdir', logdir)
    assert result.returncode == 0, result.stdout[-3000:]
    (_, history, folder), = offline_runs(logdir)
    for key in ('epstats/policy_image', 'eval_epstats/policy_image'):
        videos = [row[f'{key}.path'] for row in history.values()
                  if f'{key}.path' in row]
        assert videos, (key, sorted({k for r in history.values() for k in r}))
        frames = helpers.gif_frames(folder / 'files' / videos[0])
        assert len(frames) % 21 == 0 and frames[0].shape == (16, 16, 3)
