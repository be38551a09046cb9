// gemm_int4.cuh - launchers of the INT4 x INT4 GEMM kernels (kernels/gemm_int4.cu), called by
// the entry points after they validated every argument.
#pragma once

#include "kernels/gemm/int_gemm.cuh"

namespace ck {

// One INT4 x INT4 GEMM call (IntGemmArgs, kernels/gemm/int_gemm.cuh; so make_epilogue and the epilogue):
//   a: [m, k / 2] packed bytes, b: [n, k / 2] packed bytes (b_layout is CK_LAYOUT_NK), both
//      reinterpreted as const uint8_t*: two's complement codes in [-8, 7], element 2i in the
//      low nibble of byte i; 16-byte aligned. k is the logical K: a multiple of 32, >= 32.
//   out_dtype CK_DTYPE_INT32 writes the exact int32 sums; otherwise the fused epilogue, bit for
//   bit what ck_gemm_int8_scaled computes on the unpacked int8 operands.
// reference: shared-memory tiles, nibbles unpacked one by one, dp4a; any GPU.
// mma:       cp.async pipeline of packed tiles, nibbles unpacked to int8 in registers, mma.sync
//            m16n8k32 s8 (sm_80 and newer; cudaErrorNotSupported below).
// small_m:   m <= 16: streams the packed weight once, straight from global memory into
//            registers, unpacked to int8 mma.sync m16n8k32 fragments; memory-bound (sm_80 and
//            newer; cudaErrorNotSupported below, or for m > 16).
// wgmma:     Hopper (gemm_int8_sm90.cu): TMA copies the packed tiles, warps unpack them to
//            int8 16 code in shared memory, wgmma s8 as the INT8 GEMM's (compute capability 9.0
//            with the sm_90a build, k <= kInt4SM90MaxK: cudaErrorNotSupported otherwise).
cudaError_t gemm_int4_reference(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_int4_mma(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_int4_small_m(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_int4_sm90(const IntGemmArgs& args, cudaStream_t stream);

// The longest row the wgmma kernel takes: its int32 sums of 16 a x 16 b stay below 2^31 (256 *
// 64 * K; K a multiple of 32).
constexpr int64_t kInt4SM90MaxK = 131040;

}  // namespace ck
