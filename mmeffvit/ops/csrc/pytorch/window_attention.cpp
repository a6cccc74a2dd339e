// Device-independent entry point of the window attention operator: argument checks, then the
// CPU implementation (other devices keep F.scaled_dot_product_attention, see the Python side).
#include "window_attention.h"

namespace mmeffvit {

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
  auto unit_last = [](const at::Tensor& t) { return t.size(-1) == 1 || t.stride(-1) == 1; };
  auto ready = [&](const at::Tensor& t) { return unit_last(t) ? t : t.contiguous(); };
  at::Tensor m;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kFloat && mask->device().is_cpu(),
                "window_attention expects a float32 CPU mask");
    const int64_t n = q.size(2);
    TORCH_CHECK(mask->dim() == 4 && mask->size(2) == n && mask->size(3) == n,
                "window_attention expects a mask (BW|1, h|1, n, n) with n = ", n, ", got ",
                mask->sizes());
    m = ready(mask->expand({q.size(0), q.size(1), n, n}));
  }
  return window_attention_forward_cpu(ready(q), ready(k), ready(v), m, scale);
}

}  // namespace mmeffvit
