"""Replicas on two "hosts": two network namespaces joined by a veth pair,
each with its own address on a private test subnet and its own loopback,
as two machines on one network are. Here the hostname of the machine may
resolve to a loopback address, which the other namespace cannot reach: the
gloo collectives must advertise the address that reaches the coordinator.

Needs root and `ip netns`; skipped elsewhere. Only traffic inside the two
namespaces; one pair serves the tests of this module that one xdist worker
runs, and is deleted after them, also when one fails."""

import os
import random
import re
import shutil
import signal
import subprocess
import time

import pytest

import launch
from tests.run.test_replicas import digest, final_own_step, replica_flags

pytestmark = pytest.mark.slow


def _ip(*args):
    return subprocess.run(['ip', *args], capture_output=True, text=True)


class Hosts:
    """Two network namespaces, `names[i]` at `addrs[i]`."""

    def __init__(self):
        tag = f'{os.getpid() % 10000}{random.randrange(100)}'
        self.names = [f'emb{tag}h{i}' for i in range(2)]
        self.links = [f'emb{tag}v{i}' for i in range(2)]
        subnet = f'10.{random.randrange(64, 127)}.{random.randrange(256)}'
        self.addrs = [f'{subnet}.1', f'{subnet}.2']

    def create(self):
        steps = [
            *(['netns', 'add', name] for name in self.names),
            ['link', 'add', self.links[0], 'type', 'veth', 'peer', 'name',
             self.links[1]],
        ]
        for i in range(2):
            steps += [
                ['link', 'set', self.links[i], 'netns', self.names[i]],
                ['-n', self.names[i], 'addr', 'add', f'{self.addrs[i]}/24',
                 'dev', self.links[i]],
                ['-n', self.names[i], 'link', 'set', self.links[i], 'up'],
                ['-n', self.names[i], 'link', 'set', 'lo', 'up'],
            ]
        for step in steps:
            result = _ip(*step)
            if result.returncode:
                return f'ip {" ".join(step)}: {result.stderr.strip()}'
        return None

    def delete(self):
        for name in self.names:
            _ip('netns', 'del', name)  # Deletes its end of the veth pair too.


@pytest.fixture(scope='module')
def hosts():
    if os.geteuid() != 0:
        pytest.skip('network namespaces need root')
    if not shutil.which('ip') or _ip('netns', 'list').returncode:
        pytest.skip('`ip netns` is not available')
    pair = Hosts()
    try:
        problem = pair.create()
        if problem:
            pytest.skip(f'cannot create two network namespaces: {problem}')
        yield pair
    finally:
        pair.delete()


class Replica(launch.Launch):
    """A replica's command inside a namespace."""

    def __init__(self, hosts, index, logdir, port, *extra, logfile):
        flags = [str(x) for x in replica_flags(logdir, index, port, *extra)]
        at = flags.index('--jax.coordinator_address')
        flags[at + 1] = f'{hosts.addrs[0]}:{port}'
        self.logfile = logfile
        self._file = open(logfile, 'w')
        self.proc = subprocess.Popen(
            ['ip', 'netns', 'exec', hosts.names[index],
             *launch.command(*flags)], cwd=launch.ROOT, env=launch.env(),
            stdout=self._file, stderr=subprocess.STDOUT)


def start(hosts, tmp_path, logdir, *extra, name='run'):
    port = random.randrange(20000, 30000)  # Free: a namespace of its own.
    return [Replica(hosts, i, logdir, port, *extra,
                    logfile=tmp_path / f'{name}{i}.log') for i in range(2)]


def finish(procs, timeout=900):
    try:
        return [proc.wait(timeout) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()


# Compiled ahead (by default), so both replicas reach their first
# collectives together: gloo gives a peer 30 s to join one. One run per
# scenario: `--script train` on two hosts runs in the kill test below.
def test_two_hosts_train_one_agent(hosts, tmp_path):
    """`--script parallel` (the agent in a process of its own) on two hosts:
    both reach the steps and exit 0 with bit-identical parameters, each
    replica's gloo advertising its own host's address; the step written
    last counts the env steps of both replicas."""
    logdir = tmp_path / 'run'
    procs = start(hosts, tmp_path, logdir, '--script', 'parallel',
                  '--run.steps', 200, '--run.agent_process', True)
    codes = finish(procs)
    outputs = [proc.output() for proc in procs]
    assert codes == [0, 0], '\n\n'.join(o[-3000:] for o in outputs)
    for index, output in enumerate(outputs):
        assert f'gloo at {hosts.addrs[index]}.' in output, output[-3000:]
    assert 'Reached run.steps (200)' in outputs[0] + outputs[1]
    assert digest(outputs[0]) == digest(outputs[1])
    assert (logdir / 'ckpt' / 'replay' / '00001').exists()
    # Replica 0's own (final) env step plus replica 1's as the learners
    # last exchanged them (when they stopped).
    own = [final_own_step(logdir, replica) for replica in ('00000', '00001')]
    written = launch.metrics(logdir)[-1]['step']
    assert own[0] < written <= own[0] + own[1], (written, own)


def test_two_hosts_train_and_a_killed_replica_is_named(hosts, tmp_path):
    """`--script train` on two hosts: both train, each replica's gloo at
    its own host's address; a SIGKILL of replica 1 then ends replica 0
    within 60 s, naming replica 1."""
    logdir = tmp_path / 'run'
    procs = start(hosts, tmp_path, logdir, '--script', 'train',
                  '--run.steps', 1e6, name='kill')
    try:
        for proc in procs:
            proc.wait_for(
                lambda: re.search(r'\[Progress\]', proc.output()),
                timeout=900, what='training on both hosts')
        procs[1].terminate(signal.SIGKILL)
        begin = time.monotonic()
        code = procs[0].wait(timeout=120)
        seconds = time.monotonic() - begin
    finally:
        for proc in procs:
            proc.kill()
    outputs = [proc.output() for proc in procs]
    for index, output in enumerate(outputs):
        assert f'gloo at {hosts.addrs[index]}.' in output, output[-3000:]
    output = outputs[0]
    assert code == 1, output[-3000:]
    assert seconds < 60, seconds
    # Named by the watchdog, or by the collective the kill broke first.
    assert re.search(
        r'replica 1 of 2 was lost|lost contact with replica 1 of 2',
        output), output[-3000:]
