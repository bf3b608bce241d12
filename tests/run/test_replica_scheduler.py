"""Which replica a command is, from the scheduler that started it: a Slurm
job step of several tasks becomes replicas only when the command asks for
them (`--replicas auto`, `--replicas N`, or a coordinator address);
otherwise it is refused with a message that says what to set."""

import pytest

from embodied import main

SCHEDULER = ('JOB_COMPLETION_INDEX', 'SLURM_PROCID', 'SLURM_NTASKS')


def parse(tmp_path, monkeypatch, *flags, **environ):
    for key in SCHEDULER:
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, str(value))
    return main.parse([
        '--configs', 'debug', '--task', 'dummy_disc', '--script', 'train',
        '--logdir', str(tmp_path), *flags])


COORDINATOR = ('--jax.coordinator_address', 'node0:8476')


def test_multi_task_step_without_a_request_is_refused(tmp_path, monkeypatch):
    with pytest.raises(main.UsageError) as info:
        parse(tmp_path, monkeypatch, SLURM_PROCID=1, SLURM_NTASKS=4)
    message = str(info.value)
    assert 'SLURM_NTASKS=4' in message
    assert '--replicas auto' in message
    assert '--jax.coordinator_address' in message
    assert '--ntasks=1' in message
    assert '--replicas 1' in message


@pytest.mark.parametrize('flags', [
    ('--replicas', 'auto', *COORDINATOR),
    ('--replicas=auto', *COORDINATOR),
    ('--replicas', '4', *COORDINATOR),
    COORDINATOR,  # The scheduler's count, with a coordinator set.
])
def test_asked_for_replicas_takes_the_slurm_task(
        tmp_path, monkeypatch, flags):
    config = parse(tmp_path, monkeypatch, *flags,
                   SLURM_PROCID=2, SLURM_NTASKS=4)
    assert (config.replica, config.replicas) == (2, 4)


def test_auto_without_a_coordinator_names_the_key(tmp_path, monkeypatch):
    with pytest.raises(main.UsageError, match='jax.coordinator_address'):
        parse(tmp_path, monkeypatch, '--replicas', 'auto',
              SLURM_PROCID=0, SLURM_NTASKS=2)


def test_one_replica_asked_runs_each_task_alone(tmp_path, monkeypatch):
    config = parse(tmp_path, monkeypatch, '--replicas', '1',
                   SLURM_PROCID=3, SLURM_NTASKS=4)
    assert (config.replica, config.replicas) == (0, 1)


def test_count_that_differs_from_the_step_is_refused(tmp_path, monkeypatch):
    with pytest.raises(main.UsageError, match='SLURM_NTASKS=4'):
        parse(tmp_path, monkeypatch, '--replicas', '2', *COORDINATOR,
              SLURM_PROCID=0, SLURM_NTASKS=4)


@pytest.mark.parametrize('environ', [
    {}, {'SLURM_PROCID': 0, 'SLURM_NTASKS': 1}])
def test_one_task_runs_alone_with_or_without_auto(
        tmp_path, monkeypatch, environ):
    for flags in ((), ('--replicas', 'auto')):
        config = parse(tmp_path, monkeypatch, *flags, **environ)
        assert (config.replica, config.replicas) == (0, 1)


def test_auto_in_a_kubernetes_job_asks_for_the_count(tmp_path, monkeypatch):
    with pytest.raises(main.UsageError, match='--replicas N'):
        parse(tmp_path, monkeypatch, '--replicas', 'auto', *COORDINATOR,
              JOB_COMPLETION_INDEX=1)


def test_replicas_that_is_neither_count_nor_auto(tmp_path, monkeypatch):
    with pytest.raises(main.UsageError, match="'many'"):
        parse(tmp_path, monkeypatch, '--replicas', 'many')
