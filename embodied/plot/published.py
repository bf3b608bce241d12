"""DreamerV3's published runs, shipped as package data (`data/`: the
original's `scores/*-dreamerv3.json.gz` at revision e3f0224, MIT-licensed,
credited in `data/README.md`), and the normalization ranges of the
paper's aggregates."""

import functools
import pathlib

from . import scores

FOLDER = pathlib.Path(__file__).resolve().parent / 'data'
METHOD = 'dreamerv3'
# The suites DreamerV3 published, as its files name them.
SUITES = ('atari100k', 'atari57', 'dmc_proprio', 'dmc_vision', 'dmlab30',
          'minecraft_diamond', 'procgen')
# Our config blocks whose published suite has another name.
BLOCKS = {'atari': 'atari57', 'dmlab': 'dmlab30',
          'minecraft': 'minecraft_diamond'}


def suite_name(name):
    """The published suite of a suite or config block name, or None."""
    name = BLOCKS.get(name, name)
    return name if name in SUITES else None


def path(suite):
    """The shipped file of DreamerV3's runs of `suite` (a suite or a config
    block name, e.g. `dmc_proprio` or `atari`)."""
    name = suite_name(suite)
    if not name:
        raise ValueError(
            f"No published runs of '{suite}': DreamerV3 published "
            f"{', '.join(SUITES)} (or name a {scores.SUFFIX} file).")
    return FOLDER / f'{name}-{METHOD}{scores.SUFFIX}'


def load(source):
    """The Records of a published suite's name or of a scores file's path."""
    if str(source).endswith(scores.SUFFIX):
        return scores.read(source)
    return scores.read(path(source))


def block(suite):
    """Our config block that runs a published suite."""
    name = suite_name(suite)
    return {v: k for k, v in BLOCKS.items()}.get(name, name)


@functools.cache
def normalization():
    """{table: {task: (low, high)}}: `atari57_gamer`, `dmlab30` and
    `procgen_hard`, as the original's baselines.yaml gives them."""
    import ruamel.yaml as yaml
    text = (FOLDER / 'normalization.yaml').read_text()
    tables = yaml.YAML(typ='safe').load(text)
    return {name: {task: (float(lo), float(hi)) for task, (lo, hi) in rows.items()}
            for name, rows in tables.items()}
