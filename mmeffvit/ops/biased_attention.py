"""Softmax attention with an additive bias that is trained, whose backward recomputes the
probabilities instead of storing them: the training path of Swin's window attention with its
relative position bias (Swin, sec. 3.2) and of Focal attention's gathered windows.

torch's fused CPU attention does not run when the mask needs a gradient, and its composite
path stores the probabilities (a map as large as the scores) for backward.
:class:`_RecomputedBiasAttention` runs the fused forward and keeps q, k, v, the output and the
two small mask terms; :func:`attention_backward` rebuilds the probabilities of one block.
"""
import math

import torch
import torch.nn.functional as F

from .policy import compiling


def _sum_to(grad, shape):
    """Sum ``grad`` over the dimensions that ``shape`` broadcast (size 1 there)."""
    dims = [i for i, (g, n) in enumerate(zip(grad.shape, shape)) if n == 1 and g != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


def _terms_into(workspace, bias, mask, shape):
    """``bias + mask`` (mask may be None) broadcast to ``shape``, written into the workspace's
    ``'scores'`` buffer."""
    dtype = bias.dtype if mask is None else torch.promote_types(bias.dtype, mask.dtype)
    out = workspace.get('scores', shape, dtype, bias.device)
    return out.copy_(bias.expand(shape)) if mask is None else torch.add(bias, mask, out=out)


def _sdpa_with_terms(q, k, v, bias, mask, scale, dropout_p=0., workspace=None):
    """``F.scaled_dot_product_attention`` with the additive mask ``bias + mask`` (either None;
    their sum written into the buffer of a :class:`Workspace` when given)."""
    if bias is not None and mask is not None and workspace is not None:
        full = _terms_into(workspace, bias, mask, torch.broadcast_shapes(bias.shape, mask.shape))
    else:
        full = mask if bias is None else (bias if mask is None else bias + mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=full, dropout_p=dropout_p,
                                          scale=scale)


class _RecomputedBiasAttention(torch.autograd.Function):
    """``softmax(q·kᵀ·scale + bias + mask)·v`` whose backward recomputes the probabilities.

    With a bias that needs a gradient, torch's fused CPU attention is not used and its
    composite path stores the scores' probabilities (and the summed mask) for backward, a
    tensor as large as the scores per block. Here the forward runs the fused kernel and only
    q, k, v, the output and the two small mask terms are kept; the backward rebuilds the
    probabilities of this one block (the standard softmax-attention gradients) and returns
    the bias gradient summed over the windows it was broadcast to.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale):
        # detached: torch picks its composite kernel for a mask that requires a gradient,
        # even with autograd off (the bias gradient is this function's own)
        out = _sdpa_with_terms(q, k, v, bias.detach(), mask, scale)
        ctx.save_for_backward(q, k, v, bias, mask, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out = ctx.saved_tensors
        grads = attention_backward(q, k, v, bias, mask, out, grad_out, ctx.scale,
                                   ctx.needs_input_grad[3])
        return grads + (None, None)


def attention_backward(q, k, v, bias, mask, out, grad_out, scale, bias_grad=True,
                       workspace=None):
    """Gradients of ``out = softmax(q·kᵀ·scale + bias + mask)·v`` for q, k, v and ``bias``
    (summed to its broadcast shape; None unless ``bias_grad``), the probabilities recomputed.

    ``q (…, n, d)``, ``k (…, N, d)``, ``v (…, N, e)`` share their leading dimensions; ``bias``
    and ``mask`` (None allowed) broadcast to ``(…, n, N)``. With a :class:`Workspace` (no
    autograd) the scores and their gradient, and the gradients of k and v (which the caller
    must consume before the workspace's next use), are written into its buffers.
    """
    lead, n, big_n = q.shape[:-2], q.shape[-2], k.shape[-2]
    # batched 3-D GEMMs on (B'·h, n|N, d): the additive terms are written once and the scaled
    # q·kᵀ accumulated into them in place (baddbmm), one pass over the scores where matmul,
    # scale and the two additions took four
    full = lead + (n, big_n)
    if workspace is not None:
        add = _terms_into(workspace, bias, mask, full)
    elif mask is None:  # a fresh tensor: the bias itself must stay as it is
        add = bias.expand(full).clone(memory_format=torch.contiguous_format)
    else:
        add = bias + mask
        if add.shape != full or not add.is_contiguous():
            add = add.expand(full).contiguous()
    q3, k3 = q.reshape(-1, n, q.shape[-1]), k.reshape(-1, big_n, k.shape[-1])
    scores = add.view(-1, n, big_n).baddbmm_(q3, k3.transpose(1, 2), alpha=scale)
    if scores.dtype in (torch.float16, torch.bfloat16):  # softmax in fp32, as autocast
        probs = scores.float().softmax(-1).to(scores.dtype)
    elif torch.is_grad_enabled():  # double backward: out= is not differentiable
        probs = scores.softmax(-1)
    else:  # in place: one fresh (…, n, N) map fewer (each costs its page faults on the CPU)
        probs = torch.softmax(scores, -1, out=scores)
    del scores, add
    go3, v3 = grad_out.reshape(-1, n, v.shape[-1]), v.reshape(-1, big_n, v.shape[-1])

    def buffer(name, shape):  # None: a fresh tensor
        return None if workspace is None else workspace.get(name, shape, q.dtype, q.device)

    grad_v = torch.bmm(probs.transpose(1, 2), go3, out=buffer('grad_v', v3.shape))
    # dL/dscores = P ∘ (dO·vᵀ - rowsum(dO ∘ O)): the row term enters as the GEMM's input
    row = (go3 * out.reshape(go3.shape)).sum(-1, keepdim=True)
    grad_s = probs.mul_(torch.baddbmm(row, go3, v3.transpose(1, 2), beta=-1,
                                      out=buffer('grad_scores', probs.shape)))
    grad_q = torch.bmm(grad_s, k3).mul_(scale)
    grad_k = torch.bmm(grad_s.transpose(1, 2), q3, out=buffer('grad_k', k3.shape)).mul_(scale)
    grad_bias = None
    if bias_grad:
        grad_bias = _sum_to(grad_s.view(full), bias.shape)
        if workspace is not None and grad_bias.data_ptr() == grad_s.data_ptr():
            grad_bias = grad_bias.clone()  # not broadcast: returned, so not the buffer
    return grad_q.view(q.shape), grad_k.view(k.shape), grad_v.view(v.shape), grad_bias


class Workspace:
    """Named flat buffers, each grown to the largest request and handed out as views.

    On the CPU every large tensor allocated anew is faulted in page by page on its first write
    (glibc maps blocks this large anew and unmaps them when freed), which made an
    ``index_select`` into a new tensor four times slower than into a written one
    (``docs/ops.md``). Blocks that run one after another reuse one set of buffers instead.
    """

    def __init__(self):
        self.buffers = {}
        self.calls = 0  # attention calls of the forward that made it (see _GatheredKeysAttention)

    def get(self, name, shape, dtype, device):
        numel = math.prod(shape)
        key = (name, dtype, device)
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < numel:
            self.buffers.pop(key, None)  # free the smaller one first
            buf = self.buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return buf[:numel].view(shape)

    def clear(self):
        self.buffers.clear()


def biased_attention(q, k, v, bias, mask=None, scale=None, dropout_p=0.):
    """``F.scaled_dot_product_attention`` with the additive mask ``bias + mask``.

    ``bias`` (e.g. a relative position bias, ``(1|B', h, n, N)``) may need a gradient;
    ``mask`` (``(B'|1, 1|h, n|1, N)``, no gradient) may be None. When autograd records through
    ``bias`` on a CPU without dropout, :class:`_RecomputedBiasAttention` keeps the fused kernel
    and stores no probabilities; otherwise torch's own dispatch runs on the summed mask.
    """
    if (bias is not None and bias.requires_grad and torch.is_grad_enabled()
            and q.device.type == 'cpu' and not dropout_p and not compiling()):
        if scale is None:
            scale = q.shape[-1] ** -0.5
        return _RecomputedBiasAttention.apply(q, k, v, bias, mask, scale)
    return _sdpa_with_terms(q, k, v, bias, mask, scale, dropout_p)
