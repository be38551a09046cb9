// w4a16_prepacked.cuh - the prepacked W4A16 weight layout (ck_w4a16_prepack, documented byte by
// byte in cuda_kernels.h): its constants and index functions, for the kernels that read it
// (gemm_w4a16_prepacked_stream.cu, gemm_w4a16_prepacked_tc.cu, the reference kernel of
// gemm_w4a16.cu) and the prepack that writes it (gemm_w4a16.cu).
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

// ---------------------------------------------------------------------------------------------
// The prepacked layout (ck_w4a16_prepack). The unit is a 512-byte tile: 8 weight rows x 128 k.
// Lane l = 4 g + s of a warp owns 16 bytes at l * 16: row g, k slice 32 s .. 32 s + 31, as four
// words; word i holds k 8i .. 8i + 7 of the slice with nibble e = k 2e (e < 4), 2(e - 4) + 1
// (e >= 4). the INT4 dequantizer (core/dequant.cuh) turns word i into pairs p[j] = (k 8i + 2j, 8i + 2j + 1): exactly x's
// 32-bit words 4i + j of the same slice, so an A fragment register is a plain x word, and a
// warp's 512 bytes are one contiguous load. Codes are unsigned (symmetric q stored as q + 8 with
// zero point 8), so kernels never branch on the mode for the codes. Scales and zeros are
// [N8 / 8][groups][8]: the 8 rows of a tile share 16 (8) contiguous bytes per group.
// ---------------------------------------------------------------------------------------------
constexpr int kPackRows = 8;        // weight rows per tile (one mma n8 tile)
constexpr int kPackK = 128;         // k per tile (4 slices of 32, one per lane column)
constexpr int kPackSliceK = 32;     // k per lane: one 16-byte vector
constexpr int kPackTileBytes = kPackRows * kPackK / 2;  // 512
// N and K of a prepacked weight are at most 2^40 (cuda_kernels.h): the padded sizes, their
// products with the group count and every offset then stay far from int64_t's range.
constexpr int64_t kPackMaxDim = int64_t(1) << 40;
static_assert(kPackTileBytes == 32 * 16, "one 16-byte vector per lane");

__host__ __device__ constexpr int64_t prepacked_rows(int64_t n) { return ceil_div(n, kPackRows) * kPackRows; }
__host__ __device__ constexpr int64_t prepacked_chunks(int64_t k) { return ceil_div(k, kPackK); }

// Byte offset of the 16-byte vector of (row, k slice) in the prepacked weight; k0 a multiple of 32.
__host__ __device__ constexpr int64_t prepacked_vector_offset(int64_t row, int64_t k0, int64_t chunks) {
    return ((row / kPackRows) * chunks + k0 / kPackK) * kPackTileBytes +
           ((row % kPackRows) * (kPackK / kPackSliceK) + (k0 % kPackK) / kPackSliceK) * 16;
}

// Index of the scale (zero) of (row, group) in the prepacked scales (zeros).
__host__ __device__ constexpr int64_t prepacked_group_index(int64_t row, int64_t group, int64_t groups) {
    return ((row / kPackRows) * groups + group) * kPackRows + row % kPackRows;
}

// Nibble e of a prepacked word holds this k of the word's 8.
__host__ __device__ constexpr int prepacked_nibble_k(int e) { return e < 4 ? 2 * e : 2 * (e - 4) + 1; }

// The fused Q/K/V weight's rotary pairs (ck_qkv_prepack with rotate-half RoPE): in each of the
// first `rows` / head_dim heads (those of q and k), prepacked row 2i of the head holds weight
// row i and row 2i + 1 weight row i + R / 2 (i < R / 2, R = rotary_dim); the other rows stay.
// The two outputs one rotation mixes then sit in adjacent columns: one accumulator pair of every
// kernel. rows = 0 (the default): no pairing. source() is also the logical column of a GEMM
// output column.
struct RopePairs {
    int64_t rows = 0, head_dim = 1, rotary_dim = 0;
    __host__ __device__ constexpr int64_t source(int64_t row) const {
        if (row >= rows) return row;
        const int64_t j = row % head_dim;
        if (j >= rotary_dim) return row;
        return row - j + (j % 2 ? rotary_dim / 2 + j / 2 : j / 2);
    }
};

}  // namespace ck
