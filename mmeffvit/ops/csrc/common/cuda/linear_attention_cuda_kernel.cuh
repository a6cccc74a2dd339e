// CUDA kernels of the focusing function and the row-wise part of kv-first linear attention.
// One warp handles one row (a token): channels are strided over the 32 lanes and the row sums
// (norms, dot products) are warp reductions, accumulated in acc_t (fp32, fp64 for double).
#pragma once
#include <cuda_runtime.h>

namespace mmeffvit {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <typename acc_t>
__device__ __forceinline__ acc_t pow_pos(acc_t t, acc_t p) {  // t > 0 (ReLU + eps)
  return p == acc_t(3) ? t * t * t : pow(t, p);
}

// y = u * |t| / |u| with t = (relu(x) + eps) * inv_sp, u = t**p (FLatten eq. 5-6).
template <typename scalar_t, typename acc_t>
__global__ void focus_forward_kernel(const scalar_t* __restrict__ x,
                                     const acc_t* __restrict__ inv_sp, acc_t* __restrict__ y,
                                     int64_t rows, int64_t C, acc_t p, acc_t eps) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const scalar_t* xr = x + r * C;
    acc_t n1 = 0, n2 = 0;
    for (int64_t c = lane; c < C; c += 32) {
      acc_t xv = static_cast<acc_t>(xr[c]);
      acc_t t = ((xv > acc_t(0) ? xv : acc_t(0)) + eps) * inv_sp[c];
      acc_t u = pow_pos(t, p);
      n1 += t * t;
      n2 += u * u;
      y[r * C + c] = u;
    }
    n1 = warp_sum(n1);
    n2 = warp_sum(n2);
    const acc_t ratio = sqrt(n1) / sqrt(n2);
    for (int64_t c = lane; c < C; c += 32) y[r * C + c] *= ratio;
  }
}

// Gradient of the focusing function; dL/dsoftplus per channel is summed per block in shared
// memory (C <= 1024 * 8 / warps) and added to gsp with one atomicAdd per channel and block.
template <typename scalar_t, typename acc_t>
__global__ void focus_backward_kernel(const acc_t* __restrict__ gy, const scalar_t* __restrict__ x,
                                      const acc_t* __restrict__ inv_sp, scalar_t* __restrict__ gx,
                                      acc_t* __restrict__ gsp, int64_t rows, int64_t C, acc_t p,
                                      acc_t eps) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* part = reinterpret_cast<acc_t*>(smem_raw);  // (warps per block, C)
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t c = threadIdx.x; c < (int64_t)nw * C; c += blockDim.x) part[c] = 0;
  __syncthreads();
  acc_t* mine = part + (int64_t)wid * C;
  const int64_t warps = (int64_t)gridDim.x * nw;
  for (int64_t r = (int64_t)blockIdx.x * nw + wid; r < rows; r += warps) {
    const scalar_t* xr = x + r * C;
    const acc_t* gr = gy + r * C;
    acc_t n1 = 0, n2 = 0, S = 0;
    for (int64_t c = lane; c < C; c += 32) {
      acc_t xv = static_cast<acc_t>(xr[c]);
      acc_t t = ((xv > acc_t(0) ? xv : acc_t(0)) + eps) * inv_sp[c];
      acc_t u = pow_pos(t, p);
      n1 += t * t;
      n2 += u * u;
      S += gr[c] * u;
    }
    n1 = warp_sum(n1);
    n2 = warp_sum(n2);
    S = warp_sum(S);
    const acc_t l1 = sqrt(n1), l2 = sqrt(n2);
    const acc_t ratio = l1 / l2, cu = ratio * S / n2, ct = S / (l1 * l2);
    for (int64_t c = lane; c < C; c += 32) {
      acc_t xv = static_cast<acc_t>(xr[c]);
      acc_t t = ((xv > acc_t(0) ? xv : acc_t(0)) + eps) * inv_sp[c];
      acc_t u = pow_pos(t, p);
      acc_t dpow = p == acc_t(3) ? acc_t(3) * t * t : p * pow(t, p - acc_t(1));
      acc_t dt = (ratio * gr[c] - cu * u) * dpow + ct * t;
      gx[r * C + c] = static_cast<scalar_t>(xv > acc_t(0) ? dt * inv_sp[c] : acc_t(0));
      mine[c] -= dt * t;
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    acc_t s = 0;
    for (int w = 0; w < nw; ++w) s += part[(int64_t)w * C + c];
    atomicAdd(gsp + c, s);
  }
}

// out_i = tau_h * num_i / den_i, den_i = q_i.m + eps (mode 0) or max(q_i.m, clamp_min) (mode 1).
// q: (BH rows-major blocks) addressed as q + b*qsb + h*qsh + i*qsn; num is contiguous (BH, N, e).
template <typename scalar_t, typename acc_t>
__global__ void attention_rows_forward_kernel(
    const scalar_t* __restrict__ q, const acc_t* __restrict__ num, const acc_t* __restrict__ m,
    const acc_t* __restrict__ tau, scalar_t* __restrict__ out, int64_t H, int64_t N, int64_t d,
    int64_t e, int64_t qsb, int64_t qsh, int64_t qsn, int64_t osb, int64_t osh, int64_t osn,
    int64_t rows, int mode, acc_t eps, acc_t clamp_min) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const int64_t bh = r / N, i = r % N, b = bh / H, h = bh % H;
    const scalar_t* qr = q + b * qsb + h * qsh + i * qsn;
    const acc_t* mr = m + bh * d;
    acc_t qm = 0;
    for (int64_t c = lane; c < d; c += 32) qm += static_cast<acc_t>(qr[c]) * mr[c];
    qm = warp_sum(qm);
    const acc_t den = mode == 0 ? qm + eps : (qm >= clamp_min ? qm : clamp_min);
    const acc_t f = tau[h] / den;
    scalar_t* orow = out + b * osb + h * osh + i * osn;
    for (int64_t c = lane; c < e; c += 32) orow[c] = static_cast<scalar_t>(num[r * e + c] * f);
  }
}

// Backward rows: P = g KV^T (contiguous (BH, N, d)) -> dq; gs = tau g / den (contiguous);
// coef_i = dden_i (for dm = sum_i coef_i q_i) and sden_i = (g_i . num_i) / den_i (for dtau).
template <typename scalar_t, typename acc_t>
__global__ void attention_rows_backward_kernel(
    const scalar_t* __restrict__ q, const acc_t* __restrict__ g, const acc_t* __restrict__ P,
    const acc_t* __restrict__ m, const acc_t* __restrict__ tau, scalar_t* __restrict__ dq,
    acc_t* __restrict__ gs, acc_t* __restrict__ coef, acc_t* __restrict__ sden, int64_t H,
    int64_t N, int64_t d, int64_t e, int64_t qsb, int64_t qsh, int64_t qsn, int64_t dsb,
    int64_t dsh, int64_t dsn, int64_t rows, int mode, acc_t eps, acc_t clamp_min) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const int64_t bh = r / N, i = r % N, b = bh / H, h = bh % H;
    const scalar_t* qr = q + b * qsb + h * qsh + i * qsn;
    const acc_t* mr = m + bh * d;
    const acc_t* pr = P + r * d;
    acc_t qm = 0, s = 0;
    for (int64_t c = lane; c < d; c += 32) {
      const acc_t qv = static_cast<acc_t>(qr[c]);
      qm += qv * mr[c];
      s += qv * pr[c];
    }
    qm = warp_sum(qm);
    s = warp_sum(s);
    const bool pass = mode == 0 || qm >= clamp_min;
    const acc_t inv = acc_t(1) / (mode == 0 ? qm + eps : (pass ? qm : clamp_min));
    const acc_t t = tau[h];
    const acc_t dden = pass ? -t * s * inv * inv : acc_t(0);
    scalar_t* dr = dq + b * dsb + h * dsh + i * dsn;
    for (int64_t c = lane; c < d; c += 32) dr[c] = static_cast<scalar_t>(t * inv * pr[c] + dden * mr[c]);
    for (int64_t c = lane; c < e; c += 32) gs[r * e + c] = g[r * e + c] * t * inv;
    if (lane == 0) {
      coef[r] = dden;
      sden[r] = s * inv;
    }
  }
}

}  // namespace mmeffvit
