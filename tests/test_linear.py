"""``models/layers/linear.py``: ``Linear`` and timm's ``Mlp`` with oneDNN's fused kernels on the
CPU in fp32 (inference and training), torch's path everywhere else."""
import importlib

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Mlp as TimmMlp
from torch.profiler import profile

from mmeffvit.models.layers import Linear, Mlp
from mmeffvit.models.layers import linear as linear_module
from mmeffvit.ops.policy import ONEDNN_LINEAR, choose_cpu_gemm
from mmeffvit.utils import split_heads

ops_linear = importlib.import_module('mmeffvit.ops.linear')  # the function ops.linear shadows it


def _ops(fn):
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def _pair(dims=48, hidden=192):
    torch.manual_seed(0)
    ours = Mlp(dims, hidden)
    reference = TimmMlp(dims, hidden)
    reference.load_state_dict(ours.state_dict())
    return ours, reference


@pytest.fixture
def onednn_kernel(monkeypatch, switch_kernels):
    """The fused path on oneDNN's kernel, whichever this CPU would choose (see
    ``mmeffvit.ops.policy.choose_cpu_gemm``)."""
    if not ONEDNN_LINEAR:
        pytest.skip('torch without oneDNN linear')
    switch_kernels(required=False, cpu_gemm='onednn')


needs_onednn = pytest.mark.usefixtures('onednn_kernel')


@needs_onednn
@pytest.mark.parametrize('shape', [(2, 37, 48), (3, 5, 7, 48), (11, 48)])
def test_inference_uses_the_fused_kernel_and_matches_eager(shape):
    ours, reference = _pair()
    ours.eval(), reference.eval()
    x = torch.randn(*shape) * 3  # wide enough to reach GELU's tails
    x = x.transpose(0, -2).contiguous().transpose(0, -2) if x.dim() == 3 else x  # strided too
    with torch.no_grad():
        ops = _ops(lambda: ours(x))
        assert 'mkldnn::_linear_pointwise' in ops and 'aten::addmm' not in ops
        out, expected = ours(x), reference(x)
    explicit = F.linear(F.gelu(F.linear(x, ours.fc1.weight, ours.fc1.bias)), ours.fc2.weight,
                        ours.fc2.bias)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, explicit, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('case', ['tanh', 'float64', 'autocast', 'functorch'])
def test_eager_path_where_the_kernel_does_not_apply(case, onednn_kernel):
    ours, reference = _pair()
    ours.eval(), reference.eval()
    x = torch.randn(2, 9, 48)
    if case == 'tanh':  # the inference kernel fuses exact GELU only; its linears still fuse
        ours.act = reference.act = torch.nn.GELU(approximate='tanh')
    if case == 'float64':
        ours.double(), reference.double()
        x = x.double()
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=case == 'autocast'), torch.no_grad():
        if case == 'functorch':
            run = lambda: torch.func.vmap(ours)(x)  # noqa: E731
        else:
            run = lambda: ours(x)  # noqa: E731
        ops = _ops(run)
        assert ('mkldnn::_linear_pointwise' in ops) == (case == 'tanh') and (
            'aten::gelu' in ops or case == 'autocast')
        out, expected = run(), reference(x)
    torch.testing.assert_close(out, expected)


@needs_onednn
@pytest.mark.parametrize('case', ['train', 'grad'])
def test_training_forward_is_fused_and_gradients_are_torchs(case):
    """Training mode (or an input needing a gradient): oneDNN's forward with the bias fused,
    GELU apart; output and every gradient equal torch's (addmm) path."""
    ours, reference = _pair()
    ours.train(case == 'train'), reference.train(case == 'train')
    x = (torch.randn(2, 9, 48) * 3).requires_grad_(case == 'grad')
    ops = _ops(lambda: ours(x).sum().backward())
    assert 'mkldnn::_linear_pointwise' in ops and '_GeluLinearBackward' in ops
    ours.zero_grad(set_to_none=True)
    out, expected = ours(x), reference(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn_like(out)
    params, ref_params = list(ours.parameters()), list(reference.parameters())
    inputs = [x] if case == 'grad' else []
    grads = torch.autograd.grad(out, inputs + params, grad_out)
    expected_grads = torch.autograd.grad(expected, inputs + ref_params, grad_out)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@needs_onednn
def test_fused_linear_double_backward_matches_torch():
    """The backward is made of differentiable operators: a gradient penalty (double backward)
    through it equals the one through ``F.linear``."""
    torch.manual_seed(2)
    weight = torch.randn(6, 5, requires_grad=True)
    bias = torch.randn(6, requires_grad=True)
    x = torch.randn(4, 3, 5, requires_grad=True)

    def penalty(fn):
        out = fn(x, weight, bias)
        grad_x, = torch.autograd.grad((out.tanh() ** 2).sum(), x, create_graph=True)
        return torch.autograd.grad(grad_x.square().sum(), [x, weight, bias])

    assert 'mkldnn::_linear_pointwise' in _ops(lambda: linear_module.linear(x, weight, bias))
    for got, want in zip(penalty(linear_module.linear), penalty(F.linear)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # GELU + fc2 in one Function (the training MLP)
    assert '_GeluLinearBackward' in _ops(
        lambda: ops_linear._GeluLinear.apply(x, weight, bias).sum().backward())
    for got, want in zip(penalty(ops_linear._GeluLinear.apply),
                         penalty(lambda *a: F.linear(F.gelu(a[0]), *a[1:]))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize('owned', [True, False])
def test_gelu_linear_stores_the_pre_activation_only_and_writes_its_gradient_over_it(
        owned, monkeypatch):
    """Only ``h`` (and the weight) is saved, ``gelu(h)`` is recomputed in blocks of rows
    (three here, the last one short); gradients equal torch's. With ``owned`` a plain backward
    returns the input gradient in ``h``'s memory; with ``retain_graph`` (or not owned) ``h``
    stays intact and a second backward gives the same gradients."""
    monkeypatch.setattr(ops_linear, '_GELU_BLOCK_ELEMENTS', 1)  # 64-row blocks
    torch.manual_seed(3)
    base = torch.randn(150, 12, requires_grad=True)
    weight = torch.randn(5, 12, requires_grad=True)
    bias = torch.randn(5, requires_grad=True)
    grad_out = torch.randn(150, 5)
    expected = torch.autograd.grad(F.linear(F.gelu(base), weight, bias), [base, weight, bias],
                                   grad_out)

    def run(retain):
        hidden = base * 1  # an intermediate, as fc1's output
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                      lambda t: t):
            out = ops_linear._GeluLinear.apply(hidden, weight, bias, owned)
        assert [tuple(t.shape) for t in saved] == [(150, 12), (5, 12)]
        assert saved[0] is hidden
        snapshot = hidden.clone()
        first = torch.autograd.grad(out, [hidden, weight, bias], grad_out, retain_graph=retain)
        in_place = first[0].data_ptr() == hidden.data_ptr()
        intact = hidden.equal(snapshot)
        first = torch.autograd.grad(hidden, base, first[0], retain_graph=True) + first[1:]
        second = None
        if retain:
            second = torch.autograd.grad(out, [hidden, weight, bias], grad_out)
            second = torch.autograd.grad(hidden, base, second[0]) + second[1:]
        return in_place, intact, first, second

    in_place, intact, first, _ = run(retain=False)
    assert in_place == owned and intact != owned
    for got, want in zip(first, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    in_place, intact, first, second = run(retain=True)
    assert not in_place and intact
    for got, again, want in zip(first, second, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(again, want, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_training_mlp_stores_no_gelu_output():
    """A training Mlp saves its input and the ``(N, 4C)`` pre-activation, not ``gelu(h)`` too
    (timm's Mlp saves both)."""
    ours, reference = _pair()
    x = torch.randn(2, 9, 48, requires_grad=True)

    def hidden_maps(module):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                      lambda t: t):
            module(x)
        return len({t.data_ptr() for t in saved if t.numel() == 2 * 9 * 192})

    assert hidden_maps(reference) == 2
    assert hidden_maps(ours) == 1


def test_same_parameters_as_timm():
    ours, reference = _pair()
    assert list(ours.state_dict()) == list(reference.state_dict())


def test_flop_counter_sees_the_plain_operators():
    from torch.utils.flop_counter import FlopCounterMode
    ours, _ = _pair()
    ours.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        ours(torch.randn(5, 48))
    assert counter.get_total_flops() == 2 * 5 * 48 * 192 * 2


@needs_onednn
@pytest.mark.parametrize('bias', [True, False])
def test_linear_fused_in_inference_and_training(bias):
    torch.manual_seed(1)
    ours = Linear(40, 24, bias=bias)
    torch.manual_seed(1)
    plain = torch.nn.Linear(40, 24, bias=bias)  # the same initialisation
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                 plain.state_dict().values()))
    x = torch.randn(3, 17, 40)[:, ::2]  # strided
    with torch.no_grad():
        ops = _ops(lambda: ours(x))
        assert 'mkldnn::_linear_pointwise' in ops and 'aten::addmm' not in ops
        torch.testing.assert_close(ours(x), x @ plain.weight.T + (plain.bias if bias else 0))
    x.requires_grad_()
    ops = _ops(lambda: ours(x).sum().backward())
    assert 'mkldnn::_linear_pointwise' in ops and 'aten::addmm' not in ops
    x.grad = None
    ours.zero_grad(set_to_none=True)
    ours(x).square().sum().backward()
    plain(x_ref := x.detach().requires_grad_()).square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(ours.weight.grad, plain.weight.grad, rtol=1e-5, atol=1e-4)
    assert (ours.bias is None) == (not bias)
    if bias:
        torch.testing.assert_close(ours.bias.grad, plain.bias.grad, rtol=1e-5, atol=1e-4)


def test_hooked_submodules_keep_their_hooks():
    ours, _ = _pair()
    ours.eval()
    seen = []
    ours.fc2.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        ours(torch.randn(4, 48))
    assert seen == [torch.Size([4, 48])]


def _residual_reference(x, norm, mlp):
    """``x + fc2(gelu(fc1(layer_norm(x))))`` written with torch's functional operators."""
    y = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    y = F.linear(F.gelu(F.linear(y, mlp.fc1.weight, mlp.fc1.bias)), mlp.fc2.weight, mlp.fc2.bias)
    return x + y


def _residual_case(tokens=300, dims=24, hidden=96):
    from mmeffvit.models.layers import LayerNormFP32
    torch.manual_seed(0)
    norm, mlp = LayerNormFP32(dims).eval(), Mlp(dims, hidden).eval()
    with torch.no_grad():  # non-trivial affine parameters
        norm.weight.uniform_(0.5, 1.5), norm.bias.uniform_(-0.5, 0.5)
    return torch.randn(2, tokens, dims) * 2, norm, mlp


@needs_onednn
def test_mlp_residual_runs_in_place_in_row_blocks_and_equals_the_plain_expression(monkeypatch):
    x, norm, mlp = _residual_case()
    monkeypatch.setattr(ops_linear, '_MLP_BLOCKED_MIN_ELEMENTS', 1000)
    monkeypatch.setattr(ops_linear, '_MLP_BLOCK_ELEMENTS', 96 * 128)  # 128 rows per block
    rows_seen = []
    fused = ops_linear.fused_linear

    def spy(inp, weight, bias, activation='none'):
        rows_seen.append(inp.shape[0])
        return fused(inp, weight, bias, activation)

    monkeypatch.setattr(ops_linear, 'fused_linear', spy)
    expected = _residual_reference(x, norm, mlp)
    owned = x.clone()
    with torch.no_grad():
        out = linear_module.mlp_residual(owned, norm, mlp, torch.nn.Identity(), owned=True)
    assert out is owned  # written over the caller's tensor
    # 600 rows: blocks of 128, 128, 128, 128, 88, each through fc1 and fc2
    assert rows_seen == [128, 128, 128, 128, 128, 128, 128, 128, 88, 88]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize('case', ['not owned', 'grad', 'training', 'hook', 'batch norm',
                                  'drop path', 'small map'])
def test_mlp_residual_is_the_plain_expression_where_blocks_do_not_apply(monkeypatch, case):
    from timm.layers import DropPath
    x, norm, mlp = _residual_case()
    monkeypatch.setattr(ops_linear, '_MLP_BLOCKED_MIN_ELEMENTS',
                        10**9 if case == 'small map' else 1000)
    drop_path, owned, grad = torch.nn.Identity(), case != 'not owned', case == 'grad'
    if case == 'training':
        mlp.train()
    if case == 'hook':
        mlp.fc1.register_forward_hook(lambda *args: None)
    if case == 'batch norm':
        norm = torch.nn.BatchNorm1d(300).eval()
    if case == 'drop path':
        drop_path = DropPath(0.5).train()
    torch.manual_seed(1)
    expected = (x + drop_path(mlp(norm(x)))) if case in ('training', 'drop path') else None
    x_before = x.clone()
    torch.manual_seed(1)
    with torch.set_grad_enabled(grad):
        out = linear_module.mlp_residual(x, norm, mlp, drop_path, owned=owned)
    assert out is not x and torch.equal(x, x_before)  # a new tensor, the input untouched
    if expected is None:
        expected = (x + mlp(norm(x))) if case == 'batch norm' else _residual_reference(x, norm, mlp)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def _projected_heads(parts=3, heads=2, tokens=7, dims=12, seed=3):
    torch.manual_seed(seed)
    fc = Linear(dims, parts * dims)
    return fc, torch.randn(2, tokens, dims, requires_grad=True)


@pytest.mark.parametrize('parts', [2, 3])
def test_project_heads_gradients_equal_the_plain_split(parts):
    """``project_heads``: the same views and, bit for bit, the same gradients as
    ``split_heads(fc(x))`` through autograd's ``unbind`` (one part unused: zero gradient)."""
    fc, x = _projected_heads(parts)
    ops = _ops(lambda: sum(p.sum() for p in linear_module.project_heads(fc, x, parts, 2))
               .backward())
    assert '_SplitHeadsOverSpentBackward' in ops
    weights = [torch.randn(2, 2, 7, 6) for _ in range(parts)]

    def grads(split):
        views = split()
        loss = sum((v * w).sum() for v, w in zip(views[:-1], weights))  # last part unused
        values = [v.detach().clone() for v in views]  # the backward may reuse their memory
        return values, torch.autograd.grad(loss, [x, fc.weight, fc.bias])

    views, got = grads(lambda: linear_module.project_heads(fc, x, parts, 2))
    plain, want = grads(lambda: split_heads(fc(x), parts, 2))
    for v, p in zip(views, plain):
        assert v.shape == p.shape == (2, 2, 7, 6) and torch.equal(v, p)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize('retain', [False, True])
def test_split_heads_gradient_overwrites_the_spent_projection_unless_the_graph_is_kept(retain):
    """The gradient of the projection is written over its memory; with ``retain_graph`` the
    projection stays intact (a second backward reads the same values)."""
    projected = (torch.randn(2, 5, 12, requires_grad=True) * 1)  # a non-leaf, as fc's output
    before = projected.detach().clone()
    q, k, v = ops_linear._SplitHeadsOverSpent.apply(projected, 3, 2)
    grad, = torch.autograd.grad((q * k * v).sum(), projected, retain_graph=retain)
    expected, = torch.autograd.grad((lambda a, b, c: (a * b * c).sum())(
        *split_heads(before.requires_grad_(), 3, 2)), before)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)
    assert (grad.data_ptr() == projected.data_ptr()) == (not retain)
    if retain:
        assert torch.equal(projected.detach(), before.detach())


def test_project_heads_double_backward_and_hooked_projection_take_the_plain_path():
    fc, x = _projected_heads()

    def penalty(split):
        q, k, v = split()
        grad_x, = torch.autograd.grad((q * k * v).tanh().sum(), x, create_graph=True)
        return torch.autograd.grad(grad_x.square().sum(), [x, fc.weight])

    got = penalty(lambda: linear_module.project_heads(fc, x, 3, 2))
    want = penalty(lambda: split_heads(fc(x), 3, 2))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    fc.register_forward_hook(lambda *args: None)
    ops = _ops(lambda: sum(p.sum() for p in linear_module.project_heads(fc, x, 3, 2))
               .backward())
    assert '_SplitHeadsOverSpentBackward' not in ops and 'UnbindBackward0' in ops


@needs_onednn
def test_input_gradient_runs_onednn_and_equals_torchs():
    """``dX = dY·W`` goes through oneDNN's linear kernel (faster than MKL's GEMM on narrow
    outputs); equal to ``F.linear``'s input gradient up to float rounding."""
    torch.manual_seed(4)
    fc = Linear(24, 72).requires_grad_(False)  # the input gradient only: no dW GEMM
    x = torch.randn(3, 50, 24, requires_grad=True)
    grad_out = torch.randn(3, 50, 72)
    with profile() as prof:
        got, = torch.autograd.grad(fc(x), x, grad_out)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls['mkldnn::_linear_pointwise'] == 2 and 'aten::mm' not in calls  # fwd and dX
    want, = torch.autograd.grad(F.linear(x, fc.weight, fc.bias), x, grad_out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_unknown_linear_kernel_override_is_an_error():
    with pytest.raises(ValueError, match='MMEFFVIT_LINEAR_KERNEL'):
        choose_cpu_gemm('AVX2', 'mkl')


def test_aten_kernel_runs_torchs_linear_and_matches(monkeypatch, switch_kernels):
    """Where oneDNN is the slower kernel (AVX2), the fused path runs ``F.linear`` and GELU in
    place, forward and backward, with the same results."""
    switch_kernels(required=False, cpu_gemm='aten')
    ours, reference = _pair()
    x = torch.randn(2, 37, 48) * 3
    with torch.no_grad():
        ops = _ops(lambda: ours.eval()(x))
        assert 'mkldnn::_linear_pointwise' not in ops and 'aten::gelu_' in ops
        torch.testing.assert_close(ours(x), reference.eval()(x), rtol=1e-5, atol=1e-5)
    ours.train(), reference.train()
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    ops = _ops(lambda: ours(x_ours).square().sum().backward())
    assert 'mkldnn::_linear_pointwise' not in ops and '_GeluLinearBackward' in ops
    reference(x_ref).square().sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    for p, q in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
