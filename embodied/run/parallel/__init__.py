"""The parallel runner: agent, replay, logger and envs in separate workers.

One module per role, named as the role: `launcher` (`combined`, the
command's own process), `agent` (the learner's process, with the `actor`
and `learner` threads), `policy` (the actor and the policy in a process of
their own, with `run.policy_worker process`), `replay`, `logger` and `env`.
The table of roles, from which the launcher, the address keys, the saves
and the separate commands derive, is `roles`; the launcher's state machine
is `lifecycle`, the control methods every role serves `control`. docs/
parallel.md walks one observation through these modules.

Importing this package imports no role module: each name below is loaded
on first use, so `embodied.run.parallel.roles` stays cheap for the
single-process scripts and the config checks that read it.
"""

import importlib

# The package's exports: name -> the module that defines it.
_EXPORTS = {
    'combined': 'launcher',
    'parallel_agent': 'agent',
    'AgentControl': 'agent',
    'parallel_actor': 'actor',
    'ActorRole': 'actor',
    'parallel_learner': 'learner',
    'parallel_policy': 'policy',
    'parallel_replay': 'replay',
    'ReplayRole': 'replay',
    'parallel_logger': 'logger',
    'LoggerRole': 'logger',
    'parallel_env': 'env',
    'parallel_envs': 'env',
    'roles_table': 'roles',
    'rpc_table': 'roles',
}

# Modules renamed to their role's name; the old names still import.
_RENAMED = {
    'agent_process': 'agent', 'policy_process': 'policy',
    'replay_server': 'replay', 'logger_server': 'logger', 'entry': 'launcher',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        module = importlib.import_module(f'{__name__}.{_EXPORTS[name]}')
        return getattr(module, name)
    if name in _RENAMED:
        return importlib.import_module(f'{__name__}.{_RENAMED[name]}')
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")

