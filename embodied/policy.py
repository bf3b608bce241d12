"""A trained agent acting in a script of yours (docs/your-policy.md).

    policy = embodied.load_policy('~/logdir/run1')
    act = policy({'vector': ..., 'reward': ..., 'is_first': ...,
                  'is_last': ..., 'is_terminal': ...})  # one row per env
    act['action']  # one row per env, as the run's env would receive it

`load_policy` reads the run's `config.yaml` and the newest agent save (or
the one file of `python -m embodied.export`, which holds both), and
builds the agent as `--script eval_only` does (`factories.make_agent`), by
default on the CPU whatever devices the run trained on. The actions it gives
are those the run's env would have received: after the action wrappers the
run puts between the agent and the env (`factories.wrap_env`: the clip to
[-1, 1], the map to the env's bounds, its dtypes), which it applies without
stepping (`embodied.wrappers.received`). A save written as a pickle
(earlier versions) is read only with `trust_pickle=True`. The `Policy`
keeps the agent's recurrent state (the carry) of each env between calls;
the agent starts a fresh one for each row whose `is_first` is set, as in
the run. Importing this module does not import JAX; `load_policy` does.
"""

import elements
import numpy as np

from embodied import export
from embodied import factories
from embodied.core import checkpoint as cplib
from embodied.core import wrappers
from embodied.run import saving

MODES = ('eval', 'explore', 'train')
TRUST_ARG = 'trust_pickle=True'  # How load_policy trusts a pickle save.
# The jax settings of an agent that acts on one device of `platform`.
ONE_DEVICE = {
    'jax.policy_devices': [0], 'jax.train_devices': [0],
    'jax.policy_mesh': '-1,1,1', 'jax.train_mesh': '-1,1,1',
    'jax.mock_devices': 0, 'jax.expect_devices': 0, 'jax.prealloc': False,
    'jax.enable_policy': True}


def load_policy(
        path, mode='eval', platform='cpu', batch_size=1, seed=None,
        make_env=None, config=None, trust_pickle=False):
    """The policy of the agent saved at `path`: a run's logdir, its
    `ckpt/agent` folder or one save folder under it, or a file that
    `python -m embodied.export` wrote.

    mode: 'eval' (as `--script eval_only`) or 'explore' ('train' is the
      mode the run collects data in).
    platform: the JAX platform to act on, 'cpu' by default whatever the
      run trained on ('cuda', 'auto'), on its device 0; None keeps the
      run's own `jax` settings (devices, meshes).
    batch_size: the number of envs to compile the policy for ahead; a call
      with more rows compiles once more, one with fewer is padded.
    seed: None continues the random streams of the save (as eval_only
      does); an int restarts them from that seed.
    make_env: `make_env(config, index)`, an env factory of your own for
      the agent's spaces (as for `factories.make_agent`); None builds env 0
      of the run's `--task` (an exported file holds the spaces itself).
    config: the run's config (an `elements.Config`, or the path of a
      `config.yaml`) where `path` has no `config.yaml` above it.
    trust_pickle: read an agent save written as a pickle (by an earlier
      version of embodied, or DreamerV3): only for a save you trust, as a
      pickle can run any code. Without it such a save raises
      `checkpoint.PickleSave`.
    """
    if mode not in MODES:
        raise ValueError(
            f"load_policy: mode must be one of {', '.join(MODES)}, not "
            f"'{mode}'.")
    if export.is_export(path):
        exported = export.read(path)
        config = acting_config(
            run_config(path, exported.config), platform, batch_size)
        agent = factories.make_agent(
            config, make_env=make_env or exported.make_env)
        exported.load_into(agent)
        # The run's action wrappers over the env's own action space.
        own = _Spaces(obs_space=exported.obs_space, act_space={
            **exported.env_act_space, 'reset': elements.Space(bool)})
        actions = EnvActions(factories.wrap_env(own, config))
    else:
        agent, config, actions = build_agent(
            path, platform, batch_size, make_env, config, trust_pickle)
    if seed is not None:
        restart_seeds(agent, seed)
    policy = Policy(agent, mode, config, actions)
    policy.env_act_space = dict(policy.act_space)
    return policy


def build_agent(path, platform='cpu', batch_size=1, make_env=None,
                config=None, trust_pickle=False, trust_key=TRUST_ARG):
    """`(agent, config, actions)`: the agent saved at `path` (a logdir or a
    save folder), built as `load_policy` builds it, its acting config and
    the env's action wrappers (`EnvActions`, from env 0). A
    save written as a pickle raises `checkpoint.PickleSave` naming
    `trust_key` unless `trust_pickle`, before anything is built."""
    try:
        folder = saving.agent_save_folder(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(str(e).replace(
            'run.from_checkpoint:', 'load_policy:', 1)) from None
    found = cplib.pickle_files(folder, ['agent'])
    if found and not trust_pickle:
        raise cplib.PickleSave(found[0], trust_key)
    config = acting_config(run_config(path, config), platform, batch_size)
    env = (make_env or factories.make_env)(config, 0)
    try:  # Built once: the agent's spaces and the env's action wrappers.
        spaces, actions = _Spaces(env), EnvActions(env)
    finally:
        env.close()
    agent = factories.make_agent(config, make_env=lambda *_: spaces)
    saving.load_agent(agent, folder, trust=trust_pickle, key=trust_key)
    return agent, config, actions


class EnvActions:
    """The agent's actions as an env receives them: `self(act)` passes a
    batch of them (one row per env) through the action wrappers of `env`
    (`embodied.wrappers.received`, which does not step it: a closed env
    will do), and `space` is the act space of the env under them, without
    `reset`."""

    def __init__(self, env):
        self.env = env
        self.space = {
            k: v for k, v in wrappers.action_path(env)[1].act_space.items()
            if k != 'reset'}

    def __call__(self, act):
        return wrappers.received(self.env, act)


class _Spaces:
    """The spaces of an env, for `make_agent` to build for and for the
    action wrappers to map to (`EnvActions`); it steps nothing."""

    def __init__(self, env=None, obs_space=None, act_space=None):
        self.obs_space = dict(obs_space if env is None else env.obs_space)
        self.act_space = dict(act_space if env is None else env.act_space)

    def close(self):
        pass


def run_config(path, config=None):
    """The config of the run that saved `path`: `config` when given (a
    config or a file), else the `config.yaml` of the logdir that holds
    `path`, with the keys of this version's defaults it lacks."""
    if config is None:
        config = _find_config(elements.Path(path))
    if not isinstance(config, elements.Config):
        config = elements.Config.load(str(config))
    from embodied import config as configlib
    merged = dict(configlib.build([]).flat)
    merged.update(configlib.renamed_keys(config.flat))
    return elements.Config(merged)


def _find_config(path):
    """The `config.yaml` in `path` or in one of its 3 parents (a logdir
    holds ckpt/agent/<save>)."""
    folder = path
    for _ in range(4):
        if (folder / 'config.yaml').exists():
            return folder / 'config.yaml'
        if folder.parent == folder:
            break
        folder = folder.parent
    raise FileNotFoundError(
        f'load_policy: no config.yaml in {path} or the folders above it; '
        f'pass the run\'s config (config=...).')


def acting_config(config, platform, batch_size):
    """`config` for an agent that only acts: built as `--script eval_only`
    builds it (nothing of train compiled), on one process, and with a
    `platform` on its device 0 (None keeps the run's `jax` settings)."""
    updates = {
        'script': 'eval_only', 'replicas': 1, 'replica': 0,
        'random_agent': False, 'jax.coordinator_address': '',
        'run.envs': int(batch_size)}
    if platform is not None:
        updates.update(ONE_DEVICE, **{'jax.platform': platform})
    return config.update(updates)


def restart_seeds(agent, seed):
    """Restarts the agent's random streams from `seed`."""
    from embodied.jax import agent as agentlib
    data = {f'rng/{name}': np.int64(0) for name in agentlib.SEED_STREAMS}
    data['rng/seed'] = np.int64(seed)
    agent.load(data, regex='^rng/')


class Policy:
    """A trained agent acting for a batch of envs, one row per env.

    `policy(obs)` takes the observations of every env (a dict of arrays with
    one row per env: the agent's keys, `policy.obs_space`, plus `reward`,
    `is_first`, `is_last`, `is_terminal`) and returns the actions as the
    run's env would have received them (a dict of numpy arrays with one
    row per env, in the env's own space `policy.act_space`: continuous
    ones clipped and in its bounds; `policy.agent_act_space` is the agent's
    own, before the run's action wrappers). It keeps each env's recurrent
    state (`policy.carry`) between calls; a row with `is_first` starts a
    fresh one. A call whose row count differs from the last one's starts
    a new batch, and then every row must be `is_first`. Not thread-safe:
    one thread calls it. `actions` (`EnvActions`) maps the agent's
    actions to the env's; None gives them as the agent does.
    """

    def __init__(self, agent, mode, config, actions=None):
        self.agent = agent
        self.mode = mode
        self.config = config
        self.obs_space = dict(agent.obs_space)
        self.agent_act_space = dict(agent.act_space)
        self._actions = actions
        self.act_space = dict(actions.space if actions else agent.act_space)
        self.carry = None
        self._rows = 0

    def __call__(self, obs):
        obs = self._checked(obs)
        first = obs['is_first']
        if self.carry is None or len(first) != self._rows:
            if not first.all():
                raise ValueError(
                    f'policy: a new batch of {len(first)} envs (the last '
                    f'call had {self._rows}) must start episodes: is_first '
                    f'must be True in every row.')
            self.carry, self._rows = self.agent.init_policy(len(first)), len(
                first)
        self.carry, act, _ = self.agent.policy(
            self.carry, obs, mode=self.mode)
        return self.env_action(act)

    def env_action(self, act):
        """The agent's actions `act` (one row per env) as the run's env
        receives them: through the run's action wrappers (`EnvActions`;
        without them, as they are)."""
        return self._actions(act) if self._actions else act

    def reset(self):
        """Forgets every env's state: the next call starts a new batch."""
        self.carry, self._rows = None, 0

    def _checked(self, obs):
        """The observations as arrays, checked against the agent's
        spaces; a missing key or a wrong shape is named."""
        missing = sorted(k for k in self.obs_space if k not in obs)
        if missing:
            raise KeyError(
                f'policy: observations lack {", ".join(missing)} (got '
                f'{", ".join(sorted(obs))}); the agent takes '
                f'{_spaces_text(self.obs_space)}.')
        result = {}
        rows = None
        for key, space in self.obs_space.items():
            value = np.asarray(obs[key], space.dtype)
            if value.ndim < 1 or value.shape[1:] != space.shape or (
                    rows is not None and len(value) != rows):
                raise ValueError(
                    f"policy: observation '{key}' has shape {value.shape}; "
                    f'expected (envs, *{space.shape}) with one row per env'
                    f'{"" if rows is None else f" ({rows} envs)"}.')
            rows = len(value)
            result[key] = value
        return result


def _spaces_text(spaces):
    return ', '.join(
        f'{k} ({np.dtype(v.dtype).name}{list(v.shape)})'
        for k, v in spaces.items())
