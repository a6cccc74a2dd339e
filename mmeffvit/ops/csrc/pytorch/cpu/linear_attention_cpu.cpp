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
#include "linear_attention_blocks.h"

namespace mmeffvit {
namespace {

using namespace linear_attention_cpu;  // NOLINT: this file is its one user

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
