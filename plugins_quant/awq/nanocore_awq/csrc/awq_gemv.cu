// Decode GEMV for AutoAWQ GEMM int4 weights on the CUDA cores: y[m, n] = sum_k x[m, k] * (q[k, n] - z[g, n]) * s[g, n]
// for M = 1..4 rows, read in the checkpoint's own layout (qweight int32 [K, N/8], no repacking).
//
// Each thread owns WORDS packed words of a row (8 * WORDS output columns) and walks every K row of its split, so no
// cross-thread reduction is needed inside the K loop. A nibble is widened with one LOP3: shifted to mantissa
// bits 15-18 or 19-22 and OR-ed into 1.0f, it is the float 1 + q * 2^-8 or 1 + q * 2^-4 (exact; one shift serves
// two nibbles). The FMAs accumulate sum x * (1 + q * 2^-p) per group; subtracting the group's sum of x and scaling
// by 2^p gives sum x * q (the offset costs a few of fp32's 24 bits: far below bf16 rounding). Each group then adds
// s * (sum x*q - z * sum x). Weights are loaded UNROLL rows at a time, the next batch in flight while the current one
// is used. K is split over blockIdx.y: splits add into a zeroed fp32 buffer (vector atomics on sm_90), and the last
// block of a column block to arrive writes y (+ bias) and zeroes the buffer again for the next launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 8;  // K rows per batch; two batches in flight

__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Streamed weights (evict-first). volatile keeps a batch's loads together, ahead of the arithmetic that uses them.
template <int WORDS>
__device__ __forceinline__ void load_words(const uint32_t* p, uint32_t (&w)[WORDS]) {
  if constexpr (WORDS == 1) {
    asm volatile("ld.global.cs.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
  } else if constexpr (WORDS == 2) {
    asm volatile("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
  }
}

// (a & b) | c in one LOP3 (C's & and | with two constants become two: LOP3 takes one immediate).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Nibble i of a word holds column kColumn[i] of its 8 (AutoAWQ's interleave [0, 2, 4, 6, 1, 3, 5, 7]).
__device__ constexpr int kColumn[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// The 8 nibbles of w as 1 + q * 2^-8 (even nibbles, moved to bits 15-18) or 1 + q * 2^-4 (odd, bits 19-22).
__device__ __forceinline__ void widen(uint32_t w, uint32_t lo, uint32_t hi, uint32_t one, float (&v)[8]) {
  const uint32_t t[4] = {w << 15, w << 7, w >> 1, w >> 9};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = __uint_as_float(and_or(t[j], lo, one));
    v[2 * j + 1] = __uint_as_float(and_or(t[j], hi, one));
  }
}

template <int M, int WORDS>
struct Tile {  // one thread's accumulators: per group (acc, sum of x) and over its whole K split (total)
  float acc[M][8 * WORDS], total[M][8 * WORDS], sx[M];
};

template <int M, int WORDS>
__device__ __forceinline__ void fma_batch(Tile<M, WORDS>& t, const uint32_t (&w)[kUnroll][WORDS], const float* xs,
                                          int rows, int r0, uint32_t lo, uint32_t hi, uint32_t one) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    float xv[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      xv[m] = xs[m * rows + r0 + u];
      t.sx[m] += xv[m];
    }
#pragma unroll
    for (int j = 0; j < WORDS; ++j) {
      float v[8];
      widen(w[u][j], lo, hi, one, v);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int m = 0; m < M; ++m) t.acc[m][8 * j + i] = fmaf(xv[m], v[i], t.acc[m][8 * j + i]);
    }
  }
}

// Group g done: total += s * ((acc - sum x) * 2^p - z * sum x); acc and sum x restart.
template <typename T, int M, int WORDS>
__device__ __forceinline__ void close_group(Tile<M, WORDS>& t, const uint32_t* qzeros, const T* scales, int g, int n,
                                            int word0) {
  const int nw = n / 8;
#pragma unroll
  for (int j = 0; j < WORDS; ++j) {
    const uint32_t zw = qzeros[(int64_t)g * nw + word0 + j];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = 8 * j + i;
      const float z = (float)((zw >> (4 * i)) & 0xFu);
      const float s = to_float(scales[(int64_t)g * n + 8 * (word0 + j) + kColumn[i]]);
      const float unit = (i % 2 == 0) ? 256.f : 16.f;  // 2^8 for bits 15-18, 2^4 for bits 19-22
#pragma unroll
      for (int m = 0; m < M; ++m) {
        t.total[m][c] = fmaf(s, (t.acc[m][c] - t.sx[m]) * unit - z * t.sx[m], t.total[m][c]);
        t.acc[m][c] = 0.f;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) t.sx[m] = 0.f;
}

// y[m, 8 * (word0 + j) + c] = out[m][j][c] (+ bias), columns in natural order.
template <typename T, int M, int WORDS>
__device__ __forceinline__ void store_columns(T* y, int64_t ldy, const T* bias, int word0,
                                              const float (&out)[M][WORDS][8]) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < WORDS; ++j)
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int col = 8 * (word0 + j) + c;
        store(&y[m * ldy + col], out[m][j][c] + (bias ? to_float(bias[col]) : 0.f));
      }
}

__device__ __forceinline__ void add_to(float* p, const float (&v)[8]) {  // 8 consecutive fp32, 32-byte aligned
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
  atomicAdd(reinterpret_cast<float4*>(p) + 1, make_float4(v[4], v[5], v[6], v[7]));
#else
#pragma unroll
  for (int c = 0; c < 8; ++c) atomicAdd(p + c, v[c]);
#endif
}

template <typename T, int M, int WORDS>
__global__ void __launch_bounds__(kThreads) awq_gemv_kernel(
    const T* __restrict__ x, int64_t ldx, const uint32_t* __restrict__ qweight, const uint32_t* __restrict__ qzeros,
    const T* __restrict__ scales, const T* __restrict__ bias, T* __restrict__ y, int64_t ldy,
    float* __restrict__ accum, int* __restrict__ counters, int n, int k, int group_size, int rows_per_split) {
  extern __shared__ float xs[];  // x of this split as fp32 [M][rows]
  const int nw = n / 8;
  const int word0 = (blockIdx.x * kThreads + threadIdx.x) * WORDS;
  const int row0 = blockIdx.y * rows_per_split, rows = min(rows_per_split, k - row0);  // rows: a multiple of 16
  for (int i = threadIdx.x; i < M * rows; i += kThreads) {
    const int m = i / rows, r = i - m * rows;
    xs[i] = to_float(x[m * ldx + row0 + r]);
  }
  __syncthreads();
  const bool active = word0 < nw;
  const int word = active ? word0 : 0;  // threads past the last column read column 0 and store nothing
  Tile<M, WORDS> t;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    t.sx[m] = 0.f;
#pragma unroll
    for (int c = 0; c < 8 * WORDS; ++c) t.acc[m][c] = t.total[m][c] = 0.f;
  }
  uint32_t lo, hi, one;  // the masks and 1.0f live in registers: one LOP3 per nibble
  asm("mov.b32 %0, 0x00078000;" : "=r"(lo));
  asm("mov.b32 %0, 0x00780000;" : "=r"(hi));
  asm("mov.b32 %0, 0x3F800000;" : "=r"(one));
  const uint32_t* wp = qweight + (int64_t)row0 * nw + word;
  uint32_t a[kUnroll][WORDS], b[kUnroll][WORDS];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) load_words<WORDS>(wp + (int64_t)u * nw, a[u]);
  // a group closes at its last row or at the split's end (a split may hold part of a group: the sums are linear)
  for (int r0 = 0; r0 < rows; r0 += 2 * kUnroll) {  // rows is a multiple of 16: batches come in pairs
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load_words<WORDS>(wp + (int64_t)(r0 + kUnroll + u) * nw, b[u]);
    fma_batch<M, WORDS>(t, a, xs, rows, r0, lo, hi, one);  // no group ends here: groups are multiples of 16 rows
    if (r0 + 2 * kUnroll < rows) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load_words<WORDS>(wp + (int64_t)(r0 + 2 * kUnroll + u) * nw, a[u]);
    }
    fma_batch<M, WORDS>(t, b, xs, rows, r0 + kUnroll, lo, hi, one);
    if ((row0 + r0 + 2 * kUnroll) % group_size == 0 || r0 + 2 * kUnroll == rows)
      close_group<T, M, WORDS>(t, qzeros, scales, (row0 + r0 + kUnroll) / group_size, n, word);
  }
  // natural column order: column 8 * (word0 + j) + kColumn[i] holds nibble i
  float out[M][WORDS][8];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < WORDS; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) out[m][j][kColumn[i]] = t.total[m][8 * j + i];
  if (gridDim.y == 1) {
    if (active) store_columns<T, M, WORDS>(y, ldy, bias, word0, out);
    return;
  }
  if (active) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int j = 0; j < WORDS; ++j) add_to(&accum[(int64_t)m * n + 8 * (word0 + j)], out[m][j]);
  }
  __threadfence();  // this block's sums are in L2 before its arrival is counted
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // ready for the next launch (and graph replay)
  if (!active) return;
  float total[M][WORDS][8];  // all splits' sums
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < WORDS; ++j) {
      float4* p = reinterpret_cast<float4*>(&accum[(int64_t)m * n + 8 * (word0 + j)]);
      const float4 lo4 = __ldcg(p), hi4 = __ldcg(p + 1);
      total[m][j][0] = lo4.x, total[m][j][1] = lo4.y, total[m][j][2] = lo4.z, total[m][j][3] = lo4.w;
      total[m][j][4] = hi4.x, total[m][j][5] = hi4.y, total[m][j][6] = hi4.z, total[m][j][7] = hi4.w;
      p[0] = p[1] = make_float4(0.f, 0.f, 0.f, 0.f);  // zero again for the next launch
    }
  store_columns<T, M, WORDS>(y, ldy, bias, word0, total);
}

template <typename T, int M, int WORDS>
int launch(const void* x, int64_t ldx, const void* qweight, const void* qzeros, const void* scales, const void* bias,
           void* y, int64_t ldy, float* sums, int* counters, int n, int k, int group_size, int splits,
           int rows_per_split, cudaStream_t stream) {
  const int nw = n / 8;
  dim3 grid((nw / WORDS + kThreads - 1) / kThreads, splits);
  const size_t shared = sizeof(float) * M * rows_per_split;
  awq_gemv_kernel<T, M, WORDS><<<grid, kThreads, shared, stream>>>(
      static_cast<const T*>(x), ldx, static_cast<const uint32_t*>(qweight), static_cast<const uint32_t*>(qzeros),
      static_cast<const T*>(scales), static_cast<const T*>(bias), static_cast<T*>(y), ldy, sums, counters, n, k,
      group_size, rows_per_split);
  return (int)cudaGetLastError();
}

template <typename T, int M>
int launch_words(int words, const void* x, int64_t ldx, const void* qweight, const void* qzeros, const void* scales,
                 const void* bias, void* y, int64_t ldy, float* sums, int* counters, int n, int k, int group_size,
                 int splits, int rows_per_split, cudaStream_t stream) {
#define NANOCORE_AWQ_LAUNCH(W) \
  return launch<T, M, W>(x, ldx, qweight, qzeros, scales, bias, y, ldy, sums, counters, n, k, group_size, splits, \
                         rows_per_split, stream)
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
             const void* scales, const void* bias, void* y, int64_t ldy, float* sums, int* counters, int n, int k,
             int group_size, int splits, int rows_per_split, cudaStream_t stream) {
#define NANOCORE_AWQ_M(M_) \
  return launch_words<T, M_>(words, x, ldx, qweight, qzeros, scales, bias, y, ldy, sums, counters, n, k, \
                             group_size, splits, rows_per_split, stream)
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

// The message of a value nanocore_awq_gemv returned.
extern "C" const char* nanocore_awq_error_string(int err) {
  return err == -1 ? "unsupported dtype or (m, words) pair" : cudaGetErrorString(static_cast<cudaError_t>(err));
}

// C entry point (ctypes). dtype: 0 = float16, 1 = bfloat16. Returns a cudaError_t, or -1 for an unsupported
// (m, words) pair. With splits > 1, sums is a zeroed fp32 [m, n] buffer (left zeroed) and counters int32 zeros
// (one per column block, left at zero); both may be null when splits == 1. k, group_size and rows_per_split are
// multiples of 16.
extern "C" int nanocore_awq_gemv(int dtype, int m, int words, const void* x, int64_t ldx, const void* qweight,
                                 const void* qzeros, const void* scales, const void* bias, void* y, int64_t ldy,
                                 float* sums, int* counters, int n, int k, int group_size, int splits,
                                 int rows_per_split, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == 0)
    return launch_m<__half>(m, words, x, ldx, qweight, qzeros, scales, bias, y, ldy, sums, counters, n, k,
                            group_size, splits, rows_per_split, s);
  if (dtype == 1)
    return launch_m<__nv_bfloat16>(m, words, x, ldx, qweight, qzeros, scales, bias, y, ldy, sums, counters, n, k,
                                   group_size, splits, rows_per_split, s);
  return -1;
}
