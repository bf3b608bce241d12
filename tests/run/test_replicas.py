"""Replicas on one machine: two processes on loopback, each with 2 CPU
devices, join JAX's distributed runtime (gloo collectives) and train one
DreamerV3 agent at `debug`, as two hosts would."""

import re
import signal
import socket
import time

import pytest

import launch


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


# The replicas' task: vector observations, so that compiling and training
# the debug DreamerV3 take no CNN (what replicas change does not depend on
# the observations; devtools/replica_bench trains on images unless told).
TASK = 'cartpole_balance'


def replica_flags(logdir, replica, port, *extra, replicas=2):
    return (
        '--configs', 'debug', '--task', TASK, '--logdir', logdir,
        '--replica', replica, '--replicas', replicas,
        '--jax.coordinator_address', f'127.0.0.1:{port}',
        '--jax.mock_devices', 2, '--jax.train_devices', 0, 1,
        '--run.envs', 2, '--run.eval_envs', 0, '--run.log_every', 5,
        '--run.save_every', 10, '--run.report_every', 20,
        '--batch_size', 4, '--batch_length', 8, '--report_length', 4,
        '--replay.chunksize', 32, '--run.train_ratio', 8, *extra)


def start(tmp_path, logdir, port, *extra, name='run', per_replica=None):
    procs = []
    for replica in range(2):
        flags = list(extra) + list((per_replica or {}).get(replica, ()))
        procs.append(launch.Launch(
            *replica_flags(logdir, replica, port, *flags),
            logfile=tmp_path / f'{name}{replica}.log'))
    return procs


def finish(procs, timeout=900):
    try:
        return [proc.wait(timeout) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()


def digest(output):
    found = re.findall(r'parameter digest ([0-9a-f]+)', output)
    assert found, output[-3000:]
    return found[-1]


@pytest.mark.slow
def test_config_mismatch_is_refused_naming_the_key(tmp_path):
    port = free_port()
    procs = start(
        tmp_path, tmp_path / 'run', port,
        per_replica={0: ('--run.train_ratio', 32),
                     1: ('--run.train_ratio', 64)})
    codes = finish(procs, timeout=300)
    assert codes[0] != 0 and codes[1] != 0, codes
    for proc in procs:
        output = proc.output()
        assert 'run.train_ratio is 32' in output, output[-3000:]
        assert "64" in output and 'replica 1' in output, output[-3000:]


@pytest.mark.slow
def test_train_mesh_that_splits_parameters_over_hosts_is_refused(tmp_path):
    """f above 1 on a train mesh over two replicas would split the
    parameters across hosts; both replicas refuse it, naming the key and
    value and what fits."""
    port = free_port()
    procs = start(
        tmp_path, tmp_path / 'run', port, '--jax.train_mesh', '1,4,1')
    codes = finish(procs, timeout=300)
    assert codes == [2, 2], codes
    for proc in procs:
        output = proc.output()
        assert "jax.train_mesh is '1,4,1' (f=4, t=1)" in output, output[-3000:]
        assert "jax.train_mesh '-1,1,1'" in output, output[-3000:]


def test_unreachable_coordinator_is_named(tmp_path):
    port = free_port()
    begin = time.monotonic()
    proc = launch.Launch(
        *replica_flags(tmp_path / 'run', 1, port, '--run.connect_timeout', 2),
        logfile=tmp_path / 'alone.log')
    code = finish([proc], timeout=300)[0]
    assert code != 0
    output = proc.output()
    assert f'coordinator at 127.0.0.1:{port} within 2 s' in output, output
    assert time.monotonic() - begin < 120


def test_bad_replica_settings_are_usage_errors(tmp_path):
    result = launch.run(
        '--configs', 'debug', '--logdir', tmp_path / 'run',
        '--replicas', 2, '--replica', 1, timeout=120)
    assert result.returncode == 2
    assert 'jax.coordinator_address is empty' in result.stdout
    result = launch.run(
        '--configs', 'debug', '--logdir', tmp_path / 'run', '--replicas', 2,
        '--replica', 2, '--jax.coordinator_address', 'localhost:1',
        timeout=120)
    assert result.returncode == 2
    assert 'replica is 2 but replicas is 2' in result.stdout


def common_tag(logdir):
    """The newest save that the agent and both replicas' replay and
    counters hold complete."""
    roles = ['agent'] + [
        f'{role}/{replica}' for role in ('replay', 'logger')
        for replica in ('00000', '00001')]
    common = set.intersection(
        *(set(launch.saved_tags(logdir, role)) for role in roles))
    return max(common) if common else None


@pytest.mark.slow
def test_two_replicas_train_one_agent_kill_and_resume(tmp_path):
    """--script train as two replicas: a replica killed ends the other
    within 60 s naming it; both started again resume from their newest
    common save, stop after the same update and exit 0 with bit-identical
    parameters and metrics written once for the run."""
    logdir = tmp_path / 'run'
    port = free_port()
    # Compiled lazily (jax.precompile False): these runs train a few
    # seconds and never report, so compiling report ahead would only cost
    # (the parallel test below compiles ahead, as by default).
    lazily = ('--jax.precompile', False)
    procs = start(
        tmp_path, logdir, port, '--run.steps', 1e6, '--run.save_every', 2,
        *lazily, name='kill')
    try:
        # A save after the one at the start, so that the resume below
        # starts from a step other than 0.
        procs[1].wait_for(
            lambda: (common_tag(logdir) or 0) > 0, timeout=900,
            what='a save of both replicas after the first')
        procs[1].terminate(signal.SIGKILL)
        begin = time.monotonic()
        code = procs[0].wait(timeout=120)
        seconds = time.monotonic() - begin
    finally:
        for proc in procs:
            proc.kill()
    output = procs[0].output()
    assert code != 0, output[-3000:]
    assert seconds < 60, seconds
    assert 'replica 1' in output, output[-3000:]
    print(f'The survivor exited {seconds:.1f} s after the kill.')

    # The tag is a replica's env step; the run's step counts both replicas.
    tag = common_tag(logdir)
    steps = 2 * tag + 40
    port = free_port()
    procs = start(
        tmp_path, logdir, port, '--run.steps', steps, *lazily, name='resume')
    codes = finish(procs)
    outputs = [proc.output() for proc in procs]
    assert codes == [0, 0], '\n\n'.join(o[-3000:] for o in outputs)
    tags = [re.findall(r'Resumed from the save at step (\d+)', o)
            for o in outputs]
    assert tags == [[str(tag)], [str(tag)]], (tags, tag)
    # One set of parameters: bit-identical on both replicas.
    assert digest(outputs[0]) == digest(outputs[1])
    # Metrics written once (by replica 0), with the env step of both.
    rows = launch.metrics(logdir)
    assert max(row['step'] for row in rows) >= steps, rows[-3:]
    assert f'Reached run.steps ({steps})' in outputs[0] + outputs[1]
    for replica in ('00000', '00001'):
        assert (logdir / 'replay' / replica).is_dir()
        assert (logdir / 'ckpt' / 'logger' / replica).is_dir()


# The recipes in examples/: the variables they set must give each replica
# its index, the count and replica 0's coordinator.

EXAMPLES = launch.ROOT / 'examples'


def _parse(argv, monkeypatch, environ):
    from embodied import main
    for key in ('JOB_COMPLETION_INDEX', 'SLURM_PROCID', 'SLURM_NTASKS'):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, str(value))
    return main.parse(argv)


def test_kubernetes_recipe_gives_replica_count_and_coordinator(monkeypatch):
    from ruamel.yaml import YAML
    docs = list(YAML(typ='safe').load_all(
        (EXAMPLES / 'kubernetes-indexed-job.yaml').read_text()))
    service = next(d for d in docs if d['kind'] == 'Service')
    job = next(d for d in docs if d['kind'] == 'Job')
    assert service['spec']['clusterIP'] == 'None'  # Headless.
    assert job['spec']['completionMode'] == 'Indexed'
    pod = job['spec']['template']['spec']
    assert pod['subdomain'] == service['metadata']['name']
    container = pod['containers'][0]
    assert container['command'] == ['python', '-m', 'embodied.main']
    port = service['spec']['ports'][0]['port']
    # Pod i of an Indexed Job is <job>-<i>.<subdomain>: replica 0's host.
    coordinator = (
        f"{job['metadata']['name']}-0.{pod['subdomain']}:{port}")
    for index in range(job['spec']['completions']):
        config = _parse(container['args'], monkeypatch, {
            'JOB_COMPLETION_INDEX': index})
        assert config.replica == index
        assert config.replicas == job['spec']['completions']
        assert config.jax.coordinator_address == coordinator


@pytest.mark.slow
def test_two_by_two_devices_equal_one_by_four(tmp_path):
    """The same global batches (of the vector task) trained by 2
    processes x 2 devices and by 1 process x 4 devices: parameters
    bit-identical across the two replicas, and equal to the single
    process's within float32 tolerance."""
    import numpy as np
    module = 'devtools.replica_bench'
    updates = 3  # The tool's default, given so that TASK can follow.
    port = free_port()
    # The single process runs alongside the two: it compiles while they
    # wait for each other.
    procs = [launch.Launch(
        '--worker', replica, 2, port, 2, tmp_path / f'two{replica}.npz',
        updates, TASK, module=module, logfile=tmp_path / f'two{replica}.log')
        for replica in range(2)]
    procs.append(launch.Launch(
        '--worker', 0, 1, 0, 4, tmp_path / 'one.npz', updates, TASK,
        module=module, logfile=tmp_path / 'one.log'))
    codes = finish(procs)
    assert codes == [0, 0, 0], '\n\n'.join(
        p.output()[-3000:] for p in procs)
    two = [np.load(tmp_path / f'two{replica}.npz') for replica in range(2)]
    one = np.load(tmp_path / 'one.npz')
    assert sorted(two[0].files) == sorted(one.files)
    for key in one.files:
        np.testing.assert_array_equal(two[0][key], two[1][key], err_msg=key)
        if key.startswith('rng/'):
            assert two[0][key] == one[key], key
            continue
        # The optimizer's moments sum gradients of the whole batch, whose
        # float32 sums run in another order over hosts (gloo) than within
        # one process: measured 8e-5 apart at most (in a moment of 0.06),
        # the parameters 4e-13.
        atol = 1e-4 if key.startswith('opt/') else 1e-5
        np.testing.assert_allclose(
            two[0][key], one[key], rtol=1e-3, atol=atol, err_msg=key)


# --script parallel as two replicas: tests/run/test_replica_stop.py.


def final_own_step(logdir, replica):
    """A replica's own env step in its newest logger save."""
    from embodied.core import checkpoint as cplib
    tag = max(launch.saved_tags(logdir, f'logger/{replica}'))
    path = logdir / 'ckpt' / 'logger' / replica / f'{tag:012d}'
    return int(cplib.read_entry(path, 'step'))


def test_hosts_page_commands_give_each_replica_its_index(monkeypatch):
    """The replica commands of docs/hosts.md (not run one by one in
    tests/test_user_paths.py: they only run together) parse to replicas
    0 and 1 of 2 with one coordinator."""
    import shlex
    text = (launch.ROOT / 'docs' / 'hosts.md').read_text()
    commands = [
        line.strip().rstrip('&').strip()
        for block in re.findall(r'```sh\n(.*?)```', text, re.S)
        for line in block.splitlines() if line.startswith('python -m')]
    assert len(commands) == 4, commands
    for pair in (commands[:2], commands[2:]):
        configs = [
            _parse(shlex.split(c)[3:], monkeypatch, {}) for c in pair]
        assert [c.replica for c in configs] == [0, 1]
        assert {c.replicas for c in configs} == {2}
        assert len({c.jax.coordinator_address for c in configs}) == 1
        assert len({c.logdir for c in configs}) == 1
