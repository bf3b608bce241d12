"""Parity: our DreamerV3 (`embodied.agents.dreamerv3`) computes what the
original's `dreamerv3/agent.py` and `rssm.py` compute.

Both agents are built on this package's `embodied.jax` from the same config
and seed; our initial state is copied into the original's by name (RENAMES
below), so both start from the same parameters, optimizer and normaliser
state and random-number counters. Both then train on the same fixed batch
(replay context, episode starts, terminations, both action kinds) and must
report the same losses and metrics after the first update and after the
tenth, hold the same state after ten updates, report the same metrics, and
act the same from the same carry in `eval` mode. Randomness matches because
both agents draw their samples with `nj.seed()` in the same order from the
base's per-call seeds. Everything runs in float32 on the CPU.

Run with a checkout of danijar/dreamerv3 in EMBODIED_ORIGINAL_DREAMERV3 (see
`test_original_dreamerv3.py`, whose loader this reuses); skipped otherwise.
"""

import re

import elements
import numpy as np
import pytest

from tests.agents import test_original_dreamerv3 as original
from embodied import factories
from embodied import main as mainlib

pytestmark = [
    pytest.mark.skipif(
        not original.SOURCE, reason='EMBODIED_ORIGINAL_DREAMERV3 is not set'),
    pytest.mark.filterwarnings('ignore::DeprecationWarning'),
]

SIGNALS = {
    'reward': elements.Space(np.float32),
    'is_first': elements.Space(bool),
    'is_last': elements.Space(bool),
    'is_terminal': elements.Space(bool),
}
# The `debug` size with vector inputs, the same nets on 64x64 RGB images
# (the CNN halves them four times to 4x4, as at every real size), and the
# debug size with the config's other branches: no replay context (the carry
# and previous action come from the last batch), continuation-free
# discounting, slow targets, imagination from the last steps only, gradient
# switches, mean/std normalisers, warmup, a schedule and weight decay.
CASES = {
    'debug': ({
        'vector': elements.Space(np.float32, (4,)),
        'token': elements.Space(np.int32, (), 0, 5),
    }, []),
    'image': ({'image': elements.Space(np.uint8, (64, 64, 3))}, []),
    'branches': ({'vector': elements.Space(np.float32, (4,))}, [
        '--replay_context', '0', '--agent.contdisc', 'False',
        '--agent.imag_loss.slowtar', 'True', '--agent.imag_last', '4',
        '--agent.reward_grad', 'False', '--agent.repval_grad', 'False',
        '--agent.ac_grads', 'True', '--agent.retnorm.debias', 'True',
        '--agent.valnorm.impl', 'meanstd', '--agent.advnorm.impl', 'meanstd',
        '--agent.slowvalue.every', '2', '--agent.slowvalue.rate', '0.1',
        '--agent.dyn.rssm.absolute', 'True', '--agent.dyn.rssm.free_nats', '0',
        '--agent.enc.simple.symlog', 'False',
        '--agent.opt.schedule', 'linear', '--agent.opt.anneal', '8',
        '--agent.opt.wd', '0.01', '--agent.opt.warmup', '3']),
}
ACT = original.ACT

# A small learning rate keeps the ten updates free of chaos: with adaptive
# clipping and RMS scaling (eps 1e-20) an update's size does not depend on
# its gradient's, so the last-bit rounding differences of two differently
# written graphs (the order XLA sums in) grow by the learning rate's size
# each update; at 1e-3 the policy's parameters of two runs of OUR agent
# drift apart by 1e-3 within ten updates when one starts from parameters
# perturbed by 1e-7. At 1e-5 both agents agree to float32 rounding, while
# every difference in a loss, gradient or state update still shows in the
# metrics, the optimizer's moments and the parameter updates.
LR = '1e-5'

# Our parameter names -> the original's. The layers and their order are the
# same; only the module names differ:
RENAMES = [
    # Our encoder's vector MLP is one `nets.MLP` named 'mlp' (layers
    # 'linear<i>', 'norm<i>'); the original's encoder writes each layer out
    # as 'mlp<i>' and 'mlp<i>norm'.
    (r'(^|/)enc/mlp/linear(\d+)/', r'\1enc/mlp\2/'),
    (r'(^|/)enc/mlp/norm(\d+)/', r'\1enc/mlp\2norm/'),
    # Our encoder calls its conv stages 'conv<i>' as both decoders do; the
    # original's encoder calls them 'cnn<i>'.
    (r'(^|/)enc/conv(\d+)', r'\1enc/cnn\2'),
    # Our decoder's vector outputs are one `MLPHead` named 'vec' (its 'mlp'
    # and 'head'); the original's decoder has an `MLP` 'mlp' and a
    # `DictHead` 'vec' side by side.
    (r'(^|/)dec/vec/mlp/', r'\1dec/mlp/'),
    (r'(^|/)dec/vec/head/', r'\1dec/vec/'),
]

# Metrics only one of the two reports. The original reports the imagination
# metrics without a prefix, ours under 'imag/'.
OURS_ONLY = {'retnorm/scale', 'retnorm/offset'}
THEIRS_ONLY = {'adv_mag', 'tar', 'ret_min', 'ret_max'}


def their_name(key):
    for pattern, repl in RENAMES:
        key = re.sub(pattern, repl, key)
    return key


def their_metric(key):
    return key[len('imag/'):] if key.startswith('imag/') else key


def make_config(logdir, flags=()):
    config = mainlib.parse([
        '--configs', 'debug', '--logdir', str(logdir),
        '--agent.opt.lr', LR, '--agent.opt.warmup', '0', *flags])
    return elements.Config(
        **config.agent, logdir=config.logdir, seed=config.seed,
        jax=config.jax, batch_size=config.batch_size,
        batch_length=config.batch_length, replay_context=config.replay_context,
        report_length=config.report_length, replica=0, replicas=1)


class Pair:
    """Our agent and the original's, from one config and initial state."""

    def __init__(self, obs_space, config):
        from embodied.agents.dreamerv3 import Agent
        self.obs_space, self.config = obs_space, config
        self.ours = Agent(obs_space, ACT, config)
        # Before the original's agent is built: ninjax's name scope is
        # process-wide, and ours compiles train and report in the background.
        assert self.ours.wait_compiled(600, report=True)
        self.theirs = factories._import('dreamerv3.agent:Agent')(
            obs_space, ACT, config)
        self.initial = self.ours.save()
        self.their_initial = self.theirs.save()
        self.reset()

    def reset(self):
        """Both agents back at our initial state (parameters, optimizer,
        normalisers, random-number counters)."""
        self.ours.load(self.initial)
        self.theirs.load(self.translate(self.initial))

    def translate(self, state):
        theirs = self.theirs.save()
        mapped = {their_name(k): v for k, v in state.items()}
        assert set(mapped) == set(theirs), (
            sorted(set(mapped) ^ set(theirs)))
        return mapped

    def batch(self, seed=0):
        """A fixed batch with replay context: stored latents, rows that
        start a sequence (consec 0) and rows that continue one, episode
        starts, terminations and sequence ends inside it."""
        rng = np.random.default_rng(seed)
        B = self.config.batch_size
        T = self.config.batch_length + self.config.replay_context
        rssm = self.config.dyn.rssm
        data = {}
        for key, space in self.obs_space.items():
            if space.dtype == np.uint8:
                data[key] = rng.integers(0, 256, (B, T, *space.shape), np.uint8)
            elif space.discrete:
                data[key] = rng.integers(
                    space.low, space.high, (B, T, *space.shape), space.dtype)
            else:
                data[key] = rng.normal(size=(B, T, *space.shape)).astype(
                    space.dtype)
        terminal = rng.uniform(size=(B, T)) < 0.08
        data.update({
            'reward': rng.normal(size=(B, T)).astype(np.float32),
            'is_first': rng.uniform(size=(B, T)) < 0.08,
            'is_terminal': terminal,
            'is_last': terminal | (rng.uniform(size=(B, T)) < 0.05),
            'action': rng.integers(0, 3, (B, T)).astype(np.int32),
            'move': rng.uniform(-1, 1, (B, T, 2)).astype(np.float32),
            'stepid': rng.integers(0, 256, (B, T, 20)).astype(np.uint8),
            'consec': np.repeat((np.arange(B) % 2)[:, None], T, 1).astype(
                np.int32),
        })
        if not self.config.replay_context:
            return data
        data.update({
            'dyn/deter': rng.normal(size=(B, T, rssm.deter)).astype(
                np.float32),
            'dyn/stoch': np.eye(rssm.classes, dtype=np.float32)[
                rng.integers(0, rssm.classes, (B, T, rssm.stoch))],
        })
        return data


@pytest.fixture(scope='module', params=list(CASES))
def pair(request, tmp_path_factory):
    pytest.importorskip('einops')
    pytest.importorskip('chex')
    root = tmp_path_factory.mktemp('parity')
    original.copy_original(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        obs, flags = CASES[request.param]
        yield Pair({**obs, **SIGNALS}, make_config(root / 'logdir', flags))


def assert_close(ours, theirs, what, rtol=1e-5, atol=1e-6):
    """Our array equals the original's within float32 rounding."""
    ours = np.asarray(ours, np.float64)
    theirs = np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, err_msg=what)


def assert_metrics_match(ours, theirs, when):
    mapped = {their_metric(k): k for k in ours}
    assert len(mapped) == len(ours)  # no two of ours map to one name
    assert {k for k in ours if their_metric(k) not in theirs} == OURS_ONLY
    assert set(theirs) - set(mapped) == THEIRS_ONLY
    losses = {k for k in ours if k.startswith('loss/')}
    assert {'loss/dyn', 'loss/rep', 'loss/rew', 'loss/con', 'loss/policy',
            'loss/value', 'loss/repval'} <= losses
    problems = []
    for key in sorted(mapped):
        if key in theirs:
            try:
                assert_close(
                    ours[mapped[key]], theirs[key], f'{when}: metric {key}')
            except AssertionError:
                problems.append(
                    f'{key}: ours {float(ours[mapped[key]])!r}, '
                    f'theirs {float(theirs[key])!r}')
    assert not problems, f'{when}: ' + '; '.join(problems)


def assert_states_match(pair, when):
    """Every parameter, optimizer moment, normaliser statistic and slow
    value parameter; the updates since the start are compared too, so that
    a difference in a small update is not hidden by the parameter's size."""
    ours, theirs = pair.ours.save(), pair.theirs.save()
    for key, value in ours.items():
        if key.startswith('rng/'):
            assert int(value) == int(theirs[key]), (when, key)
            continue
        other = theirs[their_name(key)]
        if not np.size(value):
            continue
        scale = max(float(np.abs(other).max()), 1e-30)
        assert_close(value, other, f'{when}: {key}', atol=1e-6 * scale)
        start = np.asarray(pair.initial[key], np.float64)
        delta = np.asarray(value, np.float64) - start
        scale = max(float(np.abs(delta).max()), 1e-30)
        assert_close(
            delta, np.asarray(other, np.float64) - start,
            f'{when}: update of {key}', rtol=1e-3, atol=1e-3 * scale)


def their_carry(carry):
    """Our policy/train carry {'dyn', 'prevact'} in the original's layout
    (encoder carry, RSSM carry, decoder carry, previous action)."""
    return ({}, carry['dyn'], {}, carry['prevact'])


@pytest.mark.parametrize('pair', ['image', 'branches'], indirect=True)
def test_both_initialise_the_same_parameters(pair):
    """Built from one seed, the original draws the same initial parameters
    as ours: the same initialisers, fans and scales, and the modules created
    in the same order (each draw takes the next seed). Not in the `debug`
    case: with several vector observations our decoder creates its output
    layers in sorted key order, the original's in the observation space's
    order, so the same draws land on other layers."""
    for key, value in pair.initial.items():
        other = pair.their_initial[their_name(key)]
        np.testing.assert_array_equal(value, other, err_msg=key)


def test_training_matches_the_original(pair):
    pair.reset()
    data = pair.batch()
    B = pair.config.batch_size
    ours_carry = pair.ours.init_train(B)
    theirs_carry = pair.theirs.init_train(B)
    for update in range(1, 11):
        ours_carry, ours_outs, ours_mets = pair.ours.train(ours_carry, data)
        theirs_carry, theirs_outs, theirs_mets = pair.theirs.train(
            theirs_carry, data)
        if update not in (1, 10):
            continue
        when = f'update {update}'
        assert_metrics_match(ours_mets, theirs_mets, when)
        # The latents written back to replay and the carry to the next batch.
        assert set(ours_outs) == set(theirs_outs)
        replay = ours_outs.get('replay', {})
        assert set(replay) == set(theirs_outs.get('replay', {}))
        assert bool(replay) == bool(pair.config.replay_context)
        for key in replay:
            assert_close(
                replay[key], theirs_outs['replay'][key], f'{when}: {key}')
        for ours_x, theirs_x in zip(
                jax_leaves(their_carry(ours_carry)), jax_leaves(theirs_carry)):
            assert_close(ours_x, theirs_x, f'{when}: carry')
    assert int(ours_mets['opt/updates']) == 10
    assert_states_match(pair, 'after 10 updates')


def test_report_carry_matches_the_original(pair):
    # The original's `report` returns only its open-loop videos: it merges
    # its loss metrics into themselves (`mets.update(mets)`), so there are no
    # report metrics to compare; the carry it hands to the next report batch
    # is compared instead (ours reports the loss metrics, which the
    # training test compares).
    pair.reset()
    data = pair.batch(seed=1)
    B = pair.config.batch_size
    ours_carry, ours = pair.ours.report(pair.ours.init_report(B), data)
    theirs_carry, theirs = pair.theirs.report(pair.theirs.init_report(B), data)
    assert 'loss/dyn' in ours
    for ours_x, theirs_x in zip(
            jax_leaves(their_carry(ours_carry)), jax_leaves(theirs_carry)):
        assert_close(ours_x, theirs_x, 'report carry')
    videos = {k for k in theirs if k.startswith('openloop/')}
    images = {k for k, v in pair.obs_space.items() if len(v.shape) == 3}
    assert videos == {f'openloop/{k}' for k in images}
    assert {k for k in ours if k.startswith('openloop/')} == videos
    for key in videos:
        assert_openloop_layout(ours[key], theirs[key], data[key[9:]], pair)


def assert_openloop_layout(ours, theirs, images, pair):
    """Our open-loop video has the original's layout: the same shape, the
    same truth, frames (green, then red) and black end frames; only the
    predictions (drawn with other samples) and so the errors differ, and
    ours's error is (pred - true + 255) / 2 of its own prediction."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.uint8
    K = pair.config.replay_context
    B, H, W = min(6, pair.config.batch_size), *images.shape[2:4]
    T = images.shape[1] - K
    assert ours.shape[:3] == (T + 10, 3 * H + 4, B * (W + 4))
    tiles = ours[:T].reshape((T, 3 * H + 4, B, W + 4, -1))
    true = images[:B, K:].transpose((1, 0, 2, 3, 4))
    np.testing.assert_array_equal(tiles[:, 2:2 + H, :, 2:-2], true.transpose(
        (0, 2, 1, 3, 4)))
    pred = tiles[:, 2 + H:2 + 2 * H, :, 2:-2].astype(np.int32)
    error = tiles[:, 2 + 2 * H:2 + 3 * H, :, 2:-2]
    np.testing.assert_array_equal(
        error, ((pred - true.transpose((0, 2, 1, 3, 4)) + 255) // 2))
    predicted = np.zeros(ours.shape, bool)
    for b in range(B):
        left = b * (W + 4) + 2
        predicted[:T, 2 + H:2 + 3 * H, left:left + W] = True
    np.testing.assert_array_equal(ours[~predicted], theirs[~predicted])
    assert not ours[T:].any()


def test_eval_policy_acts_as_the_original(pair):
    pair.reset()
    data = pair.batch(seed=2)
    B = pair.config.batch_size
    # A carry that holds a real state: our train carry after one update.
    carry, _, _ = pair.ours.train(pair.ours.init_train(B), data)
    pair.reset()
    ours_carry, theirs_carry = carry, their_carry(carry)
    for t in range(3):
        obs = {k: data[k][:, t] for k in pair.obs_space}
        ours_carry, ours_act, _ = pair.ours.policy(ours_carry, obs, 'eval')
        theirs_carry, theirs_act, _ = pair.theirs.policy(
            theirs_carry, obs, 'eval')
        assert set(ours_act) == set(theirs_act) == set(ACT)
        np.testing.assert_array_equal(ours_act['action'], theirs_act['action'])
        assert_close(ours_act['move'], theirs_act['move'], f'step {t}: move')
        for ours_x, theirs_x in zip(
                jax_leaves(their_carry(ours_carry)), jax_leaves(theirs_carry)):
            assert_close(ours_x, theirs_x, f'step {t}: policy carry')


def jax_leaves(tree):
    import jax
    return jax.tree.leaves(tree)


@pytest.mark.parametrize('pair', ['debug'], indirect=True)
def test_cosine_schedule_differs_on_purpose(pair):
    """The one value that differs on purpose (docs/compatibility.md, "Differences
    that can change learning"): with `opt.schedule cosine` the
    original passes `0.1 * lr` as optax's `alpha`, a fraction of the
    learning rate, so its rate decays to lr * 0.1 * lr, about zero; ours
    decays to 0.1 * lr, where its `linear` schedule ends too. Until the
    decay starts both optimizers give the same updates."""
    import jax.numpy as jnp
    from embodied.agents.dreamerv3.agent import make_opt
    lr, warmup, anneal = 4e-5, 2, 12
    kw = dict(lr=lr, schedule='cosine', warmup=warmup, anneal=anneal)
    chains = [make_opt(**kw), pair.theirs.model._make_opt(**kw)]
    params = {'w/kernel': jnp.ones((3,), jnp.float32)}
    grad = {'w/kernel': jnp.array([1.0, -2.0, 0.5], jnp.float32)}
    steps = []
    for chain in chains:
        state, sizes = chain.init(params), []
        for _ in range(anneal + 2):
            update, state = chain.update(grad, state, params)
            sizes.append(float(jnp.abs(update['w/kernel']).max()))
        steps.append(np.array(sizes))
    ours, theirs = steps
    # Warmup and the first step of the decay agree, then the decays part.
    np.testing.assert_allclose(
        ours[:warmup + 1], theirs[:warmup + 1], rtol=1e-6)
    assert abs(ours[warmup + 1] - theirs[warmup + 1]) > 1e-4 * ours[warmup + 1]
    # The momentum-normalised update has size ~1 before the rate scales it.
    assert ours[-1] == pytest.approx(0.1 * lr, rel=0.05)
    assert theirs[-1] == pytest.approx(lr * 0.1 * lr, rel=0.05)
