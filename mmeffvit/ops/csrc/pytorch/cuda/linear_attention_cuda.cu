// CUDA implementations: the row-wise maths in the kernels of common/cuda, the (N x d) @ (d x e)
// products in cuBLAS through ATen (fp32 accumulation; reduced-precision inputs are upcast).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
// c10 stream headers, not ATen/cuda/CUDAContext.h: that one needs the cuSPARSE/cuBLAS headers,
// which a bare nvcc toolkit (the CI machine) does not ship
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "../linear_attention.h"
#include "cuda/linear_attention_cuda_kernel.cuh"

namespace mmeffvit {
namespace {

constexpr int kThreads = 256;  // 8 warps, one row each

int blocks_for(int64_t rows) {
  const int64_t per_block = kThreads / 32;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((rows + per_block - 1) / per_block,
                                                                  65535)));
}

at::Tensor inv_softplus(const at::Tensor& scale, at::ScalarType acc) {
  return at::softplus(scale.to(acc)).reciprocal().contiguous();
}

}  // namespace

at::Tensor focus_forward_cuda(const at::Tensor& x, const at::Tensor& scale, double p, double eps) {
  c10::cuda::CUDAGuard guard(x.device());
  const auto acc = at::toOpMathType(x.scalar_type());
  auto y = at::empty(x.sizes(), x.options().dtype(acc));
  const int64_t rows = x.size(0), C = x.size(1);
  if (rows == 0) return y;
  auto isp = inv_softplus(scale, acc);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "focus_fwd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    focus_forward_kernel<scalar_t, acc_t><<<blocks_for(rows), kThreads, 0, stream>>>(
        x.data_ptr<scalar_t>(), isp.data_ptr<acc_t>(), y.data_ptr<acc_t>(), rows, C, acc_t(p),
        acc_t(eps));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

std::vector<at::Tensor> focus_backward_cuda(const at::Tensor& gy, const at::Tensor& x,
                                            const at::Tensor& scale, double p, double eps) {
  c10::cuda::CUDAGuard guard(x.device());
  const auto acc = at::toOpMathType(x.scalar_type());
  const int64_t rows = x.size(0), C = x.size(1);
  auto gx = at::empty_like(x);
  auto gsp = at::zeros({C}, x.options().dtype(acc));
  auto isp = inv_softplus(scale, acc);
  if (rows > 0) {
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "focus_bwd_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const size_t smem = sizeof(acc_t) * (kThreads / 32) * C;
      TORCH_CHECK(smem <= 48 * 1024, "focus backward on CUDA supports C <= ",
                  48 * 1024 / (sizeof(acc_t) * (kThreads / 32)), " channels, got ", C);
      focus_backward_kernel<scalar_t, acc_t>
          <<<std::min(blocks_for(rows), 1024), kThreads, smem, stream>>>(
              gy.data_ptr<acc_t>(), x.data_ptr<scalar_t>(), isp.data_ptr<acc_t>(),
              gx.data_ptr<scalar_t>(), gsp.data_ptr<acc_t>(), rows, C, acc_t(p), acc_t(eps));
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // dL/dscale = dL/dsoftplus * (-1 / softplus) * sigmoid-like softplus'
  auto s = scale.to(acc);
  auto gscale = gsp * isp * at::sigmoid(s).masked_fill(s > 20, 1.0);
  return {gx, gscale.to(scale.scalar_type())};
}

std::vector<at::Tensor> linear_attention_forward_cuda(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, const at::Tensor& temp,
                                                      int64_t mode, double eps, double clamp_min) {
  c10::cuda::CUDAGuard guard(q.device());
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), e = v.size(3);
  const auto acc = at::toOpMathType(q.scalar_type());
  const double scale = mode == 0 ? 1.0 / static_cast<double>(n) : 1.0;
  auto kf = k.to(acc);
  auto kv = at::matmul(kf.transpose(-2, -1), v.to(acc)).mul_(scale).contiguous();
  auto ksum = kf.sum(-2).mul_(scale).contiguous();
  auto num = at::matmul(q.to(acc), kv).contiguous();  // (B, h, N, e)
  auto out = at::empty({B, N, H, e}, q.options()).permute({0, 2, 1, 3});
  auto tau = temp.defined() ? temp.to(acc).contiguous() : at::ones({H}, q.options().dtype(acc));
  const int64_t rows = B * H * N;
  if (rows > 0) {
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "la_fwd_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      attention_rows_forward_kernel<scalar_t, acc_t><<<blocks_for(rows), kThreads, 0, stream>>>(
          q.data_ptr<scalar_t>(), num.data_ptr<acc_t>(), ksum.data_ptr<acc_t>(),
          tau.data_ptr<acc_t>(), out.data_ptr<scalar_t>(), H, N, d, e, q.stride(0), q.stride(1),
          q.stride(2), out.stride(0), out.stride(1), out.stride(2), rows, static_cast<int>(mode),
          acc_t(eps), acc_t(clamp_min));
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {out, kv, ksum};
}

std::vector<at::Tensor> linear_attention_backward_cuda(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& kv, const at::Tensor& ksum, const at::Tensor& temp, int64_t mode, double eps,
    double clamp_min) {
  c10::cuda::CUDAGuard guard(q.device());
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), e = v.size(3);
  const auto acc = at::toOpMathType(q.scalar_type());
  const auto acc_opts = q.options().dtype(acc);
  auto gf = g.to(acc).contiguous();
  auto P = at::matmul(gf, kv.transpose(-2, -1)).contiguous();  // (B, h, N, d)
  auto gs = at::empty({B, H, N, e}, acc_opts);
  auto coef = at::empty({B, H, N}, acc_opts);
  auto sden = at::empty({B, H, N}, acc_opts);
  auto dq = at::empty({B, N, H, d}, q.options()).permute({0, 2, 1, 3});
  auto tau = temp.defined() ? temp.to(acc).contiguous() : at::ones({H}, acc_opts);
  const int64_t rows = B * H * N;
  if (rows > 0) {
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "la_bwd_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      attention_rows_backward_kernel<scalar_t, acc_t><<<blocks_for(rows), kThreads, 0, stream>>>(
          q.data_ptr<scalar_t>(), gf.data_ptr<acc_t>(), P.data_ptr<acc_t>(),
          ksum.data_ptr<acc_t>(), tau.data_ptr<acc_t>(), dq.data_ptr<scalar_t>(),
          gs.data_ptr<acc_t>(), coef.data_ptr<acc_t>(), sden.data_ptr<acc_t>(), H, N, d, e,
          q.stride(0), q.stride(1), q.stride(2), dq.stride(0), dq.stride(1), dq.stride(2), rows,
          static_cast<int>(mode), acc_t(eps), acc_t(clamp_min));
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    coef.zero_();
    sden.zero_();
    gs.zero_();
  }
  const double scale = mode == 0 ? 1.0 / static_cast<double>(n) : 1.0;
  auto qf = q.to(acc);
  auto dkv = at::matmul(qf.transpose(-2, -1), gs).mul_(scale);           // (B, h, d, e)
  auto dm = at::matmul(coef.unsqueeze(-2), qf).mul_(scale);               // (B, h, 1, d)
  auto dk = at::matmul(v.to(acc), dkv.transpose(-2, -1)).add_(dm).to(k.scalar_type());
  auto dv = at::matmul(k.to(acc), dkv).to(v.scalar_type());
  at::Tensor dtemp;
  if (temp.defined()) dtemp = sden.sum(at::IntArrayRef{0, 2}).to(temp.scalar_type());
  return {dq, dk, dv, dtemp};
}

}  // namespace mmeffvit
