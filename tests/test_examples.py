"""The files in examples/ and the Dockerfile, read (tests/test_slurm.py runs
the Slurm recipes on a real Slurm; Docker and Kubernetes cannot run here):
without arguments the recipes run README's command, with the variables
they document; the Kubernetes Job's grace period fits a final save, lost
pods are retried, its volumes exist; the image runs what README runs."""

import os
import re
import shlex
import subprocess

import pytest

from embodied import main

import launch

EXAMPLES = launch.ROOT / 'examples'
DOCKERFILE = launch.ROOT / 'Dockerfile'
JOB = EXAMPLES / 'kubernetes-indexed-job.yaml'
# The seconds the Kubernetes Job gives a final save beyond run.drain_timeout
# and then to exit (see the comment at the top of the file).
SAVE_SECONDS, EXIT_SECONDS = 120, 30


def recipe_argv(tmp_path, name, *args, **environ):
    """The command line a recipe starts, without Slurm: its venv's
    activate defines `python` as a function that records its arguments,
    `srun` runs its command, `scontrol` lists two hosts."""
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True, exist_ok=True)
    (venv / 'bin' / 'activate').write_text(
        f'python() {{ printf "%s\\n" "$@" > {tmp_path}/argv; }}\n'
        f'srun() {{ echo "$SRUN_CPUS_PER_TASK" > {tmp_path}/srun_cpus; '
        '"$@"; }\n'
        'scontrol() { printf "gpu-a17\\ngpu-a18\\n"; }\n')
    env = dict(os.environ, SLURM_JOB_ID='42', SLURM_JOB_NODELIST='gpu-a[17-18]',
               VENV=str(venv), **environ)
    for key in ('TASK', 'LOGDIR'):
        if key not in environ:
            env.pop(key, None)
    subprocess.run(['bash', EXAMPLES / name, *args], env=env, check=True,
                   timeout=60)
    return (tmp_path / 'argv').read_text().splitlines()


def parse(argv, monkeypatch, **environ):
    for key in ('JOB_COMPLETION_INDEX', 'SLURM_PROCID', 'SLURM_NTASKS'):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, str(value))
    assert argv[:2] == ['-m', 'embodied.main'], argv
    return main.parse(argv[2:])


def readme_gpu_config(monkeypatch):
    """The config of README's command for one GPU box (`--configs atari
    gpu ...`), outside any scheduler."""
    readme = (launch.ROOT / 'README.md').read_text()
    [line] = [line for line in readme.splitlines()
              if line.startswith('python -m embodied.main --configs atari gpu')]
    return parse(shlex.split(line)[1:], monkeypatch)


@pytest.mark.parametrize('name', ['slurm-one-node.sbatch', 'slurm.sbatch'])
def test_slurm_recipe_without_arguments_runs_readmes_command(
        tmp_path, monkeypatch, name):
    readme = readme_gpu_config(monkeypatch)
    argv = recipe_argv(tmp_path, name)
    environ = dict(SLURM_PROCID=0, SLURM_NTASKS=1 if 'one' in name else 2)
    config = parse(argv, monkeypatch, **environ)
    for key in ('task', 'script', 'run.envs', 'replay.size', 'jax.platform'):
        assert config[key] == readme[key], key
    assert config.replicas == environ['SLURM_NTASKS']
    assert config.logdir.endswith('-42'), config.logdir  # The job id.
    if name == 'slurm.sbatch':
        assert config.jax.coordinator_address == 'gpu-a17:8476'


def test_replicas_recipe_gives_srun_the_tasks_cpus(tmp_path):
    recipe_argv(tmp_path, 'slurm.sbatch', SLURM_CPUS_PER_TASK='16')
    assert (tmp_path / 'srun_cpus').read_text().strip() == '16'


@pytest.mark.parametrize('name', ['slurm-one-node.sbatch', 'slurm.sbatch'])
def test_slurm_recipe_passes_arguments_and_variables_on(
        tmp_path, monkeypatch, name):
    argv = recipe_argv(
        tmp_path, name, '--configs', 'debug', '--run.envs', '2',
        TASK='dummy_disc', LOGDIR=str(tmp_path / 'run'))
    config = parse(argv, monkeypatch, SLURM_PROCID=0, SLURM_NTASKS=1)
    assert (config.task, config.run.envs, config.logdir) == (
        'dummy_disc', 2, str(tmp_path / 'run'))
    assert config.batch_size == main.parse(['--configs', 'debug']).batch_size


@pytest.mark.parametrize('name', ['slurm-one-node.sbatch', 'slurm.sbatch'])
def test_slurm_recipe_requeues_on_its_own_signal_only(name):
    script = (EXAMPLES / name).read_text()
    assert re.search(r'^#SBATCH --signal=B:USR1@\d+$', script, re.M)
    assert re.search(r'^#SBATCH --requeue$', script, re.M)
    assert re.search(r'^trap stop_and_requeue USR1$', script, re.M)
    assert not re.search(r'^trap .*requeue.* TERM$', script, re.M)


def pip_requirement(line):
    """The quoted requirement of a `pip install` line: `.[cuda13,atari]`."""
    match = re.search(r"pip install [^']*'(\.\[[^\]]*\])'", line)
    return match and match.group(1)


def test_dockerfile_installs_readmes_gpu_install_line():
    dockerfile = DOCKERFILE.read_text()
    [installed] = [pip_requirement(line) for line in dockerfile.splitlines()
                   if line.startswith('RUN ') and pip_requirement(line)]
    readme = (launch.ROOT / 'README.md').read_text()
    gpu = [pip_requirement(line) for line in readme.splitlines()
           if 'cuda13' in line and pip_requirement(line)]
    assert gpu, "README has no `pip install '.[cuda13,...]'` line"
    assert gpu[0] == installed, (gpu[0], installed)


def test_dockerfile_example_runs_parallel_with_shm_and_a_mounted_cache(
        monkeypatch):
    dockerfile = DOCKERFILE.read_text()
    [run] = re.findall(r'^#\s+(docker run .*)$', dockerfile, re.M)
    words = shlex.split(run)
    assert '--shm-size' in words, run
    mounts = [words[i + 1].split(':')[1] for i, w in enumerate(words)
              if w == '-v']
    [cache] = re.findall(r'^ENV EMBODIED_JAX_CACHE=(\S+)$', dockerfile, re.M)
    assert any(cache.startswith(m + '/') for m in mounts), (cache, mounts)
    readme = readme_gpu_config(monkeypatch)
    config = parse(words[words.index('python') + 1:], monkeypatch)
    assert config.script == 'parallel'
    assert (config.task, config.run.envs) == (readme.task, readme.run.envs)
    assert any(config.logdir.startswith(m + '/') for m in mounts)


def job_documents():
    from ruamel.yaml import YAML
    return list(YAML(typ='safe').load_all(JOB.read_text()))


def test_kubernetes_job_grace_fits_the_final_save_and_retries(monkeypatch):
    docs = job_documents()
    job = next(d for d in docs if d['kind'] == 'Job')
    pod = job['spec']['template']['spec']
    [container] = pod['containers']
    config = parse(
        ['-m', 'embodied.main', *container['args']], monkeypatch,
        JOB_COMPLETION_INDEX=0)
    grace = pod['terminationGracePeriodSeconds']
    assert grace >= config.run.drain_timeout + SAVE_SECONDS + EXIT_SECONDS
    assert f'{grace} s' in JOB.read_text()  # The comment derives it.
    # A replica that fails, or a lost pod, is started again.
    assert job['spec']['backoffLimit'] > 0
    assert pod['restartPolicy'] == 'OnFailure'


def test_kubernetes_job_volumes_exist_and_cache_is_mounted():
    docs = job_documents()
    claims = {d['metadata']['name'] for d in docs
              if d['kind'] == 'PersistentVolumeClaim'}
    job = next(d for d in docs if d['kind'] == 'Job')
    pod = job['spec']['template']['spec']
    [container] = pod['containers']
    volumes = {v['name']: v for v in pod['volumes']}
    for volume in volumes.values():
        if 'persistentVolumeClaim' in volume:
            assert volume['persistentVolumeClaim']['claimName'] in claims
    mounts = {m['mountPath']: m['name'] for m in container['volumeMounts']}
    env = {e['name']: e['value'] for e in container['env']}
    cache = env['EMBODIED_JAX_CACHE']
    [mount] = [path for path in mounts if cache.startswith(path + '/')]
    assert 'persistentVolumeClaim' in volumes[mounts[mount]]
    assert volumes[mounts['/dev/shm']]['emptyDir']['medium'] == 'Memory'
    logdir = container['args'][container['args'].index('--logdir') + 1]
    [mount] = [path for path in mounts if logdir.startswith(path + '/')]
    assert 'persistentVolumeClaim' in volumes[mounts[mount]]


def test_kubernetes_job_runs_the_image_the_dockerfile_builds():
    dockerfile = DOCKERFILE.read_text()
    [tag] = re.findall(r'docker build -t (\S+) \.', dockerfile)
    job = JOB.read_text()
    assert re.search(rf'^\s+image: {re.escape(tag)}$', job, re.M)
    assert f'docker build -t {tag} .' in job
