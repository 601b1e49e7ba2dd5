// Activation quantization for the FP8 GEMM: one block per token row, amax -> scale -> e4m3, in one kernel.
// Same arithmetic as the torch twin (nanocore.quant_utils.quantize_fp8_per_row): scale = max(amax / 448, 1e-12),
// q = clamp(x / scale, -448, 448) rounded to nearest even.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cstdint>

#include "fp8_gemm.h"

namespace nanocore_cutlass {
namespace {

constexpr int kThreads = 256;
constexpr float kFp8Max = 448.0f;
constexpr float kMinScale = 1e-12f;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__global__ void quantize_rows_kernel(const T* __restrict__ x, int k, long long row_stride, uint8_t* __restrict__ out,
                                     int k_padded, float* __restrict__ scales, const float* __restrict__ static_scale) {
  const T* row = x + blockIdx.x * row_stride;
  __shared__ float shared_scale;
  if (static_scale == nullptr) {
    float amax = 0.0f;
    for (int i = threadIdx.x; i < k; i += kThreads) amax = fmaxf(amax, fabsf(to_float(row[i])));
    __shared__ float warp_max[kThreads / 32];
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, offset));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = 0.0f;
      for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
      shared_scale = fmaxf(m / kFp8Max, kMinScale);
    }
  } else if (threadIdx.x == 0) {
    shared_scale = *static_scale;
  }
  __syncthreads();
  const float scale = shared_scale;
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  uint8_t* out_row = out + static_cast<long long>(blockIdx.x) * k_padded;
  for (int i = threadIdx.x; i < k_padded; i += kThreads) {
    float v = i < k ? fminf(fmaxf(to_float(row[i]) / scale, -kFp8Max), kFp8Max) : 0.0f;
    out_row[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

void quantize_fp8_rows(const void* x, int input_type, int m, int k, long long x_row_stride, void* out,
                       int k_padded, float* scales, const float* static_scale, cudaStream_t stream) {
  if (m == 0) return;
  auto* q = static_cast<uint8_t*>(out);
  if (input_type == kInputBF16) {
    quantize_rows_kernel<<<m, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), k, x_row_stride, q,
                                                     k_padded, scales, static_scale);
  } else if (input_type == kInputF16) {
    quantize_rows_kernel<<<m, kThreads, 0, stream>>>(static_cast<const __half*>(x), k, x_row_stride, q, k_padded,
                                                     scales, static_scale);
  } else {
    quantize_rows_kernel<<<m, kThreads, 0, stream>>>(static_cast<const float*>(x), k, x_row_stride, q, k_padded,
                                                     scales, static_scale);
  }
}

}  // namespace nanocore_cutlass
