// Device-independent entry point of the depthwise convolution operators: argument checks, then
// the CPU implementation (CUDA callers keep cuDNN's depthwise kernels).
#include "depthwise_conv.h"

namespace mmeffvit {
namespace {

// channels-last rows of tokens: unit channel stride and each map row W consecutive tokens
bool token_rows(const at::Tensor& t) {
  return t.stride(1) == 1 && (t.size(2) == 1 || t.stride(2) == t.size(3) * t.stride(3));
}

}  // namespace

at::Tensor depthwise_conv_weight_grad(const at::Tensor& input, const at::Tensor& grad,
                                      int64_t kh, int64_t kw, int64_t ph, int64_t pw) {
  TORCH_CHECK(input.dim() == 4 && grad.dim() == 4,
              "depthwise_conv_weight_grad expects (B, C, H, W) input and grad, got ",
              input.sizes(), " and ", grad.sizes());
  TORCH_CHECK(input.device().is_cpu() && grad.device().is_cpu(),
              "depthwise_conv_weight_grad runs on CPU tensors");
  TORCH_CHECK(input.scalar_type() == grad.scalar_type() &&
                  (input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble),
              "depthwise_conv_weight_grad expects float32 or float64 input and grad of one dtype");
  TORCH_CHECK(kh > 0 && kw > 0 && ph >= 0 && pw >= 0, "bad kernel ", kh, "x", kw,
              " or padding ", ph, ", ", pw);
  const int64_t ho = input.size(2) + 2 * ph - kh + 1, wo = input.size(3) + 2 * pw - kw + 1;
  TORCH_CHECK(grad.size(0) == input.size(0) && grad.size(1) == input.size(1) &&
                  grad.size(2) == ho && grad.size(3) == wo,
              "grad must be (B, C, ", ho, ", ", wo, ") for input ", input.sizes(), ", got ",
              grad.sizes());
  auto ready = [](const at::Tensor& t) {
    return token_rows(t) ? t : t.contiguous(at::MemoryFormat::ChannelsLast);
  };
  return depthwise_conv_weight_grad_cpu(ready(input), ready(grad), kh, kw, ph, pw);
}

at::Tensor depthwise_conv3x3_gelu(const at::Tensor& x, const at::Tensor& weight,
                                  const c10::optional<at::Tensor>& bias, int64_t H, int64_t W,
                                  bool vectorized) {
  TORCH_CHECK(x.dim() == 3 && x.device().is_cpu() && x.scalar_type() == at::kFloat,
              "depthwise_conv3x3_gelu expects float32 CPU tokens (B, H*W, C), got ", x.sizes(),
              " ", x.scalar_type(), " on ", x.device());
  TORCH_CHECK(H > 0 && W > 0 && x.size(1) == H * W, x.size(1), " tokens do not form the grid ",
              H, "x", W);
  const int64_t C = x.size(2);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.device().is_cpu() &&
                  weight.dim() == 4 && weight.size(0) == C && weight.size(1) == 1 &&
                  weight.size(2) == 3 && weight.size(3) == 3,
              "weight must be float32 (", C, ", 1, 3, 3) on the CPU, got ", weight.sizes(), " ",
              weight.scalar_type());
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->device().is_cpu() &&
                    bias->numel() == C,
                "bias must be float32 with ", C, " elements on the CPU, got ", bias->sizes());
    b = bias->contiguous();
  }
  return depthwise_conv3x3_gelu_cpu(x.contiguous(), weight, b, H, W, vectorized);
}

}  // namespace mmeffvit
