// block4.cuh - launchers of the block 4-bit quantization kernels (kernels/quantize/block4.cu):
// NF4, MXFP4 and NVFP4, called by the entry points in cuda_kernels.cu after they validated
// every argument.
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

// Elements per block of the fixed-size formats, and NF4's block sizes (bitsandbytes').
constexpr int64_t kMxfp4Block = 32;
constexpr int64_t kNvfp4Block = 16;
constexpr int64_t kNf4MinBlock = 32, kNf4MaxBlock = 4096;

// 32, 64, ..., 4096: a power of two in [kNf4MinBlock, kNf4MaxBlock].
inline bool nf4_blocksize_ok(int64_t blocksize) {
    return blocksize >= kNf4MinBlock && blocksize <= kNf4MaxBlock &&
           (blocksize & (blocksize - 1)) == 0;
}

cudaError_t quantize_nf4(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                         int64_t blocksize, uint8_t* packed, float* absmax, cudaStream_t stream);

cudaError_t dequantize_nf4(const uint8_t* packed, const float* absmax, int64_t rows, int64_t cols,
                           int64_t blocksize, void* out, ck_dtype_t dtype, cudaStream_t stream);

cudaError_t quantize_mxfp4(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                           uint8_t* packed, uint8_t* scales, cudaStream_t stream);

cudaError_t dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                             int64_t cols, void* out, ck_dtype_t dtype, cudaStream_t stream);

// dynamic: compute the global scale from x into *global_scale first (else it is read).
cudaError_t quantize_nvfp4(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                           bool dynamic, float* global_scale, uint8_t* packed, uint8_t* scales,
                           cudaStream_t stream);

cudaError_t dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales,
                             const float* global_scale, int64_t rows, int64_t cols, void* out,
                             ck_dtype_t dtype, cudaStream_t stream);

}  // namespace ck
