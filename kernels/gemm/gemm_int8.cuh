// gemm_int8.cuh - launchers of the INT8 GEMM kernels (kernels/gemm_int8.cu and, for Hopper,
// kernels/gemm_int8_sm90.cu), called by the entry points after they validated every argument.
#pragma once

#include "kernels/gemm/int_gemm.cuh"

namespace ck {

// The launchers of kernels/gemm_int8.cu; cuda_kernels.cu picks one from the shape and the GPU.
// reference: simple shared-memory tiles and dp4a, any GPU; the baseline the others are tested on.
// mma:       mma.sync m16n8k32 tensor-core tiles fed by a cp.async pipeline (sm_80 and newer;
//            sm_75 runs the reference kernel instead).
// small_m:   m <= 16 and CK_LAYOUT_NK: streams the weight once at memory bandwidth, fragments
//            loaded straight from global memory (sm_80 and newer).
cudaError_t gemm_int8_reference(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_int8_mma(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_int8_small_m(const IntGemmArgs& args, cudaStream_t stream);

// Hopper (kernels/gemm_int8_sm90.cu). available(): this build has sm_90a code and the current
// device is compute capability 9.0. The launcher handles CK_LAYOUT_NK only.
bool gemm_int8_sm90_available();
cudaError_t gemm_int8_sm90(const IntGemmArgs& args, cudaStream_t stream);

// FP8 E4M3 x E4M3 with float32 sums (ck_gemm_fp8_scaled), on the same IntGemmArgs (a and b the
// E4M3 bytes, CK_LAYOUT_NK, a scaled epilogue): the reference kernel (gemm_fp8.cu: shared-memory
// tiles, float32 fma in k order), the small-M stream (mma.sync e4m3, sm_89 and newer) and the
// Hopper wgmma kernel (gemm_int8_sm90.cu). The entry point refuses GPUs before sm_89.
cudaError_t gemm_fp8_reference(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_fp8_small_m(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_fp8_sm90(const IntGemmArgs& args, cudaStream_t stream);

// W4A8 (ck_gemm_w4a8): a the E4M3 bytes, b packed symmetric INT4 [n, k / 2] with its group
// scales (IntGemmArgs::group_scales), a scaled epilogue without scale_b. The reference kernel and
// the small-M stream are FP8's, the codes converted to float32 or to E4M3 (int4_to_e4m3_x8) on
// their way in; on Hopper, gemm_w4a8_sm90.cu's kernel (the weight as wgmma's register operand).
cudaError_t gemm_w4a8_reference(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_w4a8_small_m(const IntGemmArgs& args, cudaStream_t stream);
cudaError_t gemm_w4a8_sm90(const IntGemmArgs& args, cudaStream_t stream);

// ck_int8_prepack (kernels/gemm_int8.cu): b_nk [n, k] = b_kn [k, n]^T, any GPU; k and n
// multiples of 16, both pointers 16-byte aligned.
cudaError_t int8_prepack(const int8_t* b_kn, int64_t k, int64_t n, int8_t* b_nk,
                         cudaStream_t stream);

}  // namespace ck
