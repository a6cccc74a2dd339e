"""Cost of LaViT's less-attention modes: GMACs, CPU latency and peak memory per input size.

``dense`` is the paper's form (Θ/Ψ are N×N maps of the input grid, so the model is built with
``pretrain_img_size`` equal to the input); ``window`` runs less attention in windows of the
224×224 training grid (any size, the mode the detection/segmentation configs use). Each
(mode, size) runs in its own process so peak memory is not polluted by earlier runs; the table
and the window/dense ratios come from one invocation.

Example::

    python tools/analysis/lavit_cost.py --arch tiny --sizes 224x224 800x1333 --repeat 3
"""
import argparse
import json
import statistics
import subprocess
import sys
import time


def parse_size(text):
    h, w = text.lower().split('x')
    return int(h), int(w)


def measure(arch, mode, size, repeat, threads):
    """Runs in the worker process: returns a dict of measurements for one (mode, size)."""
    import resource

    import psutil
    import torch
    from mmengine.analysis import FlopAnalyzer

    from mmeffvit.models import LaViT
    torch.set_num_threads(threads)
    pretrain = size if mode == 'dense' else 224
    model = LaViT(arch, la_mode=mode, pretrain_img_size=pretrain).eval()
    params = sum(p.numel() for p in model.parameters())
    x = torch.rand(1, 3, *size)
    rss_before = psutil.Process().memory_info().rss
    times = []
    with torch.no_grad():
        for _ in range(repeat + 1):  # the first run warms up the allocator and kernels
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    fa = FlopAnalyzer(model, x)
    fa.unsupported_ops_warnings(False)
    fa.uncalled_modules_warnings(False)
    return dict(arch=arch, mode=mode, size=list(size), params_m=params / 1e6,
                gmacs=fa.total() / 1e9, latency_ms=1e3 * statistics.median(times[1:]),
                peak_mb=max(peak - rss_before, 0) / 2**20)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', default='tiny')
    parser.add_argument('--modes', nargs='+', default=['dense', 'window'])
    parser.add_argument('--sizes', nargs='+', default=['224x224', '800x1333'])
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--json', help='also write the rows to this file')
    parser.add_argument('--worker', nargs=2, metavar=('MODE', 'SIZE'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        row = measure(args.arch, args.worker[0], parse_size(args.worker[1]), args.repeat,
                      args.threads)
        print('RESULT ' + json.dumps(row))
        return
    rows = []
    for size in args.sizes:
        for mode in args.modes:
            cmd = [sys.executable, __file__, '--arch', args.arch, '--repeat', str(args.repeat),
                   '--threads', str(args.threads), '--worker', mode, size]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')]
            if proc.returncode or not line:
                print(f'{mode} {size}: failed\n{proc.stderr[-2000:]}', file=sys.stderr)
                continue
            rows.append(json.loads(line[-1][len('RESULT '):]))
    print(f"{'arch':6} {'mode':7} {'size':>10} {'params M':>9} {'GMACs':>9} {'CPU ms':>9} "
          f"{'peak MB':>9}")
    for r in rows:
        print(f"{r['arch']:6} {r['mode']:7} {'x'.join(map(str, r['size'])):>10} "
              f"{r['params_m']:9.2f} {r['gmacs']:9.2f} {r['latency_ms']:9.1f} {r['peak_mb']:9.1f}")
    by = {(r['mode'], tuple(r['size'])): r for r in rows}
    for size in args.sizes:
        d, w = by.get(('dense', parse_size(size))), by.get(('window', parse_size(size)))
        if d and w:
            print(f'{size}: dense/window GMACs {d["gmacs"] / w["gmacs"]:.2f}x, latency '
                  f'{d["latency_ms"] / w["latency_ms"]:.2f}x, peak memory '
                  f'{d["peak_mb"] / max(w["peak_mb"], 1e-6):.2f}x, params '
                  f'{d["params_m"] / w["params_m"]:.2f}x')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)


if __name__ == '__main__':
    main()
