"""The README's first screen and the links into ``docs/`` (issue 44).

A newcomer reads the README's first screen: what mmeffvit is, the two commands for a fresh machine
and a config example; details live in ``docs/``. Every path into ``docs/`` that the documents,
the code's docstrings and the tools name must exist, so moving a document cannot leave a
dangling reference behind.
"""
import glob
import os.path as osp
import re

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
README = osp.join(REPO, 'README.md')
COMMANDS = ('bash tools/install.sh && python tools/demo.py',
            'bash tools/install.sh && python -m pytest tests')
#: files a tool writes on request, named as its default output, not documents to link
WRITTEN_ON_REQUEST = {'docs/benchmarks_detectors.md'}
DOCS_PATH = re.compile(r'(?<![\w/.])docs/[\w./*<>{}-]*')
MD_LINK = re.compile(r'\]\(([^)#\s]+)')


def _readme_lines():
    with open(README, encoding='utf-8') as f:
        return f.read().splitlines()


def _documents():
    """Markdown documents, and the sources whose docstrings and help texts point into docs/."""
    patterns = ['README.md', 'CONTRIBUTING.md', 'docs/**/*.md', 'configs/**/*.md',
                'mmeffvit/**/*.py', 'mmeffvit/ops/csrc/**/*.[ch]*', 'tools/**/*.py',
                'tools/**/*.sh', 'tests/*.py']
    for pattern in patterns:
        for path in sorted(glob.glob(osp.join(REPO, pattern), recursive=True)):
            if osp.abspath(path) != osp.abspath(__file__):  # this file names missing paths
                yield path


def docs_paths(text):
    """The concrete paths into docs/ that a text names (globs and placeholders left out)."""
    for match in DOCS_PATH.findall(text):
        path = match.rstrip('.,;:)')
        if not any(c in path for c in '*<>{}') and path != 'docs/':
            yield path


def test_readme_first_screen():
    lines = _readme_lines()
    assert len(lines) <= 260, f'README.md has {len(lines)} lines; details belong in docs/'
    for command in COMMANDS:
        where = [i for i, line in enumerate(lines, 1) if command in line]
        assert where and where[0] <= 60, f'{command!r} is not within the first 60 lines'
    first_screen = '\n'.join(lines[:40])
    for family_type in ('FLattenPVT', 'LaViT', 'CARE', 'L2ViT', 'FocalTransformer'):
        assert f'`{family_type}`' in first_screen, family_type
    assert "custom_imports = dict(imports=['mmeffvit']" in first_screen
    assert "type='FLattenPVT'" in first_screen


def test_optimisation_logs_under_docs_logs():
    top = {osp.basename(p) for p in glob.glob(osp.join(REPO, 'docs', 'profiles*'))}
    assert not top, f'optimisation logs belong under docs/logs/: {sorted(top)}'
    assert osp.isfile(osp.join(REPO, 'docs', 'logs', 'profiles.md'))
    assert osp.isfile(osp.join(REPO, 'docs', 'ops.md'))


def test_docs_paths_exist():
    dangling = []
    for path in _documents():
        with open(path, encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                for target in docs_paths(line):
                    if target not in WRITTEN_ON_REQUEST and not osp.exists(osp.join(REPO, target)):
                        dangling.append(f'{osp.relpath(path, REPO)}:{number}: {target}')
    assert not dangling, '\n'.join(dangling)


def test_markdown_relative_links_exist():
    dangling = []
    for path in _documents():
        if not path.endswith('.md'):
            continue
        with open(path, encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                for target in MD_LINK.findall(line):
                    if re.match(r'[a-z]+:', target):  # http:, https:, mailto:
                        continue
                    if not osp.exists(osp.normpath(osp.join(osp.dirname(path), target))):
                        dangling.append(f'{osp.relpath(path, REPO)}:{number}: {target}')
    assert not dangling, '\n'.join(dangling)


def test_the_checks_see_a_dangling_path():
    """The scanners find what they are meant to find (a check that cannot fail proves nothing)."""
    names = list(docs_paths('see `docs/profiles.md`, and docs/logs/ or docs/images/x_*.png.'))
    assert names == ['docs/profiles.md', 'docs/logs/']
    assert not osp.exists(osp.join(REPO, 'docs', 'profiles.md'))
    assert MD_LINK.findall('![x](docs/images/a.png) [y](https://a.b/c) [z](#anchor)') == [
        'docs/images/a.png', 'https://a.b/c']
