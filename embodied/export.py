"""A trained agent in one file: what acting needs, and nothing that runs code.

    python -m embodied.export LOGDIR FILE   # e.g. agent.safetensors
    policy = embodied.load_policy(FILE)      # no logdir, no env package

The file is a safetensors file (`core.tensorfile`): the arrays are the
policy's parameters (the agent's `policy_keys`; no optimizer state, no
world-model decoder) and the positions of its random streams, named as the
agent names them, and its metadata holds, as JSON, the run's config, the
agent's name (`agent_impl`), the agent's observation and action spaces,
the env's own action space before the run's wrappers (`env_act_space`),
the structure of the arrays and a format version. `load_policy(FILE)`
builds the agent from these alone, so the machine that acts needs the
agent's code but neither the logdir nor the env's package, and acts as
from the logdir (the same parameters and random streams). An agent that is
not an `embodied.jax.Agent` (the numpy test agent) is exported whole.
"""

import argparse
import json
import os
import re
import sys

import elements
import numpy as np

from embodied.core import checkpoint as cplib
from embodied.core import savetree
from embodied.core import tensorfile

FORMAT = 'embodied.policy'
VERSION = 1
TRUST_FLAG = '--trust_pickle'


class NotAnExport(ValueError):
    """A file that is not a policy file of this format; says why."""


class Exported:
    """A policy file read back: `config` (the run's), `agent` (its
    `agent_impl`), `obs_space` and `act_space` (the agent's),
    `env_act_space` (the env's own, before the run's wrappers), `data`
    (for `agent.load`), `load_regex` (the entries it holds; None: all),
    `step` (of the save it came from) and `version`."""

    def __init__(self, meta, data):
        self.version = int(meta['version'])
        self.agent = meta['agent']
        self.config = elements.Config(meta['config'])
        self.obs_space = spaces_from_json(meta['obs_space'])
        self.act_space = spaces_from_json(meta['act_space'])
        self.env_act_space = spaces_from_json(meta['env_act_space'])
        self.load_regex = meta.get('load_regex')
        self.step = meta.get('step')
        self.data = data

    def make_env(self, config, index):
        """An env factory for `factories.make_agent` with the agent's
        spaces (it cannot step)."""
        return _Spaces(self.obs_space, self.act_space)

    def load_into(self, agent):
        agent.load(self.data, self.load_regex)


def is_export(path):
    """Whether `path` names a file (an export) rather than a folder."""
    return os.path.isfile(os.path.expanduser(str(path)))


def export(path, file, make_env=None, config=None, trust_pickle=False,
           trust_key='trust_pickle=True'):
    """Writes the policy of the agent saved at `path` (a logdir, its
    ckpt/agent folder or one save folder, as `load_policy` takes) to the
    new file `file`; returns its size in bytes. `make_env` and `config`
    as for `load_policy`; `trust_pickle` reads a save written as a pickle
    (the file holds none)."""
    from embodied import factories
    from embodied import policy as policylib
    from embodied.run import saving
    try:
        folder = saving.agent_save_folder(path)
        run_config = policylib.run_config(path, config)
    except FileNotFoundError as e:
        message = re.sub(r'^(run\.from_checkpoint|load_policy): ', '', str(e))
        raise FileNotFoundError(f'export: {message}') from None
    seen = {}

    def recording(config, index):
        env = (make_env or factories.make_env)(config, index)
        seen.setdefault('act', own_act_space(env))
        return env

    agent, _, _ = policylib.build_agent(
        path, 'cpu', 1, recording, run_config, trust_pickle, trust_key)
    data, regex = policy_entries(agent)
    tree, arrays = savetree.split(data, 'agent')
    meta = {
        'format': FORMAT, 'version': VERSION,
        'agent': run_config.agent_impl,
        'config': dict(run_config.flat),
        'obs_space': spaces_to_json(agent.obs_space),
        'act_space': spaces_to_json(agent.act_space),
        'env_act_space': spaces_to_json(
            {k: v for k, v in seen['act'].items() if k != 'reset'}),
        'load_regex': regex,
        'step': int(folder.name) if folder.name.isdigit() else None,
        'tree': tree,
    }
    return write(file, meta, arrays)


def write(file, meta, arrays):
    """Writes the policy file `file` (atomically); returns its size."""
    metadata = {'format': FORMAT, 'version': str(VERSION),
                'embodied': json.dumps(meta)}
    file = os.path.expanduser(str(file))
    folder = os.path.dirname(os.path.abspath(file))
    os.makedirs(folder, exist_ok=True)
    size = []
    cplib.write_atomic(file, lambda f: size.append(
        tensorfile.write(f, arrays, metadata)))
    return size[0]


def read(file):
    """The `Exported` policy in `file`; raises NotAnExport saying why not."""
    file = os.path.expanduser(str(file))
    try:
        arrays, metadata = tensorfile.read(file)
    except tensorfile.FormatError as e:
        raise NotAnExport(
            f'{file} is not a policy file of `python -m embodied.export`: '
            f'{e}') from None
    if metadata.get('format') != FORMAT:
        raise NotAnExport(
            f'{file} is a safetensors file but not a policy of `python -m '
            f'embodied.export` (its metadata has no format {FORMAT}).')
    try:
        meta = json.loads(metadata['embodied'])
        if int(meta['version']) > VERSION:
            raise NotAnExport(
                f'{file} is a policy file of format {meta["version"]}, '
                f'written by a newer embodied; this one reads {VERSION}.')
        return Exported(meta, savetree.join(meta['tree'], arrays))
    except NotAnExport:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise NotAnExport(
            f'{file}: its metadata is not that of a policy file '
            f'({type(e).__name__}: {e}).') from None


def policy_entries(agent):
    """`(data, regex)`: the entries of `agent.save()` that acting needs
    and the regex that loads exactly those (None: everything). For an
    `embodied.jax.Agent`, the parameters its policy reads
    (`policy_keys`) and the random streams' positions."""
    data = agent.save()
    model = getattr(agent, 'model', None)
    keys = getattr(model, 'policy_keys', None)
    if not isinstance(keys, str) or not isinstance(data, dict):
        return data, None
    regex = f'(?:{keys})|^rng/'
    pattern = re.compile(regex)
    return {k: v for k, v in data.items() if pattern.search(k)}, regex


def own_act_space(env):
    """The action space of `env` before the run's wrappers
    (`factories.wrap_env`): the env's own, as its adapter gives it."""
    from embodied.core import wrappers
    kinds = (wrappers.NormalizeAction, wrappers.UnifyDtypes,
             wrappers.CheckSpaces, wrappers.ClipAction)
    while isinstance(env, kinds):
        env = env.env
    return dict(env.act_space)


def spaces_to_json(spaces):
    return {k: space_to_json(v) for k, v in spaces.items()}


def spaces_from_json(data):
    return {k: space_from_json(v) for k, v in data.items()}


def space_to_json(space):
    """An `elements.Space` as JSON: dtype, shape, and its bounds (one
    number where all are equal)."""
    result = {'dtype': np.dtype(space.dtype).name, 'shape': list(space.shape)}
    for name in ('low', 'high'):
        value = getattr(space, name)
        if value is None:
            continue
        value = np.asarray(value)
        flat = value.reshape(-1)
        if flat.size and (flat == flat[0]).all():
            result[name] = flat[0].item()
        else:
            result[name] = value.tolist()
    return result


def space_from_json(data):
    dtype = np.dtype(data['dtype'])
    bounds = {k: np.asarray(data[k], dtype) for k in ('low', 'high')
              if k in data}
    return elements.Space(
        dtype, tuple(data['shape']), bounds.get('low'), bounds.get('high'))


class _Spaces:
    """An env that only has spaces (the agent's, from a policy file)."""

    def __init__(self, obs_space, act_space):
        self.obs_space = dict(obs_space)
        self.act_space = {**act_space, 'reset': elements.Space(bool)}

    def close(self):
        pass


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='python -m embodied.export',
        description='Writes the policy of a trained agent to one file '
                    '(safetensors, no pickle) that embodied.load_policy(FILE) '
                    'acts from without the logdir or the env package.')
    parser.add_argument('path', help="a run's logdir, its ckpt/agent folder "
                        'or one save folder')
    parser.add_argument('file', help='the file to write, e.g. '
                        'policy.safetensors')
    parser.add_argument('--config', default=None, help="the run's config.yaml "
                        'where path has none above it')
    parser.add_argument(TRUST_FLAG, action='store_true',
                        help='read an agent save written as a pickle (an '
                        'earlier version of embodied, DreamerV3): only for a '
                        'save you trust')
    args = parser.parse_args(argv)
    from embodied.config import UsageError
    try:
        size = export(args.path, args.file, config=args.config,
                      trust_pickle=args.trust_pickle, trust_key=TRUST_FLAG)
    except (FileNotFoundError, UsageError, cplib.PickleSave,
            savetree.Unsavable) as e:
        message = str(e).replace("(config=...)", "(--config FILE)")
        print(f'error: {message}', file=sys.stderr)
        return 2
    print(f'Wrote {args.file} ({size / 2**20:.2f} MiB).', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
