// attention_tile.cuh - the warp-level steps that the prefill (attention_fwd.cu) and decode
// (attention_decode.cu) kernels share, on mma.sync m16n8k16 (ptx.cuh's mma_16x8x16).
//
// Fragment layout: lane = 4 g + t; an accumulator tile holds rows g (registers 0, 1) and g + 8
// (registers 2, 3), columns 2t and 2t + 1. A warp owns one m16 tile of query rows; each thread
// owns two of its rows (r = 0, 1: rows g and g + 8) and 2 of every 8 columns of S and of O.
//
// Tiles in shared memory are [rows][D] of 16-byte chunks, swizzled by the kernel's Smem type S
// (S::offset(row, chunk) in bytes). Per key tile a warp runs, in this order: qk_tile (S = Q K^T),
// its own mask through mask_tile, online_softmax (new maxima, rescale, P = 2^(x - m)), pv_tile
// (acc += P V). Every function is a piece of a kernel body, inlined: the arithmetic and its
// order are the kernels'.
#pragma once

#include "kernels/core/ptx.cuh"

#include <cmath>

namespace ck {
namespace attention {

constexpr int kChunkElems = 8;  // a 16-byte chunk holds 8 fp16/bf16 values
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// One sequence's token range, from the offsets clamped to [0, total] (see the header's
// device-side contract): nothing outside [0, total) is ever addressed.
struct Span {
    int64_t start, len;
};
__device__ __forceinline__ Span sequence_span(const int32_t* cu, int b, int64_t total) {
    if (!cu) return {0, total};
    const int64_t start = min(max(int64_t(cu[b]), int64_t(0)), total);
    const int64_t end = min(max(int64_t(cu[b + 1]), start), total);
    return {start, end - start};
}

// Two float32 values rounded to the dtype, packed low (first) and high as an mma operand.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Two adjacent output values: rounded to the dtype and packed, or float32 as they are.
template <typename T> __device__ __forceinline__ void store2(T* p, float lo, float hi) {
    *reinterpret_cast<uint32_t*>(p) = pack2<T>(lo, hi);
}
__device__ __forceinline__ void store2(float* p, float lo, float hi) {
    *reinterpret_cast<float2*>(p) = make_float2(lo, hi);
}

// 2^x by the special function unit alone (ex2.approx.ftz.f32: 2 float32 ulps at most, results
// below 2^-126 flushed to 0, 2^-inf = 0), where exp2f adds a range fix-up around it: the error
// model of tests/reference.py (attention_error_bound) allows both.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The max and the sum over the 4 lanes of a quad (the lanes that share an mma row).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The warp's Q rows row0 .. row0 + 15 of the Q tile at `q_tile`, as mma A fragments.
template <class S, int kKS>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qf)[kKS][4], uint32_t q_tile,
                                                 int row0, int lane) {
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks)
        ldmatrix_x4(qf[ks], q_tile + S::offset(row0 + lane % 16, 2 * ks + lane / 16));
}

// S = Q K^T over the keys key0 .. key0 + 8 kNT - 1 of the K tile at `kt` (K [keys][D]
// row-major is the col-major B operand: B[d][key] = K[key][d]).
template <typename T, class S, int kKS, int kNT>
__device__ __forceinline__ void qk_tile(float (&s)[kNT][4], const uint32_t (&qf)[kKS][4],
                                        uint32_t kt, int key0, int lane) {
    static_assert(kNT % 2 == 0, "K fragments load two n8 tiles per ldmatrix.x4");
#pragma unroll
    for (int i = 0; i < kNT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
            uint32_t r[4];
            ldmatrix_x4(r, kt + S::offset(key0 + np * 16 + (lane / 16) * 8 + lane % 8,
                                          2 * ks + (lane / 8) % 2));
            mma_16x8x16<T>(s[2 * np], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], r[0], r[1]);
            mma_16x8x16<T>(s[2 * np + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], r[2],
                           r[3]);
        }
    }
}

// x = S scale_log2 where seen(i, e) (n8 tile i, accumulator register e: the key of column
// 8 i + 2 t + (e & 1), the row g + 8 (e / 2)), -inf elsewhere; tile_max, the thread's maxima of
// its two rows. The scale multiplies before the max so that a negative scale is handled like
// any other.
template <int kNT, class Seen>
__device__ __forceinline__ void mask_tile(float (&s)[kNT][4], float (&tile_max)[2],
                                          float scale_log2, Seen&& seen) {
    tile_max[0] = tile_max[1] = -INFINITY;
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[i][e] = seen(i, e) ? s[i][e] * scale_log2 : -INFINITY;
            tile_max[e / 2] = fmaxf(tile_max[e / 2], s[i][e]);
        }
    }
}

// The softmax half of the online softmax over one tile: the new row maxima m, alpha = 2^(m_old -
// m_new) (the factor the rows' accumulators are to be rescaled by, rescale_rows), l rescaled,
// then s = P = 2^(x - m) and l += P (this thread's part of the row sum, the unrounded p, as
// FlashAttention sums it).
template <int kNT>
__device__ __forceinline__ void softmax_step(float (&s)[kNT][4], const float (&tile_max)[2],
                                             float (&m)[2], float (&l)[2], float (&alpha)[2]) {
    float m_use[2];  // the maximum p is taken relative to; 0 while a row has seen no key
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
        m_use[r] = m_new == -INFINITY ? 0.f : m_new;
        alpha[r] = fast_exp2(m[r] - m_use[r]);  // 0 while m[r] = -inf (acc, l are 0)
        m[r] = m_new;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[i][e] = fast_exp2(s[i][e] - m_use[e / 2]);  // masked keys: 2^-inf = 0
            l[e / 2] += s[i][e];
        }
    }
}

// acc's two rows of this thread times alpha (softmax_step's factors).
template <int kDT>
__device__ __forceinline__ void rescale_rows(float (&acc)[kDT][4], const float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int i = 0; i < kDT; ++i) acc[i][2 * r] *= alpha[r], acc[i][2 * r + 1] *= alpha[r];
    }
}

// The online softmax over one tile: softmax_step, and acc rescaled at once.
template <int kNT, int kDT>
__device__ __forceinline__ void online_softmax(float (&s)[kNT][4], const float (&tile_max)[2],
                                               float (&m)[2], float (&l)[2],
                                               float (&acc)[kDT][4]) {
    float alpha[2];
    softmax_step(s, tile_max, m, l, alpha);
    rescale_rows(acc, alpha);
}

// The A fragments of P for P V: the S accumulators of keys 16 kk .. 16 kk + 15 (n8 tiles 2 kk
// and 2 kk + 1 hold its columns 0-7 and 8-15), rounded to the dtype.
template <typename T, int kNT>
__device__ __forceinline__ void p_fragment(uint32_t (&a)[4], const float (&s)[kNT][4], int kk) {
    a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// acc += P V over the keys key0 .. key0 + 8 kNT - 1 of the V tile at `vt`: P's A fragments
// (p_fragment); V [keys][D] row-major is B [k = key][n = d], read transposed by ldmatrix.trans.
template <typename T, class S, int kNT, int kDT>
__device__ __forceinline__ void pv_tile(float (&acc)[kDT][4], const float (&s)[kNT][4],
                                        uint32_t vt, int key0, int lane) {
    static_assert(kNT % 2 == 0, "P V takes keys 16 at a time (the mma's k)");
    static_assert(kDT % 2 == 0, "V fragments: two n8 tiles per ldmatrix");
#pragma unroll
    for (int kk = 0; kk < kNT / 2; ++kk) {
        uint32_t a[4];
        p_fragment<T>(a, s, kk);
#pragma unroll
        for (int dp = 0; dp < kDT / 2; ++dp) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, vt + S::offset(key0 + kk * 16 + ((lane / 8) % 2) * 8 + lane % 8,
                                                2 * dp + lane / 16));
            mma_16x8x16<T>(acc[2 * dp], a[0], a[1], a[2], a[3], r[0], r[1]);
            mma_16x8x16<T>(acc[2 * dp + 1], a[0], a[1], a[2], a[3], r[2], r[3]);
        }
    }
}

// Row r of the thread (columns 2t, 2t + 1 of every n8 tile; o already points at column 2t):
// O = acc / sum (true divisions), 0 where the row saw no key. For the split partials, whose
// roundings the error model counts one by one (tests/reference.py, attention_error_bound).
template <typename Out, int kDT>
__device__ __forceinline__ void store_row(Out* o, const float (&acc)[kDT][4], int r, float sum) {
#pragma unroll
    for (int i = 0; i < kDT; ++i) {
        const float o0 = sum > 0.f ? acc[i][2 * r] / sum : 0.f;
        const float o1 = sum > 0.f ? acc[i][2 * r + 1] / sum : 0.f;
        store2(o + i * 8, o0, o1);
    }
}

// The same as O = acc x (1 / sum), the reciprocal correctly rounded once per row (two roundings
// per value where the division has one, within the model's 4u for a single pass): one multiply
// per value instead of a division's dozen instructions, in the epilogue of every work item.
template <typename Out, int kDT>
__device__ __forceinline__ void store_row_scaled(Out* o, const float (&acc)[kDT][4], int r,
                                                 float sum) {
    const float inv = sum > 0.f ? __frcp_rn(sum) : 0.f;
#pragma unroll
    for (int i = 0; i < kDT; ++i) store2(o + i * 8, acc[i][2 * r] * inv, acc[i][2 * r + 1] * inv);
}

// A row's lse = (m + log2(l)) ln(2) from its base-2 maximum and its sum; -inf without keys.
__device__ __forceinline__ float row_lse(float m, float sum) {
    return sum > 0.f ? (m + log2f(sum)) * kLn2 : -INFINITY;
}

}  // namespace attention
}  // namespace ck
