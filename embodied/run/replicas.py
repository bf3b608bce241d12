"""Which replica of how many this command is, from the command line or the
scheduler that started it.

Every host of a multi-host run runs the same command. The replica index and
count come from

* `--replica i --replicas N` on the command line;
* Slurm (`srun`, or `sbatch` with one task per host): `SLURM_PROCID` and
  `SLURM_NTASKS`, when the job step has more than one task and the command
  asks for replicas: `--replicas auto`, `--replicas N` with N equal to
  `SLURM_NTASKS`, or a `jax.coordinator_address`. A job step of several
  tasks that asks for none of these is refused: each task would train on
  its own into the same logdir;
* a Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` (the pod's index), as in
  the original; the count comes from `--replicas` (the Job's completions).

`jax.coordinator_address` (replica 0's host and a free port) is always given
on the command line; the recipes in `examples/` derive it from the
scheduler (the first host of the Slurm allocation, the headless Service of
the Kubernetes Job).
"""

from embodied.run import scripts as scriptslib

# The scripts that can run as replicas.
SCRIPTS = tuple(s.name for s in scriptslib.TABLE if s.replicas)


class BadReplicas(ValueError):
    """A replica setting that cannot work; the message names the key."""


AUTO = 'auto'


def requested(argv):
    """Splits `--replicas auto` off the command line (`replicas` is an
    integer key). Returns the remaining arguments and what the command line
    asked for: 'auto', the count it gave, or None."""
    rest, asked, pending = [], None, list(argv)
    while pending:
        arg = pending.pop(0)
        if arg == '--replicas' and pending:
            asked = pending[0]
            if asked == AUTO:
                pending.pop(0)
                continue
        elif arg.startswith('--replicas='):
            asked = arg.split('=', 1)[1]
            if asked == AUTO:
                continue
        rest.append(arg)
    if asked not in (None, AUTO):
        try:
            asked = int(float(asked))
        except ValueError:
            raise BadReplicas(
                f"--replicas is '{asked}': give a count or 'auto' (the "
                f"count of the Slurm job step).") from None
    return rest, asked


def from_scheduler(config, environ, asked=None):
    """`config` with `replica` / `replicas` set from the scheduler's
    variables in `environ`, and a line saying where they came from (or
    None). `asked` is what the command line asked for (see `requested`)."""
    if 'JOB_COMPLETION_INDEX' in environ:
        if asked == AUTO:
            raise BadReplicas(
                '--replicas auto reads the count from Slurm; a Kubernetes '
                'Indexed Job gives each pod only its index: pass --replicas '
                'N, N being the Job\'s completions.')
        index = _integer(environ, 'JOB_COMPLETION_INDEX')
        config = config.update(replica=index)
        return config, (
            f'Replica {index} of {config.replicas} (replica from '
            f'JOB_COMPLETION_INDEX, replicas from the command line).')
    count = 1
    if 'SLURM_PROCID' in environ and 'SLURM_NTASKS' in environ:
        count = _integer(environ, 'SLURM_NTASKS')
    if count <= 1:
        if asked == AUTO:
            return config, (
                'Replica 0 of 1 (--replicas auto found no Slurm job step of '
                'several tasks).')
        return config, None
    if asked == AUTO or asked == count or (
            asked is None and config.jax.coordinator_address):
        index = _integer(environ, 'SLURM_PROCID')
        config = config.update(replica=index, replicas=count)
        return config, (
            f'Replica {index} of {count} (from SLURM_PROCID and '
            f'SLURM_NTASKS).')
    if asked is None:
        raise BadReplicas(
            f'This Slurm job step has SLURM_NTASKS={count} tasks, and each '
            f'would train on its own into the same logdir. To train one '
            f'agent across them, pass --replicas auto and '
            f'--jax.coordinator_address HOST:PORT (replica 0\'s host; see '
            f'examples/slurm.sbatch). To train once, start one task '
            f'(#SBATCH --ntasks=1, or srun --ntasks=1) or pass --replicas 1.')
    if asked != 1:
        raise BadReplicas(
            f'--replicas is {asked} but this Slurm job step has '
            f'SLURM_NTASKS={count} tasks: pass --replicas auto (or '
            f'{count}), or start {asked} tasks.')
    return config, None  # --replicas 1: each task a run of its own.


def check(config):
    """Raises BadReplicas for a replica setting that cannot run."""
    count, index = int(config.replicas), int(config.replica)
    if count < 1:
        raise BadReplicas(f'replicas is {count}; it must be at least 1.')
    if count == 1:
        return
    if not 0 <= index < count:
        raise BadReplicas(
            f'replica is {index} but replicas is {count}: the replica must '
            f'be in [0, {count}).')
    if config.script not in SCRIPTS:
        raise BadReplicas(
            f'--script {config.script} cannot run as {count} replicas; '
            f'replicas train one agent with --script '
            f'{" or --script ".join(SCRIPTS)}.')
    if not config.jax.coordinator_address:
        raise BadReplicas(
            f'replicas is {count} but jax.coordinator_address is empty: '
            f'give every replica the same --jax.coordinator_address '
            f'HOST:PORT, where HOST is replica 0\'s host.')
    if config.random_agent:
        raise BadReplicas(
            'random_agent has no parameters to train across replicas; run '
            'it with replicas 1.')
    if config.script == 'parallel' and (
            config.run.remote_envs or config.run.remote_replay):
        raise BadReplicas(
            'run.remote_envs and run.remote_replay are for one replica; '
            'with several, each replica runs its own envs and replay.')


def _integer(environ, name):
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise BadReplicas(
            f"The scheduler variable {name} is '{value}', not an "
            f"integer.") from None
