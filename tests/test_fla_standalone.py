"""FocusedLinearAttention used on its own, as README.md shows it (issue 14, item 5).

The README example is extracted and run; ``attend`` with keys on their own grid is compared with
an explicit N×n attention matrix built from FLatten's definitions (sec. 4.1, eq. 5-7; sec. 4.2,
eq. 9); the dtype contract and the shape errors are checked.
"""
import doctest
import os.path as osp
import re

import pytest
import torch
import torch.nn.functional as F

from mmeffvit.models.layers import FocusedLinearAttention

README = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'README.md')


def readme_example():
    """The first python block under the README heading about FocusedLinearAttention."""
    with open(README, encoding='utf-8') as f:
        text = f.read()
    section = text.split('## Focused linear attention in your own model', 1)
    assert len(section) == 2, 'README lost its FocusedLinearAttention section'
    block = re.search(r'```python\n(.*?)```', section[1], re.S)
    assert block, 'no python block in the FocusedLinearAttention section'
    return block.group(1)


def test_readme_example_runs():
    code = readme_example()
    assert 10 <= len(code.strip().splitlines()) <= 16  # the promised ~10-line example
    namespace = {}
    exec(compile(code, 'README.md', 'exec'), namespace)
    assert namespace['out'].shape == (2, 600, 64)
    # the example's module is the real thing: it has trainable focusing scale and DWC
    assert isinstance(namespace['attn'], FocusedLinearAttention)
    assert not hasattr(namespace['core'], 'qkv') and not hasattr(namespace['core'], 'proj')


def test_docstring_example():
    finder = doctest.DocTestFinder()
    tests = finder.find(FocusedLinearAttention, 'FocusedLinearAttention',
                        globs={'torch': torch, 'FocusedLinearAttention': FocusedLinearAttention})
    examples = [t for t in tests if t.examples]
    assert examples, 'the class docstring lost its example'
    runner = doctest.DocTestRunner()
    for test in examples:
        runner.run(test)
    assert runner.failures == 0 and runner.tries >= 4


def explicit_attention(attn, q, k, v, hw, kv_hw):
    """FLatten written with the full (N, n) matrix per head, float64; no code of the module."""
    b, n_q, c = q.shape
    heads, d = attn.num_heads, c // attn.num_heads
    n_kv = kv_hw[0] * kv_hw[1]
    if attn.positional_encoding is not None:
        pe = attn.positional_encoding.reshape(1, *attn.pe_size, c).permute(0, 3, 1, 2)
        pe = F.interpolate(pe, size=kv_hw, mode='bicubic', align_corners=False)
        k = k + pe.flatten(2).transpose(1, 2)
    s = torch.log(1 + torch.exp(attn.scale))  # softplus
    p = attn.focusing_factor

    def phi(t):  # eq. 5-6: relu + eps, divided by the scale, f_p over all C channels
        t = (t.clamp(min=0) + 1e-6) / s
        return t.norm(dim=-1, keepdim=True) * t ** p / (t ** p).norm(dim=-1, keepdim=True)

    fq, fk = phi(q), phi(k)
    out = torch.empty_like(q)
    for head in range(heads):
        cols = slice(head * d, (head + 1) * d)
        sim = fq[..., cols] @ fk[..., cols].transpose(1, 2)        # (B, N, n)
        out[..., cols] = (sim @ v[..., cols]) / (sim.sum(-1, keepdim=True) + n_kv * 1e-6)
    # eq. 9: the same d-channel depthwise kernels on each head's values, at the key grid,
    # then (keys on a coarser grid) resized bilinearly to the query grid
    for head in range(heads):
        cols = slice(head * d, (head + 1) * d)
        v_map = v[..., cols].transpose(1, 2).reshape(b, d, *kv_hw)
        dwc = F.conv2d(v_map, attn.dwc.weight, attn.dwc.bias,
                       padding=attn.dwc.padding, groups=d)
        if tuple(kv_hw) != tuple(hw):
            dwc = F.interpolate(dwc, size=hw, mode='bilinear', align_corners=False)
        out[..., cols] += dwc.flatten(2).transpose(1, 2)
    return out


def randomised(attn):
    """Non-zero values for the zero-initialised scale and positional encoding."""
    torch.manual_seed(1)
    with torch.no_grad():
        attn.scale.normal_(0, 0.5)
        if attn.positional_encoding is not None:
            attn.positional_encoding.normal_(0, 0.5)
    return attn


@pytest.mark.parametrize('hw, kv_hw, pe_size', [
    ((5, 7), (5, 7), None),
    ((6, 9), (6, 9), (4, 4)),     # positional encoding resized to the key grid
    ((8, 10), (4, 5), (4, 5)),    # keys/values on a coarser grid (bring-your-own reduction)
    ((1, 13), (1, 13), None),     # one row
])
def test_attend_matches_explicit_matrix(hw, kv_hw, pe_size):
    attn = randomised(FocusedLinearAttention(
        12, 3, pe_size=pe_size, qkv_layout=None, kernel_size=3)).double()
    q = torch.randn(2, hw[0] * hw[1], 12, dtype=torch.float64)
    k = torch.randn(2, kv_hw[0] * kv_hw[1], 12, dtype=torch.float64)
    v = torch.randn(2, kv_hw[0] * kv_hw[1], 12, dtype=torch.float64)
    ours = attn.attend(q, k, v, hw, kv_hw)
    ref = explicit_attention(attn, q, k, v, hw, kv_hw)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-10)


def test_forward_is_projections_around_attend():
    attn = randomised(FocusedLinearAttention(16, 2, pe_size=(3, 3), qkv_layout='qkv')).double()
    x = torch.randn(3, 20, 16, dtype=torch.float64)
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).chunk(3, -1)
    ref = explicit_attention(attn, q, k, v, (4, 5), (4, 5)) @ attn.proj.weight.T + attn.proj.bias
    torch.testing.assert_close(attn(x, (4, 5)), ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('dtype, tol', [
    (torch.float32, 1e-5), (torch.bfloat16, 1.5e-2), (torch.float16, 2e-3)])
def test_dtype_contract(dtype, tol):
    """Module and input in one dtype: output in that dtype, close to the fp64 result."""
    torch.manual_seed(0)
    ref_attn = randomised(FocusedLinearAttention(32, 2, pe_size=(4, 4), qkv_layout='qkv'))
    x = torch.randn(2, 6 * 7, 32)
    ref = ref_attn.double()(x.double(), (6, 7))
    low = randomised(FocusedLinearAttention(32, 2, pe_size=(4, 4), qkv_layout='qkv'))
    low.load_state_dict(ref_attn.state_dict())
    out = low.to(dtype)(x.to(dtype), (6, 7))
    assert out.dtype == dtype and torch.isfinite(out.float()).all()
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < tol, rel


def test_autocast_output_dtype_and_values():
    attn = randomised(FocusedLinearAttention(32, 2, qkv_layout='qkv'))
    x = torch.randn(2, 30, 32)
    ref = attn(x, (5, 6))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = attn(x, (5, 6))
    assert out.dtype == torch.bfloat16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 3e-2


def test_attend_output_has_dtype_of_q():
    core = FocusedLinearAttention(16, 2, qkv_layout=None)
    q = torch.randn(1, 12, 16, dtype=torch.bfloat16)
    k, v = torch.randn(2, 1, 12, 16).unbind(0)
    assert core.attend(q, k, v, (3, 4)).dtype == torch.bfloat16


def test_cost_is_linear_in_tokens():
    """65 536 tokens: an explicit N×n matrix would need 16 GiB per head; this runs in MBs."""
    core = FocusedLinearAttention(16, 1, qkv_layout=None)
    q, k, v = torch.randn(3, 1, 256 * 256, 16).unbind(0)
    with torch.no_grad():
        out = core.attend(q, k, v, (256, 256))
    assert out.shape == (1, 65536, 16) and torch.isfinite(out).all()


def test_trains_inside_a_users_model():
    """Every parameter receives a gradient and one optimiser step lowers a simple loss."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)
            self.attn = FocusedLinearAttention(16, 2, pe_size=(4, 4), qkv_layout='q_kv')

        def forward(self, x, hw):
            return x + self.attn(self.norm(x), hw)

    block = Block()
    x, target = torch.randn(2, 20, 16), torch.randn(2, 20, 16)
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    loss = F.mse_loss(block(x, (4, 5)), target)
    loss.backward()
    missing = [n for n, p in block.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing, missing
    opt.step()
    assert F.mse_loss(block(x, (4, 5)), target) < loss


def _call(kind, **kw):
    core = FocusedLinearAttention(16, 2, qkv_layout=None)
    full = FocusedLinearAttention(16, 2, qkv_layout='qkv')
    q = kw.get('q', torch.randn(2, 12, 16))
    k = kw.get('k', torch.randn(2, 12, 16))
    v = kw.get('v', torch.randn(2, 12, 16))
    hw = kw.get('hw', (3, 4))
    if kind == 'forward':
        return full(kw.get('x', q), hw)
    return core.attend(q, k, v, hw, kw.get('kv_hw'))


@pytest.mark.parametrize('kind, kw, message', [
    ('attend', dict(q=torch.randn(2, 10, 16)), r'q has 10 tokens, hw_shape \(3, 4\) has 12'),
    ('attend', dict(k=torch.randn(2, 9, 16)), r'k has 9 tokens, hw_shape \(3, 4\) has 12'),
    ('attend', dict(k=torch.randn(2, 6, 16), v=torch.randn(2, 6, 16), kv_hw=(2, 4)),
     r'k has 6 tokens, kv_hw \(2, 4\) has 8'),
    ('attend', dict(v=torch.randn(2, 12, 8)), r'v has 8 channels, the module embed_dims=16'),
    ('attend', dict(q=torch.randn(12, 16)), r'q must be a \(B, tokens, C\) tensor'),
    ('attend', dict(k=torch.randn(1, 12, 16)), r'k has batch size 1, q has 2'),
    ('attend', dict(hw=(3, 4, 1)), r'hw_shape must be \(H, W\)'),
    ('attend', dict(hw=(0, 12)), r'hw_shape must be \(H, W\) with positive sides'),
    ('attend', dict(q=torch.randint(0, 9, (2, 12, 16))), r'floating'),
    ('forward', dict(x=torch.randn(2, 12, 8)), r'x has 8 channels, the module embed_dims=16'),
    ('forward', dict(x=torch.randn(12, 16)), r'x must be a \(B, tokens, C\) tensor'),
    ('forward', dict(hw=(4, 4)), r'x has 12 tokens, hw_shape \(4, 4\) has 16'),
])
def test_bad_shapes_raise_clear_errors(kind, kw, message):
    with pytest.raises(ValueError, match=message):
        _call(kind, **kw)
