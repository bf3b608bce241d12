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
