// CPU forward of softmax attention inside small windows (Swin's window attention, inference).
//
// Why: at detection resolution Swin-style stages run thousands of tiny attentions (49 tokens,
// 32 channels a head); torch's fused CPU attention handles each (window, head) with GEMM calls
// sized for long sequences and reaches ~12 GMAC/s on 2 Zen 3 threads, a sixth of the machine's
// GEMM rate (docs/profiles.md, thirteenth round). Here one task is one (window, head): its keys
// are transposed into an L1-resident table, the scores of 8 query rows are made at once against
// it (8 independent FMA chains), softmax runs on 8-wide vectors, the value sums of 2 rows share
// their loads, and the output is written with the heads already merged, (BW, n, h·d), which
// saves the transpose copy after the attention. Stage 3 of FLatten-Swin-T at 800×1333 (96
// windows × 12 heads, 2 threads): 13-18 → 10-13 ms (docs/profiles.md, fourteenth round).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../window_attention.h"
#include "cpu_clones.h"

namespace mmeffvit {
namespace {

// v8f values never cross a call boundary (the helpers are always inlined), so the ABI note
// about AVX vectors returned without AVX does not apply
#pragma GCC diagnostic ignored "-Wpsabi"

// Eight floats: GCC's vector extension, one AVX register in the AVX2 clone, two SSE registers in
// the baseline one. Loads and stores go through memcpy (no alignment assumed).
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline void store8(float* p, v8f v) {
  std::memcpy(p, &v, sizeof(v));
}

// exp(x) for x <= 0 (scores minus their row maximum): Cody-Waite range reduction and Cephes'
// degree-5 polynomial (about 1 ulp), 2^n from the exponent bits; below -87.3 the result is 0
// (a masked, -inf or padding score).
__attribute__((always_inline)) inline v8f exp_nonpositive(v8f x) {
  const v8i below = x < -87.3f;
  x = below ? v8f{} - 87.3f : x;
  const v8f n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
  v8f r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  v8f p = v8f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8f scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return below ? v8f{} : p * scale;
}

struct Views {
  const float *q, *k, *v, *mask;
  int64_t sq[3], sk[3], sv[3], sm[3];  // strides of dims 0-2 (the last one is 1)
  int64_t heads, n;
  float scale;
  float* out;  // (BW, n, h·d)
};

constexpr int64_t kRows = 8;  // query rows whose scores are made together (8 FMA chains)

// o_r = Σ_j p_r[j] v_j / total_r for R rows at once (R·DB accumulators in registers, each value
// row loaded once for all R)
template <int DB, int R>
__attribute__((always_inline)) inline void weighted_values(const float* v, int64_t sv, int64_t n,
                                                           const float* p, int64_t np,
                                                           const float* inv, float* out,
                                                           int64_t so) {
  v8f o[R][DB];
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < DB; ++e) o[r][e] = v8f{};
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * sv;
    for (int e = 0; e < DB; ++e) {
      const v8f x = load8(vj + 8 * e);
      for (int r = 0; r < R; ++r) o[r][e] += p[r * np + j] * x;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < DB; ++e) store8(out + r * so + 8 * e, o[r][e] * inv[r]);
}

// One (window b, head h) with d = 8·DB channels. Scratch: kt (d, np) keys transposed and s
// (kRows, np) scores; np = n rounded up to 8.
template <int DB>
MMEFFVIT_CPU_CLONES void window_head(const Views& a, int64_t b, int64_t h, float* kt, float* s) {
  constexpr int64_t d = 8 * DB;
  const int64_t n = a.n, np = (n + 7) / 8 * 8, so = a.heads * d;
  const float* q = a.q + b * a.sq[0] + h * a.sq[1];
  const float* k = a.k + b * a.sk[0] + h * a.sk[1];
  const float* v = a.v + b * a.sv[0] + h * a.sv[1];
  const float* mask = a.mask ? a.mask + b * a.sm[0] + h * a.sm[1] : nullptr;
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = k + j * a.sk[2];
    for (int64_t c = 0; c < d; ++c) kt[c * np + j] = kj[c];
  }
  for (int64_t c = 0; c < d; ++c)
    for (int64_t j = n; j < np; ++j) kt[c * np + j] = 0.f;
  float* out = a.out + (b * n * a.heads + h) * d;
  float inv[kRows];
  for (int64_t i0 = 0; i0 < n; i0 += kRows) {
    const int64_t rows = std::min(kRows, n - i0);
    const float* qr[kRows];  // rows past n repeat the last one (computed, not stored)
    for (int64_t r = 0; r < kRows; ++r) qr[r] = q + std::min(i0 + r, n - 1) * a.sq[2];
    // scores of rows i0.. for each block of 8 keys: kRows independent accumulators
    for (int64_t jb = 0; jb < np; jb += 8) {
      v8f acc[kRows];
      for (int64_t r = 0; r < kRows; ++r) acc[r] = v8f{};
      for (int64_t c = 0; c < d; ++c) {
        const v8f kc = load8(kt + c * np + jb);
        for (int64_t r = 0; r < kRows; ++r) acc[r] += qr[r][c] * kc;
      }
      for (int64_t r = 0; r < rows; ++r) store8(s + r * np + jb, acc[r] * a.scale);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * np;
      if (mask) {
        const float* mr = mask + (i0 + r) * a.sm[2];
        for (int64_t j = 0; j < n; ++j) sr[j] += mr[j];
      }
      for (int64_t j = n; j < np; ++j) sr[j] = -std::numeric_limits<float>::infinity();
      v8f top8 = load8(sr);
      for (int64_t jb = 8; jb < np; jb += 8) {
        const v8f x = load8(sr + jb);
        top8 = x > top8 ? x : top8;
      }
      float top = top8[0];
      for (int e = 1; e < 8; ++e) top = std::max(top, top8[e]);
      if (top == -std::numeric_limits<float>::infinity()) top = 0.f;  // a fully masked row
      v8f total8 = v8f{};
      for (int64_t jb = 0; jb < np; jb += 8) {
        const v8f p = exp_nonpositive(load8(sr + jb) - top);
        store8(sr + jb, p);
        total8 += p;
      }
      float total = 0.f;
      for (int e = 0; e < 8; ++e) total += total8[e];
      inv[r] = 1.f / total;
    }
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2)
      weighted_values<DB, 2>(v, a.sv[2], n, s + r * np, np, inv + r, out + (i0 + r) * so, so);
    if (r < rows)
      weighted_values<DB, 1>(v, a.sv[2], n, s + r * np, np, inv + r, out + (i0 + r) * so, so);
  }
}

template <int DB>
void window_heads(const Views& a, int64_t begin, int64_t end, float* scratch) {
  const int64_t np = (a.n + 7) / 8 * 8;
  for (int64_t t = begin; t < end; ++t)
    window_head<DB>(a, t / a.heads, t % a.heads, scratch, scratch + 8 * DB * np);
}

}  // namespace

at::Tensor window_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& mask,
                                        double scale) {
  const int64_t bw = q.size(0), heads = q.size(1), n = q.size(2), d = q.size(3);
  TORCH_CHECK(d % 8 == 0 && d >= 8 && d <= 128, "window_attention_forward_cpu: head dims must be "
              "a multiple of 8 up to 128, got ", d);
  auto out = at::empty({bw, n, heads * d}, q.options());
  Views a{q.const_data_ptr<float>(), k.const_data_ptr<float>(), v.const_data_ptr<float>(),
          mask.defined() ? mask.const_data_ptr<float>() : nullptr,
          {q.stride(0), q.stride(1), q.stride(2)}, {k.stride(0), k.stride(1), k.stride(2)},
          {v.stride(0), v.stride(1), v.stride(2)}, {0, 0, 0}, heads, n,
          static_cast<float>(scale), out.data_ptr<float>()};
  if (mask.defined()) {
    a.sm[0] = mask.stride(0);
    a.sm[1] = mask.stride(1);
    a.sm[2] = mask.stride(2);
  }
  const int64_t np = (n + 7) / 8 * 8;
  at::parallel_for(0, bw * heads, 1, [&](int64_t begin, int64_t end) {
    // keys transposed (d·np), scores (kRows·np)
    std::vector<float> scratch(static_cast<size_t>(d * np + kRows * np));
    switch (d / 8) {
#define MMEFFVIT_WINDOW_CASE(DB) \
  case DB:                       \
    window_heads<DB>(a, begin, end, scratch.data()); \
    break;
      MMEFFVIT_WINDOW_CASE(1)
      MMEFFVIT_WINDOW_CASE(2)
      MMEFFVIT_WINDOW_CASE(3)
      MMEFFVIT_WINDOW_CASE(4)
      MMEFFVIT_WINDOW_CASE(5)
      MMEFFVIT_WINDOW_CASE(6)
      MMEFFVIT_WINDOW_CASE(7)
      MMEFFVIT_WINDOW_CASE(8)
      MMEFFVIT_WINDOW_CASE(9)
      MMEFFVIT_WINDOW_CASE(10)
      MMEFFVIT_WINDOW_CASE(11)
      MMEFFVIT_WINDOW_CASE(12)
      MMEFFVIT_WINDOW_CASE(13)
      MMEFFVIT_WINDOW_CASE(14)
      MMEFFVIT_WINDOW_CASE(15)
      MMEFFVIT_WINDOW_CASE(16)
#undef MMEFFVIT_WINDOW_CASE
    }
  });
  return out;
}

}  // namespace mmeffvit
