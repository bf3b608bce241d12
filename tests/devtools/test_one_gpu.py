"""The CPU model of one GPU (`simulated_gpu`) and its benchmark
(`one_gpu`)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from embodied.envs import dummy
from devtools import one_gpu
from devtools import simulated_gpu

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_device_runs_items_first_in_first_out_for_their_time():
    device = simulated_gpu.SerialDevice()
    try:
        start = time.monotonic()
        train = device.submit('train', 60)
        finished = []
        policy = threading.Thread(target=lambda: (
            device.run('policy', 5), finished.append(time.monotonic())))
        policy.start()
        assert not train.is_set()  # Submitting does not wait.
        policy.join(5)
        assert train.is_set()
        # The policy waited for the whole update before it ran.
        assert finished[0] - start >= 0.065
        snapshot = device.snapshot()
        assert snapshot['busy'] == pytest.approx(
            {'train': 0.06, 'policy': 0.005})
        assert snapshot['items'] == {'train': 1, 'policy': 1}
    finally:
        device.close()


def make_agent(monkeypatch, **options):
    monkeypatch.setenv(simulated_gpu.OPTIONS, json.dumps(options))
    env = dummy.Dummy('disc')
    obs_space = {k: v for k, v in env.obs_space.items()
                 if not k.startswith('log/')}
    act_space = {k: v for k, v in env.act_space.items() if k != 'reset'}
    config = dict(batch_size=2, batch_length=3, replay_context=0, seed=0,
                  check_order=False)
    agent = simulated_gpu.SimulatedGPUAgent(obs_space, act_space, config)
    return agent, env


def batch_of(env, batch, length):
    steps = [env.step({'action': 0, 'reset': t == 0}) for t in range(length)]
    return {k: np.stack([np.stack([s[k] for s in steps])] * batch)
            for k in steps[0]}


def test_train_returns_at_once_and_its_metrics_wait_for_the_device(
        monkeypatch):
    # The update is long against any stall of a busy machine: the device
    # sleeps through it, so it costs wall time, not CPU.
    agent, env = make_agent(monkeypatch, train_ms=1500, policy_ms=1)
    try:
        data = batch_of(env, 2, 3)
        start = time.monotonic()
        carry, outs, metrics = agent.train(agent.init_train(2), data)
        assert time.monotonic() - start < 1.0  # Dispatched, not run.
        assert metrics['train_batches'] == 1  # Reading waits for it.
        assert time.monotonic() - start >= 1.5
    finally:
        agent.close()


def test_the_policy_waits_behind_an_update_and_records_its_lag(monkeypatch):
    agent, env = make_agent(monkeypatch, train_ms=50, policy_ms=2)
    try:
        data = batch_of(env, 2, 3)
        obs = {k: v[:, 0] for k, v in data.items()}
        agent.train(agent.init_train(2), data)
        start = time.monotonic()
        agent.policy(agent.init_policy(2), obs)
        assert time.monotonic() - start >= 0.05
        # The copy was submitted right behind the update: the policy, which
        # ran after it, acted with the parameters of update 1 (lag 0).
        snapshot = agent.device.snapshot()
        assert snapshot['policy_calls'] == 1 and snapshot['lag_sum'] == 0
        assert snapshot['items'] == {'train': 1, 'copy': 1, 'policy': 1}
    finally:
        agent.close()


def test_a_host_policy_leaves_the_device_and_copies_every_n_updates(
        monkeypatch):
    agent, env = make_agent(
        monkeypatch, train_ms=1, host_policy_ms=1, copy_every=3)
    try:
        data = batch_of(env, 2, 3)
        for _ in range(4):
            _, _, metrics = agent.train(agent.init_train(2), data)
        dict(metrics)  # Waits for the last update.
        agent.device.run('marker', 0)  # And for the copy behind it.
        agent.policy(agent.init_policy(2), {
            k: v[:, 0] for k, v in data.items()})
        snapshot = agent.device.snapshot()
        assert snapshot['items']['copy'] == 1  # At update 3 only.
        assert 'policy' not in snapshot['items']
        assert snapshot['lag_sum'] == 1  # Acting with update 3 at update 4.
    finally:
        agent.close()


def test_unknown_options_are_refused_by_name(monkeypatch):
    with pytest.raises(KeyError, match='train_mss'):
        make_agent(monkeypatch, train_mss=3)


def test_the_env_hook_slows_every_dummy_step(tmp_path):
    code = (
        'import time\nfrom embodied.envs import dummy\n'
        'env = dummy.Dummy("disc")\n'
        'env.step({"action": 0, "reset": True})\n'
        'start = time.monotonic()\n'
        'for _ in range(5): env.step({"action": 0, "reset": False})\n'
        'print(time.monotonic() - start)\n')
    hook = tmp_path / 'hook'
    hook.mkdir()
    (hook / 'simulated_gpu.py').write_text(
        pathlib.Path(simulated_gpu.__file__).read_text())
    (hook / 'sitecustomize.py').write_text(one_gpu.SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), str(ROOT)]))
    slow = subprocess.run(
        [sys.executable, '-c', code], env={**env, simulated_gpu.ENV_MS: '20'},
        capture_output=True, text=True, check=True)
    assert float(slow.stdout) >= 0.1
    plain = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True,
        text=True, check=True)
    assert float(plain.stdout) < 0.1


def test_figures_are_taken_over_the_steady_window():
    lines = [(100.0, '[Progress] step 0/\n'), (110.0, '[Progress] step 100/\n'),
             (120.0, '[Progress] step 300/\n'),
             (130.0, 'Duration reached at step 500: saving and stopping.\n')]
    # Counters at 0.5 s intervals would do; two around the window suffice.
    snapshots = [
        dict(time=105.0, busy={'train': 1.0, 'policy': 0.5},
             items={'train': 10}, policy_calls=10, policy_seconds=0.2,
             policy_rows=80, lag_sum=2),
        dict(time=135.0, busy={'train': 16.0, 'policy': 3.5},
             items={'train': 310}, policy_calls=310, policy_seconds=6.2,
             policy_rows=2480, lag_sum=152)]
    args = one_gpu.make_parser().parse_args(
        ['--train_ms', '50', '--dilate', '1'])
    args.warmup = 5
    row = one_gpu.figures(args, '[Summary] policy_batch_ms=3.5\n', lines,
                          snapshots)
    # Window 110 s (step 100) to 130 s (step 500): 20 s.
    assert row['env_fps'] == pytest.approx(20.0)
    assert row['learner'] == pytest.approx(100 * 10 / 20)  # 200 updates.
    assert row['busy'] == pytest.approx(100 * (10 + 2) / 20)
    assert row['policy_wait_ms'] == pytest.approx(20.0)
    assert row['policy_batch_ms'] == 3.5
    assert row['policy_rows'] == pytest.approx(8.0)
    assert row['lag'] == pytest.approx(0.5)
    # Dilated 2x, the same run stands for a device twice as fast: rates
    # double and waits halve; shares (learner, busy) and the lag stay.
    args.dilate, args.train_ms = 2, 25  # Items of 50 ms on the device.
    fast = one_gpu.figures(args, '[Summary] policy_batch_ms=3.5\n', lines,
                           snapshots)
    assert fast['env_fps'] == pytest.approx(40.0)
    assert fast['learner'] == pytest.approx(row['learner'])
    assert fast['busy'] == pytest.approx(row['busy'])
    assert fast['policy_wait_ms'] == pytest.approx(10.0)
    assert fast['policy_batch_ms'] == pytest.approx(1.75)
    assert fast['lag'] == pytest.approx(row['lag'])


def test_no_window_is_an_error_that_shows_the_output():
    args = one_gpu.make_parser().parse_args([])
    with pytest.raises(RuntimeError, match='no steady window'):
        one_gpu.figures(args, 'it failed', [], [])


@pytest.mark.slow
def test_the_benchmark_runs_the_runner_on_the_simulated_device(tmp_path):
    """Both modes: the policy in the agent's process, and in a process of
    its own on the device's second context."""
    table = tmp_path / 'table.md'
    result = subprocess.run(
        [sys.executable, '-m', 'devtools.one_gpu', '--envs', '4',
         '--dilate', '1', '--seconds', '20', '--warmup', '2',
         '--train_ms', '20', '--env_ms', '2', '--markdown', str(table)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    for mode in ('thread', 'process'):
        rows = [line for line in table.read_text().splitlines()
                if line.startswith(f'| working tree | 4 | {mode} |')]
        assert len(rows) == 1, table.read_text()
        cells = [float(c) for c in rows[0].strip('|').split('|')[3:]]
        env_fps, learner, busy = cells[:3]
        assert env_fps > 0 and 0 < learner <= 101 and learner <= busy <= 101
        assert cells[-1] >= 0  # The policy lag.


def test_an_unknown_revision_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, '-m', 'devtools.one_gpu', '--old', 'nosuchrev',
         '--envs', '4'], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert '--old nosuchrev: no such git revision' in result.stderr


def test_a_split_update_lets_a_policy_call_run_between_its_programs(
        monkeypatch):
    agent, env = make_agent(
        monkeypatch, train_ms=100, policy_ms=1, split=[0.5, 0.5])
    try:
        data = batch_of(env, 2, 3)
        obs = {k: v[:, 0] for k, v in data.items()}
        waited = []

        def act():
            time.sleep(0.01)  # Arrives while the first program runs.
            start = time.monotonic()
            agent.policy(agent.init_policy(2), obs)
            waited.append(time.monotonic() - start)

        actor = threading.Thread(target=act)
        actor.start()
        _, _, metrics = agent.train(agent.init_train(2), data)
        dict(metrics)
        actor.join(5)
        # It waited for the first half only (about 40 ms), not the update.
        assert 0.03 <= waited[0] < 0.08
    finally:
        agent.close()



def test_one_context_runs_first_in_first_out_two_take_turns_in_slices():
    scheduler = simulated_gpu.Scheduler(slice_s=1.0)
    train, _ = scheduler.submit('learner', 'train', 10.0, 0.0)
    scheduler.submit('learner', 'report', 1.0, 0.0)
    # Alone, the learner keeps the device across slices.
    assert scheduler.advance(2.5) == [] and train[1] == 7.5
    policy, _ = scheduler.submit('policy', 'policy', 0.25, 2.5)
    # The policy waits for the end of the slice (3.0), then runs at once.
    assert scheduler.next_event() == 3.0
    assert scheduler.advance(3.25) == [policy]
    # Back to the learner: its update, then its report, in order.
    finished = scheduler.advance(20.0)
    assert [item[0] for item in finished] == ['train', 'report']
    assert scheduler.busy == {'train': 10.0, 'report': 1.0, 'policy': 0.25}
    assert scheduler.now == 20.0 and scheduler.next_event() is None


def test_a_context_without_work_hands_the_device_over_at_once():
    scheduler = simulated_gpu.Scheduler(slice_s=1.0)
    scheduler.submit('learner', 'train', 5.0, 0.0)
    policy, _ = scheduler.submit('policy', 'policy', 0.25, 0.5)
    scheduler.submit('policy', 'policy', 0.25, 0.5)
    # At 1.0 the policy's two calls run back to back (0.5 s, within its
    # slice), then the learner goes on at 1.5.
    finished = scheduler.advance(1.5)
    assert [item[0] for item in finished] == ['policy', 'policy']
    assert scheduler.busy['train'] == 1.0
    assert scheduler.advance(6.0)[0][0] == 'train'
    assert scheduler.now == 6.0


def test_the_model_reproduces_the_h200_probe():
    """Calibration: a policy process beside a learner training back to back
    (docs/benchmarks.md, One GPU: p50 2.66 ms, the learner at 91%)."""
    figures = simulated_gpu.probe(
        train_ms=49, policy_ms=2.1, policy_device_ms=0.24, slice_ms=1.1,
        calls=2000)
    assert figures['p50'] == pytest.approx(2.66, abs=0.05)
    assert figures['learner'] == pytest.approx(91, abs=0.5)


def test_a_second_process_is_a_context_of_its_own(tmp_path, monkeypatch):
    """With `device_socket`, the first agent's process serves its device;
    another process's policy runs there as a second context, in the next
    slice, not behind the first one's update."""
    socket = str(tmp_path / 'device')
    agent, env = make_agent(
        monkeypatch, train_ms=3000, policy_ms=20, policy_device_ms=4,
        slice_ms=10, device_socket=socket)
    code = (
        'import sys, time\n'
        'from simulated_gpu import RemoteDevice\n'
        f'device = RemoteDevice({socket!r})\n'
        'device.connect()\n'
        'print("ready", flush=True)\n'
        'sys.stdin.readline()\n'
        'start = time.monotonic()\n'
        'device.run("policy", 4)\n'
        'print(time.monotonic() - start, flush=True)\n')
    hook = tmp_path / 'hook'
    hook.mkdir()
    (hook / 'simulated_gpu.py').write_text(
        pathlib.Path(simulated_gpu.__file__).read_text())
    other = subprocess.Popen(
        [sys.executable, '-c', code], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, 'PYTHONPATH': str(hook)})
    try:
        assert not agent.remote
        assert other.stdout.readline().strip() == 'ready'
        data = batch_of(env, 2, 3)
        _, _, metrics = agent.train(agent.init_train(2), data)
        other.stdin.write('go\n')
        other.stdin.flush()
        waited = float(other.stdout.readline())
        assert not metrics._done.is_set()  # The update still runs.
        assert waited < 1.5  # Not behind the 3-s update.
        agent.device.run('marker', 0)  # After the update and its copy.
        assert agent.device.snapshot()['items'] == {
            'train': 1, 'copy': 1, 'policy': 1, 'marker': 1}
    finally:
        other.kill()
        other.wait()
        agent.close()


def test_a_remote_context_submits_without_waiting_and_reads_counters(
        tmp_path):
    """A `RemoteDevice` (here in the same process: a context of its own
    all the same) queues items at once and learns the device's shared
    counters with each answer."""
    device, remote = simulated_gpu.shared_device(dict(
        simulated_gpu.DEFAULTS, device_socket=str(tmp_path / 'device')))
    client, is_remote = simulated_gpu.shared_device(dict(
        simulated_gpu.DEFAULTS, device_socket=str(tmp_path / 'device')))
    try:
        assert not remote and is_remote
        device.count(updates=3)
        first = client.submit('train', 60)
        second = client.submit('policy', 1)
        assert not first.is_set() and not second.is_set()
        assert second.wait(5) and first.is_set()  # In order.
        assert client.shared() == {'updates': 3}
        assert device.snapshot()['busy'] == pytest.approx(
            {'train': 0.06, 'policy': 0.001})
    finally:
        client.close()
        device.close()


def test_a_policy_process_acts_with_the_published_copy(monkeypatch):
    """With `policy_process`, the learner's side publishes each copy once
    it ran; the policy copies a newer one to its device before a call,
    acts with it and counts the updates since as its lag."""
    agent, env = make_agent(
        monkeypatch, train_ms=40, policy_ms=2, policy_device_ms=1,
        policy_process=True)
    try:
        data = batch_of(env, 2, 3)
        obs = {k: v[:, 0] for k, v in data.items()}
        _, _, metrics = agent.train(agent.init_train(2), data)
        dict(metrics)
        deadline = time.monotonic() + 5
        while agent.device.shared().get('published') != 1:
            assert time.monotonic() < deadline, agent.device.shared()
            time.sleep(0.005)
        agent.train(agent.init_train(2), data)  # Update 2, not yet copied.
        agent.policy(agent.init_policy(2), obs)
        snapshot = agent.device.snapshot()
        assert snapshot['updates'] == 2 and snapshot['lag_sum'] == 1
        # Update 1's copy to the host, then to the policy's device; update
        # 2's copy to the host, queued behind update 2.
        assert snapshot['items']['copy'] >= 2
        assert snapshot['busy']['policy'] == pytest.approx(0.001)
    finally:
        agent.close()


def test_the_table_gives_both_modes_side_by_side_and_the_probe():
    args = one_gpu.make_parser().parse_args(['--envs', '16'])
    args.runner_flags = []
    row = dict(env_fps=500.0, learner=80.0, busy=90.0, policy_wait_ms=3.0,
               policy_batch_ms=4.0, policy_rows=8.0, lag=1.0)
    results = {('', 16, 'thread'): [row, {**row, 'learner': 70.0}],
               ('', 16, 'process'): one_gpu.NO_KEY}
    table = one_gpu.markdown(args, results, [''])
    assert '| working tree | 16 | thread | 500 | 75.0 | 90.0 |' in table
    assert f'| working tree | 16 | process | {one_gpu.NO_KEY} |' in table
    probe = re.search(r'probe on the model: .* p50 ([\d.]+) ms, .* at '
                      r'([\d.]+)% of standalone', table)
    assert float(probe.group(1)) == pytest.approx(2.66, abs=0.1)
    assert float(probe.group(2)) == pytest.approx(91, abs=1)


def test_a_tree_without_the_policy_process_key_gets_no_process_run(
        tmp_path):
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs' / 'defaults.yaml').write_text(
        'defaults:\n  run:\n    agent_process: False\n')
    args = one_gpu.make_parser().parse_args([])
    results = {}
    one_gpu.run_one(args, (0, 1), ('old', tmp_path), 16, 'process',
                    (tmp_path, tmp_path), results)
    assert results == {('old', 16, 'process'): one_gpu.NO_KEY}


def test_a_closed_device_leaves_no_call_waiting():
    device = simulated_gpu.SerialDevice()
    queued = device.submit('train', 10_000)
    device.close()
    assert queued.is_set() and device.submit('policy', 10_000).is_set()
