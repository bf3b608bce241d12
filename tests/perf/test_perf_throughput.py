"""The throughput benchmark's side-by-side mode (`--old REV`)."""

import subprocess
import sys

import numpy as np
import pytest

from embodied.perf import throughput


def measured(fps, cpu):
    roles = dict.fromkeys(throughput.ROLES, 0.0)
    roles['replay'], roles['launcher'] = cpu / 2000, 0.1
    return dict(runner='parallel', name='x', env_fps=fps, train_fps=0.0,
                latency_ms=1.0, cpu_per_step=cpu / 1000, first_step=1.0,
                steady_cpu_per_step=cpu / 2000, roles=roles)


def test_compare_gives_every_round_and_the_ratio_of_medians():
    rows = [('parallel', 'random, 16 envs, 8/worker', (), 15)]
    results = {
        ('abc123', rows[0][1]): [measured(f, 0.5) for f in (100, 300, 200)],
        ('', rows[0][1]): [measured(f, 0.4) for f in (330, 110, 220)],
    }
    table = throughput.compare(rows, results, 'abc123', 3)
    assert '3 alternating rounds' in table
    line = table.splitlines()[4]
    cells = [c.strip() for c in line.strip('|').split('|')]
    assert cells[:2] == ['parallel', 'random, 16 envs, 8/worker']
    assert cells[2] == '100, 300, 200' and cells[3] == '330, 110, 220'
    assert cells[4] == '1.10'  # 220 / 200.
    assert cells[5] == '0.50, 0.50, 0.50' and cells[7] == '0.80'
    assert cells[11:] == ['0.250, 0.250, 0.250', '0.200, 0.200, 0.200',
                          '0.80']  # Steady CPU ms/env step, ratio.
    by_role = table.splitlines()[-1]
    assert table.splitlines()[-3] == '| setting | launcher | replay |'
    assert by_role == ('| random, 16 envs, 8/worker | 100.000 → 100.000 | '
                       '0.250 → 0.200 |')  # Roles without CPU left out.


def test_a_row_that_failed_in_one_tree_says_so():
    rows = [('parallel', 'dreamerv3', (), 120)]
    results = {('abc123', 'dreamerv3'): [],
               ('', 'dreamerv3'): [measured(10, 5.0)]}
    table = throughput.compare(rows, results, 'abc123', 1)
    assert '| parallel | dreamerv3 | failed | 10 | – | failed | 5.00 | – |' \
        in table
    assert table.splitlines()[4].endswith('| failed | 2.500 | – |')
    assert 'by process' not in table  # No row to break down.


def test_cpu_is_attributed_to_the_roles_the_launcher_names():
    output = ('Launching 4 workers ...\nWorkers: Agent (pid 11), Replay '
              '(pid 12), Logger (pid 13), Env00000-00007 (pid 14), '
              'Env00008-00015 (pid 15).\n')
    used = {10: 1.0, 11: 2.0, 12: 3.0, 13: 0.5, 14: 0.25, 15: 0.25, 16: 0.1}
    roles = throughput.by_role(output, used, launcher=10)
    assert roles == {'launcher': 1.0, 'agent': 2.0, 'replay': 3.0,
                     'logger': 0.5, 'env workers': 0.5, 'other': 0.1}


def test_plan_has_the_dreamer_rows_only_when_asked():
    plain = throughput.plan(throughput.make_parser().parse_args(
        ['--envs', '16', '--per_worker', '1', '8']))
    assert [name for _, name, *_ in plain][:2] == [
        'random, 16 envs, 1/worker', 'random, 16 envs, 8/worker']
    assert not any('dreamerv3' in name for _, name, *_ in plain)
    dreamer = throughput.plan(throughput.make_parser().parse_args(
        ['--skip_random', '--skip_agent', '--dreamer', '--agent', '16x8']))
    (kind, name, flags, seconds), = dreamer
    assert kind == 'parallel' and 'dreamerv3' in name
    assert list(flags[:2]) == ['--agent_impl', 'dreamerv3']
    assert seconds == 120  # --dreamer_seconds: compiling comes first.


def test_an_unknown_revision_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, '-m', 'embodied.perf.throughput', '--old',
         'no-such-revision-here', '--skip_agent', '--envs', '1',
         '--per_worker', '1', '--seconds', '1'],
        cwd=throughput.ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert 'no-such-revision-here' in result.stderr


@pytest.mark.parametrize('setting', ['16', '16x', 'x8', '16-8'])
def test_a_malformed_agent_setting_is_a_usage_error(setting):
    with pytest.raises(SystemExit) as error:
        throughput.main(['--agent', setting])
    assert error.value.code == 2


def test_steady_rate_is_timed_from_the_first_progress_line_to_the_stop():
    lines = [
        (0.0, 'Workers: Agent (pid 11).\n'),
        (4.0, '[Progress] step 1000/1000000000 | elapsed 0:00:05\n'),
        (9.0, '[Progress] step 9000/1000000000 | elapsed 0:00:10\n'),
        (14.0, 'Run duration reached at step 17000: saving and stopping.\n'),
        (20.0, '[Summary] steps=17100 wall_s=20.0\n'),
    ]
    assert throughput.steady_fps(lines) == (17000 - 1000) / (14.0 - 4.0)
    assert throughput.steady_fps(lines[:3]) != throughput.steady_fps(
        lines[:3])  # NaN: the run never decided to stop.


def test_steady_cpu_counts_the_cpu_between_the_first_progress_line_and_the_stop():
    lines = [
        (0.0, 'Workers: Agent (pid 11).\n'),
        (4.0, '[Progress] step 1000/1000000000 | elapsed 0:00:05\n'),
        (14.0, 'Run duration reached at step 17000: saving and stopping.\n'),
    ]
    # Start-up takes 3 CPU seconds, the stepping 1.5 cores from 3.5 s on,
    # the final save 6.5 s of CPU in the second after 13.5 s.
    samples = [(0.0, 0.0), (2.0, 3.0), (3.5, 3.0), (4.5, 4.5), (13.5, 18.0),
               (14.5, 24.5), (16.0, 25.0)]
    assert throughput.cpu_at(samples, 4.0) == pytest.approx(3.75)
    assert throughput.cpu_at(samples, 14.0) == pytest.approx(21.25)
    assert throughput.steady_cpu(lines, samples) == pytest.approx(
        (21.25 - 3.75) / 16000)
    assert np.isnan(throughput.steady_cpu(lines, samples[:3]))  # Too short.
    assert np.isnan(throughput.steady_cpu(lines[:2], samples))  # No stop.
