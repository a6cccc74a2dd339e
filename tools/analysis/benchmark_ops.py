"""Benchmark mmeffvit's compiled attention operators against the PyTorch composite, in one run.

Measures, at the token counts of FLatten-PVT-T stages 1-2 for an 800×1333 input, the attention
path of :class:`FocusedLinearAttention` (:func:`mmeffvit.ops.focused_linear_attention`:
focusing function on q and k, head split, kv-first linear attention, head merge; the DWC and
projections are identical in both paths and left out), plus FLatten-Swin-T's stage-1 windows:
latency (median of ``--reps`` runs, the two paths interleaved so that load changes hit both) and
peak memory, forward (inference, no grad) and forward+backward, ops (``MMEFFVIT_OPS=1``) vs
composite (``MMEFFVIT_OPS=0``). Then the whole FLatten-PVT-T backbone at 800×1333 with ops on
and off: inference forward and one training step.

Peak memory: ``tracemalloc`` does not see torch's allocations, and RSS is blurred by the malloc
arena, so the run is repeated under ``torch.profiler`` with ``profile_memory=True``: every
allocation and free of torch's CPU allocator is an event with its size, and the peak of their
running sum is the peak of memory allocated on top of the (pre-allocated) inputs, outputs (on
CUDA: ``torch.cuda.max_memory_allocated``) included.
BLAS-internal buffers are not torch allocations and are not counted in either path.

    python tools/analysis/benchmark_ops.py [--device cuda] [--dtype bfloat16] [--reps 10]
"""
import argparse
import statistics
import time

import torch

from mmeffvit import ops
from mmeffvit.models import FLattenPVT

# (batches, tokens, channels, heads): FLatten-PVT-T stages 1-2 attend globally (sr 1); the
# FLatten-Swin-T stage-1 row is the many-small-windows case (29 x 48 windows of 7x7)
STAGES = {'PVT-T stage1 (N=200x334, C=64)': (1, 200 * 334, 64, 1),
          'PVT-T stage2 (N=100x167, C=128)': (1, 100 * 167, 128, 2),
          'Swin-T stage1 (1392 x 49, C=96)': (29 * 48, 49, 96, 3)}


def sync(device):
    if device == 'cuda':
        torch.cuda.synchronize()


def attention_path(q, k, v, scale, heads):
    """What ``FocusedLinearAttention.attend`` runs between the projections and the DWC."""
    return ops.focused_linear_attention(q, k, v, scale, heads)


def run_once(inputs, heads, backward):
    if not backward:
        with torch.no_grad():
            return attention_path(*inputs, heads)
    out = attention_path(*inputs, heads)
    out.backward(torch.ones_like(out))
    return None


def latencies(fns, device, reps):
    """Median seconds of each function, runs interleaved so that load changes hit all alike."""
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


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
    """``fn()`` on the compiled operators (``flag`` '1') or on the references ('0')."""
    with ops.use_kernels() if flag == '1' else ops.use_reference():
        return fn()


def bench_stage(nb, n, c, heads, device, dtype, reps):
    g = torch.Generator().manual_seed(0)
    rows = []
    for backward in (False, True):
        def make():
            ts = [torch.randn(nb, n, c, generator=g).to(device, dtype) for _ in range(3)]
            ts.append(torch.randn(1, 1, c, generator=g).to(device))
            return [t.requires_grad_(backward) for t in ts]
        inputs = make()

        def fn():
            for t in inputs:
                t.grad = None
            return run_once(inputs, heads, backward)
        t0, t1 = latencies([lambda: with_ops('0', fn), lambda: with_ops('1', fn)], device, reps)
        res = {'0': (t0, with_ops('0', lambda: peak_bytes(fn, device))),
               '1': (t1, with_ops('1', lambda: peak_bytes(fn, device)))}
        rows.append(('fwd+bwd' if backward else 'fwd', res))
    return rows


def bench_backbone(device, dtype, reps, backward):
    """FLatten-PVT-T at 800×1333: inference forward, or a training step (forward + backward)."""
    model = FLattenPVT('tiny').to(device)
    model.train(backward)
    x = torch.rand(1, 3, 800, 1333, device=device)

    def fn():
        with torch.set_grad_enabled(backward), torch.autocast(
                device, dtype=dtype, enabled=dtype != torch.float32):
            outs = model(x)
        if backward:
            model.zero_grad(set_to_none=True)
            sum(o.float().mean() for o in outs).backward()
    t0, t1 = latencies([lambda: with_ops('0', fn), lambda: with_ops('1', fn)], device, reps)
    res = {'0': t0, '1': t1}
    if device == 'cuda' or not backward:
        return res, None
    m0 = with_ops('0', lambda: peak_bytes(fn, device))
    m1 = with_ops('1', lambda: peak_bytes(fn, device))
    return res, (m0, m1)


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
    for name, (nb, n, c, h) in STAGES.items():
        for mode, res in bench_stage(nb, n, c, h, args.device, dtype, args.reps):
            (t0, m0), (t1, m1) = res['0'], res['1']
            print(f'| {name:31s} | {mode:7s} | {t0 * 1e3:12.1f} | {t1 * 1e3:6.1f} | '
                  f'{t0 / t1:7.2f}x | {m0 / 2**20:13.1f} | {m1 / 2**20:6.1f} | {m1 / m0:8.2f}x |',
                  flush=True)
    if not args.no_backbone:
        for backward in (False, True):
            res, mem = bench_backbone(args.device, dtype, args.backbone_reps, backward)
            m = (f'{mem[0] / 2**20:13.1f} | {mem[1] / 2**20:6.1f} | {mem[1] / mem[0]:8.2f}x'
                 if mem else f'{"":13s} | {"":6s} | {"":9s}')
            print(f'| {"FLatten-PVT-T 800x1333":31s} | {"fwd+bwd" if backward else "fwd":7s} | '
                  f'{res["0"] * 1e3:12.1f} | {res["1"] * 1e3:6.1f} | '
                  f'{res["0"] / res["1"]:7.2f}x | {m} |', flush=True)


if __name__ == '__main__':
    main()
