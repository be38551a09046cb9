// quantize.cuh - launchers of the quantization kernels (kernels/quantize/quantize.cu: INT8, FP8,
// packed INT4), called by the entry points in cuda_kernels.cu after they validated every argument.
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/core/fp8.cuh"

namespace ck {

cudaError_t quantize_int8(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                          ck_granularity_t granularity, ck_scale_mode_t mode, float* scales,
                          int8_t* q, cudaStream_t stream);

cudaError_t dequantize_int8(const int8_t* q, const float* scales, int64_t rows, int64_t cols,
                            ck_granularity_t granularity, void* out, ck_dtype_t dtype,
                            cudaStream_t stream);

// The scales of an FP8 [rows, cols] tensor under a granularity: a [rows, cols] grid of them
// (1 x 1 per tensor, rows x 1 per row, blocks of kFp8Block: fp8.cuh). Host code; no overflow
// (the entry points check the product).
struct ScaleGrid {
    int64_t rows, cols;
};
inline ScaleGrid fp8_scale_grid(int64_t rows, int64_t cols, ck_granularity_t granularity) {
    const int64_t block_rows = rows / kFp8Block + (rows % kFp8Block != 0);
    const int64_t block_cols = cols / kFp8Block + (cols % kFp8Block != 0);
    switch (granularity) {
        case CK_PER_ROW: return {rows, 1};
        case CK_PER_BLOCK_1X128: return {rows, block_cols};
        case CK_PER_BLOCK_128X128: return {block_rows, block_cols};
        default: return {1, 1};
    }
}

cudaError_t quantize_fp8(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                         ck_fp8_format_t format, ck_granularity_t granularity,
                         ck_scale_mode_t mode, float* scales, uint8_t* q, cudaStream_t stream);

cudaError_t dequantize_fp8(const uint8_t* q, ck_fp8_format_t format, const float* scales,
                           int64_t rows, int64_t cols, ck_granularity_t granularity, void* out,
                           ck_dtype_t dtype, cudaStream_t stream);

cudaError_t quantize_int4(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                          int64_t group_size, ck_int4_mode_t mode, uint8_t* q, void* scales,
                          uint8_t* zeros, cudaStream_t stream);

cudaError_t dequantize_int4(const uint8_t* q, const void* scales, const uint8_t* zeros,
                            int64_t rows, int64_t cols, int64_t group_size, ck_int4_mode_t mode,
                            void* out, ck_dtype_t dtype, cudaStream_t stream);

// max |x| over the n elements of x (NaN ignored), written to *absmax on the stream: the
// per-tensor reduction behind dynamic per-tensor scales (int8, NVFP4's global scale).
cudaError_t tensor_absmax(const void* x, ck_dtype_t dtype, int64_t n, float* absmax,
                          cudaStream_t stream);

// ceil(cols / group_size), 1 for CK_GROUP_ROW, 0 for an invalid argument.
int64_t int4_groups_per_row(int64_t cols, int64_t group_size);

}  // namespace ck
