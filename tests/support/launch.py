"""Helpers for tests that run the command line in a subprocess."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUPPORT = pathlib.Path(__file__).resolve().parent


def env():
    result = dict(os.environ)
    result['JAX_PLATFORMS'] = 'cpu'
    result['PYTHONUNBUFFERED'] = '1'
    # The support folder too, for the scripts there (`original_main`).
    result['PYTHONPATH'] = os.pathsep.join(
        [str(ROOT), str(SUPPORT), result.get('PYTHONPATH', '')])
    return result


def command(*flags, module='embodied.main', script=None):
    """The command line of `python -m module` (or `python script`)."""
    entry = [str(script)] if script else ['-m', module]
    return [sys.executable, *entry, *map(str, flags)]


def assert_imports_without(modules, absent):
    """Imports `modules` in a fresh interpreter and fails unless none of
    the `absent` modules was imported with them."""
    code = (
        f'import sys, {", ".join(modules)}; '
        f'bad = [m for m in {tuple(absent)!r} if m in sys.modules]; '
        'assert not bad, bad')
    result = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True,
        timeout=60, env=env())
    assert result.returncode == 0, result.stderr


def run(*flags, timeout=600, module='embodied.main'):
    """Runs to completion; returns CompletedProcess with text output."""
    return subprocess.run(
        command(*flags, module=module), cwd=ROOT, env=env(), timeout=timeout,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Launch:
    """A command running in the background with its output in a file."""

    def __init__(self, *flags, logfile, module='embodied.main', script=None,
                 new_group=False):
        self.logfile = pathlib.Path(logfile)
        self._file = open(self.logfile, 'w')
        # With `new_group`, the command leads its own process group, as a
        # job under a scheduler does, so `signal_group` reaches all of it.
        self.proc = subprocess.Popen(
            command(*flags, module=module, script=script), cwd=ROOT, env=env(),
            stdout=self._file, stderr=subprocess.STDOUT,
            start_new_session=new_group)

    def output(self):
        return self.logfile.read_text()

    def wait_for(self, predicate, timeout=120, what='condition'):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(
                    f'Process exited ({self.proc.returncode}) before {what}:'
                    f'\n{self.output()[-3000:]}')
            time.sleep(0.1)
        raise AssertionError(
            f'Timed out waiting for {what}:\n{self.output()[-3000:]}')

    def terminate(self, signum=signal.SIGTERM):
        self.proc.send_signal(signum)

    def signal_group(self, signum=signal.SIGTERM):
        """Sends `signum` to every process of the command's group."""
        os.killpg(self.proc.pid, signum)

    def wait(self, timeout=60):
        try:
            code = self.proc.wait(timeout)
        finally:
            self._file.close()
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._file.close()


def run_until_logged(*flags, logdir, key, logfile, timeout=600):
    """Runs the command (with no step limit of its own) until its metrics
    hold `key`, then stops it with SIGTERM as a user would; returns the
    exit code and the output. A run ends when what a test checks has
    happened, however busy the machine."""
    proc = Launch(*flags, '--logdir', logdir, '--run.steps', '1e9',
                  logfile=logfile)
    try:
        proc.wait_for(lambda: any(key in row for row in metrics(logdir)),
                      timeout=timeout, what=f'{key} in the metrics')
        proc.terminate()
        code = proc.wait(180)
    finally:
        proc.kill()
    return code, proc.output()


def metrics(logdir, filename='metrics.jsonl'):
    path = pathlib.Path(logdir) / filename
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # A line being written right now.
    return rows


def latest_value(logdir, key):
    values = [row[key] for row in metrics(logdir) if key in row]
    return values[-1] if values else None


def launch_ports(output):
    """The actor, replay and logger ports a parallel launch printed."""
    import re
    match = re.search(
        r'actor at [\w.]+:(\d+), replay at [\w.]+:(\d+), logger at '
        r'[\w.]+:(\d+)', output)
    assert match, output[-2000:]
    return [int(port) for port in match.groups()]


def saved_tags(logdir, role):
    folder = pathlib.Path(logdir) / 'ckpt' / role
    if not folder.exists():
        return []
    return sorted(
        int(p.name) for p in folder.iterdir()
        if p.name.isdigit() and (p / 'done').exists())
