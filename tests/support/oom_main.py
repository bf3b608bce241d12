"""`python -m embodied.main` whose agent runs out of device memory in one
program, for tests/run/test_out_of_memory.py:

    EMBODIED_TEST_OOM=train python oom_main.py --logdir LOGDIR ...

Once the run has saved its agent at a step above 0, the next call of the
program named by $EMBODIED_TEST_OOM ('train', 'report' or 'policy') asks
the CPU for a petabyte, inside the agent's method, as a program too large
for the device would: JAX raises its own RESOURCE_EXHAUSTED error with
XLA's message. The hooks are set when this module is imported, so they
also hold in the run's spawned processes (the agent process, the policy
process), which import the launch's script as their main module.
"""

import os
import pathlib
import sys

import jax.numpy as jnp

from embodied import main
from embodied.jax import handover
from embodied.jax import hosts

PROGRAM = os.environ['EMBODIED_TEST_OOM']
PETABYTE = 2 ** 50


def _saved_after_start():
    logdir = pathlib.Path(sys.argv[sys.argv.index('--logdir') + 1])
    folder = logdir / 'ckpt' / 'agent'
    return folder.exists() and any(
        p.name.isdigit() and int(p.name) > 0 and (p / 'done').exists()
        for p in folder.iterdir())


def _ask_too_much():
    jnp.ones((PETABYTE,), jnp.uint8).block_until_ready()


def _hook(cls, method, program_of):
    original = getattr(cls, method)

    def hooked(self, *args, **kwargs):
        if program_of(args) == PROGRAM and _saved_after_start():
            _ask_too_much()
        return original(self, *args, **kwargs)
    setattr(cls, method, hooked)


# train() and report() meet their jitted program right before running it;
# policy() and init_policy() take the acting parameters.
_hook(hosts.FirstRuns, 'meet', lambda args: getattr(args[0], '__name__', ''))
_hook(handover.PolicyParams, 'acting', lambda args: 'policy')

if __name__ == '__main__':
    main.main(sys.argv[1:])
