"""`--help` and the parameter reference: every config key with its default
and its comment from configs/*.yaml; and the `gpu` block, which gives each
suite the original's values for one GPU."""

import subprocess
import sys

import pytest

from embodied import config as configlib
from embodied import config_reference
from embodied import main

import launch


@pytest.mark.parametrize('module', ['embodied.main', 'embodied.run.parallel'])
def test_help_lists_every_key_and_exits_0(module):
    result = subprocess.run(
        [sys.executable, '-m', module, '--help'], cwd=launch.ROOT,
        env=launch.env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for key in configlib.build([]).flat:
        assert any(line.split()[:1] == [f'--{key}'] for line in lines), key
    for section in ('[top level]', '[run]', '[replay]', '[jax]', '[agent]'):
        assert section in lines, section
    for block in configlib.load_blocks():
        if block != 'defaults':
            assert f'  {block}' in result.stdout, block


def test_help_shows_defaults_comments_and_blocks_applied(capsys):
    with pytest.raises(SystemExit) as info:
        main.parse(['--configs', 'atari', 'gpu', '--help'])
    assert info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    envs = next(line for line in lines if line.split()[:1] == ['--run.envs'])
    assert envs.split()[1] == '16', envs
    assert '(laptop) original: 16' in envs
    steps = next(line for line in lines if line.split()[:1] == ['--run.steps'])
    assert steps.split()[1] == '5.1e7', steps


def test_reference_takes_comments_from_every_file(tmp_path):
    (tmp_path / 'a.yaml').write_text(
        'defaults:\n  alpha: 1  # the first key\n  group:\n'
        '    beta: x  # a nested key\n    gamma: {u: 1, v: 2}  # a mapping\n'
        'fast:\n  # Makes it fast.\n  alpha: 2\n')
    (tmp_path / 'b.yaml').write_text(
        'defaults:\n  other:\n    delta: 0.5  # from the second file\n')
    config = configlib.build([], configlib.load_blocks(tmp_path))
    rows = {key: (value, comment)
            for _, _, group in config_reference.sections(config, tmp_path)
            for key, value, comment in group}
    assert rows['alpha'] == (1, 'the first key')
    assert rows['group.beta'] == ('x', 'a nested key')
    assert rows['group.gamma.u'] == (1, 'a mapping')
    assert rows['group.gamma.v'] == (2, '')
    assert rows['other.delta'] == (0.5, 'from the second file')
    [(name, note, keys)] = config_reference.blocks(tmp_path)
    assert (name, note, keys) == ('fast', 'Makes it fast.', {'alpha': 2})


def test_every_key_has_a_meaning():
    """`--help` and docs/configs.md say what every key does: each key of
    `defaults` has a comment in configs/*.yaml (a flow mapping would give
    its later keys none)."""
    assert config_reference.unexplained() == []
    config = configlib.build([])
    rows = {key: comment
            for _, _, group in config_reference.sections(config)
            for key, _, comment in group}
    assert set(rows) == set(config.flat)
    for key in ('agent.loss_scales.rep', 'agent.dyn.rssm.free_nats',
                'agent.retnorm.perchi', 'agent.slowvalue.rate',
                'agent.opt.agc', 'agent.enc.simple.depth',
                'replay.prio.maxfrac', 'env.atari.sticky'):
        assert len(rows[key].split()) >= 3, (key, rows[key])


def test_keys_without_a_meaning_are_named(tmp_path):
    (tmp_path / 'a.yaml').write_text(
        'defaults:\n  alpha: 1  # the first key\n  group:\n'
        '    gamma: {u: 1, v: 2}  # a mapping\n'
        '    delta:\n      w: 1  # a key of its own\n      x: 2\n'
        '  beta: 2\n')
    assert config_reference.unexplained(tmp_path) == [
        'beta', 'group.gamma.v', 'group.delta.x']


def test_placeholders_in_comments_are_not_html_on_the_page(tmp_path):
    (tmp_path / 'a.yaml').write_text(
        'defaults:\n  alpha: 1  # logged as train/loss/<key>, a | b\n')
    text = config_reference.markdown(tmp_path)
    assert '| `alpha` | `1` | logged as train/loss/&lt;key&gt;, a \\| b |' in (
        text)


def test_docs_page_is_regenerated_in_place():
    text = (f'before\n{config_reference.START}\nold\n'
            f'{config_reference.END}\nafter\n')
    new = config_reference.replace_generated(
        text, f'{config_reference.START}\nnew\n{config_reference.END}')
    assert new == (f'before\n{config_reference.START}\nnew\n'
                   f'{config_reference.END}\nafter\n')
    with pytest.raises(ValueError, match='markers'):
        config_reference.replace_generated('no markers', 'x')


# The original's values on a GPU: its defaults (16 envs, 4 eval envs, a 5e6
# replay), with its suite blocks' own env counts (atari100k and crafter: 1).
GPU_COMMANDS = {
    ('atari', 'gpu'): 16,
    ('dmc_proprio', 'gpu'): 16,
    ('dmc_vision', 'gpu'): 16,
    ('atari100k', 'gpu', '--run.envs', '1'): 1,
    ('crafter', 'gpu', '--run.envs', '1'): 1,
}


@pytest.mark.parametrize('command', list(GPU_COMMANDS))
def test_gpu_block_gives_the_originals_values(tmp_path, command):
    blocks = [arg for arg in command if not arg.startswith('-')
              and not arg[0].isdigit()]
    flags = list(command[len(blocks):])
    config = main.parse(
        ['--configs', *blocks, '--logdir', str(tmp_path), *flags])
    assert config.run.envs == GPU_COMMANDS[command]
    assert config.run.eval_envs == 4
    assert config.replay.size == 5e6
    assert config.jax.platform == 'cuda'
    suite = configlib.build([blocks[0]])
    assert config.task == suite.task
    assert config.run.steps == suite.run.steps
    assert config.run.train_ratio == suite.run.train_ratio
