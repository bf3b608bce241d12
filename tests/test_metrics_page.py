"""docs/metrics.md, the metrics reference: its patterns name the keys a run
logs (the debug runs of tests/test_user_paths.py, tests/run/parallel/ and
tests/agents/test_dreamerv3.py check theirs against it), and the site and
README link it."""

import re

import launch
import metrics_reference

# Keys of the runners and of DreamerV3, as runs write them.
LOGGED = [
    'step', 'time', 'episode/score', 'episode/length', 'eval_episode/score',
    'eval_episode/length', 'epstats/reward_rate',
    'epstats/log/achievement_collect_wood/sum', 'eval_epstats/policy_image',
    'epstats/policy_log/image', 'train/loss/image', 'train/loss/vector',
    'train/loss/obs/joints', 'train/loss/repval', 'train/imag/ret_rate',
    'train/ent/action', 'train/rand/action', 'train/opt/grad_norm',
    'report/loss/rep', 'report/openloop/image', 'eval/loss/con',
    'eval/openloop/image', 'fps/train', 'fps/env', 'fps/policy',
    'policy_lag/mean', 'policy_lag/max', 'replay/replay_ratio',
    'replay_eval/items', 'limiter/insert_wait_frac', 'parallel/ep_abandoned',
    'parallel_replay/eval_inserts', 'client/report/waitmean',
    'server/replay/sample_batch_train/busy_seconds', 'server/logger/refused',
    'usage/psutil/proc_ram_gb', 'usage/agent/psutil/total_cpu_frac',
    'usage/agent/nvsmi/compute_avg/gpu0', 'timer', 'timer/agent',
    'train/train_batches', 'report/reports',
]
# Names close to those, which no run writes.
NOT_LOGGED = [
    'score', 'episode/return', 'eval_episode/scores', 'train/loss',
    'train/imag/retrun', 'report/loss', 'report/imag/ret', 'eval/opt/loss',
    'replay/size', 'replay_eval/bogus', 'limiter/ratio', 'parallel/steps',
    'client/train', 'fps/learner', 'policy_lag', 'train/opt/lr',
]


def test_the_page_names_the_keys_runs_log_and_no_others():
    assert metrics_reference.undocumented(LOGGED) == []
    assert metrics_reference.undocumented(NOT_LOGGED) == sorted(NOT_LOGGED)


def test_patterns_stand_for_names_rests_and_either_word():
    regex = metrics_reference.to_regex('{report,eval}/loss/<key>')
    assert regex.fullmatch('report/loss/image')
    assert regex.fullmatch('eval/loss/obs/joints')  # Keys may hold '/'.
    assert not regex.fullmatch('train/loss/image')
    assert not regex.fullmatch('report/loss/')
    regex = metrics_reference.to_regex('usage/<process>/psutil/*')
    assert regex.fullmatch('usage/replay/psutil/proc_cpu_usage')
    assert not regex.fullmatch('usage/psutil/proc_cpu_usage')
    assert metrics_reference.to_regex('fps/train').fullmatch('fps/train')
    assert not metrics_reference.to_regex('fps/train').fullmatch('fpsXtrain')


def test_a_key_missing_from_the_page_is_named(tmp_path):
    page = tmp_path / 'metrics.md'
    page.write_text('| key | meaning |\n|---|---|\n'
                    '| `train/loss/<key>` | a loss |\n')
    (tmp_path / 'metrics.jsonl').write_text(
        '{"step": 1, "train/loss/image": 2.0, "train/new_metric": 1.0}\n')
    keys = metrics_reference.logged(tmp_path) - {'step'}
    try:
        metrics_reference.check(keys, page)
    except AssertionError as e:
        assert "['train/new_metric']" in str(e)
    else:
        raise AssertionError('the missing key passed')


def test_the_site_and_the_readme_link_the_page():
    nav = (launch.ROOT / 'mkdocs.yml').read_text()
    assert re.search(r'^\s+- [^:]+: metrics\.md$', nav, re.M), nav
    readme = (launch.ROOT / 'README.md').read_text()
    assert '| [Metrics](docs/metrics.md) |' in readme
