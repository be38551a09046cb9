// gemm_w4a16.cuh - launchers of the weight-only INT4 GEMM (kernels/gemm_w4a16.cu for the
// interchange layout and the prepack, kernels/gemm_w4a16_stream.cu and kernels/gemm_w4a16_tc.cu
// for the prepacked layout), called by the entry points after they validated every argument.
#pragma once

#include "kernels/core/common.cuh"

namespace ck {

// ---------------------------------------------------------------------------------------------
// The prepacked layout (ck_w4a16_prepack). The unit is a 512-byte tile: 8 weight rows x 128 k.
// Lane l = 4 g + s of a warp owns 16 bytes at l * 16: row g, k slice 32 s .. 32 s + 31, as four
// words; word i holds k 8i .. 8i + 7 of the slice with nibble e = k 2e (e < 4), 2(e - 4) + 1
// (e >= 4). dequant_word turns word i into pairs p[j] = (k 8i + 2j, 8i + 2j + 1): exactly x's
// 32-bit words 4i + j of the same slice, so an A fragment register is a plain x word, and a
// warp's 512 bytes are one contiguous load. Codes are unsigned (symmetric q stored as q + 8 with
// zero point 8), so kernels never branch on the mode for the codes. Scales and zeros are
// [N8 / 8][groups][8]: the 8 rows of a tile share 16 (8) contiguous bytes per group.
// ---------------------------------------------------------------------------------------------
constexpr int kPackRows = 8;        // weight rows per tile (one mma n8 tile)
constexpr int kPackK = 128;         // k per tile (4 slices of 32, one per lane column)
constexpr int kPackSliceK = 32;     // k per lane: one 16-byte vector
constexpr int kPackTileBytes = kPackRows * kPackK / 2;  // 512
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

// One W4A16 call: out[m, n] = act(x[m, k] . w'[n, k]^T + bias[n]), w' = (q - zero) * scale
// rounded to dtype (fp16 or bf16), as ck_dequantize_int4 computes it.
// Interchange layout (ck_gemm_w4a16): w [n, k / 2], scales [n, groups], zeros [n, groups] or
// nullptr (symmetric, signed codes). Prepacked layout (ck_gemm_w4a16_prepacked, see
// kernels/w4a16_fragment.cuh): w in 512-byte tiles, scales and zeros [ceil(n / 8)][groups][8],
// codes always unsigned; zeros nullptr means symmetric (zero point 8).
struct GemmW4A16Args {
    const void* x;            // [m, k] dtype
    ck_dtype_t dtype;         // CK_DTYPE_FP16 or CK_DTYPE_BF16
    const uint8_t* w;         // packed int4 weight
    const void* scales;       // dtype
    const uint8_t* zeros;     // uint8, or nullptr (symmetric)
    int64_t group_size;       // 32, 64, 128 or k (CK_GROUP_ROW is resolved to k)
    int64_t groups;           // groups per row
    const void* bias;         // [n] dtype, or nullptr
    ck_activation_t activation;
    int64_t m, n, k;          // k % 32 == 0
    void* out;                // [m, n] dtype
    bool prepacked;           // w, scales, zeros in the prepacked layout
};

// Interchange layout. small_m: m <= 16, streams the weight once (sm_80+; returns
// cudaErrorNotSupported otherwise). reference: any m, any GPU, simple and obviously right; it
// also reads the prepacked layout (args.prepacked).
cudaError_t gemm_w4a16_small_m(const GemmW4A16Args& args, cudaStream_t stream);
cudaError_t gemm_w4a16_reference(const GemmW4A16Args& args, cudaStream_t stream);

// Prepacked layout, sm_80+ (cudaErrorNotSupported otherwise). stream: m <= 16, a deep cp.async
// pipeline of weight bytes per warp. tc: any m, mma.sync tiles fed from shared memory.
cudaError_t gemm_w4a16_prepacked_stream(const GemmW4A16Args& args, cudaStream_t stream);
cudaError_t gemm_w4a16_prepacked_tc(const GemmW4A16Args& args, cudaStream_t stream);

// The prepack (ck_w4a16_prepack): interchange -> prepacked, for an [n, k] weight.
struct W4A16PrepackArgs {
    const uint8_t* w;         // [n, k / 2]
    const void* scales;       // [n, groups] dtype
    const uint8_t* zeros;     // [n, groups] or nullptr (symmetric)
    ck_dtype_t dtype;
    int64_t n, k, group_size, groups;  // group_size resolved as in GemmW4A16Args
    uint8_t* w_out;           // w4a16_prepacked_bytes(n, k)
    void* scales_out;         // ceil(n / 8) * 8 * groups
    uint8_t* zeros_out;       // same count, or nullptr (symmetric)
};
cudaError_t w4a16_prepack(const W4A16PrepackArgs& args, cudaStream_t stream);

}  // namespace ck
