// Device-independent entry points: check the arguments once, then dispatch on the device.
#include "linear_attention.h"

#include <ATen/OpMathType.h>

namespace mmeffvit {
namespace {

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), name,
              " must be a floating-point tensor, got ", t.scalar_type());
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* an, const char* bn) {
  TORCH_CHECK(a.device() == b.device(), an, " and ", bn, " must be on the same device, got ",
              a.device(), " and ", b.device());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), an, " and ", bn,
              " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

bool on_cuda(const at::Tensor& t) {
  if (!t.is_cuda()) {
    TORCH_CHECK(t.is_cpu(), "mmeffvit ops run on CPU or CUDA tensors, got ", t.device());
    return false;
  }
#ifdef WITH_CUDA
  return true;
#else
  TORCH_CHECK(false, "mmeffvit._ext was built without CUDA; rebuild with FORCE_CUDA=1");
#endif
}

// unit stride in the last dim is all the kernels need (BLAS takes any row stride)
at::Tensor rows_ready(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

void check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "linear_attention expects q, k, v of shape (B, h, N, d), (B, h, n, d), "
              "(B, h, n, e); got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  check_float(q, "q");
  check_same(q, k, "q", "k");
  check_same(q, v, "q", "v");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "k must be (B, h, n, d) with B, h, d of q ", q.sizes(), ", got ", k.sizes());
  TORCH_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2),
              "v must be (B, h, n, e) with B, h, n of k ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK(k.size(2) > 0, "linear_attention needs at least one key");
}

at::Tensor check_temp(const c10::optional<at::Tensor>& temp, const at::Tensor& q) {
  if (!temp.has_value() || !temp->defined()) return at::Tensor();
  check_float(*temp, "temperature");
  TORCH_CHECK(temp->numel() == q.size(1), "temperature must have one entry per head (",
              q.size(1), "), got shape ", temp->sizes());
  TORCH_CHECK(temp->device() == q.device(), "temperature must be on ", q.device());
  return temp->reshape({q.size(1)});
}

void check_focused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& scale, int64_t heads) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "focused_linear_attention expects q, k, v of shape (B, N, C), (B, n, C), (B, n, Ce);"
              " got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  check_float(q, "q");
  check_same(q, k, "q", "k");
  check_same(q, v, "q", "v");
  TORCH_CHECK(q.is_cpu() && scale.is_cpu(),
              "the fused focused_linear_attention kernel runs on CPU tensors, got ", q.device());
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && v.size(0) == k.size(0) &&
                  v.size(1) == k.size(1),
              "shape mismatch: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(k.size(1) > 0, "focused_linear_attention needs at least one key");
  TORCH_CHECK(heads > 0 && q.size(2) % heads == 0 && v.size(2) % heads == 0,
              "channels ", q.size(2), " / ", v.size(2), " are not divisible by heads = ", heads);
  check_float(scale, "scale");
  TORCH_CHECK(scale.numel() == q.size(2), "scale must have C = ", q.size(2),
              " entries, got shape ", scale.sizes());
}

// The forward's (d x e) state and key sum as its backward reads them: on q's device, in q's
// accumulation type, of the forward's shapes, dense (the CUDA kernels index ksum directly).
// Unchecked, a state from another call or device is read out of bounds by a kernel.
void check_state(const at::Tensor& kv, const at::Tensor& ksum, const at::Tensor& q,
                 int64_t batch, int64_t heads, int64_t d, int64_t e) {
  const auto acc = at::toOpMathType(q.scalar_type());
  const std::pair<const at::Tensor*, const char*> state[] = {{&kv, "kv"}, {&ksum, "ksum"}};
  for (const auto& [t, name] : state) {
    TORCH_CHECK(t->defined() && t->device() == q.device(), name, " must be a tensor on ",
                q.device(), ", got ", t->defined() ? t->device() : q.device());
    TORCH_CHECK(t->scalar_type() == acc, name, " must have the forward's accumulation type ", acc,
                ", got ", t->scalar_type());
  }
  TORCH_CHECK(kv.sizes() == at::IntArrayRef({batch, heads, d, e}), "kv must have shape (",
              batch, ", ", heads, ", ", d, ", ", e, "), got ", kv.sizes());
  TORCH_CHECK(ksum.sizes() == at::IntArrayRef({batch, heads, d}), "ksum must have shape (",
              batch, ", ", heads, ", ", d, "), got ", ksum.sizes());
}

// the gradient of an output: on the input's device, floating, of the output's shape
void check_grad(const at::Tensor& g, const at::Tensor& like, at::IntArrayRef shape) {
  TORCH_CHECK(g.device() == like.device(), "grad must be on ", like.device(), ", got ",
              g.device());
  check_float(g, "grad");
  TORCH_CHECK(g.sizes() == shape, "grad must have shape ", shape, ", got ", g.sizes());
}

// the focusing function's input: (rows, C) floating, a scale of C entries on its device
void check_focus(const at::Tensor& x, const at::Tensor& scale, double p, const char* op) {
  TORCH_CHECK(x.dim() == 2, op, " expects x of shape (rows, C), got ", x.sizes());
  check_float(x, "x");
  check_float(scale, "scale");
  TORCH_CHECK(scale.numel() == x.size(1), "scale must have C = ", x.size(1),
              " entries, got shape ", scale.sizes());
  TORCH_CHECK(scale.device() == x.device(), "x and scale must be on the same device, got ",
              x.device(), " and ", scale.device());
  TORCH_CHECK(p > 0, "focusing factor must be positive, got ", p);
}

}  // namespace

std::vector<at::Tensor> focused_linear_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v,
                                                         const at::Tensor& scale, int64_t heads,
                                                         double p, double focus_eps, double eps) {
  check_focused(q, k, v, scale, heads);
  TORCH_CHECK(p > 0, "focusing factor must be positive, got ", p);
  return focused_linear_attention_forward_cpu(rows_ready(q), rows_ready(k), rows_ready(v),
                                              scale.reshape({-1}).contiguous(), heads, p,
                                              focus_eps, eps);
}

std::vector<at::Tensor> focused_linear_attention_backward(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& scale, const at::Tensor& kv, const at::Tensor& ksum, int64_t heads, double p,
    double focus_eps, double eps) {
  check_focused(q, k, v, scale, heads);
  TORCH_CHECK(g.sizes() == at::IntArrayRef({q.size(0), q.size(1), v.size(2)}) &&
                  g.scalar_type() == q.scalar_type(),
              "grad must be (B, N, Ce) of dtype ", q.scalar_type(), ", got ", g.sizes(), " ",
              g.scalar_type());
  check_grad(g, q, {q.size(0), q.size(1), v.size(2)});
  check_state(kv, ksum, q, q.size(0), heads, q.size(2) / heads, v.size(2) / heads);
  return focused_linear_attention_backward_cpu(rows_ready(g), rows_ready(q), rows_ready(k),
                                               rows_ready(v), scale.reshape({-1}).contiguous(),
                                               kv.contiguous(), ksum.contiguous(), heads, p,
                                               focus_eps, eps);
}

at::Tensor focused_linear_attention_backward_into(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& scale, const at::Tensor& kv, const at::Tensor& ksum, int64_t heads, double p,
    double focus_eps, double eps, const at::Tensor& dq, const at::Tensor& dk,
    const at::Tensor& dv) {
  check_focused(q, k, v, scale, heads);
  TORCH_CHECK(g.sizes() == at::IntArrayRef({q.size(0), q.size(1), v.size(2)}) &&
                  g.scalar_type() == q.scalar_type(),
              "grad must be (B, N, Ce) of dtype ", q.scalar_type(), ", got ", g.sizes(), " ",
              g.scalar_type());
  check_grad(g, q, {q.size(0), q.size(1), v.size(2)});
  check_state(kv, ksum, q, q.size(0), heads, q.size(2) / heads, v.size(2) / heads);
  // each output may be the tensor it is the gradient of (its rows are read before they are
  // written) but must not overlap anything else: the caller's contract, not checked here
  const std::pair<const at::Tensor*, const at::Tensor*> outs[] = {{&dq, &q}, {&dk, &k},
                                                                  {&dv, &v}};
  for (const auto& [out, of] : outs) {
    TORCH_CHECK(out->sizes() == of->sizes() && out->scalar_type() == of->scalar_type() &&
                    out->is_cpu() && out->stride(-1) == 1,
                "gradient outputs must have the shape and dtype of q, k, v with unit stride in "
                "the last dim, got ", out->sizes(), " ", out->scalar_type(), " for ", of->sizes());
  }
  for (const at::Tensor* in : {&q, &k, &v})
    TORCH_CHECK(in->stride(-1) == 1, "q, k, v need unit stride in the last dim here");
  return focused_linear_attention_backward_into_cpu(rows_ready(g), q, k, v,
                                                    scale.reshape({-1}).contiguous(),
                                                    kv.contiguous(), ksum.contiguous(),
                                                    heads, p, focus_eps, eps, dq, dk, dv);
}

bool compiled_with_cuda() {
#ifdef WITH_CUDA
  return true;
#else
  return false;
#endif
}

at::Tensor focus_forward(const at::Tensor& x, const at::Tensor& scale, double p, double eps) {
  check_focus(x, scale, p, "focus_forward");
  auto xc = x.contiguous();
  auto sc = scale.reshape({-1}).contiguous();
#ifdef WITH_CUDA
  if (on_cuda(x)) return focus_forward_cuda(xc, sc, p, eps);
#else
  on_cuda(x);
#endif
  return focus_forward_cpu(xc, sc, p, eps);
}

std::vector<at::Tensor> focus_backward(const at::Tensor& gy, const at::Tensor& x,
                                       const at::Tensor& scale, double p, double eps) {
  check_focus(x, scale, p, "focus_backward");
  check_grad(gy, x, x.sizes());
  auto gyc = gy.to(at::toOpMathType(x.scalar_type())).contiguous();
  auto xc = x.contiguous();
  auto sc = scale.reshape({-1}).contiguous();
#ifdef WITH_CUDA
  if (on_cuda(x)) return focus_backward_cuda(gyc, xc, sc, p, eps);
#else
  on_cuda(x);
#endif
  return focus_backward_cpu(gyc, xc, sc, p, eps);
}

std::vector<at::Tensor> linear_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v,
                                                 const c10::optional<at::Tensor>& temp,
                                                 int64_t mode, double eps, double clamp_min) {
  check_attention(q, k, v);
  TORCH_CHECK(mode == 0 || mode == 1, "mode must be 0 (mean) or 1 (clamped sum), got ", mode);
  auto t = check_temp(temp, q);
  auto qc = rows_ready(q), kc = rows_ready(k), vc = rows_ready(v);
#ifdef WITH_CUDA
  if (on_cuda(q)) return linear_attention_forward_cuda(qc, kc, vc, t, mode, eps, clamp_min);
#else
  on_cuda(q);
#endif
  return linear_attention_forward_cpu(qc, kc, vc, t, mode, eps, clamp_min);
}

std::vector<at::Tensor> linear_attention_backward(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& kv, const at::Tensor& ksum, const c10::optional<at::Tensor>& temp,
    int64_t mode, double eps, double clamp_min) {
  check_attention(q, k, v);
  TORCH_CHECK(g.dim() == 4, "grad must be (B, h, N, e), got ", g.sizes());
  check_grad(g, q, {q.size(0), q.size(1), q.size(2), v.size(3)});
  TORCH_CHECK(mode == 0 || mode == 1, "mode must be 0 (mean) or 1 (clamped sum), got ", mode);
  check_state(kv, ksum, q, q.size(0), q.size(1), q.size(3), v.size(3));
  auto t = check_temp(temp, q);
  auto gc = rows_ready(g), qc = rows_ready(q), kc = rows_ready(k), vc = rows_ready(v);
  auto kvc = kv.contiguous(), ksc = ksum.contiguous();
#ifdef WITH_CUDA
  if (on_cuda(q)) {
    return linear_attention_backward_cuda(gc, qc, kc, vc, kvc, ksc, t, mode, eps, clamp_min);
  }
#else
  on_cuda(q);
#endif
  return linear_attention_backward_cpu(gc, qc, kc, vc, kvc, ksc, t, mode, eps, clamp_min);
}

}  // namespace mmeffvit
