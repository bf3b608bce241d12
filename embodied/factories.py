"""The factories the runners receive: env, agent, replay, stream and logger,
each built from the config.

`embodied.main` binds them to the config and hands them to the script it
runs. They live in a module of their own (not in `__main__`) so that
cloudpickle sends them to worker processes by reference, and so that a
user's own training script can call them (`embodied.factories.make_env`).
"""

import elements
import numpy as np

import embodied
from embodied.config import UsageError
from embodied.core import importing
from embodied.envs import adapter
from embodied.envs import checks
from embodied.envs import own
from embodied.run import arguments
from embodied.run import replay_size

SUITES = {
    'dummy': 'embodied.envs.dummy:Dummy',
    'cartpole': 'embodied.envs.cartpole:CartPole',
    'gym': 'embodied.envs.from_gym:FromGym',
    'dm': 'embodied.envs.from_dm:FromDM',
    'dmc': 'embodied.envs.dmc:DMC',
    'atari': 'embodied.envs.atari:Atari',
    'atari100k': 'embodied.envs.atari:Atari',
    'crafter': 'embodied.envs.crafter:Crafter',
    'pinpad': 'embodied.envs.pinpad:PinPad',
    'bsuite': 'embodied.envs.bsuite:BSuite',
    'memmaze': 'embodied.envs.memmaze:MemMaze',
    'loconav': 'embodied.envs.loconav:LocoNav',
    'procgen': 'embodied.envs.procgen:ProcGen',
    'dmlab': 'embodied.envs.dmlab:DMLab',
    'minecraft': 'embodied.envs.minecraft:Minecraft',
}

AGENTS = {
    'testing': 'embodied.agents.testing:TestAgent',
    'dreamerv3': 'embodied.agents.dreamerv3:Agent',
}

def make_args(config):
    """The slice of the config the runners see: `run` plus a few globals."""
    return arguments.from_config(config)


def env_spaces(config, factory=None):
    """The observation and action spaces of env 0 of `factory(config,
    index)`: a script's own env factory, else `make_env` (the run's
    `--task`)."""
    env = (factory or make_env)(config, 0)
    try:
        return env.obs_space, env.act_space
    finally:
        env.close()


def replay_spaces(config, make_env=None, spaces=None):
    """The spaces of one stored step: observations, actions and the replay
    context the agent writes back (agents declare it with an optional static
    method `replay_context_spaces(obs_space, act_space, config)`). The envs
    are those of `make_env` (see `env_spaces`), or `spaces`, env 0's
    `(obs_space, act_space)` where the caller has them."""
    obs_space, act_space = spaces or env_spaces(config, make_env)
    spaces = {**obs_space, **act_space}
    if not config.random_agent:
        ctor = _import(agent_path(config.agent_impl))
        context = getattr(ctor, 'replay_context_spaces', None)
        if context:
            spaces.update(context(obs_space, act_space, config))
    return spaces


def agent_spaces(obs_space, act_space):
    """The spaces the agent gets of an env's: without the `log/` metrics
    and the `reset` action."""
    obs_space = {
        k: v for k, v in obs_space.items() if not k.startswith('log/')}
    act_space = {k: v for k, v in act_space.items() if k != 'reset'}
    return obs_space, act_space


def check_agent(config, obs_space, act_space):
    """Raises a UsageError of one line, `--task <task>: <problem>`, unless
    the run's agent can be built for env 0's spaces (as `make_env` gives
    them). The agent's class tells it with an optional static method or
    classmethod `check_spaces(obs_space, act_space, config)`, given the
    spaces and the config its constructor gets, which raises a ValueError
    naming the problem; it is called without building the agent, at the
    start of a run before any worker starts and by `make_agent`."""
    if config.random_agent:
        return
    try:
        ctor = _import(agent_path(config.agent_impl))
    except ImportError as e:
        raise UsageError(f'--agent_impl {config.agent_impl}: {e}') from None
    hook = getattr(ctor, 'check_spaces', None)
    if hook is None:
        return
    try:
        hook(*agent_spaces(obs_space, act_space), agent_config(config))
    except ValueError as e:
        raise UsageError(f'--task {config.task}: {e}') from None


def make_agent(config, make_env=None):
    """The agent, for the spaces of the envs of `make_env(config, index)`: a
    script's own env factory, else the run's `--task`; refused with a
    UsageError where the agent cannot take them (`check_agent`)."""
    if config.replicas > 1 and not config.random_agent:
        _join_replicas(config)
    obs_space, act_space = env_spaces(config, make_env)
    check_agent(config, obs_space, act_space)
    obs_space, act_space = agent_spaces(obs_space, act_space)
    if config.random_agent:
        return embodied.RandomAgent(obs_space, act_space)
    ctor = _import(agent_path(config.agent_impl))
    return ctor(obs_space, act_space, agent_config(config))


def agent_config(config):
    """The config the agent's constructor gets: the `agent` block (the
    `testing` block for agent_impl testing) and the globals it needs."""
    if config.agent_impl == 'testing':
        return elements.Config(
            **config.testing,
            seed=config.seed,
            batch_size=config.batch_size,
            batch_length=config.batch_length,
            replay_context=config.replay_context,
            logdir=config.logdir)
    return elements.Config(
        **config.agent,
        logdir=config.logdir,
        seed=config.seed,
        jax=config.jax,
        batch_size=config.batch_size,
        batch_length=config.batch_length,
        replay_context=config.replay_context,
        report_length=config.report_length,
        replica=config.replica,
        replicas=config.replicas,
        policy_batches=arguments.policy_calls(
            make_args(config), config.script),
        trains=config.script != 'eval_only')


def _join_replicas(config):
    """Joins the run's replicas (JAX's distributed runtime), refuses a
    replica whose config differs from replica 0's, and checks that all see
    one logdir; in the process that builds the agent, before it is built
    (not in a process `distributed.stay_local` kept out: a policy
    process)."""
    from embodied.jax import distributed
    if distributed.local():
        return
    distributed.start(config)
    distributed.check_same_config(config)
    distributed.check_shared_logdir(config.logdir)


def make_logger(config):
    step = elements.Counter()
    suite = env_block(config)
    # The step written counts the env steps of every replica; only replica
    # 0 writes metrics files. In --script train the replicas step alike; in
    # --script parallel the logger adds up the replicas' steps (RunStep).
    multiplier = config.env.get(suite, {}).get('repeat', 1)
    if config.script == 'train':
        multiplier *= config.replicas
    from embodied.outputs import registry
    outputs = [elements.logger.TerminalOutput(config.logger.filter, 'Agent')]
    for name in (config.logger.outputs if config.replica == 0 else ()):
        if name not in registry.OUTPUTS:
            raise ValueError(
                f"Unknown logger output '{name}' in logger.outputs "
                f"(known: {', '.join(registry.NAMES)}).")
        outputs += registry.OUTPUTS[name].build(config)
    return embodied.outputs.Logger(step, outputs, multiplier)


def make_replay(config, folder, mode='train'):
    capacity, length = replay_size.shape(config, mode)
    if config.batch_size * length > capacity:
        raise ValueError(
            f'The {mode} replay holds {int(capacity)} steps but one batch '
            f'needs batch_size * length = {config.batch_size} * {length} = '
            f'{config.batch_size * length}: raise replay.size.')
    directory = elements.Path(config.logdir) / folder
    if config.replicas > 1:
        directory /= f'{config.replica:05}'
    kwargs = dict(
        length=length, capacity=int(capacity), online=config.replay.online,
        chunksize=config.replay.chunksize, directory=directory)
    if config.replay.fracs.uniform < 1 and mode == 'train':
        recency = 1.0 / np.arange(1, capacity + 1) ** config.replay.recexp
        selectors = embodied.replay.selectors
        kwargs['selector'] = selectors.Mixture(dict(
            uniform=selectors.Uniform(),
            priority=selectors.Prioritized(**config.replay.prio),
            recency=selectors.Recency(recency),
        ), config.replay.fracs)
    return embodied.replay.Replay(**kwargs)


def make_env(config, index, **overrides):
    """Env `index` of the run: a suite's (`--task suite_task`) or your own
    (`--task module:attr`, `embodied.envs.own`), checked and wrapped."""
    if is_own_task(config.task):
        kwargs = env_kwargs(config, own.BLOCK, index, overrides)
        env = own.make(config.task, kwargs)
    else:
        suite, task = config.task.split('_', 1)
        ctor = _import(SUITES[suite])
        kwargs = env_kwargs(config, suite, index, overrides)
        if suite == 'gym' and ':' in task:
            # gymnasium's `module:EnvId`: your module registers the id.
            own.import_module(
                task.split(':')[0], config.task, f" (gymnasium's '{task}')")
            env = own.call(ctor, config.task, (task,), kwargs,
                           f"gymnasium.make('{task}')")
        else:
            try:
                env = ctor(task, **kwargs)
            except adapter.UnsupportedSpace as e:
                raise UsageError(f'--task {config.task}: {e}') from None
    checks.check(env, f'--task {config.task}')
    return wrap_env(env, config)


def is_own_task(task):
    """Whether `--task` names your own env (`module:attr`) rather than a
    suite of SUITES; the rule is in `embodied.envs.own`."""
    return own.is_own(task, SUITES)


def env_block(config):
    """The name of the `env.<name>` block of the run's task."""
    if is_own_task(config.task):
        return own.BLOCK
    return config.task.split('_', 1)[0]


def env_kwargs(config, block, index, overrides):
    """The keyword arguments of env `index` from `env.<block>`."""
    kwargs = dict(config.env.get(block, {}))
    kwargs.update(overrides)
    if kwargs.pop('use_seed', False):
        # Replicas step envs of their own seeds (replica 0's are those of a
        # run of one replica).
        key = (config.seed, index)
        if config.replicas > 1 and config.replica:
            key = (config.seed, config.replica, index)
        kwargs['seed'] = hash(key) % (2 ** 32 - 1)
    if kwargs.pop('use_logdir', False):
        kwargs['logdir'] = elements.Path(config.logdir) / f'env{index}'
    return kwargs


def wrap_env(env, config):
    for name, space in env.act_space.items():
        if not space.discrete:
            env = embodied.wrappers.NormalizeAction(env, name)
    env = embodied.wrappers.UnifyDtypes(env)
    env = embodied.wrappers.CheckSpaces(env)
    for name, space in env.act_space.items():
        if not space.discrete:
            env = embodied.wrappers.ClipAction(env, name)
    return env


def make_stream(config, replay, mode):
    # The original binds `replay.sample`; the sampler also fills a
    # shared-memory slot in place (`streams.Stateless`).
    stream = embodied.streams.Stateless(
        replay.sampler(config.batch_size, mode))
    stream = embodied.streams.Consec(
        stream,
        length=config.batch_length if mode == 'train' else config.report_length,
        consec=config.consec_train if mode == 'train' else config.consec_report,
        prefix=config.replay_context,
        strict=(mode == 'train'),
        contiguous=True)
    return stream


def agent_path(agent_impl):
    """'module:Class' of the agent: a name from AGENTS, or the user's own
    agent class given as 'package.module:Class' (e.g. a subclass of
    `embodied.jax.Agent`)."""
    if agent_impl in AGENTS:
        return AGENTS[agent_impl]
    module, _, name = agent_impl.partition(':')
    if module and name.isidentifier():
        return agent_impl
    raise UsageError(
        f"Unknown --agent_impl '{agent_impl}'. Choose one of: "
        f"{', '.join(AGENTS)}, or name your own class as module:Class.")


def _import(path):
    try:
        return importing.load(path)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"Cannot load '{path}': {e}") from e
