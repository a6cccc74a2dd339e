// Row-major GEMM for the CPU kernels, on the BLAS library torch is linked with.
//
// ATen's cpublas is not exported and dispatched ATen ops inside a parallel region fight over the
// threads (measured 8x slower on 2 cores), so the Fortran sgemm_/dgemm_ of the library torch
// loaded (MKL or OpenBLAS) is looked up at run time. Called inside at::parallel_for, MKL and
// OpenBLAS run single-threaded (for MKL this is enforced: see BlasThreadsInRegion). Naive loops
// are the fallback when no BLAS symbol is found.
#pragma once
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <cstdint>
#include <type_traits>

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

// Row-major C (M x N, ldc) = alpha op(A) op(B) + beta C, i.e. column-major C^T = op(B)^T op(A)^T.
template <typename acc_t>
void gemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, acc_t alpha, const acc_t* A,
             int64_t lda, const acc_t* B, int64_t ldb, acc_t beta, acc_t* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
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
