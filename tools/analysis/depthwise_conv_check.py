"""Depthwise convs on token maps: what the layouts cost on this CPU (docs/logs/profiles.md).

Every family except the softmax-only ones runs depthwise convs on maps that are views of
``(B, N, C)`` tokens, i.e. channels-last memory. This measures, at the shapes of FLatten-PVT(v2),
L²ViT and FLatten's DWC at 800×1333 (one image), the forward and the two backward products:

* ``NCHW weight``: the modules as they are; oneDNN copies the channels-last input to NCHW, runs
  its NCHW depthwise kernel and returns NCHW, which the next token-layout op copies back;
* ``channels-last weight``: the same conv with its weight in ``channels_last``: no copies, the
  vectorised NHWC kernel;
* ``grouped weight grad``: the weight gradient as a grouped conv of the padded input with the
  output gradient as kernel (``groups = B·C``), instead of oneDNN's backward-weights kernel.

Outputs and gradients are compared with the NCHW path. Usage::

    python tools/analysis/depthwise_conv_check.py [--threads 2] [--reps 3]
"""
import argparse
import time

import torch
import torch.nn.functional as F

# (what, channels, kernel, H, W) at an 800×1333 input
CASES = [
    ('FLatten-PVT-T DWC stage 1', 64, 5, 200, 334),
    ('FLatten-PVTv2-B1 MLP DWConv stage 1', 512, 3, 200, 334),
    ('FLatten-PVTv2-B0 MLP DWConv stage 2', 512, 3, 100, 167),
    ('L2ViT-T LCM stage 2', 192, 7, 100, 167),
    ('L2ViT-T LCM stage 3', 384, 7, 50, 84),
]


def best(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def grouped_weight_grad(x, grad_out, k):
    """``dL/dw[c, i, j] = Σ_{b,y,x} g[b, c, y, x]·x_pad[b, c, y+i, x+j]`` as one grouped conv."""
    b, c, h, w = x.shape
    p = k // 2
    xp = F.pad(x, (p, p, p, p)).reshape(1, b * c, h + 2 * p, w + 2 * p)
    g = F.conv2d(xp, grad_out.reshape(b * c, 1, h, w), groups=b * c)
    return g.reshape(b, c, k, k).sum(0).unsqueeze(1)


def backward(grad_out, x, weight, k, mask):
    c = weight.shape[0]
    return torch.ops.aten.convolution_backward(grad_out, x, weight, [c], [1, 1], [k // 2] * 2,
                                               [1, 1], False, [0, 0], c, mask)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    parser.add_argument('--reps', type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads; ms, best of '
          f'{args.reps}')
    print('| conv | C | k | map | forward NCHW w | forward CL w | input grad NCHW w | '
          'input grad CL w | weight grad NCHW w | weight grad CL w | grouped weight grad |')
    print('|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|')
    gen = torch.Generator().manual_seed(0)
    for what, c, k, h, w in CASES:
        tokens = torch.randn(1, h * w, c, generator=gen)
        x = tokens.transpose(1, 2).reshape(1, c, h, w)  # channels-last view, as in the models
        grad_out = torch.randn(1, h * w, c, generator=gen).transpose(1, 2).reshape(1, c, h, w)
        weight = torch.randn(c, 1, k, k, generator=gen)
        # not .contiguous(memory_format=...): a (C, 1, k, k) tensor already counts as
        # channels-last contiguous and keeps its NCHW strides, which oneDNN reads as NCHW;
        # .to() (as Module.to(memory_format=...)) writes the channels-last strides (k², 1, k, 1)
        weight_cl = weight.to(memory_format=torch.channels_last)
        cells = []
        outs = []
        for wt in (weight, weight_cl):
            cells.append(best(lambda: F.conv2d(x, wt, padding=k // 2, groups=c), args.reps))
            outs.append(F.conv2d(x, wt, padding=k // 2, groups=c))
        grads = []
        for index in (0, 1):
            for wt in (weight, weight_cl):
                mask = [index == 0, index == 1, False]
                cells.append(best(lambda: backward(grad_out, x, wt, k, mask), args.reps))
                grads.append(backward(grad_out, x, wt, k, mask)[index])
        cells.append(best(lambda: grouped_weight_grad(x, grad_out, k), args.reps))
        ref = grads[2]
        err = max((outs[1] - outs[0]).abs().max() / outs[0].abs().max(),
                  (grads[1] - grads[0]).abs().max() / grads[0].abs().max(),
                  (grads[3] - ref).abs().max() / ref.abs().max(),
                  (grouped_weight_grad(x, grad_out, k) - ref).abs().max() / ref.abs().max())
        print(f'| {what} | {c} | {k} | {h}×{w} | '
              + ' | '.join(f'{t * 1e3:.0f}' for t in cells) + f' |  (max rel. diff {err:.1e})',
              flush=True)


if __name__ == '__main__':
    main()
