"""Generate the model zoo from the code: ``docs/model_zoo.md``, ``model-index.yml``, one
``configs/<family>/metafile.yml`` per family and the generated sections of the family READMEs.

``docs/model_zoo.md`` lists every variant of every backbone (``arch_settings`` of FLattenPVT,
FLattenPVTv2, FLattenSwin, FLattenCSWin, FLattenDeiT, LaViT, CARE, L2ViT, FocalTransformer, plus
variants that are an arch with other arguments: Swin-B at 384², Focal's conv embedding):

* parameters of the official ImageNet classifier (final norm and head included, as the official
  code counts them; ``mmeffvit.analysis.models.CLASSIFIER_SPECS``) and of the dense-prediction
  backbone (out-norms of all four stages; DeiT with its ViTDet pyramid);
* GMACs of the classifier at its ImageNet resolution and of the dense backbone at 800×1333,
  counted by :mod:`mmeffvit.analysis` (mmengine's FlopAnalyzer);
* the configs of ``configs/<family>/`` whose backbone is that variant, the checkpoint they load
  and whether the official release has it.

The metafiles and README sections (:mod:`mmeffvit.analysis.zoo.index`) describe each config:
its backbone, counted parameters and backbone GMACs, and the results the authors published for
exactly that setting (:mod:`mmeffvit.analysis.zoo.published`). Counts are cached in
``docs/model_zoo_counts.json`` (:mod:`mmeffvit.analysis.zoo.counts`). Usage::

    python tools/analysis/model_zoo.py            # count what is new, rewrite every file
    python tools/analysis/model_zoo.py --check    # exit 1 with a diff if a file is stale (seconds)
    python tools/analysis/model_zoo.py --check --recount   # also recount everything (an hour)
"""
import argparse
import difflib
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

import mmeffvit  # noqa: E402,F401  registers the backbones
from mmeffvit.analysis.zoo import index as zoo_index  # noqa: E402
from mmeffvit.analysis.zoo.configs import config_index  # noqa: E402
from mmeffvit.analysis.zoo.counts import CountCache  # noqa: E402
from mmeffvit.analysis.zoo.variants import FAMILIES, RELEASED, variants  # noqa: E402

DOC = osp.join(REPO_ROOT, 'docs', 'model_zoo.md')
COUNTS = osp.join(REPO_ROOT, 'docs', 'model_zoo_counts.json')
CONFIG_DIR = osp.join(REPO_ROOT, 'configs')
DET_SHAPE = (800, 1333)


# --- the table ---------------------------------------------------------------------------------

def _number(entry, field, scale, fmt):
    return '?' if entry is None else fmt.format(entry[field] / scale)


def row_cells(variant, configs, counts):
    """The cells of one variant's row, counts from ``counts`` (a :class:`CountCache`)."""
    used = [(name, ckpt) for name, backbone, ckpt in configs if variant.matches(backbone)]
    ckpts = sorted({osp.basename(c) for _, c in used if c})
    remark = RELEASED.get(variant.name)
    files = ', '.join(f'`{c}`' for c in ckpts)
    if remark is None:
        weights = f'not released (configs expect {files})' if ckpts else 'not released'
    elif remark:
        weights = f'{files} ({remark})' if ckpts else remark
    else:
        weights = files or 'released (no config)'
    res = variant.cls_resolution()
    cls = counts.backbone('classifier', variant.type, variant.classifier_args(), res)
    dense = counts.backbone('backbone', variant.type, variant.backbone_args(), DET_SHAPE)
    return dict(
        model=variant.name,
        build=f'`{variant.type}` `{variant.arch}`' + ''.join(
            f' `{k}={v}`' for k, v in sorted(variant.kwargs.items())),
        res=f'{res[0]}²' if res[0] == res[1] else f'{res[0]}×{res[1]}',
        cls_params=_number(cls, 'params', 1e6, '{:.2f}'),
        bb_params=_number(dense, 'params', 1e6, '{:.2f}'),
        cls_gmacs=_number(cls, 'macs', 1e9, '{:.2f}'),
        det_gmacs=_number(dense, 'macs', 1e9, '{:.1f}'),
        configs='<br>'.join(f'`{n}`' for n, _ in used) or '–',
        weights=weights)


COLUMNS = [('model', 'model'), ('build', 'backbone'), ('res', 'IN res'),
           ('cls_params', 'params (M)<br>classifier'), ('bb_params', 'params (M)<br>backbone'),
           ('cls_gmacs', 'GMACs<br>classifier'), ('det_gmacs', 'GMACs backbone<br>800×1333'),
           ('configs', 'configs'), ('weights', 'ImageNet weights')]

HEADER = """# Model zoo

<!-- GENERATED from the code by tools/analysis/model_zoo.py; do not edit by hand.
     Regenerate: python tools/analysis/model_zoo.py
     Check:      python tools/analysis/model_zoo.py --check -->

Every variant mmeffvit builds, of every family. **GMACs** are multiply-adds (1 MAC = one
multiply-add, the fvcore / mmengine convention; papers call them FLOPs), counted by tracing the
model with mmengine's `FlopAnalyzer` (`mmeffvit/analysis/complexity.py`): linear layers,
convolutions and every attention product (focused and plain linear attention's `KᵀV` and `Q(KᵀV)`
with their normalisers, depthwise convs; softmax attention's `QKᵀ` and `AV`; LaViT's Θ/Ψ maps).
Element-wise work (focusing functions, softmax, norms, activations, pooling, resizing of position
tensors) is not counted. Results, detector / segmentor parameters and per-config counts:
`configs/<family>/README.md` and `metafile.yml`.

* **classifier**: the official ImageNet model at its ImageNet resolution (IN res), as the
  official code builds it (`mmeffvit/analysis/models.py`, `CLASSIFIER_SPECS`): backbone, final
  norm, global pooling and `Linear(C, 1000)`; FLatten-PVT's final norm built but not applied
  (as PVT v1's); CARE's two heads (GELU, LayerNorm, Linear each); Focal without stage-4
  surroundings (a 7×7 map is one window); LaViT (no official code) with the paper's dense Θ/Ψ.
* **backbone**: the dense-prediction backbone as the configs build it (per-stage out-norms;
  DeiT with its ViTDet simple pyramid; LaViT's windowed less attention), without neck or heads,
  on a 1×3×800×1333 input.
* **configs**: files in `configs/<family>/` whose backbone is that variant; **ImageNet weights**:
  the file their `pretrained` names and whether the official release has it.

Official checkpoints load through `init_cfg=dict(type='Pretrained', checkpoint=...)` (each
backbone converts its family's layout); `tools/model_converters/flatten2mmeffvit.py SRC DST`
converts a FLatten release into an mmengine checkpoint. Count any model with
`python tools/analysis/get_flops.py CONFIG` or
`python tools/analysis/get_flops.py --backbone FLattenSwin --arch tiny --with-head`.
"""


def section_of(name):
    """The family section of a row name (``FLatten-PVTv2-B0`` -> ``FLatten-PVTv2``)."""
    return max((p for p in FAMILIES.values() if name.startswith(p + '-')), key=len)


def render(rows):
    """Markdown of the whole file from the cell dicts, one table per family."""
    lines = [HEADER]
    family = None
    for cells in rows:
        fam = section_of(cells['model'])
        if fam != family:
            family = fam
            lines += ['', f'## {fam}', '',
                      '| ' + ' | '.join(title for _, title in COLUMNS) + ' |',
                      '|' + '|'.join('---' if k in ('model', 'build', 'configs', 'weights')
                                     else '--:' for k, _ in COLUMNS) + '|']
        lines.append('| ' + ' | '.join(str(cells[k]) for k, _ in COLUMNS) + ' |')
    return '\n'.join(lines) + '\n'


def generate(counts, config_dir=CONFIG_DIR):
    """The cell dicts of every row."""
    configs = config_index(config_dir)
    return [row_cells(variant, configs, counts) for variant in variants()]


def parse_table(text):
    """Cell dicts of the rows of a generated file (the inverse of :func:`render`)."""
    rows = []
    starts = tuple(f'| {prefix}-' for prefix in FAMILIES.values())
    for line in text.splitlines():
        if line.startswith(starts):
            values = [c.strip() for c in line.strip().strip('|').split(' | ')]
            rows.append(dict(zip([k for k, _ in COLUMNS], values)))
    return rows


def outputs(counts, repo_root=REPO_ROOT):
    """``{path: text}`` of every generated file."""
    config_dir = osp.join(repo_root, 'configs')
    files = {osp.join(repo_root, 'docs', 'model_zoo.md'): render(generate(counts, config_dir))}
    files.update(zoo_index.outputs(repo_root, counts))
    return files


def _diff(path, old, new):
    return ''.join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), path,
                                        'generated'))


def main(argv=None):
    """Write the generated files or, with ``--check``, compare them; returns the exit code."""
    parser = argparse.ArgumentParser(description='Generate the model zoo files from the code')
    parser.add_argument('--check', action='store_true',
                        help='regenerate in memory and exit 1 with a diff if a file differs '
                        '(counts from docs/model_zoo_counts.json)')
    parser.add_argument('--recount', action='store_true',
                        help='count every entry again (about an hour on a 2-core CPU); with '
                        '--check, fail if a count differs from the cached one')
    parser.add_argument('--root', default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    counts_path = osp.join(args.root, 'docs', 'model_zoo_counts.json')
    counts = CountCache(counts_path, count=not args.check, recount=args.recount,
                        progress=not args.check)
    files = outputs(counts, args.root)
    files[counts_path] = counts.text()
    if args.check:
        failed = False
        if counts.missing:
            print(f'not counted yet (or the config changed): {counts.missing}; '
                  'run python tools/analysis/model_zoo.py')
            failed = True
        for key, old, new in counts.changed:
            print(f'count changed: {key}: cached {old}, counted {new}')
            failed = True
        for path, text in files.items():
            old = open(path, encoding='utf-8').read() if osp.exists(path) else ''
            if old != text:
                sys.stdout.write(_diff(path, old, text))
                print(f'\n{path} is stale: run python tools/analysis/model_zoo.py')
                failed = True
        if not failed:
            print(f'{len(files)} generated files are up to date')
        return int(failed)
    for path, text in files.items():
        with open(path, 'w', encoding='utf-8') as f:
            f.write(text)
        print(f'wrote {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
