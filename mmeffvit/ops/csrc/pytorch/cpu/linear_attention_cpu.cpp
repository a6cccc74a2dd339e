// CPU kernels of the focusing function and of kv-first linear attention.
//
// Design (why): the composite PyTorch chain writes ~15 full-size tensors; here every full-size
// quantity is either an input, the output, or a gradient. Row-wise maths (norms, powers,
// normalisers) runs in one fused pass per row with fp32 (fp64 for double) accumulation, and the
// only matrix products are (rows x d) @ (d x e) blocks handed to BLAS, so no N x N or N x d
// temporary exists. Work is split over row blocks with at::parallel_for; reductions over rows use
// per-thread partial sums that are added at the end (deterministic for a fixed thread count).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>

#include <dlfcn.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "../linear_attention.h"

namespace mmeffvit {
namespace {

constexpr int64_t kRowBlock = 512;  // rows per BLAS block: fits L2 for d, e <= 128

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

template <typename scalar_t>
void focus_forward_kernel(const at::Tensor& x, const at::Tensor& scale, at::Tensor& y, double p,
                          double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t rows = x.size(0), C = x.size(1);
  std::vector<acc_t> inv_sp(C);
  auto s = scale.to(at::toOpMathType(x.scalar_type())).contiguous();
  const acc_t* sp = s.data_ptr<acc_t>();
  for (int64_t c = 0; c < C; ++c) inv_sp[c] = acc_t(1) / softplus(sp[c]);
  const scalar_t* xp = x.data_ptr<scalar_t>();
  acc_t* yp = y.data_ptr<acc_t>();
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const scalar_t* xr = xp + r * C;
      acc_t* yr = yp + r * C;
      acc_t n1 = 0, n2 = 0;
      for (int64_t c = 0; c < C; ++c) {
        acc_t xv = static_cast<acc_t>(xr[c]);
        acc_t t = (xv > acc_t(0) ? xv : acc_t(0)) + acc_t(eps);
        t *= inv_sp[c];
        acc_t u = power(t, p);
        n1 += t * t;
        n2 += u * u;
        yr[c] = u;  // the output row doubles as scratch for t**p
      }
      const acc_t ratio = std::sqrt(n1) / std::sqrt(n2);
      for (int64_t c = 0; c < C; ++c) yr[c] *= ratio;
    }
  });
}

template <typename scalar_t>
void focus_backward_kernel(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& scale,
                           at::Tensor& gx, at::Tensor& gscale, double p, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  const auto acc_type = at::toOpMathType(x.scalar_type());
  const int64_t rows = x.size(0), C = x.size(1);
  auto s = scale.to(acc_type).contiguous();
  const acc_t* sp = s.data_ptr<acc_t>();
  std::vector<acc_t> inv_sp(C);
  for (int64_t c = 0; c < C; ++c) inv_sp[c] = acc_t(1) / softplus(sp[c]);
  const int nt = at::get_num_threads();
  std::vector<acc_t> partial(static_cast<size_t>(nt) * C, acc_t(0));
  const acc_t* gp = gy.data_ptr<acc_t>();
  const scalar_t* xp = x.data_ptr<scalar_t>();
  scalar_t* gxp = gx.data_ptr<scalar_t>();
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    acc_t* part = partial.data() + static_cast<size_t>(at::get_thread_num()) * C;
    std::vector<acc_t> t(C);
    for (int64_t r = r0; r < r1; ++r) {
      const scalar_t* xr = xp + r * C;
      const acc_t* gr = gp + r * C;
      acc_t n1 = 0, n2 = 0, S = 0;
      for (int64_t c = 0; c < C; ++c) {
        acc_t xv = static_cast<acc_t>(xr[c]);
        acc_t tv = ((xv > acc_t(0) ? xv : acc_t(0)) + acc_t(eps)) * inv_sp[c];
        acc_t u = power(tv, p);
        t[c] = tv;
        n1 += tv * tv;
        n2 += u * u;
        S += gr[c] * u;
      }
      // y = u * |t| / |u|:  dL/du = r g - r S u / |u|^2,  dL/dt += S t / (|t| |u|)
      const acc_t l1 = std::sqrt(n1), l2 = std::sqrt(n2);
      const acc_t ratio = l1 / l2, cu = ratio * S / n2, ct = S / (l1 * l2);
      for (int64_t c = 0; c < C; ++c) {
        const acc_t tv = t[c];
        const acc_t u = power(tv, p);
        const acc_t du = ratio * gr[c] - cu * u;
        const acc_t dpow = p == 3.0 ? acc_t(3) * tv * tv : acc_t(p) * power(tv, p - 1.0);
        const acc_t dt = du * dpow + ct * tv;
        gxp[r * C + c] = static_cast<scalar_t>(
            static_cast<acc_t>(xr[c]) > acc_t(0) ? dt * inv_sp[c] : acc_t(0));
        part[c] -= dt * tv;  // dL/dsoftplus = -dt * t / softplus, finished below
      }
    }
  });
  acc_t* gs = gscale.data_ptr<acc_t>();
  for (int64_t c = 0; c < C; ++c) {
    acc_t sum = 0;
    for (int i = 0; i < nt; ++i) sum += partial[static_cast<size_t>(i) * C + c];
    gs[c] = sum * inv_sp[c] * softplus_grad(sp[c]);
  }
}

// Fortran BLAS of the BLAS library torch is linked with (MKL or OpenBLAS), found at run time:
// ATen's cpublas is not exported, and dispatched ATen ops inside a parallel region fight over
// the threads (measured 8x slower on 2 cores). Naive loops are the fallback if none is found.
using sgemm_t = void (*)(const char*, const char*, const int*, const int*, const int*,
                         const float*, const float*, const int*, const float*, const int*,
                         const float*, float*, const int*);
using dgemm_t = void (*)(const char*, const char*, const int*, const int*, const int*,
                         const double*, const double*, const int*, const double*, const int*,
                         const double*, double*, const int*);

void* find_blas(const char* lower, const char* upper) {
  void* torch_cpu = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  for (const char* name : {lower, upper}) {
    void* f = torch_cpu ? dlsym(torch_cpu, name) : nullptr;
    if (!f) f = dlsym(RTLD_DEFAULT, name);
    if (f) return f;
  }
  return nullptr;
}

template <typename acc_t>
void blas_gemm(char ta, char tb, int m, int n, int k, acc_t alpha, const acc_t* a, int lda,
               const acc_t* b, int ldb, acc_t beta, acc_t* c, int ldc, bool* done) {
  if constexpr (std::is_same_v<acc_t, float>) {
    static const auto f = reinterpret_cast<sgemm_t>(find_blas("sgemm_", "SGEMM"));
    if (f) f(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
    *done = f != nullptr;
  } else {
    static const auto f = reinterpret_cast<dgemm_t>(find_blas("dgemm_", "DGEMM"));
    if (f) f(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
    *done = f != nullptr;
  }
}

// Row-major C (M x N, ldc) = alpha op(A) op(B) + beta C, i.e. column-major C^T = op(B)^T op(A)^T.
template <typename acc_t>
void gemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, acc_t alpha, const acc_t* A,
             int64_t lda, const acc_t* B, int64_t ldb, acc_t beta, acc_t* C, int64_t ldc) {
  bool done = false;
  blas_gemm<acc_t>(tb ? 'T' : 'N', ta ? 'T' : 'N', N, M, K, alpha, B, ldb, A, lda, beta, C, ldc,
                   &done);
  if (done) return;
  for (int64_t i = 0; i < M; ++i) {
    acc_t* c = C + i * ldc;
    for (int64_t j = 0; j < N; ++j) c[j] = beta == acc_t(0) ? acc_t(0) : c[j] * beta;
    for (int64_t kk = 0; kk < K; ++kk) {
      const acc_t a = alpha * (ta ? A[kk * lda + i] : A[i * lda + kk]);
      if (tb) {
        for (int64_t j = 0; j < N; ++j) c[j] += a * B[j * ldb + kk];
      } else {
        for (int64_t j = 0; j < N; ++j) c[j] += a * B[kk * ldb + j];
      }
    }
  }
}

// Pointer to row r of head bh of a (B, h, L, f) tensor with unit stride in the last dim.
template <typename T>
struct Rows {
  T* base;
  int64_t sb, sh, sr, H;
  Rows(const at::Tensor& t, int64_t heads)
      : base(t.data_ptr<T>()), sb(t.stride(0)), sh(t.stride(1)), sr(t.stride(2)), H(heads) {}
  T* at(int64_t bh, int64_t r) const { return base + (bh / H) * sb + (bh % H) * sh + r * sr; }
};

// rows [r0, r0 + len) of one head, converted into a contiguous (len x f) opmath buffer
template <typename scalar_t, typename acc_t>
void load_rows(const Rows<scalar_t>& t, int64_t bh, int64_t r0, int64_t len, int64_t f,
               acc_t* dst) {
  for (int64_t i = 0; i < len; ++i) {
    const scalar_t* src = t.at(bh, r0 + i);
    for (int64_t c = 0; c < f; ++c) dst[i * f + c] = static_cast<acc_t>(src[c]);
  }
}

template <typename acc_t>
inline acc_t denominator(acc_t qm, int64_t mode, double eps, double clamp_min, bool* pass) {
  if (mode == 0) {
    *pass = true;
    return qm + acc_t(eps);
  }
  *pass = qm >= acc_t(clamp_min);  // torch.clamp passes the gradient where x >= min
  return *pass ? qm : acc_t(clamp_min);
}

}  // namespace

at::Tensor focus_forward_cpu(const at::Tensor& x, const at::Tensor& scale, double p, double eps) {
  auto acc_type = at::toOpMathType(x.scalar_type());
  auto y = at::empty(x.sizes(), x.options().dtype(acc_type));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "focus_forward_cpu",
                                  [&] { focus_forward_kernel<scalar_t>(x, scale, y, p, eps); });
  return y;
}

std::vector<at::Tensor> focus_backward_cpu(const at::Tensor& gy, const at::Tensor& x,
                                           const at::Tensor& scale, double p, double eps) {
  auto gx = at::empty_like(x);
  auto gscale = at::empty({x.size(1)}, x.options().dtype(at::toOpMathType(x.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "focus_backward_cpu",
      [&] { focus_backward_kernel<scalar_t>(gy, x, scale, gx, gscale, p, eps); });
  return {gx, gscale.to(scale.scalar_type())};
}

std::vector<at::Tensor> linear_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& temp,
                                                     int64_t mode, double eps, double clamp_min) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), e = v.size(3), BH = B * H;
  const auto acc_type = at::toOpMathType(q.scalar_type());
  const auto acc_opts = q.options().dtype(acc_type);
  const int nt = at::get_num_threads();
  // per-thread partial state KV (d x e) and key sum (d) of every (b, head)
  auto partial = at::zeros({nt, BH, d * e + d}, acc_opts);
  // output in the memory layout (B, N, h, e): heads merge back into (B, N, h*e) for free
  auto out = at::empty({B, N, H, e}, q.options()).permute({0, 2, 1, 3});
  auto kv = at::empty({B, H, d, e}, acc_opts);
  auto ksum = at::empty({B, H, d}, acc_opts);
  auto tcpu = temp.defined() ? temp.to(acc_type).contiguous() : at::ones({H}, acc_opts);
  const int64_t nblk_k = (n + kRowBlock - 1) / kRowBlock, nblk_q = (N + kRowBlock - 1) / kRowBlock;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "la_fwd_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Rows<scalar_t> qr(q, H), kr(k, H), vr(v, H);
    const Rows<scalar_t> orow(out, H);
    acc_t* part_base = partial.data_ptr<acc_t>();
    at::parallel_for(0, BH * nblk_k, 1, [&](int64_t t0, int64_t t1) {
      std::vector<acc_t> kb(kRowBlock * d), vb(kRowBlock * e);
      acc_t* mine = part_base + at::get_thread_num() * BH * (d * e + d);
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t bh = task / nblk_k, r0 = (task % nblk_k) * kRowBlock;
        const int64_t len = std::min(n, r0 + kRowBlock) - r0;
        load_rows(kr, bh, r0, len, d, kb.data());
        load_rows(vr, bh, r0, len, e, vb.data());
        acc_t* p = mine + bh * (d * e + d);
        gemm_rm<acc_t>(true, false, d, e, len, 1, kb.data(), d, vb.data(), e, 1, p, e);
        for (int64_t i = 0; i < len; ++i)
          for (int64_t c = 0; c < d; ++c) p[d * e + c] += kb[i * d + c];
      }
    });
    auto total = partial.sum(0);
    const double scale = mode == 0 ? 1.0 / static_cast<double>(n) : 1.0;
    kv.view({BH, d * e}).copy_(total.narrow(1, 0, d * e)).mul_(scale);
    ksum.view({BH, d}).copy_(total.narrow(1, d * e, d)).mul_(scale);
    const acc_t* kvp = kv.data_ptr<acc_t>();
    const acc_t* msp = ksum.data_ptr<acc_t>();
    const acc_t* tp = tcpu.data_ptr<acc_t>();
    at::parallel_for(0, BH * nblk_q, 1, [&](int64_t t0, int64_t t1) {
      std::vector<acc_t> qb(kRowBlock * d), num(kRowBlock * e);
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t bh = task / nblk_q, r0 = (task % nblk_q) * kRowBlock;
        const int64_t len = std::min(N, r0 + kRowBlock) - r0;
        load_rows(qr, bh, r0, len, d, qb.data());
        gemm_rm<acc_t>(false, false, len, e, d, 1, qb.data(), d, kvp + bh * d * e, e, 0,
                       num.data(), e);
        const acc_t* m = msp + bh * d;
        for (int64_t i = 0; i < len; ++i) {
          acc_t qm = 0;
          for (int64_t c = 0; c < d; ++c) qm += qb[i * d + c] * m[c];
          bool pass;
          const acc_t f = tp[bh % H] / denominator(qm, mode, eps, clamp_min, &pass);
          scalar_t* o = orow.at(bh, r0 + i);
          for (int64_t c = 0; c < e; ++c) o[c] = static_cast<scalar_t>(num[i * e + c] * f);
        }
      }
    });
  });
  return {out, kv, ksum};
}

std::vector<at::Tensor> linear_attention_backward_cpu(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& kv, const at::Tensor& ksum, const at::Tensor& temp, int64_t mode, double eps,
    double clamp_min) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), e = v.size(3), BH = B * H;
  const auto acc_type = at::toOpMathType(q.scalar_type());
  const auto acc_opts = q.options().dtype(acc_type);
  const int nt = at::get_num_threads();
  // per-thread partials of dKV (d*e), dm (d) and dtemperature (1) for every (b, head)
  const int64_t width = d * e + d + 1;
  auto partial = at::zeros({nt, BH, width}, acc_opts);
  auto dq = at::empty({B, N, H, d}, q.options()).permute({0, 2, 1, 3});
  auto dk = at::empty({B, n, H, d}, k.options()).permute({0, 2, 1, 3});
  auto dv = at::empty({B, n, H, e}, v.options()).permute({0, 2, 1, 3});
  auto tcpu = temp.defined() ? temp.to(acc_type).contiguous() : at::ones({H}, acc_opts);
  const int64_t nblk_q = (N + kRowBlock - 1) / kRowBlock, nblk_k = (n + kRowBlock - 1) / kRowBlock;
  const double scale = mode == 0 ? 1.0 / static_cast<double>(n) : 1.0;
  at::Tensor dtemp;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "la_bwd_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const Rows<scalar_t> qr(q, H), kr(k, H), vr(v, H), gr(g, H);
    const Rows<scalar_t> dqr(dq, H), dkr(dk, H), dvr(dv, H);
    const acc_t* kvp = kv.data_ptr<acc_t>();
    const acc_t* msp = ksum.data_ptr<acc_t>();
    const acc_t* tp = tcpu.data_ptr<acc_t>();
    acc_t* part_base = partial.data_ptr<acc_t>();
    at::parallel_for(0, BH * nblk_q, 1, [&](int64_t t0, int64_t t1) {
      std::vector<acc_t> qb(kRowBlock * d), gb(kRowBlock * e), P(kRowBlock * d);
      acc_t* mine = part_base + at::get_thread_num() * BH * width;
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t bh = task / nblk_q, r0 = (task % nblk_q) * kRowBlock;
        const int64_t len = std::min(N, r0 + kRowBlock) - r0;
        load_rows(qr, bh, r0, len, d, qb.data());
        load_rows(gr, bh, r0, len, e, gb.data());
        // P = g KV^T: dq before the normaliser; g.num = q.P avoids keeping the output
        const acc_t* kvb = kvp + bh * d * e;
        gemm_rm<acc_t>(false, true, len, d, e, 1, gb.data(), e, kvb, e, 0, P.data(), d);
        const acc_t* m = msp + bh * d;
        acc_t* pb = mine + bh * width;
        acc_t* dm = pb + d * e;
        const acc_t tau = tp[bh % H];
        for (int64_t i = 0; i < len; ++i) {
          acc_t qm = 0, s = 0;
          for (int64_t c = 0; c < d; ++c) {
            qm += qb[i * d + c] * m[c];
            s += qb[i * d + c] * P[i * d + c];
          }
          bool pass;
          const acc_t inv = acc_t(1) / denominator(qm, mode, eps, clamp_min, &pass);
          pb[d * e + d] += s * inv;
          const acc_t dden = pass ? -tau * s * inv * inv : acc_t(0);
          scalar_t* dqo = dqr.at(bh, r0 + i);
          for (int64_t c = 0; c < d; ++c) {
            dqo[c] = static_cast<scalar_t>(tau * inv * P[i * d + c] + dden * m[c]);
            dm[c] += dden * qb[i * d + c];
          }
          for (int64_t c = 0; c < e; ++c) gb[i * e + c] *= tau * inv;  // g tau / den
        }
        gemm_rm<acc_t>(true, false, d, e, len, 1, qb.data(), d, gb.data(), e, 1, pb, e);
      }
    });
    auto total = partial.sum(0);  // (BH, width)
    auto dkv = total.narrow(1, 0, d * e).mul(scale).contiguous();
    auto dmt = total.narrow(1, d * e, d).mul(scale).contiguous();
    if (temp.defined()) {
      dtemp = total.select(1, d * e + d).view({B, H}).sum(0).to(temp.scalar_type());
    }
    // dK = (V dKV^T + dm) * scale, dV = K dKV * scale (scale folded into dkv and dm)
    const acc_t* dkvp = dkv.data_ptr<acc_t>();
    const acc_t* dmp = dmt.data_ptr<acc_t>();
    at::parallel_for(0, BH * nblk_k, 1, [&](int64_t t0, int64_t t1) {
      std::vector<acc_t> kb(kRowBlock * d), vb(kRowBlock * e), ob(kRowBlock * std::max(d, e));
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t bh = task / nblk_k, r0 = (task % nblk_k) * kRowBlock;
        const int64_t len = std::min(n, r0 + kRowBlock) - r0;
        load_rows(kr, bh, r0, len, d, kb.data());
        load_rows(vr, bh, r0, len, e, vb.data());
        const acc_t* dkvb = dkvp + bh * d * e;
        const acc_t* dm = dmp + bh * d;
        gemm_rm<acc_t>(false, true, len, d, e, 1, vb.data(), e, dkvb, e, 0, ob.data(), d);
        for (int64_t i = 0; i < len; ++i) {
          scalar_t* o = dkr.at(bh, r0 + i);
          for (int64_t c = 0; c < d; ++c) o[c] = static_cast<scalar_t>(ob[i * d + c] + dm[c]);
        }
        gemm_rm<acc_t>(false, false, len, e, d, 1, kb.data(), d, dkvb, e, 0, ob.data(), e);
        for (int64_t i = 0; i < len; ++i) {
          scalar_t* o = dvr.at(bh, r0 + i);
          for (int64_t c = 0; c < e; ++c) o[c] = static_cast<scalar_t>(ob[i * e + c]);
        }
      }
    });
  });
  return {dq, dk, dv, dtemp};
}

}  // namespace mmeffvit
