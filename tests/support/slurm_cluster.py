"""A one-node Slurm cluster on loopback for tests: Debian's `slurm-wlm`
and `munge` (installed by `install()` where apt-get and root allow),
`munged`, `slurmctld` and `slurmd` in the foreground with their config,
state, logs and sockets in one folder, stopped by pid.

    with slurm_cluster.Cluster(folder) as cluster:
        job = cluster.sbatch(script, '--time=1', env=...)
        cluster.wait(lambda: cluster.state(job) == 'RUNNING')
"""

import ctypes
import fcntl
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time

PACKAGES = ('slurm-wlm', 'munge')
DAEMONS = ('munged', 'slurmctld', 'slurmd')


def missing():
    """Why a cluster cannot be had here (a sentence), or None."""
    if all(shutil.which(name) for name in ('munged', 'slurmctld', 'slurmd',
                                           'sbatch', 'scontrol')):
        return None if os.geteuid() == 0 else (
            'Slurm is installed but the test is not root (slurmd runs jobs '
            'as their user).')
    if os.geteuid() != 0:
        return 'Slurm is not installed and the test is not root to install it.'
    if not shutil.which('apt-get'):
        return 'Slurm is not installed and there is no apt-get to install it.'
    return None


def install(timeout=600):
    """Installs Slurm and munge with apt-get unless present; returns None,
    or why it could not (a sentence). Test processes running side by side
    (xdist) install one after another."""
    with open('/tmp/embodied-slurm-install.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which('slurmctld') and shutil.which('munged'):
            return None
        env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
        for command in (['apt-get', 'update'],
                        ['apt-get', 'install', '-y', '-o',
                         'DPkg::Lock::Timeout=300', '--no-install-recommends',
                         *PACKAGES]):
            result = subprocess.run(
                command, env=env, capture_output=True, text=True,
                timeout=timeout)
            if result.returncode:
                return (f'`{" ".join(command)}` failed ({result.returncode}):'
                        f' {result.stderr.strip()[-500:]}')
    return None


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class Cluster:
    """One node, `localhost`, with this machine's CPUs and half its
    memory; JobRequeue=1."""

    def __init__(self, folder):
        self.folder = pathlib.Path(folder)
        self.procs = {}
        self.jobs = []
        # The controller runs under this host's name (slurmctld checks
        # it); the node is `localhost`, which resolves everywhere (the
        # replicas recipe takes the node's name for the coordinator).
        self.host = socket.gethostname().split('.')[0]
        self.node = 'localhost'

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def env(self):
        """The environment for Slurm's commands and the jobs."""
        return dict(os.environ, SLURM_CONF=str(self.folder / 'slurm.conf'))

    def _start(self):
        f = self.folder
        for name in ('state', 'spool', 'munge'):
            (f / name).mkdir(parents=True, exist_ok=True)
        os.chmod(f / 'munge', 0o700)
        key = f / 'munge' / 'munge.key'
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = f / 'munge' / 'munge.socket'
        self._daemon('munged', [
            'munged', '--foreground', '--force', f'--socket={sock}',
            f'--key-file={key}', f'--log-file={f}/munge/munged.log',
            f'--pid-file={f}/munge/munged.pid',
            f'--seed-file={f}/munge/munged.seed'])
        self.wait(sock.exists, 30, 'munged\'s socket')
        cpus = os.cpu_count()
        memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
        (f / 'slurm.conf').write_text(f"""\
ClusterName=embodied-test
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd.pid
SlurmctldLogFile={f}/slurmctld.log
SlurmdLogFile={f}/slurmd.log
JobCompType=jobcomp/filetxt
JobCompLoc={f}/jobcomp.txt
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobRequeue=1
ReturnToService=2
KillWait=30
MinJobAge=3600
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MessageTimeout=30
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} \
RealMemory={memory // 2**20 // 2} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        self._daemon('slurmctld', ['slurmctld', '-D', '-i'])
        self._daemon('slurmd', ['slurmd', '-D', '-N', self.node])
        self.wait(lambda: self.node_state() in ('IDLE', 'MIXED'), 120,
                  'the node to be idle')

    def _daemon(self, name, command):
        log = open(self.folder / f'{name}.out', 'w')
        self.procs[name] = subprocess.Popen(
            command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_end_with_parent())
        log.close()

    def stop(self):
        """Ends the jobs, then stops the daemons by pid, then kills by pid
        whatever of this cluster is left (slurmstepd leaves slurmd's
        process tree: it and the jobs are found by SLURM_CONF)."""
        if self.jobs and self._alive('slurmctld'):
            self.run('scancel', '--signal=KILL', '--full', *self.jobs,
                     check=False)
            self.run('scancel', *self.jobs, check=False)
            try:
                self.wait(lambda: not self.run(
                    'squeue', '-h', '-t', 'RUNNING,COMPLETING',
                    check=False).strip(), 60, 'the jobs to end')
            except (AssertionError, RuntimeError):
                pass
        for name in reversed(DAEMONS):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        left = self._leftovers()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while left and time.monotonic() < deadline:
            left = [pid for pid in left if os.path.exists(f'/proc/{pid}')
                    and not _zombie(pid)]
            time.sleep(0.1)

    def _alive(self, name):
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def _leftovers(self):
        """Pids of processes with this cluster's SLURM_CONF."""
        marker = f'SLURM_CONF={self.folder / "slurm.conf"}\0'.encode()
        found = []
        for entry in os.listdir('/proc'):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f'/proc/{entry}/environ', 'rb') as f:
                    if marker in f.read() + b'\0':
                        found.append(int(entry))
            except OSError:
                pass
        return found

    def run(self, *command, check=True):
        result = subprocess.run(
            command, env=self.env, capture_output=True, text=True,
            timeout=60)
        if check and result.returncode:
            raise RuntimeError(
                f'{" ".join(command)} exited {result.returncode}: '
                f'{result.stdout}{result.stderr}\n{self.logs()}')
        return result.stdout

    def logs(self):
        return '\n'.join(
            f'--- {name} ---\n{(self.folder / name).read_text()[-3000:]}'
            for name in ('slurmctld.log', 'slurmd.log', 'slurmctld.out',
                         'slurmd.out')
            if (self.folder / name).exists())

    def node_state(self):
        out = self.run('sinfo', '-h', '-o', '%T', '-n', self.node,
                       check=False)
        return out.strip().upper().rstrip('*~#')

    def sbatch(self, *args, env=None, cwd=None):
        """Submits; returns the job id."""
        result = subprocess.run(
            ['sbatch', '--parsable', *map(str, args)], env=env or self.env,
            cwd=cwd, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr + self.logs()
        job = result.stdout.strip().split(';')[0]
        self.jobs.append(job)
        return job

    def job(self, job):
        """`scontrol show job`'s fields as a dict."""
        out = self.run('scontrol', '-o', 'show', 'job', str(job))
        return dict(re.findall(r'(\w+)=(\S*)', out))

    def state(self, job):
        return self.job(job)['JobState']

    def wait(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f'{name} exited {proc.returncode}:\n{self.logs()}')
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f'Timed out after {timeout} s waiting for {what}.\n'
                    f'{self.logs()}')
            time.sleep(0.5)

    def signal_batch(self, job, signum):
        """What `--signal=B:SIG@N` does at N s before the limit."""
        self.run('scancel', '--batch', f'--signal={signum.name[3:]}',
                 str(job))


def _end_with_parent():
    """What a daemon's child runs before exec: Linux then sends the daemon
    SIGTERM when the thread that started it (the test's) dies, so a test
    killed before `stop()` (SIGKILL, a crash) leaves no daemon behind. (A
    job running then, which slurmd starts apart from itself, is left to
    end by its own time limit.) The libc call is looked up here, in the
    test process: the child between fork and exec only calls it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


def _zombie(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except OSError:
        return False
