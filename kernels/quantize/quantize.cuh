// quantize.cuh - launchers of the quantization kernels (kernels/quantize.cu), called by the
// entry points in cuda_kernels.cu after they validated every argument.
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

cudaError_t quantize_int8(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                          ck_granularity_t granularity, ck_scale_mode_t mode, float* scales,
                          int8_t* q, cudaStream_t stream);

cudaError_t dequantize_int8(const int8_t* q, const float* scales, int64_t rows, int64_t cols,
                            ck_granularity_t granularity, void* out, ck_dtype_t dtype,
                            cudaStream_t stream);

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
