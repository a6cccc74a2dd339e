// Device-independent entry points of the window attention operators: argument checks, then the
// CPU implementations (other devices keep F.scaled_dot_product_attention, see the Python side).
#include "window_attention.h"

namespace mmeffvit {
namespace {

// the kernels read rows with unit stride in the last dim; any other strides are read in place
at::Tensor unit_last_dim(const at::Tensor& t) {
  return t.size(-1) == 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

}  // namespace

at::Tensor window_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const c10::optional<at::Tensor>& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "window_attention expects q, k, v of one shape (BW, h, n, d), got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "window_attention runs on CPU tensors");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "window_attention expects float32 q, k, v");
  at::Tensor m;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kFloat && mask->device().is_cpu(),
                "window_attention expects a float32 CPU mask");
    const int64_t n = q.size(2);
    TORCH_CHECK(mask->dim() == 4 && mask->size(2) == n && mask->size(3) == n,
                "window_attention expects a mask (BW|1, h|1, n, n) with n = ", n, ", got ",
                mask->sizes());
    m = unit_last_dim(mask->expand({q.size(0), q.size(1), n, n}));
  }
  return window_attention_forward_cpu(unit_last_dim(q), unit_last_dim(k), unit_last_dim(v), m,
                                      scale);
}

at::Tensor gathered_window_attention_forward(const at::Tensor& q, const at::Tensor& bank,
                                             const at::Tensor& index,
                                             const c10::optional<at::Tensor>& bias,
                                             const c10::optional<at::Tensor>& key_mask,
                                             double scale) {
  TORCH_CHECK(q.dim() == 4 && bank.dim() == 4 && bank.size(2) == 2 &&
                  bank.size(3) == q.size(1) * q.size(3),
              "gathered_window_attention expects q (BW, h, nq, d) and a bank (B, M, 2, h·d), got ",
              q.sizes(), ", ", bank.sizes());
  TORCH_CHECK(index.dim() == 2 && index.scalar_type() == at::kLong && index.size(0) > 0 &&
                  q.size(0) == bank.size(0) * index.size(0),
              "gathered_window_attention expects an int64 index (nW, nk) with B·nW = ", q.size(0),
              " windows, got ", index.sizes(), " ", index.scalar_type(), " for B = ",
              bank.size(0));
  TORCH_CHECK(q.device().is_cpu() && bank.device().is_cpu() && index.device().is_cpu(),
              "gathered_window_attention runs on CPU tensors");
  TORCH_CHECK(q.scalar_type() == at::kFloat && bank.scalar_type() == at::kFloat,
              "gathered_window_attention expects float32 q and bank");
  const int64_t heads = q.size(1), nq = q.size(2), nk = index.size(1), rows = bank.size(1);
  TORCH_CHECK(nk > 0, "gathered_window_attention needs at least one key per window");
  const at::Tensor idx = index.contiguous();
  if (idx.numel() > 0) {  // every row is read unchecked by the kernel
    const auto range = at::aminmax(idx);
    const int64_t lo = std::get<0>(range).item<int64_t>(), hi = std::get<1>(range).item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < rows, "gathered_window_attention: index values must lie in [0, ",
                rows, "), got [", lo, ", ", hi, "]");
  }
  at::Tensor b, m;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->device().is_cpu() &&
                    bias->dim() == 3 && bias->size(1) == nq && bias->size(2) == nk,
                "gathered_window_attention expects a float32 CPU bias (h|1, ", nq, ", ", nk,
                "), got ", bias->sizes());
    b = unit_last_dim(bias->expand({heads, nq, nk}));
  }
  if (key_mask.has_value() && key_mask->defined()) {
    TORCH_CHECK(key_mask->scalar_type() == at::kFloat && key_mask->device().is_cpu() &&
                    key_mask->dim() == 2 && key_mask->size(1) == nk &&
                    (key_mask->size(0) == index.size(0) || key_mask->size(0) == 1),
                "gathered_window_attention expects a float32 CPU key mask (nW|1, ", nk,
                "), got ", key_mask->sizes());
    m = unit_last_dim(key_mask->expand({index.size(0), nk}));
  }
  return gathered_window_attention_forward_cpu(unit_last_dim(q), bank.contiguous(), idx, b, m,
                                               scale);
}

}  // namespace mmeffvit
