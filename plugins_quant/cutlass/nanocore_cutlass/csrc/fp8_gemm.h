// The torch-free interface between the binding (ops.cu) and the CUTLASS GEMM translation units.
#pragma once

#include <cuda_runtime.h>
#include <cstddef>

namespace nanocore_cutlass {

enum Fp8GemmStatus { kFp8GemmOk = 0, kFp8GemmCannotImplement = 1, kFp8GemmInitFailed = 2, kFp8GemmRunFailed = 3 };

// D[m, n] = a_scale[m] * b_scale[n] * sum_k A[m, k] * B[n, k]; A, B fp8 e4m3 row-major, D row-major.
struct Fp8GemmArgs {
  const void* a;
  const void* b;
  const float* a_scale;
  const float* b_scale;
  void* d;
  int m, n, k;
  void* workspace;
  cudaStream_t stream;
  int device_id;
  int sm_count;
};

// tile: 0 = small M, 1 = large M. With workspace_bytes non-null only the workspace size is computed.
int fp8_gemm_sm90_bf16(int tile, const Fp8GemmArgs& args, size_t* workspace_bytes);
int fp8_gemm_sm90_fp16(int tile, const Fp8GemmArgs& args, size_t* workspace_bytes);

}  // namespace nanocore_cutlass

namespace nanocore_cutlass {

enum InputType { kInputF32 = 0, kInputF16 = 1, kInputBF16 = 2 };

// Rows of x [m, k] (row stride x_row_stride elements) -> fp8 e4m3 out [m, k_padded] (zero padded) and
// float scales [m]: dynamic per-token amax / 448 when static_scale is null, else *static_scale for every row.
void quantize_fp8_rows(const void* x, int input_type, int m, int k, long long x_row_stride, void* out,
                       int k_padded, float* scales, const float* static_scale, cudaStream_t stream);

}  // namespace nanocore_cutlass
