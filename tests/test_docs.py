"""The documentation site builds: `mkdocs build --strict` fails on a broken
link or anchor, a page missing from the navigation or a nav entry without a
page. README.md is not part of the site, so its links to the pages are
checked here."""

import re
import subprocess
import sys

import pytest

import launch

pytest.importorskip('mkdocs')


def test_site_builds_in_strict_mode(tmp_path):
    site = tmp_path / 'site'
    result = subprocess.run(
        [sys.executable, '-m', 'mkdocs', 'build', '--strict',
         '--site-dir', str(site)],
        cwd=launch.ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    for page in (launch.ROOT / 'docs').glob('*.md'):
        name = 'index.html' if page.stem == 'index' else f'{page.stem}/index.html'
        assert (site / name).exists(), page


def anchors(page):
    """The heading anchors of a page, as mkdocs and GitHub make them."""
    from markdown.extensions.toc import slugify
    text = re.sub(r'```.*?```', '', page.read_text(), flags=re.S)
    return {slugify(heading.replace('`', ''), '-')
            for heading in re.findall(r'^#+ (.+)$', text, re.M)}


def test_readme_links_reach_pages_and_headings():
    readme = (launch.ROOT / 'README.md').read_text()
    links = re.findall(r'\]\(([^)\s]+)\)', readme)
    local = [link for link in links if not re.match(r'\w+://', link)]
    assert local, links
    for link in local:
        path, _, anchor = link.partition('#')
        target = launch.ROOT / (path or 'README.md')
        assert target.exists(), link
        if anchor:
            assert anchor in anchors(target), (link, sorted(anchors(target)))


DOC_FILES = [launch.ROOT / 'README.md', *sorted((launch.ROOT / 'docs').glob('*.md'))]
# Backticked names under a config section that are JAX's own API, not keys.
JAX_API = re.compile(r'jax\.(random|distributed|make_array|numpy|export|lax|jit|devices|config)\b')
# Keys that a factory of the user's own defines (docs/own-environment.md).
OWN_ENV_KEY = re.compile(r'env\.own(\.\w+)?$')


def backticked(text):
    return re.findall(r'`([^`\s]+)`', text)


# Backticked names with these ends are files (`agent.json`), not keys.
FILE_SUFFIXES = ('.py', '.json', '.pkl', '.safetensors')


def unknown_keys(text):
    """Backticked `section.key` names in `text` that are no config key (nor
    a mapping of keys, like `run.usage`)."""
    from embodied import config as configlib
    flat = set(configlib.build([]).flat)
    sections = {key.split('.', 1)[0] for key in flat if '.' in key}
    prefixes = {'.'.join(key.split('.')[:end]) for key in flat
                for end in range(1, key.count('.') + 1)}
    unknown = []
    for name in backticked(text):
        name = name.split('=', 1)[0].rstrip('.,:;')
        head = name.split('.', 1)[0]
        if head not in sections or '.' not in name or JAX_API.match(name) or (
                OWN_ENV_KEY.match(name)):
            continue
        if name.endswith(FILE_SUFFIXES) or not re.fullmatch(r'[\w.]+', name):
            continue
        if name not in flat and name not in prefixes:
            unknown.append(name)
    return unknown


def missing_paths(text):
    """Backticked repository paths in `text` that do not exist."""
    pattern = r'(?:embodied|configs|docs|examples|tests)/[\w./-]*\w|Dockerfile'
    return [path for name in backticked(text)
            for path in re.findall(rf'^(?:{pattern})$', name)
            if not (launch.ROOT / path).exists()]


def test_config_keys_named_in_the_docs_exist():
    missing = [f'{page.name}: {name}' for page in DOC_FILES
               for name in unknown_keys(page.read_text())]
    assert not missing, missing


def test_repository_files_named_in_the_docs_exist():
    missing = [f'{page.name}: {path}' for page in DOC_FILES
               for path in missing_paths(page.read_text())]
    assert not missing, missing


def test_checks_catch_a_renamed_key_and_a_missing_file():
    text = ('Set `run.envs` and `run.env_count`, see `rpc.auth`, '
            '`jax.random.split`, `examples/slurm.sbatch` and '
            '`examples/slurm-gone.sbatch`.')
    assert unknown_keys(text) == ['run.env_count']
    assert missing_paths(text) == ['examples/slurm-gone.sbatch']


def test_key_reference_matches_the_yaml():
    from embodied import config_reference
    page = launch.ROOT / 'docs' / 'configs.md'
    text = page.read_text()
    wanted = config_reference.replace_generated(
        text, config_reference.markdown())
    assert text == wanted, (
        'docs/configs.md is out of date with configs/*.yaml: run '
        'python -m embodied.config_reference --write')
