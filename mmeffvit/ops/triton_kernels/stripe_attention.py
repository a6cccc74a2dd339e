"""One branch of CSWin's cross-shaped window attention with LePE (CSWin, sec. 3.2-3.3, Eq. 3-4)
as Triton kernels.

Windows of ``(wh, ww)`` tokens tile the ``H×W`` map (stripes, or the whole map); token ``t`` of
window ``(gy, gx)`` is map row ``gy·wh + t // ww``, column ``gx·ww + t % ww``, real where that
lies inside the map. q, k and v are read in place through their ``(B, H·W, C)`` strides (views
into the block's fused projection): no stripe is padded or copied. The forward, one program per
(image, window, head) and block of queries, runs the softmax online over blocks of keys
(windows hold up to several hundred tokens: 7×84 stripes at 800×1333), adds LePE (a depthwise
3×3 conv on v, zero outside the window and the map) and writes the output in token order with
the rows' log-sum-exp.

The backward recomputes: a query kernel (the attention output again, then dq, and LePE's weight
and bias gradients as partial sums) and a key kernel (dk, dv, and LePE's term of dv).
"""
import torch
import triton
import triton.language as tl

from .focused_linear_attention import dot_setup, padded

BLOCK_QUERIES = 64
BLOCK_KEYS = 64


@triton.jit
def _tokens(t, win, gw, H, W, n, WH: tl.constexpr, WW: tl.constexpr):
    """Map rows, columns, token indices and realness of window-local tokens ``t``."""
    row = (win // gw) * WH + t // WW
    col = (win % gw) * WW + t % WW
    return row, col, row * W + col, (t < n) & (row < H) & (col < W)


@triton.jit
def _rows(ptr, tok, sn, cols, sc, real, col_mask):
    """One head's columns of tokens ``tok`` (zero where not ``real``)."""
    return tl.load(ptr + tok[:, None] * sn + cols[None, :] * sc,
                   mask=real[:, None] & col_mask[None, :], other=0.0)


@triton.jit
def _neighbour(t, row, col, real, dy, dx, W, H, WH: tl.constexpr, WW: tl.constexpr):
    """Map token index of the neighbour ``(dy, dx)`` away from each token ``t``, and whether
    it is inside the window and the map (LePE's zero padding elsewhere)."""
    lr = t // WW + dy
    lc = t % WW + dx
    ok = (real & (lr >= 0) & (lr < WH) & (lc >= 0) & (lc < WW) & (row + dy < H)
          & (col + dx < W))
    return (row + dy) * W + col + dx, ok


@triton.jit
def _lepe(v_ptr, svn, svc, w_ptr, t, row, col, real, cols, col_mask, W, H,
          WH: tl.constexpr, WW: tl.constexpr, BLOCK: tl.constexpr, D_PAD: tl.constexpr):
    """``Σ_taps v[neighbour] · weight[tap]`` of tokens ``t`` (fp32), neighbours inside the
    window and the map."""
    acc = tl.zeros([BLOCK, D_PAD], dtype=tl.float32)
    for ky in tl.static_range(3):
        for kx in tl.static_range(3):
            nb, ok = _neighbour(t, row, col, real, ky - 1, kx - 1, W, H, WH, WW)
            v = _rows(v_ptr, nb, svn, cols, svc, ok, col_mask)
            w = tl.load(w_ptr + cols * 9 + ky * 3 + kx, mask=col_mask, other=0.0)
            acc += v.to(tl.float32) * w.to(tl.float32)[None, :]
    return acc


@triton.jit
def _attend(q, k_ptr, v_ptr, skn, skc, svn, svc, win, gw, H, W, n, cols, col_mask, scale,
            m_i, l_i, acc, WH: tl.constexpr, WW: tl.constexpr, BLOCK_N: tl.constexpr,
            DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """The online softmax of queries ``q`` over the window's keys: running max, sum and
    unnormalised output."""
    for j0 in range(0, n, BLOCK_N):
        t = j0 + tl.arange(0, BLOCK_N)
        _, _, tok, real = _tokens(t, win, gw, H, W, n, WH, WW)
        k = _rows(k_ptr, tok, skn, cols, skc, real, col_mask)
        v = _rows(v_ptr, tok, svn, cols, svc, real, col_mask)
        s = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION)
        s = tl.where(real[None, :], s * scale, float('-inf'))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE),
                                            input_precision=PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _head_setup(heads, nw, D: tl.constexpr, D_PAD: tl.constexpr):
    """Image, window and head of this program; the head's columns and their mask."""
    pid = tl.program_id(0)
    hd = pid % heads
    win = (pid // heads) % nw
    b = pid // (heads * nw)
    offs = tl.arange(0, D_PAD)
    return pid, b, win, hd * D + offs, offs < D


@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, w_ptr, bias_ptr, o_ptr, lse_ptr, H, W, n, gw, nw,
                    heads, scale, sqb, sqn, sqc, skb, skn, skc, svb, svn, svc,
                    HAS_BIAS: tl.constexpr, WH: tl.constexpr, WW: tl.constexpr,
                    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    pid, b, win, cols, col_mask = _head_setup(heads, nw, D, D_PAD)
    q_ptr += b * sqb
    k_ptr += b * skb
    v_ptr += b * svb
    t = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row, col, tok, real = _tokens(t, win, gw, H, W, n, WH, WW)
    q = _rows(q_ptr, tok, sqn, cols, sqc, real, col_mask)
    # finite start: a block of keys all padding leaves the running max finite
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    m_i, l_i, acc = _attend(q, k_ptr, v_ptr, skn, skc, svn, svc, win, gw, H, W, n, cols,
                            col_mask, scale, m_i, l_i, acc, WH, WW, BLOCK_N, DOT_DTYPE,
                            PRECISION)
    out = acc / l_i[:, None] + _lepe(v_ptr, svn, svc, w_ptr, t, row, col, real, cols, col_mask,
                                     W, H, WH, WW, BLOCK_M, D_PAD)
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    # output (B, H·W, C) contiguous
    tl.store(o_ptr + (b * H * W + tok[:, None]) * (heads * D) + cols[None, :],
             out.to(o_ptr.dtype.element_ty), mask=real[:, None] & col_mask[None, :])
    tl.store(lse_ptr + pid * n + t, m_i + tl.log(l_i), mask=t < n)


@triton.jit
def _query_kernel(q_ptr, k_ptr, v_ptr, g_ptr, lse_ptr, delta_ptr, dq_ptr, part_ptr, H, W, n,
                  gw, nw, heads, scale, sqb, sqn, sqc, skb, skn, skc, svb, svn, svc, sgb, sgn,
                  sgc, WH: tl.constexpr, WW: tl.constexpr, D: tl.constexpr,
                  D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """dq of a block of queries, the rows' ``δ = Σ dO·O`` for the key kernel, and LePE's
    weight and bias gradient terms of these rows (partial sums ``(programs, C, 10)``)."""
    pid, b, win, cols, col_mask = _head_setup(heads, nw, D, D_PAD)
    q_ptr += b * sqb
    k_ptr += b * skb
    v_ptr += b * svb
    g_ptr += b * sgb
    t = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row, col, tok, real = _tokens(t, win, gw, H, W, n, WH, WW)
    mask = real[:, None] & col_mask[None, :]
    q = _rows(q_ptr, tok, sqn, cols, sqc, real, col_mask)
    g = _rows(g_ptr, tok, sgn, cols, sgc, real, col_mask).to(tl.float32)
    lse = tl.load(lse_ptr + pid * n + t, mask=t < n, other=0.0)
    # the attention output again, as the forward computed it
    m_i, l_i, acc = _attend(q, k_ptr, v_ptr, skn, skc, svn, svc, win, gw, H, W, n, cols,
                            col_mask, scale, tl.full([BLOCK_M], -1e30, dtype=tl.float32),
                            tl.zeros([BLOCK_M], dtype=tl.float32),
                            tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32), WH, WW, BLOCK_N,
                            DOT_DTYPE, PRECISION)
    delta = tl.sum(g * (acc / l_i[:, None]), axis=1)
    tl.store(delta_ptr + pid * n + t, delta, mask=t < n)
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    for j0 in range(0, n, BLOCK_N):
        tk = j0 + tl.arange(0, BLOCK_N)
        _, _, tok_k, real_k = _tokens(tk, win, gw, H, W, n, WH, WW)
        k = _rows(k_ptr, tok_k, skn, cols, skc, real_k, col_mask)
        v = _rows(v_ptr, tok_k, svn, cols, svc, real_k, col_mask)
        s = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION)
        p = tl.where(real_k[None, :], tl.exp(s * scale - lse[:, None]), 0.0)
        dp = tl.dot(g.to(DOT_DTYPE), tl.trans(v.to(DOT_DTYPE)), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(DOT_DTYPE), k.to(DOT_DTYPE), dq, input_precision=PRECISION)
    tl.store(dq_ptr + (b * H * W + tok[:, None]) * (heads * D) + cols[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=mask)
    # LePE: d weight[c, tap] = Σ_rows g[row, c] · v[neighbour(row, tap), c]; d bias = Σ g
    part = part_ptr + ((b * nw + win) * tl.num_programs(1) + tl.program_id(1)) * (heads * D * 10)
    for ky in tl.static_range(3):
        for kx in tl.static_range(3):
            nb, ok = _neighbour(t, row, col, real, ky - 1, kx - 1, W, H, WH, WW)
            v = _rows(v_ptr, nb, svn, cols, svc, ok, col_mask)
            tl.store(part + cols * 10 + ky * 3 + kx, tl.sum(g * v.to(tl.float32), axis=0),
                     mask=col_mask)
    tl.store(part + cols * 10 + 9, tl.sum(g, axis=0), mask=col_mask)


@triton.jit
def _key_kernel(q_ptr, k_ptr, v_ptr, g_ptr, w_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, H, W,
                n, gw, nw, heads, scale, sqb, sqn, sqc, skb, skn, skc, svb, svn, svc, sgb, sgn,
                sgc, WH: tl.constexpr, WW: tl.constexpr, D: tl.constexpr,
                D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """dk and dv of a block of keys; dv includes LePE's term (the conv transposed: each key's
    v feeds the outputs of its neighbours, mirrored taps)."""
    pid, b, win, cols, col_mask = _head_setup(heads, nw, D, D_PAD)
    q_ptr += b * sqb
    k_ptr += b * skb
    v_ptr += b * svb
    g_ptr += b * sgb
    t = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row, col, tok, real = _tokens(t, win, gw, H, W, n, WH, WW)
    mask = real[:, None] & col_mask[None, :]
    k = _rows(k_ptr, tok, skn, cols, skc, real, col_mask)
    v = _rows(v_ptr, tok, svn, cols, svc, real, col_mask)
    dk = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    for i0 in range(0, n, BLOCK_M):
        tq = i0 + tl.arange(0, BLOCK_M)
        _, _, tok_q, real_q = _tokens(tq, win, gw, H, W, n, WH, WW)
        q = _rows(q_ptr, tok_q, sqn, cols, sqc, real_q, col_mask)
        g = _rows(g_ptr, tok_q, sgn, cols, sgc, real_q, col_mask)
        lse = tl.load(lse_ptr + pid * n + tq, mask=tq < n, other=0.0)
        delta = tl.load(delta_ptr + pid * n + tq, mask=tq < n, other=0.0)
        s = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION)
        p = tl.where(real_q[:, None] & real[None, :], tl.exp(s * scale - lse[:, None]), 0.0)
        dv = tl.dot(tl.trans(p.to(DOT_DTYPE)), g.to(DOT_DTYPE), dv, input_precision=PRECISION)
        dp = tl.dot(g.to(DOT_DTYPE), tl.trans(v.to(DOT_DTYPE)), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dk = tl.dot(tl.trans(ds.to(DOT_DTYPE)), q.to(DOT_DTYPE), dk, input_precision=PRECISION)
    # LePE's term: the output at (row - dy, col - dx) took this v with tap (dy, dx)
    for ky in tl.static_range(3):
        for kx in tl.static_range(3):
            nb, ok = _neighbour(t, row, col, real, 1 - ky, 1 - kx, W, H, WH, WW)
            g = _rows(g_ptr, nb, sgn, cols, sgc, ok, col_mask)
            w = tl.load(w_ptr + cols * 9 + ky * 3 + kx, mask=col_mask, other=0.0)
            dv += g.to(tl.float32) * w.to(tl.float32)[None, :]
    out = (b * H * W + tok[:, None]) * (heads * D) + cols[None, :]
    tl.store(dk_ptr + out, (dk * scale).to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=mask)


def geometry(hw, window):
    """``(windows across, windows in all, tokens per window)``."""
    (h, w), (wh, ww) = hw, window
    gw = triton.cdiv(w, ww)
    return gw, triton.cdiv(h, wh) * gw, wh * ww


def _launch_args(q, k, v, hw, window, heads, scale):
    gw, nw, n = geometry(hw, window)
    dot_dtype, precision = dot_setup(q.dtype)
    sizes = (hw[0], hw[1], n, gw, nw, heads, scale)
    meta = dict(WH=window[0], WW=window[1], D=q.shape[2] // heads,
                D_PAD=padded(q.shape[2] // heads), DOT_DTYPE=dot_dtype, PRECISION=precision)
    return sizes, (*q.stride(), *k.stride(), *v.stride()), meta, q.shape[0] * nw * heads, n


def launch_forward(q, k, v, weight, bias, hw, window, heads, scale):
    """The output ``(B, H·W, C)`` in the dtype of q and the fp32 log-sum-exp
    ``(B·nW·heads, n)``."""
    sizes, strides, meta, programs, n = _launch_args(q, k, v, hw, window, heads, scale)
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty(programs, n, device=q.device, dtype=torch.float32)
    block_m = min(BLOCK_QUERIES, padded(n))
    weight = weight.contiguous()
    _forward_kernel[(programs, triton.cdiv(n, block_m))](
        q, k, v, weight, weight if bias is None else bias, out, lse, *sizes, *strides,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=min(BLOCK_KEYS, padded(n)), **meta)
    return out, lse


def launch_backward(grad, q, k, v, weight, lse, hw, window, heads, scale):
    """dq, dk, dv ``(B, H·W, C)`` in the inputs' dtypes and LePE's gradients ``(C, 10)`` fp32:
    the weight's nine taps, then the bias."""
    sizes, strides, meta, programs, n = _launch_args(q, k, v, hw, window, heads, scale)
    c = q.shape[2]
    block_m = min(BLOCK_QUERIES, padded(n))
    block_n = min(BLOCK_KEYS, padded(n))
    query_blocks = triton.cdiv(n, block_m)
    dq, dk, dv = (torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))
    delta = torch.empty_like(lse)
    parts = torch.empty(programs // heads * query_blocks, c, 10, device=q.device,
                        dtype=torch.float32)
    weight = weight.contiguous()
    _query_kernel[(programs, query_blocks)](
        q, k, v, grad, lse, delta, dq, parts, *sizes, *strides, *grad.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, **meta)
    _key_kernel[(programs, triton.cdiv(n, block_n))](
        q, k, v, grad, weight, lse, delta, dk, dv, *sizes, *strides, *grad.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, **meta)
    return dq, dk, dv, parts.sum(0)
