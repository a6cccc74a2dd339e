// Shared machinery of the CPU linear-attention kernels (linear_attention_cpu.cpp): the focusing
// function and its backward per row, the two row layouts (`Rows`), blocks of rows loaded into
// fp32 scratch, and the parallel loops over row blocks with their per-thread partial sums.
// Included by that one file only.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu_blas.h"

namespace mmeffvit {
namespace linear_attention_cpu {

using cpu::gemm_rm;

constexpr int64_t kRowBlock = 256;  // rows per block: three (256 x 64) fp32 buffers fit L2

template <typename acc_t>
inline acc_t softplus(acc_t s) {  // torch's default: beta 1, threshold 20
  return s > acc_t(20) ? s : std::log1p(std::exp(s));
}

template <typename acc_t>
inline acc_t softplus_grad(acc_t s) {  // d softplus / ds = sigmoid(s), 1 above the threshold
  return s > acc_t(20) ? acc_t(1) : acc_t(1) / (acc_t(1) + std::exp(-s));
}

template <typename acc_t>
inline acc_t power(acc_t t, double p) {  // t > 0 always (ReLU + eps)
  if (p == 3.0) return t * t * t;
  if (p == 2.0) return t * t;
  if (p == 1.0) return t;
  return std::pow(t, acc_t(p));
}

// Focusing function parameters: 1 / softplus(scale) per channel, the power and the ReLU eps.
template <typename acc_t>
struct Focus {
  std::vector<acc_t> inv_sp, sp_grad;
  double p = 3.0, eps = 1e-6;
  bool on = false;
  Focus() = default;
  Focus(const at::Tensor& scale, double p_, double eps_) : p(p_), eps(eps_), on(true) {
    const at::Tensor s = scale.to(std::is_same_v<acc_t, double> ? at::kDouble : at::kFloat).contiguous();
    const acc_t* sp = s.data_ptr<acc_t>();
    for (int64_t c = 0; c < s.numel(); ++c) {
      inv_sp.push_back(acc_t(1) / softplus(sp[c]));
      sp_grad.push_back(softplus_grad(sp[c]));
    }
  }
};

// t^p and p t^(p-1); the cube (every released FLatten model) is spelt out so loops vectorise
template <bool kCube, typename acc_t>
inline acc_t pow_p(acc_t t, double p) {
  if constexpr (kCube) return t * t * t;
  else return power(t, p);
}

template <bool kCube, typename acc_t>
inline acc_t dpow_p(acc_t t, double p) {
  if constexpr (kCube) return acc_t(3) * t * t;
  else return acc_t(p) * power(t, p - 1.0);
}

// Loops with sums carry `omp simd reduction`: without it the compiler keeps float sums in order
// and the row loops run scalar (measured 2x slower focusing).
template <bool kCube, typename scalar_t, typename acc_t>
inline void focus_row_impl(const scalar_t* x, int64_t C, const Focus<acc_t>& f, acc_t* y) {
  acc_t n1 = 0, n2 = 0;
  const acc_t eps = acc_t(f.eps);
  const acc_t* isp = f.inv_sp.data();
#pragma omp simd reduction(+ : n1, n2)
  for (int64_t c = 0; c < C; ++c) {
    const acc_t xv = static_cast<acc_t>(x[c]);
    const acc_t t = ((xv > acc_t(0) ? xv : acc_t(0)) + eps) * isp[c];
    const acc_t u = pow_p<kCube>(t, f.p);
    n1 += t * t;
    n2 += u * u;
    y[c] = u;  // the output row doubles as scratch for t**p
  }
  const acc_t ratio = std::sqrt(n1 / n2);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] *= ratio;
}

// y = f_p(t), t = (relu(x) + eps) / softplus(s), f_p(t) = |t| t^p / |t^p| (FLatten eq. 5-6)
template <typename scalar_t, typename acc_t>
inline void focus_row(const scalar_t* x, int64_t C, const Focus<acc_t>& f, acc_t* y) {
  if (f.p == 3.0) {
    focus_row_impl<true>(x, C, f, y);
  } else {
    focus_row_impl<false>(x, C, f, y);
  }
}

template <bool kCube, typename scalar_t, typename acc_t>
inline void focus_row_backward_impl(const scalar_t* x, const acc_t* gy, int64_t C,
                                    const Focus<acc_t>& f, scalar_t* gx, acc_t* part) {
  acc_t n1 = 0, n2 = 0, S = 0;
  const acc_t eps = acc_t(f.eps);
  const acc_t* isp = f.inv_sp.data();
#pragma omp simd reduction(+ : n1, n2, S)
  for (int64_t c = 0; c < C; ++c) {
    const acc_t xv = static_cast<acc_t>(x[c]);
    const acc_t t = ((xv > acc_t(0) ? xv : acc_t(0)) + eps) * isp[c];
    const acc_t u = pow_p<kCube>(t, f.p);
    n1 += t * t;
    n2 += u * u;
    S += gy[c] * u;
  }
  const acc_t l1 = std::sqrt(n1), l2 = std::sqrt(n2);
  const acc_t ratio = l1 / l2, cu = ratio * S / n2, ct = S / (l1 * l2);
  // the ReLU's gate as a factor of the clamped value: GCC 12 keeps a loop with
  // `xv > 0 ? dt : 0` scalar ("control flow in loop"), and this row loop was the largest part
  // of the FLatten backward
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const acc_t xv = static_cast<acc_t>(x[c]);
    const acc_t pos = xv > acc_t(0) ? xv : acc_t(0);
    const acc_t gate = pos > acc_t(0) ? acc_t(1) : acc_t(0);
    const acc_t t = (pos + eps) * isp[c];
    const acc_t u = pow_p<kCube>(t, f.p);
    const acc_t dt = (ratio * gy[c] - cu * u) * dpow_p<kCube>(t, f.p) + ct * t;
    gx[c] = static_cast<scalar_t>(dt * isp[c] * gate);
    part[c] -= dt * t;
  }
}

// dL/dx of one row given dL/dy (gy); adds -sum(dt * t) per channel to `part` (finished into
// dL/dscale by the caller). y = u |t| / |u|: dL/du = r g - r S u / |u|^2, dL/dt += S t / (|t||u|)
template <typename scalar_t, typename acc_t>
inline void focus_row_backward(const scalar_t* x, const acc_t* gy, int64_t C,
                               const Focus<acc_t>& f, scalar_t* gx, acc_t* part) {
  if (f.p == 3.0) {
    focus_row_backward_impl<true>(x, gy, C, f, gx, part);
  } else {
    focus_row_backward_impl<false>(x, gy, C, f, gx, part);
  }
}

// Row r of batch b: base + (b / H) * sb + (b % H) * sh + r * sr, unit stride inside a row.
template <typename T>
struct Rows {
  T* base;
  int64_t sb, sh, sr, H;
  T* at(int64_t b, int64_t r) const { return base + (b / H) * sb + (b % H) * sh + r * sr; }
};

template <typename T>
Rows<T> head_rows(const at::Tensor& t) {  // (B, h, L, f): a batch is one (b, head)
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2), t.size(1)};
}

template <typename T>
Rows<T> token_rows(const at::Tensor& t) {  // (B, L, h*f): a batch is one b
  return {t.data_ptr<T>(), t.stride(0), 0, t.stride(1), 1};
}

// The problem: nb batches of N query rows and n key rows, `hin` heads side by side in a row,
// head dims d (q, k) and e (v). Temperature of head hh in batch b: temp[(b % tH) * hin + hh].
struct Shape {
  int64_t nb, N, n, hin, d, e, tH;
  int64_t mode;  // 0: mean-normalised (FLatten), 1: clamped sum (L2ViT)
  double eps, clamp_min;
};

template <typename acc_t>
inline acc_t denominator(acc_t qm, const Shape& s, bool* pass) {
  if (s.mode == 0) {
    *pass = true;
    return qm + acc_t(s.eps);
  }
  *pass = qm >= acc_t(s.clamp_min);  // torch.clamp passes the gradient where x >= min
  return *pass ? qm : acc_t(s.clamp_min);
}

// rows [r0, r0 + len) of batch b, mapped (focus) or converted, into a (len x C) buffer
template <typename scalar_t, typename acc_t>
void load_block(const Rows<scalar_t>& t, int64_t b, int64_t r0, int64_t len, int64_t C,
                const Focus<acc_t>* f, acc_t* dst) {
  for (int64_t i = 0; i < len; ++i) {
    const scalar_t* src = t.at(b, r0 + i);
    if (f != nullptr && f->on) {
      focus_row(src, C, *f, dst + i * C);
    } else {
      for (int64_t c = 0; c < C; ++c) dst[i * C + c] = static_cast<acc_t>(src[c]);
    }
  }
}

// Runs f(t0, t1, chunk) over [0, n) in fixed chunks taken from a shared counter: under a loaded
// machine a descheduled thread's share is taken over by the others (a static split waits for
// it; measured 2-3x slower on 2 shared cores). Partial sums are kept per chunk, not per thread,
// so results do not depend on which thread ran what (deterministic for a given thread count).
inline int64_t chunk_size(int64_t n) {
  return std::max<int64_t>(1, n / (8 * static_cast<int64_t>(at::get_num_threads())));
}

inline int64_t num_chunks(int64_t n) { return (n + chunk_size(n) - 1) / chunk_size(n); }

template <typename F>
void dynamic_for(int64_t n, const F& f) {
  const int64_t chunk = chunk_size(n);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_chunks(n)), 1,
                   [&](int64_t, int64_t) {
                     for (;;) {
                       const int64_t t0 = next.fetch_add(chunk);
                       if (t0 >= n) break;
                       f(t0, std::min(n, t0 + chunk), t0 / chunk);
                     }
                   });
}

// Parallel over batches when there are enough (each batch reduced by one chunk into its own
// state), else over row blocks with one slot of partial state per chunk.
inline bool needs_partials(int64_t nb, int64_t rows) {
  return nb < at::get_num_threads() && rows > kRowBlock;
}

inline int64_t num_blocks(int64_t rows) {
  return std::max<int64_t>(1, (rows + kRowBlock - 1) / kRowBlock);
}

// number of chunks (slots) for_blocks uses
inline int64_t block_chunks(int64_t nb, int64_t rows) {
  return num_chunks(needs_partials(nb, rows) ? nb * num_blocks(rows) : nb);
}

// Runs body(b, r0, len, slot) over every row block of every batch; slot is the chunk index.
template <typename F>
void for_blocks(int64_t nb, int64_t rows, F body) {
  const int64_t nblk = num_blocks(rows);
  if (!needs_partials(nb, rows)) {
    dynamic_for(nb, [&](int64_t b0, int64_t b1, int64_t slot) {
      for (int64_t b = b0; b < b1; ++b)
        for (int64_t k = 0; k < nblk; ++k) {
          const int64_t r0 = k * kRowBlock;
          body(b, r0, std::min(rows, r0 + kRowBlock) - r0, slot);
        }
    });
  } else {
    dynamic_for(nb * nblk, [&](int64_t t0, int64_t t1, int64_t slot) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / nblk, r0 = (t % nblk) * kRowBlock;
        body(b, r0, std::min(rows, r0 + kRowBlock) - r0, slot);
      }
    });
  }
}

// fp32/fp64 scratch as a torch tensor, so that memory profilers see it like any allocation
template <typename acc_t>
at::Tensor scratch(int64_t numel) {
  return at::zeros({numel}, at::TensorOptions().dtype(std::is_same_v<acc_t, double>
                                                          ? at::kDouble : at::kFloat));
}

}  // namespace linear_attention_cpu
}  // namespace mmeffvit
