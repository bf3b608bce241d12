"""The steps of tests/test_export.py that run in processes of their own.

    python policy_file.py save LOGDIR TASK AGENT   # a logdir with one save
    python policy_file.py act PATH SEED            # actions as JSON lines
                                                   # (SEED none: the save's)

`save` builds the agent (`--agent_impl AGENT`, the `debug` block) for the
env of `--task TASK` (a module of the test's own, importable only where
the test puts it on PYTHONPATH) and writes the run's config.yaml and one
agent save, as a run leaves them. `act` loads the policy of PATH (a logdir
or an exported file) with `seed`, acts on the same observations for 2 envs
over 4 steps, and prints each step's actions as one JSON line, after a line
saying whether the env's module was importable.
"""

import importlib.util
import json
import sys

import numpy as np


def save(logdir, task, agent_impl):
    import elements
    from embodied import config as configlib
    from embodied import factories
    from embodied.core import checkpoint as cplib
    from embodied.run import saving
    config = configlib.build(['debug']).update(
        task=task, agent_impl=agent_impl, logdir=logdir,
        **{'testing.check_order': False, 'jax.precompile': False})
    elements.Path(logdir).mkdir()
    config.save(elements.Path(logdir) / 'config.yaml')
    agent = factories.make_agent(config)
    cplib.write(saving.directory(logdir, 'agent') / f'{7:012d}',
                {'agent': agent.save})


def act(path, seed):
    import embodied
    module = importlib.util.find_spec('i61_robot') is not None
    print(json.dumps({'env_module_importable': module}), flush=True)
    seed = None if seed == 'none' else int(seed)
    policy = embodied.load_policy(path, batch_size=2, seed=seed)
    rng = np.random.default_rng(0)
    for step in range(4):
        obs = {k: rng.uniform(-1, 1, (2, *v.shape)).astype(v.dtype)
               if np.issubdtype(v.dtype, np.floating)
               else np.zeros((2, *v.shape), v.dtype)
               for k, v in policy.obs_space.items()}
        obs['is_first'] = np.full(2, step == 0)
        act = policy(obs)
        print(json.dumps({k: np.asarray(v).tolist() for k, v in
                          sorted(act.items())}), flush=True)
    spaces = getattr(policy, 'env_act_space', None) or {}
    print(json.dumps({'env_act_space': {
        k: [float(np.min(v.low)), float(np.max(v.high))]
        for k, v in spaces.items()}}), flush=True)


if __name__ == '__main__':
    {'save': save, 'act': act}[sys.argv[1]](*sys.argv[2:])
