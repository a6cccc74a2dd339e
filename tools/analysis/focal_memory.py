"""Peak training memory of a Focal Transformer backbone against Swin-T at 800×1333.

Peak memory is focal attention's known weakness (the official repository's issue #9 reports
about 2× Swin in segmentation): every query window attends its 49 tokens, the 132 rolled
surrounding tokens and the pooled neighbourhood (230 keys per query in stage 1 against Swin's
49). This script runs one training step (forward of the backbone, ``sum of outputs`` backward)
of each model (drop path off in both) on the same input and prints, per model, two numbers and
their ratios:

- **measured**: parameter bytes plus the peak of the memory that torch's allocator holds during
  the step above what it held before it (the input and the parameters are allocated before;
  activations, workspaces and gradients during). On CUDA the allocator's own statistics
  (``max_memory_allocated``); on CPU the allocation and free events of ``torch.profiler`` with
  ``profile_memory=True``, summed in time order with the running maximum kept
  (:func:`benchmark_ops.peak_bytes`). BLAS/oneDNN-internal buffers are not torch allocations
  and are not counted on CPU.
- **estimate**: the bytes of the distinct storages other than parameters that autograd saves
  for the backward pass (the activations that dominate a training peak) plus parameters and
  gradients, counted with
  ``saved_tensors_hooks`` in the same step. It ignores transient buffers (e.g. the attention
  logits before the softmax) and counts gradients and all saved tensors as live at once.

The reference is mmdet's ``SwinTransformer`` tiny (``--ref swin``, window 7) or
mmeffvit's ``FLattenSwin`` with ``attn_type='SSSS'`` (``--ref flatten_swin``, plain Swin-T).

Example::

    python tools/analysis/focal_memory.py --arch tiny --size 800x1333 --batch 1
"""
import argparse
import os.path as osp
import sys

import torch


def build(name, arch):
    if name == 'focal':
        from mmeffvit.models import FocalTransformer
        return FocalTransformer(arch, drop_path_rate=0.)
    if name == 'swin':
        from mmdet.models.backbones import SwinTransformer
        return SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
                               window_size=7, drop_path_rate=0.)
    from mmeffvit.models import FLattenSwin
    return FLattenSwin('tiny', attn_type='SSSS', drop_path_rate=0.)


def step(model, x):
    """One training step: ``(measured, estimate)`` bytes, see the module docstring."""
    from benchmark_ops import peak_bytes  # tools/analysis/benchmark_ops.py
    seen = {}
    # weights saved for the backward are the parameters themselves: counted once, below
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        try:
            storage = t.untyped_storage()
            if storage.data_ptr() not in own:
                seen[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    def run():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outs = model(x)
        sum(o.float().sum() for o in outs).backward()

    params = sum(p.numel() * p.element_size() for p in model.parameters())
    measured = params + peak_bytes(run, x.device.type)
    return measured, sum(seen.values()) + 2 * params


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', default='tiny', help='Focal arch (tiny/small/base)')
    parser.add_argument('--ref', default='swin', choices=['swin', 'flatten_swin'])
    parser.add_argument('--size', default='800x1333', help='HxW')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--limit', type=float, default=2.5, help='ratio the run must stay under')
    args = parser.parse_args()
    h, w = (int(v) for v in args.size.lower().split('x'))
    device = torch.device(args.device)
    x = torch.rand(args.batch, 3, h, w, device=device)
    tool_dir = osp.dirname(osp.abspath(__file__))
    # this tool's folder (benchmark_ops) and the checkout (mmeffvit, also when not installed)
    sys.path[:0] = [tool_dir, osp.dirname(osp.dirname(tool_dir))]
    names = {args.ref: 'Swin-T' if args.ref == 'swin' else 'FLatten-Swin SSSS (Swin-T)',
             'focal': f'Focal-{args.arch}'}
    peaks = {}
    for name in (args.ref, 'focal'):
        model = build(name, args.arch).to(device)
        model.train()  # mmdet's Swin.train() returns None
        peaks[name] = step(model, x)
        del model
    ratio = [f / r for f, r in zip(peaks['focal'], peaks[args.ref])]
    print(f'one training step at {h}x{w}, batch {args.batch}, {device.type}, torch '
          f'{torch.__version__}')
    print('| backbone | measured peak (MiB) | estimate (MiB) |')
    print('|---|---:|---:|')
    for name in (args.ref, 'focal'):
        print(f'| {names[name]} | {peaks[name][0] / 2**20:.1f} | {peaks[name][1] / 2**20:.1f} |')
    print(f'| ratio | {ratio[0]:.2f}x | {ratio[1]:.2f}x |')
    ok = ratio[0] <= args.limit
    print(f'measured ratio {ratio[0]:.2f}x, limit {args.limit}x: {"OK" if ok else "OVER"}')
    return 0 if ok else 1


if __name__ == '__main__':
    raise SystemExit(main())
