"""Process-wide JAX setup from the `jax` config block: platform, devices,
compute dtype, compilation cache.

JAX reads most of these settings once, when its first backend starts, so
`setup()` must run before anything else in the process touches a device. It
returns a `Runtime` that says which devices the policy and the learner use.
"""

import dataclasses
import importlib.util
import os
import pathlib
import threading

from . import mesh as meshlib

PLATFORMS = ('auto', 'cpu', 'cuda', 'gpu', 'tpu')
DTYPES = ('auto', 'float32', 'bfloat16')  # float16 would need loss scaling

AUTOTUNE = 1  # the original's XLA GPU autotune level (XLA's default: 4)
CACHE_OFF = 'off'  # $EMBODIED_JAX_CACHE value that turns the cache off
CACHE_GB = 4  # default bound of the cache folder
# The XLA caches JAX keeps inside its persistent cache folder: the GPU
# autotuner's results per fusion, so a program that misses the cache (a
# new shape, an edited model) still skips timing the matmuls and
# convolutions it shares with earlier ones. Not 'all': that adds XLA's
# kernel cache, which JAX leaves off by default for a naming conflict with
# its own cache.
XLA_CACHES = 'xla_gpu_per_fusion_autotune_cache_dir'

_lock = threading.Lock()
_applied = {}


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What `setup()` decided: where the policy and the learner run. The
    device tuples are the devices each mesh spans, in mesh order (see
    `mesh.choose_devices`)."""
    platform: str
    compute_dtype: object
    policy_devices: tuple
    train_devices: tuple
    jit: bool
    debug: bool
    cache_dir: str
    enable_policy: bool = True
    policy_mesh: str = '-1,1,1'  # 'd,f,t' over policy_devices (mesh.py)
    train_mesh: str = '-1,1,1'  # 'd,f,t' over train_devices


class PlatformError(RuntimeError):
    """The requested JAX platform or devices are not available."""


def setup(jaxcfg, logdir=None):
    """Configures JAX for this process and returns the Runtime.

    `jaxcfg` holds the original's keys: platform, compute_dtype,
    policy_devices, train_devices, policy_mesh, train_mesh, mock_devices,
    prealloc, jit, debug, autotune, deterministic.
    """
    _check_choice('jax.platform', jaxcfg.platform, PLATFORMS)
    if getattr(jaxcfg, 'coordinator_address', '') and not _distributed():
        raise PlatformError(
            'jax.coordinator_address is set but this process has not joined '
            'the run\'s replicas: set replicas (and replica) too, or call '
            'embodied.jax.distributed.start(config) before building the '
            'agent.')
    _check_choice('jax.compute_dtype', jaxcfg.compute_dtype, DTYPES)
    flags = xla_flags(jaxcfg)
    with _lock:
        _configure_before_start(jaxcfg, flags)
        import jax
        cache_dir = _enable_cache(jax, logdir)
        if jaxcfg.debug:
            jax.config.update('jax_disable_most_optimizations', True)
        devices = _devices(jax, jaxcfg.platform)
    platform = devices[0].platform
    local = [d for d in devices if d.process_index == jax.process_index()]
    expect = getattr(jaxcfg, 'expect_devices', 0)
    if expect and len(local) != expect:
        raise PlatformError(
            f'jax.expect_devices is {expect} but JAX found {len(local)} '
            f'{platform} devices.')
    policy_mesh = str(getattr(jaxcfg, 'policy_mesh', meshlib.DEFAULT))
    train_mesh = str(getattr(jaxcfg, 'train_mesh', meshlib.DEFAULT))
    # Device indices name this host's devices. The policy acts on its own
    # host's; with several replicas the learner's mesh spans the devices
    # each host names (one global mesh).
    policy = meshlib.choose_devices(
        local, _pick(local, jaxcfg.policy_devices, 'jax.policy_devices'),
        policy_mesh, 'jax.policy_mesh')
    if jax.process_count() > 1:
        train = _train_devices_every_host(
            jax, devices, jaxcfg.train_devices, train_mesh)
    else:
        train = meshlib.choose_devices(
            devices, _pick(devices, jaxcfg.train_devices, 'jax.train_devices'),
            train_mesh, 'jax.train_mesh')
    return Runtime(
        platform=platform,
        compute_dtype=_dtype(jax, jaxcfg.compute_dtype, platform),
        policy_devices=tuple(policy),
        train_devices=tuple(train),
        policy_mesh=policy_mesh,
        train_mesh=train_mesh,
        jit=bool(jaxcfg.jit),
        debug=bool(jaxcfg.debug),
        cache_dir=cache_dir,
        enable_policy=bool(getattr(jaxcfg, 'enable_policy', True)))


def _check_choice(key, value, choices):
    if value not in choices:
        raise ValueError(
            f"Unsupported {key} '{value}'; choose one of {', '.join(choices)}.")


def xla_flags(jaxcfg):
    """The XLA flags of `jax.autotune` and `jax.deterministic`, as the
    original sets them on every run, and of `jax.debug`: {flag name: value}.

    With `jax.debug` (XLA's optimizations off, for a fast compile) the CPU
    backend also emits elementwise fusions with its older LLVM emitters
    instead of its fusion emitters, which compile the unoptimized train
    program in about half the time and train as fast (docs/benchmarks.md,
    "Figures behind settings in the code")."""
    level = getattr(jaxcfg, 'autotune', AUTOTUNE)
    if isinstance(level, bool) or not isinstance(level, int) or not (
            0 <= level <= 4):
        raise ValueError(
            f"jax.autotune must be an XLA GPU autotune level from 0 (off) "
            f"to 4, not {level!r}.")
    deterministic = getattr(jaxcfg, 'deterministic', True)
    if not isinstance(deterministic, bool):
        raise ValueError(
            f'jax.deterministic must be True or False, not '
            f'{deterministic!r}.')
    flags = {
        'xla_gpu_autotune_level': str(level),
        'xla_gpu_deterministic_ops': str(deterministic).lower()}
    if getattr(jaxcfg, 'debug', False):
        flags['xla_cpu_use_fusion_emitters'] = 'false'
    return flags


def add_xla_flags(flags, environ=None):
    """Appends `flags` ({name: value}) to $XLA_FLAGS, leaving out every one
    that $XLA_FLAGS sets already: the user's own flags win. Returns the
    names added."""
    environ = os.environ if environ is None else environ
    current = environ.get('XLA_FLAGS', '')
    present = {
        word.lstrip('-').split('=', 1)[0] for word in current.split()}
    added = [name for name in flags if name not in present]
    if added:
        environ['XLA_FLAGS'] = ' '.join(
            [*current.split(), *(f'--{k}={flags[k]}' for k in added)])
    if (flags.get('xla_gpu_deterministic_ops') == 'true'
            and 'xla_gpu_deterministic_ops' in added):
        environ.setdefault('TF_CUDNN_DETERMINISTIC', '1')
    return added


def _configure_before_start(jaxcfg, flags=None):
    """Sets what JAX only reads when its backends start (first device use):
    among them the XLA flags `flags` (XLA parses $XLA_FLAGS once)."""
    settings = dict(
        platform=jaxcfg.platform, mock=int(jaxcfg.mock_devices),
        prealloc=bool(jaxcfg.prealloc))
    if _applied:
        if settings['mock'] != _applied['mock'] and _backend_started():
            raise PlatformError(
                f'jax.mock_devices {settings["mock"]} asked for, but JAX '
                f'already started in this process with mock_devices '
                f'{_applied["mock"]}; device settings apply once per process.')
        return
    _applied.update(settings)
    if flags and not _backend_started():
        add_xla_flags(flags)
    if not jaxcfg.prealloc:
        os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
    import jax
    if jaxcfg.platform != 'auto' and not _backend_started():
        platform = 'cuda' if jaxcfg.platform == 'gpu' else jaxcfg.platform
        if 'JAX_PLATFORMS' not in os.environ:
            jax.config.update('jax_platforms', platform)
    if jaxcfg.mock_devices:
        if _backend_started():
            import jax
            count = len(jax.devices('cpu'))
            if count < jaxcfg.mock_devices:
                raise PlatformError(
                    f'jax.mock_devices {jaxcfg.mock_devices} asked for, but '
                    f'JAX already started in this process with {count} CPU '
                    f'devices; set it before JAX first runs (a new process).')
        else:
            jax.config.update('jax_num_cpu_devices', int(jaxcfg.mock_devices))


def _backend_started():
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge._backends)
    except (ImportError, AttributeError):
        return False


def _devices(jax, platform):
    try:
        if jax.config.jax_num_cpu_devices > 1 or platform == 'cpu':
            return jax.devices('cpu')
        if platform == 'auto':
            return jax.devices()
        return jax.devices('cuda' if platform == 'gpu' else platform)
    except (RuntimeError, AssertionError) as e:
        # JAX raises AssertionError when jax_platforms names only a platform
        # whose plugin is missing (no backend started at all).
        first = str(e).splitlines()[0] if str(e) else 'no backend started'
        raise PlatformError(
            f"jax.platform is '{platform}' but JAX cannot use it here "
            f"({first}). Install the matching jax build (for NVIDIA GPUs: "
            f"pip install '.[cuda13]', or '.[cuda12]' for drivers "
            f"before 580; docs/troubleshooting.md) or pass --jax.platform "
            f"cpu.") from None


def _pick(devices, indices, key):
    """The indices `key` names, checked against the devices."""
    chosen = []
    for index in indices:
        if not 0 <= index < len(devices):
            raise PlatformError(
                f'{key} names device {index}, but only {len(devices)} '
                f'{devices[0].platform} devices exist (set jax.mock_devices '
                f'to fake more on CPU).')
        chosen.append(index)
    if not chosen:
        raise ValueError(f'{key} is empty; name at least one device.')
    return tuple(chosen)


def _train_devices_every_host(jax, devices, indices, text):
    """The train mesh's devices with several processes: on every host the
    devices `indices` name there, and for a mesh of fixed sizes, as many
    per host as its share of the mesh needs (named ones first)."""
    import math
    count = jax.process_count()
    sizes = meshlib.parse(text, 'jax.train_mesh')
    per_host = None
    if -1 not in sizes:
        need = math.prod(sizes)
        if need % count:
            raise meshlib.LayoutError(
                f"jax.train_mesh '{text}' spans {need} devices, which do not "
                f"split evenly over the {count} replicas' hosts.")
        per_host = need // count
    chosen = []
    for process in range(count):
        mine = [d for d in devices if d.process_index == process]
        named = [mine[i] for i in _pick(mine, indices, 'jax.train_devices')]
        if per_host is not None:
            if per_host > len(mine):
                raise meshlib.LayoutError(
                    f"jax.train_mesh '{text}' needs {per_host} devices on "
                    f"each of the {count} hosts, but a host has "
                    f"{len(mine)}.")
            named = (named + [d for d in mine if d not in named])[:per_host]
        chosen += named
    return tuple(chosen)


def _distributed():
    """Whether this process is one of a run's replicas: joined, or kept
    local (`distributed.stay_local`)."""
    try:
        from embodied.jax import distributed
        return distributed.started() or distributed.local()
    except ImportError:
        return False


def _dtype(jax, name, platform):
    import jax.numpy as jnp
    if name == 'auto':
        return jnp.float32 if platform == 'cpu' else jnp.bfloat16
    return getattr(jnp, name)


def _enable_cache(jax, logdir):
    """A persistent compilation cache shared by runs and tests.

    $EMBODIED_JAX_CACHE, else ~/.cache/embodied/jax (else the logdir when the
    home folder cannot be written); `off` turns it off. It holds every
    program this process compiles, lazily jitted or lowered and compiled
    ahead of time, so reruns load them instead of compiling. Where the
    `filelock` package is installed, the least recently used entries go once
    it holds more than $EMBODIED_JAX_CACHE_GB (default 4) GiB; without it
    JAX cannot evict and the folder grows until deleted. On a GPU the folder
    also keeps the autotuner's results (see `_enable_xla_caches`). Every
    replica of a run writes its programs there, not only replica 0 (see
    `_every_process_writes`).
    """
    _every_process_writes()
    current = jax.config.jax_compilation_cache_dir
    if current:
        return current
    setting = os.environ.get('EMBODIED_JAX_CACHE', '')
    if setting.lower() == CACHE_OFF:
        jax.config.update('jax_enable_compilation_cache', False)
        return ''
    candidates = []
    if setting:
        candidates.append(setting)
    candidates.append(str(pathlib.Path('~/.cache/embodied/jax').expanduser()))
    if logdir and '://' not in str(logdir):
        candidates.append(str(pathlib.Path(str(logdir)).expanduser() / 'jaxcache'))
    for path in candidates:
        try:
            pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        jax.config.update('jax_compilation_cache_dir', path)
        jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
        jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
        _enable_xla_caches(jax)
        if importlib.util.find_spec('filelock'):  # JAX evicts only with it
            jax.config.update(
                'jax_compilation_cache_max_size', _cache_bytes())
        return path
    return ''


def _enable_xla_caches(jax):
    """Keeps XLA's autotuning results in the cache folder (`XLA_CACHES`),
    where this JAX has the option and $JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES
    does not choose otherwise."""
    name = 'jax_persistent_cache_enable_xla_caches'
    if name not in jax.config.values or name.upper() in os.environ:
        return
    jax.config.update(name, XLA_CACHES)


def _every_process_writes():
    """Lets the process of every replica write what it compiles to the
    cache. JAX writes only process 0's programs (so that hosts do not
    contend for one remote folder), yet the other replicas cannot load
    those: on CPU a program's key holds its process's own devices, and the
    programs of a replica's own devices (its policy) name them anywhere.
    Without this, every replica but 0 compiles all of its programs anew at
    each launch, a resume or a requeued job too. Wraps `_cache_write` of
    `jax._src.compiler` where its arguments are the known ones; process
    0's writes and JAX's other rules (host callbacks, the minimum compile
    time) stay JAX's."""
    import inspect
    from jax._src import compilation_cache
    from jax._src import compiler
    from jax._src import distributed
    original = getattr(compiler, '_cache_write', None)
    if original is None or getattr(original, 'every_process', False):
        return
    expected = ['cache_key', 'compile_time_secs', 'module_name', 'backend',
                'executable', 'host_callbacks']
    if (list(inspect.signature(original).parameters) != expected
            or not hasattr(compilation_cache, 'put_executable_and_time')):
        return

    def write(cache_key, compile_time_secs, module_name, backend,
              executable, host_callbacks):
        import jax
        minimum = jax.config.jax_persistent_cache_min_compile_time_secs
        if (distributed.global_state.process_id in (0, None)
                or host_callbacks or compile_time_secs < minimum):
            return original(cache_key, compile_time_secs, module_name,
                            backend, executable, host_callbacks)
        try:
            compilation_cache.put_executable_and_time(
                cache_key, module_name, executable, backend,
                int(compile_time_secs))
        except Exception as e:  # As JAX: a failed write is no failed run.
            import warnings
            warnings.warn(
                f'Error writing persistent compilation cache entry for '
                f"'{module_name}': {type(e).__name__}: {e}")

    write.every_process = True
    compiler._cache_write = write


def _cache_bytes():
    value = os.environ.get('EMBODIED_JAX_CACHE_GB', str(CACHE_GB))
    try:
        gigabytes = float(value)
    except ValueError:
        raise ValueError(
            f"EMBODIED_JAX_CACHE_GB must be a number of GiB, not '{value}'.")
    return int(gigabytes * 2 ** 30) if gigabytes > 0 else -1
