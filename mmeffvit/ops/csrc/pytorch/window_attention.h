// Declarations of the window attention operator (CPU inference).
#pragma once
#include <ATen/ATen.h>

namespace mmeffvit {

// softmax(q·kᵀ·scale + mask)·v per (window, head), heads merged: q, k, v (BW, h, n, d) float32
// with unit stride in the last dim (any other strides, so views of a fused qkv projection are
// read in place); mask (BW, h, n, n) with unit stride in the last dim, broadcast strides (0)
// allowed, or undefined. Returns (BW, n, h·d) contiguous. No autograd: inference only.
at::Tensor window_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& mask,
                                        double scale);

// The same with each window's keys and values read from a bank through an index (Focal
// attention): q (B·nW, h, nq, d) as above; bank (B, M, 2, C) contiguous, C = h·d, keys at
// [.., 0, ..] and values at [.., 1, ..]; index (nW, nk) int64 rows of the bank; bias (h, nq, nk)
// with unit stride in the last dim, added to every window's scores, or undefined; key_mask
// (nW, nk) likewise, added to every query row of window w. Returns (B·nW, nq, h·d).
at::Tensor gathered_window_attention_forward_cpu(const at::Tensor& q, const at::Tensor& bank,
                                                 const at::Tensor& index, const at::Tensor& bias,
                                                 const at::Tensor& key_mask, double scale);

// device-independent entry points (argument checks, then dispatch)
at::Tensor gathered_window_attention_forward(const at::Tensor& q, const at::Tensor& bank,
                                             const at::Tensor& index,
                                             const c10::optional<at::Tensor>& bias,
                                             const c10::optional<at::Tensor>& key_mask,
                                             double scale);
at::Tensor window_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const c10::optional<at::Tensor>& mask, double scale);

}  // namespace mmeffvit
