"""The compiled program size tool (`devtools.compile_size`)."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from devtools import compile_size


def cuda_text(fn, *args):
    return jax.jit(fn).trace(*args).lower(
        lowering_platforms=('cuda',)).as_text()


def test_counts_loops_unrolled_and_scanned():
    def fn(x, w, k):
        def step(c, _):
            return jnp.tanh(c @ w), None
        x = jax.lax.scan(step, x, None, length=5)[0]
        for _ in range(3):  # Unrolled: the same matmul three times.
            x = jnp.tanh(x @ w)
        image = jax.lax.conv_general_dilated(
            x.reshape((1, 4, 4, 4)), k, (1, 1), 'SAME',
            dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        return x, image

    args = (
        jnp.ones((4, 16), jnp.bfloat16), jnp.ones((16, 16), jnp.bfloat16),
        jnp.ones((3, 3, 4, 8), jnp.bfloat16))
    stats = compile_size.program_stats(cuda_text(fn, *args))
    assert stats['dot_general'] == 4  # One in the loop body, three unrolled.
    assert stats['dot_signatures'] == 1 and stats['dot_max_repeat'] == 4
    assert stats['convolution'] == 1 and stats['conv_signatures'] == 1
    assert stats['while'] == 1 and stats['trips'] == '5'
    dot = 2 * 4 * 16 * 16
    conv = 2 * (4 * 4 * 8) * (3 * 3 * 4)
    assert stats['matmul_gflops'] * 1e9 == (5 + 3) * dot + conv
    assert stats['ops'] > stats['dot_general'] + stats['convolution']


def test_dtypes_and_layouts_make_distinct_signatures():
    def fn(a, b):
        # The same product in bfloat16, in float32, and contracting the
        # first axis of a transposed input.
        return (a @ b, a.astype(jnp.float32) @ b.astype(jnp.float32),
                jnp.einsum('ji,jk->ik', a.T, b))

    a, b = np.ones((4, 8), np.float32), np.ones((8, 4), np.float32)
    stats = compile_size.program_stats(cuda_text(
        fn, jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16)))
    assert stats['dot_general'] == 3 and stats['dot_signatures'] == 3


def test_called_functions_count_once_per_call():
    inner = jax.jit(lambda x, w: x @ w)

    def fn(x, w):
        return inner(inner(x, w), w)

    x = jnp.ones((4, 4))
    text = cuda_text(fn, x, x)
    stats = compile_size.program_stats(text)
    assert stats['dot_general'] == 2 and stats['dot_signatures'] == 1


@pytest.mark.slow
def test_the_command_prints_a_table_per_program(tmp_path):
    out, details = tmp_path / 'table.md', tmp_path / 'details.json'
    result = subprocess.run(
        [sys.executable, '-m', 'devtools.compile_size', '--configs',
         'debug', '--setups', 'ours', '--markdown', str(out), '--details',
         str(details)],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = out.read_text().splitlines()
    titles = [x for x in lines if x.endswith(':')]
    assert [x.split()[0] for x in titles] == ['train', 'report']
    assert all('cuda lowering, compute dtype bfloat16' in x for x in titles)
    header = next(x for x in lines if x.startswith('| setup |'))
    names = [c.strip() for c in header.strip('|').split('|')]
    assert names == ['setup'] + [t for _, t, _ in compile_size.COLUMNS]
    rows = [x for x in lines if x.startswith('| ours |')]
    assert len(rows) == 2
    for row in rows:
        cells = dict(zip(names, (c.strip() for c in row.strip('|').split('|'))))
        number = lambda key: float(cells[key].replace(',', ''))
        for key in ('dot_general', 'distinct dots', 'while', 'all ops'):
            assert number(key) > 0, (key, row)
        assert number('distinct dots') <= number('dot_general')
    # The flops of the debug size round to 0.00 GFLOP in the table.
    for program in json.loads(details.read_text())['ours'].values():
        assert program['matmul_gflops'] > 0 and program['xla_gflops'] > 0
        assert program['xla_gbytes'] > 0
