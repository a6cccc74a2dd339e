"""Peak training memory of a Focal Transformer backbone against Swin-T at 800×1333.

Peak memory is focal attention's known weakness (the official repository's issue #9 reports
about 2× Swin in segmentation): every query window attends its 49 tokens, the 132 rolled
surrounding tokens and the pooled neighbourhood (230 keys per query in stage 1 against Swin's
49). This script runs one training step (forward of the backbone, ``sum of outputs`` backward)
of each model on the same input and prints both peaks and their ratio.

- On CUDA: ``torch.cuda.max_memory_allocated`` over the step (parameters and gradients
  included), each model measured after ``reset_peak_memory_stats`` in the same process.
- On CPU (no allocator statistics): the bytes of the distinct storages that autograd saves for
  the backward pass (the activations that dominate a training peak) plus parameters and
  gradients, counted with ``saved_tensors_hooks``.

The reference is mmdet's ``SwinTransformer`` tiny (``--ref swin``, window 7, drop path 0.2) or
mmeffvit's ``FLattenSwin`` with ``attn_type='SSSS'`` (``--ref flatten_swin``, plain Swin-T).

Example::

    python tools/analysis/focal_memory.py --arch tiny --size 800x1333 --batch 1
"""
import argparse

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


def step_cpu(model, x):
    """Saved-activation bytes (distinct storages) of one step plus parameters and gradients."""
    seen = {}

    def pack(t):
        try:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = model(x)
    sum(o.float().sum() for o in outs).backward()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return sum(seen.values()) + 2 * params


def step_cuda(model, x):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    outs = model(x)
    sum(o.float().sum() for o in outs).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


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
    step = step_cuda if device.type == 'cuda' else step_cpu
    peaks = {}
    for name in (args.ref, 'focal'):
        model = build(name, args.arch).to(device)
        model.train()  # mmdet's Swin.train() returns None
        peaks[name] = step(model, x)
        del model
        print(f'{name:>12}: peak {peaks[name] / 2 ** 20:9.1f} MiB '
              f'({"allocator peak" if device.type == "cuda" else "saved activations + params"})')
    ratio = peaks['focal'] / peaks[args.ref]
    print(f'Focal-{args.arch} / {args.ref} (Swin-T) at {h}x{w}, batch {args.batch}, '
          f'{device.type}: {ratio:.2f}x (limit {args.limit}x) '
          f'{"OK" if ratio <= args.limit else "OVER"}')
    return 0 if ratio <= args.limit else 1


if __name__ == '__main__':
    raise SystemExit(main())
