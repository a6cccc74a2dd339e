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

// device-independent entry point (argument checks, then dispatch)
at::Tensor window_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const c10::optional<at::Tensor>& mask, double scale);

}  // namespace mmeffvit
