// FP8 e4m3 x e4m3 -> fp32 GEMM for sm_90a on a CUTLASS 3.x TMA warp-specialized kernel, with the
// per-token (row) x per-channel (column) scales applied in an EVT epilogue: D = a_scale[m] * (b_scale[n] * acc).
// Torch-free on purpose: these translation units are the slow ones to compile, and each builds in parallel.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "fp8_gemm.h"

namespace nanocore_cutlass {

using namespace cute;

template <class ElementD, class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct Fp8ScaledGemm {
  using ElementAB = cutlass::float_e4m3_t;
  using ElementAcc = float;
  // A = activations [M, K] row-major, B = weight [N, K] row-major (= K x N column-major): both K-major, as fp8 wgmma needs
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementAB>::value;  // 16 elements: K % 16
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;    // 8 elements: N % 8

  // EVT: b_scale (row vector over N) * acc, then a_scale (column vector over M) * that, rounded to ElementD
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  using ScaleB = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  using ScaleA = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, _0>>;
  using MulB = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                                      cutlass::FloatRoundStyle::round_to_nearest>;
  using MulA = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float,
                                                      cutlass::FloatRoundStyle::round_to_nearest>;
  using ScaledAcc = cutlass::epilogue::fusion::Sm90EVT<MulB, ScaleB, Acc>;
  using Epilogue = cutlass::epilogue::fusion::Sm90EVT<MulA, ScaleA, ScaledAcc>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float,
      void, LayoutD, kAlignD,  // no C operand: the bias is added outside
      ElementD, LayoutD, kAlignD, EpilogueSchedule, Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignAB, ElementAB, LayoutB,
      kAlignAB, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static size_t workspace_size(const Fp8GemmArgs& p) {
    auto args = make_arguments(p, nullptr);
    return Gemm::get_workspace_size(args);
  }

  static int run(const Fp8GemmArgs& p) {
    auto args = make_arguments(p, p.workspace);
    Gemm gemm;
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) return kFp8GemmCannotImplement;
    status = gemm.initialize(args, p.workspace, p.stream);
    if (status != cutlass::Status::kSuccess) return kFp8GemmInitFailed;
    status = gemm.run(p.stream);
    return status == cutlass::Status::kSuccess ? kFp8GemmOk : kFp8GemmRunFailed;
  }

 private:
  static typename Gemm::Arguments make_arguments(const Fp8GemmArgs& p, void* workspace) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    StrideA stride_a = cutlass::make_cute_packed_stride(StrideA{}, make_shape(p.m, p.k, 1));
    StrideB stride_b = cutlass::make_cute_packed_stride(StrideB{}, make_shape(p.n, p.k, 1));
    StrideD stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(p.m, p.n, 1));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, 1},
        {static_cast<const ElementAB*>(p.a), stride_a, static_cast<const ElementAB*>(p.b), stride_b},
        {{}, nullptr, stride_d, static_cast<ElementD*>(p.d), stride_d}};
    // tree arguments mirror the EVT: {ScaleA, {ScaleB, Acc, MulB}, MulA}
    args.epilogue.thread = {{p.a_scale}, {{p.b_scale}, {}, {}}, {}};
    args.hw_info.device_id = p.device_id;
    args.hw_info.sm_count = p.sm_count;
    return args;
  }
};

// Decode-sized M (<= 64): one 64-row tile, a 1x8 cluster multicasts the activations to 8 CTAs along N.
template <class ElementD>
using SmallMGemm = Fp8ScaledGemm<ElementD, Shape<_64, _64, _128>, Shape<_1, _8, _1>,
                                 cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                                 cutlass::epilogue::TmaWarpSpecialized>;
// Prefill: 128x128 tiles, ping-pong consumers overlap one tile's epilogue with the next tile's MMAs.
template <class ElementD>
using LargeMGemm = Fp8ScaledGemm<ElementD, Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                                 cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                                 cutlass::epilogue::TmaWarpSpecialized>;

// One tile config of one output type: workspace query (p.workspace ignored) or run.
template <class Gemm>
int dispatch(const Fp8GemmArgs& p, size_t* workspace_bytes) {
  if (workspace_bytes != nullptr) {
    *workspace_bytes = Gemm::workspace_size(p);
    return kFp8GemmOk;
  }
  return Gemm::run(p);
}

}  // namespace nanocore_cutlass
