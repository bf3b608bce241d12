"""The recipes in examples/ and the Dockerfile: the one-node Slurm recipe
starts one run that the parser takes as one replica, passes the time-limit
SIGTERM on to it and requeues the job; the image installs what README's GPU
install line installs."""

import os
import re
import signal
import subprocess
import time

from embodied import main

import launch

EXAMPLES = launch.ROOT / 'examples'


def fake_slurm(tmp_path):
    """`srun` that records its arguments and runs until SIGTERM (recording
    that too), `scontrol` that records its arguments, and an empty venv."""
    fake = tmp_path / 'bin'
    fake.mkdir()
    (fake / 'srun').write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done '
        f'> {tmp_path}/argv\n'
        f'trap "echo term > {tmp_path}/srun_term; exit 0" TERM\n'
        f'while :; do sleep 0.05; done\n')
    (fake / 'scontrol').write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol\n')
    for name in ('srun', 'scontrol'):
        os.chmod(fake / name, 0o755)
    (tmp_path / 'venv' / 'bin').mkdir(parents=True)
    (tmp_path / 'venv' / 'bin' / 'activate').write_text(
        f'echo activated > {tmp_path}/activated\n')
    return dict(os.environ, PATH=f'{fake}:{os.environ["PATH"]}',
                SLURM_JOB_ID='42', VENV=str(tmp_path / 'venv'),
                LOGDIR=str(tmp_path / 'run'))


def wait_for(path, timeout=30):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f'{path} never appeared'
        time.sleep(0.05)


def test_one_node_recipe_runs_once_and_requeues_on_sigterm(
        tmp_path, monkeypatch):
    script = (EXAMPLES / 'slurm-one-node.sbatch').read_text()
    assert re.search(r'^#SBATCH --signal=B:TERM@\d+$', script, re.M)
    assert re.search(r'^#SBATCH --requeue$', script, re.M)
    assert re.search(r'^#SBATCH --ntasks=1$', script, re.M)
    proc = subprocess.Popen(
        ['bash', EXAMPLES / 'slurm-one-node.sbatch'],
        env=fake_slurm(tmp_path), stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        wait_for(tmp_path / 'argv')
        assert (tmp_path / 'activated').exists()
        proc.send_signal(signal.SIGTERM)  # What Slurm sends before the limit.
        out, _ = proc.communicate(timeout=30)
    finally:
        try:  # The stand-in srun, should the script have left it behind.
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, out
    assert (tmp_path / 'srun_term').exists()  # The run got the SIGTERM.
    assert (tmp_path / 'scontrol').read_text().split() == ['requeue', '42']
    argv = (tmp_path / 'argv').read_text().splitlines()
    assert argv[:3] == ['python', '-m', 'embodied.main'], argv
    for key in ('SLURM_PROCID', 'SLURM_NTASKS', 'JOB_COMPLETION_INDEX'):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv('SLURM_PROCID', '0')
    monkeypatch.setenv('SLURM_NTASKS', '1')
    config = main.parse(argv[3:])
    assert (config.replica, config.replicas) == (0, 1)
    assert config.logdir == str(tmp_path / 'run')
    assert (config.task, config.run.envs, config.replay.size) == (
        'atari_pong', 16, 5e6)


def pip_requirement(line):
    """The quoted requirement of a `pip install` line: `.[cuda13,atari]`."""
    match = re.search(r"pip install [^']*'(\.\[[^\]]*\])'", line)
    return match and match.group(1)


def test_dockerfile_installs_readmes_gpu_install_line():
    dockerfile = (launch.ROOT / 'Dockerfile').read_text()
    [installed] = [pip_requirement(line) for line in dockerfile.splitlines()
                   if line.startswith('RUN ') and pip_requirement(line)]
    readme = (launch.ROOT / 'README.md').read_text()
    gpu = [pip_requirement(line) for line in readme.splitlines()
           if 'cuda13' in line and pip_requirement(line)]
    assert gpu, "README has no `pip install '.[cuda13,...]'` line"
    assert gpu[0] == installed, (gpu[0], installed)


def test_kubernetes_job_runs_the_image_the_dockerfile_builds():
    dockerfile = (launch.ROOT / 'Dockerfile').read_text()
    [tag] = re.findall(r'docker build -t (\S+) \.', dockerfile)
    job = (EXAMPLES / 'kubernetes-indexed-job.yaml').read_text()
    assert re.search(rf'^\s+image: {re.escape(tag)}$', job, re.M)
    assert f'docker build -t {tag} .' in job
