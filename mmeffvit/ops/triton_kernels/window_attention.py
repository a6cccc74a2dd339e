"""Softmax attention inside small windows (Swin, sec. 3.2, Eq. 4) as Triton kernels.

One program per (window, head) and block of queries holds the window's keys and values
(``n ≤ 256`` tokens: 7×7 and 12×12 windows) and computes
``softmax(q·kᵀ·scale + bias + mask)·v`` in fp32, writing the output heads apart
``(B·nW, n, h, e)`` (the caller's head merge is a view) and the log-sum-exp of each row for
the backward. The bias and the mask are read through strides, broadcast over windows or heads
where their size is 1 (no repeated copy). The backward, one program per (window, head),
recomputes the probabilities from the log-sum-exp and writes dq, dk, dv, and, where the bias
is trained, the score gradients that sum into its gradient.
"""
import torch
import triton
import triton.language as tl

from .focused_linear_attention import dot_setup, padded

BLOCK_QUERIES = 64
MAX_TOKENS = 256  # keys a program holds; larger windows take the reference


def broadcast_strides(t, windows, heads):
    """Strides of a ``(windows | 1, heads | 1, n, n)`` term, 0 along a broadcast dimension
    (the kernels take a dummy pointer and zero strides for None)."""
    if t is None:
        return 0, 0, 0, 0
    return (0 if t.shape[0] == 1 else t.stride(0), 0 if t.shape[1] == 1 else t.stride(1),
            t.stride(2), t.stride(3))


@triton.jit
def _scores(q, k_ptr, skn, skd, b_ptr, m_ptr, sb2, sb3, sm2, sm3, rows, row_mask, n, scale,
            D: tl.constexpr, D_PAD: tl.constexpr, N_PAD: tl.constexpr,
            HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, DOT_DTYPE: tl.constexpr,
            PRECISION: tl.constexpr):
    """``q·kᵀ·scale + bias + mask`` of a block of queries against the window's keys, fp32,
    ``-inf`` past the last key; also returns the keys."""
    keys = tl.arange(0, N_PAD)
    key_mask = keys < n
    d = tl.arange(0, D_PAD)
    k = tl.load(k_ptr + keys[:, None] * skn + d[None, :] * skd,
                mask=key_mask[:, None] & (d < D)[None, :], other=0.0)
    s = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * scale
    both = row_mask[:, None] & key_mask[None, :]
    if HAS_BIAS:
        s += tl.load(b_ptr + rows[:, None] * sb2 + keys[None, :] * sb3, mask=both,
                     other=0.0).to(tl.float32)
    if HAS_MASK:
        s += tl.load(m_ptr + rows[:, None] * sm2 + keys[None, :] * sm3, mask=both,
                     other=0.0).to(tl.float32)
    return tl.where(key_mask[None, :], s, float('-inf')), k


@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, b_ptr, m_ptr, o_ptr, lse_ptr, n, heads, scale,
                    sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3,
                    sb0, sb1, sb2, sb3, sm0, sm1, sm2, sm3,
                    HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, D: tl.constexpr,
                    E: tl.constexpr, D_PAD: tl.constexpr, E_PAD: tl.constexpr,
                    N_PAD: tl.constexpr, BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr,
                    PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    w = pid // heads
    hd = pid % heads
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n
    d = tl.arange(0, D_PAD)
    q = tl.load(q_ptr + w * sq0 + hd * sq1 + rows[:, None] * sq2 + d[None, :] * sq3,
                mask=row_mask[:, None] & (d < D)[None, :], other=0.0)
    s, _ = _scores(q, k_ptr + w * sk0 + hd * sk1, sk2, sk3, b_ptr + w * sb0 + hd * sb1,
                   m_ptr + w * sm0 + hd * sm1, sb2, sb3, sm2, sm3, rows, row_mask, n, scale,
                   D, D_PAD, N_PAD, HAS_BIAS, HAS_MASK, DOT_DTYPE, PRECISION)
    row_max = tl.max(s, axis=1)
    p = tl.exp(s - row_max[:, None])
    total = tl.sum(p, axis=1)
    keys = tl.arange(0, N_PAD)
    e = tl.arange(0, E_PAD)
    v = tl.load(v_ptr + w * sv0 + hd * sv1 + keys[:, None] * sv2 + e[None, :] * sv3,
                mask=(keys < n)[:, None] & (e < E)[None, :], other=0.0)
    out = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION) / total[:, None]
    # output heads apart: (windows, n, heads, E) contiguous
    tl.store(o_ptr + ((w * n + rows[:, None]) * heads + hd) * E + e[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & (e < E)[None, :])
    tl.store(lse_ptr + pid * n + rows, row_max + tl.log(total), mask=row_mask)


@triton.jit
def _backward_kernel(q_ptr, k_ptr, v_ptr, b_ptr, m_ptr, o_ptr, lse_ptr, g_ptr, dq_ptr, dk_ptr,
                     dv_ptr, ds_ptr, n, heads, scale,
                     sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3,
                     sb0, sb1, sb2, sb3, sm0, sm1, sm2, sm3, sg0, sg1, sg2, sg3,
                     HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, BIAS_GRAD: tl.constexpr,
                     D: tl.constexpr, E: tl.constexpr, D_PAD: tl.constexpr,
                     E_PAD: tl.constexpr, N_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                     DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """dq, dk, dv of one (window, head), and its score gradients into ``ds`` (fp32,
    ``(windows, heads, n, n)``) where the bias is trained."""
    pid = tl.program_id(0)
    w = pid // heads
    hd = pid % heads
    keys = tl.arange(0, N_PAD)
    key_mask = keys < n
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, E_PAD)
    v = tl.load(v_ptr + w * sv0 + hd * sv1 + keys[:, None] * sv2 + e[None, :] * sv3,
                mask=key_mask[:, None] & (e < E)[None, :], other=0.0)
    dk = tl.zeros([N_PAD, D_PAD], dtype=tl.float32)
    dv = tl.zeros([N_PAD, E_PAD], dtype=tl.float32)
    for m0 in range(0, n, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_mask = rows < n
        qd_mask = row_mask[:, None] & (d < D)[None, :]
        qe_mask = row_mask[:, None] & (e < E)[None, :]
        q = tl.load(q_ptr + w * sq0 + hd * sq1 + rows[:, None] * sq2 + d[None, :] * sq3,
                    mask=qd_mask, other=0.0)
        s, k = _scores(q, k_ptr + w * sk0 + hd * sk1, sk2, sk3, b_ptr + w * sb0 + hd * sb1,
                       m_ptr + w * sm0 + hd * sm1, sb2, sb3, sm2, sm3, rows, row_mask, n,
                       scale, D, D_PAD, N_PAD, HAS_BIAS, HAS_MASK, DOT_DTYPE, PRECISION)
        lse = tl.load(lse_ptr + pid * n + rows, mask=row_mask, other=0.0)
        p = tl.exp(s - lse[:, None])
        p = tl.where(row_mask[:, None], p, 0.0)
        g = tl.load(g_ptr + w * sg0 + hd * sg1 + rows[:, None] * sg2 + e[None, :] * sg3,
                    mask=qe_mask, other=0.0).to(tl.float32)
        o = tl.load(o_ptr + ((w * n + rows[:, None]) * heads + hd) * E + e[None, :],
                    mask=qe_mask, other=0.0).to(tl.float32)
        dv = tl.dot(tl.trans(p.to(DOT_DTYPE)), g.to(DOT_DTYPE), dv, input_precision=PRECISION)
        dp = tl.dot(g.to(DOT_DTYPE), tl.trans(v.to(DOT_DTYPE)), input_precision=PRECISION)
        ds = p * (dp - tl.sum(g * o, axis=1)[:, None])
        dq = tl.dot(ds.to(DOT_DTYPE), k.to(DOT_DTYPE), input_precision=PRECISION) * scale
        tl.store(dq_ptr + ((w * heads + hd) * n + rows[:, None]) * D + d[None, :],
                 dq.to(dq_ptr.dtype.element_ty), mask=qd_mask)
        dk = tl.dot(tl.trans(ds.to(DOT_DTYPE)), q.to(DOT_DTYPE), dk, input_precision=PRECISION)
        if BIAS_GRAD:
            tl.store(ds_ptr + (pid * n + rows[:, None]) * n + keys[None, :], ds,
                     mask=row_mask[:, None] & key_mask[None, :])
    kd_mask = key_mask[:, None] & (d < D)[None, :]
    tl.store(dk_ptr + ((w * heads + hd) * n + keys[:, None]) * D + d[None, :],
             (dk * scale).to(dk_ptr.dtype.element_ty), mask=kd_mask)
    tl.store(dv_ptr + ((w * heads + hd) * n + keys[:, None]) * E + e[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=key_mask[:, None] & (e < E)[None, :])


def _layout(q, v):
    bw, h, n, d = q.shape
    e = v.shape[-1]
    return bw, h, n, d, e, padded(d), padded(e), padded(n)


def launch_forward(q, k, v, bias, mask, scale):
    """The output ``(BW, n, h, e)`` in the dtype of q and the fp32 log-sum-exp ``(BW, h, n)``."""
    bw, h, n, d, e, d_pad, e_pad, n_pad = _layout(q, v)
    dot_dtype, precision = dot_setup(q.dtype)
    out = torch.empty(bw, n, h, e, device=q.device, dtype=q.dtype)
    lse = torch.empty(bw, h, n, device=q.device, dtype=torch.float32)
    block = min(BLOCK_QUERIES, n_pad)
    _forward_kernel[(bw * h, triton.cdiv(n, block))](
        q, k, v, q if bias is None else bias, q if mask is None else mask, out, lse, n, h,
        scale, *q.stride(), *k.stride(), *v.stride(), *broadcast_strides(bias, bw, h),
        *broadcast_strides(mask, bw, h), HAS_BIAS=bias is not None, HAS_MASK=mask is not None,
        D=d, E=e, D_PAD=d_pad, E_PAD=e_pad, N_PAD=n_pad, BLOCK_M=block, DOT_DTYPE=dot_dtype,
        PRECISION=precision)
    return out, lse


def launch_backward(grad, q, k, v, bias, mask, out, lse, scale, bias_grad):
    """dq, dk, dv ``(BW, h, n, ·)`` in the inputs' dtypes, and the bias gradient in the bias'
    shape and dtype (an empty tensor unless ``bias_grad``). ``grad`` is ``(BW, n, h, e)``."""
    bw, h, n, d, e, d_pad, e_pad, n_pad = _layout(q, v)
    dot_dtype, precision = dot_setup(q.dtype)
    dq = torch.empty(bw, h, n, d, device=q.device, dtype=q.dtype)
    dk = torch.empty(bw, h, n, d, device=k.device, dtype=k.dtype)
    dv = torch.empty(bw, h, n, e, device=v.device, dtype=v.dtype)
    ds = torch.empty(bw, h, n, n, device=q.device, dtype=torch.float32) if bias_grad else dq
    g = grad.transpose(1, 2)  # (BW, h, n, e) strides
    _backward_kernel[(bw * h, )](
        q, k, v, q if bias is None else bias, q if mask is None else mask, out, lse, g, dq, dk,
        dv, ds, n, h, scale, *q.stride(), *k.stride(), *v.stride(),
        *broadcast_strides(bias, bw, h), *broadcast_strides(mask, bw, h), *g.stride(),
        HAS_BIAS=bias is not None, HAS_MASK=mask is not None, BIAS_GRAD=bias_grad, D=d, E=e,
        D_PAD=d_pad, E_PAD=e_pad, N_PAD=n_pad, BLOCK_M=min(BLOCK_QUERIES, n_pad),
        DOT_DTYPE=dot_dtype, PRECISION=precision)
    if not bias_grad:
        return dq, dk, dv, q.new_empty(0)
    dims = [i for i in (0, 1) if bias.shape[i] == 1]
    dbias = ds.sum(dims, keepdim=True) if dims else ds
    return dq, dk, dv, dbias.to(bias.dtype)
