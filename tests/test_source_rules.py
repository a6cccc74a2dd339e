"""The tree's layering rules (CONTRIBUTING.md), read from the sources with ``ast``.

``mmeffvit/models/`` holds the models and no kernels: every path choice (device, instruction
set, environment, autograd Function) lives in ``mmeffvit/ops/`` behind one entry point per
operation; ``ops/`` never imports ``models/``; no backbone imports another; no two modules
import each other, directly or round a circle, not even by an import deferred into a function;
no source file is longer than ~600 lines.
"""
import ast
import os.path as osp
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'mmeffvit'
MODEL_FILES = sorted((PACKAGE / 'models').rglob('*.py'))
BACKBONES = PACKAGE / 'models' / 'backbones'


def dotted(node):
    """``a.b.c`` of an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return '.'.join(reversed(parts))
    return None


def kernel_choices(source):
    """``(line, what)`` of every kernel choice in a models/ source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = dotted(node) if isinstance(node, ast.Attribute) else None
        if name is not None:
            if name.startswith('torch.ops.mkldnn') or '.ops.mkldnn' in name:
                found.append((node.lineno, name))
            if name == 'os.environ':
                found.append((node.lineno, name))
        if isinstance(node, ast.Compare):
            for side in [node.left] + node.comparators:
                if isinstance(side, ast.Attribute) and side.attr == 'type' and (
                        isinstance(side.value, ast.Attribute) and side.value.attr == 'device'):
                    found.append((node.lineno, 'device.type comparison'))
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', '')
            if called.endswith('_applies'):
                found.append((node.lineno, f'{called}()'))
            if called in ('getenv', 'putenv'):
                found.append((node.lineno, f'os.{called}'))
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = dotted(base) or ''
                if name == 'Function' or name.endswith('autograd.Function'):
                    found.append((node.lineno, f'class {node.name}({name})'))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names]
            module = getattr(node, 'module', None) or ''
            if 'environ' in names or (module == 'torch.autograd' and 'Function' in names):
                found.append((node.lineno, f'import of {names}'))
    return found


@pytest.mark.parametrize('path', MODEL_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_models_choose_no_kernel(path):
    found = kernel_choices(path.read_text())
    assert not found, (f'{path.relative_to(ROOT)}: kernel choices belong in mmeffvit/ops/ behind '
                       f'an entry point: {found}')


@pytest.mark.parametrize('snippet,what', [
    ('torch.ops.mkldnn._linear_pointwise(x, w, b)', 'torch.ops.mkldnn'),
    ("if x.device.type == 'cpu': pass", 'device.type'),
    ("if 'cuda' != q.device.type: pass", 'device.type'),
    ('if onednn_applies(x, w): pass', '_applies()'),
    ('if ops.linear.onednn_applies(x, w): pass', '_applies()'),
    ("flag = os.environ.get('X')", 'os.environ'),
    ("flag = os.getenv('X')", 'os.getenv'),
    ('class F(torch.autograd.Function): pass', 'Function'),
    ('from torch.autograd import Function', 'import'),
])
def test_the_rule_sees_each_kind_of_choice(snippet, what):
    found = kernel_choices(snippet)
    assert found and any(what.split('(')[0] in w for _, w in found), found


def test_the_rule_allows_what_models_do():
    source = '''
with torch.autocast(device_type=x.device.type, enabled=False):
    y = ops.attention(q, k, v, scale=s)
class Block(nn.Module):
    pass
'''
    assert kernel_choices(source) == []


def imported_modules(path):
    """Absolute dotted names of the mmeffvit modules ``path`` imports."""
    package = '.'.join(path.relative_to(ROOT).with_suffix('').parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parent = package.split('.')[:len(package.split('.')) - node.level + 1]
                base = '.'.join(parent + ([base] if base else []))
            names.add(base)
            names.update(f'{base}.{a.name}' for a in node.names)
    return {n for n in names if n.startswith('mmeffvit')}


@pytest.mark.parametrize('below', ['ops', 'utils'])
def test_ops_and_utils_import_nothing_from_models(below):
    for path in sorted((PACKAGE / below).rglob('*.py')):
        wrong = {n for n in imported_modules(path) if n.startswith('mmeffvit.models')}
        assert not wrong, f'{path.relative_to(ROOT)} imports {wrong}'


def test_no_backbone_imports_another():
    families = {p.stem for p in BACKBONES.glob('*.py')} - {'__init__', 'base'}
    for path in sorted(BACKBONES.glob('*.py')):
        if path.stem == '__init__':
            continue
        others = {n for n in imported_modules(path)
                  if n.startswith('mmeffvit.models.backbones.')
                  and n.split('.')[3] in families - {path.stem}}
        assert not others, f'{path.relative_to(ROOT)} imports the backbones {others}'


def module_graph():
    """``{module: modules it imports}`` over mmeffvit, function-level imports included; a
    ``from package import name`` counts as the submodule where ``name`` is one."""
    files = {}
    for path in PACKAGE.rglob('*.py'):
        parts = path.relative_to(ROOT).with_suffix('').parts
        files['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == '__init__.py' else name.rpartition('.')[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parent = package.split('.')[:len(package.split('.')) - node.level + 1]
                    base = '.'.join(parent + ([base] if base else []))
                for alias in node.names:
                    full = f'{base}.{alias.name}'
                    edges.add(full if full in files else base)
        graph[name] = {e for e in edges if e in files} - {name}
    return graph


def circles(graph):
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert circles(module_graph()) == []


def test_circles_are_found():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}, 'e': set()}
    assert circles(graph) == [['a', 'b', 'c']]
    graph = module_graph()
    assert 'mmeffvit.engine.errors' in graph['mmeffvit.engine.launch']
    assert 'mmeffvit.models.backbones.base' in graph['mmeffvit.models.backbones.focal_transformer']


def test_source_files_stay_under_600_lines():
    suffixes = ('.py', '.cpp', '.cu', '.h', '.cuh')
    long = {str(p.relative_to(ROOT)): n for p in sorted(PACKAGE.rglob('*'))
            if p.suffix in suffixes and (n := len(p.read_text().splitlines())) > 600}
    assert not long, f'split these files (CONTRIBUTING.md): {long}'


def test_the_rules_read_the_tree():
    assert len(MODEL_FILES) > 20 and osp.isdir(BACKBONES)
    assert 'mmeffvit.ops' in imported_modules(BACKBONES / 'focal_transformer.py')
