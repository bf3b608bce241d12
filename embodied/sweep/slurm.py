"""A sweep's runs as one Slurm job array, submitted with `sbatch --array`.

The sweep writes one batch script, `<sweep>/slurm/array.sbatch`, in which
array element N runs run N of the sweep (its folder `N-*`), picked by
`SLURM_ARRAY_TASK_ID`. Each element does what examples/slurm-one-node.sbatch
does: the run is a child of the batch script, 120 s before the time limit
Slurm sends SIGUSR1 to the script (`--signal=B:USR1@120`), which sends
SIGTERM to the run (it stops after its current step, saves and exits 0) and
then requeues the element (`scontrol requeue`), which resumes from that
save in the same folder. `scancel` sends SIGTERM to every process of the
job: the run saves and the element ends CANCELLED. The element's exit code
is the run's. Only the unfinished runs are submitted, and runs already in
Slurm's queue (an element of an array of this sweep, by job name) are not
submitted again.
"""

import hashlib
import getpass
import os
import re
import shlex
import shutil
import subprocess
import sys

from embodied.config import UsageError
from embodied.sweep import local
from embodied.sweep import state

SCRIPT = '''\
#!/bin/bash
# The runs of the sweep in {sweepdir} as one Slurm job array, written by
# `python -m embodied.sweep`: element N runs run N (its folder N-*). As in
# examples/slurm-one-node.sbatch, Slurm sends SIGUSR1 to this script before
# the time limit; the script stops the run (SIGTERM: it saves and exits 0)
# and requeues the element, which then resumes from that save.
#SBATCH --job-name={jobname}
#SBATCH --nodes=1
#SBATCH --ntasks=1
{gpus}#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={sweepdir}/slurm/%A_%a.out

case "$SLURM_ARRAY_TASK_ID" in
{cases}
  *) echo "error: element $SLURM_ARRAY_TASK_ID is no run of this sweep." >&2
     exit 2 ;;
esac
mkdir -p "$LOGDIR" || exit 1
exec >>"$LOGDIR/output.log" 2>&1
echo "Slurm job $SLURM_JOB_ID (array $SLURM_ARRAY_JOB_ID, element" \\
  "$SLURM_ARRAY_TASK_ID) on $(hostname): $LOGDIR"
cd {cwd} || exit 1

# Set before the run starts, so that no signal can miss them.
RUN=
stop() {{
  if [ -z "$RUN" ]; then return 143; fi
  kill -TERM "$RUN"
  wait "$RUN"
}}
stop_and_requeue() {{
  echo "Time limit near: stopping the run with a final save, then requeueing."
  stop
  STATUS=$?
  echo "The run exited $STATUS."
  if [ "$STATUS" -eq 0 ]; then
    echo "Requeueing job $SLURM_JOB_ID."
    scontrol requeue "$SLURM_JOB_ID"
  fi
  exit "$STATUS"
}}
trap stop_and_requeue USR1
trap 'stop; exit $?' TERM

{python} -m embodied.main "$@" &
RUN=$!
wait "$RUN"
exit $?
'''


def job_name(sweepdir):
    """The array's job name: the sweep folder's name and a digest of its
    path, by which a later submission finds the sweep's queued runs."""
    digest = hashlib.sha1(str(sweepdir).encode()).hexdigest()[:8]
    return f'sweep-{re.sub(r"[^A-Za-z0-9_.]", "_", sweepdir.name)[:40]}-{digest}'


def script(runs, sweepdir, gpus=1, python=None, cwd=None):
    """The text of the array's batch script for `runs` (`grid.Run`s)."""
    cases = []
    for run in runs:
        argv = ' '.join(shlex.quote(arg) for arg in run.argv)
        cases.append(
            f'  {run.index}) LOGDIR={shlex.quote(str(run.logdir))}\n'
            f'     set -- {argv} ;;')
    return SCRIPT.format(
        sweepdir=sweepdir, jobname=job_name(sweepdir),
        gpus=f'#SBATCH --gpus={int(gpus)}\n' if gpus else '',
        cases='\n'.join(cases), cwd=shlex.quote(str(cwd or os.getcwd())),
        python=shlex.quote(python or sys.executable))


def array_spec(indices, parallel=0):
    """sbatch's --array value: the indices as ranges, `%parallel` at most
    running at once when `parallel` > 0."""
    indices = sorted(set(indices))
    ranges, start = [], None
    for i, index in enumerate(indices):
        if start is None:
            start = index
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            ranges.append(f'{start}' if start == index else f'{start}-{index}')
            start = None
    spec = ','.join(ranges)
    return f'{spec}%{parallel}' if parallel else spec


def queued(sweepdir, env=None):
    """{array index: job id} of the sweep's elements in Slurm's queue
    (pending, running or requeued), or None when squeue cannot tell."""
    try:
        result = subprocess.run(
            ['squeue', '-h', '-r', '-u', getpass.getuser(), '-n',
             job_name(sweepdir), '-o', '%i'],
            capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode:
        return None
    found = {}
    for line in result.stdout.split():
        match = re.fullmatch(r'(\d+)_(\d+)', line.strip())
        if match:
            found[int(match.group(2))] = line.strip()
    return found


def submit(runs, sweepdir, gpus=1, sbatch=(), parallel=0, python=None,
           env=None, say=print):
    """Submits the unfinished of `runs` (`grid.Run`s) that are not queued
    already as one job array; returns its job id, or None when nothing was
    left to submit. Raises UsageError without Slurm's commands, and
    RuntimeError when sbatch refuses the job (its message)."""
    if not shutil.which('sbatch', path=(env or os.environ).get('PATH')):
        raise UsageError(
            '--sweep.scheduler slurm: no sbatch on PATH (the sweep submits '
            'its runs with Slurm\'s sbatch).')
    inqueue = queued(sweepdir, env)
    if inqueue is None:
        say('Could not read Slurm\'s queue (squeue): submitting every '
            'unfinished run.')
        inqueue = {}
    todo = []
    for run in runs:
        done, where = state.describe(run)
        if done:
            say(f'Skipping {run.name}: {where}.')
        elif run.index in inqueue:
            say(f'Skipping {run.name}: in Slurm\'s queue as job '
                f'{inqueue[run.index]} ({where}).')
        else:
            say(f'Submitting {run.name} ({where}).')
            todo.append(run)
    if not todo:
        say('Nothing to submit: every run is finished or queued.')
        return None
    folder = sweepdir / 'slurm'
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / 'array.sbatch'
    path.write_text(script(todo, sweepdir, gpus, python))
    spec = array_spec([run.index for run in todo], parallel)
    result = subprocess.run(
        ['sbatch', '--parsable', f'--array={spec}', *sbatch, str(path)],
        capture_output=True, text=True, timeout=120, env=env)
    if result.returncode:
        raise RuntimeError(
            f'sbatch refused the array ({path}): '
            f'{(result.stderr or result.stdout).strip()}')
    job = result.stdout.strip().split(';')[0]
    say(f'Submitted array job {job} ({len(todo)} elements: --array={spec}, '
        f'script {path}); each run\'s output is in its folder\'s '
        f'{local.OUTPUT}, and the same command later submits what is '
        f'still unfinished.')
    return job
