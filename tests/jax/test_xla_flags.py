"""`jax.autotune` and `jax.deterministic` reach XLA as the original's flags,
`jax.debug` the CPU emitters that compile fastest, and a flag the user set
in $XLA_FLAGS wins. XLA reads $XLA_FLAGS once per
process, so each case runs `runtime.setup` in a fresh process and reads the
debug options XLA dumps beside each program it compiles."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from embodied.jax import runtime

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, sys
import elements
from embodied.jax import runtime
settings = json.loads(sys.argv[1])
jaxcfg = elements.Config({
    'platform': 'cpu', 'compute_dtype': 'auto', 'policy_devices': [0],
    'train_devices': [0], 'mock_devices': 0, 'prealloc': False, 'jit': True,
    'debug': False, **settings})
runtime.setup(jaxcfg)
import jax, jax.numpy as jnp
print(jax.jit(lambda x: x * 3)(jnp.ones(2)))
'''


def debug_options(tmp_path, settings, user_flags=''):
    """XLA's debug options of a program compiled after `runtime.setup` with
    the `jax` keys `settings` and $XLA_FLAGS `user_flags`, as {name: value}."""
    dump = tmp_path / 'dump'
    env = dict(
        os.environ, JAX_PLATFORMS='cpu', EMBODIED_JAX_CACHE='off',
        PYTHONPATH=str(ROOT),
        XLA_FLAGS=f'--xla_dump_to={dump} {user_flags}'.strip())
    env.pop('TF_CUDNN_DETERMINISTIC', None)
    result = subprocess.run(
        [sys.executable, '-c', SCRIPT, json.dumps(settings)], env=env,
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(dump.glob('*lambda*.debug_options'))
    assert files, sorted(p.name for p in dump.iterdir())
    options = {}
    for line in files[0].read_text().splitlines():
        if ':' in line:
            key, value = line.split(':', 1)
            options[key.strip()] = value.strip()
    return options


def test_defaults_are_the_originals_xla_flags(tmp_path):
    options = debug_options(tmp_path, {})
    assert options['xla_gpu_autotune_level'] == '1'
    assert options['xla_gpu_deterministic_ops'] == 'true'


def test_keys_reach_xla(tmp_path):
    options = debug_options(tmp_path, dict(autotune=3, deterministic=False))
    assert options['xla_gpu_autotune_level'] == '3'
    # XLA's default, which the key leaves alone.
    assert options.get('xla_gpu_deterministic_ops', 'false') == 'false'


def test_debug_compiles_with_the_older_cpu_emitters(tmp_path):
    """`jax.debug` (optimizations off) also turns off the CPU backend's
    fusion emitters, which double an unoptimized compile; without it XLA
    keeps its own default, and a user's setting wins."""
    assert debug_options(tmp_path / 'debug', dict(debug=True))[
        'xla_cpu_use_fusion_emitters'] == 'false'
    assert debug_options(tmp_path / 'default', {}).get(
        'xla_cpu_use_fusion_emitters', 'true') == 'true'
    assert debug_options(
        tmp_path / 'user', dict(debug=True),
        '--xla_cpu_use_fusion_emitters=true').get(
            'xla_cpu_use_fusion_emitters', 'true') == 'true'


def test_users_own_xla_flags_win(tmp_path):
    options = debug_options(
        tmp_path, dict(autotune=0, deterministic=True),
        '--xla_gpu_autotune_level=2 --xla_gpu_deterministic_ops=false')
    assert options['xla_gpu_autotune_level'] == '2'
    assert options.get('xla_gpu_deterministic_ops', 'false') == 'false'


def test_flags_are_appended_after_the_users():
    environ = {'XLA_FLAGS': '--xla_dump_to=/x --xla_gpu_autotune_level=4'}
    added = runtime.add_xla_flags(
        {'xla_gpu_autotune_level': '1', 'xla_gpu_deterministic_ops': 'true'},
        environ)
    assert added == ['xla_gpu_deterministic_ops']
    assert environ['XLA_FLAGS'] == (
        '--xla_dump_to=/x --xla_gpu_autotune_level=4 '
        '--xla_gpu_deterministic_ops=true')
    assert environ['TF_CUDNN_DETERMINISTIC'] == '1'


@pytest.mark.parametrize('settings, words', [
    (dict(autotune=5), 'jax.autotune'),
    (dict(autotune='high'), 'jax.autotune'),
    (dict(deterministic='yes'), 'jax.deterministic'),
])
def test_bad_values_are_named(settings, words):
    import elements
    jaxcfg = elements.Config(**settings)
    with pytest.raises(ValueError, match=words):
        runtime.xla_flags(jaxcfg)
