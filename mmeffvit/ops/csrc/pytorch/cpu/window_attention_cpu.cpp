// CPU forward of softmax attention inside small windows (Swin's window attention, inference).
//
// Why: at detection resolution Swin-style stages run thousands of tiny attentions (49 tokens,
// 32 channels a head); torch's fused CPU attention handles each (window, head) with GEMM calls
// sized for long sequences and reaches a small fraction of the machine's GEMM rate there
// (docs/ops.md). Here one task is one (window, head): its keys
// are transposed into an L1-resident table, the scores of 8 query rows are made at once against
// it (8 independent FMA chains), softmax runs on 8-wide vectors, the value sums of 2 rows share
// their loads, and the output is written with the heads already merged, (BW, n, h·d), which
// saves the transpose copy after the attention (timings: docs/ops.md, window_attention).
// Focal attention's windows read their keys (window, ring, pooled: 181-230) from a shared bank
// through an index, and its bias and per-window key mask are added to the scores here, so
// neither the gathered keys nor the summed mask is ever written (fifteenth round).
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
  const float *q, *k, *v, *mask, *key_mask;
  // gathered keys: key j of window b is row index[(b % windows)·nk + j] of image b / windows
  const int64_t* index;
  int64_t sq[3], sk[3], sv[3], sm[3];  // strides of dims 0-2 (the last one is 1)
  int64_t skm;      // key_mask's row stride (row b % windows)
  int64_t windows;  // windows per image, for index and key_mask
  int64_t heads, nq, nk;
  float scale;
  float* out;  // (BW, nq, h·d)
};

constexpr int64_t kRows = 8;  // query rows whose scores are made together (8 FMA chains)

// o_r = Σ_j p_r[j] v_j / total_r for R rows at once (R·DB accumulators in registers, each value
// row loaded once for all R)
template <int DB, int R>
__attribute__((always_inline)) inline void weighted_values(const float* const* vrow, int64_t n,
                                                           const float* p, int64_t np,
                                                           const float* inv, float* out,
                                                           int64_t so) {
  v8f o[R][DB];
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < DB; ++e) o[r][e] = v8f{};
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = vrow[j];
    for (int e = 0; e < DB; ++e) {
      const v8f x = load8(vj + 8 * e);
      for (int r = 0; r < R; ++r) o[r][e] += p[r * np + j] * x;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < DB; ++e) store8(out + r * so + 8 * e, o[r][e] * inv[r]);
}

// One (window b, head h) with d = 8·DB channels. Scratch: kt (d, np) keys transposed, s
// (kRows, np) scores and vrow (nk) value row pointers; np = nk rounded up to 8.
template <int DB>
MMEFFVIT_CPU_CLONES void window_head(const Views& a, int64_t b, int64_t h, float* kt, float* s,
                                     const float** vrow) {
  constexpr int64_t d = 8 * DB;
  const int64_t nq = a.nq, nk = a.nk, np = (nk + 7) / 8 * 8, so = a.heads * d;
  const int64_t window = a.windows ? b % a.windows : 0;
  const int64_t source = a.index ? b / a.windows : b;  // image of the bank, or the window
  const float* q = a.q + b * a.sq[0] + h * a.sq[1];
  const float* k = a.k + source * a.sk[0] + h * a.sk[1];
  const float* v = a.v + source * a.sv[0] + h * a.sv[1];
  const int64_t* index = a.index ? a.index + window * nk : nullptr;
  const float* mask = a.mask ? a.mask + b * a.sm[0] + h * a.sm[1] : nullptr;
  const float* key_mask = a.key_mask ? a.key_mask + window * a.skm : nullptr;
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t row = index ? index[j] : j;
    const float* kj = k + row * a.sk[2];
    vrow[j] = v + row * a.sv[2];
    for (int64_t c = 0; c < d; ++c) kt[c * np + j] = kj[c];
  }
  for (int64_t c = 0; c < d; ++c)
    for (int64_t j = nk; j < np; ++j) kt[c * np + j] = 0.f;
  float* out = a.out + (b * nq * a.heads + h) * d;
  float inv[kRows];
  for (int64_t i0 = 0; i0 < nq; i0 += kRows) {
    const int64_t rows = std::min(kRows, nq - i0);
    const float* qr[kRows];  // rows past nq repeat the last one (computed, not stored)
    for (int64_t r = 0; r < kRows; ++r) qr[r] = q + std::min(i0 + r, nq - 1) * a.sq[2];
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
        for (int64_t j = 0; j < nk; ++j) sr[j] += mr[j];
      }
      if (key_mask)
        for (int64_t j = 0; j < nk; ++j) sr[j] += key_mask[j];
      for (int64_t j = nk; j < np; ++j) sr[j] = -std::numeric_limits<float>::infinity();
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
      weighted_values<DB, 2>(vrow, nk, s + r * np, np, inv + r, out + (i0 + r) * so, so);
    if (r < rows)
      weighted_values<DB, 1>(vrow, nk, s + r * np, np, inv + r, out + (i0 + r) * so, so);
  }
}

template <int DB>
void window_heads(const Views& a, int64_t begin, int64_t end, float* scratch,
                  const float** vrow) {
  const int64_t np = (a.nk + 7) / 8 * 8;
  for (int64_t t = begin; t < end; ++t)
    window_head<DB>(a, t / a.heads, t % a.heads, scratch, scratch + 8 * DB * np, vrow);
}

// Runs every (window, head) of a on the threads and returns the merged output.
void run_windows(const Views& a, int64_t bw, int64_t d) {
  const int64_t np = (a.nk + 7) / 8 * 8;
  at::parallel_for(0, bw * a.heads, 1, [&](int64_t begin, int64_t end) {
    // keys transposed (d·np), scores (kRows·np); value rows (nk)
    std::vector<float> scratch(static_cast<size_t>(d * np + kRows * np));
    std::vector<const float*> vrow(static_cast<size_t>(a.nk));
    switch (d / 8) {
#define MMEFFVIT_WINDOW_CASE(DB) \
  case DB:                       \
    window_heads<DB>(a, begin, end, scratch.data(), vrow.data()); \
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
}

void check_head_dims(int64_t d) {
  TORCH_CHECK(d % 8 == 0 && d >= 8 && d <= 128, "window attention: head dims must be a "
              "multiple of 8 up to 128, got ", d);
}

void set_strides(int64_t* dst, const at::Tensor& t) {
  for (int i = 0; i < 3; ++i) dst[i] = t.stride(i);
}

}  // namespace

at::Tensor window_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& mask,
                                        double scale) {
  const int64_t bw = q.size(0), heads = q.size(1), n = q.size(2), d = q.size(3);
  check_head_dims(d);
  auto out = at::empty({bw, n, heads * d}, q.options());
  Views a{};
  a.q = q.const_data_ptr<float>();
  a.k = k.const_data_ptr<float>();
  a.v = v.const_data_ptr<float>();
  set_strides(a.sq, q);
  set_strides(a.sk, k);
  set_strides(a.sv, v);
  if (mask.defined()) {
    a.mask = mask.const_data_ptr<float>();
    set_strides(a.sm, mask);
  }
  a.heads = heads;
  a.nq = a.nk = n;
  a.scale = static_cast<float>(scale);
  a.out = out.data_ptr<float>();
  run_windows(a, bw, d);
  return out;
}

at::Tensor gathered_window_attention_forward_cpu(const at::Tensor& q, const at::Tensor& bank,
                                                 const at::Tensor& index, const at::Tensor& bias,
                                                 const at::Tensor& key_mask, double scale) {
  const int64_t bw = q.size(0), heads = q.size(1), nq = q.size(2), d = q.size(3);
  check_head_dims(d);
  const int64_t c = heads * d, rows = bank.size(1);
  auto out = at::empty({bw, nq, c}, q.options());
  Views a{};
  a.q = q.const_data_ptr<float>();
  set_strides(a.sq, q);
  // bank (B, M, 2, C): keys at [.., 0, ..], values at [.., 1, ..]; head h at channels h·d
  a.k = bank.const_data_ptr<float>();
  a.v = a.k + c;
  a.sk[0] = a.sv[0] = rows * 2 * c;
  a.sk[1] = a.sv[1] = d;
  a.sk[2] = a.sv[2] = 2 * c;
  a.index = index.const_data_ptr<int64_t>();
  a.windows = index.size(0);
  if (bias.defined()) {  // (h, nq, nk), the same for every window
    a.mask = bias.const_data_ptr<float>();
    a.sm[0] = 0;
    a.sm[1] = bias.stride(0);
    a.sm[2] = bias.stride(1);
  }
  if (key_mask.defined()) {
    a.key_mask = key_mask.const_data_ptr<float>();
    a.skm = key_mask.stride(0);
  }
  a.heads = heads;
  a.nq = nq;
  a.nk = index.size(1);
  a.scale = static_cast<float>(scale);
  a.out = out.data_ptr<float>();
  run_windows(a, bw, d);
  return out;
}

}  // namespace mmeffvit
