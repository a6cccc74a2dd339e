// Python bindings of mmeffvit._ext (the one translation unit that includes pybind11).
#include <torch/extension.h>

#include "cpu/cpu_blas.h"
#include "depthwise_conv.h"
#include "linear_attention.h"
#include "window_attention.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("focus_forward", &mmeffvit::focus_forward, "focusing function forward", py::arg("x"),
        py::arg("scale"), py::arg("p"), py::arg("eps"));
  m.def("focus_backward", &mmeffvit::focus_backward, "focusing function backward",
        py::arg("grad"), py::arg("x"), py::arg("scale"), py::arg("p"), py::arg("eps"));
  m.def("linear_attention_forward", &mmeffvit::linear_attention_forward,
        "kv-first linear attention forward", py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("temperature"), py::arg("mode"), py::arg("eps"), py::arg("clamp_min"));
  m.def("linear_attention_backward", &mmeffvit::linear_attention_backward,
        "kv-first linear attention backward", py::arg("grad"), py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("kv"), py::arg("ksum"), py::arg("temperature"), py::arg("mode"),
        py::arg("eps"), py::arg("clamp_min"));
  m.def("focused_linear_attention_forward", &mmeffvit::focused_linear_attention_forward,
        "focusing function + kv-first linear attention forward (CPU)", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("heads"), py::arg("p"),
        py::arg("focus_eps"), py::arg("eps"));
  m.def("focused_linear_attention_backward", &mmeffvit::focused_linear_attention_backward,
        "focusing function + kv-first linear attention backward (CPU)", py::arg("grad"),
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("kv"),
        py::arg("ksum"), py::arg("heads"), py::arg("p"), py::arg("focus_eps"), py::arg("eps"));
  m.def("focused_linear_attention_backward_into",
        &mmeffvit::focused_linear_attention_backward_into,
        "focused_linear_attention_backward writing dq, dk, dv into given tensors, each may be "
        "the input it is the gradient of (CPU); returns dscale", py::arg("grad"), py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("kv"), py::arg("ksum"),
        py::arg("heads"), py::arg("p"), py::arg("focus_eps"), py::arg("eps"), py::arg("dq"),
        py::arg("dk"), py::arg("dv"));
  m.def("depthwise_conv_weight_grad", &mmeffvit::depthwise_conv_weight_grad,
        "weight gradient of a stride-1 depthwise conv on channels-last maps (CPU)",
        py::arg("input"), py::arg("grad"), py::arg("kh"), py::arg("kw"), py::arg("ph"),
        py::arg("pw"));
  m.def("window_attention_forward", &mmeffvit::window_attention_forward,
        "softmax attention in small windows, heads merged, inference (CPU)", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("scale"));
  m.def("gathered_window_attention_forward", &mmeffvit::gathered_window_attention_forward,
        "softmax attention of windows whose keys are gathered from a bank, heads merged, "
        "inference (CPU)", py::arg("q"), py::arg("bank"), py::arg("index"), py::arg("bias"),
        py::arg("key_mask"), py::arg("scale"));
  m.def("depthwise_conv3x3_gelu", &mmeffvit::depthwise_conv3x3_gelu,
        "gelu(3x3 depthwise conv + bias) on (B, H*W, C) float32 tokens, CPU inference",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("H"), py::arg("W"),
        py::arg("vectorized") = true);
  m.def("set_cpu_gemm", &mmeffvit::cpu::set_cpu_gemm,
        "the GEMM of the CPU kernels' block products: 'brgemm' (oneDNN's, through ATen), 'blas' "
        "or 'auto' (brgemm where ATen reports AVX-512); returns the one in use before",
        py::arg("name"));
  m.def("compiled_with_cuda", &mmeffvit::compiled_with_cuda, "whether CUDA kernels are built");
}
