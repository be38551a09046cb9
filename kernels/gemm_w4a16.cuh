// gemm_w4a16.cuh - launchers of the weight-only INT4 GEMM (kernels/gemm_w4a16.cu), called by
// ck_gemm_w4a16 after it validated every argument.
#pragma once

#include "kernels/common.cuh"

namespace ck {

// One W4A16 call: out[m, n] = act(x[m, k] . w'[n, k]^T + bias[n]), w' = (q - zero) * scale
// rounded to dtype (fp16 or bf16), as ck_dequantize_int4 computes it.
struct GemmW4A16Args {
    const void* x;            // [m, k] dtype
    ck_dtype_t dtype;         // CK_DTYPE_FP16 or CK_DTYPE_BF16
    const uint8_t* w;         // [n, k / 2] packed int4
    const void* scales;       // [n, groups] dtype
    const uint8_t* zeros;     // [n, groups] uint8, or nullptr (symmetric)
    int64_t group_size;       // 32, 64, 128 or k (CK_GROUP_ROW is resolved to k)
    int64_t groups;           // groups per row
    const void* bias;         // [n] dtype, or nullptr
    ck_activation_t activation;
    int64_t m, n, k;          // k % 32 == 0
    void* out;                // [m, n] dtype
};

// The launchers. small_m: m <= 16, streams the weight once (sm_80+; returns
// cudaErrorNotSupported otherwise). reference: any m, any GPU, simple and obviously right.
cudaError_t gemm_w4a16_small_m(const GemmW4A16Args& args, cudaStream_t stream);
cudaError_t gemm_w4a16_reference(const GemmW4A16Args& args, cudaStream_t stream);

}  // namespace ck
