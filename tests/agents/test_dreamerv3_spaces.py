"""DreamerV3's space rules (embodied/agents/dreamerv3/spaces.py) against
its networks: what the rules pass, the encoder and decoder trace and
reconstruct at the image's size; where a rule says a size needs sides that
the stages divide, the networks without that rule fail to trace; what the
refusal names as a value that works passes. The runs' refusals are in
tests/envs/test_agent_spaces.py."""

import re

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np
import pytest

from embodied import config as configlib
from embodied import factories
from embodied.agents.dreamerv3 import agent as agentlib
from embodied.agents.dreamerv3 import rssm
from embodied.agents.dreamerv3 import spaces

MULTS = [2, 3, 4, 4]
STEP = {k: elements.Space(bool) for k in ('is_first', 'is_last',
                                          'is_terminal')}
STEP['reward'] = elements.Space(np.float32)


def agent_config(*flags):
    config = configlib.build(['debug'])
    config = elements.Flags(config).parse(list(flags))
    return factories.agent_config(config)


def reconstructed(size, enc_mults, dec_mults):
    """The shape the decoder reconstructs a (1, *size, 3) image in, tracing
    the encoder and decoder without running them (nor the encoder's own
    image rule)."""
    space = {'image': elements.Space(np.uint8, (*size, 3))}

    def both(image):
        enc = rssm.Encoder(space, depth=2, units=8, layers=1,
                           mults=enc_mults, name='enc')
        dec = rssm.Decoder(space, depth=2, units=8, layers=1,
                           mults=dec_mults, bspace=0, name='dec')
        enc({'image': image})
        feat = {'deter': jnp.zeros((1, 8)), 'stoch': jnp.zeros((1, 4, 4))}
        return dec(feat)['image'].pred()

    _, pred = jax.eval_shape(
        lambda x, s: nj.pure(both)({}, x, seed=s, create=True),
        jax.ShapeDtypeStruct((1, *size, 3), jnp.uint8),
        jax.ShapeDtypeStruct((2,), jnp.uint32))
    return pred.shape[1:3]


def image_problem(size, stages, **flags):
    obs = {**STEP, 'image': elements.Space(np.uint8, (*size, 3))}
    mults = ','.join(map(str, MULTS[:stages]))
    config = agent_config(
        '--agent.enc.simple.mults', mults, '--agent.dec.simple.mults', mults,
        *[x for k, v in flags.items() for x in (f'--agent.{k}', v)])
    try:
        spaces.check(obs, {'action': elements.Space(np.int32, (), 0, 2)},
                     config)
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize('side', [6, 8, 12, 16, 20, 24, 48])
def test_the_image_rules_are_the_networks(monkeypatch, side):
    monkeypatch.setattr(rssm.Encoder, '_check_images', lambda self: None)
    for stages in range(1, len(MULTS) + 1):
        # As traced: without the decoder's block-diagonal space (its rule
        # is of the settings alone).
        problem = image_problem(
            (side, side), stages, **{'dec.simple.bspace': '0'})
        try:
            shape = reconstructed(
                (side, side), MULTS[:stages], MULTS[:stages])
        except (TypeError, ValueError):
            shape = None
        if problem is None:
            assert shape == (side, side), (side, stages)
        elif 'divides' in problem:
            assert shape != (side, side), (side, stages, problem)
        else:  # The original's rule: the encoder ends in 2 to 16 pixels.
            assert 'must end between 2 and 16 pixels' in problem, problem
            end = side // 2 ** stages
            assert not 2 <= end <= 16, (side, stages)


def test_the_decoder_needs_its_own_stages_to_divide():
    """Encoder stages that fit and decoder stages that do not: the decoder
    reconstructs another size; the rule names the decoder's setting."""
    assert reconstructed((24, 24), MULTS[:3], MULTS) != (24, 24)
    obs = {**STEP, 'image': elements.Space(np.uint8, (24, 24, 3))}
    config = agent_config('--agent.enc.simple.mults', '2,3,4')
    with pytest.raises(ValueError, match='agent.dec.simple.mults'):
        spaces.check(obs, {}, config)


@pytest.mark.parametrize(
    'size', [(16, 16), (24, 24), (16, 64), (512, 512), (7, 7)])
def test_the_values_a_refusal_names_work(size):
    problem = image_problem(size, len(MULTS))
    assert problem, size
    flags = re.search(r'set ((--agent\.\S+ \S+ ?)+) \(', problem)
    if flags:
        obs = {**STEP, 'image': elements.Space(np.uint8, (*size, 3))}
        spaces.check(obs, {}, agent_config(*flags.group(1).split()))
    height, width = map(int, re.search(
        r'e\.g\. (\d+)x(\d+)', problem).groups())
    assert image_problem((height, width), len(MULTS)) is None


@pytest.mark.parametrize('channels', [1, 2, 3, 4])
def test_the_open_loop_video_draws_the_channels_the_rule_lets_in(channels):
    obs = {**STEP, 'image': elements.Space(np.uint8, (16, 16, channels))}
    config = agent_config('--agent.enc.simple.mults', '2,3')
    try:
        spaces.check(obs, {}, config)
        refused = False
    except ValueError as e:
        assert 'agent.report_openloop' in str(e), e
        refused = True
    true = jnp.zeros((2, 4, 8, 8, channels), jnp.uint8)
    try:
        agentlib.openloop_video(true, jnp.zeros(true.shape), 2)
        drawn = True
    except (TypeError, ValueError):
        drawn = False
    assert refused != drawn, channels
    spaces.check(obs, {}, agent_config(
        '--agent.enc.simple.mults', '2,3', '--agent.report_openloop',
        'False'))
