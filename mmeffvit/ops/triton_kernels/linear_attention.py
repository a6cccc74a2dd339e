"""Kv-first linear attention on mapped features (``mmeffvit.ops.linear_attention``: L²ViT's
clamped sum with a per-head temperature, FLatten's mean form, CARE's) as two Triton passes per
head, the same plan as :mod:`.focused_linear_attention` without the focusing function.

Pass 1: the state ``S = Σ_j k_jᵀ v_j`` and key sum ``m = Σ_j k_j`` (``/ n`` in the mean form)
in fp32 partial sums over token ranges, summed by one reduction. Pass 2:
``o_i = τ_h q_i S / den_i`` with ``den_i = q_i·m + eps`` (mean) or ``max(q_i·m, clamp)`` (sum).
The backward recomputes the numerator and normaliser per query block.
"""
import torch
import triton
import triton.language as tl

from .focused_linear_attention import (BLOCK_TOKENS, dot_setup, load_state, padded, store_state,
                                       summed, token_splits)


@triton.jit
def _state_kernel(k_ptr, v_ptr, part_ptr, n, heads, tokens_per_split, inv_n,
                  skb, skh, skn, skd, svb, svh, svn, sve,
                  D: tl.constexpr, E: tl.constexpr, D_PAD: tl.constexpr, E_PAD: tl.constexpr,
                  BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    k_ptr += (pid // heads) * skb + (pid % heads) * skh
    v_ptr += (pid // heads) * svb + (pid % heads) * svh
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, E_PAD)
    kv = tl.zeros([D_PAD, E_PAD], dtype=tl.float32)
    ksum = tl.zeros([D_PAD], dtype=tl.float32)
    start = split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, n)
    for n0 in range(start, stop, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N)
        row_mask = rows < stop
        k = tl.load(k_ptr + rows[:, None] * skn + d[None, :] * skd,
                    mask=row_mask[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + rows[:, None] * svn + e[None, :] * sve,
                    mask=row_mask[:, None] & (e < E)[None, :], other=0.0)
        kv = tl.dot(tl.trans(k.to(DOT_DTYPE)), v.to(DOT_DTYPE), kv, input_precision=PRECISION)
        ksum += tl.sum(k, axis=0)
    part_ptr += (pid * tl.num_programs(1) + split) * (D_PAD * E_PAD + D_PAD)
    store_state(part_ptr, kv * inv_n, ksum * inv_n, D_PAD, E_PAD)


@triton.jit
def _normalised(q, kv, kmean, eps, clamp, MODE: tl.constexpr, DOT_DTYPE: tl.constexpr,
                PRECISION: tl.constexpr):
    """``q S`` (without τ), the raw normaliser ``q·m`` and the one divided by."""
    num = tl.dot(q.to(DOT_DTYPE), kv.to(DOT_DTYPE), input_precision=PRECISION)
    raw = tl.sum(q * kmean[None, :], axis=1)
    den = raw + eps if MODE == 0 else tl.maximum(raw, clamp)
    return num, raw, den


@triton.jit
def _apply_kernel(q_ptr, state_ptr, t_ptr, o_ptr, N, heads, eps, clamp,
                  sqb, sqh, sqn, sqd,
                  MODE: tl.constexpr, HAS_TEMP: tl.constexpr, D: tl.constexpr, E: tl.constexpr,
                  D_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < N
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, E_PAD)
    q = tl.load(q_ptr + (pid // heads) * sqb + (pid % heads) * sqh + rows[:, None] * sqn
                + d[None, :] * sqd, mask=row_mask[:, None] & (d < D)[None, :],
                other=0.0).to(tl.float32)
    kv, kmean = load_state(state_ptr + pid * (D_PAD * E_PAD + D_PAD), D_PAD, E_PAD)
    num, _, den = _normalised(q, kv, kmean, eps, clamp, MODE, DOT_DTYPE, PRECISION)
    den = tl.where(row_mask, den, 1.0)
    if HAS_TEMP:
        num = num * tl.load(t_ptr + pid % heads).to(tl.float32)
    tl.store(o_ptr + (pid * N + rows[:, None]) * E + e[None, :],
             (num / den[:, None]).to(o_ptr.dtype.element_ty),
             mask=row_mask[:, None] & (e < E)[None, :])


@triton.jit
def _grad_query_kernel(q_ptr, state_ptr, t_ptr, g_ptr, dq_ptr, part_ptr, N, heads,
                       tokens_per_split, eps, clamp, sqb, sqh, sqn, sqd, sgb, sgh, sgn, sge,
                       MODE: tl.constexpr, HAS_TEMP: tl.constexpr, D: tl.constexpr,
                       E: tl.constexpr, D_PAD: tl.constexpr, E_PAD: tl.constexpr,
                       BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr,
                       PRECISION: tl.constexpr):
    """dq, and this split's share of dS, dm and dτ (packed after dS and dm)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    q_ptr += (pid // heads) * sqb + (pid % heads) * sqh
    g_ptr += (pid // heads) * sgb + (pid % heads) * sgh
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, E_PAD)
    kv, kmean = load_state(state_ptr + pid * (D_PAD * E_PAD + D_PAD), D_PAD, E_PAD)
    tau = tl.load(t_ptr + pid % heads).to(tl.float32) if HAS_TEMP else 1.0
    d_kv = tl.zeros([D_PAD, E_PAD], dtype=tl.float32)
    d_kmean = tl.zeros([D_PAD], dtype=tl.float32)
    d_tau = tl.zeros([BLOCK_M], dtype=tl.float32)
    start = split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, N)
    for m0 in range(start, stop, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_mask = rows < stop
        qd_mask = row_mask[:, None] & (d < D)[None, :]
        q = tl.load(q_ptr + rows[:, None] * sqn + d[None, :] * sqd, mask=qd_mask,
                    other=0.0).to(tl.float32)
        g = tl.load(g_ptr + rows[:, None] * sgn + e[None, :] * sge,
                    mask=row_mask[:, None] & (e < E)[None, :], other=0.0).to(tl.float32)
        num, raw, den = _normalised(q, kv, kmean, eps, clamp, MODE, DOT_DTYPE, PRECISION)
        den = tl.where(row_mask, den, 1.0)  # rows past the end: 0 / 1, not 0 / 0 with clamp 0
        d_num = g / den[:, None]  # of τ·q S
        d_den = -tl.sum(d_num * num, axis=1) * tau / den
        if MODE == 1:  # the clamp passes the gradient where q·m >= clamp (as torch.clamp)
            d_den = tl.where(raw >= clamp, d_den, 0.0)
        dq = tl.dot((d_num * tau).to(DOT_DTYPE), tl.trans(kv.to(DOT_DTYPE)),
                    input_precision=PRECISION) + d_den[:, None] * kmean[None, :]
        tl.store(dq_ptr + (pid * N + rows[:, None]) * D + d[None, :],
                 dq.to(dq_ptr.dtype.element_ty), mask=qd_mask)
        d_kv = tl.dot(tl.trans(q.to(DOT_DTYPE)), (d_num * tau).to(DOT_DTYPE), d_kv,
                      input_precision=PRECISION)
        d_kmean += tl.sum(d_den[:, None] * q, axis=0)
        d_tau += tl.sum(d_num * num, axis=1)
    part_ptr += (pid * tl.num_programs(1) + split) * (D_PAD * E_PAD + D_PAD + 1)
    store_state(part_ptr, d_kv, d_kmean, D_PAD, E_PAD)
    tl.store(part_ptr + D_PAD * E_PAD + D_PAD, tl.sum(d_tau, axis=0))


@triton.jit
def _grad_key_kernel(k_ptr, v_ptr, dstate_ptr, dk_ptr, dv_ptr, n, heads, inv_n,
                     skb, skh, skn, skd, svb, svh, svn, sve,
                     D: tl.constexpr, E: tl.constexpr, D_PAD: tl.constexpr, E_PAD: tl.constexpr,
                     BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """``dk_j = (v_j dSᵀ + dm) / n`` and ``dv_j = k_j dS / n`` (no ``/ n`` in the sum form)."""
    pid = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, E_PAD)
    d_kv, d_kmean = load_state(dstate_ptr + pid * (D_PAD * E_PAD + D_PAD + 1), D_PAD, E_PAD)
    d_kv, d_kmean = d_kv * inv_n, d_kmean * inv_n
    kd_mask = row_mask[:, None] & (d < D)[None, :]
    ve_mask = row_mask[:, None] & (e < E)[None, :]
    k = tl.load(k_ptr + (pid // heads) * skb + (pid % heads) * skh + rows[:, None] * skn
                + d[None, :] * skd, mask=kd_mask, other=0.0)
    v = tl.load(v_ptr + (pid // heads) * svb + (pid % heads) * svh + rows[:, None] * svn
                + e[None, :] * sve, mask=ve_mask, other=0.0)
    dk = tl.dot(v.to(DOT_DTYPE), tl.trans(d_kv.to(DOT_DTYPE)),
                input_precision=PRECISION) + d_kmean[None, :]
    tl.store(dk_ptr + (pid * n + rows[:, None]) * D + d[None, :],
             dk.to(dk_ptr.dtype.element_ty), mask=kd_mask)
    dv = tl.dot(k.to(DOT_DTYPE), d_kv.to(DOT_DTYPE), input_precision=PRECISION)
    tl.store(dv_ptr + (pid * n + rows[:, None]) * E + e[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=ve_mask)


def _layout(q, v):
    b, h, _, d = q.shape
    e = v.shape[-1]
    return b, h, d, e, padded(d), padded(e)


def launch_forward(q, k, v, temperature, mode, eps, clamp_min):
    """``(B, h, N, e)`` in the dtype of q and the packed fp32 state for the backward."""
    b, h, d, e, d_pad, e_pad = _layout(q, v)
    n_q, n = q.shape[2], k.shape[2]
    dot_dtype, precision = dot_setup(q.dtype)
    splits, per_split = token_splits(n)
    parts = torch.empty(b * h, splits, d_pad * e_pad + d_pad, device=q.device,
                        dtype=torch.float32)
    _state_kernel[(b * h, splits)](
        k, v, parts, n, h, per_split, 1.0 / n if mode == 0 else 1.0, *k.stride(), *v.stride(),
        D=d, E=e, D_PAD=d_pad, E_PAD=e_pad, BLOCK_N=BLOCK_TOKENS, DOT_DTYPE=dot_dtype,
        PRECISION=precision)
    state = summed(parts)
    out = torch.empty(b, h, n_q, e, device=q.device, dtype=q.dtype)
    _apply_kernel[(b * h, triton.cdiv(n_q, BLOCK_TOKENS))](
        q, state, q if temperature is None else temperature, out, n_q, h, eps, clamp_min,
        *q.stride(), MODE=mode, HAS_TEMP=temperature is not None, D=d, E=e, D_PAD=d_pad,
        E_PAD=e_pad, BLOCK_M=BLOCK_TOKENS, DOT_DTYPE=dot_dtype, PRECISION=precision)
    return out, state


def launch_backward(grad, q, k, v, temperature, state, mode, eps, clamp_min):
    """dq, dk, dv (their inputs' dtypes) and dτ (``(h,)`` fp32; empty without a temperature)."""
    b, h, d, e, d_pad, e_pad = _layout(q, v)
    n_q, n = q.shape[2], k.shape[2]
    dot_dtype, precision = dot_setup(q.dtype)
    common = dict(D=d, E=e, D_PAD=d_pad, E_PAD=e_pad, DOT_DTYPE=dot_dtype, PRECISION=precision)
    splits, per_split = token_splits(n_q)
    parts = torch.empty(b * h, splits, d_pad * e_pad + d_pad + 1, device=q.device,
                        dtype=torch.float32)
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    _grad_query_kernel[(b * h, splits)](
        q, state, q if temperature is None else temperature, grad, dq, parts, n_q, h,
        per_split, eps, clamp_min, *q.stride(), *grad.stride(), MODE=mode,
        HAS_TEMP=temperature is not None, BLOCK_M=BLOCK_TOKENS, **common)
    dstate = summed(parts)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    _grad_key_kernel[(b * h, triton.cdiv(n, BLOCK_TOKENS))](
        k, v, dstate, dk, dv, n, h, 1.0 / n if mode == 0 else 1.0, *k.stride(), *v.stride(),
        BLOCK_N=BLOCK_TOKENS, **common)
    d_tau = q.new_empty(0, dtype=torch.float32)
    if temperature is not None:
        d_tau = dstate[:, -1].view(b, h).sum(0)
    return dq, dk, dv, d_tau
