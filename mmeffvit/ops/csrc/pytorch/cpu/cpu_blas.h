// Row-major GEMM for the CPU kernels: oneDNN's fp32 block-GEMM microkernel through ATen's
// exported `at::native::cpublas::brgemm` where ATen reports AVX-512, else the BLAS library torch
// is linked with.
//
// Why brgemm there: the kernels multiply cache-sized blocks (256 x 64 by 64 x 64), where MKL's
// sgemm_ takes its AVX2 path on AMD CPUs, at less than half brgemm's rate there, a transposed
// operand (copied first) included (docs/ops.md). The choice follows the rule of
// mmeffvit's linear layers (oneDNN on AVX-512 only) and set_cpu_gemm overrides it.
//
// ATen's cpublas::gemm is not exported and dispatched ATen ops inside a parallel region fight
// over the threads (measured 8x slower on 2 cores), so the Fortran sgemm_/dgemm_ of the library
// torch loaded (MKL or OpenBLAS) is looked up at run time. Called inside at::parallel_for, MKL and
// OpenBLAS run single-threaded (for MKL this is enforced: see BlasThreadsInRegion). Naive loops
// are the fallback when no BLAS symbol is found.
#pragma once
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/native/CPUBlas.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace mmeffvit {
namespace cpu {

using sgemm_t = void (*)(const char*, const char*, const int*, const int*, const int*,
                         const float*, const float*, const int*, const float*, const int*,
                         const float*, float*, const int*);
using dgemm_t = void (*)(const char*, const char*, const int*, const int*, const int*,
                         const double*, const double*, const int*, const double*, const int*,
                         const double*, double*, const int*);

inline void* find_blas(const char* lower, const char* upper) {
  void* torch_cpu = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  for (const char* name : {lower, upper}) {
    void* f = torch_cpu ? dlsym(torch_cpu, name) : nullptr;
    if (!f) f = dlsym(RTLD_DEFAULT, name);
    if (f) return f;
  }
  return nullptr;
}

// Inside a parallel region MKL must run on the calling thread only. It does so by itself while
// its "dynamic" mode is on, but torch.set_num_threads switches that off, and MKL then starts
// nested threads in every OpenMP thread (measured: 2x slower on 2 cores). MKL's thread-local
// setting fixes it for the duration of a call; other BLAS libraries are left alone.
class BlasThreadsInRegion {
 public:
  BlasThreadsInRegion() {
    using fn_t = int (*)(int);
    // the C entry point (by value); the lower-case name is MKL's Fortran one (by reference)
    static const auto set_local = reinterpret_cast<fn_t>(
        find_blas("MKL_Set_Num_Threads_Local", "MKL_Set_Num_Threads_Local"));
    if (set_local != nullptr && at::in_parallel_region()) {
      set_ = set_local;
      previous_ = set_local(1);
    }
  }
  ~BlasThreadsInRegion() {
    if (set_ != nullptr) set_(previous_);  // 0 restores the global setting
  }
  BlasThreadsInRegion(const BlasThreadsInRegion&) = delete;
  BlasThreadsInRegion& operator=(const BlasThreadsInRegion&) = delete;

 private:
  int (*set_)(int) = nullptr;
  int previous_ = 0;
};

template <typename acc_t>
bool blas_gemm(char ta, char tb, int m, int n, int k, acc_t alpha, const acc_t* a, int lda,
               const acc_t* b, int ldb, acc_t beta, acc_t* c, int ldc) {
  if constexpr (std::is_same_v<acc_t, float>) {
    static const auto f = reinterpret_cast<sgemm_t>(find_blas("sgemm_", "SGEMM"));
    if (f) f(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
    return f != nullptr;
  } else {
    static const auto f = reinterpret_cast<dgemm_t>(find_blas("dgemm_", "DGEMM"));
    if (f) f(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
    return f != nullptr;
  }
}

#ifdef CPUBLAS_BRGEMM_F32F32F32
constexpr bool kHasBrgemm = true;
#else
constexpr bool kHasBrgemm = false;
#endif

// 1: fp32 products on brgemm, 0: on BLAS; -1 until chosen (the default on first use)
inline std::atomic<int>& brgemm_state() {
  static std::atomic<int> state{-1};
  return state;
}

inline bool use_brgemm() {
  int s = brgemm_state().load(std::memory_order_relaxed);
  if (s < 0) {
    s = kHasBrgemm && at::get_cpu_capability().rfind("AVX512", 0) == 0;
    brgemm_state().store(s);
  }
  return s == 1;
}

// "brgemm", "blas" or "auto" (the default rule); returns the GEMM in use before the call
inline std::string set_cpu_gemm(const std::string& name) {
  const std::string before = use_brgemm() ? "brgemm" : "blas";
  TORCH_CHECK(name == "brgemm" || name == "blas" || name == "auto",
              "cpu gemm must be 'brgemm', 'blas' or 'auto', got '", name, "'");
  TORCH_CHECK(name != "brgemm" || kHasBrgemm,
              "this torch has no fp32 at::native::cpublas::brgemm");
  brgemm_state().store(name == "auto" ? -1 : name == "brgemm");
  return before;
}

// dst (cols x rows, ldd) = src^T, src (rows x cols, lds); in 16 x 16 tiles (a row-by-row
// transpose made the block product 4x slower than BLAS's own transposed path)
inline void transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst,
                      int64_t ldd) {
  constexpr int64_t kTile = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * ldd + r] = src[r * lds + c];
    }
}

// brgemm multiplies untransposed row-major operands, C = A B (+ C): a transposed operand is
// copied into a per-thread buffer first
inline void brgemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A,
                      int64_t lda, const float* B, int64_t ldb, bool add_c, float* C,
                      int64_t ldc) {
  thread_local std::vector<float> at_buf, bt_buf;
  if (ta) {  // A is stored K x M
    at_buf.resize(M * K);
    transpose(A, K, M, lda, at_buf.data(), K);
    A = at_buf.data();
    lda = K;
  }
  if (tb) {  // B is stored N x K
    bt_buf.resize(K * N);
    transpose(B, N, K, ldb, bt_buf.data(), N);
    B = bt_buf.data();
    ldb = N;
  }
#ifdef CPUBLAS_BRGEMM_F32F32F32
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add_c, A, B, C, false);
#endif
}

// Row-major C (M x N, ldc) = alpha op(A) op(B) + beta C, i.e. column-major C^T = op(B)^T op(A)^T.
template <typename acc_t>
void gemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, acc_t alpha, const acc_t* A,
             int64_t lda, const acc_t* B, int64_t ldb, acc_t beta, acc_t* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if constexpr (std::is_same_v<acc_t, float>) {
    // ATen keeps every brgemm kernel it generates, per thread (~140 KB each; many distinct
    // token counts grew RSS by tens of MiB, docs/ops.md): sizes off the 16-float vector grid,
    // such as the ragged last row block of a batch, stay on BLAS, so a thread holds few
    // kernels whatever the image sizes; the rule depends on the shape only (reproducible)
    const bool on_grid = M % 16 == 0 && N % 16 == 0 && K % 16 == 0;
    if (on_grid && alpha == 1.f && (beta == 0.f || beta == 1.f) && use_brgemm()) {
      const BlasThreadsInRegion single_threaded_in_region;  // for ATen's BLAS fallback
      brgemm_rm(ta, tb, M, N, K, A, lda, B, ldb, beta == 1.f, C, ldc);
      return;
    }
  }
  const BlasThreadsInRegion single_threaded_in_region;
  if (blas_gemm<acc_t>(tb ? 'T' : 'N', ta ? 'T' : 'N', N, M, K, alpha, B, ldb, A, lda, beta, C,
                       ldc)) {
    return;
  }
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

}  // namespace cpu
}  // namespace mmeffvit
