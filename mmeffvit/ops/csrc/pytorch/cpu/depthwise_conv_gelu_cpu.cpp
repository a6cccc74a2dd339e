// CPU inference of PVT v2's ConvMlp middle: a 3x3 depthwise conv (stride 1, zero padding 1)
// and exact GELU on (B, H*W, C) tokens, in one pass.
//
// Why: the hidden map is wide (FLatten-PVTv2-B1 stage 1: 200 x 334 x 512, 137 MB) and the pass
// is bound by memory, where this pass beats oneDNN's depthwise conv with GELU fused
// (docs/ops.md): every
// output row is computed from three input rows with the next input columns prefetched, GELU
// in registers, and the output written by non-temporal stores (it is far larger than the
// caches, and the next layer reads it from memory anyway). The AVX-512 path has no
// auto-vectorised equivalent (erf); other CPUs get the plain loops below (std::erf).
//
// GELU(x) = x/2 (1 + erf(x / sqrt 2)); erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7,
// the approximation of ATen's vectorised erf) with exp(-z^2) by a degree-6 polynomial on
// [-ln2/2, ln2/2] and scalef: outputs within 1e-6 of the float64 conv + GELU, as close as
// oneDNN's and ATen's own.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../depthwise_conv.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MMEFFVIT_AVX512_GELU 1
#define MMEFFVIT_AVX512 __attribute__((target("avx512f")))
#endif

namespace mmeffvit {
namespace {

// the three input rows of an output row (nullptr: outside the map, zero padding)
struct RowTriple {
  const float* up;
  const float* mid;
  const float* down;
};

void row_plain(const RowTriple& rows, const float* w9c, const float* bias, float* out, int64_t W,
               int64_t C) {
  const float* r[3] = {rows.up, rows.mid, rows.down};
  for (int64_t x = 0; x < W; ++x)
    for (int64_t c = 0; c < C; ++c) {
      float acc = bias ? bias[c] : 0.f;
      for (int dy = 0; dy < 3; ++dy) {
        if (r[dy] == nullptr) continue;
        for (int dx = 0; dx < 3; ++dx) {
          const int64_t xx = x + dx - 1;
          if (xx >= 0 && xx < W) acc += w9c[(dy * 3 + dx) * C + c] * r[dy][xx * C + c];
        }
      }
      out[x * C + c] = 0.5f * acc * (1.f + std::erf(acc * 0.70710678118654752f));
    }
}

#ifdef MMEFFVIT_AVX512_GELU
// exp(x) for x <= 0 (erf needs exp(-z^2)): 2^n e^r, r = x - n ln2 in [-ln2/2, ln2/2]
MMEFFVIT_AVX512 inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2, split
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  for (const float coef : {1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(coef));
  return _mm512_scalef_ps(p, n);
}

MMEFFVIT_AVX512 inline __m512 gelu(__m512 x) {
  const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f));
  const __m512 az = _mm512_abs_ps(z);
  const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.f),
                                 _mm512_fmadd_ps(az, _mm512_set1_ps(0.3275911f),
                                                 _mm512_set1_ps(1.f)));
  __m512 p = _mm512_set1_ps(1.061405429f);
  for (const float coef : {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f})
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(coef));
  p = _mm512_mul_ps(p, t);
  const __m512 e = exp_nonpositive(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), az), az));
  const __m512 erf_abs = _mm512_fnmadd_ps(p, e, _mm512_set1_ps(1.f));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(z), _mm512_set1_epi32(0x80000000));
  const __m512 erf_z = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(erf_abs), sign));
  const __m512 half_x = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(half_x, erf_z, half_x);
}

// channels [c, c + 16) of output column x from input columns [x0, x1] (edge columns and the
// last partial vector of channels, which `mask` covers); `stream`: a non-temporal store
template <bool kUp, bool kDown>
MMEFFVIT_AVX512 inline void column(const RowTriple& rows, const float* w9c, const float* bias,
                                   float* out, int64_t C, int64_t x, int64_t x0, int64_t x1,
                                   int64_t c, __mmask16 mask, bool stream) {
  __m512 acc = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : _mm512_setzero_ps();
  for (int64_t xx = x0; xx <= x1; ++xx) {
    const int64_t dx = xx - x + 1;
    const int64_t at = xx * C + c;
    if (kUp)
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w9c + dx * C + c),
                            _mm512_maskz_loadu_ps(mask, rows.up + at), acc);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w9c + (3 + dx) * C + c),
                          _mm512_maskz_loadu_ps(mask, rows.mid + at), acc);
    if (kDown)
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w9c + (6 + dx) * C + c),
                            _mm512_maskz_loadu_ps(mask, rows.down + at), acc);
  }
  acc = gelu(acc);
  if (stream) {
    _mm512_stream_ps(out + x * C + c, acc);
  } else {
    _mm512_mask_storeu_ps(out + x * C + c, mask, acc);
  }
}

// the input column this many tokens ahead of the output column is prefetched from the row
// below (the only one not read for the previous output row; 2 measured best of 1-8)
constexpr int64_t kPrefetchColumns = 2;

template <bool kUp, bool kDown>
MMEFFVIT_AVX512 void row_avx512(const RowTriple& rows, const float* w9c, const float* bias,
                                float* out, int64_t W, int64_t C, bool stream) {
  const int64_t full = C / 16 * 16;  // channels in whole vectors
  for (int64_t x = 0; x < W; ++x) {
    const int64_t x0 = std::max<int64_t>(x - 1, 0), x1 = std::min<int64_t>(x + 1, W - 1);
    if (kDown && x + kPrefetchColumns < W) {
      const char* ahead = reinterpret_cast<const char*>(rows.down + (x + kPrefetchColumns) * C);
      for (int64_t byte = 0; byte < C * 4; byte += 64) _mm_prefetch(ahead + byte, _MM_HINT_T0);
    }
    if (x == 0 || x + 1 == W) {  // edge columns, masked
      for (int64_t c = 0; c < C; c += 16) {
        const __mmask16 mask = C - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (C - c)) - 1);
        column<kUp, kDown>(rows, w9c, bias, out, C, x, x0, x1, c, mask, stream && c < full);
      }
      continue;
    }
    float* o = out + x * C;
    for (int64_t c = 0; c < full; c += 16) {  // the 9 taps spelt out
      __m512 acc = bias ? _mm512_loadu_ps(bias + c) : _mm512_setzero_ps();
      const float* wc = w9c + c;
      const int64_t at = (x - 1) * C + c;
#define MMEFFVIT_TAP(row, tap, dx) \
  acc = _mm512_fmadd_ps(_mm512_loadu_ps(wc + (tap) * C), _mm512_loadu_ps(row + at + (dx) * C), acc)
      if (kUp) {
        MMEFFVIT_TAP(rows.up, 0, 0);
        MMEFFVIT_TAP(rows.up, 1, 1);
        MMEFFVIT_TAP(rows.up, 2, 2);
      }
      MMEFFVIT_TAP(rows.mid, 3, 0);
      MMEFFVIT_TAP(rows.mid, 4, 1);
      MMEFFVIT_TAP(rows.mid, 5, 2);
      if (kDown) {
        MMEFFVIT_TAP(rows.down, 6, 0);
        MMEFFVIT_TAP(rows.down, 7, 1);
        MMEFFVIT_TAP(rows.down, 8, 2);
      }
#undef MMEFFVIT_TAP
      acc = gelu(acc);
      if (stream) {
        _mm512_stream_ps(o + c, acc);
      } else {
        _mm512_storeu_ps(o + c, acc);
      }
    }
    if (full < C)
      column<kUp, kDown>(rows, w9c, bias, out, C, x, x0, x1, full,
                         __mmask16((1u << (C - full)) - 1), false);
  }
}

MMEFFVIT_AVX512 void sfence() { _mm_sfence(); }
#endif

constexpr int64_t kStreamBytes = int64_t(32) << 20;

}  // namespace

at::Tensor depthwise_conv3x3_gelu_cpu(const at::Tensor& x, const at::Tensor& weight,
                                      const at::Tensor& bias, int64_t H, int64_t W,
                                      bool vectorized) {
  const int64_t B = x.size(0), C = x.size(2);
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const at::Tensor w9c = weight.reshape({C, 9}).t().contiguous();  // (tap, C): channel rows
  const float* xp = x.data_ptr<float>();
  const float* wp = w9c.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t row = W * C;
#ifdef MMEFFVIT_AVX512_GELU
  const bool avx512 = vectorized && __builtin_cpu_supports("avx512f");
  // non-temporal stores write whole aligned 64-byte lines, and only pay for outputs larger than
  // the caches (stage 4 of B1, 25 x 42 x 2048, was slower with them)
  const bool stream = C % 16 == 0 && reinterpret_cast<uintptr_t>(op) % 64 == 0 &&
                      out.numel() * 4 >= kStreamBytes;
#else
  const bool avx512 = false;
#endif
  at::parallel_for(0, B * H, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t y = r % H;
      const float* mid = xp + r * row;
      const RowTriple rows{y > 0 ? mid - row : nullptr, mid, y + 1 < H ? mid + row : nullptr};
      float* o = op + r * row;
      if (!avx512) {
        row_plain(rows, wp, bp, o, W, C);
        continue;
      }
#ifdef MMEFFVIT_AVX512_GELU
      if (rows.up && rows.down) {
        row_avx512<true, true>(rows, wp, bp, o, W, C, stream);
      } else if (rows.up) {
        row_avx512<true, false>(rows, wp, bp, o, W, C, stream);
      } else if (rows.down) {
        row_avx512<false, true>(rows, wp, bp, o, W, C, stream);
      } else {
        row_avx512<false, false>(rows, wp, bp, o, W, C, stream);
      }
#endif
    }
#ifdef MMEFFVIT_AVX512_GELU
    if (avx512 && stream) sfence();  // the stores are visible before the caller reads `out`
#endif
  });
  return out;
}

}  // namespace mmeffvit
