"""Benchmark mmeffvit's compiled attention operators against the PyTorch composite, in one run.

Measures, at the token counts of FLatten-PVT-T stages 1-2 for an 800×1333 input, the attention
path of :class:`FocusedLinearAttention` (focusing function on q and k, head split, kv-first
linear attention, head merge; the DWC and projections are identical in both paths and left out):
latency (median of ``--reps`` runs) and peak memory, forward (inference, no grad) and
forward+backward, ops (``MMEFFVIT_OPS=1``) vs composite (``MMEFFVIT_OPS=0``). Then the whole
FLatten-PVT-T backbone at 800×1333 with ops on and off.

Peak memory: ``tracemalloc`` does not see torch's allocations, and RSS is blurred by the malloc
arena, so the run is repeated under ``torch.profiler`` with ``profile_memory=True``: every
allocation and free of torch's CPU allocator is an event with its size, and the peak of their
running sum is the peak of memory allocated on top of the (pre-allocated) inputs, outputs (on
CUDA: ``torch.cuda.max_memory_allocated``) included.
BLAS-internal buffers are not torch allocations and are not counted in either path.

    python tools/analysis/benchmark_ops.py [--device cuda] [--dtype bfloat16] [--reps 10]
"""
import argparse
import os
import statistics
import time

import torch

from mmeffvit import ops
from mmeffvit.models import FLattenPVT
from mmeffvit.models.layers import focus_feature_map, kv_first_linear_attention

STAGES = {'stage1 (N=200x334, C=64, h=1)': (200 * 334, 64, 1),
          'stage2 (N=100x167, C=128, h=2)': (100 * 167, 128, 2)}


def sync(device):
    if device == 'cuda':
        torch.cuda.synchronize()


def attention_path(q, k, v, scale, heads):
    b, n, c = q.shape
    d = c // heads

    def split(t):
        return t.reshape(b, -1, heads, d).transpose(1, 2)

    qf = focus_feature_map(q, scale)
    kf = focus_feature_map(k, scale)
    out = kv_first_linear_attention(split(qf), split(kf), split(v.float()))
    return out.transpose(1, 2).reshape(b, n, c)


def run_once(inputs, heads, backward):
    if not backward:
        with torch.no_grad():
            return attention_path(*inputs, heads)
    out = attention_path(*inputs, heads)
    out.backward(torch.ones_like(out))
    return None


def latency(fn, device, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_bytes(fn, device):
    if device == 'cuda':  # the caching allocator keeps exact statistics
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    # CPU: every allocation / free of torch's CPU allocator is a profiler event with its size
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        fn()

    def walk(nodes):
        for node in nodes:
            yield node
            yield from walk(node.children)
    alloc = torch._C._profiler._EventType.Allocation
    events = sorted((e for e in walk(prof.profiler.kineto_results.experimental_event_tree())
                     if e.tag == alloc), key=lambda e: e.start_time_ns)
    live = peak = 0
    for e in events:
        live += e.extra_fields.alloc_size
        peak = max(peak, live)
    return peak


def with_ops(flag, fn):
    old = os.environ.get('MMEFFVIT_OPS')
    os.environ['MMEFFVIT_OPS'] = flag
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop('MMEFFVIT_OPS')
        else:
            os.environ['MMEFFVIT_OPS'] = old


def bench_stage(n, c, heads, device, dtype, reps):
    g = torch.Generator().manual_seed(0)
    rows = []
    for backward in (False, True):
        def make():
            ts = [torch.randn(1, n, c, generator=g).to(device, dtype) for _ in range(3)]
            ts.append(torch.randn(1, 1, c, generator=g).to(device))
            return [t.requires_grad_(backward) for t in ts]
        inputs = make()

        def fn():
            for t in inputs:
                t.grad = None
            return run_once(inputs, heads, backward)
        res = {}
        for flag in ('0', '1'):
            t = with_ops(flag, lambda: latency(fn, device, reps))
            m = with_ops(flag, lambda: peak_bytes(fn, device))
            res[flag] = (t, m)
        rows.append(('fwd+bwd' if backward else 'fwd', res))
    return rows


def bench_backbone(device, dtype, reps):
    model = FLattenPVT('tiny').to(device).eval()
    x = torch.rand(1, 3, 800, 1333, device=device)
    res = {}
    for flag in ('0', '1'):
        def fn():
            with torch.no_grad(), torch.autocast(device, dtype=dtype,
                                                 enabled=dtype != torch.float32):
                model(x)
        res[flag] = with_ops(flag, lambda: latency(fn, device, reps))
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
    parser.add_argument('--reps', type=int, default=10)
    parser.add_argument('--backbone-reps', type=int, default=3)
    parser.add_argument('--no-backbone', action='store_true')
    args = parser.parse_args()
    if ops.load_ext() is None:
        raise SystemExit('mmeffvit._ext is not built: python setup.py build_ext --inplace')
    dtype = getattr(torch, args.dtype)
    print(f'device={args.device} dtype={args.dtype} threads={torch.get_num_threads()} '
          f'torch={torch.__version__}')
    head = (f"| {'case':31s} | pass    | composite ms | op ms  | speed-up | composite MiB "
            f"| op MiB | mem ratio |")
    print(head)
    print('|' + '|'.join('-' * (len(x)) for x in head.split('|')[1:-1]) + '|')
    for name, (n, c, h) in STAGES.items():
        for mode, res in bench_stage(n, c, h, args.device, dtype, args.reps):
            (t0, m0), (t1, m1) = res['0'], res['1']
            print(f'| {name:31s} | {mode:7s} | {t0 * 1e3:12.1f} | {t1 * 1e3:6.1f} | '
                  f'{t0 / t1:7.2f}x | {m0 / 2**20:13.1f} | {m1 / 2**20:6.1f} | {m1 / m0:8.2f}x |',
                  flush=True)
    if not args.no_backbone:
        res = bench_backbone(args.device, dtype, args.backbone_reps)
        print(f'| FLatten-PVT-T 800x1333 backbone | fwd     | {res["0"] * 1e3:12.1f} | '
              f'{res["1"] * 1e3:6.1f} | {res["0"] / res["1"]:7.2f}x |               |        '
              f'|           |')


if __name__ == '__main__':
    main()
