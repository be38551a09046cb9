// epilogue.cuh - the GEMM epilogues shared by every matrix kernel, one rounding to the output
// type each:
//   Epilogue<OutT>       int32 accumulators (INT8, INT4 GEMMs) or float32 ones (FP8 GEMMs):
//                        scale by row and column, bias,
//                        activation: out[r, c] = act(fma(float(acc) * scale_a[r or 0], scale_b[c or 0], bias[c]))
//   FloatEpilogue<T>     float accumulators (W4A16 GEMMs): out[r, c] = act(acc + bias[c]), the
//                        bias added only where there is one.
//   QkvEpilogue<T>       the same kernels' fused Q/K/V projection: the split into q, k, v, the
//                        bias and the rotary embedding (below).
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
    const float* scale_a;   // 1 or m values, or nullptr: 1 (scales applied in the main loop)
    const float* scale_b;   // 1 or n values, or nullptr: 1
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
        return scale_a ? __ldg(scale_a + (scale_a_per_row ? r : 0)) : 1.f;
    }
    __device__ __forceinline__ float col_scale(int64_t c) const {
        return scale_b ? __ldg(scale_b + (scale_b_per_col ? c : 0)) : 1.f;
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

    // One accumulator (int32, or float32 for FP8) -> output value. Written out with explicit
    // roundings so that every kernel computes the same bits: v = fma(acc * scale_a, scale_b,
    // bias) (the header's definition).
    template <typename Acc>
    __device__ __forceinline__ OutT convert(Acc acc, float row_s, float col_s, float b) const {
        if constexpr (std::is_same_v<OutT, int32_t>) {
            static_assert(std::is_same_v<Acc, int32_t>, "raw int32 output of int32 sums only");
            return acc;
        } else {
            const float v = __fmaf_rn(__fmul_rn(float(acc), row_s), col_s, b);
            return from_float<OutT>(activate(v, activation));
        }
    }

    // Stores the accumulators of columns c and c + 1 of row r (c is even), given the row's scale
    // and the columns' parameters. Anything outside the matrix is dropped.
    template <typename Acc>
    __device__ __forceinline__ void store_pair(int64_t r, int64_t c, Acc acc0, Acc acc1,
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
    template <typename Acc>
    __device__ __forceinline__ void store_pair(int64_t r, int64_t c, Acc acc0, Acc acc1) const {
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

// The fused Q/K/V projection's outputs (ck_qkv_projection; tests/reference.py,
// qkv_projection): the GEMM's [m, n] float32 result y, n = (Hq + 2 Hkv) D, is split by column
// into q [m, Hq, D], k and v [m, Hkv, D]; the bias (n values in the checkpoint's row order, or
// nullptr) is added, RoPE rotates q and k (never v) in float32, and each value is rounded once.
// The weight was prepacked with rope_pairs (w4a16_prepacked.cuh) for the rotate-half style, so
// the two values one rotation mixes are always the two columns of one accumulator pair.
// q == nullptr: not a projection (every plain GEMM).
struct QkvOut {
    void* q = nullptr;
    void* k = nullptr;
    void* v = nullptr;
    const void* bias = nullptr;          // [n] dtype, logical (checkpoint) order
    const int32_t* positions = nullptr;  // [m]: token r's row of cos_sin, clamped to [0, P)
    const float* cos_sin = nullptr;      // [P, R]: cos(p theta_i) for i < R / 2, then sin
    int64_t max_position = 0;            // P
    int64_t heads_q = 0, heads_kv = 0, head_dim = 0, rotary_dim = 0;  // Hq, Hkv, D (even), R
    int rope = CK_ROPE_NONE;             // ck_rope_style_t
    bool pair_aligned = false;           // q, k and v 4-byte aligned: a pair is one store
};

// The epilogue of the float-accumulator (W4A16) kernels: T is __half or __nv_bfloat16.
template <typename T> struct FloatEpilogue {
    T* out;
    int64_t m, n;         // the output is [m, n], row-major
    const T* bias;        // n values or nullptr
    ck_activation_t activation;
    bool pair_aligned;    // n even and out 4-byte aligned: a pair is one 4-byte store
    static constexpr bool kQkv = false;

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

    // What a kernel that stores many rows of one column pair may work out once (QkvEpilogue's
    // Column): nothing here.
    struct Column {};
    __device__ __forceinline__ Column column(int64_t) const { return {}; }
    __device__ __forceinline__ void store_pair(int64_t r, int64_t c, float v0, float v1,
                                               const Column&) const {
        store_pair(r, c, v0, v1);
    }
};

// The fused projection's epilogue (kernels instantiated for it: kQkvRows): FloatEpilogue's
// plain output, bias and activation unused (nullptr, none); store_pair splits, adds the bias and
// rotates instead. A separate type, so that no plain kernel carries the projection's code.
template <typename T> struct QkvEpilogue : FloatEpilogue<T> {
    QkvOut qkv;
    static constexpr bool kQkv = true;

    // The projection's store of GEMM columns c, c + 1 (c even; D even, so both lie in one
    // head h, at j = c - h D and j + 1). In q and k with j < R, the pair is one rotation's:
    // rotate-half, logical components a = i, b = i + R / 2 of the head (i = j / 2, the
    // prepack's rope_pairs); interleaved, a = j, b = j + 1. With c, s = cos_sin[p, i],
    // cos_sin[p, R / 2 + i]: a' = a c - b s, b' = b c + a s (two products and a difference,
    // each rounded: within the reference's rope_float32_error). Elsewhere the pair is stored as
    // it is, plus the bias.
    // Column: what depends on c alone (the head's division, where its values go, the bias), so
    // that a kernel storing many rows of one pair works it out once (column()).
    struct Column {
        T* base;                 // row 0's first value of the head in q, k or v
        int64_t row_stride;      // Hq D (q) or Hkv D (k, v)
        int64_t ja, jb;          // where v0 and v1 go in the head
        int64_t i;               // the rotation's cos/sin index, or -1: no rotation
        bool adjacent;           // jb = ja + 1 with ja even: one 4-byte store where aligned
        float bias0, bias1;      // the bias of components ja and jb (0 without one)
    };
    __device__ __forceinline__ Column column(int64_t c) const {
        if (c >= this->n) return {};  // past the projection's columns: never stored
        const int64_t d = qkv.head_dim, hq = qkv.heads_q, hkv = qkv.heads_kv;
        const int64_t h = c / d, j = c - h * d;
        Column col;
        if (h < hq) col.base = static_cast<T*>(qkv.q) + h * d, col.row_stride = hq * d;
        else if (h < hq + hkv) col.base = static_cast<T*>(qkv.k) + (h - hq) * d, col.row_stride = hkv * d;
        else col.base = static_cast<T*>(qkv.v) + (h - hq - hkv) * d, col.row_stride = hkv * d;
        const int64_t rd = qkv.rotary_dim;
        const bool rotate = qkv.rope != CK_ROPE_NONE && h < hq + hkv && j < rd;
        const bool neox = qkv.rope == CK_ROPE_NEOX;
        col.i = rotate ? j / 2 : -1;
        col.ja = rotate && neox ? j / 2 : j;
        col.jb = rotate && neox ? j / 2 + rd / 2 : j + 1;
        col.adjacent = !(rotate && neox);
        const T* bias_h = qkv.bias ? static_cast<const T*>(qkv.bias) + h * d : nullptr;
        col.bias0 = bias_h ? to_float(bias_h[col.ja]) : 0.f;
        col.bias1 = bias_h ? to_float(bias_h[col.jb]) : 0.f;
        return col;
    }
    __device__ __forceinline__ void store_pair(int64_t r, int64_t c, float v0, float v1) const {
        store_pair(r, c, v0, v1, column(c));
    }
    __device__ __forceinline__ void store_pair(int64_t r, int64_t, float v0, float v1,
                                               const Column& col) const {
        T* base = col.base + r * col.row_stride;
        const bool has_bias = qkv.bias != nullptr;
        float a = v0, b = v1;
        if (has_bias) {
            a += col.bias0;
            b += col.bias1;
        }
        if (col.i >= 0) {
            const int64_t rd = qkv.rotary_dim;
            const int64_t p = __ldg(qkv.positions + r);
            const float* row = qkv.cos_sin + (p < 0 ? 0 : p < qkv.max_position ? p : qkv.max_position - 1) * rd;
            const float cs = __ldg(row + col.i), sn = __ldg(row + rd / 2 + col.i);
            const T ya = from_float<T>(__fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)));
            const T yb = from_float<T>(__fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn)));
            if (col.adjacent && qkv.pair_aligned) {
                FloatEpilogue<T>::store_two(base + col.ja, ya, yb);
            } else {
                base[col.ja] = ya;
                base[col.jb] = yb;
            }
            return;
        }
        if (qkv.pair_aligned) {
            FloatEpilogue<T>::store_two(base + col.ja, from_float<T>(a), from_float<T>(b));
        } else {
            base[col.ja] = from_float<T>(a);
            base[col.ja + 1] = from_float<T>(b);
        }
    }
};

}  // namespace ck
