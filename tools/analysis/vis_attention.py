"""Attention maps of a backbone on a photo, and the rank / entropy of its attention matrices.

For chosen blocks of a backbone (from a config, or ``--backbone TYPE --arch A``) and chosen query
points, draws what each query attends to over the image, one PNG per block with a panel per
query and kind of map, and writes the rank and entropy of every full N×n attention matrix per
head (table printed and saved as markdown + CSV, bar chart PNG). Examples::

    python tools/analysis/vis_attention.py --backbone FLattenPVT --arch tiny
    python tools/analysis/vis_attention.py --backbone LaViT --arch tiny --stage 3 --block 1 2 \\
        --img sample:chelsea --points 120,80 300,200
    python tools/analysis/vis_attention.py configs/mask_rcnn_flatten_pvt_t_1x.py \\
        --checkpoint work_dirs/mask_rcnn_flatten_pvt_t_1x/epoch_12.pth --out-dir outputs/attn

Maps (recomputed in float64 from the blocks' recorded inputs and their own weights, see
:mod:`mmeffvit.analysis.attention_maps`): FLatten's focused linear map ``φ(q)·φ(k)ᵀ`` normalised,
its depthwise-conv term (drawn as the channel-mean kernel's neighbourhood weights), their sum,
and the softmax map of the same q, k; LaViT's VA and LA maps; Focal's fine and pooled levels;
L²ViT's global linear (LGA) and window (LWA) maps; Swin windows and CSWin stripes. The rank is
numerical: singular values above ``σ₁·max(N, n)·ε`` (ε of float64), plus an effective rank at
``1e-3·σ₁``; entropies are of rows normalised to sum one.

Without ``--checkpoint`` the backbone keeps random weights (seeded): the tool prints so and
writes it on every picture. The picture is resized so that its shorter side is ``--size``
(rounded to multiples of 32); ``--points x,y`` are pixels of the original picture, by default
the peaks of a spectral-residual saliency map (Hou & Zhang, CVPR 2007).
"""
import argparse
import csv
import os
import os.path as osp
import pickle
import sys
import textwrap

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

import cv2  # noqa: E402  (mmcv's dependency)
import matplotlib  # noqa: E402

matplotlib.use('Agg')  # files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402

from mmeffvit.utils import SAMPLE_PHOTOS, sample_photo  # noqa: E402
from mmeffvit.analysis.attention_maps import (BACKBONE_LAYOUTS, backbone_layout,  # noqa: E402
                                              record_maps, stage_blocks)
from mmeffvit.utils.suggest import unknown_choice_error  # noqa: E402

RANDOM_WEIGHTS = 'RANDOM WEIGHTS (no checkpoint): the maps show an untrained model'
#: blocks drawn when --stage/--block are not given: the ones that show each family's maps
DEFAULT_TARGETS = {
    'FLattenPVT': [(2, 1)], 'FLattenPVTv2': [(2, 1)], 'LaViT': [(3, 1), (3, 2)],
    'FocalTransformer': [(2, 1)], 'L2ViT': [(2, 1), (2, 2)], 'FLattenSwin': [(2, 1), (3, 2)],
    'FLattenCSWin': [(2, 1), (3, 1)],
}
IMAGENET_MEAN, IMAGENET_STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


class VisAttentionError(ValueError):
    """A bad option, picture, config or checkpoint: the message says which and why."""


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', nargs='?', help='mmdet/mmseg/mmpretrain config whose '
                        'model.backbone is drawn (or use --backbone)')
    parser.add_argument('--backbone', help=f'backbone type: {", ".join(BACKBONE_LAYOUTS)}')
    parser.add_argument('--arch', default='tiny', help='arch of --backbone (default tiny)')
    parser.add_argument('--backbone-options', nargs='+', action=DictAction, default={},
                        help='more constructor arguments, key=value (e.g. la_mode=dense)')
    parser.add_argument('--checkpoint', help='trained weights: a backbone, classifier or '
                        'detector/segmentor checkpoint (without: random weights)')
    parser.add_argument('--img', default='sample:astronaut', help='picture, or sample:NAME '
                        f'({", ".join(SAMPLE_PHOTOS)})')
    parser.add_argument('--size', type=int, nargs='+', default=[224],
                        help='shorter side of the model input (rounded to a multiple of 32), or '
                        'H W exactly (default 224)')
    parser.add_argument('--stage', type=int, nargs='+', help='stage(s), 1-based')
    parser.add_argument('--block', type=int, nargs='+', help='block(s) of each stage, 1-based '
                        '(default 1)')
    parser.add_argument('--points', nargs='+', metavar='X,Y',
                        help='query points in pixels of the original picture (default: 3 '
                        'salient points)')
    parser.add_argument('--head', type=int, help='draw one head (1-based) instead of the mean '
                        'over heads')
    parser.add_argument('--out-dir', default='outputs/attention')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--seed', type=int, default=0, help='seed of the random weights')
    parser.add_argument('--max-rank-tokens', type=int, default=4096,
                        help='skip the rank of matrices with more rows or columns (SVD cost)')
    return parser


# ---- model --------------------------------------------------------------------------------------
def backbone_config(args):
    """The backbone's config dict, a short name for files and titles, and the input
    normalisation (the config's ``data_preprocessor`` mean/std, else ImageNet's)."""
    if (args.config is None) == (args.backbone is None):
        raise VisAttentionError('give a CONFIG or --backbone TYPE (one of them)')
    if args.backbone is not None:
        names = {n.lower(): n for n in BACKBONE_LAYOUTS}
        name = names.get(args.backbone.split('.')[-1].lower())
        if name is None:
            from mmeffvit.registry import mmeffvit_model_names
            known = {n.lower() for n in mmeffvit_model_names()}
            if args.backbone.split('.')[-1].lower() in known:
                raise VisAttentionError(f'{args.backbone} has no attention maps here yet; '
                                        f'supported: {", ".join(BACKBONE_LAYOUTS)}')
            raise VisAttentionError(unknown_choice_error('backbone', args.backbone,
                                                         BACKBONE_LAYOUTS).args[0])
        cfg = dict(type=name, arch=args.arch)
        label = f'{name}-{args.arch}'
        norm = (IMAGENET_MEAN, IMAGENET_STD)
    else:
        if not osp.isfile(args.config):
            raise VisAttentionError(f'config {args.config} not found')
        model = Config.fromfile(args.config).get('model')
        cfg = model.get('backbone', model) if isinstance(model, dict) else None
        if not isinstance(cfg, dict) or 'type' not in cfg:
            raise VisAttentionError(f'{args.config} has no model.backbone')
        cfg = cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg)
        label = osp.splitext(osp.basename(args.config))[0]
        pre = model.get('data_preprocessor') or {}
        norm = (tuple(pre.get('mean', IMAGENET_MEAN)), tuple(pre.get('std', IMAGENET_STD)))
    cfg.update(args.backbone_options)
    # weights come from --checkpoint only: a config's ImageNet init would be silent otherwise
    cfg['init_cfg'] = None
    return cfg, label, norm


def build_backbone(cfg, seed):
    import mmeffvit  # noqa: F401  registers the models
    from mmengine.logging import MMLogger

    from mmeffvit.registry import MODELS
    MMLogger.get_current_instance().setLevel('WARNING')  # no per-parameter init report
    torch.manual_seed(seed)
    try:
        model = MODELS.build(cfg)
    except (KeyError, ValueError, TypeError) as err:
        raise VisAttentionError(f'cannot build the backbone {cfg}: {err}') from err
    backbone_layout(model)  # a clear error for backbones without map drawing
    model.init_weights()
    return model


def load_weights(model, path):
    """Load ``path`` into the backbone; returns the report line and the missing keys."""
    from mmeffvit.utils import load_checkpoint_file, unwrap_state_dict
    from mmeffvit.utils.checkpoint_fit import check_fit
    if not osp.isfile(path):
        raise VisAttentionError(f'checkpoint {path} not found')
    try:
        state = unwrap_state_dict(load_checkpoint_file(path, tensors_only=True))
        state = model.convert_weights(state)
        report = check_fit(model, state, source=f'checkpoint {path}', is_backbone=True)
    except (RuntimeError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as err:
        raise VisAttentionError(str(err)) from err
    missing = model.load_state_dict(state, strict=False).missing_keys
    return report.line(), missing


# ---- picture and points -------------------------------------------------------------------------
def read_picture(spec):
    """RGB uint8 array of a file or ``sample:NAME``."""
    if spec.startswith('sample:'):
        try:
            spec = sample_photo(spec[len('sample:'):])
        except (KeyError, OSError, ImportError) as err:
            raise VisAttentionError(err.args[0] if err.args else str(err)) from err
    if not osp.isfile(spec):
        raise VisAttentionError(f'picture {spec} not found')
    bgr = cv2.imread(spec, cv2.IMREAD_COLOR)
    if bgr is None:
        raise VisAttentionError(f'{spec} is not a readable picture')
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def input_size(shape, size):
    """``(H, W)`` of the model input: shorter side ``size[0]`` (multiples of 32) or exact."""
    if len(size) == 2:
        if min(size) < 32:
            raise VisAttentionError(f'--size {size}: each side must be at least 32')
        return tuple(size)
    if len(size) != 1 or size[0] < 32:
        raise VisAttentionError(f'--size takes one value >= 32 or two (H W), got {size}')
    scale = size[0] / min(shape[:2])
    return tuple(max(32, int(round(s * scale / 32)) * 32) for s in shape[:2])


def parse_points(specs, shape):
    points = []
    for spec in specs:
        try:
            x, y = (float(v) for v in spec.split(','))
        except ValueError:
            raise VisAttentionError(f'--points {spec!r}: expected x,y in pixels') from None
        if not (0 <= x < shape[1] and 0 <= y < shape[0]):
            raise VisAttentionError(f'--points {spec}: outside the {shape[1]}x{shape[0]} '
                                    'picture')
        points.append((x, y))
    return points


def salient_points(rgb, count=3):
    """``count`` peaks of the spectral-residual saliency (Hou & Zhang 2007), kept apart by a
    fifth of the shorter side and away from the border, in pixels of ``rgb``."""
    height, width = rgb.shape[:2]
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float64)
    small_w = 64
    small = cv2.resize(grey, (small_w, max(8, round(small_w * height / width))),
                       interpolation=cv2.INTER_AREA)
    spectrum = np.fft.fft2(small)
    log_amplitude = np.log(np.abs(spectrum) + 1e-9)
    residual = log_amplitude - cv2.blur(log_amplitude, (3, 3))
    saliency = np.abs(np.fft.ifft2(np.exp(residual + 1j * np.angle(spectrum)))) ** 2
    saliency = cv2.GaussianBlur(saliency, (0, 0), 2.5)
    saliency = cv2.resize(saliency, (width, height), interpolation=cv2.INTER_LINEAR)
    margin = int(0.08 * min(height, width))
    saliency[:margin], saliency[-margin:] = 0, 0
    saliency[:, :margin], saliency[:, -margin:] = 0, 0
    radius = min(height, width) / 5
    ys, xs = np.mgrid[:height, :width]
    points = []
    for _ in range(count):
        y, x = np.unravel_index(np.argmax(saliency), saliency.shape)
        points.append((float(x), float(y)))
        saliency[(ys - y) ** 2 + (xs - x) ** 2 < radius ** 2] = -1
    return points


def to_tensor(rgb, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    x = (rgb.astype(np.float32) - np.array(mean, np.float32)) / np.array(std, np.float32)
    return torch.from_numpy(x).permute(2, 0, 1)[None].contiguous()


# ---- drawing ------------------------------------------------------------------------------------
def token_stride(image_hw, grid):
    """Pixels per stage token (a power of two; the patch embeddings pad to whole tokens)."""
    return 2 ** round(float(np.log2(image_hw[0] / grid[0])))


def query_token(point, stride, grid):
    row = min(int(point[1] // stride), grid[0] - 1)
    col = min(int(point[0] // stride), grid[1] - 1)
    return row * grid[1] + col, (row, col)


def map_row(kind, token, head):
    row = kind.matrix[:, token]
    values = row.mean(0) if head is None else row[head]
    return values.reshape(kind.key_grid).numpy()


def overlay(ax, values, kind, stride, signed):
    """Draw ``values`` on the key grid of ``kind`` at its pixel position; returns the mappable.

    Opacity grows with the magnitude, so cells a query does not see stay clear."""
    vmax = float(np.abs(values).max()) or 1.0
    cmap = plt.get_cmap('RdBu_r' if signed else 'inferno')
    norm = Normalize(-vmax if signed else 0.0, vmax)
    rgba = cmap(norm(values))
    rgba[..., 3] = 0.9 * np.sqrt(np.clip(np.abs(values) / vmax, 0, 1))
    (rows, cols), (cell_h, cell_w) = kind.key_grid, kind.key_cell
    top, left = kind.key_origin[0] * stride, kind.key_origin[1] * stride
    extent = (left, left + cols * cell_w * stride, top + rows * cell_h * stride, top)
    ax.imshow(rgba, extent=extent, interpolation='nearest')
    return plt.cm.ScalarMappable(norm=norm, cmap=cmap)


def draw_block(block, image, points, original_points, path, header, random_weights, head):
    """One PNG: a panel per query point and kind of map (points in rows, kinds in columns;
    a block with one kind of map puts its points side by side)."""
    kinds = [k for k in block.kinds if k.draw]
    height, width = image.shape[:2]
    stride = token_stride((height, width), block.query_grid)
    rows, cols = (1, len(points)) if len(kinds) == 1 else (len(points), len(kinds))
    panel = 3.4
    fig_width = max(7.5, panel * cols + 0.6)
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(
        fig_width, panel * height / width * rows + 1.8))
    grey = np.repeat(image.mean(-1, keepdims=True), 3, -1).astype(np.uint8)
    for p, (point, shown) in enumerate(zip(points, original_points)):
        token, (row, col) = query_token(point, stride, block.query_grid)
        for k, kind in enumerate(kinds):
            ax = axes[0][p] if len(kinds) == 1 else axes[p][k]
            values = map_row(kind, token, head)
            ax.imshow(grey, alpha=0.75)
            mappable = overlay(ax, values, kind, stride, kind.signed)
            fig.colorbar(mappable, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
            ax.add_patch(plt.Rectangle((col * stride, row * stride), stride, stride, fill=False,
                                       edgecolor='lime', linewidth=1.2))
            ax.plot(*point, marker='+', markersize=14, markeredgewidth=2, color='lime')
            ax.set_xlim(0, width)
            ax.set_ylim(height, 0)
            ax.set_xticks([])
            ax.set_yticks([])
            title = textwrap.fill(kind.title, 40)
            ax.set_title(f'{title}\nq{p + 1} ({shown[0]:.0f}, {shown[1]:.0f})  '
                         f'row sum {values.sum():.3g}', fontsize=7)
    chars = int(fig_width * 15)
    fig.suptitle('\n'.join(textwrap.fill(line, chars) for line in header.split('\n')),
                 fontsize=9)
    if random_weights:
        fig.text(0.5, 0.005, RANDOM_WEIGHTS, ha='center', va='bottom', color='white',
                 fontsize=10, weight='bold', bbox=dict(facecolor='red', edgecolor='none'))
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- rank and entropy ---------------------------------------------------------------------------
def singular_values(matrix):
    """``torch.linalg.svdvals`` on one thread: at these sizes LAPACK gains little from threads
    and loses a lot when the cores are shared (784² float64: 0.29 s on one thread, 27 s on two
    on a loaded 2-core machine, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.linalg.svdvals(matrix)
    finally:
        torch.set_num_threads(threads)


def rank_entropy(block, max_tokens):
    """One dict per (kind, head): numerical rank, effective rank, mean row entropy."""
    rows = []
    for kind in block.kinds:
        heads, n_rows, n_cols = kind.matrix.shape
        if max(n_rows, n_cols) > max_tokens:
            rows.append(dict(kind=kind.name, head='all', N=n_rows, n=n_cols,
                             rank='skipped', note=f'more than --max-rank-tokens {max_tokens}'))
            continue
        sv = singular_values(kind.matrix)
        tol = sv[:, :1] * max(n_rows, n_cols) * torch.finfo(torch.float64).eps
        ranks = (sv > tol).sum(-1)
        effective = (sv > 1e-3 * sv[:, :1]).sum(-1)
        entropy = [None] * heads
        if not kind.signed:
            mass = kind.matrix.sum(-1, keepdim=True)
            p = kind.matrix / mass.clamp(min=1e-300)
            row_entropy = -(p * torch.log(p.clamp(min=1e-300))).sum(-1)
            entropy = [float(row_entropy[h][mass[h, :, 0] > 0].mean()) for h in range(heads)]
        for h in range(heads):
            rows.append(dict(kind=kind.name, head=h + 1, N=n_rows, n=n_cols,
                             rank=int(ranks[h]), effective_rank=int(effective[h]),
                             entropy=entropy[h], tolerance=float(tol[h, 0])))
    return rows


def write_rank_files(block, rows, stem, label):
    """Markdown, CSV and a bar chart PNG of ``rows``; returns the markdown text."""
    fields = ['kind', 'head', 'N', 'n', 'rank', 'effective_rank', 'entropy', 'tolerance']
    with open(stem + '.csv', 'w', newline='') as f:
        writer = csv.DictWriter(f, fields, extrasaction='ignore')
        writer.writeheader()
        writer.writerows(rows)
    titles = {k.name: k.title for k in block.kinds}
    lines = [f'# Attention matrix rank and entropy: {label}, stage {block.stage} block '
             f'{block.block}', '',
             f'{block.attention}; {block.num_heads} heads of {block.head_dims} channels. '
             'rank: singular values > σ₁·max(N, n)·ε (float64 ε = 2.2e-16); effective rank: '
             '> 1e-3·σ₁; entropy: mean over queries of the row normalised to sum one (nats), '
             '"-" for signed maps. A linear map φ(Q)φ(K)ᵀ has rank at most '
             f'd = {block.head_dims} per head.', '',
             '| kind | head | N × n | rank | effective rank | entropy |',
             '|---|---|---|---|---|---|']
    for row in rows:
        entropy = row.get('entropy')
        lines.append(f"| {row['kind']} ({titles[row['kind']]}) | {row['head']} | "
                     f"{row['N']} × {row['n']} | {row['rank']} | "
                     f"{row.get('effective_rank', '-')} | "
                     f"{'-' if entropy is None else f'{entropy:.2f}'} |")
    text = '\n'.join(lines) + '\n'
    with open(stem + '.md', 'w', encoding='utf-8') as f:
        f.write(text)
    ranked = [r for r in rows if isinstance(r['rank'], int)]
    kinds = list(dict.fromkeys(r['kind'] for r in ranked))
    if kinds:
        fig, ax = plt.subplots(figsize=(3.2 + 0.5 * block.num_heads * len(kinds), 3.6))
        width = 0.8 / len(kinds)
        for i, name in enumerate(kinds):
            values = [r['rank'] for r in ranked if r['kind'] == name]
            ax.bar(np.arange(len(values)) + (i - (len(kinds) - 1) / 2) * width, values, width,
                   label=name)
        full = min(min(r['N'], r['n']) for r in ranked)
        ax.axhline(full, color='k', linestyle=':', linewidth=1, label=f'full rank {full}')
        ax.axhline(block.head_dims, color='grey', linestyle='--', linewidth=1,
                   label=f'head dims d = {block.head_dims}')
        ax.set_xticks(range(block.num_heads), [f'head {h + 1}' for h in range(block.num_heads)])
        ax.set_ylabel('numerical rank')
        ax.set_title(f'{label} stage {block.stage} block {block.block}: rank per head\n'
                     '(σ > σ₁·max(N, n)·ε₆₄)', fontsize=9)
        ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
        fig.tight_layout()
        fig.savefig(stem + '.png', dpi=90)
        plt.close(fig)
    return text


# ---- main ---------------------------------------------------------------------------------------
def targets_of(args, model):
    if args.stage is None:
        if args.block is not None:
            raise VisAttentionError('--block needs --stage')
        for cls in type(model).__mro__:
            if cls.__name__ in DEFAULT_TARGETS:
                return DEFAULT_TARGETS[cls.__name__]
    blocks = args.block or [1]
    targets = [(s, b) for s in args.stage for b in blocks]
    for stage, block in targets:  # clear errors before the forward
        count = len(stage_blocks(model, stage))
        if not 1 <= block <= count:
            raise VisAttentionError(f'--block {block}: stage {stage} has blocks 1..{count}')
    return targets


def run(args):
    """Draw and measure; returns the lines to print."""
    cfg, label, norm = backbone_config(args)
    picture = read_picture(args.img)
    points = (parse_points(args.points, picture.shape) if args.points
              else salient_points(picture))
    height, width = input_size(picture.shape, args.size)
    image = cv2.resize(picture, (width, height), interpolation=cv2.INTER_AREA)
    scale = (width / picture.shape[1], height / picture.shape[0])
    scaled = [(x * scale[0], y * scale[1]) for x, y in points]

    model = build_backbone(cfg, args.seed)
    lines = []
    random_weights = args.checkpoint is None
    if random_weights:
        weights = f'random weights (seed {args.seed})'
        lines.append(f'!! {RANDOM_WEIGHTS}')
    else:
        report, missing = load_weights(model, args.checkpoint)
        weights = f'weights {osp.basename(args.checkpoint)} ({report})'
        lines.append(f'{args.checkpoint}: {report}' + (f'; missing {missing}' if missing else ''))
    try:
        targets = targets_of(args, model)
    except ValueError as err:
        raise VisAttentionError(str(err)) from err
    if not random_weights:
        names = {id(m): n for n, m in model.named_modules()}
        drawn = [names[id(stage_blocks(model, s)[b - 1])] + '.' for s, b in targets]
        unset = [k for k in missing if k.startswith(tuple(drawn))]
        if unset:
            weights += f'; {len(unset)} tensors of the drawn blocks RANDOM'
            lines.append(f'!! the checkpoint lacks {unset}: these stay random')
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        raise VisAttentionError(f'--device {args.device}, but torch sees no GPU (use cpu)')
    model = model.to(args.device).eval()
    if args.head is not None and args.head < 1:
        raise VisAttentionError('--head is 1-based')
    try:
        blocks, _ = record_maps(model, to_tensor(image, *norm).to(args.device), targets)
    except ValueError as err:  # e.g. LaViT la_mode='dense' at another size
        raise VisAttentionError(f'the backbone refused the {width}x{height} input: {err}') from err

    for block in blocks:
        for kind in block.kinds:
            if not torch.isfinite(kind.matrix).all():
                raise VisAttentionError(
                    f'the {kind.name} map of stage {block.stage} block {block.block} holds NaN '
                    'or inf: the weights (or the picture) produce non-finite attention')
    os.makedirs(args.out_dir, exist_ok=True)
    for block in blocks:
        head = None
        if args.head is not None:
            if args.head > block.num_heads:
                raise VisAttentionError(f'--head {args.head}: stage {block.stage} has '
                                        f'{block.num_heads} heads')
            head = args.head - 1
        stem = osp.join(args.out_dir, f'{label}_stage{block.stage}_block{block.block}')
        heads = 'mean over heads' if head is None else f'head {head + 1}/{block.num_heads}'
        header = (f'{label} ({weights}), stage {block.stage} block {block.block}: '
                  f'{block.attention}; {heads}\n{width}x{height} input from {args.img}, '
                  + '; '.join([f'{block.query_grid[0]}x{block.query_grid[1]} tokens']
                              + block.notes))
        draw_block(block, image, scaled, points, stem + '.png', header, random_weights, head)
        rows = rank_entropy(block, args.max_rank_tokens)
        lines.append(write_rank_files(block, rows, stem + '_rank', label))
        lines.append(f'-> {stem}.png, {stem}_rank.md/.csv/.png')
    if random_weights:
        lines.append(f'!! {RANDOM_WEIGHTS}')
    return lines


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        lines = run(args)
    except VisAttentionError as err:
        parser.error(str(err))
    for line in lines:
        print(line)
    return 0


if __name__ == '__main__':
    sys.exit(main())
