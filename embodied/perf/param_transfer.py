"""How long the policy's parameters take from the learner's device to the
host and back to a device, through the shared-memory buffer a policy
process reads (`embodied.jax.param_sync`), at real model sizes.

    python -m embodied.perf.param_transfer                 # size12m, default size
    python -m embodied.perf.param_transfer --sets debug --repeats 5

For each parameter set (`--sets`: names of config block lists, see
`SETS`) the shapes of DreamerV3's policy parameters (`policy_keys`) come
from an abstract trace of the agent's init (no compile, no memory), and
arrays of those shapes are made on the first device of `--platform`. Then,
`--repeats` times each, medians reported:

- `d2h`: every array to the host, into a slot of the buffer
  (`param_sync.to_host`): plain (`np.asarray` of the device array), and
  through JAX's pinned host memory where the device offers it;
- `h2d`: from the buffer's slot back to the device, copied and waited for
  (`param_sync.to_device`), plain and through pinned host memory;
- `round trip`: a `Publisher` write plus a `Subscriber` read of one
  generation, as a policy process receives it.

On CPU the "device" is host memory too: the figures are memory copies,
the cost a CPU run pays; on a GPU they cross PCIe or NVLink-C2C.
`--markdown FILE` also writes the table.
"""

import argparse
import pathlib
import re
import statistics
import sys
import time

import numpy as np

# The parameter sets: the config blocks of each (`embodied.main`'s
# `--configs`). `default` is the default model size (the `defaults` block's
# DreamerV3, size200m) at Atari's spaces.
SETS = {
    'debug': ('debug',),
    'size12m': ('atari', 'size12m'),
    'default': ('atari',),
}


def make_parser():
    parser = argparse.ArgumentParser(
        description=' '.join(__doc__.split('\n\n')[0].split()))
    parser.add_argument('--sets', nargs='+', default=['size12m', 'default'],
                        choices=sorted(SETS))
    parser.add_argument('--platform', default='auto',
                        help="jax.platform of the arrays ('auto': cuda if "
                             'present, else cpu)')
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--markdown', default='')
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    rows = []
    device = None
    for name in args.sets:
        shapes = policy_shapes(SETS[name], args.platform)
        figures, device = measure(shapes, args.platform, args.repeats)
        rows.append((name, shapes, figures))
        print(f'{name}: {format_row(figures)}', flush=True)
    table = render(args, device, rows)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')
    return 0


def policy_shapes(blocks, platform='cpu'):
    """{name: (shape, dtype)} of DreamerV3's policy parameters at the
    config blocks `blocks`, from an abstract trace of its init."""
    shapes, policy_keys = state_shapes(blocks, platform)
    pattern = re.compile(policy_keys)
    return {k: v for k, v in shapes.items() if pattern.search(k)}


def state_shapes(blocks, platform='cpu'):
    """`({name: (shape, dtype)}, policy_keys)`: every entry of DreamerV3's
    state (parameters and optimizer state) at the config blocks `blocks`,
    from an abstract trace of its init, and the regex of the parameters
    its policy reads."""
    from embodied import main as mainlib
    from embodied import factories
    config = mainlib.parse(['--configs', *blocks, '--jax.platform', platform,
                            '--logdir', '/tmp/unused-param-transfer'])
    import jax
    import ninjax as nj
    import elements
    from embodied.jax import agent as agentlib
    from embodied.jax import nets
    from embodied.jax import runtime as runtimelib
    runtime = runtimelib.setup(config.jax)
    nets.COMPUTE_DTYPE = runtime.compute_dtype
    env = factories.make_env(config, 0)
    obs = {k: v for k, v in env.obs_space.items() if not k.startswith('log/')}
    act = {k: v for k, v in env.act_space.items() if k != 'reset'}
    env.close()
    obs, act = agentlib._plain_spaces(obs), agentlib._plain_spaces(act)
    cls = factories._import(factories.agent_path(config.agent_impl))
    agent_config = elements.Config(
        **config.agent, seed=0, jax=config.jax, batch_size=1,
        batch_length=config.batch_length, replay_context=config.replay_context,
        report_length=config.report_length, replica=0, replicas=1)
    model = object.__new__(cls)
    with agentlib.TRACE_LOCK:
        model.__init__(obs, act, agent_config)
    length = config.batch_length + config.replay_context
    spaces = {**obs, **act, **dict(model.ext_space)}
    data = {k: jax.ShapeDtypeStruct((1, length, *v.shape), v.dtype)
            for k, v in spaces.items()}
    init_train, train = nj.pure(model.init_train), nj.pure(model.train)

    def init(seed, data):
        state, carry = init_train({}, 1, seed=seed, create=True, modify=True)
        state, _ = train(state, carry, data, seed=seed, create=True,
                         modify=True, ignore=True)
        return state

    with agentlib.TRACE_LOCK:
        state = jax.eval_shape(
            init, jax.ShapeDtypeStruct((2,), np.uint32), data)
    return {k: (tuple(v.shape), np.dtype(v.dtype))
            for k, v in state.items()}, model.policy_keys


def measure(shapes, platform, repeats):
    """The medians of each transfer, in ms, and the device's name."""
    import jax
    from embodied.jax import param_sync
    from embodied.rpc import shared_params
    device = jax.devices(None if platform == 'auto' else platform)[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    rng = np.random.default_rng(0)
    params = {k: jax.device_put(rng.standard_normal(s).astype(d), sharding)
              for k, (s, d) in shapes.items()}
    jax.block_until_ready(params)
    pinned = param_sync.pinned_available(next(iter(params.values())))
    layout = shared_params.layout_of(params)
    writer = shared_params.ParamWriter(layout)
    reader = shared_params.ParamReader(writer.path, layout)
    try:
        slot = reader._mapped.slots[0]
        times = {}
        for kind in (False, True) if pinned else (False,):
            suffix = ' pinned' if kind else ''
            times[f'd2h{suffix}'] = timed(
                lambda: param_sync.to_host(params, slot, kind), repeats)
            times[f'h2d{suffix}'] = timed(
                lambda: param_sync.to_device(slot, sharding, kind), repeats)
        times['round trip'] = round_trip(params, sharding, repeats)
    finally:
        reader.close()
        writer.close()
    mib = sum(np.dtype(d).itemsize * int(np.prod(s))
              for s, d in shapes.values()) / 2**20
    return dict(mib=mib, arrays=len(shapes), pinned=pinned, **times), str(
        device)


def round_trip(params, sharding, repeats):
    """Median ms from a publisher's write of a new generation to the
    subscriber's install of it on the device."""
    from embodied.jax import param_sync
    state = {'version': 0}
    publisher = param_sync.Publisher(
        lambda: (state['version'], params), lambda: 0, poll=3600)
    subscriber = param_sync.Subscriber(
        publisher.path, publisher.layout, sharding, lambda p, v: None)
    try:
        subscriber.update()

        def once():
            state['version'] += 1
            publisher._write(*publisher.source())
            assert subscriber.update()
        return timed(once, repeats)
    finally:
        subscriber.close()
        publisher.close()


def timed(fn, repeats):
    fn()  # Warm-up: first transfers allocate.
    values = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        values.append(1000 * (time.perf_counter() - start))
    return statistics.median(values)


def format_row(figures):
    cells = [f"{figures['mib']:.1f} MiB in {figures['arrays']} arrays"]
    cells += [f'{k} {v:.2f} ms ({figures["mib"] / 1024 / (v / 1000):.1f} '
              f'GiB/s)' for k, v in figures.items()
              if k not in ('mib', 'arrays', 'pinned')]
    return ', '.join(cells)


COLUMNS = ('d2h', 'd2h pinned', 'h2d', 'h2d pinned', 'round trip')


def render(args, device, rows):
    lines = [
        f'Policy parameters device -> host -> device on {device}, medians of '
        f'{args.repeats}, {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}'
        f' (ms; GiB/s in brackets):', '',
        '| parameters | MiB | ' + ' | '.join(COLUMNS) + ' |',
        '|' + '---|' * (len(COLUMNS) + 2)]
    for name, _, figures in rows:
        cells = []
        for column in COLUMNS:
            value = figures.get(column)
            cells.append('not offered' if value is None else (
                f'{value:.2f} ({figures["mib"] / 1024 / (value / 1000):.1f})'))
        blocks = ' '.join(SETS[name])
        lines.append(f'| {name} (`{blocks}`) | {figures["mib"]:.2f} | '
                     + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
