"""LaViT: published sizes, paper-form vs window mode, AR module, LA transform, loss plumbing."""
import contextlib
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

from amp_check import AMP_DTYPES, check_autocast_against_fp32

from mmeffvit.models import AttentionResidualDownsample, LaViT, LessAttention
from mmeffvit.models.backbones.lavit import _unwindow, _windows
from mmeffvit.models.layers import less_attention

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
# LaViT paper Table 2 (ImageNet-1k classifiers, 224x224): parameters, "FLOPs" (multiply-adds)
PUBLISHED = {'tiny': (10.9e6, 1.6e9), 'small': (22.4e6, 3.3e9), 'base': (39.6e6, 6.1e9)}
# this reconstruction with the ImageNet head (configs/lavit/README.md, "Reconstruction notes"),
# counted as tools/analysis/get_flops.py counts: all parameters, GMACs; then the same without
# the dense Θ/Ψ
MEASURED = {'tiny': (11.041e6, 1.8145e9, 10.995e6, 1.8011e9),
            'small': (22.621e6, 3.6745e9, 22.407e6, 3.6119e9),
            'base': (40.369e6, 6.3212e9, 39.664e6, 6.1174e9)}
# honest gaps to the published numbers (params, MACs), all parameters counted:
# tiny +1.3 % / +13.4 %, small +1.0 % / +11.3 %, base +1.9 % / +3.6 %
GAPS = {'tiny': (0.014, 0.135), 'small': (0.011, 0.114), 'base': (0.020, 0.037)}


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def with_classifier(model):
    """The ImageNet model adds a final LayerNorm and a 1000-way Linear on the last stage."""
    c = model.embed_dims[-1]
    return n_params(model) + c * 1000 + 1000 + 2 * c


def theta_psi_params(model):
    return sum(p.numel() for n, p in model.named_parameters()
               if '.attn.theta.' in n or '.attn.psi.' in n)


@pytest.mark.parametrize('arch', ['tiny', 'small', 'base'])
def test_parameter_counts_near_published(arch):
    model = LaViT(arch)
    total = with_classifier(model)
    assert total == pytest.approx(MEASURED[arch][0], rel=1e-4)
    assert 0 < total / PUBLISHED[arch][0] - 1 < GAPS[arch][0], total
    assert total - theta_psi_params(model) == pytest.approx(MEASURED[arch][2], rel=1e-4)


@pytest.mark.parametrize('arch', ['tiny', 'small', 'base'])
def test_macs_near_published(arch):
    from mmeffvit.analysis import ImageNetClassifier, analyze
    torch.manual_seed(0)
    model = ImageNetClassifier(LaViT(arch, la_mode='dense', out_indices=(3, )),
                               unused_norm=True).eval()
    report = analyze(model, torch.rand(1, 3, 224, 224))
    assert report.params == with_classifier(model.backbone)
    assert not report.unsupported_ops
    macs = report.macs
    assert macs == pytest.approx(MEASURED[arch][1], rel=1e-3)
    assert 0 < macs / PUBLISHED[arch][1] - 1 < GAPS[arch][1], macs
    theta_psi = sum(v for k, v in report.by_module.items()
                    if k.endswith(('.attn.theta', '.attn.psi')))
    assert macs - theta_psi == pytest.approx(MEASURED[arch][3], rel=1e-3)


def test_without_dense_maps_base_and_small_match_the_paper():
    """Leaving Θ/Ψ out, base matches both published numbers and small its parameters."""
    for arch, tol_params, tol_macs in (('base', 0.002, 0.003), ('small', 0.001, None)):
        _, _, params, macs = MEASURED[arch]
        assert abs(params / PUBLISHED[arch][0] - 1) < tol_params
        if tol_macs is not None:
            assert abs(macs / PUBLISHED[arch][1] - 1) < tol_macs


def _randomise_ar(model, value=0.5):
    for m in model.modules():
        if isinstance(m, AttentionResidualDownsample):
            m.gamma.data.fill_(value)  # make the residual matter in comparisons


def test_window_mode_equals_paper_form_at_training_size():
    torch.manual_seed(0)
    dense = LaViT('tiny', la_mode='dense')
    dense.init_weights()
    _randomise_ar(dense)
    for m in dense.modules():
        if isinstance(m, LessAttention):  # non-identity Θ/Ψ
            m.theta.weight.data.add_(0.05 * torch.randn_like(m.theta.weight))
            m.psi.weight.data.add_(0.05 * torch.randn_like(m.psi.weight))
    window = LaViT('tiny', la_mode='window')
    window.load_state_dict(dense.state_dict())
    x = torch.rand(1, 3, 224, 224)
    with torch.no_grad():
        for a, b in zip(dense.eval()(x), window.eval()(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dense_mode_rejects_other_sizes_with_a_hint():
    model = LaViT('tiny', la_mode='dense').eval()
    with pytest.raises(ValueError, match="la_mode='window'"):
        with torch.no_grad():
            model(torch.rand(1, 3, 256, 224))


def test_odd_size_training_forward_all_params_get_gradients():
    model = LaViT('tiny', diag_loss=dict(type='DiagonalityLoss', loss_weight=0.01))
    model.init_weights()
    model.train()
    outs = model(torch.rand(1, 3, 333, 517))
    assert [tuple(o.shape) for o in outs] == [
        (1, 64, 84, 130), (1, 128, 42, 65), (1, 320, 21, 33), (1, 448, 11, 17)]
    aux = model.aux_losses()
    assert set(aux) == {'loss_diag'} and torch.isfinite(aux['loss_diag'])
    assert model.aux_losses() == {}  # read once
    (sum(o.mean() for o in outs) + aux['loss_diag']).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    assert model.block3[1].attn.theta.weight.grad.abs().sum() > 0
    assert model.block4[1].attn.psi.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        model(torch.rand(1, 3, 64, 64))
    assert model.aux_losses() == {}  # no loss in eval


def test_less_attention_transform_matches_explicit_bilinear_form():
    torch.manual_seed(0)
    la = LessAttention(8, 2, num_queries=6, num_keys=4, identity_init=False, psi_bias=True)
    a = torch.randn(3, 2, 6, 4)
    wt, bt, wp, bp = la.theta.weight, la.theta.bias, la.psi.weight, la.psi.bias
    # A' = W_Ψ A W_Θᵀ + (W_Ψ 1) b_Θᵀ + b_Ψ 1ᵀ
    ref = wp @ a @ wt.T + (wp.sum(1, keepdim=True) @ bt[None]) + bp[:, None]
    torch.testing.assert_close(la.transform(a), ref, rtol=1e-5, atol=1e-5)
    eye = LessAttention(8, 2, num_queries=6, num_keys=4)
    torch.testing.assert_close(eye.transform(a), a)  # identity init re-uses the map


def test_attention_residual_is_a_grid_conv_not_a_raster_stride():
    ar = AttentionResidualDownsample(2, 2, layer_scale_init=None)
    with torch.no_grad():
        ar.dwconv.weight.fill_(0.25)
        ar.dwconv.bias.zero_()
        ar.pwconv.weight.copy_(torch.eye(2).view(2, 2, 1, 1))
        ar.pwconv.bias.zero_()
    attn = torch.randn(2, 2, 4 * 6, 5)
    out = ar(attn, (4, 6), (1, 5))
    grid = attn.transpose(-2, -1).reshape(2 * 2 * 5, 1, 4, 6)
    ref = F.avg_pool2d(grid, 2).reshape(2, 2, 5, 6).transpose(-2, -1)
    torch.testing.assert_close(out, ref)


def test_attention_residual_odd_grid_heads_and_registry():
    from mmeffvit.registry import MODELS
    ar = MODELS.build(dict(type='AttentionResidualDownsample', in_heads=2, out_heads=5))
    out = ar(torch.randn(1, 2, 7 * 9, 12), (7, 9), (3, 4), out_k_hw=(4, 4))
    assert out.shape == (1, 5, 4 * 5, 16)
    assert float(out.abs().max()) < 1e-2  # LayerScale starts small
    with pytest.raises(ValueError, match='does not match'):
        ar(torch.randn(1, 3, 63, 12), (7, 9), (3, 4))
    no_sr = AttentionResidualDownsample(1, 2, key_stride=2)  # keys shrink with the queries
    assert no_sr(torch.randn(1, 1, 16, 16), (4, 4), (4, 4)).shape == (1, 2, 4, 4)


def test_window_helpers_against_loops():
    x = torch.randn(2, 5 * 7, 3)
    win, n = _windows(x, (5, 7), (2, 3))
    assert n == (3, 3) and win.shape == (18, 6, 3)
    torch.testing.assert_close(_unwindow(win, (5, 7), (2, 3), n), x)


def test_chain_first_differs_and_bf16_autocast():
    torch.manual_seed(0)
    arch = dict(LaViT.arch_settings['tiny'], depths=[2, 2, 3, 2])  # two LA layers in stage 3
    prev = LaViT(arch, la_mode='dense')
    prev.init_weights()
    for m in prev.modules():
        if isinstance(m, LessAttention):
            m.theta.weight.data.add_(0.1 * torch.randn_like(m.theta.weight))
    first = LaViT(arch, la_mode='dense', chain='first')
    first.load_state_dict(prev.state_dict())
    x = torch.rand(1, 3, 224, 224)
    with torch.no_grad():
        assert not torch.allclose(prev.eval()(x)[2], first.eval()(x)[2])
    model = LaViT('tiny', diag_loss=dict(type='DiagonalityLoss', loss_weight=0.1)).train()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.rand(1, 3, 97, 131))
        loss = sum(o.float().mean() for o in outs) + model.aux_losses()['loss_diag']
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bad_arguments():
    with pytest.raises(KeyError, match='la_mode'):
        LaViT('tiny', la_mode='interp')
    with pytest.raises(ValueError, match='num_va_layers'):
        LaViT(dict(embed_dims=[32, 64], num_heads=[1, 2], mlp_ratios=[4, 4], depths=[2, 2],
                   num_va_layers=[0, 2]), patch_sizes=(4, 2))
    with pytest.raises(ValueError, match='align'):
        LaViT('tiny', window_sizes=(None, None, 14, 5))


def test_frozen_stage_includes_its_attention_residual():
    model = LaViT('tiny', frozen_stages=3)
    model.train()
    for mod in (model.block3, model.attn_residual3, model.patch_embed3):
        assert not mod.training and all(not p.requires_grad for p in mod.parameters())
    assert all(p.requires_grad for p in model.block4.parameters())
    assert all(p.requires_grad for p in model.attn_residual4.parameters())


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_loss_and_residual_modules_build_under_toolbox_scopes(scope):
    from mmengine.registry import init_default_scope
    init_default_scope(scope)
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    assert isinstance(registry.build(dict(type='DiagonalityLoss')), torch.nn.Module)
    assert isinstance(registry.build(dict(type='AttentionResidualDownsample', in_heads=1,
                                          out_heads=2)), AttentionResidualDownsample)


def test_loss_diag_reaches_detector_losses_and_switch_turns_it_off():
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    init_default_scope('mmdet')
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'lavit', 'retinanet_lavit_t_1x_coco.py'))
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model)
    model.init_weights()
    packed = demo_mm_inputs(1, [[3, 96, 128]], num_items=[2], num_classes=80)
    data = model.data_preprocessor(packed, training=True)
    losses = model(**data, mode='loss')
    assert 'loss_diag' in losses and torch.isfinite(losses['loss_diag'])
    _, log_vars = model.parse_losses(losses)
    assert 'loss_diag' in log_vars
    model.with_backbone_aux_loss = False
    assert 'loss_diag' not in model(**data, mode='loss')


def test_pretrained_loading_drops_head_and_resizes_position_tables(tmp_path):
    src = LaViT('tiny', pretrain_img_size=256)
    state = dict(src.state_dict())
    for key in [k for k in state if k.startswith('block') and '.attn.theta' in k
                or '.attn.psi' in k]:
        state.pop(key)  # Θ/Ψ of another size cannot be resized: not in this checkpoint
    state['head.weight'] = torch.zeros(1000, 448)
    torch.save({'model': state}, tmp_path / 'lavit_t.pth')
    ckpt = str(tmp_path / 'lavit_t.pth')
    model = LaViT('tiny', init_cfg=dict(type='Pretrained', checkpoint=ckpt))
    model.init_weights()
    assert model.pos_embed1.shape == (1, 56 * 56, 64)
    torch.testing.assert_close(model.block1[0].attn.q.weight, src.block1[0].attn.q.weight)


def test_window_stage_equals_paper_form_on_each_window():
    """Stage 3 on a 28x42 grid = 2x3 windows, each the dense (paper) stage on its 14x14 crop."""
    torch.manual_seed(0)
    dense = LaViT('tiny', la_mode='dense', out_indices=(2, ))
    for m in dense.modules():
        if isinstance(m, LessAttention):
            m.psi.weight.data.add_(0.05 * torch.randn_like(m.psi.weight))
    window = LaViT('tiny', la_mode='window', out_indices=(2, ))
    window.load_state_dict(dense.state_dict())
    tokens = torch.randn(1, 28 * 42, 320)
    with torch.no_grad():
        out, carry = window.eval()._stage(2, tokens, (28, 42), None, None)
        grid = out.reshape(28, 42, 320)
        for a in range(2):
            for b in range(3):
                crop = tokens.reshape(28, 42, 320)[14 * a:14 * a + 14, 14 * b:14 * b + 14]
                ref, _ = dense.eval()._stage(2, crop.reshape(1, 196, 320), (14, 14), None, None)
                torch.testing.assert_close(
                    grid[14 * a:14 * a + 14, 14 * b:14 * b + 14].reshape(1, 196, 320), ref,
                    rtol=1e-5, atol=1e-5)
    assert carry['scores'].shape == (6, 5, 196, 49)


def test_key_mask_marks_padding_only_cells():
    model = LaViT('tiny')
    assert model._key_mask(2, (28, 28), (2, 2), 1, 'cpu') is None
    mask = model._key_mask(2, (21, 28), (2, 2), 2, 'cpu')   # rows 21..27 are padding
    assert mask.shape == (8, 1, 1, 49)
    grid = mask[:4].reshape(2, 2, 7, 7)  # windows (a, b), key rows, key cols
    assert not grid[0].any()                               # top windows: all real
    assert grid[1, :, 4:].all() and not grid[1, :, :4].any()  # key rows 11..13 = padding


@pytest.mark.parametrize('dtype', AMP_DTYPES)
def test_autocast_forward_backward_matches_fp32(dtype):
    torch.manual_seed(0)
    model = LaViT('tiny', drop_path_rate=0.)  # both passes must run the same network
    model.init_weights()
    check_autocast_against_fp32(model, torch.rand(1, 3, 97, 131), dtype)


@pytest.mark.parametrize('arch', ['tiny', 'small', 'base'])
def test_inputs_below_32_pixels(arch):
    """The reduction convs need 32 px; smaller inputs are zero-padded and outputs cropped."""
    model = LaViT(arch).eval()
    with torch.no_grad():
        for size in [(1, 1), (7, 20), (31, 31)]:
            x = torch.rand(1, 3, *size)
            outs = model(x)
            assert [tuple(o.shape[-2:]) for o in outs] == [
                (-(-size[0] // s), -(-size[1] // s)) for s in (4, 8, 16, 32)]
            assert all(torch.isfinite(o).all() for o in outs)
            padded = model(F.pad(x, (0, 32 - size[1], 0, 32 - size[0])))
            for out, ref in zip(outs, padded):
                assert torch.equal(out, ref[..., :out.shape[-2], :out.shape[-1]])


@pytest.mark.parametrize('use_probs', [False, True])
def test_score_attention_saves_the_scores_not_the_probabilities(use_probs):
    """``softmax(A) V`` of a layer whose scores are kept anyway stores no probability map (the
    backward recomputes it from the row log-sum-exp); output and gradients equal the plain
    softmax and matmul, also when the returned probabilities feed a loss (the LA layers'
    L_DP)."""
    from mmeffvit.ops.attention import _SoftmaxValues, masked_softmax
    torch.manual_seed(0)
    scores = (torch.randn(2, 3, 40, 12) * 4).requires_grad_()
    v = torch.randn(2, 3, 12, 8, requires_grad=True)
    grad_out, grad_probs = torch.randn(2, 3, 40, 8), torch.randn(2, 3, 40, 12)

    def loss(out, probs):
        return (out * grad_out).sum() + ((probs * grad_probs).sum() if use_probs else 0)

    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out, probs = _SoftmaxValues.apply(scores, v)
    map_shaped = [t for t in saved if t.shape == scores.shape]
    assert len(map_shaped) == 1 and map_shaped[0] is scores
    got = torch.autograd.grad(loss(out, probs), [scores, v])
    ref_probs = masked_softmax(scores)
    ref_out = ref_probs @ v
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(probs, ref_probs)
    want = torch.autograd.grad(loss(ref_out, ref_probs), [scores, v])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_training_lavit_stores_no_global_score_map():
    """Stages 1-2 hold no LA layer: their last VA layers' scores, read by the next AR module
    only, stay factored (FactoredScores), so no tensor of a global map's shape is saved for
    backward (the dense path saved stage 1's map, and stage 2's with its residual)."""
    model = LaViT(arch='tiny').train()
    x = torch.randn(1, 3, 128, 128)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        sum(o.sum() for o in model(x)).backward()
    # 128/4 = 32 tokens a side in stage 1 (1 head), 16 in stage 2 (2 heads); sr keeps 4x4 keys
    maps = {(1, 1, 32 * 32, 16), (1, 2, 16 * 16, 16)}
    shapes = {tuple(t.shape) for t in saved}
    assert shapes and not shapes & maps, shapes & maps
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with patch_dense_scores():
            model(x)
    assert {tuple(t.shape) for t in saved} & maps  # the check sees maps where there are


@contextlib.contextmanager
def patch_dense_scores():
    """Every VA layer writes its scores as a map (the path before factored scores)."""
    forward = less_attention.VanillaAttention.forward

    def dense(self, *args, factor_scores=False, **kwargs):
        return forward(self, *args, factor_scores=False, **kwargs)

    less_attention.VanillaAttention.forward = dense
    try:
        yield
    finally:
        less_attention.VanillaAttention.forward = forward


@pytest.mark.parametrize('size', [(124, 92), (150, 230), (224, 224)])
def test_factored_scores_equal_the_dense_path(size):
    """Outputs and every gradient with stages 1-2's scores factored equal those of the maps, on
    odd sizes too (124: stage 2's key grid is a cell larger than stage 1's, so the AR residual
    gets zero-padded keys and keeps its bias column)."""
    torch.manual_seed(0)
    model = LaViT('tiny', drop_path_rate=0.).double().train()
    _randomise_ar(model)
    x = torch.randn(2, 3, *size, dtype=torch.float64)

    def run():
        outs = model(x)
        loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
                   for o in outs)
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        return outs, grads

    outs, grads = run()
    with patch_dense_scores():
        ref_outs, ref_grads = run()
    for a, b in zip(outs, ref_outs):  # the map path's softmax runs in fp32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    scale = max(g.abs().max() for g in ref_grads if g is not None)
    for (name, _), a, b in zip(model.named_parameters(), grads, ref_grads):
        if b is None:
            assert a is None, name
            continue
        # per-row constants (the AR biases away from padded keys) have a zero gradient: the
        # factors give exactly zero, the maps rounding noise
        a = torch.zeros_like(b) if a is None else a
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6 * float(scale), msg=name)


def test_attention_saturation_tool_reads_every_layer_map():
    """tools/analysis/attention_saturation.py rebuilds the softmax maps of VA and LA layers
    (the layers keep none): one per block, rows summing to 1; identity Θ/Ψ copy the map."""
    import importlib.util
    path = osp.join(osp.dirname(__file__), '..', 'tools', 'analysis', 'attention_saturation.py')
    spec = importlib.util.spec_from_file_location('attention_saturation_tool', path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    torch.manual_seed(0)
    model = LaViT('tiny', la_mode='dense', pretrain_img_size=64).eval()
    maps = tool.lavit_maps(model, torch.rand(2, 3, 64, 64), stage=3)
    assert [tuple(m.shape) for m in maps] == [(2, 5, 16, 4)] * 2  # 4x4 queries, 2x2 keys
    for m in maps:
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]))
    assert tool.consecutive_similarity(maps) == [pytest.approx(1.0)]


@pytest.mark.parametrize('la_mode', ['window', 'dense'])
def test_inference_attention_on_onednn_row_blocks_equals_sdpa(monkeypatch, switch_kernels, la_mode):
    """CPU fp32 inference with oneDNN's linears (forced): the VA layers attend by oneDNN row
    blocks (no flash kernel runs), outputs equal to torch's SDPA path."""
    from torch.profiler import profile

    from mmeffvit.ops.policy import ONEDNN_LINEAR
    if not ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    switch_kernels(required=False, cpu_gemm='onednn')
    torch.manual_seed(0)
    model = LaViT('tiny', la_mode=la_mode).eval()
    _randomise_ar(model)
    # the paper form (dense) holds LA maps for the training grid only
    x = torch.randn(1, 3, *((124, 92) if la_mode == 'window' else (224, 224)))
    with torch.no_grad():
        with profile() as prof:
            outs = model(x)
        switch_kernels(required=False, cpu_gemm='aten')  # SDPA: the row blocks need oneDNN's
        ref = model(x)
    assert not any('flash' in e.key for e in prof.key_averages())
    for a, b in zip(outs, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
