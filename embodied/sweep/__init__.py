"""Sweeps: seeds x tasks x flags as normal runs, here or as a Slurm array.

    python -m embodied.sweep --logdir ~/logdir/sweep --configs debug \\
        --task dummy_disc cartpole_balance --seed 0 1 --sweep.parallel 2

runs the four combinations, two at a time, each as `python -m embodied.main`
with its `--task`, `--seed`, `--method` and `--logdir` set and the other
flags as given, in `~/logdir/sweep/<index>-<task>-<method>-<seed>` (the
layout the original's `plot.py` reads; `names` says how a `-` in a task is
written). The same command again skips the finished runs (those whose
newest save reached `run.steps`) and resumes the others. With
`--sweep.scheduler slurm` the unfinished runs go to Slurm as one job array
(`slurm`). The command line is described in `grid`.

From Python:

    runs = sweep.plan('~/logdir/sweep', ['--configs', 'debug'],
                      tasks=['dummy_disc'], seeds=[0, 1])
    sweep.run_local(runs, parallel=2)          # -> exit code
    sweep.submit_slurm(runs, gpus=1)           # -> job id or None
    sweep.parse_name('0-gym_CartPole%2Dv1-dreamerv3-1')
    # Name(index=0, task='gym_CartPole-v1', method='dreamerv3', seed=1)
"""

from embodied.sweep.grid import BadGrid, Run, plan  # noqa: F401
from embodied.sweep.names import Name, folder as folder_name  # noqa: F401
from embodied.sweep.names import parse as parse_name  # noqa: F401
from embodied.sweep.names import task_method_seed  # noqa: F401
from embodied.sweep.state import finished, saved_step  # noqa: F401


def run_local(runs, parallel=1, say=print):
    """Runs the unfinished `runs` (from `plan`) on this machine, `parallel`
    at a time, skipping the finished ones; returns the exit code (0: all
    finished; 1: a run failed; 130/143: stopped by SIGINT/SIGTERM)."""
    from embodied.sweep import local
    return local.run(runs, parallel, say=say)


def submit_slurm(runs, gpus=1, sbatch=(), parallel=0, say=print):
    """Submits the unfinished `runs` (from `plan`) that are not queued yet
    as one Slurm job array, each element asking for `gpus` GPUs, with more
    `sbatch` arguments; returns the job id, or None if nothing was left."""
    from embodied.sweep import slurm
    if not runs:
        return None
    return slurm.submit(runs, runs[0].logdir.parent, gpus, tuple(sbatch),
                        parallel, say=say)
