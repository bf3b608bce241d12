"""A run whose caller goes away: its stdout pipe closes mid-run, or the tool
that started it is SIGKILLed. It stops, saves and exits within the bound
and leaves no process (`devtools.exit_soak` repeats these many times)."""

import pytest

from devtools import exit_soak


@pytest.mark.slow
@pytest.mark.parametrize('variant', exit_soak.PIPE_VARIANTS, ids=[
    'stderr-on-the-pipe', 'stderr-apart', 'block-buffered'])
def test_a_run_whose_stdout_closes_stops_saves_and_exits(tmp_path, variant):
    result = exit_soak.pipe_closes(tmp_path, **variant)
    assert exit_soak.check_pipe(result) == [], result
    assert result['seconds'] < exit_soak.BOUND
    log = result['log']
    assert 'lost its reader' in log or 'lost their reader' in log
    saved = [t for t in result['after'] if t not in result['before']]
    assert saved and saved[-1] > max(result['before'], default=-1)
    if variant['split']:  # The stream still working says why, and where.
        assert "This command's stdout lost its reader" in result['stderr']
        assert 'broken_pipe.log' in result['stderr']


@pytest.mark.slow
@pytest.mark.parametrize('repeat', range(2))
def test_the_throughput_tool_sigkilled_leaves_no_process(tmp_path, repeat):
    result = exit_soak.tool_killed(tmp_path, seconds=60)
    assert result['left'] == [], result
    assert result['seconds'] is not None and (
        result['seconds'] < exit_soak.BOUND)
    # It stopped in order (SIGTERM from its tether), not by the SIGKILL.
    assert exit_soak.check_tool(result) == [], result
