// Python bindings: torch tensors in, checked, dispatched to the torch-free CUDA translation units.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <array>

#include "fp8_gemm.h"

namespace {

// Up to this many rows the 64-row tile with a 1x8 cluster wins (decode); above, 128x128 tiles.
constexpr int64_t kSmallM = 64;

int input_type_of(const torch::Tensor& x) {
  if (x.scalar_type() == torch::kBFloat16) return nanocore_cutlass::kInputBF16;
  if (x.scalar_type() == torch::kHalf) return nanocore_cutlass::kInputF16;
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "cutlass: activations must be bfloat16, float16 or float32, got ",
              x.scalar_type());
  return nanocore_cutlass::kInputF32;
}

// Persistent kernels size their grid by the SM count; cached since the attribute query is not free.
int sm_count(int device) {
  static std::array<int, 64> counts{};
  TORCH_CHECK(device >= 0 && device < static_cast<int>(counts.size()), "cutlass: device index out of range");
  if (counts[device] == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device));
  }
  return counts[device];
}

}  // namespace

// x [M, K] -> (fp8 [M, k_padded] zero padded, float scales [M, 1]); static_scale: a one-element float tensor or None.
std::vector<torch::Tensor> quantize_fp8_rows(torch::Tensor x, int64_t k_padded, c10::optional<torch::Tensor> static_scale) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.stride(1) == 1, "cutlass: x must be a CUDA [M, K] tensor with unit column stride");
  TORCH_CHECK(k_padded >= x.size(1) && k_padded % 16 == 0, "cutlass: k_padded must be a multiple of 16 >= K");
  const c10::cuda::CUDAGuard guard(x.device());
  auto q = torch::empty({x.size(0), k_padded}, x.options().dtype(torch::kFloat8_e4m3fn));
  auto scales = torch::empty({x.size(0), 1}, x.options().dtype(torch::kFloat));
  const float* static_ptr = nullptr;
  if (static_scale.has_value()) {
    TORCH_CHECK(static_scale->is_cuda() && static_scale->scalar_type() == torch::kFloat && static_scale->numel() == 1,
                "cutlass: input_scale must be a one-element float32 CUDA tensor");
    static_ptr = static_scale->data_ptr<float>();
  }
  nanocore_cutlass::quantize_fp8_rows(x.data_ptr(), input_type_of(x), x.size(0), x.size(1), x.stride(0), q.data_ptr(),
                                      k_padded, scales.data_ptr<float>(), static_ptr,
                                      c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {q, scales};
}

// a [M, K] fp8, b [N, K] fp8, a_scale [M] float, b_scale [N] float -> a_scale * b_scale * (a @ b^T) in out_dtype.
torch::Tensor fp8_scaled_mm(torch::Tensor a, torch::Tensor b, torch::Tensor a_scale, torch::Tensor b_scale,
                            c10::ScalarType out_dtype) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 2 && b.dim() == 2, "cutlass: a and b must be 2-D CUDA tensors");
  TORCH_CHECK(a.scalar_type() == torch::kFloat8_e4m3fn && b.scalar_type() == torch::kFloat8_e4m3fn,
              "cutlass: a and b must be float8_e4m3fn");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "cutlass: a and b must be contiguous (row-major, K-major)");
  TORCH_CHECK(a.size(1) == b.size(1), "cutlass: a has K=", a.size(1), " but b has K=", b.size(1));
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  TORCH_CHECK(k % 16 == 0 && n % 8 == 0, "cutlass: K must be a multiple of 16 and N of 8 (pad the weight), got K=", k,
              " N=", n);
  TORCH_CHECK(a_scale.scalar_type() == torch::kFloat && b_scale.scalar_type() == torch::kFloat &&
                  a_scale.is_contiguous() && b_scale.is_contiguous() && a_scale.numel() == m && b_scale.numel() == n,
              "cutlass: scales must be contiguous float32 with M and N elements");
  TORCH_CHECK(out_dtype == torch::kBFloat16 || out_dtype == torch::kHalf, "cutlass: out_dtype must be bf16 or fp16");
  const c10::cuda::CUDAGuard guard(a.device());
  auto d = torch::empty({m, n}, a.options().dtype(out_dtype));
  if (m == 0) return d;
  nanocore_cutlass::Fp8GemmArgs args{a.data_ptr(), b.data_ptr(), a_scale.data_ptr<float>(), b_scale.data_ptr<float>(),
                                     d.data_ptr(), static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                     nullptr, c10::cuda::getCurrentCUDAStream(), a.get_device(),
                                     sm_count(a.get_device())};
  auto gemm = out_dtype == torch::kBFloat16 ? nanocore_cutlass::fp8_gemm_sm90_bf16 : nanocore_cutlass::fp8_gemm_sm90_fp16;
  const int tile = m <= kSmallM ? 0 : 1;
  size_t workspace_bytes = 0;
  gemm(tile, args, &workspace_bytes);
  torch::Tensor workspace;  // from torch's caching allocator, so CUDA-graph capture works
  if (workspace_bytes > 0) {
    workspace = torch::empty({static_cast<int64_t>(workspace_bytes)}, a.options().dtype(torch::kUInt8));
    args.workspace = workspace.data_ptr();
  }
  const int status = gemm(tile, args, nullptr);
  TORCH_CHECK(status == nanocore_cutlass::kFp8GemmOk, "cutlass: the sm_90a FP8 GEMM failed (status ", status,
              ": 1 cannot implement, 2 init, 3 run) for M=", m, " N=", n, " K=", k);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quantize_fp8_rows", &quantize_fp8_rows, "fp8 e4m3 rows + per-row float scales (dynamic or static)");
  m.def("fp8_scaled_mm", &fp8_scaled_mm, "a_scale[m] * b_scale[n] * (a @ b^T) on the CUTLASS sm_90a kernel");
}
