// gemm_int8.cuh - launchers of the INT8 GEMM kernels (kernels/gemm_int8.cu and, for Hopper,
// kernels/gemm_int8_sm90.cu), called by the entry points after they validated every argument.
#pragma once

#include "kernels/common.cuh"
#include "kernels/epilogue.cuh"

namespace ck {

// One INT8 GEMM call: out[m, n] = epilogue(a[m, k] x b), b as b_layout says.
// out_dtype CK_DTYPE_INT32 writes the raw accumulators (scales, bias, activation unused).
struct GemmInt8Args {
    const int8_t* a;
    const int8_t* b;
    ck_layout_t b_layout;
    int64_t m, n, k;
    const float* scale_a;
    bool scale_a_per_row;
    const float* scale_b;
    bool scale_b_per_col;
    const void* bias;  // out_dtype, n values, or nullptr
    ck_activation_t activation;
    void* out;
    ck_dtype_t out_dtype;
};

// The epilogue of one call, as every kernel gets it.
template <typename OutT> Epilogue<OutT> make_epilogue(const GemmInt8Args& g) {
    Epilogue<OutT> e{};
    e.out = static_cast<OutT*>(g.out);
    e.m = g.m;
    e.n = g.n;
    e.scale_a = g.scale_a;
    e.scale_b = g.scale_b;
    e.bias = std::is_same_v<OutT, int32_t> ? nullptr : static_cast<const OutT*>(g.bias);
    e.scale_a_per_row = g.scale_a_per_row;
    e.scale_b_per_col = g.scale_b_per_col;
    e.pair_aligned = g.n % 2 == 0 && is_aligned(g.out, 2 * sizeof(OutT));
    // Column parameters of an even column c and c + 1 load as one vector when aligned for it.
    e.column_pairs = g.scale_b_per_col && is_aligned(g.scale_b, 2 * sizeof(float)) &&
                     (!g.bias || is_aligned(g.bias, 2 * sizeof(OutT)));
    e.activation = g.activation;
    return e;
}

// The launchers of kernels/gemm_int8.cu; cuda_kernels.cu picks one from the shape and the GPU.
// reference: simple shared-memory tiles and dp4a, any GPU; the baseline the others are tested on.
// mma:       mma.sync m16n8k32 tensor-core tiles fed by a cp.async pipeline (sm_80 and newer;
//            sm_75 runs the reference kernel instead).
// small_m:   m <= 16 and CK_LAYOUT_NK: streams the weight once at memory bandwidth, fragments
//            loaded straight from global memory (sm_80 and newer).
cudaError_t gemm_int8_reference(const GemmInt8Args& args, cudaStream_t stream);
cudaError_t gemm_int8_mma(const GemmInt8Args& args, cudaStream_t stream);
cudaError_t gemm_int8_small_m(const GemmInt8Args& args, cudaStream_t stream);

// Hopper (kernels/gemm_int8_sm90.cu). available(): this build has sm_90a code and the current
// device is compute capability 9.0. The launcher handles CK_LAYOUT_NK only.
bool gemm_int8_sm90_available();
cudaError_t gemm_int8_sm90(const GemmInt8Args& args, cudaStream_t stream);

}  // namespace ck
