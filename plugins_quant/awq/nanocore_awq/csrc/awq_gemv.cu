// Decode GEMV for AutoAWQ GEMM int4 weights on the CUDA cores: y[m, n] = sum_k x[m, k] * (q[k, n] - z[g, n]) * s[g, n]
// for M = 1..4 rows, read in the checkpoint's own layout (qweight int32 [K, N/8], no repacking).
//
// Each thread owns WORDS packed words of a row (8 * WORDS output columns) and walks every K row of its split, so no
// cross-thread reduction is needed inside the K loop. A nibble is widened with one LOP3: shifted to mantissa
// bits 15-18 or 19-22 and OR-ed into 1.0f, it is the float 1 + q * 2^-8 or 1 + q * 2^-4 (exact; one shift serves
// two nibbles). The FMAs accumulate sum x * (1 + q * 2^-p) per group; subtracting the group's sum of x and scaling
// by 2^p gives sum x * q (the offset costs a few of fp32's 24 bits: far below bf16 rounding). Each group then adds
// s * (sum x*q - z * sum x). K is split over blockIdx.y; the last block of a column block to arrive sums the fp32
// partials (the same protocol as nanocore.toolkit.gemm.splitk_finish) and writes y (+ bias).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <int WORDS> struct Words;
template <> struct Words<1> { using type = uint32_t; };
template <> struct Words<2> { using type = uint2; };
template <> struct Words<4> { using type = uint4; };

template <int WORDS>
__device__ __forceinline__ void load_words(const uint32_t* p, uint32_t (&w)[WORDS]) {
  // streamed once: do not keep the weights in L1
  auto v = __ldcs(reinterpret_cast<const typename Words<WORDS>::type*>(p));
  static_assert(sizeof(v) == sizeof(w), "word count");
  memcpy(w, &v, sizeof(w));
}

// Nibble i of a word holds column kColumn[i] of its 8 (AutoAWQ's interleave [0, 2, 4, 6, 1, 3, 5, 7]).
__device__ constexpr int kColumn[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// The 8 nibbles of w as 1 + q * 2^-8 (even nibbles, moved to bits 15-18) or 1 + q * 2^-4 (odd, bits 19-22).
__device__ __forceinline__ void widen(uint32_t w, float (&v)[8]) {
  const uint32_t t[4] = {w << 15, w << 7, w >> 1, w >> 9};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = __uint_as_float((t[j] & 0x00078000u) | 0x3F800000u);
    v[2 * j + 1] = __uint_as_float((t[j] & 0x00780000u) | 0x3F800000u);
  }
}

template <typename T, int M, int WORDS, int UNROLL>
__global__ void __launch_bounds__(kThreads) awq_gemv_kernel(
    const T* __restrict__ x, int64_t ldx, const uint32_t* __restrict__ qweight, const uint32_t* __restrict__ qzeros,
    const T* __restrict__ scales, const T* __restrict__ bias, T* __restrict__ y, int64_t ldy,
    float* __restrict__ partials, int* __restrict__ counters, int n, int k, int group_size, int groups_per_split) {
  constexpr int COLS = 8 * WORDS;
  extern __shared__ float smem[];  // x of this split as fp32 [M][rows], then the sum of x per group [M][groups]
  const int nw = n / 8;
  const int word0 = (blockIdx.x * kThreads + threadIdx.x) * WORDS;
  const int groups = k / group_size;
  const int g_begin = blockIdx.y * groups_per_split;
  const int g_end = min(g_begin + groups_per_split, groups);
  const int rows = (g_end - g_begin) * group_size, row0 = g_begin * group_size;
  float* xs = smem;
  float* xsum = smem + M * rows;
  for (int i = threadIdx.x; i < M * rows; i += kThreads) {
    const int m = i / rows, r = i - m * rows;
    xs[i] = to_float(x[m * ldx + row0 + r]);
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for (int i = threadIdx.x / 32; i < M * (g_end - g_begin); i += kThreads / 32) {  // group sums, a warp each
    const int m = i / (g_end - g_begin), g = i - m * (g_end - g_begin);
    float s = 0.f;
    for (int r = lane; r < group_size; r += 32) s += xs[m * rows + g * group_size + r];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) xsum[i] = s;
  }
  __syncthreads();
  const bool active = word0 < nw;
  float total[M][COLS];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < COLS; ++c) total[m][c] = 0.f;
  const uint32_t* wp = qweight + (int64_t)row0 * nw + (active ? word0 : 0);
  for (int g = 0; g < g_end - g_begin; ++g) {
    float acc[M][COLS];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int c = 0; c < COLS; ++c) acc[m][c] = 0.f;
    for (int r0 = 0; r0 < group_size; r0 += UNROLL) {
      uint32_t w[UNROLL][WORDS];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) load_words<WORDS>(wp + (int64_t)(g * group_size + r0 + u) * nw, w[u]);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        float xv[M];
#pragma unroll
        for (int m = 0; m < M; ++m) xv[m] = xs[m * rows + g * group_size + r0 + u];
#pragma unroll
        for (int j = 0; j < WORDS; ++j) {
          float v[8];
          widen(w[u][j], v);
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[m][8 * j + i] = fmaf(xv[m], v[i], acc[m][8 * j + i]);
        }
      }
    }
    if (active) {  // this group's zero points and scales: s * (sum x*q - z * sum x)
      const int gg = g_begin + g;
#pragma unroll
      for (int j = 0; j < WORDS; ++j) {
        const uint32_t zw = qzeros[(int64_t)gg * nw + word0 + j];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int c = 8 * j + i;
          const float z = (float)((zw >> (4 * i)) & 0xFu);
          const float s = to_float(scales[(int64_t)gg * n + 8 * (word0 + j) + kColumn[i]]);
          const float unit = (i % 2 == 0) ? 256.f : 16.f;  // 2^8 for bits 15-18, 2^4 for bits 19-22
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const float sx = xsum[m * (g_end - g_begin) + g];
            total[m][c] = fmaf(s, (acc[m][c] - sx) * unit - z * sx, total[m][c]);
          }
        }
      }
    }
  }
  if (gridDim.y == 1) {
    if (!active) return;
#pragma unroll
    for (int j = 0; j < WORDS; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int col = 8 * (word0 + j) + kColumn[i];
        const float b = bias ? to_float(bias[col]) : 0.f;
#pragma unroll
        for (int m = 0; m < M; ++m) store(&y[m * ldy + col], total[m][8 * j + i] + b);
      }
    return;
  }
  if (active) {
#pragma unroll
    for (int j = 0; j < WORDS; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int m = 0; m < M; ++m)
          __stcg(&partials[((int64_t)blockIdx.y * M + m) * n + 8 * (word0 + j) + kColumn[i]], total[m][8 * j + i]);
  }
  __threadfence();  // this block's partials are visible before its arrival is counted
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // ready for the next launch (and graph replay)
  if (!active) return;
#pragma unroll
  for (int j = 0; j < WORDS; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int col = 8 * (word0 + j) + kColumn[i];
      const float b = bias ? to_float(bias[col]) : 0.f;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float sum = b;
        for (int split = 0; split < (int)gridDim.y; ++split) sum += __ldcg(&partials[((int64_t)split * M + m) * n + col]);
        store(&y[m * ldy + col], sum);
      }
    }
}

template <typename T, int M, int WORDS>
int launch(const void* x, int64_t ldx, const void* qweight, const void* qzeros, const void* scales, const void* bias,
           void* y, int64_t ldy, float* partials, int* counters, int n, int k, int group_size, int splits,
           int groups_per_split, cudaStream_t stream) {
  const int nw = n / 8;
  dim3 grid((nw / WORDS + kThreads - 1) / kThreads, splits);
  const int rows = groups_per_split * group_size;
  const size_t shared = sizeof(float) * M * (rows + groups_per_split);
  awq_gemv_kernel<T, M, WORDS, 8><<<grid, kThreads, shared, stream>>>(
      static_cast<const T*>(x), ldx, static_cast<const uint32_t*>(qweight), static_cast<const uint32_t*>(qzeros),
      static_cast<const T*>(scales), static_cast<const T*>(bias), static_cast<T*>(y), ldy, partials, counters, n, k,
      group_size, groups_per_split);
  return (int)cudaGetLastError();
}

template <typename T, int M>
int launch_words(int words, const void* x, int64_t ldx, const void* qweight, const void* qzeros, const void* scales,
                 const void* bias, void* y, int64_t ldy, float* partials, int* counters, int n, int k, int group_size,
                 int splits, int groups_per_split, cudaStream_t stream) {
#define NANOCORE_AWQ_LAUNCH(W) \
  return launch<T, M, W>(x, ldx, qweight, qzeros, scales, bias, y, ldy, partials, counters, n, k, group_size, splits, \
                         groups_per_split, stream)
  // M * WORDS <= 4: the fp32 accumulators (2 * M * 8 * WORDS) stay in registers
  if (words == 1) NANOCORE_AWQ_LAUNCH(1);
  if constexpr (M <= 2) {
    if (words == 2) NANOCORE_AWQ_LAUNCH(2);
  }
  if constexpr (M == 1) {
    if (words == 4) NANOCORE_AWQ_LAUNCH(4);
  }
#undef NANOCORE_AWQ_LAUNCH
  return -1;
}

template <typename T>
int launch_m(int m, int words, const void* x, int64_t ldx, const void* qweight, const void* qzeros,
             const void* scales, const void* bias, void* y, int64_t ldy, float* partials, int* counters, int n, int k,
             int group_size, int splits, int groups_per_split, cudaStream_t stream) {
#define NANOCORE_AWQ_M(M_) \
  return launch_words<T, M_>(words, x, ldx, qweight, qzeros, scales, bias, y, ldy, partials, counters, n, k, \
                             group_size, splits, groups_per_split, stream)
  switch (m) {
    case 1: NANOCORE_AWQ_M(1);
    case 2: NANOCORE_AWQ_M(2);
    case 3: NANOCORE_AWQ_M(3);
    case 4: NANOCORE_AWQ_M(4);
    default: return -1;
  }
#undef NANOCORE_AWQ_M
}

}  // namespace

// C entry point (ctypes). dtype: 0 = float16, 1 = bfloat16. Returns a cudaError_t, or -1 for an unsupported
// (m, words) pair. partials / counters may be null when splits == 1.
extern "C" int nanocore_awq_gemv(int dtype, int m, int words, const void* x, int64_t ldx, const void* qweight,
                                 const void* qzeros, const void* scales, const void* bias, void* y, int64_t ldy,
                                 float* partials, int* counters, int n, int k, int group_size, int splits,
                                 int groups_per_split, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == 0)
    return launch_m<__half>(m, words, x, ldx, qweight, qzeros, scales, bias, y, ldy, partials, counters, n, k,
                            group_size, splits, groups_per_split, s);
  if (dtype == 1)
    return launch_m<__nv_bfloat16>(m, words, x, ldx, qweight, qzeros, scales, bias, y, ldy, partials, counters, n, k,
                                   group_size, splits, groups_per_split, s);
  return -1;
}
