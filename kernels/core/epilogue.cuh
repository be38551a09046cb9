// epilogue.cuh - the GEMM epilogues shared by every matrix kernel, one rounding to the output
// type each:
//   Epilogue<OutT>       int32 accumulators (INT8, INT4 GEMMs): scale by row and column, bias,
//                        activation: out[r, c] = act(fma(float(acc) * scale_a[r or 0], scale_b[c or 0], bias[c]))
//   FloatEpilogue<T>     float accumulators (W4A16 GEMMs): out[r, c] = act(acc + bias[c]), the
//                        bias added only where there is one.
//
// Kernels produce accumulators in pairs of adjacent columns (the mma C-fragment layout), so the
// store unit is a pair: one 8-byte (int32/fp32) or 4-byte (fp16/bf16) store when both columns
// are inside the matrix and pairs are aligned (Epilogue::pair_aligned), else one element at a
// time. Rows and columns outside [M, N) are never written: partial tiles need no other care.
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

// The activation, as a run-time value: it costs one uniform branch per stored pair, and a new
// activation (GELU, SiLU) is one more case here and in ck_activation_t.
__device__ __forceinline__ float activate(float v, ck_activation_t act) {
    switch (act) {
        case CK_ACTIVATION_RELU: return fmaxf(v, 0.f);
        default: return v;
    }
}

// silu(g) = g / (1 + exp(-g)), the gate of SwiGLU (the MoE layer's silu(gate) * up).
__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// A 16-bit float from its bit pattern.
template <typename T> __device__ __forceinline__ T bits_to(uint16_t v);
template <> __device__ __forceinline__ __half bits_to<__half>(uint16_t v) { return __ushort_as_half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 bits_to<__nv_bfloat16>(uint16_t v) {
    return __ushort_as_bfloat16(v);
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
    bool column_pairs;      // per-column scale_b (and bias) aligned to load two columns at once
    ck_activation_t activation;

    // Scales and bias are read-only for the whole kernel (the header forbids overlap with the
    // output): __ldg lets the compiler batch these loads ahead of the stores instead of
    // serializing each load behind the previous pair's store.
    __device__ __forceinline__ float row_scale(int64_t r) const {
        return __ldg(scale_a + (scale_a_per_row ? r : 0));
    }
    __device__ __forceinline__ float col_scale(int64_t c) const {
        return __ldg(scale_b + (scale_b_per_col ? c : 0));
    }

    // The scale and bias of output columns c and c + 1: looked up once and shared by every row
    // a thread stores in those columns. Columns past n read nothing.
    struct Columns {
        float scale0, scale1, bias0, bias1;
    };
    __device__ __forceinline__ Columns columns(int64_t c) const {
        Columns col{0.f, 0.f, 0.f, 0.f};
        if constexpr (!std::is_same_v<OutT, int32_t>) {
            if (column_pairs && c + 1 < n) {  // c is even: both loads are vector-aligned
                const float2 s = __ldg(reinterpret_cast<const float2*>(scale_b + c));
                col.scale0 = s.x;
                col.scale1 = s.y;
                if (bias) {
                    if constexpr (sizeof(OutT) == 4) {
                        const float2 b = __ldg(reinterpret_cast<const float2*>(bias + c));
                        col.bias0 = b.x;
                        col.bias1 = b.y;
                    } else {
                        const uint32_t b = __ldg(reinterpret_cast<const unsigned int*>(bias + c));
                        col.bias0 = to_float(bits_to<OutT>(uint16_t(b)));
                        col.bias1 = to_float(bits_to<OutT>(uint16_t(b >> 16)));
                    }
                }
                return col;
            }
            if (c < n) {
                col.scale0 = col_scale(c);
                if (bias) col.bias0 = to_float(__ldg(bias + c));
            }
            if (c + 1 < n) {
                col.scale1 = col_scale(c + 1);
                if (bias) col.bias1 = to_float(__ldg(bias + c + 1));
            }
        }
        return col;
    }

    // The scale of row r (unused for int32 output); rows past m read nothing.
    __device__ __forceinline__ float rows(int64_t r) const {
        if constexpr (std::is_same_v<OutT, int32_t>) return 0.f;
        return r < m ? row_scale(r) : 0.f;
    }

    // One accumulator -> output value. Written out with explicit roundings so that every kernel
    // computes the same bits: v = fma(acc * scale_a, scale_b, bias) (the header's definition).
    __device__ __forceinline__ OutT convert(int32_t acc, float row_s, float col_s, float b) const {
        if constexpr (std::is_same_v<OutT, int32_t>) {
            return acc;
        } else {
            const float v = __fmaf_rn(__fmul_rn(float(acc), row_s), col_s, b);
            return from_float<OutT>(activate(v, activation));
        }
    }

    // Stores the accumulators of columns c and c + 1 of row r (c is even), given the row's scale
    // and the columns' parameters. Anything outside the matrix is dropped.
    __device__ __forceinline__ void store_pair(int64_t r, int64_t c, int32_t acc0, int32_t acc1,
                                               float row_s, const Columns& col) const {
        if (r >= m || c >= n) return;
        OutT* p = out + r * n + c;
        const OutT v0 = convert(acc0, row_s, col.scale0, col.bias0);
        if (c + 1 < n) {
            const OutT v1 = convert(acc1, row_s, col.scale1, col.bias1);
            if (pair_aligned) {
                store_two(p, v0, v1);
                return;
            }
            p[1] = v1;
        }
        p[0] = v0;
    }

    // The same, looking the row and column parameters up itself.
    __device__ __forceinline__ void store_pair(int64_t r, int64_t c, int32_t acc0,
                                               int32_t acc1) const {
        if (r >= m || c >= n) return;
        store_pair(r, c, acc0, acc1, rows(r), columns(c));
    }

    // Two 16-bit outputs as one 32-bit word, the first in the low half (memory order).
    __device__ __forceinline__ static uint32_t pack_two(OutT v0, OutT v1) {
        static_assert(sizeof(OutT) == 2, "pack_two is for 16-bit outputs");
        return bits(v0) | (bits(v1) << 16);
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

    template <typename> friend struct FloatEpilogue;
};

// The epilogue of the float-accumulator (W4A16) kernels: T is __half or __nv_bfloat16.
template <typename T> struct FloatEpilogue {
    T* out;
    int64_t m, n;         // the output is [m, n], row-major
    const T* bias;        // n values or nullptr
    ck_activation_t activation;
    bool pair_aligned;    // n even and out 4-byte aligned: a pair is one 4-byte store

    // v + bias[c] where there is a bias (c < n). The streaming kernels add nothing without a
    // bias; the tiled ones add bias_at(c), 0 without one (a -0 sum becomes +0 there): each
    // kernel keeps the bits it has always produced.
    __device__ __forceinline__ float add_bias(int64_t c, float v) const {
        return bias ? v + to_float(bias[c]) : v;
    }
    // bias[c], or 0 without a bias or past n.
    __device__ __forceinline__ float bias_at(int64_t c) const {
        return bias && c < n ? to_float(bias[c]) : 0.f;
    }

    // Stores act(v0), act(v1) at columns c and c + 1 of row r, rounded once: one 4-byte store
    // when both are inside and pair_aligned, else one element at a time. The caller checks
    // r < m and c < n; a column c + 1 past n is dropped.
    __device__ __forceinline__ void store_pair(int64_t r, int64_t c, float v0, float v1) const {
        T* p = out + r * n + c;
        const T h0 = from_float<T>(activate(v0, activation));
        if (c + 1 < n) {
            const T h1 = from_float<T>(activate(v1, activation));
            if (pair_aligned) {
                Epilogue<T>::store_two(p, h0, h1);
                return;
            }
            p[1] = h1;
        }
        p[0] = h0;
    }

    // Two adjacent outputs at p (4-byte aligned) as one 4-byte store.
    __device__ __forceinline__ static void store_two(T* p, T v0, T v1) {
        Epilogue<T>::store_two(p, v0, v1);
    }

    // Stores act(v) at (r, c), r < m and c < n.
    __device__ __forceinline__ void store(int64_t r, int64_t c, float v) const {
        out[r * n + c] = from_float<T>(activate(v, activation));
    }
};

}  // namespace ck
