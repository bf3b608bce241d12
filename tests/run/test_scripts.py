"""The single-process scripts end to end, with the numpy test agent."""


import launch

COMMON = (
    '--configs', 'debug', '--agent_impl', 'testing', '--task', 'dummy_disc',
    '--run.log_every', '1', '--run.envs', '2', '--run.eval_envs', '1')


def run_ok(script, logdir, *flags):
    """Runs `script` to its end, which must be exit 0."""
    result = launch.run(
        '--script', script, *COMMON, *flags, '--logdir', logdir)
    assert result.returncode == 0, result.stdout[-3000:]
    return result


def test_train_reaches_steps_then_resumes(tmp_path):
    logdir = tmp_path / 'run'
    result = run_ok('train', logdir, '--run.steps', '300')
    assert 'Reached run.steps' in result.stdout
    assert 'Traceback' not in result.stdout
    assert launch.metrics(logdir), 'no metrics.jsonl rows written'
    assert (logdir / 'config.yaml').exists()
    for role in ('agent', 'replay', 'logger'):
        tags = launch.saved_tags(logdir, role)
        assert tags and tags[-1] >= 300, (role, tags)
    assert list((logdir / 'replay').glob('*')), 'no replay chunk files'
    assert launch.latest_value(logdir, 'train/train_batches') > 0

    result = run_ok('train', logdir, '--run.steps', '600')
    first = launch.saved_tags(logdir, 'logger')
    assert 'Resumed from the save at step' in result.stdout
    assert first[-1] >= 600
    assert launch.latest_value(logdir, 'train/loads') == 1


def test_train_with_env_subprocesses(tmp_path):
    logdir = tmp_path / 'run'
    run_ok('train', logdir, '--run.debug', 'False', '--run.steps', '200')
    assert launch.saved_tags(logdir, 'logger')[-1] >= 200


def test_sigterm_saves_and_rerun_resumes_step(tmp_path):
    logdir = tmp_path / 'run'
    run = launch.Launch(
        '--script', 'train', *COMMON, '--run.steps', '1e9',
        '--run.save_every', '1e6', '--logdir', logdir,
        logfile=tmp_path / 'first.log')
    try:
        run.wait_for(
            lambda: (launch.latest_value(logdir, 'train/train_batches')
                     or 0) > 0,
            what='training to start')
        run.terminate()
        assert run.wait(timeout=10) == 0, run.output()[-3000:]
    finally:
        run.kill()
    assert 'Traceback' not in run.output()
    stopped = launch.saved_tags(logdir, 'logger')[-1]
    assert stopped > 0
    assert stopped in launch.saved_tags(logdir, 'agent')
    assert stopped in launch.saved_tags(logdir, 'replay')

    result = run_ok('train', logdir, '--run.steps', stopped + 100)
    assert f'Resumed from the save at step {stopped}' in result.stdout
    assert launch.saved_tags(logdir, 'logger')[-1] >= stopped + 100


def test_train_eval_then_eval_only(tmp_path):
    logdir = tmp_path / 'run'
    run_ok('train_eval', logdir, '--run.steps', '300',
           '--run.report_every', '1')
    rows = launch.metrics(logdir)
    assert any('eval_episode/score' in row for row in rows)
    assert any('episode/score' in row for row in rows)
    assert list((logdir / 'replay_eval').glob('*')), 'no eval replay data'

    run_ok('eval_only', logdir, '--run.steps', '200')
    assert launch.saved_tags(logdir, 'eval')[-1] >= 200
    # Training checkpoints are untouched by evaluation.
    assert launch.saved_tags(logdir, 'logger')[-1] >= 300


def test_eval_only_without_checkpoint_says_what_is_missing(tmp_path):
    result = launch.run(
        '--script', 'eval_only', *COMMON, '--run.steps', '10',
        '--logdir', tmp_path / 'empty')
    assert result.returncode != 0
    assert 'run.from_checkpoint' in result.stdout
