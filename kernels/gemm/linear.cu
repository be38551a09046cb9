// linear.cu - ck_linear on cuBLASLt: a floating-point linear layer with its epilogue fused.
//
//   out[M, N] = act(x[M, K] w[N, K]^T + bias[N])   x, w, bias, out: fp32, fp16 or bf16, row-major
//
// Row-major through a column-major library. cuBLASLt computes D = op(A) op(B) on column-major
// matrices, and the bytes of a row-major [R, C] matrix are those of a column-major [C, R] one
// (leading dimension C). So we ask for the transpose of out, out^T[N, M] = w[N, K] x^T[K, M]:
//   A = w:   column-major [K, N], lda = K; transA = T, so op(A) = w      [N, K]
//   B = x:   column-major [K, M], ldb = K; transB = N, so op(B) = x^T    [K, M]
//   D = out: column-major [N, M], ldd = N; element (n, m) lies at m * N + n, which is out[m, n]
// This is the "TN" GEMM, the layout cuBLAS(Lt) is fastest in. C is D with beta = 0 (not read).
// cuBLASLt's bias epilogue adds a vector of length rows(D) = N to every column of D, i.e.
// bias[n] to every out[m, n]: one bias per output channel, as nn.Linear has it.
//
// Precision: CUBLAS_COMPUTE_32F with a float scale type accumulates in float32 and keeps fp32
// inputs in fp32 (CUBLAS_COMPUTE_32F_FAST_TF32 would round them to TF32). The epilogue adds the
// bias and applies ReLU to the float accumulators, then rounds once to dtype.
//
// Graph capture: no workspace (the heuristic is limited to MAX_WORKSPACE_BYTES = 0 and the call
// passes nullptr, 0), so cuBLASLt allocates nothing; everything else is host-side.
//
// Caches, shared by all threads behind one mutex:
//   - one cuBLASLt handle per device, created on first use and kept for the life of the process
//     (not destroyed at exit: static destructors may run after the CUDA context is gone). A
//     cuBLASLt handle holds no stream or workspace, so threads can share it.
//   - the heuristic's algorithm per (device, dtype, m, n, k, epilogue, pointer alignment), so a
//     repeated shape skips cublasLtMatmulAlgoGetHeuristic (host time on every call otherwise).
//     The alignment is part of the key because the heuristic picks for the alignment it is told:
//     cuBLASLt assumes 256-byte aligned buffers unless told otherwise, and reads the bias
//     pointer's alignment from the descriptor. One entry per distinct shape: a few hundred bytes.
//   The matmul and layout descriptors are created per call (plain host structs) and destroyed.
#include "kernels/gemm/linear.cuh"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace ck {
namespace {

// The largest alignment the heuristic cares about (its default assumption).
constexpr uint32_t kMaxAlignment = 256;

// Returns the status of `call` if it failed.
#define CK_LT_TRY(call)                                                    \
    do {                                                                   \
        const cublasStatus_t ck_lt_status_ = (call);                       \
        if (ck_lt_status_ != CUBLAS_STATUS_SUCCESS) return ck_lt_status_; \
    } while (0)

// A cuBLASLt descriptor destroyed at scope exit.
template <typename T, cublasStatus_t (*Destroy)(T)> struct Owned {
    T value = nullptr;
    Owned() = default;
    Owned(const Owned&) = delete;
    Owned& operator=(const Owned&) = delete;
    ~Owned() {
        if (value) Destroy(value);
    }
};
using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <typename V>
cublasStatus_t set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
    return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value);
}
template <typename V>
cublasStatus_t set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                   const V& value) {
    return cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value);
}

cudaDataType_t cuda_type(ck_dtype_t dtype) {
    switch (dtype) {
        case CK_DTYPE_FP16: return CUDA_R_16F;
        case CK_DTYPE_BF16: return CUDA_R_16BF;
        default: return CUDA_R_32F;  // the entry point admits fp32, fp16 and bf16 only
    }
}

// The largest power of two <= kMaxAlignment that divides the address (kMaxAlignment for null).
uint32_t alignment_of(const void* p) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    uint32_t align = kMaxAlignment;
    while (align > 1 && address % align != 0) align /= 2;
    return align;
}

// (device, dtype, m, n, k, epilogue, alignment of the least aligned pointer)
using AlgoKey = std::tuple<int, int, int64_t, int64_t, int64_t, int, uint32_t>;

std::mutex g_mutex;
std::map<int, cublasLtHandle_t> g_handles;        // by device ordinal
std::map<AlgoKey, cublasLtMatmulAlgo_t> g_algos;  // the heuristic's first choice

cublasStatus_t handle_for(int device, cublasLtHandle_t* handle) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_handles.find(device);
    if (it == g_handles.end()) {
        cublasLtHandle_t created = nullptr;
        CK_LT_TRY(cublasLtCreate(&created));
        it = g_handles.emplace(device, created).first;
    }
    *handle = it->second;
    return CUBLAS_STATUS_SUCCESS;
}

// The cached algorithm for `key`, or the heuristic's first choice for these descriptors (no
// workspace, buffers aligned to `align`), cached. The lock is not held during the heuristic: two
// threads may both ask it for a new key, and both get the same answer.
cublasStatus_t algo_for(cublasLtHandle_t handle, const AlgoKey& key, uint32_t align,
                        cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                        cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d,
                        cublasLtMatmulAlgo_t* algo) {
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        const auto it = g_algos.find(key);
        if (it != g_algos.end()) {
            *algo = it->second;
            return CUBLAS_STATUS_SUCCESS;
        }
    }
    Preference pref;
    CK_LT_TRY(cublasLtMatmulPreferenceCreate(&pref.value));
    CK_LT_TRY(set(pref.value, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{0}));
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        CK_LT_TRY(set(pref.value, attr, align));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    CK_LT_TRY(
        cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, d, d, pref.value, 1, &result, &found));
    if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_NOT_SUPPORTED;

    std::lock_guard<std::mutex> lock(g_mutex);
    g_algos.emplace(key, result.algo);
    *algo = result.algo;
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t linear(const void* x, const void* w, const void* bias, ck_dtype_t dtype, int64_t m,
                      int64_t n, int64_t k, ck_activation_t activation, void* out,
                      cudaStream_t stream) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasLtHandle_t handle = nullptr;
    CK_LT_TRY(handle_for(device, &handle));

    const bool relu = activation == CK_ACTIVATION_RELU;
    const cublasLtEpilogue_t epilogue =
        bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
             : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
    const cudaDataType_t type = cuda_type(dtype);

    // D = op(A) op(B) with A = w (transposed), B = x: see the top of the file.
    MatmulDesc op;
    CK_LT_TRY(cublasLtMatmulDescCreate(&op.value, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK_LT_TRY(set(op.value, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
    CK_LT_TRY(set(op.value, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
    CK_LT_TRY(set(op.value, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
    if (bias) {
        CK_LT_TRY(set(op.value, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
        CK_LT_TRY(set(op.value, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(type)));
    }
    Layout a, b, d;
    CK_LT_TRY(cublasLtMatrixLayoutCreate(&a.value, type, uint64_t(k), uint64_t(n), k));  // w
    CK_LT_TRY(cublasLtMatrixLayoutCreate(&b.value, type, uint64_t(k), uint64_t(m), k));  // x
    CK_LT_TRY(cublasLtMatrixLayoutCreate(&d.value, type, uint64_t(n), uint64_t(m), n));  // out

    const uint32_t align =
        std::min({alignment_of(x), alignment_of(w), alignment_of(out), alignment_of(bias)});
    const AlgoKey key{device, int(dtype), m, n, k, int(epilogue), align};
    cublasLtMatmulAlgo_t algo;
    CK_LT_TRY(algo_for(handle, key, align, op.value, a.value, b.value, d.value, &algo));

    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(handle, op.value, &alpha, w, a.value, x, b.value, &beta, out, d.value,
                          out, d.value, &algo, /*workspace=*/nullptr, /*workspaceSizeInBytes=*/0,
                          stream);
}

}  // namespace ck
