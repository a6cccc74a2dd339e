"""Triton building blocks of FLatten's focusing function (sec. 4.1, eq. 5-6), per token block.

``t = (relu(x) + eps) / softplus(s)``, ``φ(x) = t**p · ||t|| / ||t**p||`` with both norms over
all C channels of a token (heads together, as the official code). A kernel that works on one
head's columns first computes the per-token factor ``||t|| / ||t**p||`` over the whole row
(:func:`row_norms`), then maps its own columns (:func:`focus_columns`); nothing mapped is
written to memory.
"""
import triton
import triton.language as tl


@triton.jit
def softplus(s):
    """``log(1 + exp(s))`` as ``F.softplus`` (threshold 20), exact for very negative s too."""
    e = tl.exp(tl.minimum(s, 20.0))
    small = e - 0.5 * e * e  # log1p(e) to fp32 precision where e < 4.5e-5
    return tl.where(s > 20.0, s, tl.where(s < -10.0, small, tl.log(1.0 + e)))


@triton.jit
def softplus_grad(s):
    """d softplus / ds: the sigmoid, 1 above the threshold."""
    return tl.where(s > 20.0, 1.0, 1.0 / (1.0 + tl.exp(-s)))


@triton.jit
def power(t, p, P_INT: tl.constexpr):
    """``t ** p`` for ``t > 0``: repeated products for an integer power ``P_INT`` (as ATen's
    pow does for small integers), else ``exp2(p · log2 t)``."""
    if P_INT > 0:
        u = t
        for _ in tl.static_range(P_INT - 1):
            u = u * t
    else:
        u = tl.exp2(p * tl.log2(t))
    return u


@triton.jit
def focus_columns(x_ptr, stride_n, stride_c, rows, row_mask, cols, col_mask, s_ptr, focus_eps,
                  p, P_INT: tl.constexpr):
    """``t`` and ``t ** p`` of the given rows and columns, fp32, zero outside the masks."""
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_n + cols[None, :] * stride_c, mask=mask,
                other=0.0).to(tl.float32)
    s = tl.load(s_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    t = (tl.maximum(x, 0.0) + focus_eps) / softplus(s)[None, :]
    t = tl.where(mask, t, 1.0)  # a valid base for the power; zeroed below
    u = power(t, p, P_INT)
    return tl.where(mask, t, 0.0), tl.where(mask, u, 0.0)


@triton.jit
def row_norms(x_ptr, stride_n, stride_c, rows, row_mask, C, s_ptr, focus_eps, p,
              P_INT: tl.constexpr, BLOCK_C: tl.constexpr):
    """``||t||`` and ``||t ** p||`` over all C channels of each row, in column chunks."""
    sq_t = tl.zeros([rows.shape[0]], dtype=tl.float32)
    sq_u = tl.zeros([rows.shape[0]], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        t, u = focus_columns(x_ptr, stride_n, stride_c, rows, row_mask, cols, cols < C, s_ptr,
                             focus_eps, p, P_INT)
        sq_t += tl.sum(t * t, axis=1)
        sq_u += tl.sum(u * u, axis=1)
    return tl.sqrt(sq_t), tl.sqrt(sq_u)


@triton.jit
def focused_head(x_ptr, stride_n, stride_c, rows, row_mask, C, cols, col_mask, s_ptr, focus_eps,
                 p, P_INT: tl.constexpr, BLOCK_C: tl.constexpr):
    """One head's columns of ``φ(x)`` for a block of rows, with ``t``, ``t ** p`` and the
    row factor ``||t|| / ||t ** p||`` (zero past the last row) that the backward needs."""
    norm_t, norm_u = row_norms(x_ptr, stride_n, stride_c, rows, row_mask, C, s_ptr, focus_eps,
                               p, P_INT, BLOCK_C)
    factor = norm_t / tl.where(row_mask, norm_u, 1.0)  # rows past the end: 0 / 1
    t, u = focus_columns(x_ptr, stride_n, stride_c, rows, row_mask, cols, col_mask, s_ptr,
                         focus_eps, p, P_INT)
    return u * factor[:, None], t, u, factor


@triton.jit
def focus_backward_rows(x_ptr, sxn, sxc, g_ptr, sgn, sgc, dx_ptr, sdn, sdc, s_ptr, ds_ptr,
                        rows, row_mask, C, focus_eps, p, P_INT: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    """``dx`` of ``φ`` for a block of whole rows given ``g = dL/dφ`` (written to ``dx_ptr``),
    and these rows' share of ``dL/ds`` (written to the C entries at ``ds_ptr``).

    With ``a = ||t||``, ``b = ||u||``, ``u = t**p`` and ``γ = g · u`` per row:
    ``dt = (g a/b - γ a/b³ u) p t^(p-1) + γ/(a b) t``; ``dx = dt / softplus(s) · [x > 0]``,
    ``d softplus(s) = -dt t / softplus(s)``.
    """
    sq_t = tl.zeros([rows.shape[0]], dtype=tl.float32)
    sq_u = tl.zeros([rows.shape[0]], dtype=tl.float32)
    gu = tl.zeros([rows.shape[0]], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_mask = cols < C
        t, u = focus_columns(x_ptr, sxn, sxc, rows, row_mask, cols, col_mask, s_ptr, focus_eps,
                             p, P_INT)
        g = tl.load(g_ptr + rows[:, None] * sgn + cols[None, :] * sgc,
                    mask=row_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        sq_t += tl.sum(t * t, axis=1)
        sq_u += tl.sum(u * u, axis=1)
        gu += tl.sum(g * u, axis=1)
    a = tl.sqrt(sq_t)
    b = tl.where(row_mask, tl.sqrt(sq_u), 1.0)
    a_safe = tl.where(row_mask, a, 1.0)
    direct = a / b  # 0 past the last row
    through_b = gu * a / (b * b * b)
    through_a = gu / (a_safe * b)
    through_a = tl.where(row_mask, through_a, 0.0)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_mask = cols < C
        mask = row_mask[:, None] & col_mask[None, :]
        t, u = focus_columns(x_ptr, sxn, sxc, rows, row_mask, cols, col_mask, s_ptr, focus_eps,
                             p, P_INT)
        x = tl.load(x_ptr + rows[:, None] * sxn + cols[None, :] * sxc, mask=mask, other=0.0)
        g = tl.load(g_ptr + rows[:, None] * sgn + cols[None, :] * sgc, mask=mask,
                    other=0.0).to(tl.float32)
        s = tl.load(s_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        sigma = softplus(s)
        t_safe = tl.where(mask, t, 1.0)
        dt = ((g * direct[:, None] - through_b[:, None] * u) * (p * u / t_safe)
              + through_a[:, None] * t)
        dt = tl.where(mask, dt, 0.0)
        dx = tl.where(x > 0, dt / sigma[None, :], 0.0)
        tl.store(dx_ptr + rows[:, None] * sdn + cols[None, :] * sdc,
                 dx.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(ds_ptr + cols, tl.sum(-dt * t, axis=0) / sigma * softplus_grad(s),
                 mask=col_mask)
