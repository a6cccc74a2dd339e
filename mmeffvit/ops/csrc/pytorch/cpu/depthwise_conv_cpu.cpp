// CPU weight gradient of a stride-1 depthwise convolution on channels-last (token) maps.
//
// Why: oneDNN's depthwise weight gradient is slow on a CPU for kernels of 5 and more, and the
// grouped-conv formulation (the map as input, the output gradient as a (C, 1, Ho, Wo) kernel)
// first copies both operands into dense NCHW-like layouts; this one pass is several times
// faster at FLatten's stage-1/2 sizes (docs/ops.md). For every output row
// and tap (i, j) the row of output gradients is multiplied with the shifted input row and
// accumulated into a (kh * kw, C) table that stays in L1; the channel loop is contiguous and
// vectorises. Rows are split in fixed chunks, each with its own table, summed in chunk order:
// the result does not depend on the number of threads or on which thread ran what.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "../depthwise_conv.h"
#include "cpu_clones.h"

namespace mmeffvit {
namespace {

constexpr int64_t kRowsPerChunk = 4;

// acc[c] += sum_x g[x, c] * v[x, c] over `cols` tokens (token strides sg, sv): channels in
// blocks held in registers across the tokens (cloned for AVX2 + FMA below, cpu_clones.h).
template <typename T>
inline void tap_sum(T* acc, const T* g, const T* v, int64_t cols, int64_t sg, int64_t sv,
                    int64_t C) {
  constexpr int64_t kBlock = 64 / sizeof(T) * 2;  // two cache lines of channels
  int64_t c0 = 0;
  for (; c0 + kBlock <= C; c0 += kBlock) {
    T a[kBlock] = {};
    for (int64_t x = 0; x < cols; ++x) {
      const T* gx = g + x * sg + c0;
      const T* vx = v + x * sv + c0;
#pragma omp simd
      for (int64_t c = 0; c < kBlock; ++c) a[c] += gx[c] * vx[c];
    }
#pragma omp simd
    for (int64_t c = 0; c < kBlock; ++c) acc[c0 + c] += a[c];
  }
  for (int64_t x = 0; x < cols; ++x)
    for (int64_t c = c0; c < C; ++c) acc[c] += g[x * sg + c] * v[x * sv + c];
}

MMEFFVIT_CPU_CLONES void tap_sum_cloned(float* acc, const float* g, const float* v, int64_t cols,
                                        int64_t sg, int64_t sv, int64_t C) {
  tap_sum(acc, g, v, cols, sg, sv, C);
}

MMEFFVIT_CPU_CLONES void tap_sum_cloned(double* acc, const double* g, const double* v,
                                        int64_t cols, int64_t sg, int64_t sv, int64_t C) {
  tap_sum(acc, g, v, cols, sg, sv, C);
}

template <typename scalar_t>
void weight_grad_kernel(const at::Tensor& input, const at::Tensor& grad, int64_t kh, int64_t kw,
                        int64_t ph, int64_t pw, scalar_t* out) {
  const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t Ho = grad.size(2), Wo = grad.size(3);
  const int64_t sib = input.stride(0), sit = input.stride(3);
  const int64_t sgb = grad.stride(0), sgt = grad.stride(3);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const scalar_t* gr = grad.const_data_ptr<scalar_t>();
  const int64_t K = kh * kw, rows = B * Ho;
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  std::vector<scalar_t> partial(static_cast<size_t>(chunks * K * C), scalar_t(0));
  // chunks taken from a shared counter: a descheduled thread's share goes to the others
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), chunks), 1, [&](int64_t, int64_t) {
    for (int64_t t; (t = next.fetch_add(1)) < chunks;) {
      scalar_t* table = partial.data() + t * K * C;
      const int64_t r1 = std::min(rows, (t + 1) * kRowsPerChunk);
      for (int64_t r = t * kRowsPerChunk; r < r1; ++r) {
        const int64_t b = r / Ho, y = r % Ho;
        const scalar_t* grow = gr + b * sgb + y * Wo * sgt;
        for (int64_t i = 0; i < kh; ++i) {
          const int64_t yy = y + i - ph;
          if (yy < 0 || yy >= H) continue;
          const scalar_t* irow = in + b * sib + yy * W * sit;
          for (int64_t j = 0; j < kw; ++j) {
            scalar_t* acc = table + (i * kw + j) * C;
            // output columns whose tap x + j - pw lies inside the map
            const int64_t x0 = std::max<int64_t>(0, pw - j);
            const int64_t x1 = std::min<int64_t>(Wo, W + pw - j);
            if (x1 > x0)
              tap_sum_cloned(acc, grow + x0 * sgt, irow + (x0 + j - pw) * sit, x1 - x0, sgt,
                             sit, C);
          }
        }
      }
    }
  });
  // (chunks, K, C) summed in chunk order, written as (C, 1, kh, kw)
  std::vector<scalar_t> total(static_cast<size_t>(K * C), scalar_t(0));
  for (int64_t t = 0; t < chunks; ++t) {
    const scalar_t* p = partial.data() + t * K * C;
#pragma omp simd
    for (int64_t e = 0; e < K * C; ++e) total[e] += p[e];
  }
  for (int64_t k = 0; k < K; ++k)
    for (int64_t c = 0; c < C; ++c) out[c * K + k] = total[k * C + c];
}

}  // namespace

at::Tensor depthwise_conv_weight_grad_cpu(const at::Tensor& input, const at::Tensor& grad,
                                          int64_t kh, int64_t kw, int64_t ph, int64_t pw) {
  auto out = at::empty({input.size(1), 1, kh, kw}, input.options());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "depthwise_conv_weight_grad", [&] {
    weight_grad_kernel<scalar_t>(input, grad, kh, kw, ph, pw, out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace mmeffvit
