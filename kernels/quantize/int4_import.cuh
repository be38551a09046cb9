// int4_import.cuh - launchers of the checkpoint importers (kernels/int4_import.cu): GPTQ and AWQ
// 4-bit weights -> the interchange format, and the column gather of act-order activations.
// Called by the entry points in cuda_kernels.cu after they validated every argument.
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

struct Int4ImportArgs {
    const int32_t* qweight;  // GPTQ [k / 8, n], AWQ [k, n / 8]
    const int32_t* qzeros;   // [groups, n / 8]
    const void* scales;      // [groups, n] of dtype
    const int32_t* g_idx;    // GPTQ only: [k] or nullptr (groups of consecutive k)
    ck_dtype_t dtype;        // CK_DTYPE_FP16 or CK_DTYPE_BF16
    int64_t n, k;            // n % 8 == 0, k % 32 == 0
    int64_t group_size;      // resolved: 32, 64, 128, or k for CK_GROUP_ROW
    int64_t groups;          // ceil(k / group_size)
    uint8_t* w_out;          // [n, k / 2]
    void* scales_out;        // [n, groups] of dtype
    uint8_t* zeros_out;      // [n, groups]
    int32_t* perm;           // [k], written when g_idx is given (nullptr otherwise)
};

cudaError_t import_gptq(const Int4ImportArgs& args, cudaStream_t stream);

cudaError_t import_awq(const Int4ImportArgs& args, cudaStream_t stream);

// out[r][j] = x[r][perm[j]] for [rows, cols] matrices of dtype (fp32, fp16, bf16).
cudaError_t permute_columns(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                            const int32_t* perm, void* out, cudaStream_t stream);

}  // namespace ck
