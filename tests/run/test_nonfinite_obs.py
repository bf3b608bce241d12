"""NaN or infinite observations from envs that skip the space checks are
refused, naming the env and the key."""

import functools

import numpy as np
import portal
import pytest

import embodied
from embodied import rpc
from embodied.core import checks
from embodied.envs import dummy
from embodied.run.parallel import actor


def test_nonfinite_names_env_and_key_and_skips_env_metrics():
    batch = {'vector': np.zeros((3, 2), np.float32),
             'image': np.zeros((3, 2, 2), np.uint8),
             'log/metric': np.full(3, np.nan)}
    assert checks.nonfinite(batch, [4, 5, 6]) is None
    batch['vector'][1, 1] = np.inf
    assert checks.nonfinite(batch, [4, 5, 6]) == (
        "Env 5: obs 'vector' is not finite (inf at index (1,)).")


def test_actor_refuses_nan_from_an_original_env_process():
    """The original's env processes send unchecked observations, one env
    per request; the actor answers a NaN with an error naming env and key
    and serves the next request."""
    server = rpc.Server('localhost:0', 'Actor', flush_after=0.01)
    server.bind('act', lambda data: {'action': data['envid'] * 0}, batch=1,
                check=actor._finite_obs)
    with server:
        client = portal.Client(f'localhost:{server.port}', 'OriginalEnv')
        try:
            good = {'envid': 3, 'vector': np.zeros(2, np.float32)}
            assert client.act(good).result(timeout=10)['action'] == 0
            bad = {'envid': 3, 'vector': np.array([0, np.nan], np.float32)}
            with pytest.raises(Exception, match=(
                    r"Actor.act: Env 3: obs 'vector' is not finite")):
                client.act(bad).result(timeout=10)
            assert client.act(good).result(timeout=10)['action'] == 0
        finally:
            client.close()


def test_driver_refuses_nan_from_an_unwrapped_env():
    make = functools.partial(
        dummy.Dummy, 'disc', size=(8, 8), fail_after=3, fail_mode='nan')
    driver = embodied.Driver([make, make], parallel=False)
    agent = embodied.RandomAgent(
        {k: v for k, v in make().obs_space.items()},
        {k: v for k, v in make().act_space.items() if k != 'reset'})
    driver.reset(agent.init_policy)
    try:
        with pytest.raises(ValueError, match=(
                r"Driver: Env 0: obs 'vector' is not finite")):
            driver(agent.policy, steps=20)
    finally:
        driver.close()
