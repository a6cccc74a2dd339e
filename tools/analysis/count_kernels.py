"""The kernels a backbone's CUDA forward launches, counted on this CPU with fake CUDA tensors.

For each case of ``tools/analysis/benchmark.py`` (default: every mmeffvit family and mmdet's
PVT-T, PVTv2-B0/B1 and Swin-T) one forward in eval and one in training mode (autograd
recording) on fake CUDA tensors, ``batch×3×H×W``, fp32 and bf16 (model and input cast):
kernels, bytes read + written, FLOPs, and every data-dependent operator (a device-to-host sync
on a GPU; the count stops there); fp32 again with the Triton kernels selected
(``use_kernels(required=False, triton=True)``, as ``MMEFFVIT_TRITON=1``). How:
:mod:`mmeffvit.analysis.kernel_count`. No GPU needed.

    python tools/analysis/count_kernels.py                      # table into docs/benchmarks_gpu.md
    python tools/analysis/count_kernels.py --cases Focal-T,Swin-T --out /tmp/k.md
    python tools/analysis/count_kernels.py --budget tests/data/kernel_budget.json  # ceilings

The table is written between ``<!-- kernel-counts:start -->`` and ``<!-- kernel-counts:end -->``
of ``--out`` (other text kept). ``--budget`` writes today's eval and training fp32 counts of
the mmeffvit cases, default policy and Triton selected, as the ceilings
``tests/test_kernel_budget.py`` holds them to.
"""
import argparse
from contextlib import nullcontext
import datetime
import json
import os.path as osp
import sys

import torch

TOOL_DIR = osp.dirname(osp.abspath(__file__))
if TOOL_DIR not in sys.path:
    sys.path.insert(0, TOOL_DIR)

import benchmark  # noqa: E402
from mmeffvit import ops  # noqa: E402
from mmeffvit.analysis.benchmark_worker import build_case  # noqa: E402
from mmeffvit.analysis.kernel_count import count_backbone  # noqa: E402

START, END = '<!-- kernel-counts:start -->', '<!-- kernel-counts:end -->'
DEFAULT_CASES = ['PVT-T', 'PVTv2-B0', 'PVTv2-B1', 'Swin-T'] + [
    n for n, (scope, _, _) in benchmark.CASES.items() if scope == 'mmeffvit']
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16}

#: the counted forwards: key -> (dtype, training, Triton kernels selected)
COUNTS = {'fp32-eval': ('fp32', False, False), 'fp32-train': ('fp32', True, False),
          'bf16-eval': ('bf16', False, False), 'triton-eval': ('fp32', False, True),
          'triton-train': ('fp32', True, True)}
#: budget modes of tests/data/kernel_budget.json -> count key
BUDGET_MODES = {'eval': 'fp32-eval', 'train': 'fp32-train', 'triton-eval': 'triton-eval',
                'triton-train': 'triton-train'}


def count_case(name, shape, batch, dtype, train, triton=False):
    """The :class:`~mmeffvit.analysis.kernel_count.Count`, or the error's one-line text where
    the forward fails on fake tensors for another reason than a data-dependent operator;
    ``triton``: with the Triton kernels selected."""
    scope, cfg, _ = benchmark.CASES[name]
    block = ops.use_kernels(required=False, triton=True) if triton else nullcontext()
    try:
        with block:
            return count_backbone(build_case(dict(scope=scope, cfg=cfg)), shape, batch, dtype,
                                  train)
    except RuntimeError as err:
        return f'{type(err).__name__}: {str(err).splitlines()[0]}'


def table(rows, shape, batch):
    lines = [
        f'Fake CUDA tensors, input {batch}×3×{shape[0]}×{shape[1]}; the second forward of that '
        'size (the per-shape caches filled, as in every later step), eval or training mode '
        '(autograd recording; the backward cannot run without a CUDA driver). *kernels*: '
        'ATen operators that launch work (not views, metadata or bare allocations); *GB*: '
        'bytes their arguments and outputs hold (an upper bound on traffic); *GFLOPs*: matrix '
        'products and convolutions; *×peer*: kernels over those of the softmax backbone users '
        'would otherwise pick (the peer on the same policy); *Triton*: with the Triton kernels '
        'selected (`MMEFFVIT_TRITON=1`; a Triton op counts its launches); '
        '`F.scaled_dot_product_attention` counts the fused kernel an sm80+ GPU would choose '
        '(flash, memory-efficient, else the math path); '
        '*data-dependent*: where the forward needs tensor data on the host (its count stops '
        'there, marked ≥).', '',
        '| backbone | peer | eval fp32 kernels | ×peer | train fp32 kernels | eval bf16 kernels '
        '| Triton eval fp32 | ×peer | Triton train fp32 | eval fp32 GB | GFLOPs '
        '| data-dependent |',
        '|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|']
    for name, r in rows.items():
        peer = benchmark.CASES[name][2]
        counted = {key: c for key, c in r.items() if not isinstance(c, str)}

        def ratio(key):
            if (peer in rows and key in counted and not counted[key].data_dependent
                    and not isinstance(rows[peer][key], str)):
                return f"{r[key].kernels / rows[peer][key].kernels:.2f}"
            return '–'

        def kernels(c):
            if isinstance(c, str):
                return f'fails ({c})'
            return f'≥ {c.kernels}' if c.data_dependent else str(c.kernels)

        where = sorted({d.split(' at ')[-1] for c in counted.values() for d in c.data_dependent
                        if ' at ' in d})
        lines.append(
            f"| {name} | {peer or '–'} | {kernels(r['fp32-eval'])} | {ratio('fp32-eval')} | "
            f"{kernels(r['fp32-train'])} | {kernels(r['bf16-eval'])} | "
            f"{kernels(r['triton-eval'])} | {ratio('triton-eval')} | "
            f"{kernels(r['triton-train'])} | "
            f"{getattr(r['fp32-eval'], 'bytes', 0) / 1e9:.1f} | "
            f"{getattr(r['fp32-eval'], 'flops', 0) / 1e9:.0f} | "
            f"{', '.join(f'`{w}`' for w in where) or 'none'} |")
    return '\n'.join(lines)


def write_between_markers(path, body, command):
    text = open(path).read() if osp.exists(path) else f'# Kernel counts\n\n{START}\n{END}\n'
    if START not in text:
        text = (text.rstrip() + '\n\n## Kernels per forward, counted without a GPU\n\n'
                f'{START}\n{END}\n')
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
    block = (f'{START}\nMeasured {stamp} (torch {torch.__version__}) with:\n\n    {command}\n\n'
             f'{body}\n{END}')
    with open(path, 'w') as f:
        f.write(head + block + tail)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--cases', default=','.join(DEFAULT_CASES))
    p.add_argument('--shape', type=benchmark.parse_shape, default=(800, 1333))
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--out', default=osp.join(benchmark.REPO_ROOT, 'docs', 'benchmarks_gpu.md'))
    p.add_argument('--budget', help='write the fp32 counts of the mmeffvit cases here (JSON)')
    args = p.parse_args(argv)
    args.case_names = [n for n in args.cases.split(',') if n]
    unknown = [n for n in args.case_names if n not in benchmark.CASES]
    if unknown:
        p.error(f'unknown cases {unknown}; choose from {sorted(benchmark.CASES)}')
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = {}
    for name in args.case_names:
        rows[name] = {key: count_case(name, args.shape, args.batch, DTYPES[d], train, triton)
                      for key, (d, train, triton) in COUNTS.items()}
        print(name, {k: getattr(c, 'kernels', c) for k, c in rows[name].items()}, flush=True)
    command = 'python tools/analysis/count_kernels.py ' + ' '.join(argv or sys.argv[1:])
    write_between_markers(args.out, table(rows, args.shape, args.batch), command.strip())
    if args.budget:
        failed = {n: r for n, r in rows.items() if benchmark.CASES[n][0] == 'mmeffvit'
                  and any(isinstance(r[key], str) for key in BUDGET_MODES.values())}
        if failed:
            raise SystemExit(f'no budget: these forwards fail on fake tensors: {failed}')
        budget = dict(shape=list(args.shape), batch=args.batch, cases={
            name: {mode: dict(kernels=r[key].kernels,
                              data_dependent=sorted(set(r[key].data_dependent)))
                   for mode, key in BUDGET_MODES.items()}
            for name, r in rows.items() if benchmark.CASES[name][0] == 'mmeffvit'})
        with open(args.budget, 'w') as f:
            json.dump(budget, f, indent=1)
            f.write('\n')
    return rows


if __name__ == '__main__':
    main()
