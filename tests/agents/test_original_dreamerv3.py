"""Acceptance: the original DreamerV3 agent (danijar/dreamerv3's own
`dreamerv3/agent.py` and `rssm.py`, unchanged) builds, trains and acts on
this package's `embodied.jax`, and trains under the `train` and `parallel`
scripts (`--agent_impl dreamerv3.agent:Agent`); and the module library has
every name, signature and field default of the original's `embodied.jax`
nets, outs, heads, opt and utils, and its layers, heads, outputs, Optimizer,
SlowModel and Normalize compute the same values as the original's from the
same parameters.

The original's files are not part of this project. Point the environment
variable EMBODIED_ORIGINAL_DREAMERV3 at a checkout of danijar/dreamerv3 (or
at its git directory) to run these tests; they are skipped otherwise. The
original also imports `einops` and `chex` (the `test` extra)."""

import json
import os
import pathlib
import subprocess
import sys

import elements
import numpy as np
import pytest

import helpers
from embodied.perf import checkout as original
from embodied import factories
from embodied import main as mainlib

SOURCE = os.environ.get('EMBODIED_ORIGINAL_DREAMERV3', '')

pytestmark = [
    pytest.mark.skipif(
        not SOURCE, reason='EMBODIED_ORIGINAL_DREAMERV3 is not set'),
    pytest.mark.filterwarnings('ignore::DeprecationWarning'),
]

OBS = {
    'vector': elements.Space(np.float32, (4,)),
    'image': elements.Space(np.uint8, (16, 16, 3)),
    'reward': elements.Space(np.float32),
    'is_first': elements.Space(bool),
    'is_last': elements.Space(bool),
    'is_terminal': elements.Space(bool),
}
ACT = {
    'action': elements.Space(np.int32, (), 0, 3),
    'move': elements.Space(np.float32, (2,), -1, 1),
}


def copy_original(target):
    """Copies the original's dreamerv3 package files into `target`."""
    original.copy_agent(SOURCE, target)


@pytest.fixture(scope='module')
def agent(tmp_path_factory):
    pytest.importorskip('einops')
    pytest.importorskip('chex')
    root = tmp_path_factory.mktemp('original')
    copy_original(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        config = mainlib.parse([
            '--configs', 'debug', '--logdir', str(root / 'logdir'),
            '--agent_impl', 'dreamerv3.agent:Agent',
            # Small image decoder/encoder for 16x16 images.
            '--agent.enc.simple.mults', '2,2',
            '--agent.dec.simple.mults', '2,2',
            '--agent.enc.simple.depth', '4', '--agent.dec.simple.depth', '4',
            '--agent.opt.warmup', '0', '--agent.opt.lr', '1e-3'])
        agent_config = elements.Config(
            **config.agent, logdir=config.logdir, seed=config.seed,
            jax=config.jax, batch_size=config.batch_size,
            batch_length=config.batch_length,
            replay_context=config.replay_context,
            report_length=config.report_length, replica=0, replicas=1)
        ctor = factories._import('dreamerv3.agent:Agent')
        agent = ctor(OBS, ACT, agent_config)
        # The tests trace its modules directly; ninjax's name scope is
        # process-wide and the agent compiles in the background.
        assert agent.wait_compiled(600, report=True)
        yield agent, ctor


def make_batch(B, T, ext_space, seed=0):
    rng = np.random.default_rng(seed)
    vector = rng.normal(size=(B, T, 4)).astype(np.float32)
    # Replay context entries (the stored latents) start from zeros.
    context = {
        k: np.zeros((B, T, *s.shape), s.dtype) for k, s in ext_space.items()}
    return {
        **context,
        'vector': vector,
        'image': rng.integers(0, 255, (B, T, 16, 16, 3)).astype(np.uint8),
        'reward': vector[..., 0].copy(),
        'is_first': np.zeros((B, T), bool).copy(),
        'is_last': np.zeros((B, T), bool),
        'is_terminal': np.zeros((B, T), bool),
        'action': rng.integers(0, 3, (B, T)).astype(np.int32),
        'move': rng.uniform(-1, 1, (B, T, 2)).astype(np.float32),
        'stepid': rng.integers(0, 255, (B, T, 20)).astype(np.uint8),
        'consec': np.zeros((B, T), np.int32),
    }


def test_original_agent_builds_on_this_package(agent):
    agent, ctor = agent
    import embodied.jax
    assert issubclass(ctor, embodied.jax.Agent)
    assert isinstance(agent.model, ctor)
    names = agent.save()
    for prefix in ('enc/', 'dyn/', 'dec/', 'rew/', 'con/', 'pol/', 'val/',
                   'slowval/', 'retnorm/', 'opt/'):
        assert any(k.startswith(prefix) for k in names), prefix


def test_original_agent_trains_and_acts(agent):
    agent, _ = agent
    config = agent.model.config
    B = config.batch_size
    T = config.batch_length + config.replay_context
    data = make_batch(B, T, agent.ext_space)
    carry = agent.init_train(B)
    losses = []
    for step in range(6):
        carry, outs, metrics = agent.train(carry, data)
        losses.append(float(metrics['loss/rew']))
        assert np.isfinite(float(metrics['opt/loss']))
    assert int(metrics['opt/updates']) >= 6
    # The reward head fits the repeated batch.
    assert losses[-1] < losses[0]
    carry, metrics = agent.report(agent.init_report(B), data)
    assert all(np.isfinite(np.asarray(v)).all() for v in metrics.values())

    pcarry = agent.init_policy(3)
    obs = {k: v[:3, 0] for k, v in data.items() if k in OBS}
    obs['is_first'] = np.ones(3, bool)
    pcarry, act, out = agent.policy(pcarry, obs, mode='train')
    assert act['action'].shape == (3,)
    assert ((act['action'] >= 0) & (act['action'] < 3)).all()
    # Samples of the bounded normal are not clipped (the env side clips).
    assert act['move'].shape == (3, 2) and np.isfinite(act['move']).all()


# The original's agent code on a mesh: 8 mock CPU devices, data, FSDP and
# tensor parallel axes of 2 (it has no partition rules, so its parameters
# are replicated and its batches split over d and f).
MESH = ('train', [
    '--jax.mock_devices', '8', '--jax.train_mesh', '2,2,2',
    '--batch_size', '8'])


@pytest.mark.parametrize(
    'script, flags', [*helpers.SCRIPTS, MESH],
    ids=[s for s, _ in helpers.SCRIPTS] + ['train-mesh-2,2,2'])
def test_original_agent_trains_under_script(tmp_path, script, flags):
    pytest.importorskip('einops')
    pytest.importorskip('chex')
    copy_original(tmp_path)
    logdir = tmp_path / 'run'
    root = str(pathlib.Path(__file__).resolve().parents[2])
    command = [
        sys.executable, '-m', 'embodied.main', '--configs', 'debug',
        '--agent_impl', 'dreamerv3.agent:Agent', '--task', 'cartpole_balance',
        '--script', script, '--run.steps', '400', '--logdir', str(logdir),
        *flags]
    env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = os.pathsep.join(
        [root, str(tmp_path), *filter(None, [env.get('PYTHONPATH')])])
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600,
        cwd=root)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    records = [
        json.loads(line)
        for line in (logdir / 'metrics.jsonl').read_text().splitlines()]
    trained = [r for r in records if 'train/loss/value' in r]
    assert trained, output[-4000:]
    assert all(np.isfinite(r['train/loss/dyn']) for r in trained)
    assert max(r['step'] for r in records) >= 400
    assert (logdir / 'ckpt').exists()


def load_original_jax(target):
    """Imports the original's embodied/jax package as `original_jax`."""
    import importlib
    package = target / 'original_jax'
    package.mkdir()
    for name in ('__init__', 'agent', 'heads', 'internal', 'nets', 'opt',
                 'outs', 'transform', 'utils'):
        text = original.read(SOURCE, f'embodied/jax/{name}.py')
        (package / f'{name}.py').write_text(text)
    return {
        name: importlib.import_module(f'original_jax.{name}')
        for name in ('nets', 'outs', 'heads', 'opt', 'utils')}


def signature(obj):
    import inspect
    obj = getattr(obj, '_method', obj)  # ninjax wraps module methods
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None
    # Default lambdas print with their address.
    return __import__('re').sub(r' at 0x[0-9a-f]+', '', text)


def fields(cls):
    """A ninjax module's fields and defaults, as text."""
    defaults = getattr(cls, '_defaults', {})
    return {
        k: __import__('re').sub(r' at 0x[0-9a-f]+', '', repr(v))
        for k, v in defaults.items()}


def test_module_library_has_the_original_names_and_signatures(
        tmp_path, monkeypatch):
    """Every public function, class, method and ninjax field (with its
    default) of the original's nets, outs, heads, opt and utils exists here
    with the same signature."""
    import importlib
    import inspect
    pytest.importorskip('einops')
    monkeypatch.syspath_prepend(str(tmp_path))
    originals = load_original_jax(tmp_path)
    problems = []
    for modname, orig in originals.items():
        ours = importlib.import_module(f'embodied.jax.{modname}')
        for name, obj in vars(orig).items():
            if name.startswith('_') or inspect.ismodule(obj):
                continue
            if callable(obj) and obj.__module__ != orig.__name__:
                continue  # imported from elsewhere
            if name in ('ensure_dtypes_fwd', 'ensure_dtypes_bwd'):
                continue  # the custom VJP's halves, private here
            where = f'{modname}.{name}'
            if not hasattr(ours, name):
                problems.append(f'missing {where}')
                continue
            mine = getattr(ours, name)
            if not inspect.isclass(obj):
                if callable(obj) and signature(obj) != signature(mine):
                    problems.append(f'{where}{signature(mine)}')
                continue
            if fields(obj) != fields(mine):
                problems.append(f'{where} fields {fields(mine)}')
            for meth, fn in vars(obj).items():
                private = meth.startswith('_')
                if private and meth not in ('__init__', '__call__'):
                    continue
                if not callable(fn) and not isinstance(fn, staticmethod):
                    continue
                other = inspect.getattr_static(mine, meth, None)
                if other is None:
                    problems.append(f'missing {where}.{meth}')
                elif signature(fn) != signature(other):
                    problems.append(
                        f'{where}.{meth}{signature(other)} vs '
                        f'{signature(fn)}')
    assert not problems, problems


@pytest.fixture
def both(tmp_path, monkeypatch):
    """The original's modules and ours, both computing in float32."""
    import importlib
    pytest.importorskip('einops')
    monkeypatch.syspath_prepend(str(tmp_path))
    originals = load_original_jax(tmp_path)
    ours = {
        name: importlib.import_module(f'embodied.jax.{name}')
        for name in originals}
    import jax.numpy as jnp
    monkeypatch.setattr(originals['nets'], 'COMPUTE_DTYPE', jnp.float32)
    monkeypatch.setattr(ours['nets'], 'COMPUTE_DTYPE', jnp.float32)
    return originals, ours


def run_both(both, build, fn, *args):
    """Builds a module with each library (`build(lib) -> module`), creates
    the initial state with ours and runs both from it."""
    import ninjax as nj
    originals, ours = both
    module = build(ours)
    run = nj.pure(lambda *a: fn(module, ours, *a))
    # ignore=True keeps every entry at the value it was created with.
    state, _ = run({}, *args, seed=0, create=True, ignore=True)
    _, mine = run(dict(state), *args, seed=0)
    module = build(originals)
    _, theirs = nj.pure(lambda *a: fn(module, originals, *a))(
        dict(state), *args, seed=0)
    return mine, theirs


def assert_trees_close(a, b):
    import jax
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(a)]
    for path, x, y in zip(paths, la, lb):
        np.testing.assert_allclose(
            np.asarray(x, np.float64), np.asarray(y, np.float64),
            rtol=1e-5, atol=1e-6, err_msg=path)


def test_layers_compute_what_the_originals_compute(both):
    rng = np.random.default_rng(0)
    f = lambda *s: rng.normal(size=s).astype(np.float32)
    cases = [
        (lambda L: L['nets'].Linear((2, 3), name='m'), f(4, 5)),
        (lambda L: L['nets'].BlockLinear(8, 4, name='m'), f(3, 8)),
        (lambda L: L['nets'].Conv2D(4, 3, 2, name='m'), f(2, 8, 8, 3)),
        (lambda L: L['nets'].Conv2D(4, 3, 2, transp=True, name='m'),
         f(2, 4, 4, 3)),
        (lambda L: L['nets'].Conv3D(3, 3, name='m'), f(1, 4, 6, 6, 2)),
        (lambda L: L['nets'].Conv3D(3, 3, 2, transp=True, name='m'),
         f(1, 2, 3, 3, 2)),
        (lambda L: L['nets'].Norm('rms', name='m'), f(3, 6)),
        (lambda L: L['nets'].Norm('layer1em6', name='m'), f(3, 6)),
        (lambda L: L['nets'].MLP(2, 8, name='m'), f(2, 3, 5)),
    ]
    for build, x in cases:
        mine, theirs = run_both(both, build, lambda m, L, x: m(x), x)
        assert_trees_close(mine, theirs)
    idx = np.array([[1, 4], [0, 3]])
    mine, theirs = run_both(
        both, lambda L: L['nets'].Embed(5, 3, (2,), name='m'),
        lambda m, L, i: m(i), idx)
    assert_trees_close(mine, theirs)
    resets = np.zeros((2, 5), bool)
    resets[:, 2] = True
    mine, theirs = run_both(
        both, lambda L: L['nets'].GRU(units=4, name='m'),
        lambda m, L, x, r: m(m.initial(2), x, r), f(2, 5, 3), resets)
    assert_trees_close(mine, theirs)
    mask = np.tril(np.ones((4, 4), bool))[None].repeat(2, 0)
    mine, theirs = run_both(
        both, lambda L: L['nets'].Transformer(
            units=8, layers=2, heads=2, glu=True, name='m'),
        lambda m, L, x, k: m(x, k, training=False), f(2, 4, 8), mask)
    assert_trees_close(mine, theirs)
    spaces = {
        'b': elements.Space(np.int32, (2,), 0, 4),
        'a': elements.Space(np.float32, (3,)),
    }
    xs = {'b': np.array([[1, -1], [3, 0]], np.int32), 'a': f(2, 3)}
    mine, theirs = run_both(
        both, lambda L: L['nets'].DictEmbed(spaces, 6, name='m'),
        lambda m, L, xs: (m(xs, (2,)), L['nets'].DictConcat(
            spaces, 1, squish=L['nets'].symlog)(xs)), xs)
    assert_trees_close(mine, theirs)


def test_heads_and_outputs_compute_what_the_originals_compute(both):
    import jax
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 2, 6)).astype(np.float32)
    key = jax.random.PRNGKey(3)
    cases = [
        (elements.Space(np.float32, ()), 'symexp_twohot',
         rng.normal(size=(3,)).astype(np.float32) * 50),
        (elements.Space(np.float32, (2,)), 'mse', x[:, 0, :2]),
        (elements.Space(np.float32, (2,)), 'huber', x[:, 0, :2]),
        (elements.Space(np.float32, (2,)), 'symlog_mse', x[:, 0, :2] * 9),
        (elements.Space(bool, (), 0, 2), 'binary',
         np.array([1.0, 0.0, 1.0], np.float32)),
        (elements.Space(np.int32, (2,), 0, 4), 'categorical',
         np.array([[1, 3], [0, 0], [2, 1]], np.int32)),
        (elements.Space(np.int32, (2,), 0, 4), 'onehot',
         np.eye(4, dtype=np.float32)[[[1, 3], [0, 0], [2, 1]]]),
        (elements.Space(np.float32, (2,), -1, 1), 'bounded_normal',
         np.tanh(x[:, 0, :2])),
        (elements.Space(np.float32, (2,)), 'normal_logstd', x[:, 0, :2]),
    ]
    for space, output, target in cases:
        def fn(m, L, x, target):
            out = m(x, 1)
            values = {'pred': out.pred(), 'loss': out.loss(target)}
            if output not in ('mse', 'huber', 'symlog_mse', 'symexp_twohot'):
                values['logp'] = out.logp(target)
            if output not in ('binary', 'mse', 'huber', 'symlog_mse',
                              'symexp_twohot'):
                values['sample'] = out.sample(key)
                values['entropy'] = out.entropy()
            return values
        mine, theirs = run_both(
            both, lambda L: L['heads'].MLPHead(
                space, output, layers=2, units=8, outscale=0.5,
                minstd=0.1, unimix=0.01, bins=31, name='m'),
            fn, x, target)
        assert_trees_close(mine, theirs)
    # KL between two outputs of the same kind.
    originals, ours = both
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    kls = [
        L['outs'].Agg(L['outs'].OneHot(logits, 0.01), 1).kl(
            L['outs'].Agg(L['outs'].OneHot(logits[::-1], 0.01), 1))
        for L in (ours, originals)]
    assert_trees_close(kls[0], kls[1])
    normals = [
        L['outs'].Normal(logits, 2.0).kl(L['outs'].Normal(-logits, 0.5))
        for L in (ours, originals)]
    assert_trees_close(normals[0], normals[1])


def test_optimizer_and_stats_compute_what_the_originals_compute(both):
    import jax.numpy as jnp
    import optax
    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)

    def build(L):
        model = L['nets'].Linear(1, name='model')
        chain = optax.chain(
            L['opt'].clip_by_agc(0.3), L['opt'].scale_by_rms(0.999, 1e-20),
            L['opt'].scale_by_momentum(0.9, nesterov=True),
            optax.scale_by_learning_rate(0.01))
        opt = L['opt'].Optimizer(model, chain, name='opt')
        slow = L['utils'].SlowModel(
            L['nets'].Linear(1, name='slow'), source=model, rate=0.1,
            every=2)
        norms = [
            L['utils'].Normalize('perc', name='perc'),
            L['utils'].Normalize('meanstd', debias=False, name='ms')]
        return model, opt, slow, norms

    def fn(modules, L, x, y):
        model, opt, slow, norms = modules
        results = []
        for step in range(3):
            loss = lambda x, y: jnp.square(model(x) - y).mean()
            metrics = opt(loss, x, y)
            slow.update()
            stats = [n(model(x) * (step + 1), True) for n in norms]
            results.append((metrics, slow(x), stats))
        return results

    mine, theirs = run_both(both, build, fn, x, y)
    assert_trees_close(mine, theirs)


def test_layer_scan_computes_what_the_originals_computes(both):
    import jax.numpy as jnp
    import ninjax as nj

    def build(L):
        class Block(nj.Module):
            def __call__(self, x, scale):
                return jnp.tanh(self.sub('lin', L['nets'].Linear, 4)(x)) * scale
        return L['utils'].LayerScan(Block(name='blk'), 3)

    x = np.random.default_rng(3).normal(size=(2, 4)).astype(np.float32)
    scales = np.array([1.0, 0.5, 2.0], np.float32)
    mine, theirs = run_both(both, build, lambda m, L, x, s: m(x, s), x, scales)
    assert_trees_close(mine, theirs)
