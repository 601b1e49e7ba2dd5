// Instantiates the sm_90a FP8 GEMMs with fp16 output (its own translation unit so it compiles in parallel).
#include "fp8_gemm_sm90.cuh"

namespace nanocore_cutlass {

int fp8_gemm_sm90_fp16(int tile, const Fp8GemmArgs& args, size_t* workspace_bytes) {
  if (tile == 0) return dispatch<SmallMGemm<cutlass::half_t>>(args, workspace_bytes);
  return dispatch<LargeMGemm<cutlass::half_t>>(args, workspace_bytes);
}

}  // namespace nanocore_cutlass
