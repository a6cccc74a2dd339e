"""Generate ``docs/model_zoo.md`` from the code: every FLatten variant, its size, cost and configs.

For each arch of each FLatten backbone (``arch_settings`` of FLattenPVT, FLattenPVTv2,
FLattenSwin, FLattenCSWin, FLattenDeiT; plus Swin-B at 384², which is an arch with other
arguments) the table lists:

* parameters of the official ImageNet classifier (final norm and 1000-class head included, as the
  official code counts them) and of the dense-prediction backbone (the arguments the configs use:
  out-norms of all four stages; DeiT with its ViTDet pyramid);
* GMACs of the classifier at its ImageNet resolution and of the dense backbone at the detection
  input 800×1333, both counted by :mod:`mmeffvit.analysis` (mmengine's FlopAnalyzer);
* the configs in the family folders of ``configs/`` whose backbone is that variant and the
  checkpoint they load
  (``pretrained = ...``), with whether the official release has it.

Configs are read without building them (a Python-literal reading of their ``model.backbone`` and
``pretrained``, following local ``_base_`` files), which is fast; ``tests/test_model_zoo.py``
compares that reading with mmengine's ``Config`` on some configs. Usage::

    python tools/analysis/model_zoo.py            # rewrite docs/model_zoo.md (minutes on a CPU)
    python tools/analysis/model_zoo.py --check    # exit 1 with a diff if the file is stale
    python tools/analysis/model_zoo.py --keep-gmacs  # only configs / params changed: seconds
"""
import argparse
import ast
import difflib
import glob
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

import mmeffvit  # noqa: E402,F401  registers the backbones
from mmeffvit.analysis import build_backbone, build_classifier, count_params  # noqa: E402
from mmeffvit.analysis.models import cached_backbone_complexity  # noqa: E402

DOC = osp.join(REPO_ROOT, 'docs', 'model_zoo.md')
CONFIG_DIR = osp.join(REPO_ROOT, 'configs')
DET_SHAPE = (800, 1333)
FAMILIES = ('FLattenPVT', 'FLattenPVTv2', 'FLattenSwin', 'FLattenCSWin', 'FLattenDeiT')
#: variants that are an arch with other constructor arguments (name suffix, arch, kwargs)
EXTRA_VARIANTS = {'FLattenSwin': [('B@384', 'base', dict(pretrain_img_size=384, window_size=12))]}
#: ImageNet checkpoints the official FLatten-Transformer repository released (README, renewed
#: 2023-09-18; flatten.md sec. 3): a fact about the release, not computable from the code
RELEASED = {('FLattenPVT', 'T'), ('FLattenPVTv2', 'B0'), ('FLattenSwin', 'T'),
            ('FLattenSwin', 'S'), ('FLattenSwin', 'B'), ('FLattenSwin', 'B@384'),
            ('FLattenCSWin', 'T')}
_SHORT = {'tiny': 'T', 'small': 'S', 'medium': 'M', 'large': 'L', 'base': 'B', 'base_384': 'B@384'}


class Variant:
    """One row: a backbone type, an arch and extra constructor arguments."""

    def __init__(self, type_name, arch, kwargs=None, short=None):
        self.type = type_name
        self.arch = arch
        self.kwargs = dict(kwargs or {})
        self.short = short or _SHORT.get(arch, arch.upper())

    @property
    def name(self):
        return f'FLatten-{self.type[len("FLatten"):]}-{self.short}'

    def classifier(self):
        return build_classifier(self.type, self.arch, **self.kwargs)

    def backbone(self):
        return build_backbone(self.type, self.arch, **self.kwargs)

    def cls_resolution(self):
        """The ImageNet resolution: the backbone's pre-training size."""
        return _pair(self.kwargs.get('pretrain_img_size') or self._arch_size(self.arch))

    def _arch_size(self, arch):
        return self.backbone_class().arch_settings.get(arch, {}).get('pretrain_img_size', 224)

    def backbone_class(self):
        from mmeffvit.registry import MODELS
        return MODELS.get(self.type)

    def matches(self, backbone_cfg):
        """Whether a config's ``model.backbone`` dict builds this variant."""
        cls = self.backbone_class()
        type_name = str(backbone_cfg.get('type', '')).split('.')[-1]
        arch = backbone_cfg.get('arch')
        if type_name != self.type or not isinstance(arch, str):
            return False
        arch = cls.arch_aliases.get(arch.lower(), arch.lower())
        size = _pair(backbone_cfg.get('pretrain_img_size') or self._arch_size(arch))
        return arch == self.arch and size == self.cls_resolution()


def _pair(size):
    return (size, size) if isinstance(size, int) else tuple(size)


def variants():
    """Every row of the table, in family order, from the backbones' ``arch_settings``."""
    from mmeffvit.registry import MODELS
    rows = []
    for type_name in FAMILIES:
        for arch in MODELS.get(type_name).arch_settings:
            rows.append(Variant(type_name, arch))
        for short, arch, kwargs in EXTRA_VARIANTS.get(type_name, []):
            rows.append(Variant(type_name, arch, kwargs, short))
    return rows


# --- reading configs without building them ----------------------------------------------------

def _literal(node, names, bases=None):
    """Value of a config expression made of literals, ``dict(...)`` calls, known names and
    ``_base_.pop('key')`` (in a config's code mmengine binds ``_base_`` to its merged bases)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.List):
        return [_literal(e, names, bases) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, names, bases) for e in node.elts)
    if isinstance(node, ast.Dict):
        return {_literal(k, names, bases): _literal(v, names, bases)
                for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict':
        out = {}
        for arg in node.args:  # dict(mapping, key=value): a copy with those keys replaced
            value = _literal(arg, names, bases)
            out.update(value if isinstance(value, dict) else {})
        out.update({kw.arg: _literal(kw.value, names, bases) for kw in node.keywords if kw.arg})
        return out
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and isinstance(node.func.value, ast.Name) and node.func.value.id == '_base_' \
            and node.func.attr == 'pop' and bases is not None and node.args \
            and isinstance(node.args[0], ast.Constant):
        return bases.pop(node.args[0].value, None)
    return None


def _merge(base, new):
    """mmengine's dict inheritance: recursive update, ``_delete_=True`` replaces."""
    if not isinstance(base, dict) or not isinstance(new, dict) or new.get('_delete_'):
        return {k: v for k, v in new.items() if k != '_delete_'} if isinstance(new, dict) else new
    out = dict(base)
    for key, value in new.items():
        out[key] = _merge(base.get(key), value) if key in base else value
    return out


def read_config(path):
    """Top-level names of a config file merged over its local ``_base_`` files (not ``pkg::``)."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    assigns = [(stmt.targets[0].id, stmt.value) for stmt in tree.body
               if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
               and isinstance(stmt.targets[0], ast.Name)]
    bases = next((_literal(value, {}) for key, value in assigns if key == '_base_'), None) or []
    merged = {}
    for base in [bases] if isinstance(bases, str) else bases:
        if isinstance(base, str) and '::' not in base:
            merged = _merge(merged, read_config(osp.normpath(osp.join(osp.dirname(path), base))))
    names = {}
    for key, value in assigns:
        if key != '_base_':
            names[key] = _literal(value, names, merged)
    for key, value in names.items():
        merged[key] = _merge(merged.get(key), value) if key in merged else value
    return merged


def config_index(config_dir=CONFIG_DIR):
    """``[(config name, backbone dict, checkpoint)]`` of every config in a family folder of
    ``configs/``, named ``<family>/<file stem>`` (not ``_base_/``, ``demo/`` or the top-level entry
    points, which inherit a family config unchanged)."""
    out = []
    for path in sorted(glob.glob(osp.join(config_dir, '*', '*.py'))):
        folder = osp.basename(osp.dirname(path))
        if folder in ('_base_', 'demo'):
            continue
        cfg = read_config(path)
        backbone = (cfg.get('model') or {}).get('backbone') or {}
        init = backbone.get('init_cfg') if isinstance(backbone.get('init_cfg'), dict) else {}
        ckpt = cfg.get('pretrained') or init.get('checkpoint')
        out.append((f'{folder}/{osp.splitext(osp.basename(path))[0]}', backbone, ckpt))
    return out


# --- the table ---------------------------------------------------------------------------------

def row_cells(variant, configs, with_macs=True):
    """The cells of one variant's row (GMACs cells are ``None`` without ``with_macs``)."""
    used = [(name, ckpt) for name, backbone, ckpt in configs if variant.matches(backbone)]
    ckpts = sorted({osp.basename(c) for _, c in used if c})
    released = (variant.type, variant.short) in RELEASED
    if ckpts:
        files = ', '.join(f'`{c}`' for c in ckpts)
        weights = files if released else f'not released (configs expect {files})'
    else:
        weights = 'released (no config)' if released else 'not released'
    res = variant.cls_resolution()
    cells = dict(
        model=variant.name,
        build=f'`{variant.type}` `{variant.arch}`' + ''.join(
            f' `{k}={v}`' for k, v in sorted(variant.kwargs.items())),
        res=f'{res[0]}²' if res[0] == res[1] else f'{res[0]}×{res[1]}',
        cls_params=f'{_params(variant.classifier) / 1e6:.2f}',
        bb_params=f'{_params(variant.backbone) / 1e6:.2f}',
        cls_gmacs=None, det_gmacs=None,
        configs='<br>'.join(f'`{n}`' for n, _ in used) or '–',
        weights=weights)
    if with_macs:
        cells['cls_gmacs'] = f'{cls_gmacs(variant):.2f}'
        cells['det_gmacs'] = f'{det_gmacs(variant):.1f}'
    return cells


def _params(factory):
    """Parameters of ``factory()``, built on the meta device when the constructor allows it."""
    try:
        with torch.device('meta'):
            return count_params(factory())
    except (NotImplementedError, RuntimeError):
        return count_params(factory())


def cls_gmacs(variant):
    """GMACs of the ImageNet classifier at its resolution (memoised per process)."""
    if variant.kwargs:
        from mmeffvit.analysis import backbone_complexity
        return backbone_complexity(variant.type, variant.arch, variant.cls_resolution(), True,
                                   **variant.kwargs).gmacs
    return cached_backbone_complexity(variant.type, variant.arch, variant.cls_resolution(),
                                      True).gmacs


def det_gmacs(variant):
    """GMACs of the dense backbone at 800×1333."""
    if variant.kwargs:
        from mmeffvit.analysis import backbone_complexity
        return backbone_complexity(variant.type, variant.arch, DET_SHAPE, False,
                                   **variant.kwargs).gmacs
    return cached_backbone_complexity(variant.type, variant.arch, DET_SHAPE, False).gmacs


COLUMNS = [('model', 'model'), ('build', 'backbone'), ('res', 'IN res'),
           ('cls_params', 'params (M)<br>classifier'), ('bb_params', 'params (M)<br>backbone'),
           ('cls_gmacs', 'GMACs<br>classifier'), ('det_gmacs', 'GMACs backbone<br>800×1333'),
           ('configs', 'configs'), ('weights', 'ImageNet weights')]

HEADER = """# Model zoo

<!-- GENERATED from the code by tools/analysis/model_zoo.py; do not edit by hand.
     Regenerate: python tools/analysis/model_zoo.py
     Check:      python tools/analysis/model_zoo.py --check -->

Every FLatten variant mmeffvit builds. **GMACs** are multiply-adds (1 MAC = one multiply-add,
the fvcore / mmengine convention; papers, FLatten's included, call them FLOPs), counted by
tracing the model with mmengine's `FlopAnalyzer` (`mmeffvit/analysis/complexity.py`): linear layers,
convolutions and every attention product (focused linear attention's `q·mean(k)`, `KᵀV`,
`Q(KᵀV)` and depthwise conv; softmax attention's `QKᵀ` and `AV`). Element-wise work (the focusing
function, softmax, norms, activations, pooling, resizing of position tensors) is not counted.

* **classifier**: the official ImageNet model (backbone, final norm, global pooling,
  `Linear(C, 1000)`) as the official code counts it, at its ImageNet resolution (IN res).
* **backbone**: the dense-prediction backbone as the configs build it (per-stage out-norms;
  DeiT with its ViTDet simple pyramid), without neck or heads, on a 1×3×800×1333 input.
* **configs**: files in `configs/<family>/` whose backbone is that variant; **ImageNet weights**:
  the file their `pretrained` names and whether the official FLatten-Transformer release has it.

Convert an official release with
`python tools/model_converters/flatten2mmeffvit.py SRC DST` and count any model with
`python tools/analysis/get_flops.py CONFIG` or
`python tools/analysis/get_flops.py --backbone FLattenSwin --arch tiny --with-head`.
"""


def render(rows):
    """Markdown of the whole file from the cell dicts, one table per family."""
    lines = [HEADER]
    family = None
    for cells in rows:
        fam = cells['model'].rsplit('-', 1)[0]
        if fam != family:
            family = fam
            lines += ['', f'## {fam}', '',
                      '| ' + ' | '.join(title for _, title in COLUMNS) + ' |',
                      '|' + '|'.join('---' if k in ('model', 'build', 'configs', 'weights')
                                     else '--:' for k, _ in COLUMNS) + '|']
        lines.append('| ' + ' | '.join(str(cells[k]) for k, _ in COLUMNS) + ' |')
    return '\n'.join(lines) + '\n'


def generate(with_macs=True, progress=False):
    """The cell dicts of every row (slow with ``with_macs``: each model is traced twice)."""
    configs = config_index()
    rows = []
    for variant in variants():
        if progress:
            print(f'  {variant.name} ...', flush=True)
        rows.append(row_cells(variant, configs, with_macs))
    return rows


def parse_table(text):
    """Cell dicts of the rows of a generated file (the inverse of :func:`render`)."""
    rows = []
    for line in text.splitlines():
        if line.startswith('| FLatten-'):
            values = [c.strip() for c in line.strip().strip('|').split(' | ')]
            rows.append(dict(zip([k for k, _ in COLUMNS], values)))
    return rows


def main(argv=None):
    """Write ``docs/model_zoo.md`` or, with ``--check``, compare it; returns the exit code."""
    parser = argparse.ArgumentParser(description='Generate docs/model_zoo.md from the code')
    parser.add_argument('--check', action='store_true',
                        help='regenerate in memory and exit 1 with a diff if the file differs')
    parser.add_argument('--out', default=DOC, help='file to write or check')
    parser.add_argument('--keep-gmacs', action='store_true',
                        help='recompute everything but the GMACs columns, which are copied from '
                        'the existing file (for config changes; --check always recomputes them)')
    args = parser.parse_args(argv)
    if args.keep_gmacs and not args.check:
        old = {r['model']: r for r in parse_table(open(args.out, encoding='utf-8').read())}
        rows = generate(with_macs=False)
        missing = [r['model'] for r in rows if r['model'] not in old]
        if missing:
            parser.error(f'no GMACs to keep for {missing}: run without --keep-gmacs')
        for row in rows:
            row['cls_gmacs'], row['det_gmacs'] = (old[row['model']]['cls_gmacs'],
                                                  old[row['model']]['det_gmacs'])
        text = render(rows)
    else:
        text = render(generate(progress=not args.check))
    if args.check:
        old = open(args.out, encoding='utf-8').read() if osp.exists(args.out) else ''
        if old == text:
            print(f'{args.out} is up to date')
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            old.splitlines(True), text.splitlines(True), args.out, 'generated'))
        print(f'\n{args.out} is stale: run python tools/analysis/model_zoo.py')
        return 1
    with open(args.out, 'w', encoding='utf-8') as f:
        f.write(text)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
