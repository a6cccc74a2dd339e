// Declarations of the depthwise convolution operators (CPU).
#pragma once
#include <ATen/ATen.h>

namespace mmeffvit {

// Weight gradient of a stride-1 depthwise conv on channels-last maps:
// dw[c, 0, i, j] = sum_{b, y, x} grad[b, c, y, x] * input[b, c, y + i - ph, x + j - pw]
// (zero outside the map). input (B, C, H, W) and grad (B, C, Ho, Wo) with unit channel stride
// and rows of tokens (stride(2) == W * stride(3)); any token and batch stride, so token views
// such as the v slice of a fused qkv projection are read in place. Returns (C, 1, kh, kw).
at::Tensor depthwise_conv_weight_grad_cpu(const at::Tensor& input, const at::Tensor& grad,
                                          int64_t kh, int64_t kw, int64_t ph, int64_t pw);

// Inference of gelu(depthwise_conv3x3(x) + bias) (stride 1, zero padding 1, exact GELU) on
// float32 tokens x (B, H*W, C) (contiguous), weight (C, 1, 3, 3), bias (C) or undefined;
// returns contiguous (B, H*W, C). `vectorized` false forces the plain loops (tests).
at::Tensor depthwise_conv3x3_gelu_cpu(const at::Tensor& x, const at::Tensor& weight,
                                      const at::Tensor& bias, int64_t H, int64_t W,
                                      bool vectorized);

// device-independent entry points (argument checks, then dispatch)
at::Tensor depthwise_conv_weight_grad(const at::Tensor& input, const at::Tensor& grad,
                                      int64_t kh, int64_t kw, int64_t ph, int64_t pw);
at::Tensor depthwise_conv3x3_gelu(const at::Tensor& x, const at::Tensor& weight,
                                  const c10::optional<at::Tensor>& bias, int64_t H, int64_t W,
                                  bool vectorized);

}  // namespace mmeffvit
