// linear.cuh - the launcher behind ck_linear (kernels/linear.cu): a floating-point linear layer
// on cuBLASLt, called by the entry point after it validated every argument.
#pragma once

#include <cublas_api.h>

#include "kernels/core/common.cuh"

namespace ck {

// out[m, n] = act(x[m, k] w[n, k]^T + bias[n]), all row-major, every operand of `dtype`
// (fp32, fp16 or bf16), float32 accumulation (no TF32), bias may be nullptr. Enqueued on `stream`
// with no workspace: nothing is allocated, so the call can be captured in a CUDA graph.
// Returns the first failing cuBLASLt status, CUBLAS_STATUS_NOT_SUPPORTED when cuBLASLt has no
// algorithm for the problem, or CUBLAS_STATUS_NOT_INITIALIZED when there is no current device.
cublasStatus_t linear(const void* x, const void* w, const void* bias, ck_dtype_t dtype, int64_t m,
                      int64_t n, int64_t k, ck_activation_t activation, void* out,
                      cudaStream_t stream);

}  // namespace ck
