// int_gemm.cuh - what the integer GEMMs (INT8 x INT8 in gemm_int8*.cu, INT4 x INT4 in
// gemm_int4.cu) share: the call's operands (IntGemmArgs), its epilogue, the output-dtype
// dispatch, and the dp4a reference kernels' micro-tile.
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/core/fp8.cuh"
#include "kernels/core/ptx.cuh"

namespace ck {

// One integer GEMM call: out[m, n] = epilogue(a[m, k] x b), b as b_layout says. a and b are
// int8 [m, k] and [n, k] (or [k, n]) for the INT8 GEMMs, packed int4 [m, k / 2] and [n, k / 2]
// bytes for the INT4 GEMMs (b_layout CK_LAYOUT_NK, k the logical K); each family's launchers
// read them as their element type (a_as / b_as).
// out_dtype CK_DTYPE_INT32 writes the raw accumulators (scales, bias, activation unused).
// The FP8 GEMM's block scales (block_scale_a [m, k_blocks], block_scale_b [ceil(n / 128),
// k_blocks] with k_blocks = ceil(k / 128): DeepSeek-V3's 1 x 128 and 128 x 128 scales) are
// applied to each 128-wide k-block's sums in the main loop; scale_a and scale_b are then
// nullptr, which the epilogue reads as 1.
struct IntGemmArgs {
    const void* a;
    const void* b;
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
    const float* block_scale_a = nullptr;
    const float* block_scale_b = nullptr;
    // W4A8 (ck_gemm_w4a8): b is packed symmetric INT4 [n, k / 2], its scales [n, groups] of
    // group_scale_dtype (fp16 or bf16), groups = ceil(k / 128) or 1 (GroupScales).
    const void* group_scales = nullptr;
    ck_dtype_t group_scale_dtype = CK_DTYPE_FP16;
    int64_t groups = 0;

    bool block_scaled() const { return block_scale_a != nullptr; }
    template <typename T> const T* a_as() const { return static_cast<const T*>(a); }
    template <typename T> const T* b_as() const { return static_cast<const T*>(b); }
};

// The epilogue of one call, as every kernel gets it.
template <typename OutT> Epilogue<OutT> make_epilogue(const IntGemmArgs& g) {
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

// The FP8 GEMM's block scales as its kernels take them (see IntGemmArgs): a == nullptr, none.
// A k-block's sums of output (r, c) are scaled by at(r, c, kb) = a[r, kb] * b[c / 128, kb],
// float32, before they are added to the float32 sums (k-blocks and blocks of kFp8Block, fp8.cuh).
// r < m and c < n.
struct BlockScales {
    const float* a;
    const float* b;
    int64_t k_blocks;
    __device__ __forceinline__ float a_at(int64_t r, int64_t kb) const {
        return __ldg(a + r * k_blocks + kb);
    }
    __device__ __forceinline__ float b_at(int64_t c, int64_t kb) const {
        return __ldg(b + c / kFp8Block * k_blocks + kb);
    }
    __device__ __forceinline__ float at(int64_t r, int64_t c, int64_t kb) const {
        return __fmul_rn(a_at(r, kb), b_at(c, kb));
    }
};
inline BlockScales block_scales(const IntGemmArgs& g) {
    return {g.block_scale_a, g.block_scale_b, ceil_div(g.k, kFp8Block)};
}

// W4A8 (ck_gemm_w4a8): the weight's group scales [n, groups] (fp16 or bf16 bits), read as
// float32 for column c and 128-wide k-block kb: groups is ceil(k / 128) (group 128) or 1 (a row).
struct GroupScales {
    const uint16_t* p;
    bool bf16;
    int64_t groups;
    __device__ __forceinline__ float at(int64_t c, int64_t kb) const {
        const uint16_t bits = __ldg(p + c * groups + (groups == 1 ? 0 : kb));
        return bf16 ? __uint_as_float(uint32_t(bits) << 16) : __half2float(__ushort_as_half(bits));
    }
};
inline GroupScales group_scales(const IntGemmArgs& g) {
    return {static_cast<const uint16_t*>(g.group_scales), g.group_scale_dtype == CK_DTYPE_BF16,
            g.groups};
}

// Eight packed symmetric INT4 codes (code 2i in the low nibble of byte i, two's complement
// -8 .. 7) as eight FP8 E4M3 bytes of the same values, in order: codes 0-3 in lo, 4-7 in hi.
// Every code is an E4M3 value. Two table lookups per four codes (prmt: its selector nibbles are
// the codes themselves): codes 0 .. 7 index the positive table directly, codes 8 .. 15 (-8 ..
// -1) the negative one with bit 3 cleared; a set bit 3 makes prmt return a sign byte instead,
// and a third prmt takes each byte from the lookup that was meant for it.
__device__ __forceinline__ void int4_to_e4m3_x8(uint32_t w, uint32_t& lo, uint32_t& hi) {
    constexpr uint32_t kPos0 = 0x44403800u, kPos1 = 0x4E4C4A48u;  // e4m3(0 .. 7)
    constexpr uint32_t kNeg0 = 0xCACCCED0u, kNeg1 = 0xB8C0C4C8u;  // e4m3(-8 .. -1)
    const uint32_t flipped = w ^ 0x88888888u;                      // negatives as plain indices
    const uint32_t pick = ((w >> 1) & 0x44444444u) | 0x32103210u;  // byte i from b when negative
    const uint32_t w_hi = w >> 16, flipped_hi = flipped >> 16, pick_hi = pick >> 16;
    lo = prmt(prmt(kPos0, kPos1, w), prmt(kNeg0, kNeg1, flipped), pick);
    hi = prmt(prmt(kPos0, kPos1, w_hi), prmt(kNeg0, kNeg1, flipped_hi), pick_hi);
}

// Calls f with a value of the output element type of out_dtype (int32 or a float type).
template <typename F> cudaError_t dispatch_out_dtype(ck_dtype_t out_dtype, F&& f) {
    if (out_dtype == CK_DTYPE_INT32) return f(int32_t{});
    return dispatch_float_dtype(out_dtype, f);
}

// ---------------------------------------------------------------------------------------------
// The dp4a reference kernels' shared core (gemm_int8.cu, gemm_int4.cu): 64 x 64 output tiles,
// 256 threads; thread (ty, tx) = (tid / 16, tid % 16) owns rows ty + 16 i (i < 4) and the column
// pairs 32 j + 2 tx, + 1 (j < 2). A step stages kKWords 4-k words per row in k-major shared tiles
// [kw][row] (padded: rows stay 8-byte aligned for the pair loads).
// ---------------------------------------------------------------------------------------------
constexpr int kDp4aBM = 64, kDp4aBN = 64, kDp4aThreads = 256;
constexpr int kDp4aPad = 4;                      // words
constexpr int kDp4aRows = 4, kDp4aColPairs = 2;  // micro-tile: 4 rows x 2 column pairs
static_assert(kDp4aThreads / 16 * kDp4aRows == kDp4aBM && 16 * 2 * kDp4aColPairs == kDp4aBN,
              "the micro-tiles cover the block tile");
static_assert(kDp4aPad % 2 == 0, "column pairs are read as 8-byte words");

template <int kKWords> struct Dp4aTiles {
    uint32_t a[kKWords][kDp4aBM + kDp4aPad];
    alignas(8) uint32_t b[kKWords][kDp4aBN + kDp4aPad];
};
using Dp4aAcc = int32_t[kDp4aRows][2 * kDp4aColPairs];

// Where a thread of a reference block works: the block's output tile (blocks walk the tiles
// column by column: tile row blockIdx.x % tiles_m) and the thread's micro-tile (ty, tx).
struct Dp4aThread {
    int64_t m0, n0;
    int ty, tx;
    __device__ __forceinline__ explicit Dp4aThread(int64_t m) {
        const int64_t tiles_m = ceil_div(m, kDp4aBM);
        m0 = blockIdx.x % tiles_m * kDp4aBM;
        n0 = blockIdx.x / tiles_m * kDp4aBN;
        ty = int(threadIdx.x) / 16, tx = int(threadIdx.x) % 16;
    }
};

// One staged step: acc += the thread's micro-tile of a . b over the step's kKWords words.
template <int kKWords>
__device__ __forceinline__ void dp4a_micro_tile(const Dp4aTiles<kKWords>& s, const Dp4aThread& th,
                                                Dp4aAcc& acc) {
    const int ty = th.ty, tx = th.tx;
#pragma unroll 4
    for (int kw = 0; kw < kKWords; ++kw) {
        int av[kDp4aRows], bv[2 * kDp4aColPairs];
#pragma unroll
        for (int i = 0; i < kDp4aRows; ++i) av[i] = int(s.a[kw][ty + 16 * i]);
#pragma unroll
        for (int j = 0; j < kDp4aColPairs; ++j) {
            const uint2 p = *reinterpret_cast<const uint2*>(&s.b[kw][32 * j + 2 * tx]);
            bv[2 * j] = int(p.x);
            bv[2 * j + 1] = int(p.y);
        }
#pragma unroll
        for (int i = 0; i < kDp4aRows; ++i)
#pragma unroll
            for (int j = 0; j < 2 * kDp4aColPairs; ++j) acc[i][j] = __dp4a(av[i], bv[j], acc[i][j]);
    }
}

// The thread's micro-tile through the epilogue (rows and columns outside [m, n) are skipped).
template <typename OutT>
__device__ __forceinline__ void store_dp4a_micro_tile(const Epilogue<OutT>& ep, const Dp4aThread& th,
                                                      const Dp4aAcc& acc) {
#pragma unroll
    for (int i = 0; i < kDp4aRows; ++i)
#pragma unroll
        for (int j = 0; j < kDp4aColPairs; ++j)
            ep.store_pair(th.m0 + th.ty + 16 * i, th.n0 + 32 * j + 2 * th.tx, acc[i][2 * j],
                          acc[i][2 * j + 1]);
}

// The reference kernels' block: for each step of kStep bytes of a row over k_extent,
// stage(tiles, k0) writes the step's shared tiles (its global loads first, then a __syncthreads
// so that the previous step's reads are done, then its shared stores); every thread then adds
// its micro-tile of the step, and at the end stores it through the epilogue.
template <int kKWords, int kStep, typename OutT, class Stage>
__device__ __forceinline__ void dp4a_reference_block(const Epilogue<OutT>& ep, const Dp4aThread& th,
                                                     int64_t k_extent, Stage&& stage) {
    __shared__ Dp4aTiles<kKWords> tiles;
    Dp4aAcc acc = {};
    for (int64_t k0 = 0; k0 < k_extent; k0 += kStep) {
        stage(tiles, k0);
        __syncthreads();
        dp4a_micro_tile(tiles, th, acc);
    }
    store_dp4a_micro_tile(ep, th, acc);
}

}  // namespace ck
