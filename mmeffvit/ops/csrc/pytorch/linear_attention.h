// Declarations shared by the device-independent entry points and the CPU / CUDA implementations.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace mmeffvit {

// focus: x (R, C) contiguous, scale (C). Output (R, C) in the opmath dtype of x.
at::Tensor focus_forward_cpu(const at::Tensor& x, const at::Tensor& scale, double p, double eps);
std::vector<at::Tensor> focus_backward_cpu(const at::Tensor& gy, const at::Tensor& x,
                                           const at::Tensor& scale, double p, double eps);
// linear attention: q (B, h, N, d), k (B, h, n, d), v (B, h, n, e), unit stride in the last dim;
// temp (h) or undefined; mode 0 = mean-normalised (FLatten), 1 = clamped sum (L2ViT).
// Forward returns {out, KV state (B, h, d, e), key sum (B, h, d)}, the state in opmath dtype.
std::vector<at::Tensor> linear_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& temp,
                                                     int64_t mode, double eps, double clamp_min);
std::vector<at::Tensor> linear_attention_backward_cpu(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& kv, const at::Tensor& ksum, const at::Tensor& temp, int64_t mode, double eps,
    double clamp_min);
// focusing function and linear attention fused (FLatten): q (B, N, C), k (B, n, C), v (B, n, Ce)
// raw projections with unit stride in the last dim, scale (C). Forward returns {out (B, N, Ce),
// KV state (B, h, d, e), key mean (B, h, d)}; backward {dq, dk, dv, dscale}. CPU only: on CUDA
// the Python side composes the two CUDA operators.
std::vector<at::Tensor> focused_linear_attention_forward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& scale,
    int64_t heads, double p, double focus_eps, double eps);
std::vector<at::Tensor> focused_linear_attention_backward_cpu(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& scale, const at::Tensor& kv, const at::Tensor& ksum, int64_t heads, double p,
    double focus_eps, double eps);
// the same gradients written into dq, dk, dv (unit stride in the last dim, any row stride);
// returns dscale. Each may be the tensor it is the gradient of (q, k, v): every row is read
// before its gradient row is written, so the gradients can overwrite saved projections.
at::Tensor focused_linear_attention_backward_into_cpu(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& scale, const at::Tensor& kv, const at::Tensor& ksum, int64_t heads, double p,
    double focus_eps, double eps, const at::Tensor& dq, const at::Tensor& dk,
    const at::Tensor& dv);

#ifdef WITH_CUDA
at::Tensor focus_forward_cuda(const at::Tensor& x, const at::Tensor& scale, double p, double eps);
std::vector<at::Tensor> focus_backward_cuda(const at::Tensor& gy, const at::Tensor& x,
                                            const at::Tensor& scale, double p, double eps);
std::vector<at::Tensor> linear_attention_forward_cuda(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, const at::Tensor& temp,
                                                      int64_t mode, double eps, double clamp_min);
std::vector<at::Tensor> linear_attention_backward_cuda(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& kv, const at::Tensor& ksum, const at::Tensor& temp, int64_t mode, double eps,
    double clamp_min);
#endif

// device-independent entry points (argument checks, then dispatch on the device)
at::Tensor focus_forward(const at::Tensor& x, const at::Tensor& scale, double p, double eps);
std::vector<at::Tensor> focus_backward(const at::Tensor& gy, const at::Tensor& x,
                                       const at::Tensor& scale, double p, double eps);
std::vector<at::Tensor> linear_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v,
                                                 const c10::optional<at::Tensor>& temp,
                                                 int64_t mode, double eps, double clamp_min);
std::vector<at::Tensor> linear_attention_backward(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& kv, const at::Tensor& ksum, const c10::optional<at::Tensor>& temp,
    int64_t mode, double eps, double clamp_min);
std::vector<at::Tensor> focused_linear_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v,
                                                         const at::Tensor& scale, int64_t heads,
                                                         double p, double focus_eps, double eps);
std::vector<at::Tensor> focused_linear_attention_backward(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& scale, const at::Tensor& kv, const at::Tensor& ksum, int64_t heads, double p,
    double focus_eps, double eps);
at::Tensor focused_linear_attention_backward_into(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& scale, const at::Tensor& kv, const at::Tensor& ksum, int64_t heads, double p,
    double focus_eps, double eps, const at::Tensor& dq, const at::Tensor& dk,
    const at::Tensor& dv);
bool compiled_with_cuda();

}  // namespace mmeffvit
