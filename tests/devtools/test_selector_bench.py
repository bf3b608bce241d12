"""The Prioritized selector benchmark: both revisions in one process, one
table row per operation."""

import re

from devtools import selector_bench


def test_compares_a_revision_with_the_working_tree(capsys):
    selector_bench.main([
        '--old', 'HEAD', '--items', '40', '--length', '4', '--draws', '40',
        '--rounds', '2'])
    lines = capsys.readouterr().out.strip().split('\n')
    assert lines[0].startswith('Prioritized: 40 items of 4 steps')
    assert lines[1] == (
        '| op (CPU us per call) | HEAD | working tree | new/old, fastest '
        '| new/old, median |')
    rows = {line.split(' | ')[0][2:]: line for line in lines[3:]}
    assert list(rows) == ['sample', 'prioritize', 'insert + remove']
    for line in rows.values():
        assert re.fullmatch(
            r'\| .+( \| [\d.]+ \(median [\d.]+\)){2}( \| [\d.]+){2} \|', line)


def test_loads_each_tree_under_its_own_name(tmp_path):
    from embodied.perf import checkout as revisions
    old = revisions.export('HEAD', tmp_path / 'old')
    module = selector_bench.load_selectors(old, '_test_selector_bench_old')
    assert module.__name__ == '_test_selector_bench_old.selectors'
    assert module.__file__.startswith(str(old))
    selector = selector_bench.build(module, items=5, length=3)
    assert len(selector) == 5 and selector() in range(5)
