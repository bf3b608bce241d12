"""Meshes and partition rules: mesh strings, rules to shardings, and our
DreamerV3 trained under the layouts 8,1,1, 2,4,1, 2,2,2 and 1,4,2 on 8 mock
CPU devices computing what one device computes, with real FSDP shards and
checkpoints that load across layouts (`mesh_layouts.py` runs them in a
subprocess, as mock devices need a fresh process)."""

import fcntl
import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from embodied.jax import mesh as meshlib
from embodied.jax import sharding as shardinglib

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYOUTS = ('8,1,1', '2,4,1', '2,2,2', '1,4,2')


# Mesh strings


def test_check_config_counts_the_devices_of_every_replica():
    """With replicas the train mesh spans each host's train devices (a
    fixed-size mesh an equal share of each host's) and the batch of all."""
    jaxcfg = dict(mock_devices=2, train_devices=[0, 1], train_mesh='1,4,1')
    meshlib.check_config(jaxcfg, 2, replicas=2)
    meshlib.check_config({**jaxcfg, 'train_mesh': '-1,1,1'}, 2, replicas=2)
    with pytest.raises(meshlib.LayoutError, match='needs 4 devices'):
        meshlib.check_config(jaxcfg, 2)  # One host has 2.
    with pytest.raises(meshlib.LayoutError, match='do not split evenly'):
        meshlib.check_config({**jaxcfg, 'train_mesh': '1,6,1'}, 2, replicas=2)
    with pytest.raises(meshlib.LayoutError, match='batch_size x replicas 2'):
        meshlib.check_config({**jaxcfg, 'train_mesh': '-1,1,1'}, 1, replicas=2)


@pytest.mark.parametrize('text, count, sizes', [
    ('-1,1,1', 8, (8, 1, 1)), ('2,-1,2', 8, (2, 2, 2)),
    ('1,-1,1', 4, (1, 4, 1)), ('2,2,2', 8, (2, 2, 2))])
def test_mesh_sizes(text, count, sizes):
    assert meshlib.fit(text, count, 'jax.train_mesh') == sizes


@pytest.mark.parametrize('text, count, words', [
    ('3,1,1', 8, ["jax.train_mesh '3,1,1' needs 3 devices", "'8,1,1'"]),
    ('-1,3,1', 8, ['multiple of 3', 'divisors of 8: 1, 2, 4, 8']),
    ('-1,-1,1', 8, ['at most one -1']),
    ('2,2', 4, ["three sizes 'd,f,t'"]),
    ('a,1,1', 4, ["is 'a,1,1'"]),
    ('0,1,1', 4, ['each >= 1'])])
def test_bad_mesh_names_key_value_and_what_fits(text, count, words):
    with pytest.raises(meshlib.LayoutError) as info:
        meshlib.fit(text, count, 'jax.train_mesh')
    for word in words:
        assert word in str(info.value)


def test_fixed_mesh_takes_the_next_devices():
    devices = list(range(8))
    assert meshlib.choose_devices(devices, [0], '2,2,2', 'k') == devices
    assert meshlib.choose_devices(devices, [3], '1,2,1', 'k') == [3, 0]
    assert meshlib.choose_devices(devices, [1, 2], '-1,1,1', 'k') == [1, 2]
    with pytest.raises(meshlib.LayoutError, match='only 8 exist'):
        meshlib.choose_devices(devices, [0], '4,4,1', 'k')


# Rules


def test_fit_spec_drops_axes_that_do_not_divide():
    mesh = types.SimpleNamespace(shape={'d': 2, 'f': 4, 't': 2})
    assert shardinglib.fit_spec(P('f', 't'), (16, 8), mesh) == P('f', 't')
    assert shardinglib.fit_spec(P('f', 't'), (6, 8), mesh) == P(None, 't')
    assert shardinglib.fit_spec(P('f', 't'), (8, 3), mesh) == P('f')
    assert shardinglib.fit_spec(P(('d', 'f')), (4, 3), mesh) == P('d')
    with pytest.raises(ValueError, match='rank 1'):
        shardinglib.fit_spec(P('f', 't'), (8,), mesh, 'x/bias')


def test_unmatched_parameter_is_an_error():
    import jax
    mesh = meshlib.Layout(jax.devices()[:1], '1,1,1', 'jax.train_mesh').mesh
    shapes = {'enc/kernel': np.zeros((2, 2)), 'enc/bias': np.zeros(2)}
    with pytest.raises(ValueError, match="'enc/bias'"):
        shardinglib.param_shardings(shapes, [('kernel$', P())], mesh)


# Our DreamerV3 on meshes


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """The layouts' runs, made once per test session: xdist may hand this
    module's tests to several workers, and the first to get here makes
    them while the others wait for its file (the folder above a worker's
    base temp is the session's)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        root = root.parent
    path = root / 'mesh_layouts' / 'runs.npz'
    with open(root / 'mesh_layouts.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            make_runs(path)
    with np.load(path) as data:
        yield dict(data)


def make_runs(path):
    path.parent.mkdir(exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = os.pathsep.join(
        [str(ROOT), *filter(None, [env.get('PYTHONPATH')])])
    result = subprocess.run(
        [sys.executable, str(ROOT / 'tests/jax/mesh_layouts.py'), str(path),
         *LAYOUTS], capture_output=True, text=True, env=env, timeout=1200,
        cwd=ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert 'Agent: tracing' in result.stdout  # precompile off: lazy traces


def entries(runs, prefix):
    return {k[len(prefix):]: v for k, v in runs.items() if k.startswith(prefix)}


@pytest.mark.slow
@pytest.mark.parametrize('layout', LAYOUTS)
def test_layout_trains_as_one_device(runs, layout):
    """Every metric of each of the 10 updates within float32 rounding
    (rtol 1e-5): a gradient or statistic summed instead of averaged over
    the data axes, or a shard left out, moves losses and grad_norm far more.
    The state after 10 updates within 1e-4 of each entry's largest value."""
    reference = entries(runs, 'ref/metric/')
    ours = entries(runs, f'{layout}/metric/')
    assert set(ours) == set(reference) and len(reference) > 100
    assert {'10/opt/grad_norm', '10/loss/dyn', '10/loss/policy'} <= set(ours)
    problems = []
    for key, value in sorted(reference.items()):
        if not np.allclose(ours[key], value, rtol=1e-5, atol=1e-6):
            problems.append(f'{key}: {float(ours[key])} vs {float(value)}')
    assert not problems, problems[:10]
    assert int(ours['10/opt/updates']) == 10
    reference = entries(runs, 'ref/state/')
    ours = entries(runs, f'{layout}/state/')
    assert set(ours) == set(reference)
    for key, value in reference.items():
        if key.startswith('rng/'):
            assert int(ours[key]) == int(value), key
        elif np.size(value):
            scale = max(float(np.abs(value).max()), 1e-30)
            np.testing.assert_allclose(
                ours[key], value, rtol=1e-5, atol=1e-4 * scale, err_msg=key)
    # The updates were not nothing.
    start = entries(runs, 'ref/metric/1/')
    assert float(start['opt/update_rms']) > 0


@pytest.mark.slow
@pytest.mark.parametrize('layout', LAYOUTS)
def test_sharding_is_real(runs, layout):
    """Each device holds 1/f of a kernel's input rows and 1/t of its output
    columns (val/mlp/linear0/kernel is 16 x 8 at debug), and so do the optimizer's
    moments of it; biases stay whole."""
    d, f, t = map(int, layout.split(','))
    name = 'val/mlp/linear0/kernel'
    for key in (name, f'opt/state/1/1/{name}', f'opt/state/2/1/{name}'):
        shards = runs[f'{layout}/shards/{key}']
        assert shards.shape == (8, 2), key
        assert (shards == [16 // f, 8 // t]).all(), (key, shards)
    assert (runs[f'{layout}/shards/val/mlp/linear0/bias'] == [8]).all()
    # Every entry with 'f' in its spec is split over f on every device.
    total = 0
    for key, spec in entries(runs, f'{layout}/spec/').items():
        if "'f'" in str(spec) and f > 1:
            full = runs[f'{layout}/state/{key}'].shape
            shards = runs[f'{layout}/shards/{key}']
            assert np.prod(shards, 1).max() <= np.prod(full) // f, key
            total += 1
    assert total > 20 or f == 1


@pytest.mark.slow
def test_policy_parameters_move_to_the_policy_mesh(runs):
    """The policy's copy lies on its own mesh, laid out by the same rules:
    device 0 whole by default; for the 2,2,2 run, policy mesh 1,2,1 over
    devices 0 and 1, each holding half of a kernel's input rows."""
    name = 'pol/mlp/linear0/kernel'  # 16 x 8 at debug
    for layout in ('8,1,1', '1,4,2'):
        assert runs[f'{layout}/policy/{name}'].tolist() == [[0, 16, 8]]
    assert runs[f'2,2,2/policy/{name}'].tolist() == [[0, 8, 8], [1, 8, 8]]
    assert not any(
        k.startswith('2,2,2/policy/') and k.split('/policy/')[1].startswith(
            ('dec/', 'rew/', 'con/', 'val/', 'slowval/', 'opt/'))
        for k in runs)


@pytest.mark.slow
def test_checkpoints_load_across_layouts(runs):
    """A save on 1 device loads on 1,4,2, and a save on 2,2,2 loads on 1
    device, through checkpoint files of the usual format."""
    for prefix, source in (
            ('ckpt/1to142/', 'ref/state/'), ('ckpt/222to1/', '2,2,2/state/')):
        loaded, saved = entries(runs, prefix), entries(runs, source)
        assert set(loaded) == set(saved) and saved
        for key, value in saved.items():
            np.testing.assert_array_equal(loaded[key], value, err_msg=key)


@pytest.mark.parametrize('flags, words', [
    (('--jax.train_mesh', '4,4,1'), [
        "jax.train_mesh '4,4,1' needs 16 devices", "'8,1,1'"]),
    (('--jax.train_mesh', '8,1,1', '--batch_size', '6'), [
        'batch_size 6 does not divide', "jax.train_mesh '8,1,1'",
        'multiple of 8']),
])
def test_mesh_that_does_not_fit_is_a_usage_error(tmp_path, flags, words):
    env = dict(os.environ, JAX_PLATFORMS='cpu')
    env['PYTHONPATH'] = os.pathsep.join(
        [str(ROOT), *filter(None, [env.get('PYTHONPATH')])])
    result = subprocess.run(
        [sys.executable, '-m', 'embodied.main', '--configs', 'debug',
         '--jax.mock_devices', '8', '--logdir', str(tmp_path), *flags],
        capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 2, result.stderr[-2000:]
    assert 'Traceback' not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
