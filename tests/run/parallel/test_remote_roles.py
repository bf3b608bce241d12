"""Roles started as separate commands: a refused or orphaned role says why,
backs off and ends by itself; the main run's last word names what went
wrong and how to start a role. Two "hosts" are two commands with two
logdirs on loopback."""

import re
import time

import numpy as np
import pytest

import launch
from devtools import faults
from embodied import rpc
from embodied.rpc import auth
from embodied.run.parallel import remote_roles
from tests.run.parallel.test_parallel import COMMON

ENVS = ('--run.envs', '1', '--run.eval_envs', '0', '--run.actor_batch', '1')


class Command(faults.Process):
    """A command of the run with a chosen EMBODIED_SECRET; `wait` asserts
    that it ends in time."""

    def __init__(self, logdir, script, *flags, secret=None):
        env = launch.env()
        env.pop(auth.ENV_VAR, None)
        if secret:
            env[auth.ENV_VAR] = secret
        super().__init__(
            launch.command('--script', script, *COMMON, *flags,
                           '--logdir', logdir),
            env, logdir.parent / f'{logdir.name}.log')

    def wait(self, timeout):
        code = super().wait(timeout)
        assert code != 'timeout', (
            f'still running after {timeout} s:\n{self.output()[-3000:]}')
        return code

    def wait_for(self, pattern, timeout=240):
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.output()):
            assert self.poll() is None, (
                f'exited ({self.code}) before {pattern!r}:\n'
                f'{self.output()[-3000:]}')
            assert time.monotonic() < deadline, (
                f'no {pattern!r} after {timeout} s:\n{self.output()[-3000:]}')
            time.sleep(0.1)


@pytest.fixture
def commands():
    started = []
    yield lambda *a, **k: started.append(Command(*a, **k)) or started[-1]
    for command in started:
        command.kill()


def free_port():
    return rpc.addresses.free_ports(1)[0]


@pytest.mark.slow
def test_env_command_with_wrong_secret_says_so_once_and_ends(
        tmp_path, commands):
    """10 s against an actor that refuses its secret: one line per worker
    that names the server and what to set, a few more at the end, little
    CPU, and the exit code of a refusal after run.connect_timeout."""
    server = rpc.Server('127.0.0.1:0', 'Actor',
                        auth=auth.Credentials.from_secret('the-runs-secret'))
    server.bind('act', lambda data: data, batch=1)
    with server:
        port = server.port
        envs = commands(
            tmp_path / 'envs', 'parallel_envs', *ENVS,
            '--run.actor_addr', f'127.0.0.1:{port}',
            '--run.connect_timeout', '10', secret='another-secret')
        assert envs.wait(240) == rpc.supervisor.EXIT_REFUSED
        refused = server.stats()['refused']
    output = envs.output()
    assert envs.seconds >= 10, output
    lines = output.splitlines()
    assert len(lines) <= 12, output
    said = [line for line in lines if 'refused this command' in line]
    assert len(said) == 1, output
    assert f'Actor at 127.0.0.1:{port}' in said[0]
    assert 'EMBODIED_SECRET' in said[0] and '--logdir' in said[0]
    assert 'gave up after 10 s (run.connect_timeout)' in output
    assert 'parallel_envs: ending with exit code 77' in output
    assert 'Traceback' not in output
    # Back-off from 0.1 s, doubling up to 5 s: 8 attempts in 10 s.
    assert refused <= 20, refused
    # Starting Python and the env costs under a CPU second (0.7 measured);
    # a loop that retried at once would spend the whole 10 s on a core.
    assert envs.cpu < 5, envs.cpu


@pytest.mark.slow
def test_main_run_names_refused_envs_and_the_command_to_start_them(
        tmp_path, commands):
    port = free_port()
    addr = ('--run.actor_addr', f'127.0.0.1:{port}')
    main = commands(tmp_path / 'main', 'parallel', *ENVS, *addr,
                    '--run.remote_envs', 'True', '--run.connect_timeout', '10')
    envs = commands(tmp_path / 'envs', 'parallel_envs', *ENVS, *addr,
                    '--run.connect_timeout', '120')
    envs.wait_for('refused this command')
    assert main.wait(240) != 0
    output = main.output()
    start = [line for line in output.splitlines()
             if line.startswith('Start the parallel_envs command')]
    assert len(start) == 1, output[-3000:]
    assert '--script parallel_envs' in start[0]
    assert '--run.remote_envs' not in start[0]
    assert 'EMBODIED_SECRET=<the contents of ' \
        f'{tmp_path / "main" / "secret"}>' in output
    assert 'Traceback' not in output
    assert main.code == rpc.supervisor.EXIT_UNREACHABLE
    match = re.search(
        rf'No env worker reached the actor at 127.0.0.1:{port} within 10 s '
        r'\(run.connect_timeout\)\. The actor refused (\d+) connections? with '
        r'a wrong or missing secret, from 127\.0\.0\.1: commands started '
        r'with another run secret', output)
    assert match, output[-3000:]
    assert 'Start env workers with: python -m embodied.main --script ' \
           'parallel_envs' in output
    envs.kill()


@pytest.mark.slow
def test_env_command_whose_main_run_dies_ends_by_itself(tmp_path, commands):
    port = free_port()
    flags = (*ENVS, '--run.actor_addr', f'127.0.0.1:{port}',
             '--run.connect_timeout', '10', '--run.steps', '1e9')
    main = commands(tmp_path / 'main', 'parallel', *flags,
                    '--run.remote_envs', 'True', secret='shared')
    envs = commands(tmp_path / 'envs', 'parallel_envs', *flags,
                    secret='shared')
    main.wait_for(r'\[Progress\] step [1-9]')
    main.kill()
    killed = time.monotonic()
    code = envs.wait(120)
    output = envs.output()
    assert code == rpc.supervisor.EXIT_UNREACHABLE, output[-3000:]
    assert time.monotonic() - killed < 10 + 30, output[-3000:]
    assert re.search(r'No actor at 127.0.0.1:\d+ for 10 s since it was lost '
                     r'\(run.connect_timeout\): the main run has ended', output)
    assert output.count('Lost the actor') <= 1, output[-3000:]


def test_replay_command_without_main_run_ends_by_itself(tmp_path, commands):
    replay = commands(
        tmp_path / 'replay', 'parallel_replay', *ENVS,
        '--run.logger_addr', f'127.0.0.1:{free_port()}',
        '--run.replay_addr', f'127.0.0.1:{free_port()}',
        '--run.connect_timeout', '3', '--run.wait_report', '1')
    code = replay.wait(120)
    output = replay.output()
    assert code == rpc.supervisor.EXIT_UNREACHABLE, output[-3000:]
    assert 'ReplayLogger: no server at 127.0.0.1:' in output
    assert 'Exiting.' in output and 'Traceback' not in output


def test_role_command_is_this_command_with_another_script():
    argv = ['--script', 'parallel', '--run.remote_envs', 'True',
            '--run.actor_addr', '10.0.0.1:7000', '--logdir', 'A B']
    assert remote_roles.command('parallel_envs', argv).endswith(
        "--script parallel_envs --run.actor_addr 10.0.0.1:7000 "
        "--logdir 'A B'")
    assert '--run.remote' not in remote_roles.command(
        'parallel_envs', ['--script=parallel', '--run.remote_envs=True'])
    assert remote_roles.command(
        'parallel_envs', ['--configs', 'debug']) is None


def test_refused_client_reports_once_backs_off_and_names_the_server(capsys):
    server = rpc.Server('127.0.0.1:0', 'Replay',
                        auth=auth.Credentials.from_secret('right'))
    server.bind('add', lambda x: x)
    wrong = auth.Credentials.from_secret('wrong').handshake()
    with server:
        start = time.monotonic()
        with pytest.raises(rpc.Refused, match='kept refusing'):
            rpc.connect(server.port, 'Learner', timeout=3, handshake=wrong,
                        report_every=30)
        assert time.monotonic() - start >= 3
        with pytest.raises(rpc.Refused, match='kept refusing'):
            rpc.SyncClient.connect(server.port, 'Env00000', timeout=3,
                                   handshake=wrong, report_every=30)
        # Back-off from 0.1 s: about six attempts in 3 s, not hundreds.
        assert server.stats()['refused'] <= 20
        plain = rpc.SyncClient.connect(server.port, 'Plain', timeout=5)
        with pytest.raises(rpc.Refused):
            plain.call('add', np.zeros(1))
    out = capsys.readouterr().out
    for name in ('Learner', 'Env00000'):
        said = [line for line in out.splitlines()
                if line.startswith(f'{name}: Replay at 127.0.0.1:')]
        assert len(said) == 1, out
        assert 'refused this command: its run secret differs' in said[0]


def test_backoff_grows_and_reports_each_reason_once_per_interval(capsys):
    backoff = rpc.backoff.Backoff(first=0.1, limit=0.4, every=0.3)
    assert [backoff.next_delay() for _ in range(4)] == [0.1, 0.2, 0.4, 0.4]
    assert backoff.report('lost', 'lost it')
    assert not backoff.report('lost', 'lost it')
    assert backoff.report('refused', 'refused')
    time.sleep(0.35)
    assert backoff.report('lost', 'lost it', again='still lost')
    backoff.reset()
    assert backoff.next_delay() == 0.1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'lost it' and out[1] == 'refused'
    assert out[2].startswith('still lost (1 more times in the last')


def test_env_command_without_auth_against_a_run_with_auth_names_run_auth(
        tmp_path, commands, capsys):
    server = rpc.Server('127.0.0.1:0', 'Actor',
                        auth=auth.Credentials.from_secret('the-runs-secret'))
    server.bind('act', lambda data: data, batch=1)
    with server:
        port = server.port
        envs = commands(
            tmp_path / 'envs', 'parallel_envs', *ENVS, '--run.auth', 'False',
            '--run.actor_addr', f'127.0.0.1:{port}',
            '--run.connect_timeout', '20')
        assert envs.wait(240) == rpc.supervisor.EXIT_REFUSED
    output = envs.output()
    assert 'Traceback' not in output, output
    said = [line for line in output.splitlines() if 'run.auth differs' in line]
    assert said and f'Actor at 127.0.0.1:{port} refused this ' \
        'command' in said[0], output
    assert '(the server has run.auth True, this command run.auth False)' \
        in said[0]
    assert 'secret differs' not in output, output
    assert 'refused a connection from 127.0.0.1:' in capsys.readouterr().out


def test_env_command_with_auth_against_a_run_without_names_run_auth(
        tmp_path, commands):
    server = rpc.Server('127.0.0.1:0', 'Actor')  # run.auth False.
    server.bind('act', lambda data: data, batch=1)
    with server:
        envs = commands(
            tmp_path / 'envs', 'parallel_envs', *ENVS,
            '--run.actor_addr', f'127.0.0.1:{server.port}',
            '--run.connect_timeout', '5', secret='a-secret')
        assert envs.wait(240) == rpc.supervisor.EXIT_REFUSED
    output = envs.output()
    assert 'Traceback' not in output, output
    said = [line for line in output.splitlines()
            if 'run.auth differs (the server' in line]
    assert len(said) == 1, output
    assert '(the server has run.auth False, this command run.auth True)' \
        in said[0]
    assert 'add --run.auth False to this command' in said[0]
    assert 'its run.auth differs' in output


@pytest.mark.slow
def test_replay_command_whose_main_run_dies_ends_by_itself(
        tmp_path, commands):
    ports = [free_port() for _ in range(3)]
    flags = (*ENVS, '--run.actor_addr', f'127.0.0.1:{ports[0]}',
             '--run.replay_addr', f'127.0.0.1:{ports[1]}',
             '--run.logger_addr', f'127.0.0.1:{ports[2]}',
             '--run.connect_timeout', '10', '--run.steps', '1e9')
    replay = commands(tmp_path / 'replay', 'parallel_replay', *flags,
                      secret='shared')
    main = commands(tmp_path / 'main', 'parallel', *flags,
                    '--run.remote_replay', 'True', secret='shared')
    main.wait_for(r'\[Progress\] step [1-9]')
    assert replay.poll() is None, replay.output()[-3000:]
    main.kill()
    killed = time.monotonic()
    code = replay.wait(120)
    output = replay.output()
    assert code == rpc.supervisor.EXIT_UNREACHABLE, output[-3000:]
    assert time.monotonic() - killed < 10 + 30, output[-3000:]
    assert re.search(rf'Replay: no logger at 127.0.0.1:{ports[2]} for 10 s '
                     r'\(run.connect_timeout\): the main run has ended',
                     output), output[-3000:]
    assert 'Traceback' not in output, output[-3000:]


ORIGINAL_WITH_TIMEOUT = '''
import sys
import elements
import original_main
from embodied import main as mainlib
# The original's args, plus run.connect_timeout so the refusal ends soon.
mainlib.make_args = lambda config: elements.Config(
    **original_main.original_args(config),
    connect_timeout=config.run.connect_timeout)
if __name__ == '__main__':
    mainlib.run(mainlib.parse(sys.argv[1:]))
'''


def test_main_command_through_the_original_main_ends_in_one_line(tmp_path):
    """The original's main.py calls the runners itself, without
    `embodied.main`'s handlers: a refused peer still ends the command with
    one line and exit code 77."""
    script = tmp_path / 'original_with_timeout.py'
    script.write_text(ORIGINAL_WITH_TIMEOUT)
    server = rpc.Server('127.0.0.1:0', 'Replay',
                        auth=auth.Credentials.from_secret('another-secret'))
    with server:
        port = server.port
        flags = ('--script', 'parallel', *COMMON, *ENVS,
                 '--run.remote_replay', 'True',
                 '--run.replay_addr', f'127.0.0.1:{port}',
                 '--run.connect_timeout', '5', '--logdir', tmp_path / 'main')
        env = launch.env()
        env[auth.ENV_VAR] = 'the-runs-secret'
        main = faults.Process(launch.command(*flags, script=script), env,
                              tmp_path / 'main.log')
        try:
            code = main.wait(240)
        finally:
            main.kill()
    output = main.output()
    assert code == rpc.supervisor.EXIT_REFUSED, output[-3000:]
    assert 'Traceback' not in output, output[-3000:]
    errors = [x for x in output.splitlines() if x.startswith('error: ')]
    assert len(errors) == 1, output[-3000:]
    # The launcher's connect or the learner's gives up first, whichever
    # comes first on a busy machine; either line names the address.
    assert f'at 127.0.0.1:{port} kept refusing' in errors[0], errors[0]
