"""`--script parallel` as two replicas on loopback. A SIGTERM stops the run
with one final save at one tag in every replica and exit 0, whether it
reaches every process (a scheduler stopping the job) or one replica's
launcher only; the next launch resumes from that save. The first launch
runs the policy in a process of its own (`run.policy_worker process`),
one per replica; the second resumes its save in the thread mode. (A
parallel run of two replicas to its steps:
tests/run/test_replicas_hosts.py.)"""

import re
import signal

import pytest

import launch
from tests.run.test_replicas import (
    common_tag, digest, finish, free_port, replica_flags)

pytestmark = pytest.mark.slow

# A loss value the logger printed (its filter line names `train/loss/|`).
LOSS = re.compile(r'train/loss/\w+ ')
# Runs until stopped, saving only at the start and at the stop.
PARALLEL = ('--script', 'parallel', '--run.steps', 1e6,
            '--run.save_every', 1e6)
# A replica's launcher names its workers; with the policy process, one.
POLICY = re.compile(r'Workers: Policy \(pid \d+\), Agent')


def launch_replicas(tmp_path, logdir, name, *extra):
    """Both replicas, each leading its own process group as a scheduler's
    task does."""
    port = free_port()
    return [launch.Launch(
        *replica_flags(logdir, replica, port, *PARALLEL, *extra),
        logfile=tmp_path / f'{name}{replica}.log', new_group=True)
        for replica in range(2)]


def stop_and_check(procs, logdir, send):
    """Sends the SIGTERM with `send`, then checks that both replicas exit 0
    after one final save at one tag past the resumed one; returns it."""
    before = common_tag(logdir) or 0
    try:
        # Replica 0's logger prints the losses of this launch's updates.
        procs[0].wait_for(lambda: LOSS.search(procs[0].output()),
                          timeout=900, what='training')
        send(procs)
        codes = finish(procs, timeout=300)
    finally:
        for proc in procs:
            proc.kill()
    outputs = [proc.output() for proc in procs]
    assert codes == [0, 0], '\n\n'.join(o[-3000:] for o in outputs)
    for output in outputs:
        assert 'Traceback' not in output, output[-3000:]
    tag = common_tag(logdir)
    assert tag is not None and tag > before, (tag, before)
    for role in ('agent', 'replay/00000', 'replay/00001'):
        assert launch.saved_tags(logdir, role)[-1] == tag, role
    # One set of parameters: the learners stopped after the same update.
    assert digest(outputs[0]) == digest(outputs[1])
    return tag, outputs


def test_sigterm_to_all_or_one_replica_saves_at_one_tag_and_resumes(
        tmp_path):
    """Two launches on one logdir: SIGTERM to both replicas' process
    groups; then SIGTERM to replica 1's command alone (replica 0 stops
    because it did), in a launch that resumed from the tag the first
    saved."""
    logdir = tmp_path / 'run'

    def to_every_process(procs):
        for proc in procs:
            proc.signal_group(signal.SIGTERM)

    # The policy processes get the SIGTERM too, and leave the stop to
    # their launchers.
    procs = launch_replicas(
        tmp_path, logdir, 'all', '--run.policy_worker', 'process')
    first, outputs = stop_and_check(procs, logdir, to_every_process)
    for output in outputs:
        assert 'Received a stop signal' in output, output[-3000:]
        assert POLICY.search(output), output[:3000]

    def to_replica_1(procs):
        procs[1].terminate(signal.SIGTERM)

    procs = launch_replicas(tmp_path, logdir, 'one')
    _, outputs = stop_and_check(procs, logdir, to_replica_1)
    for output in outputs:
        resumed = re.findall(
            r'Learner resumed the agent from the save at step (\d+)', output)
        assert resumed == [str(first)], (resumed, first, output[-3000:])
    assert not POLICY.search(outputs[0] + outputs[1])
    assert 'Received a stop signal' in outputs[1], outputs[1][-3000:]
    assert 'Another replica stopped the run' in outputs[0], outputs[0][-3000:]
