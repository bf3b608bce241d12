"""Finds and merges the YAML config blocks under `configs/`.

Every `*.yaml` file in the config folder holds named blocks (`defaults`,
`debug`, task and model-size blocks). A block may appear in several files (an
agent's file adds its `agent` keys to `defaults`); the parts are merged, and a
key defined twice for the same block is an error. The folder is the top-level
`configs/` of a checkout, or `embodied/configs/` inside an installed wheel.
"""

import difflib
import importlib.resources
import pathlib

import elements
import ruamel.yaml as yaml


class UsageError(Exception):
    """A bad command line or config value; the message says which."""


# Keys renamed since they shipped: old name -> new name. The command line,
# config blocks and a saved run's config.yaml may still use the old name.
RENAMED = {
    'run.policy_process': 'run.policy_worker',
}


def renamed_flags(argv):
    """`argv` with each flag of an old key name spelled with the new one."""
    result = []
    for arg in argv:
        if arg.startswith('--'):
            name, sep, value = arg[2:].partition('=')
            base = name.rstrip('+')
            if base in RENAMED:
                arg = '--' + RENAMED[base] + name[len(base):] + sep + value
        result.append(arg)
    return result


def renamed_keys(flat):
    """A flat {key: value} mapping with old key names replaced by new ones."""
    return {RENAMED.get(key, key): value for key, value in flat.items()}


def config_dir():
    packaged = importlib.resources.files('embodied') / 'configs'
    if packaged.is_dir():
        return pathlib.Path(str(packaged))
    checkout = pathlib.Path(__file__).resolve().parent.parent / 'configs'
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        f'No config folder found at {packaged} or {checkout}.')


def load_blocks(directory=None):
    """Returns {block name: nested dict} merged over all YAML files."""
    directory = pathlib.Path(directory or config_dir())
    blocks, origin = {}, {}
    files = sorted(directory.glob('*.yaml'))
    if not files:
        raise FileNotFoundError(f'No *.yaml config files in {directory}.')
    for filename in files:
        content = yaml.YAML(typ='safe').load(filename.read_text()) or {}
        for name, block in content.items():
            block = block or {}
            if not isinstance(block, dict):
                raise TypeError(
                    f"Config block '{name}' in {filename} must be a mapping.")
            flat = renamed_keys(_flatten(block))
            for key in flat:
                if (name, key) in origin:
                    raise ValueError(
                        f"Config key '{key}' of block '{name}' is defined in "
                        f"both {origin[name, key]} and {filename}.")
                origin[name, key] = filename
            blocks.setdefault(name, {}).update(flat)
    return blocks


def build(names, blocks=None):
    """Applies the blocks in order on top of `defaults`."""
    blocks = blocks or load_blocks()
    config = elements.Config(_nest_plain(blocks['defaults']))
    for name in names:
        if name == 'defaults':
            continue
        if name not in blocks:
            close = difflib.get_close_matches(name, list(blocks), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ''
            raise KeyError(
                f"Unknown config block '{name}' (--configs).{hint} "
                f"Known blocks: {', '.join(sorted(blocks))}.")
        try:
            config = config.update(blocks[name])
        except KeyError as e:
            raise KeyError(f"Config block '{name}': {e.args[0]}") from None
    return config


def _flatten(mapping, prefix=''):
    result = {}
    for key, value in mapping.items():
        key = f'{prefix}.{key}' if prefix else str(key)
        if isinstance(value, dict) and not _is_pattern(key):
            result.update(_flatten(value, key))
        else:
            result[key] = value
    return result


def _nest_plain(flat):
    result = {}
    for key, value in flat.items():
        node = result
        parts = key.split('.')
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return result


def _is_pattern(key):
    return bool(elements.Config.IS_PATTERN.match(key))
