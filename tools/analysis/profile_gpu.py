"""Which kernels a GPU step runs: ``torch.profiler`` per backbone, beside the kernel counter.

For every case of ``tools/analysis/benchmark.py`` (default: every mmeffvit family and mmdet's
softmax peers), in a child process per case and mode (spawned on CUDA): warm-up steps, one step
timed by CUDA events, one step under the profiler (:mod:`mmeffvit.analysis.kernel_profile`).
The report gives per backbone the step time, the kernels launched and their device time, the
kernel counter's count of one forward (fake CUDA tensors, fp32 and the step's dtype: the count
that ``tests/data/kernel_budget.json`` holds) and, for inference, the ratio of the two, which
calibrates the counter; then the top kernels by device time. Without a GPU (``--device cpu``)
the same tables list ATen operators instead of kernels.

Written between ``<!-- gpu-profiles:start -->`` and ``<!-- gpu-profiles:end -->`` of ``--out``
(other text kept), the raw results to ``--json``.

    python tools/analysis/profile_gpu.py --device cuda --dtype bf16 --modes infer
    python tools/analysis/profile_gpu.py --device cuda --modes train --optimizer adamw
    python tools/analysis/profile_gpu.py --device cpu --cases FLatten-PVTv2-B0 --shape 64x96 \\
        --out /tmp/p.md                                    # the CPU stand-in, seconds
"""
import argparse
import datetime
import json
import os
import os.path as osp
import sys

TOOL_DIR = osp.dirname(osp.abspath(__file__))
if TOOL_DIR not in sys.path:
    sys.path.insert(0, TOOL_DIR)

import benchmark  # noqa: E402
from profile_backbone import write_section  # noqa: E402

START, END = '<!-- gpu-profiles:start -->', '<!-- gpu-profiles:end -->'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--cases', default='all', help='benchmark.py case names (peers added)')
    p.add_argument('--shape', type=benchmark.parse_shape, default=(800, 1333))
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--dtype', default='bf16', choices=sorted(benchmark.DTYPES))
    p.add_argument('--modes', default='infer')
    p.add_argument('--optimizer', choices=['none', 'adamw'], default='adamw')
    p.add_argument('--device', default='cuda', choices=['cpu', 'cuda'])
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--top', type=int, default=8, help='kernels per backbone')
    p.add_argument('--timeout', type=float, default=600., help='seconds per child')
    p.add_argument('--out', default=osp.join(benchmark.REPO_ROOT, 'docs', 'benchmarks_gpu.md'))
    p.add_argument('--json', help='raw results (default: <out without .md>/profiles.json)')
    p.add_argument('--from-json', help='render an earlier run, profile nothing')
    args = p.parse_args(argv)
    args.dtype = benchmark.DTYPES[args.dtype]
    args.case_names = benchmark.select_cases(args.cases)
    args.modes = [m for m in args.modes.split(',') if m]
    if not args.modes or any(m not in ('infer', 'train') for m in args.modes):
        p.error('--modes: infer, train or both')
    args.json = args.json or osp.join(osp.splitext(args.out)[0], 'profiles.json')
    return args


def run(args, argv):
    from mmeffvit.ops.policy import policy
    opts = dict(device=args.device, dtype=args.dtype, threads=len(os.sched_getaffinity(0)),
                optimizer=args.optimizer)
    runner = benchmark.Runner(opts, args.timeout,
                              ['torch', 'numpy', 'mmeffvit', 'mmdet.models',
                               'mmeffvit.analysis.benchmark_worker'],
                              'spawn' if args.device == 'cuda' else 'forkserver')
    jobs = [dict(kind='kernels', name=n, shape=tuple(args.shape), batch=args.batch, mode=m,
                 warmup=args.warmup,
                 case=dict(scope=benchmark.CASES[n][0], cfg=benchmark.CASES[n][1]))
            for m in args.modes for n in args.case_names]
    progress = benchmark.Progress([[j] for j in jobs])
    started = datetime.datetime.now().astimezone().isoformat(timespec='seconds')
    machine = runner.run([dict(kind='machine')], progress.update)[0]
    results = {}
    for job in jobs:
        results.setdefault(job['name'], {})[job['mode']] = runner.run([job], progress.update)[0]
    return dict(command=benchmark.command_line(argv, __file__), date=started,
                shape=list(args.shape), batch=args.batch, dtype=args.dtype,
                device=args.device, optimizer=args.optimizer, triton=policy().triton,
                machine=machine, cases=args.case_names, modes=args.modes, results=results,
                peers={n: benchmark.CASES[n][2] for n in args.case_names})


def _ratio(a, b):
    return f'{a / b:.2f}' if a and b else '–'


def summary_table(data):
    rows = ['| backbone | mode | step ms | ×peer | kernels launched | ×peer | kernel ms | '
            'counter fp32 / step dtype (one forward) | launched / counter |',
            '|---|---|--:|--:|--:|--:|--:|--:|--:|']
    for mode in data['modes']:
        for name in data['cases']:
            res = data['results'].get(name, {}).get(mode, {})
            if 'error' in res or not res:
                rows.append(f"| {name} | {mode} | failed: {res.get('error', 'no result')} "
                            '| | | | | | |')
                continue
            peer = data['results'].get(data['peers'].get(name) or '', {}).get(mode, {})
            counts = list(res['counter'].values())
            # the counter counts one forward: comparable with the launches of an inference
            calib = _ratio(res['launches'], counts[-1]) if mode == 'infer' else '–'
            rows.append(
                f"| {name} | {mode} | {res['step_ms']:.1f} | "
                f"{_ratio(res['step_ms'], peer.get('step_ms'))} | {res['launches']} | "
                f"{_ratio(res['launches'], peer.get('launches'))} | {res['kernel_us'] / 1e3:.1f} | "
                f"{' / '.join(map(str, counts))} | {calib} |")
    return rows


def render(data, top):
    h, w = data['shape']
    mach = data.get('machine', {})
    what = mach.get('gpu', 'CPU (ATen operators stand in for kernels)')
    lines = [START, '', f"Measured {data['date']} on {what}, torch {mach.get('torch', '?')}, "
             f"input {data['batch']}×3×{h}×{w}, autocast {data['dtype']}, training steps with "
             f"{'AdamW' if data['optimizer'] == 'adamw' else 'no optimiser'}, mmeffvit's Triton "
             f"kernels {'selected' if data.get('triton') else 'not selected'}, with:", '',
             '    ' + data['command'], '',
             '*step ms*: one unprofiled step after the warm-up (CUDA events); *kernels launched* '
             'and *kernel ms*: the profiled step; *counter*: the kernel counter on fake CUDA '
             'tensors for one forward in the same mode; *launched / counter*: its calibration '
             '(inference).', '']
    lines += summary_table(data) + ['']
    for mode in data['modes']:
        for name in data['cases']:
            res = data['results'].get(name, {}).get(mode, {})
            if 'top' not in res:
                continue
            lines += [f'#### {name}, {mode}: top {res["kind"]} by time', '',
                      '| kernel | launches | share of kernel time |', '|---|--:|--:|']
            lines += [f"| `{k}` | {c} | {100 * us / res['kernel_us']:.1f} % |"
                      for k, c, us in res['top'][:top]]
            lines.append('')
    return lines + [END]


def write(data, out, top):
    generated = '\n'.join(render(data, top))
    write_section(out, generated, START, END, lambda text: (
        (text.rstrip('\n') + '\n\n' if text else '')
        + '## Kernels per step on the GPU, profiled\n\n' + generated + '\n'))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json, encoding='utf-8') as f:
            data = json.load(f)
    else:
        data = run(args, argv)
        os.makedirs(osp.dirname(args.json) or '.', exist_ok=True)
        with open(args.json, 'w', encoding='utf-8') as f:
            json.dump(data, f, indent=1)
    write(data, args.out, args.top)
    print(f'wrote {args.out}', file=sys.stderr)
    return data


if __name__ == '__main__':
    main()
