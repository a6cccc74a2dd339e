"""FLatten's focused linear attention (sec. 4.1, eq. 5-7) as two Triton passes per head.

Pass 1 (:func:`_state_kernel`): ``φ(k)`` block by block, the state ``Σ_j φ(k_j)^T v_j / n`` and
the key mean ``Σ_j φ(k_j) / n``, fp32, in ``splits`` partial sums over token ranges (summed by
one reduction: the same order every run, no atomics). Pass 2 (:func:`_apply_kernel`): ``φ(q)``
block by block, ``o_i = φ(q_i) S / (φ(q_i) · m + eps)`` plus an optional residual (FLatten's
depthwise-conv term), written in the dtype of q. The mapped features live only in registers.

The pair is one custom op, ``mmeffvit::focused_linear_attention``, with a fake implementation
(shapes only: torch.compile and the kernel counter see one op and never launch anything).
"""
import torch
import triton
import triton.language as tl

from .focus import focus_backward_rows, focused_head

BLOCK_TOKENS = 64  # rows of a token block
BLOCK_C = 64  # columns per step of the row norms
TOKENS_PER_SPLIT = 256  # at least this many keys per partial state (pass 1's parallelism)
MAX_SPLITS = 128


def interpreting():
    """Whether Triton runs its CPU interpreter (``TRITON_INTERPRET=1``, Triton's own switch)."""
    return bool(triton.knobs.runtime.interpret)


def padded(size):
    """A power of two of at least 16 (``tl.dot``'s smallest operand side)."""
    return max(16, triton.next_power_of_2(size))


def integer_power(p):
    """``p`` as a small integer for repeated products, 0 where it is not one."""
    return int(p) if float(p).is_integer() and 1 <= p <= 8 else 0


def dot_setup(dtype):
    """The ``tl.dot`` operand dtype and precision for inputs of ``dtype``: 16-bit operands with
    fp32 accumulation for 16-bit inputs, fp32 ('ieee', or 'tf32' where torch allows TF32 for
    matmuls) for fp32. The interpreter's 16-bit dot is wrong, so there every operand is fp32."""
    if dtype == torch.float32 or interpreting():
        tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
        return tl.float32, 'tf32' if tf32 and not interpreting() else 'ieee'
    return (tl.bfloat16 if dtype == torch.bfloat16 else tl.float16), 'ieee'


def token_splits(n):
    """``(splits, tokens per split)`` of a pass that sums over ``n`` tokens in partial sums:
    one per ``TOKENS_PER_SPLIT`` tokens (at most ``MAX_SPLITS``), each a whole number of
    ``BLOCK_TOKENS`` blocks."""
    splits = max(1, min(MAX_SPLITS, triton.cdiv(n, TOKENS_PER_SPLIT)))
    per_split = triton.cdiv(triton.cdiv(n, splits), BLOCK_TOKENS) * BLOCK_TOKENS
    return triton.cdiv(n, per_split), per_split


def summed(parts):
    """The partial sums ``(programs, splits, width)`` summed over the splits (a view for one)."""
    return parts[:, 0] if parts.shape[1] == 1 else parts.sum(1)


@triton.jit
def head_columns(head, D: tl.constexpr, D_PAD: tl.constexpr):
    """One head's ``D`` columns of a token row (padded to ``D_PAD``) and their mask."""
    offs = tl.arange(0, D_PAD)
    return head * D + offs, offs < D


@triton.jit
def load_state(state_ptr, D_PAD: tl.constexpr, E_PAD: tl.constexpr):
    """The packed ``(D_PAD, E_PAD)`` state and ``D_PAD`` key sum at ``state_ptr``."""
    d = tl.arange(0, D_PAD)
    kv = tl.load(state_ptr + d[:, None] * E_PAD + tl.arange(0, E_PAD)[None, :])
    return kv, tl.load(state_ptr + D_PAD * E_PAD + d)


@triton.jit
def store_state(state_ptr, kv, ksum, D_PAD: tl.constexpr, E_PAD: tl.constexpr):
    """Packs a ``(D_PAD, E_PAD)`` state and a ``D_PAD`` key sum at ``state_ptr``."""
    d = tl.arange(0, D_PAD)
    tl.store(state_ptr + d[:, None] * E_PAD + tl.arange(0, E_PAD)[None, :], kv)
    tl.store(state_ptr + D_PAD * E_PAD + d, ksum)


@triton.jit
def _state_kernel(k_ptr, v_ptr, s_ptr, part_ptr, n, C, Ce, heads, tokens_per_split, inv_n,
                  focus_eps, p,
                  skb, skn, skc, svb, svn, svc,
                  P_INT: tl.constexpr, D: tl.constexpr, E: tl.constexpr,
                  D_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_C: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // heads
    head = pid_bh % heads
    k_ptr += b * skb
    v_ptr += b * svb
    d_cols, d_mask = head_columns(head, D, D_PAD)
    e_cols, e_mask = head_columns(head, E, E_PAD)
    kv = tl.zeros([D_PAD, E_PAD], dtype=tl.float32)
    ksum = tl.zeros([D_PAD], dtype=tl.float32)
    start = split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, n)
    for n0 in range(start, stop, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N)
        row_mask = rows < stop
        phi, _, _, _ = focused_head(k_ptr, skn, skc, rows, row_mask, C, d_cols, d_mask, s_ptr,
                                    focus_eps, p, P_INT, BLOCK_C)
        v = tl.load(v_ptr + rows[:, None] * svn + e_cols[None, :] * svc,
                    mask=row_mask[:, None] & e_mask[None, :], other=0.0)
        kv = tl.dot(tl.trans(phi.to(DOT_DTYPE)), v.to(DOT_DTYPE), kv, input_precision=PRECISION)
        ksum += tl.sum(phi, axis=0)
    # partial state of this split, already / n
    part_ptr += (pid_bh * tl.num_programs(1) + split) * (D_PAD * E_PAD + D_PAD)
    store_state(part_ptr, kv * inv_n, ksum * inv_n, D_PAD, E_PAD)


@triton.jit
def _apply_kernel(q_ptr, s_ptr, state_ptr, r_ptr, o_ptr, N, C, heads, focus_eps, eps, p,
                  sqb, sqn, sqc, srb, srn, src, sob, son, soc,
                  HAS_RESIDUAL: tl.constexpr, P_INT: tl.constexpr, D: tl.constexpr,
                  E: tl.constexpr, D_PAD: tl.constexpr, E_PAD: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, DOT_DTYPE: tl.constexpr,
                  PRECISION: tl.constexpr):
    pid_bh = tl.program_id(0)
    b = pid_bh // heads
    head = pid_bh % heads
    q_ptr += b * sqb
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < N
    d_cols, d_mask = head_columns(head, D, D_PAD)
    e_cols, e_mask = head_columns(head, E, E_PAD)
    kv, kmean = load_state(state_ptr + pid_bh * (D_PAD * E_PAD + D_PAD), D_PAD, E_PAD)
    phi, _, _, _ = focused_head(q_ptr, sqn, sqc, rows, row_mask, C, d_cols, d_mask, s_ptr,
                                focus_eps, p, P_INT, BLOCK_C)
    num = tl.dot(phi.to(DOT_DTYPE), kv.to(DOT_DTYPE), input_precision=PRECISION)
    den = tl.sum(phi * kmean[None, :], axis=1) + eps
    out = num / den[:, None]
    mask = row_mask[:, None] & e_mask[None, :]
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + b * srb + rows[:, None] * srn + e_cols[None, :] * src, mask=mask,
                    other=0.0)
        out += r.to(tl.float32)
    tl.store(o_ptr + b * sob + rows[:, None] * son + e_cols[None, :] * soc,
             out.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grad_query_kernel(q_ptr, s_ptr, state_ptr, g_ptr, dphi_ptr, part_ptr, N, C, heads,
                       tokens_per_split, focus_eps, eps, p,
                       sqb, sqn, sqc, sgb, sgn, sgc,
                       P_INT: tl.constexpr, D: tl.constexpr, E: tl.constexpr,
                       D_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_C: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """``dL/dφ(q)`` of one head (into the fp32 map ``dphi``) and this split's share of
    ``dL/dS`` and ``dL/dm``, recomputing ``φ(q)``, the numerator and the normaliser."""
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // heads
    head = pid_bh % heads
    q_ptr += b * sqb
    g_ptr += b * sgb
    dphi_ptr += b * N * C
    d_cols, d_mask = head_columns(head, D, D_PAD)
    e_cols, e_mask = head_columns(head, E, E_PAD)
    kv, kmean = load_state(state_ptr + pid_bh * (D_PAD * E_PAD + D_PAD), D_PAD, E_PAD)
    d_kv = tl.zeros([D_PAD, E_PAD], dtype=tl.float32)
    d_kmean = tl.zeros([D_PAD], dtype=tl.float32)
    start = split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, N)
    for m0 in range(start, stop, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_mask = rows < stop
        phi, _, _, _ = focused_head(q_ptr, sqn, sqc, rows, row_mask, C, d_cols, d_mask, s_ptr,
                                    focus_eps, p, P_INT, BLOCK_C)
        num = tl.dot(phi.to(DOT_DTYPE), kv.to(DOT_DTYPE), input_precision=PRECISION)
        den = tl.sum(phi * kmean[None, :], axis=1) + eps
        g = tl.load(g_ptr + rows[:, None] * sgn + e_cols[None, :] * sgc,
                    mask=row_mask[:, None] & e_mask[None, :], other=0.0).to(tl.float32)
        d_num = g / den[:, None]
        d_den = -tl.sum(d_num * num, axis=1) / den
        d_phi = tl.dot(d_num.to(DOT_DTYPE), tl.trans(kv.to(DOT_DTYPE)),
                       input_precision=PRECISION) + d_den[:, None] * kmean[None, :]
        tl.store(dphi_ptr + rows[:, None] * C + d_cols[None, :], d_phi,
                 mask=row_mask[:, None] & d_mask[None, :])
        d_kv = tl.dot(tl.trans(phi.to(DOT_DTYPE)), d_num.to(DOT_DTYPE), d_kv,
                      input_precision=PRECISION)
        d_kmean += tl.sum(d_den[:, None] * phi, axis=0)
    part_ptr += (pid_bh * tl.num_programs(1) + split) * (D_PAD * E_PAD + D_PAD)
    store_state(part_ptr, d_kv, d_kmean, D_PAD, E_PAD)


@triton.jit
def _grad_key_kernel(k_ptr, v_ptr, s_ptr, dstate_ptr, dphi_ptr, dv_ptr, n, C, heads, inv_n,
                     focus_eps, p,
                     skb, skn, skc, svb, svn, svc, sdb, sdn, sdc,
                     P_INT: tl.constexpr, D: tl.constexpr, E: tl.constexpr,
                     D_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_C: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """``dL/dφ(k)`` of one head (into the fp32 map ``dphi``) and ``dL/dv``: with
    ``S = Σ φ(k)^T v / n`` and ``m = Σ φ(k) / n``, ``dφ(k_j) = (v_j dS^T + dm) / n`` and
    ``dv_j = φ(k_j) dS / n``."""
    pid_bh = tl.program_id(0)
    b = pid_bh // heads
    head = pid_bh % heads
    k_ptr += b * skb
    v_ptr += b * svb
    dphi_ptr += b * n * C
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    d_cols, d_mask = head_columns(head, D, D_PAD)
    e_cols, e_mask = head_columns(head, E, E_PAD)
    d_kv, d_kmean = load_state(dstate_ptr + pid_bh * (D_PAD * E_PAD + D_PAD), D_PAD, E_PAD)
    d_kv, d_kmean = d_kv * inv_n, d_kmean * inv_n
    phi, _, _, _ = focused_head(k_ptr, skn, skc, rows, row_mask, C, d_cols, d_mask, s_ptr,
                                focus_eps, p, P_INT, BLOCK_C)
    ev_mask = row_mask[:, None] & e_mask[None, :]
    v = tl.load(v_ptr + rows[:, None] * svn + e_cols[None, :] * svc, mask=ev_mask, other=0.0)
    d_phi = tl.dot(v.to(DOT_DTYPE), tl.trans(d_kv.to(DOT_DTYPE)),
                   input_precision=PRECISION) + d_kmean[None, :]
    tl.store(dphi_ptr + rows[:, None] * C + d_cols[None, :], d_phi,
             mask=row_mask[:, None] & d_mask[None, :])
    dv = tl.dot(phi.to(DOT_DTYPE), d_kv.to(DOT_DTYPE), input_precision=PRECISION)
    tl.store(dv_ptr + b * sdb + rows[:, None] * sdn + e_cols[None, :] * sdc,
             dv.to(dv_ptr.dtype.element_ty), mask=ev_mask)


@triton.jit
def _focus_grad_kernel(x_ptr, s_ptr, dphi_ptr, dx_ptr, ds_ptr, N, C, focus_eps, p,
                       sxb, sxn, sxc, sdb, sdn, sdc,
                       P_INT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """``dL/dx`` of a block of whole rows from ``dL/dφ(x)``, and the block's share of ``dL/ds``
    (row ``block`` of ``ds``)."""
    b = tl.program_id(0)
    block = b * tl.num_programs(1) + tl.program_id(1)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    focus_backward_rows(x_ptr + b * sxb, sxn, sxc, dphi_ptr + b * N * C, C, 1,
                        dx_ptr + b * sdb, sdn, sdc, s_ptr, ds_ptr + block * C, rows, rows < N,
                        C, focus_eps, p, P_INT, BLOCK_C)


def state_layout(c, ce, heads):
    """``(D, E, D_PAD, E_PAD)``: a head's key and value widths and their padded sizes."""
    d, e = c // heads, ce // heads
    return d, e, padded(d), padded(e)


def launch_forward(q, k, v, scale, heads, focusing_factor, focus_eps, eps, residual=None):
    """Both passes; returns the output and the packed fp32 state ``(B·h, D_PAD·E_PAD + D_PAD)``
    (the backward's input)."""
    b, n_q, c = q.shape
    n, ce = k.shape[1], v.shape[2]
    d, e, d_pad, e_pad = state_layout(c, ce, heads)
    dot_dtype, precision = dot_setup(q.dtype)
    p_int = integer_power(focusing_factor)
    splits, per_split = token_splits(n)
    width = d_pad * e_pad + d_pad
    parts = torch.empty(b * heads, splits, width, device=q.device, dtype=torch.float32)
    scale = scale.reshape(-1)
    _state_kernel[(b * heads, splits)](
        k, v, scale, parts, n, c, ce, heads, per_split, 1.0 / n, focus_eps, focusing_factor,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        P_INT=p_int, D=d, E=e, D_PAD=d_pad, E_PAD=e_pad, BLOCK_N=BLOCK_TOKENS, BLOCK_C=BLOCK_C,
        DOT_DTYPE=dot_dtype, PRECISION=precision)
    state = summed(parts)
    out = torch.empty(b, n_q, ce, device=q.device, dtype=q.dtype)
    r = out if residual is None else residual
    _apply_kernel[(b * heads, triton.cdiv(n_q, BLOCK_TOKENS))](
        q, scale, state, r, out, n_q, c, heads, focus_eps, eps, focusing_factor,
        q.stride(0), q.stride(1), q.stride(2), r.stride(0), r.stride(1), r.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HAS_RESIDUAL=residual is not None, P_INT=p_int, D=d, E=e, D_PAD=d_pad, E_PAD=e_pad,
        BLOCK_M=BLOCK_TOKENS, BLOCK_C=BLOCK_C, DOT_DTYPE=dot_dtype, PRECISION=precision)
    return out, state


def launch_backward(grad, q, k, v, scale, state, heads, focusing_factor, focus_eps, eps):
    """``dq, dk, dv`` (in the inputs' dtypes) and ``dscale`` (fp32, C entries) of
    :func:`launch_forward`, recomputing the focused features from ``q`` and ``k``."""
    b, n_q, c = q.shape
    n, ce = k.shape[1], v.shape[2]
    d, e, d_pad, e_pad = state_layout(c, ce, heads)
    dot_dtype, precision = dot_setup(q.dtype)
    p_int = integer_power(focusing_factor)
    common = dict(P_INT=p_int, D=d, E=e, D_PAD=d_pad, E_PAD=e_pad, BLOCK_C=BLOCK_C,
                  DOT_DTYPE=dot_dtype, PRECISION=precision)
    scale = scale.reshape(-1)
    splits, per_split = token_splits(n_q)
    parts = torch.empty(b * heads, splits, d_pad * e_pad + d_pad, device=q.device,
                        dtype=torch.float32)
    dphi_q = torch.empty(b, n_q, c, device=q.device, dtype=torch.float32)
    _grad_query_kernel[(b * heads, splits)](
        q, scale, state, grad, dphi_q, parts, n_q, c, heads, per_split, focus_eps, eps,
        focusing_factor, q.stride(0), q.stride(1), q.stride(2),
        grad.stride(0), grad.stride(1), grad.stride(2), BLOCK_M=BLOCK_TOKENS, **common)
    dstate = summed(parts)
    dphi_k = torch.empty(b, n, c, device=q.device, dtype=torch.float32)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    _grad_key_kernel[(b * heads, triton.cdiv(n, BLOCK_TOKENS))](
        k, v, scale, dstate, dphi_k, dv, n, c, heads, 1.0 / n, focus_eps, focusing_factor,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2), BLOCK_N=BLOCK_TOKENS, **common)
    blocks_q, blocks_k = triton.cdiv(n_q, BLOCK_TOKENS), triton.cdiv(n, BLOCK_TOKENS)
    ds_parts = torch.empty(b * (blocks_q + blocks_k), c, device=q.device, dtype=torch.float32)
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    for x, dphi, dx, n_x, blocks, ds in ((q, dphi_q, dq, n_q, blocks_q, ds_parts[:b * blocks_q]),
                                         (k, dphi_k, dk, n, blocks_k, ds_parts[b * blocks_q:])):
        _focus_grad_kernel[(b, blocks)](
            x, scale, dphi, dx, ds, n_x, c, focus_eps, focusing_factor,
            x.stride(0), x.stride(1), x.stride(2), dx.stride(0), dx.stride(1), dx.stride(2),
            P_INT=p_int, BLOCK_M=BLOCK_TOKENS, BLOCK_C=BLOCK_C)
    return dq, dk, dv, ds_parts.sum(0)
