"""Attention maps (mmeffvit.analysis.attention_maps / attention_kinds) and
tools/analysis/vis_attention.py (issue 14, item 2).

The maps are checked against computations written here from the papers' definitions: FLatten's
N×n matrix token by token, its DWC term from convolutions of one-hot values; and for every family
the module's own output is rebuilt as ``proj(map @ V)`` (+ the local terms) with V placed on the
map's key grid by code of this file, so a map at a wrong position or with a wrong weight fails.
"""
import csv
import importlib.util
import math
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.logging import MMLogger
from PIL import Image

from mmeffvit.models import (FLattenCSWin, FLattenPVT, FLattenSwin, FocalTransformer, L2ViT,
                             LaViT)
from mmeffvit.models.layers import FocusedLinearAttention
from mmeffvit.analysis.attention_kinds import flatten_maps
from mmeffvit.analysis.attention_maps import AttentionRecorder, BlockMaps

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOL = osp.join(REPO_ROOT, 'tools', 'analysis', 'vis_attention.py')
MMLogger.get_current_instance().setLevel('WARNING')


def _load_tool():
    spec = importlib.util.spec_from_file_location('_tool_vis_attention', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vis_attention = _load_tool()


@pytest.fixture(autouse=True)
def one_thread():
    """These CPU kernels are tiny; with two threads on the shared 2-core test machine a float64
    depthwise conv took 40x longer than on one (measured), so the tests run single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- FLatten, explicitly -------------------------------------------------------------------------
def phi_token(t, scale, power, eps=1e-6):
    """FLatten's kernel on one token (sec. 4.1, eq. 5-6), written out."""
    s = torch.log1p(torch.exp(scale))  # softplus
    t = (torch.clamp(t, min=0) + eps) / s
    return (t ** power) * torch.sqrt((t ** 2).sum()) / torch.sqrt((t ** (2 * power)).sum())


def explicit_linear_map(q, k, scale, heads, power, eps=1e-6):
    """``A[h, i, j]`` token by token: ``(φ(q_i)·φ(k_j)/n) / (φ(q_i)·mean_j φ(k_j) + ε)``."""
    n_q, n_k, c = q.shape[0], k.shape[0], q.shape[1]
    d = c // heads
    q, k = q.detach(), k.detach()
    fq = [phi_token(q[i], scale, power) for i in range(n_q)]
    fk = [phi_token(k[j], scale, power) for j in range(n_k)]
    a = torch.zeros(heads, n_q, n_k, dtype=torch.float64)
    mass = torch.zeros(heads, n_q, dtype=torch.float64)
    for h in range(heads):
        sl = slice(h * d, (h + 1) * d)
        k_mean = sum(f[sl] for f in fk) / n_k
        for i in range(n_q):
            mass[h, i] = float(fq[i][sl] @ k_mean)
            for j in range(n_k):
                a[h, i, j] = float(fq[i][sl] @ fk[j][sl]) / n_k / (mass[h, i] + eps)
    return a, mass


def dwc_impulse_map(conv, kv_hw, hw):
    """Channel-mean response at every query to a one-hot V (all channels) at each key."""
    n = kv_hw[0] * kv_hw[1]
    columns = []
    for j in range(n):
        impulse = torch.zeros(1, conv.in_channels, n, dtype=torch.float64)
        impulse[..., j] = 1
        out = F.conv2d(impulse.reshape(1, -1, *kv_hw), conv.weight, None, padding=conv.padding,
                       groups=conv.groups)
        if tuple(kv_hw) != tuple(hw):
            out = F.interpolate(out, size=hw, mode='bilinear', align_corners=False)
        columns.append(out.mean(1).flatten())
    return torch.stack(columns, 1)


def flatten_module(layout, sr=1, pe=(4, 6), kernel=3):
    torch.manual_seed(0)
    attn = FocusedLinearAttention(12, 2, pe_size=pe, kernel_size=kernel, sr_ratio=sr,
                                  qkv_layout=layout).double().eval()
    with torch.no_grad():  # non-trivial scale and positional encoding
        attn.scale.normal_(0, 0.5)
        attn.positional_encoding.normal_(0, 0.5)
    return attn


@pytest.mark.parametrize('layout, sr, hw', [('q_kv', 1, (4, 6)), ('qkv', 1, (3, 5)),
                                            ('q_kv', 2, (4, 6))])
def test_flatten_maps_match_explicit_computation(layout, sr, hw):
    attn = flatten_module(layout, sr, pe=(hw[0] // sr, hw[1] // sr))
    x = torch.randn(1, hw[0] * hw[1], 12, dtype=torch.float64)
    maps = flatten_maps(attn, {'x': x, 'hw_shape': hw}, hw)
    linear, local = maps['kinds'][0].matrix, maps['kinds'][1].matrix
    assert [k.name for k in maps['kinds']] == ['linear', 'local', 'linear+local', 'softmax']

    # q, k, v by this file's code
    if layout == 'qkv':
        q, k, v = (x[0] @ attn.qkv.weight.t() + attn.qkv.bias).chunk(3, -1)
        kv_hw = hw
    else:
        q = x[0] @ attn.q.weight.t() + attn.q.bias
        src = x
        kv_hw = hw
        if sr > 1:
            grid = F.conv2d(x.transpose(1, 2).reshape(1, 12, *hw), attn.sr.weight, attn.sr.bias,
                            stride=sr)
            kv_hw = tuple(grid.shape[-2:])
            src = F.layer_norm(grid.flatten(2).transpose(1, 2), (12, ), attn.norm.weight,
                               attn.norm.bias, attn.norm.eps)
        k, v = (src[0] @ attn.kv.weight.t() + attn.kv.bias).chunk(2, -1)
    k = k + attn.positional_encoding[0]  # stored at the key grid: no resize
    expected, mass = explicit_linear_map(q, k, attn.scale.detach().reshape(-1), 2, 3)
    torch.testing.assert_close(linear, expected, rtol=1e-9, atol=1e-12)
    # rows sum to m/(m + 1e-6), m = φ(q_i)·mean φ(k): one wherever a head keeps some mass (the
    # focusing norm runs over all heads' channels, so a head's features can nearly vanish)
    torch.testing.assert_close(linear.sum(-1), mass / (mass + 1e-6))
    assert (mass > 1e-2).any()
    torch.testing.assert_close(linear.sum(-1)[mass > 1e-2],
                               torch.ones(int((mass > 1e-2).sum()), dtype=torch.float64),
                               rtol=0, atol=1e-4)
    # the local term: the conv of one-hot values, token by token
    torch.testing.assert_close(local[0], dwc_impulse_map(attn.dwc, kv_hw, hw), rtol=0,
                               atol=1e-12)
    torch.testing.assert_close(local[1], local[0])  # one kernel set for every head

    # the module's output is proj(A V + DWC(V)) with the exact per-channel DWC
    with torch.no_grad():
        out = attn(x, hw)[0]
        heads_v = v.reshape(-1, 2, 6).transpose(0, 1)
        mixed = (linear @ heads_v).transpose(0, 1).reshape(-1, 12)
        dwc = attn.dwc(heads_v.transpose(1, 2).reshape(2, 6, *kv_hw))
        if kv_hw != hw:
            dwc = F.interpolate(dwc, size=hw, mode='bilinear', align_corners=False)
        mixed = mixed + dwc.reshape(2, 6, -1).permute(2, 0, 1).reshape(-1, 12)
        torch.testing.assert_close(attn.proj(mixed), out, rtol=1e-9, atol=1e-10)
    softmax = maps['kinds'][3].matrix
    d = 6
    ref = torch.softmax(torch.einsum('ihd,jhd->hij', q.reshape(-1, 2, d), k.reshape(-1, 2, d))
                        / math.sqrt(d), -1)
    torch.testing.assert_close(softmax, ref)


def test_rank_linear_map_bounded_by_head_dims_dwc_restores_it():
    """FLatten sec. 4.2: rank(φ(Q)φ(K)ᵀ) <= d; adding the DWC term makes the map full rank."""
    attn = flatten_module('q_kv', pe=(5, 6), kernel=5)
    x = torch.randn(1, 30, 12, dtype=torch.float64)
    maps = flatten_maps(attn, {'x': x, 'hw_shape': (5, 6)}, (5, 6))
    block = BlockMaps(1, 1, maps['attention'], (5, 6), 2, 6, maps['kinds'])
    rows = {(r['kind'], r['head']): r for r in vis_attention.rank_entropy(block, 4096)}
    for head in (1, 2):
        assert rows[('linear', head)]['rank'] == 6          # d = 6 < N = 30
        assert rows[('linear+local', head)]['rank'] == 30   # full
        assert rows[('softmax', head)]['rank'] == 30
        assert rows[('local', head)]['entropy'] is None     # signed map: no entropy
        assert 0 < rows[('linear', head)]['entropy'] <= math.log(30) + 1e-9
    # the rank counted by the tool agrees with numpy's default tolerance
    np_rank = np.linalg.matrix_rank(maps['kinds'][0].matrix[0].numpy())
    assert rows[('linear', 1)]['rank'] == np_rank


# -- every family: the module's output rebuilt from the maps --------------------------------------
IMAGE_HW = (96, 128)


def windows_to_grid(t, n_win, win):
    """``(nW, wh*ww, C)`` row-major windows of row-major tokens -> ``(gh*wh, gw*ww, C)``."""
    (gh, gw), (wh, ww) = n_win, win
    return t.reshape(gh, gw, wh, ww, -1).permute(0, 2, 1, 3, 4).reshape(gh * wh, gw * ww, -1)


def ceil_div(a, b):
    return -(-a // b)


def mix(matrix, values, heads):
    """``merge_h(M_h @ V_h)`` for ``matrix (h, N, n)`` and ``values (n, C)``."""
    vh = values.reshape(values.shape[0], heads, -1).transpose(0, 1)
    return (matrix @ vh).transpose(0, 1).reshape(matrix.shape[1], -1)


def sr_source(attn, x, hw):
    """Keys/values source of PVT's spatial reduction, for ``x (B, H*W, C)``."""
    if getattr(attn, 'sr', None) is None:
        return x, tuple(hw)
    grid = attn.sr(x.transpose(1, 2).reshape(x.shape[0], x.shape[2], *hw))
    return attn.norm(grid.flatten(2).transpose(1, 2)), tuple(grid.shape[-2:])


def rebuild_flatten(attn, args, maps, output, block):
    h = attn.num_heads
    if 'x' in args:
        x, hw = args['x'], tuple(args['hw_shape'])
        if hasattr(attn, 'qkv'):
            v, kv_hw = attn.qkv(x).chunk(3, -1)[2], hw
        else:
            src, kv_hw = sr_source(attn, x, hw)
            v = attn.kv(src).chunk(2, -1)[1]
    else:
        v, hw = args['v'], tuple(args['hw'])
        kv_hw = hw
    v = v[0]
    c = v.shape[-1]
    out = mix(maps.kind('linear').matrix, v, h)
    vh = v.reshape(-1, h, c // h).permute(1, 2, 0).reshape(h, c // h, *kv_hw)
    dwc = attn.dwc(vh)
    if kv_hw != hw:
        dwc = F.interpolate(dwc, size=hw, mode='bilinear', align_corners=False)
    out = out + dwc.reshape(h, c // h, -1).permute(2, 0, 1).reshape(-1, c)
    if hasattr(attn, 'get_v'):
        out = out + attn.get_v(v.t().reshape(1, c, *hw)).reshape(c, -1).t()
    if hasattr(attn, 'proj'):
        out = attn.proj(out)
    return out, output[0]


def rebuild_sra(attn, args, maps, output, block):
    src, _ = sr_source(attn, args['x'], args['hw_shape'])
    v = attn.kv(src).chunk(2, -1)[1][0]
    return attn.proj(mix(maps.kind('softmax').matrix, v, attn.num_heads)), output[0]


def rebuild_lavit(attn, args, maps, output, block):
    win = tuple(args['hw_shape'])
    height, width = maps.query_grid
    n_win = (ceil_div(height, win[0]), ceil_div(width, win[1]))
    src, k_win = sr_source(attn, args['x'], win)
    v = attn.v(src) if hasattr(attn, 'v') else attn.kv(src).chunk(2, -1)[1]
    values = windows_to_grid(v, n_win, k_win).reshape(-1, v.shape[-1])
    kind = maps.kind('la' if hasattr(attn, 'v') else 'va')
    out = windows_to_grid(output, n_win, win)[:height, :width].reshape(height * width, -1)
    return attn.proj(mix(kind.matrix, values, attn.num_heads)), out


def rebuild_focal(attn, args, maps, output, block):
    x, pooled = args['x'], args['pooled']
    c = x.shape[-1]
    values = torch.cat([attn.qkv(t.reshape(-1, c)).chunk(3, -1)[2] for t in [x] + pooled])
    height, width = maps.query_grid
    out = output[0, :height, :width].reshape(height * width, c)
    return attn.proj(mix(maps.kind('all').matrix, values, attn.num_heads)), out


def rebuild_lwa(attn, args, maps, output, block):
    x = args['x']
    side = math.isqrt(x.shape[1])
    height, width = maps.query_grid
    n_win = (ceil_div(height, side), ceil_div(width, side))
    v = attn.qkv(x).chunk(3, -1)[2]
    values = windows_to_grid(v, n_win, (side, side)).reshape(-1, v.shape[-1])
    out = windows_to_grid(output, n_win, (side, side))[:height, :width]
    return (attn.proj(mix(maps.kind('window').matrix, values, attn.num_heads)),
            out.reshape(height * width, -1))


def rebuild_lga(attn, args, maps, output, block):
    v = attn.qkv(args['x']).chunk(3, -1)[2][0]
    return attn.proj(mix(maps.kind('global').matrix, v, attn.num_heads)), output[0]


def rebuild_swin(attn, args, maps, output, block):
    if attn.window_size is None:  # the shared WindowMSA without a bias table is L²ViT's LWA
        return rebuild_lwa(attn, args, maps, output, block)
    window = int(args['window'])
    height, width = maps.query_grid
    n_win = (ceil_div(height, window), ceil_div(width, window))
    shift = block.shift_size if args.get('mask') is not None else 0

    def unshift(t):  # windows of the cyclically shifted map -> the map's own positions
        grid = windows_to_grid(t, n_win, (window, window))
        return torch.roll(grid, shifts=(shift, shift), dims=(0, 1))

    v = attn.qkv(args['x']).chunk(3, -1)[2]
    values = unshift(v).reshape(-1, v.shape[-1])
    out = unshift(output)[:height, :width].reshape(height * width, -1)
    return attn.proj(mix(maps.kind('window').matrix, values, attn.num_heads)), out


def stripe_lepe(attn, v, hw):
    """LePE inside each stripe: the 3×3 conv sees zeros beyond the stripe."""
    height, width = hw
    grid = v[0].t().reshape(1, -1, height, width)
    sw = attn.split_size
    out = torch.zeros_like(grid)
    if attn.idx == 0:
        for c0 in range(0, width, sw):
            out[..., c0:c0 + sw] = attn.get_v(grid[..., c0:c0 + sw])
    elif attn.idx == 1:
        for r0 in range(0, height, sw):
            out[..., r0:r0 + sw, :] = attn.get_v(grid[..., r0:r0 + sw, :])
    else:
        out = attn.get_v(grid)
    return out.reshape(out.shape[1], -1).t()


REBUILD = {'FocusedLinearAttention': rebuild_flatten, 'LePEFocusedLinearAttention':
           rebuild_flatten, 'SpatialReductionAttention': rebuild_sra,
           'VanillaAttention': rebuild_lavit, 'LessAttention': rebuild_lavit,
           'FocalAttention': rebuild_focal,
           'LinearAttention': rebuild_lga, 'WindowMSA': rebuild_swin}


def small_models():
    pvt_arch = dict(embed_dims=[16, 32, 40, 64], num_heads=[1, 2, 5, 4], mlp_ratios=[2] * 4,
                    depths=[1, 1, 1, 1], sr_ratios=[1, 2, 2, 1], attn_types='LLSL')
    lavit_arch = dict(embed_dims=[16, 32, 40, 48], num_heads=[1, 2, 2, 2], mlp_ratios=[2] * 4,
                      depths=[1, 1, 2, 2], sr_ratios=[8, 4, 2, 1], num_va_layers=[1, 1, 1, 1])
    small = dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 2])
    return {
        'pvt': (lambda: FLattenPVT(pvt_arch, pretrain_img_size=64),
                [(1, 1), (2, 1), (3, 1), (4, 1)]),
        'lavit': (lambda: LaViT(lavit_arch, pretrain_img_size=64),
                  [(2, 1), (3, 1), (3, 2), (4, 1), (4, 2)]),  # 2: a factored residual
        'focal': (lambda: FocalTransformer(dict(small, depths=[1, 1, 1, 1]),
                                           focal_levels=(3, 2, 2, 2)), [(1, 1), (2, 1)]),
        'focal_official_borders': (lambda: FocalTransformer(
            dict(small, depths=[1, 1, 1, 1]), mask_borders=False), [(1, 1), (3, 1)]),
        'l2vit': (lambda: L2ViT(dict(small, embed_dims=[16, 32, 48, 64])),
                  [(1, 1), (1, 2), (2, 1)]),
        'swin': (lambda: FLattenSwin(small, pretrain_img_size=64), [(1, 1), (3, 1), (3, 2)]),
        'cswin': (lambda: FLattenCSWin(dict(small, depths=[1, 1, 1, 1], num_heads=[2] * 4),
                                       pretrain_img_size=64, split_sizes=[1, 2, 2, 2]),
                  [(2, 1), (3, 1), (4, 1)]),
    }


def randomise(model):
    """Give the parameters that start at a neutral value (identity Θ/Ψ, LayerScale 1e-4, zero
    tables and encodings) random values, so that every term of the maps matters."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(('theta.weight', 'psi.weight', 'positional_encoding', 'scale',
                              'bias_table', 'gamma')) or 'bias_table_to' in name:
                p.add_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.5))


@pytest.mark.parametrize('family', list(small_models()))
def test_maps_rebuild_the_module_output(family):
    build, targets = small_models()[family]
    torch.manual_seed(0)
    model = build()
    model.init_weights()
    randomise(model)
    model = model.double().eval()
    image = torch.randn(1, 3, *IMAGE_HW, dtype=torch.float64)
    with AttentionRecorder(model, targets) as recorder, torch.no_grad():
        model(image)
    blocks = recorder.maps()
    assert [(b.stage, b.block) for b in blocks] == targets
    for (key, module, found), maps in zip(recorder.targets, blocks):
        stride = 4 * 2 ** (maps.stage - 1)
        assert maps.query_grid == (ceil_div(IMAGE_HW[0], stride), ceil_div(IMAGE_HW[1], stride))
        n_queries = maps.query_grid[0] * maps.query_grid[1]
        for kind in maps.kinds:
            assert kind.matrix.shape[:2] == (maps.num_heads, n_queries)
            assert kind.matrix.shape[2] == kind.key_grid[0] * kind.key_grid[1]
            if kind.stochastic:
                torch.testing.assert_close(kind.matrix.sum(-1),
                                           torch.ones_like(kind.matrix[..., 0]),
                                           rtol=0, atol=1e-9)
            if kind.name == 'linear':  # FLatten: m/(m + 1e-6), see the explicit test
                assert (kind.matrix.sum(-1) <= 1).all()
            if not kind.signed:
                assert (kind.matrix >= 0).all()
        with torch.no_grad():
            if type(found[0][1]).__name__ == 'LePEAttention':
                heads = maps.kind('stripes').matrix
                start = 0
                for name, attn in found:
                    args = recorder.inputs[key][name][1]
                    part = heads[start:start + attn.num_heads]
                    start += attn.num_heads
                    rebuilt = mix(part, args['v'][0], attn.num_heads) + stripe_lepe(
                        attn, args['v'], maps.query_grid)
                    torch.testing.assert_close(rebuilt, recorder.outputs[(key, name)][0])
                continue
            name, attn = found[0]
            args = recorder.inputs[key][name][1]
            output = recorder.outputs[(key, name)]
            output = output[0] if isinstance(output, tuple) else output
            rebuilt, expected = REBUILD[type(attn).__name__](attn, args, maps, output, module)
            # LaViT's masked softmax runs in fp32 even for fp64 inputs
            tol = dict(rtol=1e-5, atol=1e-7) if family == 'lavit' else dict(rtol=1e-7,
                                                                            atol=1e-9)
            torch.testing.assert_close(rebuilt, expected, **tol)


def test_focal_pooled_cells_drawn_where_they_pool():
    """With mean pooling every pooled token is the mean of the padded map over one rectangle:
    the cell the map kind says it covers (key_origin, key_cell), zeros outside the map."""
    torch.manual_seed(0)
    model = FocalTransformer(dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 2]),
                             focal_levels=(3, 3, 2, 2), pool_method='mean')
    model.init_weights()
    model = model.double().eval()
    targets = [(1, 1), (2, 1)]
    with AttentionRecorder(model, targets) as recorder, torch.no_grad():
        model(torch.randn(1, 3, 88, 120, dtype=torch.float64))
    checked = 0
    for (key, _, found), maps in zip(recorder.targets, recorder.maps()):
        args = recorder.inputs[key][found[0][0]][1]
        x = args['x'][0]  # (Hp, Wp, C)
        for level, pooled in enumerate(args['pooled'], 1):
            kind = maps.kind(f'pooled{level}')
            assert kind.key_grid == tuple(pooled.shape[1:3])
            (top, left), (cell_h, cell_w) = kind.key_origin, kind.key_cell
            for r in range(kind.key_grid[0]):
                for c in range(kind.key_grid[1]):
                    r0, c0 = int(top + r * cell_h), int(left + c * cell_w)
                    rect = x.new_zeros(int(cell_h), int(cell_w), x.shape[-1])
                    rr = slice(max(r0, 0), min(r0 + int(cell_h), x.shape[0]))
                    cc = slice(max(c0, 0), min(c0 + int(cell_w), x.shape[1]))
                    rect[rr.start - r0:rr.stop - r0, cc.start - c0:cc.stop - c0] = x[rr, cc]
                    torch.testing.assert_close(rect.mean((0, 1)), pooled[0, r, c])
                    checked += 1
    # level 2 (3x3-token cells) does not tile the 7-token windows: its grid is centre-cropped
    assert any(maps.kind('pooled2').key_origin != (0.0, 0.0) for maps in recorder.maps())
    assert checked > 50


# -- the tool -------------------------------------------------------------------------------------
def read_rank_csv(path):
    with open(path, newline='') as f:
        return {(r['kind'], r['head']): r for r in csv.DictReader(f)}


def red_banner(png):
    """Whether the bottom of the picture carries the red random-weights banner."""
    pixels = np.asarray(Image.open(png).convert('RGB')).astype(int)
    bottom = pixels[-pixels.shape[0] // 20:]
    red = (bottom[..., 0] > 200) & (bottom[..., 1] < 60) & (bottom[..., 2] < 60)
    return red.mean() > 0.05


@pytest.mark.e2e
def test_cli_on_a_photo(tmp_path):
    """The command line as a user runs it: FLatten-PVT-T on scikit-image's cat, two points."""
    out = tmp_path / 'attn'
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, TOOL, '--backbone', 'FLattenPVT', '--arch', 'tiny', '--img',
         'sample:chelsea', '--size', '64', '--points', '120,80', '300,200', '--out-dir',
         str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'RANDOM WEIGHTS' in proc.stdout
    png = out / 'FLattenPVT-tiny_stage2_block1.png'
    picture = np.asarray(Image.open(png).convert('RGB'))
    assert picture.shape[0] > 300 and picture.shape[1] > 600 and picture.std() > 20
    assert red_banner(png)
    # 451x300 photo -> 96x64 input -> stage 2: 8x12 = 96 tokens, 2 heads of d = 64
    ranks = read_rank_csv(out / 'FLattenPVT-tiny_stage2_block1_rank.csv')
    for head in ('1', '2'):
        assert ranks[('linear', head)]['N'] == '96'
        assert int(ranks[('linear', head)]['rank']) <= 64
        assert int(ranks[('linear+local', head)]['rank']) == 96
    assert (out / 'FLattenPVT-tiny_stage2_block1_rank.png').is_file()
    table = (out / 'FLattenPVT-tiny_stage2_block1_rank.md').read_text()
    assert '| linear (' in table and 'σ₁·max(N, n)·ε' in table
    assert '| linear (' in proc.stdout  # the table is printed too


def run_tool(argv, capsys):
    code = vis_attention.main(argv)
    return code, capsys.readouterr().out


def test_checkpoint_weights_are_the_ones_drawn(tmp_path, capsys):
    """A detector-style checkpoint of a seeded LaViT-T gives the maps of that model (equal to
    the tool's own random weights with that seed), without the random-weights label."""
    torch.manual_seed(5)
    model = LaViT('tiny')
    model.init_weights()
    ckpt = tmp_path / 'det.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in model.state_dict().items()}},
               ckpt)
    common = ['--backbone', 'LaViT', '--img', 'sample:astronaut', '--size', '64', '--stage',
              '3', '--block', '1', '2', '--points', '100,100', '400,300']
    code, text = run_tool(common + ['--checkpoint', str(ckpt), '--out-dir',
                                    str(tmp_path / 'a')], capsys)
    assert code == 0 and 'RANDOM' not in text and 'tensors loaded' in text
    assert not red_banner(tmp_path / 'a' / 'LaViT-tiny_stage3_block1.png')
    run_tool(common + ['--seed', '5', '--out-dir', str(tmp_path / 'b')], capsys)
    for block in (1, 2):
        name = f'LaViT-tiny_stage3_block{block}_rank.csv'
        loaded, seeded = (read_rank_csv(tmp_path / d / name) for d in 'ab')
        assert loaded == seeded
    run_tool(common + ['--seed', '6', '--out-dir', str(tmp_path / 'c')], capsys)
    assert read_rank_csv(tmp_path / 'c' / name) != read_rank_csv(tmp_path / 'a' / name)
    # a file without the drawn block's attention says that part stays random
    state = {k: v for k, v in model.state_dict().items() if not k.startswith('block3.1.attn.v')}
    torch.save(state, tmp_path / 'partial.pth')
    code, text = run_tool(common + ['--checkpoint', str(tmp_path / 'partial.pth'), '--out-dir',
                                    str(tmp_path / 'd')], capsys)
    assert "!! the checkpoint lacks ['block3.1.attn.v.weight', 'block3.1.attn.v.bias']" in text


def test_config_backbone_and_one_head(tmp_path, capsys):
    config = osp.join(REPO_ROOT, 'configs', 'mask_rcnn_flatten_pvt_t_1x.py')
    code, text = run_tool([config, '--img', 'sample:coffee', '--size', '64', '--stage', '1',
                           '--head', '1', '--out-dir', str(tmp_path)], capsys)
    assert code == 0
    assert (tmp_path / 'mask_rcnn_flatten_pvt_t_1x_stage1_block1.png').is_file()
    assert 'RANDOM WEIGHTS' in text  # the config's ImageNet init_cfg is not used


@pytest.mark.parametrize('argv, message', [
    ([], 'give a CONFIG or --backbone'),
    (['--backbone', 'FLattenPVTT'], 'choose one of: FLattenPVT'),
    (['--backbone', 'CARE'], 'CARE has no attention maps here yet; supported: FLattenPVT'),
    (['--backbone', 'FLattenDeiT'], 'FLattenDeiT has no attention maps here yet'),
    (['--backbone', 'FLattenPVT', '--stage', '7'], 'stage 7 does not exist'),
    (['--backbone', 'FLattenPVT', '--stage', '2', '--block', '3'], 'stage 2 has blocks 1..2'),
    (['--backbone', 'FLattenPVT', '--block', '1'], '--block needs --stage'),
    (['--backbone', 'FLattenPVT', '--points', '9999,3'], 'outside the 512x512 picture'),
    (['--backbone', 'FLattenPVT', '--points', '3;4'], 'expected x,y'),
    (['--backbone', 'FLattenPVT', '--img', 'nowhere.png'], 'picture nowhere.png not found'),
    (['--backbone', 'FLattenPVT', '--img', 'sample:kitten'], 'choose one of: '),
    (['--backbone', 'FLattenPVT', '--size', '8'], '--size'),
    (['--backbone', 'FLattenPVT', '--checkpoint', 'missing.pth'], 'missing.pth not found'),
    (['--backbone', 'FLattenPVT', '--stage', '1', '--head', '2'], 'stage 1 has 1 heads'),
    (['--backbone', 'FLattenPVT', '--backbone-options', 'arch=huge'], "Unknown arch 'huge'"),
    (['--backbone', 'LaViT', '--backbone-options', 'la_mode=dense'],
     'refused the 64x64 input: less attention holds'),
])
def test_clear_errors(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        vis_attention.main(argv + ['--size', '64', '--out-dir', str(tmp_path)]
                           if '--size' not in argv else argv + ['--out-dir', str(tmp_path)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_wrong_and_corrupt_checkpoints(tmp_path, capsys):
    torch.manual_seed(0)
    other = FLattenPVT('tiny')
    torch.save(other.state_dict(), tmp_path / 'pvt.pth')
    (tmp_path / 'broken.pth').write_bytes(b'not a checkpoint')
    for name, message in (('pvt.pth', 'does not fit'), ('broken.pth', 'broken.pth')):
        with pytest.raises(SystemExit):
            vis_attention.main(['--backbone', 'LaViT', '--size', '64', '--checkpoint',
                                str(tmp_path / name), '--out-dir', str(tmp_path)])
        assert message in capsys.readouterr().err


def test_non_finite_weights_are_an_error(tmp_path, capsys):
    torch.manual_seed(0)
    model = FLattenPVT('tiny')
    state = model.state_dict()
    state['block2.0.attn.kv.weight'][0, 0] = float('nan')
    torch.save(state, tmp_path / 'nan.pth')
    with pytest.raises(SystemExit):
        vis_attention.main(['--backbone', 'FLattenPVT', '--size', '64', '--checkpoint',
                            str(tmp_path / 'nan.pth'), '--out-dir', str(tmp_path)])
    assert 'map of stage 2 block 1 holds NaN' in capsys.readouterr().err
    assert not list(tmp_path.glob('*.png'))


def test_salient_points_inside_and_apart():
    picture = vis_attention.read_picture('sample:astronaut')
    points = vis_attention.salient_points(picture)
    assert len(points) == 3
    for x, y in points:
        assert 0.08 * 512 <= x < 0.92 * 512 and 0.08 * 512 <= y < 0.92 * 512
    for i, (x0, y0) in enumerate(points):
        for x1, y1 in points[i + 1:]:
            assert math.hypot(x1 - x0, y1 - y0) >= 512 / 5
