"""Attention saturation check (LaViT paper sec. 4.5, Fig. 3): cosine similarity between the
attention maps of consecutive layers of one stage, for LaViT and a PVT (v1) baseline.

A similarity near 1 means a layer re-computes (almost) the attention of the layer before it,
the saturation LaViT's less-attention layers are meant to avoid. The maps are the softmax
probabilities ``(B, heads, N_q, N_k)`` of every layer of ``--stage``, flattened per image and
head; the printed value is the mean over images and heads. Without checkpoints both models are
randomly initialised (then the numbers only exercise the script: LaViT's LA layers start as the
identity transform, i.e. similarity 1 by construction). Example::

    python tools/analysis/attention_saturation.py --arch base --stage 3 \
        --lavit-checkpoint work_dirs/lavit_b.pth --pvt-checkpoint checkpoints/pvt_medium.pth
"""
import argparse

import torch
import torch.nn.functional as F

# PVT v1 depths matching the LaViT archs (sec. 4.1: "same network structure as PVT")
PVT_DEPTHS = {'tiny': [2, 2, 2, 2], 'small': [3, 4, 6, 3], 'base': [3, 4, 18, 3]}


def lavit_maps(model, x, stage):
    """Softmax maps ``(B, heads, N, n)`` of every layer of ``stage`` (1-based) of a LaViT: VA
    layers' ``softmax(QKᵀ/√d + R)``, LA layers' ``softmax(Ψ(Θ(A)ᵀ)ᵀ)``, rebuilt from the
    recorded inputs (the layers keep no probability maps of their own)."""
    from mmeffvit.analysis.attention_maps import record_maps
    targets = [(stage, j + 1) for j in range(len(getattr(model, f'block{stage}')))]
    per_image = [record_maps(model, x[i:i + 1], targets)[0] for i in range(x.shape[0])]
    return [torch.stack([blocks[j].kinds[0].matrix for blocks in per_image]).float()
            for j in range(len(targets))]


def pvt_maps(model, x, stage):
    """Softmax maps of a FLattenPVT built with SRA ('S') blocks, recomputed from q/k."""
    maps = []

    def hook(attn, inputs, _):
        tokens, hw = inputs
        b, n, c = tokens.shape
        h = attn.num_heads
        q = attn.q(tokens).reshape(b, n, h, c // h).transpose(1, 2)
        src = tokens
        if attn.sr_ratio > 1:
            grid = attn.sr(tokens.transpose(1, 2).reshape(b, c, *hw))
            src = attn.norm(grid.flatten(2).transpose(1, 2))
        k = attn.kv(src).reshape(b, -1, 2, h, c // h)[:, :, 0].transpose(1, 2)
        maps.append(((q @ k.transpose(-2, -1)) * (c // h) ** -0.5).softmax(-1).detach())

    hooks = [blk.attn.register_forward_hook(hook) for blk in getattr(model, f'block{stage}')]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return maps


def consecutive_similarity(maps):
    """Mean cosine similarity of layer l and l-1 maps, for l = 2..L."""
    sims = []
    for prev, cur in zip(maps[:-1], maps[1:]):
        if prev.shape != cur.shape:
            sims.append(float('nan'))
            continue
        sims.append(float(F.cosine_similarity(prev.flatten(2), cur.flatten(2), dim=-1).mean()))
    return sims


def load(model, path):
    if path:
        from mmeffvit.utils import load_checkpoint_file, unwrap_state_dict
        ckpt = load_checkpoint_file(path, tensors_only=True)
        state = model.convert_weights(unwrap_state_dict(ckpt))
        print(path, model.load_state_dict(state, strict=False))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', default='base', choices=sorted(PVT_DEPTHS))
    parser.add_argument('--stage', type=int, default=3)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--lavit-checkpoint')
    parser.add_argument('--pvt-checkpoint')
    args = parser.parse_args()

    from mmengine.logging import MMLogger

    from mmeffvit.models import FLattenPVT, LaViT
    MMLogger.get_current_instance().setLevel('WARNING')  # no per-parameter init report
    torch.manual_seed(args.seed)
    lavit = LaViT(args.arch, la_mode='dense', pretrain_img_size=args.size)
    pvt = FLattenPVT(dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8],
                          mlp_ratios=[8, 8, 4, 4], depths=PVT_DEPTHS[args.arch],
                          sr_ratios=[8, 4, 2, 1], attn_types='SSSS'),
                     pretrain_img_size=args.size)
    for model, path in ((lavit, args.lavit_checkpoint), (pvt, args.pvt_checkpoint)):
        model.init_weights()
        load(model, path)
        model.eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    rows = [('LaViT-' + args.arch, consecutive_similarity(lavit_maps(lavit, x, args.stage))),
            ('PVT (same depths)', consecutive_similarity(pvt_maps(pvt, x, args.stage)))]
    kinds = ['VA' if not b.less_attention else 'LA' for b in getattr(lavit, f'block{args.stage}')]
    print(f'stage {args.stage}: cosine similarity of layer l and l-1 attention maps')
    print(f"{'layer':>6} {'LaViT type':>10} " + ' '.join(f'{name:>18}' for name, _ in rows))
    for i in range(len(rows[0][1])):
        print(f'{i + 2:>6} {kinds[i + 1]:>10} ' + ' '.join(f'{sims[i]:18.4f}' for _, sims in rows))
    for name, sims in rows:
        print(f'{name}: mean {sum(sims) / max(len(sims), 1):.4f}')


if __name__ == '__main__':
    main()
