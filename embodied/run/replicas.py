"""Which replica of how many this command is, from the command line or the
scheduler that started it.

Every host of a multi-host run runs the same command. The replica index and
count come from

* Slurm (`srun`, or `sbatch` with one task per host): `SLURM_PROCID` and
  `SLURM_NTASKS`, when the job step has more than one task;
* a Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` (the pod's index), as in
  the original; the count comes from `--replicas` (the Job's completions);
* otherwise `--replica i --replicas N` on the command line.

`jax.coordinator_address` (replica 0's host and a free port) is always given
on the command line; the recipes in `examples/` derive it from the
scheduler (the first host of the Slurm allocation, the headless Service of
the Kubernetes Job).
"""

SCRIPTS = ('train', 'parallel')  # The scripts that can run as replicas.


class BadReplicas(ValueError):
    """A replica setting that cannot work; the message names the key."""


def from_scheduler(config, environ):
    """`config` with `replica` / `replicas` set from the scheduler's
    variables in `environ`, and a line saying where they came from (or
    None)."""
    if 'JOB_COMPLETION_INDEX' in environ:
        index = _integer(environ, 'JOB_COMPLETION_INDEX')
        config = config.update(replica=index)
        return config, (
            f'Replica {index} of {config.replicas} (replica from '
            f'JOB_COMPLETION_INDEX, replicas from the command line).')
    if 'SLURM_PROCID' in environ and 'SLURM_NTASKS' in environ:
        count = _integer(environ, 'SLURM_NTASKS')
        if count > 1:
            index = _integer(environ, 'SLURM_PROCID')
            config = config.update(replica=index, replicas=count)
            return config, (
                f'Replica {index} of {count} (from SLURM_PROCID and '
                f'SLURM_NTASKS).')
    return config, None


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
