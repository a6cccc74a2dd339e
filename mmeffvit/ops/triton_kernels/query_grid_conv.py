"""LaViT's attention-residual conv over the query grid of a score map (LaViT, sec. 3.3, Eq. 6)
as Triton kernels: ``out[b, o, y, x, n] = Σ_{h,i,j} w[o, h, i, j] · a[b, h, s·y+i, s·x+j, n]
+ bias[o]``, zeros beyond the input grid.

Forward: one program per (image, output head, output row) and block of columns and keys reads
each tap in place (any strides) and writes the sum once. Backward: the scores' gradient, one
program per input row, gathers the output taps that read it; the weight's gradient sums
``g · a`` per (o, h, i, j) in partial sums over row ranges (one reduction after, no atomics).
"""
import torch
import triton
import triton.language as tl

from .focused_linear_attention import interpreting

ROWS_PER_SPLIT = 8  # output rows per partial sum of the weight gradient


def blocks():
    """``(BLOCK_X, BLOCK_N)``: 16 × 64 elements a program on a GPU; larger blocks in the
    interpreter, whose cost is per operation, not per element."""
    return (64, 256) if interpreting() else (16, 64)


@triton.jit
def _forward_kernel(a_ptr, w_ptr, b_ptr, o_ptr, H_IN, HQ, WQ, NK, HO, WO, OUT, stride,
                    sa0, sa1, sa2, sa3, sa4,
                    HAS_BIAS: tl.constexpr, K: tl.constexpr, BLOCK_X: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    y = pid % HO
    o = (pid // HO) % OUT
    b = pid // (HO * OUT)
    xs = tl.program_id(1) * BLOCK_X + tl.arange(0, BLOCK_X)
    ns = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    out_mask = (xs < WO)[:, None] & (ns < NK)[None, :]
    acc = tl.zeros([BLOCK_X, BLOCK_N], dtype=tl.float32)
    for h in range(H_IN):
        for i in tl.static_range(K):
            yi = stride * y + i
            for j in tl.static_range(K):
                xi = stride * xs + j
                mask = out_mask & (xi < WQ)[:, None] & (yi < HQ)
                a = tl.load(a_ptr + b * sa0 + h * sa1 + yi * sa2 + xi[:, None] * sa3
                            + ns[None, :] * sa4, mask=mask, other=0.0)
                w = tl.load(w_ptr + ((o * H_IN + h) * K + i) * K + j).to(tl.float32)
                acc += a.to(tl.float32) * w
    if HAS_BIAS:
        acc += tl.load(b_ptr + o).to(tl.float32)
    tl.store(o_ptr + (((b * OUT + o) * HO + y) * WO + xs[:, None]) * NK + ns[None, :],
             acc.to(o_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _grad_input_kernel(g_ptr, w_ptr, da_ptr, H_IN, HQ, WQ, NK, HO, WO, OUT, stride,
                       sg0, sg1, sg2, sg3, sg4,
                       K: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_N: tl.constexpr):
    """``da[b, h, yi, xi, n] = Σ_{o,i,j} w[o, h, i, j] · g[b, o, (yi-i)/s, (xi-j)/s, n]`` over the
    taps that exist (divisible and inside the output grid), 0 where no output reads it."""
    pid = tl.program_id(0)
    yi = pid % HQ
    h = (pid // HQ) % H_IN
    b = pid // (HQ * H_IN)
    xi = tl.program_id(1) * BLOCK_X + tl.arange(0, BLOCK_X)
    ns = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_mask = (xi < WQ)[:, None] & (ns < NK)[None, :]
    acc = tl.zeros([BLOCK_X, BLOCK_N], dtype=tl.float32)
    for o in range(OUT):
        for i in tl.static_range(K):
            yy = yi - i
            y_ok = (yy >= 0) & (yy % stride == 0) & (yy // stride < HO)
            for j in tl.static_range(K):
                xx = xi - j
                x_ok = (xx >= 0) & (xx % stride == 0) & (xx // stride < WO)
                mask = in_mask & x_ok[:, None] & y_ok
                g = tl.load(g_ptr + b * sg0 + o * sg1 + (yy // stride) * sg2
                            + (xx // stride)[:, None] * sg3 + ns[None, :] * sg4, mask=mask,
                            other=0.0)
                w = tl.load(w_ptr + ((o * H_IN + h) * K + i) * K + j).to(tl.float32)
                acc += g.to(tl.float32) * w
    tl.store(da_ptr + (((b * H_IN + h) * HQ + yi) * WQ + xi[:, None]) * NK + ns[None, :],
             acc.to(da_ptr.dtype.element_ty), mask=in_mask)


@triton.jit
def _grad_weight_kernel(g_ptr, a_ptr, part_ptr, B, H_IN, HQ, WQ, NK, HO, WO, OUT, stride,
                        rows_per_split, sg0, sg1, sg2, sg3, sg4, sa0, sa1, sa2, sa3, sa4,
                        K: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_N: tl.constexpr):
    """This split's share of ``dw[o, h, i, j] = Σ_{b,y,x,n} g[b, o, y, x, n] · a[b, h, s·y+i,
    s·x+j, n]``, over output rows ``split·rows_per_split …`` of the ``B·HO`` rows."""
    tap = tl.program_id(0)
    j = tap % K
    i = (tap // K) % K
    h = (tap // (K * K)) % H_IN
    o = tap // (K * K * H_IN)
    split = tl.program_id(1)
    acc = tl.zeros([BLOCK_X, BLOCK_N], dtype=tl.float32)
    start = split * rows_per_split
    for r in range(start, tl.minimum(start + rows_per_split, B * HO)):
        b = r // HO
        y = r % HO
        yi = stride * y + i
        for x0 in range(0, WO, BLOCK_X):
            xs = x0 + tl.arange(0, BLOCK_X)
            xi = stride * xs + j
            for n0 in range(0, NK, BLOCK_N):
                ns = n0 + tl.arange(0, BLOCK_N)
                mask = (xs < WO)[:, None] & (ns < NK)[None, :]
                g = tl.load(g_ptr + b * sg0 + o * sg1 + y * sg2 + xs[:, None] * sg3
                            + ns[None, :] * sg4, mask=mask, other=0.0)
                a = tl.load(a_ptr + b * sa0 + h * sa1 + yi * sa2 + xi[:, None] * sa3
                            + ns[None, :] * sa4, mask=mask & (xi < WQ)[:, None] & (yi < HQ),
                            other=0.0)
                acc += g.to(tl.float32) * a.to(tl.float32)
    tl.store(part_ptr + tap * tl.num_programs(1) + split, tl.sum(tl.sum(acc, axis=1), axis=0))


def _geometry(attn, weight, out_hw):
    b, h, hq, wq, nk = attn.shape
    return b, h, hq, wq, nk, weight.shape[0], weight.shape[-1], out_hw[0], out_hw[1]


def launch_forward(attn, weight, bias, stride, out_hw):
    """``(B, out, Ho, Wo, Nk)`` in the dtype of ``attn``, fp32 sums."""
    b, h, hq, wq, nk, o, k, ho, wo = _geometry(attn, weight, out_hw)
    out = torch.empty(b, o, ho, wo, nk, device=attn.device, dtype=attn.dtype)
    weight = weight.contiguous()
    BLOCK_X, BLOCK_N = blocks()
    _forward_kernel[(b * o * ho, triton.cdiv(wo, BLOCK_X), triton.cdiv(nk, BLOCK_N))](
        attn, weight, weight if bias is None else bias, out, h, hq, wq, nk, ho, wo, o, stride,
        *attn.stride(), HAS_BIAS=bias is not None, K=k, BLOCK_X=BLOCK_X, BLOCK_N=BLOCK_N)
    return out


def num_weight_splits(b, ho):
    return triton.cdiv(b * ho, ROWS_PER_SPLIT)


def launch_backward(grad, attn, weight, stride, out_hw, need_attn, need_weight, need_bias):
    """The gradients of ``attn`` (its dtype), ``weight`` and ``bias`` (fp32 sums in their
    dtypes; ``weight.dtype`` for the bias), each an empty tensor where not needed."""
    b, h, hq, wq, nk, o, k, ho, wo = _geometry(attn, weight, out_hw)
    w = weight.contiguous()
    BLOCK_X, BLOCK_N = blocks()
    # distinct empty tensors where not needed: a custom op's outputs may not alias
    grad_attn, grad_weight, grad_bias = (attn.new_empty(0) for _ in range(3))
    if need_attn:
        grad_attn = torch.empty(attn.shape, device=attn.device, dtype=attn.dtype)
        _grad_input_kernel[(b * h * hq, triton.cdiv(wq, BLOCK_X), triton.cdiv(nk, BLOCK_N))](
            grad, w, grad_attn, h, hq, wq, nk, ho, wo, o, stride, *grad.stride(), K=k,
            BLOCK_X=BLOCK_X, BLOCK_N=BLOCK_N)
    if need_weight:
        splits = num_weight_splits(b, ho)
        parts = torch.empty(o * h * k * k, splits, device=attn.device, dtype=torch.float32)
        _grad_weight_kernel[(o * h * k * k, splits)](
            grad, attn, parts, b, h, hq, wq, nk, ho, wo, o, stride, ROWS_PER_SPLIT,
            *grad.stride(), *attn.stride(), K=k, BLOCK_X=BLOCK_X, BLOCK_N=BLOCK_N)
        grad_weight = parts.sum(1).view(weight.shape).to(weight.dtype)
    if need_bias:
        grad_bias = grad.sum((0, 2, 3, 4), dtype=torch.float32).to(weight.dtype)
    return grad_attn, grad_weight, grad_bias
