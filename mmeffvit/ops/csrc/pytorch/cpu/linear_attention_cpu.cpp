// CPU kernels of the focusing function and of kv-first linear attention (plain and fused).
//
// Design (why): the composite PyTorch chain writes ~15 full-size tensors; here every full-size
// quantity is an input, the output or a gradient. Tokens are processed in blocks of kRowBlock
// rows: a block is mapped (focusing function or a dtype conversion) into a small fp32 buffer
// that stays in cache, then multiplied with the (d x e) state by BLAS. The state reductions are
// split over batches when there are enough of them (no partial sums at all) and otherwise over
// row blocks with per-thread partial sums added at the end (deterministic for a fixed thread
// count). The focusing backward recomputes the per-row norms instead of storing them.
//
// One core serves two layouts through `Rows`: the per-head layout (B, h, L, f) of
// `linear_attention` (a "batch" is one (b, head), one head per row) and the token layout
// (B, L, h*f) of `focused_linear_attention`, whose rows hold all heads, as the focusing norms
// need.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <vector>

#include "../linear_attention.h"
#include "cpu_blas.h"

namespace mmeffvit {
namespace {

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

// Forward. kv (nb, hin, d, e) and ks (nb, hin, d) receive the (scaled) state and key sum.
template <typename scalar_t, typename acc_t>
void forward_core(const Shape& s, const Rows<scalar_t>& q, const Rows<scalar_t>& k,
                  const Rows<scalar_t>& v, const Rows<scalar_t>& out, const Focus<acc_t>& f,
                  const acc_t* temp, acc_t* kv, acc_t* ks) {
  const int64_t C = s.hin * s.d, Ce = s.hin * s.e, SE = s.hin * s.d * s.e, W = SE + C;
  const bool used = needs_partials(s.nb, s.n);
  const int64_t slots = used ? block_chunks(s.nb, s.n) : 0;
  at::Tensor partial_t = scratch<acc_t>(slots * s.nb * W);  // [KV | key sum] per batch
  acc_t* partial = partial_t.data_ptr<acc_t>();
  std::fill(kv, kv + s.nb * SE, acc_t(0));
  std::fill(ks, ks + s.nb * C, acc_t(0));
  for_blocks(s.nb, s.n, [&](int64_t b, int64_t r0, int64_t len, int64_t slot) {
    thread_local std::vector<acc_t> kb, vb;
    kb.resize(len * C);
    vb.resize(len * Ce);
    load_block(k, b, r0, len, C, &f, kb.data());
    load_block<scalar_t, acc_t>(v, b, r0, len, Ce, nullptr, vb.data());
    acc_t* st = used ? partial + (slot * s.nb + b) * W : kv + b * SE;
    acc_t* sum = used ? st + SE : ks + b * C;
    for (int64_t hh = 0; hh < s.hin; ++hh)
      gemm_rm<acc_t>(true, false, s.d, s.e, len, 1, kb.data() + hh * s.d, C,
                     vb.data() + hh * s.e, Ce, 1, st + hh * s.d * s.e, s.e);
    for (int64_t i = 0; i < len; ++i)
      for (int64_t c = 0; c < C; ++c) sum[c] += kb[i * C + c];
  });
  for (int64_t t = 0; t < slots; ++t)
      for (int64_t b = 0; b < s.nb; ++b) {
        const acc_t* p = partial + (t * s.nb + b) * W;
        for (int64_t j = 0; j < SE; ++j) kv[b * SE + j] += p[j];
        for (int64_t j = 0; j < C; ++j) ks[b * C + j] += p[SE + j];
      }
  if (s.mode == 0) {  // mean-normalised: K^T V / n and mean(K)
    const acc_t scale = acc_t(1) / acc_t(s.n);
    for (int64_t j = 0; j < s.nb * SE; ++j) kv[j] *= scale;
    for (int64_t j = 0; j < s.nb * C; ++j) ks[j] *= scale;
  }
  const int64_t nblk = (s.N + kRowBlock - 1) / kRowBlock;
  dynamic_for(s.nb * nblk, [&](int64_t t0, int64_t t1, int64_t) {
    std::vector<acc_t> qb(kRowBlock * C), ob(kRowBlock * Ce);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / nblk, r0 = (t % nblk) * kRowBlock;
      const int64_t len = std::min(s.N, r0 + kRowBlock) - r0;
      load_block(q, b, r0, len, C, &f, qb.data());
      const acc_t* kvb = kv + b * SE;
      const acc_t* m = ks + b * C;
      for (int64_t hh = 0; hh < s.hin; ++hh)
        gemm_rm<acc_t>(false, false, len, s.e, s.d, 1, qb.data() + hh * s.d, C,
                       kvb + hh * s.d * s.e, s.e, 0, ob.data() + hh * s.e, Ce);
      for (int64_t i = 0; i < len; ++i) {
        scalar_t* o = out.at(b, r0 + i);
        for (int64_t hh = 0; hh < s.hin; ++hh) {
          const acc_t* qh = qb.data() + i * C + hh * s.d;
          acc_t qm = 0;
#pragma omp simd reduction(+ : qm)
          for (int64_t c = 0; c < s.d; ++c) qm += qh[c] * m[hh * s.d + c];
          bool pass;
          const acc_t fac = temp[(b % s.tH) * s.hin + hh] / denominator(qm, s, &pass);
          const acc_t* oh = ob.data() + i * Ce + hh * s.e;
          for (int64_t c = 0; c < s.e; ++c)
            o[hh * s.e + c] = static_cast<scalar_t>(oh[c] * fac);
        }
      }
    }
  });
}

// Backward. dtemp (nb * hin) receives dL/dtemperature per (batch, head); dscale (C) the
// gradient of the focusing scale (when focusing).
template <typename scalar_t, typename acc_t>
void backward_core(const Shape& s, const Rows<scalar_t>& g, const Rows<scalar_t>& q,
                   const Rows<scalar_t>& k, const Rows<scalar_t>& v, const Focus<acc_t>& f,
                   const acc_t* temp, const acc_t* kv, const acc_t* ks,
                   const Rows<scalar_t>& dq, const Rows<scalar_t>& dk,
                   const Rows<scalar_t>& dv, acc_t* dtemp, acc_t* dscale) {
  const int64_t C = s.hin * s.d, Ce = s.hin * s.e, SE = s.hin * s.d * s.e;
  const int64_t W = SE + C + s.hin;  // dKV, dm, dtemp per batch
  const bool used = needs_partials(s.nb, s.N);
  const int64_t slots = used ? block_chunks(s.nb, s.N) : 0;
  const int64_t nblk_k = num_blocks(s.n);
  at::Tensor partial_t = scratch<acc_t>(slots * s.nb * W);
  at::Tensor state_t = scratch<acc_t>(s.nb * W);
  acc_t* partial = partial_t.data_ptr<acc_t>();
  acc_t* state = state_t.data_ptr<acc_t>();
  // dscale per chunk of either pass
  const int64_t sslots = std::max(block_chunks(s.nb, s.N), num_chunks(s.nb * nblk_k));
  std::vector<acc_t> spart(static_cast<size_t>(sslots) * C, acc_t(0));
  // queries: dq, and the reductions dKV = sum q^T (g tau / den), dm, dtemp
  for_blocks(s.nb, s.N, [&](int64_t b, int64_t r0, int64_t len, int64_t slot) {
    thread_local std::vector<acc_t> qb, gb, P;
    qb.resize(len * C);
    gb.resize(len * Ce);
    P.resize(len * C);
    load_block(q, b, r0, len, C, &f, qb.data());
    load_block<scalar_t, acc_t>(g, b, r0, len, Ce, nullptr, gb.data());
    const acc_t* kvb = kv + b * SE;
    const acc_t* m = ks + b * C;
    acc_t* st = (used ? partial + slot * s.nb * W : state) + b * W;
    acc_t* dm = st + SE;
    acc_t* dt = dm + C;
    for (int64_t hh = 0; hh < s.hin; ++hh)  // P = g KV^T; g.num = q.P avoids keeping the output
      gemm_rm<acc_t>(false, true, len, s.d, s.e, 1, gb.data() + hh * s.e, Ce,
                     kvb + hh * s.d * s.e, s.e, 0, P.data() + hh * s.d, C);
    for (int64_t i = 0; i < len; ++i) {
      for (int64_t hh = 0; hh < s.hin; ++hh) {
        const acc_t* qh = qb.data() + i * C + hh * s.d;
        acc_t* ph = P.data() + i * C + hh * s.d;
        const acc_t* mh = m + hh * s.d;
        acc_t qm = 0, sv = 0;
#pragma omp simd reduction(+ : qm, sv)
        for (int64_t c = 0; c < s.d; ++c) {
          qm += qh[c] * mh[c];
          sv += qh[c] * ph[c];
        }
        bool pass;
        const acc_t inv = acc_t(1) / denominator(qm, s, &pass);
        const acc_t tau = temp[(b % s.tH) * s.hin + hh];
        dt[hh] += sv * inv;
        const acc_t dden = pass ? -tau * sv * inv * inv : acc_t(0);
        for (int64_t c = 0; c < s.d; ++c) {
          ph[c] = tau * inv * ph[c] + dden * mh[c];  // P becomes dL/dq (mapped)
          dm[hh * s.d + c] += dden * qh[c];
        }
        acc_t* gh = gb.data() + i * Ce + hh * s.e;
        for (int64_t c = 0; c < s.e; ++c) gh[c] *= tau * inv;
      }
    }
    for (int64_t hh = 0; hh < s.hin; ++hh)
      gemm_rm<acc_t>(true, false, s.d, s.e, len, 1, qb.data() + hh * s.d, C,
                     gb.data() + hh * s.e, Ce, 1, st + hh * s.d * s.e, s.e);
    acc_t* sp = spart.data() + slot * C;
    for (int64_t i = 0; i < len; ++i) {
      scalar_t* o = dq.at(b, r0 + i);
      if (f.on) {
        focus_row_backward(q.at(b, r0 + i), P.data() + i * C, C, f, o, sp);
      } else {
        for (int64_t c = 0; c < C; ++c) o[c] = static_cast<scalar_t>(P[i * C + c]);
      }
    }
  });
  for (int64_t t = 0; t < slots; ++t)
    for (int64_t j = 0; j < s.nb * W; ++j) state[j] += partial[t * s.nb * W + j];
  const acc_t scale = s.mode == 0 ? acc_t(1) / acc_t(s.n) : acc_t(1);
  for (int64_t b = 0; b < s.nb; ++b) {
    for (int64_t j = 0; j < SE + C; ++j) state[b * W + j] *= scale;
    for (int64_t hh = 0; hh < s.hin; ++hh) dtemp[b * s.hin + hh] = state[b * W + SE + C + hh];
  }
  // keys: dk = (v dKV^T + dm) / n through the focusing backward, dv = k dKV / n
  dynamic_for(s.nb * nblk_k, [&](int64_t t0, int64_t t1, int64_t slot) {
    std::vector<acc_t> kb(kRowBlock * C), vb(kRowBlock * Ce), Dk(kRowBlock * C),
        Dv(kRowBlock * Ce);
    acc_t* sp = spart.data() + slot * C;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / nblk_k, r0 = (t % nblk_k) * kRowBlock;
      const int64_t len = std::min(s.n, r0 + kRowBlock) - r0;
      load_block(k, b, r0, len, C, &f, kb.data());
      load_block<scalar_t, acc_t>(v, b, r0, len, Ce, nullptr, vb.data());
      const acc_t* dkv = state + b * W;
      const acc_t* dm = dkv + SE;
      for (int64_t hh = 0; hh < s.hin; ++hh) {
        gemm_rm<acc_t>(false, true, len, s.d, s.e, 1, vb.data() + hh * s.e, Ce,
                       dkv + hh * s.d * s.e, s.e, 0, Dk.data() + hh * s.d, C);
        gemm_rm<acc_t>(false, false, len, s.e, s.d, 1, kb.data() + hh * s.d, C,
                       dkv + hh * s.d * s.e, s.e, 0, Dv.data() + hh * s.e, Ce);
      }
      for (int64_t i = 0; i < len; ++i) {
        acc_t* dkr = Dk.data() + i * C;
        for (int64_t c = 0; c < C; ++c) dkr[c] += dm[c];
        scalar_t* ok = dk.at(b, r0 + i);
        if (f.on) {
          focus_row_backward(k.at(b, r0 + i), dkr, C, f, ok, sp);
        } else {
          for (int64_t c = 0; c < C; ++c) ok[c] = static_cast<scalar_t>(dkr[c]);
        }
        scalar_t* ov = dv.at(b, r0 + i);
        for (int64_t c = 0; c < Ce; ++c) ov[c] = static_cast<scalar_t>(Dv[i * Ce + c]);
      }
    }
  });
  if (dscale != nullptr) {
    for (int64_t c = 0; c < C; ++c) {
      acc_t sum = 0;
      for (int64_t t = 0; t < sslots; ++t) sum += spart[t * C + c];
      dscale[c] = sum * f.inv_sp[c] * f.sp_grad[c];
    }
  }
}

at::Tensor temperature_or_ones(const at::Tensor& temp, int64_t count, at::ScalarType acc_type) {
  return temp.defined() ? temp.to(acc_type).contiguous()
                        : at::ones({count}, at::TensorOptions().dtype(acc_type));
}

}  // namespace

at::Tensor focus_forward_cpu(const at::Tensor& x, const at::Tensor& scale, double p, double eps) {
  auto acc_type = at::toOpMathType(x.scalar_type());
  auto y = at::empty(x.sizes(), x.options().dtype(acc_type));
  const int64_t rows = x.size(0), C = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "focus_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Focus<acc_t> f(scale, p, eps);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    acc_t* yp = y.data_ptr<acc_t>();
    at::parallel_for(0, rows, 256, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) focus_row(xp + r * C, C, f, yp + r * C);
    });
  });
  return y;
}

std::vector<at::Tensor> focus_backward_cpu(const at::Tensor& gy, const at::Tensor& x,
                                           const at::Tensor& scale, double p, double eps) {
  auto gx = at::empty_like(x);
  const auto acc_type = at::toOpMathType(x.scalar_type());
  auto gscale = at::empty({x.size(1)}, x.options().dtype(acc_type));
  const int64_t rows = x.size(0), C = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "focus_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Focus<acc_t> f(scale, p, eps);
    const int nt = at::get_num_threads();
    std::vector<acc_t> part(static_cast<size_t>(nt) * C, acc_t(0));
    const acc_t* gp = gy.data_ptr<acc_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* gxp = gx.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 256, [&](int64_t r0, int64_t r1) {
      acc_t* mine = part.data() + at::get_thread_num() * C;
      for (int64_t r = r0; r < r1; ++r)
        focus_row_backward(xp + r * C, gp + r * C, C, f, gxp + r * C, mine);
    });
    acc_t* gs = gscale.data_ptr<acc_t>();
    for (int64_t c = 0; c < C; ++c) {
      acc_t sum = 0;
      for (int t = 0; t < nt; ++t) sum += part[t * C + c];
      gs[c] = sum * f.inv_sp[c] * f.sp_grad[c];
    }
  });
  return {gx, gscale.to(scale.scalar_type())};
}

std::vector<at::Tensor> linear_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& temp,
                                                     int64_t mode, double eps, double clamp_min) {
  const int64_t B = q.size(0), H = q.size(1);
  const Shape s{B * H, q.size(2), k.size(2), 1, q.size(3), v.size(3), H, mode, eps, clamp_min};
  const auto acc_type = at::toOpMathType(q.scalar_type());
  // output in the memory layout (B, N, h, e): heads merge back into (B, N, h*e) for free
  auto out = at::empty({B, s.N, H, s.e}, q.options()).permute({0, 2, 1, 3});
  auto kv = at::empty({B, H, s.d, s.e}, q.options().dtype(acc_type));
  auto ks = at::empty({B, H, s.d}, q.options().dtype(acc_type));
  auto t = temperature_or_ones(temp, H, acc_type);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "la_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    forward_core<scalar_t, acc_t>(s, head_rows<scalar_t>(q), head_rows<scalar_t>(k),
                                  head_rows<scalar_t>(v), head_rows<scalar_t>(out),
                                  Focus<acc_t>(), t.data_ptr<acc_t>(), kv.data_ptr<acc_t>(),
                                  ks.data_ptr<acc_t>());
  });
  return {out, kv, ks};
}

std::vector<at::Tensor> linear_attention_backward_cpu(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& kv, const at::Tensor& ksum, const at::Tensor& temp, int64_t mode, double eps,
    double clamp_min) {
  const int64_t B = q.size(0), H = q.size(1);
  const Shape s{B * H, q.size(2), k.size(2), 1, q.size(3), v.size(3), H, mode, eps, clamp_min};
  const auto acc_type = at::toOpMathType(q.scalar_type());
  auto dq = at::empty({B, s.N, H, s.d}, q.options()).permute({0, 2, 1, 3});
  auto dk = at::empty({B, s.n, H, s.d}, k.options()).permute({0, 2, 1, 3});
  auto dv = at::empty({B, s.n, H, s.e}, v.options()).permute({0, 2, 1, 3});
  auto dtemp = at::empty({B, H}, q.options().dtype(acc_type));
  auto t = temperature_or_ones(temp, H, acc_type);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "la_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    backward_core<scalar_t, acc_t>(
        s, head_rows<scalar_t>(g), head_rows<scalar_t>(q), head_rows<scalar_t>(k),
        head_rows<scalar_t>(v), Focus<acc_t>(), t.data_ptr<acc_t>(),
        kv.contiguous().data_ptr<acc_t>(), ksum.contiguous().data_ptr<acc_t>(),
        head_rows<scalar_t>(dq), head_rows<scalar_t>(dk), head_rows<scalar_t>(dv),
        dtemp.data_ptr<acc_t>(), nullptr);
  });
  at::Tensor dt;
  if (temp.defined()) dt = dtemp.sum(0).to(temp.scalar_type());
  return {dq, dk, dv, dt};
}

std::vector<at::Tensor> focused_linear_attention_forward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& scale,
    int64_t heads, double p, double focus_eps, double eps) {
  const int64_t B = q.size(0), C = q.size(2), Ce = v.size(2);
  const Shape s{B, q.size(1), k.size(1), heads, C / heads, Ce / heads, 1, 0, eps, 0.0};
  const auto acc_type = at::toOpMathType(q.scalar_type());
  auto out = at::empty({B, s.N, Ce}, q.options());
  auto kv = at::empty({B, heads, s.d, s.e}, q.options().dtype(acc_type));
  auto ks = at::empty({B, heads, s.d}, q.options().dtype(acc_type));
  auto t = at::ones({heads}, q.options().dtype(acc_type));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "fla_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    forward_core<scalar_t, acc_t>(s, token_rows<scalar_t>(q), token_rows<scalar_t>(k),
                                  token_rows<scalar_t>(v), token_rows<scalar_t>(out),
                                  Focus<acc_t>(scale, p, focus_eps), t.data_ptr<acc_t>(),
                                  kv.data_ptr<acc_t>(), ks.data_ptr<acc_t>());
  });
  return {out, kv, ks};
}

at::Tensor focused_linear_attention_backward_into_cpu(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& scale, const at::Tensor& kv, const at::Tensor& ksum, int64_t heads, double p,
    double focus_eps, double eps, const at::Tensor& dq, const at::Tensor& dk,
    const at::Tensor& dv) {
  const int64_t B = q.size(0), C = q.size(2), Ce = v.size(2);
  const Shape s{B, q.size(1), k.size(1), heads, C / heads, Ce / heads, 1, 0, eps, 0.0};
  const auto acc_type = at::toOpMathType(q.scalar_type());
  auto dtemp = at::empty({B, heads}, q.options().dtype(acc_type));
  auto dscale = at::empty({C}, q.options().dtype(acc_type));
  auto t = at::ones({heads}, q.options().dtype(acc_type));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "fla_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    backward_core<scalar_t, acc_t>(
        s, token_rows<scalar_t>(g), token_rows<scalar_t>(q), token_rows<scalar_t>(k),
        token_rows<scalar_t>(v), Focus<acc_t>(scale, p, focus_eps), t.data_ptr<acc_t>(),
        kv.contiguous().data_ptr<acc_t>(), ksum.contiguous().data_ptr<acc_t>(),
        token_rows<scalar_t>(dq), token_rows<scalar_t>(dk), token_rows<scalar_t>(dv),
        dtemp.data_ptr<acc_t>(), dscale.data_ptr<acc_t>());
  });
  return dscale.to(scale.scalar_type());
}

std::vector<at::Tensor> focused_linear_attention_backward_cpu(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& scale, const at::Tensor& kv, const at::Tensor& ksum, int64_t heads, double p,
    double focus_eps, double eps) {
  auto dq = at::empty(q.sizes(), q.options());
  auto dk = at::empty(k.sizes(), k.options());
  auto dv = at::empty(v.sizes(), v.options());
  auto dscale = focused_linear_attention_backward_into_cpu(g, q, k, v, scale, kv, ksum, heads, p,
                                                           focus_eps, eps, dq, dk, dv);
  return {dq, dk, dv, dscale};
}

}  // namespace mmeffvit
