"""Fault benchmark of the parallel runner: kills, damaged saves, hostile peers.

    python -m devtools.faults                        # every fault, a table
    python -m devtools.faults --only garbage sigterm --markdown t.md

Each fault runs the real command line (`--script parallel`, the numpy test
agent, `--configs debug`, `dummy_disc`, 2 envs, every server on loopback
with `{auto}` ports) in its own temporary logdir and process group, bounded
by `--timeout` seconds per command. Faults:

* `sigterm-group`: SIGTERM to the run's process group twice and once more
  to the launcher, as `timeout` and schedulers send it.
* `sigkill-replay`, `sigkill-logger`: SIGKILL of one role, then the same
  command again.
* `sigkill-tree`: SIGKILL of every process of the run, then again.
* `damaged-agent.json`, `damaged-replay.json`, `damaged-limiter.json`,
  `damaged-step.json`: the newest save's file cut to 58 bytes after a clean
  stop, then the same command again.
* `disk-full`: the logdir on a 1 MB tmpfs (needs root, else the row says
  it was skipped); the run must end with one line (the path, the bytes
  free, the last complete save) and exit 74, and the same command with
  64 MB must resume from that save.
* `garbage`: while the run trains, each of the three ports gets random bytes,
  a zero-length and a 4 GiB frame header (after portal's plain handshake and
  after a wrong token), 50 connections held open, and an unauthenticated
  `stop('exit')` from a plain `portal.Client`; then the run is stopped by
  SIGTERM.

Roles started as separate commands (`--script parallel_envs` next to
`--script parallel --run.remote_envs True`, each with its own logdir, on
loopback, run.connect_timeout 20 s):

* `envs-wrong-secret`: no EMBODIED_SECRET, so each command has its own
  secret; the env command must say so and end by itself.
* `envs-before-main`: one EMBODIED_SECRET; the env command starts 30 s
  before the main run (run.connect_timeout 60 s) and must still connect.
* `main-killed`: one EMBODIED_SECRET; the main run's process group gets
  SIGKILL while it trains; the env command must end by itself.
* `replica-killed`: `--kills` times (20), two `--script train` replicas
  of DreamerV3 `debug` on loopback, one SIGKILLed once both train; the
  other must exit non-zero within 60 s naming it (CPU-heavy: minutes per
  kill).
* `auth-mismatch`: the main run with run.auth on, the env command with
  `--run.auth False`; the env command must name run.auth and both values.
* `replay-orphan`: a replay command (`--script parallel_replay`) beside
  `--run.remote_replay True`; the main run is SIGKILLed after step 100
  and the replay command must exit 69 within run.connect_timeout.

For these, "what happened" gives each command's exit code, seconds to exit,
lines written and CPU seconds (the command and the children it waited for).

Columns: the fault, what happened (exit codes, where the run resumed),
steps lost (env steps counted before the fault that the resumed run does not
have: the largest step in the metrics, lines moved aside on resume included,
minus the step resumed from; for a stop, the step last printed minus the
final save; the steps since the last complete save are what a SIGKILL costs), and whether a role was killed by
anything but the fault itself.
"""

import argparse
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMON = (
    '--script', 'parallel', '--configs', 'debug', '--agent_impl', 'testing',
    '--task', 'dummy_disc', '--run.envs', '2', '--run.eval_envs', '0',
    '--run.log_every', '1', '--run.save_every', '2', '--replay.size', '3000',
    '--logger.outputs', 'jsonl')
# The files of each role's save (the test agent's holds no arrays, so no
# agent.safetensors).
ROLE_FILES = {
    'agent.json': 'agent', 'replay.json': 'replay', 'limiter.json': 'replay',
    'step.json': 'logger'}


class Run:
    """One command of the benchmark in its own process group."""

    def __init__(self, logdir, *flags, timeout=120, name='first', logs=None):
        self.logdir = pathlib.Path(logdir)
        self.logfile = pathlib.Path(logs or self.logdir.parent) / f'{name}.log'
        self.deadline = time.monotonic() + timeout
        env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
        env['PYTHONPATH'] = os.pathsep.join(
            [str(ROOT), env.get('PYTHONPATH', '')])
        with open(self.logfile, 'a') as f:
            self.proc = subprocess.Popen(
                [sys.executable, '-m', 'embodied.run.parallel', *COMMON,
                 '--logdir', str(logdir), *map(str, flags)],
                cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True)

    def output(self):
        return self.logfile.read_text(errors='replace')

    def step(self):
        steps = re.findall(r'\[Progress\] step (\d+)/', self.output())
        return int(steps[-1]) if steps else 0

    def wait_for(self, predicate, what):
        while not predicate():
            if self.proc.poll() is not None:
                raise RuntimeError(f'Exited before {what}:\n'
                                   f'{self.output()[-2000:]}')
            if time.monotonic() > self.deadline:
                raise TimeoutError(f'Timed out waiting for {what}.')
            time.sleep(0.1)

    def wait(self):
        try:
            return self.proc.wait(max(1, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            return 'timeout'

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def pid(self, name):
        match = re.search(rf'{name} \(pid (\d+)\)', self.output())
        return int(match.group(1)) if match else None

    def ports(self):
        match = re.search(
            r'actor at [\w.]+:(\d+), replay at [\w.]+:(\d+), logger at '
            r'[\w.]+:(\d+)', self.output())
        return [int(x) for x in match.groups()]


class Process:
    """A command line in its own process group, its output in `logfile`;
    once it exited, `code`, `cpu` (its CPU seconds with those of the
    children it waited for) and `seconds` (from its start)."""

    def __init__(self, argv, env, logfile):
        self.argv, self.logfile = argv, pathlib.Path(logfile)
        self.start = time.monotonic()
        self.code = self.cpu = self.seconds = None
        with open(self.logfile, 'w') as f:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=f,
                stderr=subprocess.STDOUT, start_new_session=True)

    def output(self):
        return self.logfile.read_text(errors='replace')

    def lines(self):
        return len(self.output().splitlines())

    def poll(self):
        if self.code is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.code
                self.cpu = usage.ru_utime + usage.ru_stime
                self.seconds = time.monotonic() - self.start
        return self.code

    def wait(self, timeout):
        """The exit code, or 'timeout' (then the process group is killed)."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                return 'timeout'
            time.sleep(0.1)
        return self.code

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while self.poll() is None:
            time.sleep(0.05)


class Command(Process):
    """A role's own command line (no `--script parallel` prefix)."""

    FLAGS = COMMON[2:]  # Without `--script parallel`.

    def __init__(self, tmp, name, script, *flags, secret=None):
        env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
        env.pop('EMBODIED_SECRET', None)
        if secret:
            env['EMBODIED_SECRET'] = secret
        env['PYTHONPATH'] = os.pathsep.join(
            [str(ROOT), env.get('PYTHONPATH', '')])
        argv = [sys.executable, '-m', 'embodied.main', '--script',
                script, *self.FLAGS, '--logdir', str(tmp / name),
                *map(str, flags)]
        super().__init__(argv, env, pathlib.Path(tmp) / f'{name}.log')

    def summary(self, since=None):
        """Exit code, seconds to exit (from its start or from `since`),
        lines written and CPU seconds in all."""
        seconds = self.seconds if since is None else (
            self.start + self.seconds - since)
        after = 'after its start' if since is None else 'after the kill'
        return (f'exit {self.code} {seconds:.0f} s {after}, {self.lines()} '
                f'lines, {self.cpu:.1f} CPU s')


def _remote_pair(tmp, timeout, secret_main, secret_envs, delay=0,
                 connect_timeout=20, during=None, envs_flags=()):
    """The main run with remote envs and an env command; returns both."""
    port = _free_port()
    flags = ('--run.actor_addr', f'127.0.0.1:{port}',
             '--run.connect_timeout', connect_timeout, '--run.steps', '1e9')
    envs = Command(tmp, 'envs', 'parallel_envs', *flags, *envs_flags,
                   secret=secret_envs)
    main = None
    try:
        time.sleep(delay)
        main = Command(tmp, 'main', 'parallel', '--run.remote_envs', 'True',
                       *flags, secret=secret_main)
        if during:
            during(main, envs)
        envs.wait(timeout)
        main.wait(timeout)
    finally:
        envs.kill()
        main and main.kill()
    return main, envs


def _free_port():
    return _free_ports(1)[0]


def _free_ports(count):
    from embodied.rpc import addresses
    return addresses.free_ports(count)


def fault_envs_wrong_secret(tmp, timeout):
    main, envs = _remote_pair(tmp, timeout, None, None)
    named = 'refused this command: its run secret differs' in envs.output()
    told = re.search(r'The actor refused \d+ connections? with a wrong or '
                     r'missing secret', main.output())
    return dict(happened=f'envs: {envs.summary()}'
                         f'{", secret named" if named else ""}; main: '
                         f'exit {main.code}'
                         f'{", refusals named" if told else ""}',
                lost='-', killed=[])


def fault_envs_before_main(tmp, timeout):
    def stop_after_steps(main, envs):
        deadline = time.monotonic() + timeout
        while not re.search(r'\[Progress\] step [1-9]\d{2,}/', main.output()):
            if main.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.2)
        main.proc.send_signal(signal.SIGTERM)
    main, envs = _remote_pair(
        tmp, timeout, 'shared-secret', 'shared-secret', delay=30,
        connect_timeout=60, during=stop_after_steps)
    return dict(happened=f'envs: {envs.summary()}; main: {main.summary()}, '
                         f'stopped by SIGTERM after step 100',
                lost='-', killed=[])


def fault_main_killed(tmp, timeout):
    killed_at = []

    def kill_main(main, envs):
        deadline = time.monotonic() + timeout
        while not re.search(r'\[Progress\] step [1-9]\d{2,}/', main.output()):
            if main.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.2)
        killed_at.append((time.monotonic(), envs.lines()))
        main.kill()
    main, envs = _remote_pair(
        tmp, timeout, 'shared-secret', 'shared-secret', during=kill_main)
    if not killed_at:
        return dict(happened=f'main never reached step 100: {main.summary()}',
                    lost='-', killed=[])
    since, lines = killed_at[0]
    return dict(happened=f'main SIGKILLed after step 100; envs: '
                         f'{envs.summary(since)} '
                         f'({envs.lines() - lines} of them after it)',
                lost='-', killed=[])


def fault_auth_mismatch(tmp, timeout):
    main, envs = _remote_pair(tmp, timeout, 'shared-secret', None,
                              envs_flags=('--run.auth', 'False'))
    named = ('run.auth differs (the server has run.auth True, this command '
             'run.auth False)' in envs.output())
    told = 'run.auth differs (that command has run.auth False' in (
        main.output())
    named = (', run.auth and both values named' if named else
             ', run.auth NOT named')
    return dict(happened=f'envs: {envs.summary()}{named}; '
                         f'main: exit {main.code}'
                         f'{", run.auth named" if told else ""}',
                lost='-', killed=[])


def fault_replay_orphan(tmp, timeout, connect_timeout=20):
    """A replay command whose main run is SIGKILLed after step 100."""
    ports = _free_ports(3)
    flags = ('--run.actor_addr', f'127.0.0.1:{ports[0]}',
             '--run.replay_addr', f'127.0.0.1:{ports[1]}',
             '--run.logger_addr', f'127.0.0.1:{ports[2]}',
             '--run.connect_timeout', connect_timeout, '--run.steps', '1e9')
    replay = Command(tmp, 'replay', 'parallel_replay', *flags,
                     secret='shared-secret')
    main = Command(tmp, 'main', 'parallel', '--run.remote_replay', 'True',
                   *flags, secret='shared-secret')
    try:
        deadline = time.monotonic() + timeout
        while not re.search(r'\[Progress\] step [1-9]\d{2,}/', main.output()):
            if main.poll() is not None or time.monotonic() > deadline:
                return dict(happened=f'main never reached step 100: '
                                     f'{main.summary()}', lost='-', killed=[])
            time.sleep(0.2)
        killed, lines = time.monotonic(), replay.lines()
        main.kill()
        replay.wait(timeout)
    finally:
        replay.kill()
        main.kill()
    named = 'the main run has ended. Exiting.' in replay.output()
    return dict(happened=f'main SIGKILLed after step 100; replay: '
                         f'{replay.summary(killed)} '
                         f'({replay.lines() - lines} of them after it)'
                         f'{", the lost logger named" if named else ""}',
                lost='-', killed=[])


def tags(logdir, role):
    folder = pathlib.Path(logdir) / 'ckpt' / role
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir()
                  if p.name.isdigit() and (p / 'done').exists())


def last_logged_step(logdir):
    """The largest step in the run's metrics, counting the lines a resume
    moved aside: how far the run had counted before a fault."""
    steps = [0]
    for name in ('metrics.jsonl', 'metrics.rewound.jsonl'):
        path = pathlib.Path(logdir) / name
        if path.exists():
            steps += [int(x) for x in re.findall(
                r'"step": (\d+)', path.read_text(errors='replace'))]
    return max(steps)


def resumed_step(output):
    match = re.search(r'Logger resumed at step (\d+)', output)
    return int(match.group(1)) if match else None


def killed_roles(output, expected=()):
    """Roles the launcher saw end unexpectedly, except those in expected."""
    names = re.findall(r"Worker '(\w+)' ended unexpectedly", output)
    return sorted(set(names) - set(expected))


def resume(logdir, timeout, target):
    run = Run(logdir, '--run.steps', target, timeout=timeout, name='rerun')
    code = run.wait()
    output = run.output()
    return code, resumed_step(output), output


def fault_sigterm(tmp, timeout):
    run = Run(tmp / 'run', '--run.steps', '1e9', timeout=timeout)
    try:
        run.wait_for(lambda: run.step() >= 200, 'step 200')
        step = run.step()
        os.killpg(run.proc.pid, signal.SIGTERM)
        time.sleep(0.05)
        os.killpg(run.proc.pid, signal.SIGTERM)
        run.proc.send_signal(signal.SIGTERM)
        code = run.wait()
    finally:
        run.kill()
    saved = (tags(tmp / 'run', 'logger') or [0])[-1]
    common = all(saved in tags(tmp / 'run', r) for r in ('agent', 'replay'))
    return dict(
        happened=f'exit {code}, final save at {saved}'
                 f'{"" if common else " (not in every role)"}',
        lost=max(0, step - saved), killed=killed_roles(run.output()))


def wait_saves(run, count):
    """Waits for `count` saves and step 200."""
    run.wait_for(lambda: len(tags(run.logdir, 'logger')) >= count and (
        run.step() >= 200), f'{count} saves')


def fault_sigkill_role(role):
    def fault(tmp, timeout):
        run = Run(tmp / 'run', '--run.steps', '1e9', timeout=timeout)
        try:
            wait_saves(run, 3)
            os.kill(run.pid(role), signal.SIGKILL)
            code = run.wait()
        finally:
            run.kill()
        target = run.step() + 200
        code2, resumed, output = resume(tmp / 'run', timeout, target)
        lost = last_logged_step(tmp / 'run') - (resumed or 0)
        return dict(
            happened=f'exit {code}; rerun exit {code2}, resumed at '
                     f'{resumed}', lost=lost,
            killed=killed_roles(run.output(), [role]) + killed_roles(output))
    return fault


def fault_sigkill_tree(tmp, timeout):
    run = Run(tmp / 'run', '--run.steps', '1e9', timeout=timeout)
    try:
        wait_saves(run, 3)
        tree = psutil.Process(run.proc.pid).children(recursive=True)
    finally:
        run.kill()
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    code2, resumed, output = resume(tmp / 'run', timeout, run.step() + 200)
    return dict(happened=f'rerun exit {code2}, resumed at {resumed}',
                lost=last_logged_step(tmp / 'run') - (resumed or 0),
                killed=killed_roles(output))


def fault_damaged(filename):
    def fault(tmp, timeout):
        run = Run(tmp / 'run', '--run.steps', '1e9', timeout=timeout)
        try:
            wait_saves(run, 3)
            run.proc.send_signal(signal.SIGTERM)
            code = run.wait()
        finally:
            run.kill()
        role = ROLE_FILES[filename]
        newest = tags(tmp / 'run', role)[-1]
        path = tmp / 'run' / 'ckpt' / role / f'{newest:012d}' / filename
        os.truncate(path, 58)
        code2, resumed, output = resume(tmp / 'run', timeout, newest + 200)
        named = str(path) in output
        return dict(
            happened=f'stop exit {code}; rerun exit {code2}, resumed at '
                     f'{resumed}{", file named" if named else ""}',
            lost=newest - (resumed or 0), killed=killed_roles(output))
    return fault


def _send(port, payload, wait=True):
    with socket.create_connection(('127.0.0.1', port), 5) as sock:
        sock.sendall(payload)
        if wait:
            sock.settimeout(5)
            try:
                sock.recv(16)
            except (ConnectionResetError, socket.timeout):
                pass


def fault_garbage(tmp, timeout):
    import portal
    rng = random.Random(0)
    run = Run(tmp / 'run', '--run.steps', '1e9', timeout=timeout)
    held = []
    try:
        run.wait_for(lambda: run.step() >= 100, 'step 100')
        before = run.step()
        wrong = b'portal_handshake:' + b'0' * 64
        payloads = [
            bytes(rng.randrange(256) for _ in range(256)),
            b'portal_handshake' + (0).to_bytes(8, 'little'),
            b'portal_handshake' + (4 << 30).to_bytes(8, 'little'),
            wrong + (4 << 30).to_bytes(8, 'little'),
            wrong + (0).to_bytes(8, 'little'),
        ]
        for port in run.ports():
            for payload in payloads:
                _send(port, payload)
            for _ in range(50):
                held.append(socket.create_connection(('127.0.0.1', port), 5))
            client = portal.Client(f'127.0.0.1:{port}', 'Intruder',
                                   logging=False)
            try:
                client.call('stop', 'exit').result(timeout=3)
            except Exception:
                pass
            finally:
                client.close(1)
        run.wait_for(lambda: run.step() >= before + 300, 'steps after it')
        step = run.step()
        for sock in held:
            sock.close()
        run.proc.send_signal(signal.SIGTERM)
        code = run.wait()
    finally:
        for sock in held:
            sock.close()
        run.kill()
    saved = (tags(tmp / 'run', 'logger') or [0])[-1]
    refused = len(re.findall('refused a connection', run.output()))
    return dict(
        happened=f'trained on ({before} -> {step}); stop exit {code}, final '
                 f'save at {saved}; {refused} refusals printed',
        lost=max(0, step - saved), killed=killed_roles(run.output()))


def fault_disk_full(tmp, timeout):
    """The logdir on a 1 MB tmpfs (needs root): the run must end with one
    line and exit 74; then, with 64 MB, the same command must resume."""
    from embodied.core import diskfull
    disk = tmp / 'disk'
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', str(disk)],
            capture_output=True).returncode:
        return dict(happened='skipped: mounting a small tmpfs needs root',
                    lost='-', killed=[])
    try:
        run = Run(disk / 'run', '--run.steps', '1e9', timeout=timeout,
                  logs=tmp)
        try:
            code = run.wait()
        finally:
            run.kill()
        output = run.output()
        lines = [x for x in output.splitlines() if 'error' in x.lower()]
        saved = re.search(r'the last complete save, step (\d+)', output)
        saved = int(saved.group(1)) if saved else None
        one = (len(lines) == 1 and 'Traceback' not in output and
               lines[0].startswith('error: Could not write ') and
               'bytes free' in lines[0])
        subprocess.run(['mount', '-o', 'remount,size=64m', str(disk)],
                       check=True)
        rerun = Run(disk / 'run', '--run.steps', (saved or 0) + 200,
                    timeout=timeout, name='rerun', logs=tmp)
        code2 = rerun.wait()
        rerun.kill()
        resumed = resumed_step(rerun.output())
    finally:
        subprocess.run(['umount', '-l', str(disk)], capture_output=True)
    ok = code == diskfull.EXIT_IO and one and resumed == saved
    return dict(
        happened=f'exit {code}, {"one line" if one else "NOT one line"} '
                 f'naming the path, bytes free and the last complete save '
                 f'{saved}; rerun with space exit {code2}, resumed at '
                 f'{resumed}{"" if ok else " (FAILED)"}',
        lost=max(0, run.step() - (saved or 0)),
        killed=killed_roles(output) + killed_roles(rerun.output()))


def fault_replica_killed(tmp, timeout, kills=20):
    """`kills` times: two `--script train` replicas (DreamerV3 `debug`, 2
    CPU devices each, loopback), replica 1 SIGKILLed once both train; the
    survivor must exit non-zero within 60 s naming replica 1."""
    import collections
    from devtools import replica_bench
    results = []
    for index in range(kills):
        folder = tmp / f'kill{index}'
        folder.mkdir()
        seconds, code = replica_bench.seconds_to_exit_after_kill(folder)
        output = (folder / 'kill0.log').read_text(errors='replace')
        named = bool(re.search(
            r'replica 1 of 2 was lost|lost contact with replica 1 of 2',
            output))
        results.append((seconds, code, named))
        print(f'  kill {index + 1}: exit {code} {seconds:.1f} s after it'
              f'{", replica 1 named" if named else ", NOT named"}', flush=True)
    good = sum(named and code not in (0, None) and seconds < 60
               for seconds, code, named in results)
    codes = collections.Counter(code for _, code, _ in results)
    seconds = [s for s, _, _ in results]
    return dict(
        happened=f'{good} of {kills} kills: the survivor named replica 1 and '
                 f'exited non-zero within 60 s; exit codes '
                 f'{dict(sorted(codes.items()))}, {min(seconds):.1f} to '
                 f'{max(seconds):.1f} s after the kill',
        lost='-', killed=[])


FAULTS = {
    'sigterm-group': fault_sigterm,
    'sigkill-replay': fault_sigkill_role('Replay'),
    'sigkill-logger': fault_sigkill_role('Logger'),
    'sigkill-tree': fault_sigkill_tree,
    **{f'damaged-{name}': fault_damaged(name) for name in ROLE_FILES},
    'garbage': fault_garbage,
    'envs-wrong-secret': fault_envs_wrong_secret,
    'envs-before-main': fault_envs_before_main,
    'main-killed': fault_main_killed,
    'disk-full': fault_disk_full,
    'auth-mismatch': fault_auth_mismatch,
    'replay-orphan': fault_replay_orphan,
    'replica-killed': fault_replica_killed,
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--only', nargs='+', default=list(FAULTS),
                        choices=list(FAULTS))
    parser.add_argument('--timeout', type=float, default=180,
                        help='seconds each command may take')
    parser.add_argument('--markdown', type=str, default='')
    parser.add_argument('--kills', type=int, default=20,
                        help='replica-killed: how many pairs to kill')
    args = parser.parse_args(argv)
    # A SIGTERM ends the benchmark through its `finally` blocks, which kill
    # the run it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    rows = []
    for name in args.only:
        start = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                options = {'kills': args.kills} if (
                    name == 'replica-killed') else {}
                row = FAULTS[name](pathlib.Path(tmp), args.timeout, **options)
            except Exception as e:
                row = dict(happened=f'benchmark failed: {type(e).__name__}: '
                                    f'{str(e)[:300]}', lost='?', killed='?')
        row = dict(fault=name, seconds=time.monotonic() - start, **row)
        rows.append(row)
        print(format_row(row), flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')


def format_row(row):
    killed = ', '.join(row['killed']) if isinstance(
        row['killed'], list) else row['killed']
    return (f"{row['fault']}: {row['happened']}; steps lost {row['lost']}; "
            f"roles killed: {killed or 'none'} ({row['seconds']:.0f} s)")


def markdown(rows):
    lines = ['| fault | what happened | steps lost | role killed? |',
             '|---|---|---|---|']
    for row in rows:
        killed = row['killed']
        killed = (', '.join(killed) or 'no') if isinstance(
            killed, list) else killed
        lines.append(f"| {row['fault']} | {row['happened']} | {row['lost']} "
                     f"| {killed} |")
    return '\n'.join(lines)


if __name__ == '__main__':
    main()
