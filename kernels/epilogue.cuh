// epilogue.cuh - the GEMM epilogue shared by every matrix kernel: int32 (or float) accumulators
// -> scale by row and column -> bias -> activation -> one rounding to the output type -> store.
//
//   out[r, c] = act(fma(float(acc) * scale_a[r or 0], scale_b[c or 0], bias[c]))
//
// Kernels produce accumulators in pairs of adjacent columns (the mma C-fragment layout), so the
// store unit is a pair: one 8-byte (int32/fp32) or 4-byte (fp16/bf16) store when both columns
// are inside the matrix and pairs are aligned (Epilogue::pair_aligned), else one element at a
// time. Rows and columns outside [M, N) are never written: partial tiles need no other care.
#pragma once

#include "kernels/common.cuh"

namespace ck {

// The activation, as a run-time value: it costs one uniform branch per stored pair, and a new
// activation (GELU, SiLU) is one more case here and in ck_activation_t.
__device__ __forceinline__ float activate(float v, ck_activation_t act) {
    switch (act) {
        case CK_ACTIVATION_RELU: return fmaxf(v, 0.f);
        default: return v;
    }
}

// What a kernel needs to finish its tile. OutT is int32_t (raw accumulators: the scales, bias and
// activation are ignored), float, __half or __nv_bfloat16.
template <typename OutT> struct Epilogue {
    OutT* out;
    int64_t m, n;           // the output is [m, n], row-major
    const float* scale_a;   // 1 or m values
    const float* scale_b;   // 1 or n values
    const OutT* bias;       // n values or nullptr
    bool scale_a_per_row;
    bool scale_b_per_col;
    bool pair_aligned;      // n even and out 2-element aligned: a pair is one vector store
    ck_activation_t activation;

    __device__ __forceinline__ float row_scale(int64_t r) const {
        return scale_a[scale_a_per_row ? r : 0];
    }
    __device__ __forceinline__ float col_scale(int64_t c) const {
        return scale_b[scale_b_per_col ? c : 0];
    }

    // One accumulator -> output value, with the row's scale already looked up.
    __device__ __forceinline__ OutT convert(int32_t acc, float row_s, int64_t c) const {
        if constexpr (std::is_same_v<OutT, int32_t>) {
            return acc;
        } else {
            // Written out with explicit roundings so that every kernel computes the same bits:
            // v = fma(acc * scale_a, scale_b, bias) (the header's definition).
            const float b = bias ? to_float(bias[c]) : 0.f;
            const float v = __fmaf_rn(__fmul_rn(float(acc), row_s), col_scale(c), b);
            return from_float<OutT>(activate(v, activation));
        }
    }

    // Stores the accumulators of columns c and c + 1 of row r (c is even). Anything outside the
    // matrix is dropped.
    __device__ __forceinline__ void store_pair(int64_t r, int64_t c, int32_t acc0,
                                               int32_t acc1) const {
        if (r >= m || c >= n) return;
        float row_s = 0.f;
        if constexpr (!std::is_same_v<OutT, int32_t>) row_s = row_scale(r);
        OutT* p = out + r * n + c;
        const OutT v0 = convert(acc0, row_s, c);
        if (c + 1 < n) {
            const OutT v1 = convert(acc1, row_s, c + 1);
            if (pair_aligned) {
                store_two(p, v0, v1);
                return;
            }
            p[1] = v1;
        }
        p[0] = v0;
    }

  private:
    __device__ __forceinline__ static uint32_t bits(int32_t v) { return uint32_t(v); }
    __device__ __forceinline__ static uint32_t bits(float v) { return __float_as_uint(v); }
    __device__ __forceinline__ static uint32_t bits(__half v) { return __half_as_ushort(v); }
    __device__ __forceinline__ static uint32_t bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

    __device__ __forceinline__ static void store_two(OutT* p, OutT v0, OutT v1) {
        if constexpr (sizeof(OutT) == 4) {
            *reinterpret_cast<uint2*>(p) = make_uint2(bits(v0), bits(v1));
        } else {
            *reinterpret_cast<uint32_t*>(p) = bits(v0) | (bits(v1) << 16);
        }
    }
};

}  // namespace ck
