"""An env process that talks to the actor the way the original's
`parallel_env` does: one env per `act` request, a scalar `envid`, unbatched
leaves, and unbatched actions in the reply. Run as a script:

    python tests/support/original_env.py ACTOR_ADDR ENVID IS_EVAL [FLAG ...]

The env is made by `embodied.main.make_env` from the config the flags give.

It steps until the actor answers with a stop reply (which the original never
sends: its env processes run until killed), then exits 0.
"""

import sys

import numpy as np
import portal

from embodied import main as mainlib

STOP_KEY = '__stop__'


def main(addr, envid, is_eval, flags):
    env = mainlib.make_env(mainlib.parse(flags), envid)
    actor = portal.Client(addr, f'OriginalEnv{envid}', autoconn=False)
    actor.connect()
    act = None
    steps = 0
    while True:
        if act is None or act['reset']:
            act = {k: v.sample() for k, v in env.act_space.items()}
            act['reset'] = True
        obs = env.step(act)
        obs = {k: np.asarray(v, order='C') for k, v in obs.items()}
        obs['is_eval'] = is_eval
        act = actor.act({'envid': envid, **obs}).result()
        if STOP_KEY in act:
            break
        assert act['reset'].shape == (), act  # Unbatched, as it was sent.
        steps += 1
    actor.close()
    print(f'Original-style env {envid} stepped {steps} times.', flush=True)


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == 'True', sys.argv[4:])
