"""The env worker's stacking of its envs' observations (`env.stacker`)."""

import numpy as np
import pytest

from embodied.core import wrappers
from embodied.envs import dummy
from embodied.run.parallel import env as env_workers


def _envs(count):
    return [wrappers.CheckSpaces(dummy.Dummy('disc')) for _ in range(count)]


@pytest.mark.parametrize('shared', [True, False])
def test_stacker_stacks_the_obs_of_its_envs_per_key(shared):
    envs = _envs(3)
    if not shared:
        envs[1] = envs[1].env  # No CheckSpaces: each env checks itself.
    stack = env_workers.stacker(envs)
    act = {k: v.sample() for k, v in envs[0].act_space.items()}
    act['reset'] = True
    obs = [env.step(act) for env in envs]
    batch = stack(obs)
    assert batch.keys() == obs[0].keys()
    for key, value in batch.items():
        assert value.shape == (3, *np.shape(obs[0][key]))
        np.testing.assert_array_equal(value[1], obs[1][key])
    # Where every env shares its spaces, the obs are checked once, stacked.
    assert all(env.check_obs != shared for env in envs
               if isinstance(env, wrappers.CheckSpaces))


def test_stacker_names_the_env_of_a_bad_obs():
    envs = _envs(2)
    stack = env_workers.stacker(envs)
    act = {k: v.sample() for k, v in envs[0].act_space.items()}
    act['reset'] = True
    obs = [env.step(act) for env in envs]
    obs[1] = {**obs[1], 'reward': np.float32(np.nan).astype(np.float64)}
    with pytest.raises(wrappers.BatchSpaceError) as info:
        stack(obs)
    assert info.value.index == 1
