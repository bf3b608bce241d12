"""The recipes in examples/ on a real Slurm (Debian's slurm-wlm, one node on
loopback, daemons started here and stopped by pid): at the signal before
the time limit the run saves, exits 0 and the job requeues itself and
resumes from that save; `scancel` cancels; a failing run shows as FAILED
with its exit code. Runs on CPU with the numpy test agent (one node) and
the debug DreamerV3 (two replicas), each job lasting a minute or two. And
a sweep's job array (`python -m embodied.sweep --sweep.scheduler slurm`),
whose elements requeue and resume as the one-node recipe does."""

import pathlib
import re
import signal
import subprocess
import sys

import pytest

import launch
import slurm_cluster

pytestmark = pytest.mark.slow

EXAMPLES = launch.ROOT / 'examples'
# The recipes' #SBATCH lines ask for a GPU node; these fit the test's node
# (sbatch's command line overrides them). The signal is asked for 70 s
# before a 2-minute limit; Slurm looks at time limits about every 30 s and
# sent it about 28 s after the start (2026-11-27), once the run stepped.
FIT = ('--gpus=0', '--mem=1G', '--cpus-per-task=1', '--time=2',
       '--signal=B:USR1@70')
ONE_NODE = ('--configs', 'debug', '--agent_impl', 'testing', '--run.envs', 2,
            '--run.eval_envs', 0, '--run.steps', 1e9,
            '--run.save_every', 1e6, '--run.log_every', 1)
# Two replicas of the debug DreamerV3 as tests/run/test_replicas.py runs
# them, saving only at the start and at the stop.
REPLICAS = ('--configs', 'debug', '--jax.mock_devices', 2,
            '--jax.train_devices', 0, 1, '--run.envs', 2,
            '--run.eval_envs', 0, '--run.log_every', 5, '--run.steps', 1e6,
            '--run.save_every', 1e6, '--run.report_every', 20,
            '--batch_size', 4, '--batch_length', 8, '--report_length', 4,
            '--replay.chunksize', 32, '--run.train_ratio', 8)


@pytest.fixture
def cluster(tmp_path):
    why = slurm_cluster.missing() or slurm_cluster.install()
    if why:
        pytest.skip(f'No real Slurm here: {why}')
    with slurm_cluster.Cluster(tmp_path / 'slurm') as cluster:
        yield cluster


def job_env(cluster, tmp_path, **extra):
    """What the recipes read: a venv whose activate puts this Python first
    on PATH, LOGDIR, TASK; and what tests run with (CPU JAX, the checkout
    on PYTHONPATH)."""
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True, exist_ok=True)
    (venv / 'bin' / 'activate').write_text(
        f'export PATH={pathlib.Path(sys.executable).parent}:$PATH\n')
    env = launch.env()
    env.update(SLURM_CONF=cluster.env['SLURM_CONF'], VENV=str(venv),
               TASK='dummy_disc')
    env.update(extra)
    return env


def ended(cluster, job):
    state = cluster.state(job)
    return state if state in (
        'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL',
        'OUT_OF_MEMORY') else None


def still_running(cluster, job, out):
    """True while the job runs (or waits to); fails, with the job's
    output, once it ended."""
    state = ended(cluster, job)
    assert not state, (state, out.read_text()[-5000:] if out.exists() else '')
    return True


def requeued(cluster, job, times):
    """Waits until the job was requeued `times` times and runs again: a
    requeued job waits for its begin time, about 2 minutes ahead, which
    this moves to 3 s from now (slurmd refuses a job whose new credential
    dates from the second its old one was revoked: 'Job credential
    revoked'); and its time limit goes to 30 minutes, so that no second
    signal comes while the test looks at the resumed run."""
    cluster.wait(lambda: int(cluster.job(job)['Restarts']) >= times, 180,
                 f'job {job} to be requeued')
    cluster.run('scontrol', 'update', f'JobId={job}', 'StartTime=now+3',
                'TimeLimit=30', check=False)
    cluster.wait(lambda: cluster.state(job) == 'RUNNING', 180,
                 f'job {job} to run again')


def test_one_node_recipe_saves_requeues_resumes_and_cancels(
        cluster, tmp_path):
    logdir = tmp_path / 'run'
    out = tmp_path / 'job.out'
    env = job_env(cluster, tmp_path, LOGDIR=str(logdir))
    job = cluster.sbatch(
        *FIT, f'--output={out}', EXAMPLES / 'slurm-one-node.sbatch',
        *ONE_NODE, env=env, cwd=launch.ROOT)
    requeued(cluster, job, 1)
    text = out.read_text()
    saved = launch.saved_tags(logdir, 'logger')[-1]
    assert saved > 0, text[-3000:]
    assert 'Received SIGTERM' in text, text[-3000:]
    assert 'The run exited 0.' in text, text[-3000:]
    assert launch.saved_tags(logdir, 'agent')[-1] == saved
    cluster.wait(lambda: 'Logger resumed' in out.read_text(), 180,
                 'the requeued run to resume')
    assert f'Logger resumed at step {saved}' in out.read_text()
    # scancel: the run saves at its SIGTERM, and the job ends CANCELLED.
    cluster.run('scancel', job)
    cluster.wait(lambda: ended(cluster, job), 120, 'the job to end')
    assert cluster.job(job)['JobState'] == 'CANCELLED'
    assert int(cluster.job(job)['Restarts']) == 1


def test_one_node_recipe_failing_run_fails_the_job(cluster, tmp_path):
    out = tmp_path / 'job.out'
    env = job_env(cluster, tmp_path, LOGDIR=str(tmp_path / 'run'))
    job = cluster.sbatch(
        *FIT, f'--output={out}', EXAMPLES / 'slurm-one-node.sbatch',
        *ONE_NODE, '--run.no_such_key', 1, env=env, cwd=launch.ROOT)
    cluster.wait(lambda: ended(cluster, job), 120, 'the job to end')
    info = cluster.job(job)
    assert (info['JobState'], info['ExitCode']) == ('FAILED', '2:0'), (
        info, out.read_text())
    assert 'run.no_such_key' in out.read_text()


def test_replicas_recipe_saves_at_one_tag_requeues_and_resumes(
        cluster, tmp_path):
    """Two replicas as two tasks of one node (loopback), the debug
    DreamerV3; the signal is sent as Slurm sends it before the time limit
    (to the batch shell) once both trained, not at a time, as compiling
    takes longer on some machines than on others."""
    from tests.run.test_replica_stop import LOSS
    from tests.run.test_replicas import TASK, common_tag, free_port
    logdir = tmp_path / 'run'
    out = tmp_path / 'job.out'
    env = job_env(cluster, tmp_path, LOGDIR=str(logdir), TASK=TASK,
                  COORDINATOR_PORT=str(free_port()))
    job = cluster.sbatch(
        '--nodes=1', '--ntasks-per-node=2', '--gpus-per-node=0', '--mem=2G',
        '--cpus-per-task=1', '--time=30', f'--output={out}',
        EXAMPLES / 'slurm.sbatch', *REPLICAS, env=env, cwd=launch.ROOT)
    cluster.wait(lambda: still_running(cluster, job, out) and out.exists()
                 and LOSS.search(out.read_text()), 900, 'the replicas to train')
    cluster.signal_batch(job, signal.SIGUSR1)
    requeued(cluster, job, 1)
    text = out.read_text()
    # Every task got the SIGTERM (none stopped only because another did).
    assert text.count('Received SIGTERM') >= 2, text[-3000:]
    assert 'Another replica stopped the run' not in text, text[-3000:]
    assert 'The run exited 0.' in text, text[-3000:]
    tag = common_tag(logdir)
    assert tag and launch.saved_tags(logdir, 'agent')[-1] == tag, text[-3000:]
    cluster.wait(lambda: still_running(cluster, job, out) and out.read_text(
        ).count('Learner resumed') == 2, 900, 'both replicas to resume')
    resumed = re.findall(r'Learner resumed the agent from the save at step '
                         r'(\d+)', out.read_text())
    assert resumed == [str(tag)] * 2, (resumed, tag)
    cluster.run('scancel', job)
    cluster.wait(lambda: ended(cluster, job), 120, 'the job to end')
    assert cluster.job(job)['JobState'] == 'CANCELLED'


# docs/sweeps.md's sweep on Slurm, at `--configs debug` with the numpy test
# agent: 2 envs, each element on one CPU; the train steps burn CPU so that
# element 1 is still running when the test signals it.
SWEEP_STEPS = 600
SWEEP = ('--configs', 'debug', '--agent_impl', 'testing', '--task',
         'dummy_disc', '--seed', 0, 1, '--run.steps', SWEEP_STEPS,
         '--run.envs', 2, '--run.eval_envs', 0, '--testing.train_burn', 0.05,
         '--sweep.scheduler', 'slurm', '--sweep.gpus', 0,
         '--sweep.sbatch', '--mem=1G --cpus-per-task=1 --time=30')


def test_sweep_array_runs_its_elements_and_one_requeues_and_resumes(
        cluster, tmp_path):
    """A 2-element array from `python -m embodied.sweep --sweep.scheduler
    slurm`: element 1, signalled once it stepped as Slurm signals before the
    time limit, saves, requeues and resumes; both elements complete with
    their runs finished. The same command while they are queued submits
    nothing, and after they finished says so."""
    from embodied.sweep import state
    sweepdir = tmp_path / 'sweep'
    env = job_env(cluster, tmp_path)

    def sweep():
        result = subprocess.run(
            launch.command('--logdir', sweepdir, *SWEEP,
                           module='embodied.sweep'),
            env=env, cwd=launch.ROOT, capture_output=True, text=True,
            timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    output = sweep()
    job = re.search(r'Submitted array job (\d+) \(2 elements: --array=0-1,',
                    output)
    assert job, output
    job = job.group(1)
    cluster.jobs.append(job)
    runs = [sweepdir / '0-dummy_disc-testing-0',
            sweepdir / '1-dummy_disc-testing-1']
    again = sweep()
    for index, run in enumerate(runs):
        assert (f"Skipping {run.name}: in Slurm's queue as job "
                f"{job}_{index}") in again, again
    assert 'Nothing to submit' in again, again

    element = f'{job}_1'
    log = runs[1] / 'output.log'
    cluster.wait(lambda: still_running(cluster, element, log) and (
        runs[1] / 'metrics.jsonl').exists(), 300, 'element 1 to step')
    cluster.signal_batch(element, signal.SIGUSR1)
    requeued(cluster, element, 1)
    for index in range(2):
        cluster.wait(lambda: ended(cluster, f'{job}_{index}'), 600,
                     f'element {index} to end')
        info = cluster.job(f'{job}_{index}')
        assert (info['JobState'], info['ExitCode']) == ('COMPLETED', '0:0'), (
            info, (runs[index] / 'output.log').read_text()[-3000:])
        assert state.saved_step(runs[index]) >= SWEEP_STEPS
        assert (runs[index] / 'scores.jsonl').exists()
    text = log.read_text()
    assert 'The run exited 0.' in text, text
    assert f'Requeueing element {element}.' in text, text
    saved = re.search(r'Saving checkpoint: .*/ckpt/logger/0*(\d+)\n',
                      text[text.index('Received SIGTERM'):])
    assert saved and int(saved.group(1)) < SWEEP_STEPS, text[-3000:]
    assert f'Resumed from the save at step {saved.group(1)}.' in text, text
    assert int(cluster.job(element)['Restarts']) == 1
    assert int(cluster.job(f'{job}_0')['Restarts']) == 0
    done = sweep()
    for run in runs:
        assert f'Skipping {run.name}: finished at step' in done, done
    assert 'Nothing to submit' in done, done



# A test process that holds a cluster and dies before `stop()`: its daemons
# (each leading a session of its own) end with it.
HOLDER = """
import sys, time
import slurm_cluster
with slurm_cluster.Cluster(sys.argv[1]) as cluster:
    print(*(proc.pid for proc in cluster.procs.values()), flush=True)
    time.sleep(600)
"""


def test_daemons_end_when_the_test_process_is_killed(tmp_path):
    import psutil
    why = slurm_cluster.missing() or slurm_cluster.install()
    if why:
        pytest.skip(f'No real Slurm here: {why}')
    holder = subprocess.Popen(
        [sys.executable, '-c', HOLDER, str(tmp_path / 'slurm')],
        env=launch.env(), stdout=subprocess.PIPE, text=True)
    daemons = []
    try:
        daemons = [psutil.Process(int(pid))
                   for pid in holder.stdout.readline().split()]
        assert len(daemons) == len(slurm_cluster.DAEMONS), daemons
        holder.kill()
        holder.wait()
        _, alive = psutil.wait_procs(daemons, timeout=60)
        assert not alive, alive
    finally:
        for proc in [holder, *daemons]:
            try:
                proc.kill()
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        holder.wait()
