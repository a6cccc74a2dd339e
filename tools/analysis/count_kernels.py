"""The kernels a backbone's CUDA forward launches, counted on this CPU with fake CUDA tensors.

For each case of ``tools/analysis/benchmark.py`` (default: every mmeffvit family and mmdet's
PVT-T, PVTv2-B0/B1 and Swin-T) one forward in eval and one in training mode (autograd
recording) on fake CUDA tensors, ``batch×3×H×W``, fp32 and bf16 (model and input cast):
kernels, bytes read + written, FLOPs, and every data-dependent operator (a device-to-host sync
on a GPU; the count stops there). How: :mod:`mmeffvit.analysis.kernel_count`. No GPU needed.

    python tools/analysis/count_kernels.py                      # table into docs/benchmarks_gpu.md
    python tools/analysis/count_kernels.py --cases Focal-T,Swin-T --out /tmp/k.md
    python tools/analysis/count_kernels.py --budget tests/data/kernel_budget.json  # ceilings

The table is written between ``<!-- kernel-counts:start -->`` and ``<!-- kernel-counts:end -->``
of ``--out`` (other text kept). ``--budget`` writes today's eval and training fp32 counts of
the mmeffvit cases as the ceilings ``tests/test_kernel_budget.py`` holds them to.
"""
import argparse
import datetime
import json
import os.path as osp
import sys

import torch

TOOL_DIR = osp.dirname(osp.abspath(__file__))
if TOOL_DIR not in sys.path:
    sys.path.insert(0, TOOL_DIR)

import benchmark  # noqa: E402
from mmeffvit.analysis.benchmark_worker import build_case  # noqa: E402
from mmeffvit.analysis.kernel_count import count_backbone  # noqa: E402

START, END = '<!-- kernel-counts:start -->', '<!-- kernel-counts:end -->'
DEFAULT_CASES = ['PVT-T', 'PVTv2-B0', 'PVTv2-B1', 'Swin-T'] + [
    n for n, (scope, _, _) in benchmark.CASES.items() if scope == 'mmeffvit']
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16}


def count_case(name, shape, batch, dtype, train):
    """The :class:`~mmeffvit.analysis.kernel_count.Count`, or the error's one-line text where
    the forward fails on fake tensors for another reason than a data-dependent operator."""
    scope, cfg, _ = benchmark.CASES[name]
    try:
        return count_backbone(build_case(dict(scope=scope, cfg=cfg)), shape, batch, dtype, train)
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
        'would otherwise pick; *data-dependent*: where the forward needs tensor data on the '
        'host (its count stops there, marked ≥).', '',
        '| backbone | peer | eval fp32 kernels | ×peer | train fp32 kernels | eval bf16 kernels '
        '| eval fp32 GB | GFLOPs | data-dependent |',
        '|---|---|--:|--:|--:|--:|--:|--:|---|']
    for name, r in rows.items():
        peer = benchmark.CASES[name][2]
        counted = {key: c for key, c in r.items() if not isinstance(c, str)}
        ratio = '–'
        if (peer in rows and 'fp32-eval' in counted and not counted['fp32-eval'].data_dependent
                and not isinstance(rows[peer]['fp32-eval'], str)):
            ratio = f"{r['fp32-eval'].kernels / rows[peer]['fp32-eval'].kernels:.2f}"

        def kernels(c):
            if isinstance(c, str):
                return f'fails ({c})'
            return f'≥ {c.kernels}' if c.data_dependent else str(c.kernels)

        where = sorted({d.split(' at ')[-1] for c in counted.values() for d in c.data_dependent
                        if ' at ' in d})
        lines.append(
            f"| {name} | {peer or '–'} | {kernels(r['fp32-eval'])} | {ratio} | "
            f"{kernels(r['fp32-train'])} | {kernels(r['bf16-eval'])} | "
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
        rows[name] = {f'{d}-{m}': count_case(name, args.shape, args.batch, DTYPES[d],
                                             m == 'train')
                      for d, m in (('fp32', 'eval'), ('fp32', 'train'), ('bf16', 'eval'))}
        print(name, {k: getattr(c, 'kernels', c) for k, c in rows[name].items()}, flush=True)
    command = 'python tools/analysis/count_kernels.py ' + ' '.join(argv or sys.argv[1:])
    write_between_markers(args.out, table(rows, args.shape, args.batch), command.strip())
    if args.budget:
        failed = {n: r for n, r in rows.items() if benchmark.CASES[n][0] == 'mmeffvit'
                  and any(isinstance(r[f'fp32-{m}'], str) for m in ('eval', 'train'))}
        if failed:
            raise SystemExit(f'no budget: these forwards fail on fake tensors: {failed}')
        budget = dict(shape=list(args.shape), batch=args.batch, cases={
            name: {mode: dict(kernels=r[f'fp32-{mode}'].kernels,
                              data_dependent=sorted(set(r[f'fp32-{mode}'].data_dependent)))
                   for mode in ('eval', 'train')}
            for name, r in rows.items() if benchmark.CASES[name][0] == 'mmeffvit'})
        with open(args.budget, 'w') as f:
            json.dump(budget, f, indent=1)
            f.write('\n')
    return rows


if __name__ == '__main__':
    main()
