// sparse_int4.cuh - structured-sparse INT4 weights (2:4 and 16:32 along K): the format's device
// helpers, shared by the quantization kernels (sparse_quantize.cu) and the GEMMs
// (gemm_sparse_w4a16.cu), and their launchers, called by the entry points after they validated
// every argument. The format is cuda_kernels.h's (and tests/reference.py's), restated:
//   codes [n, k / 4]: the kept values of a row (k / 2 of them, in ascending k) packed two per
//     byte as ck_quantize_int4 packs them (value 2i in the low nibble; two's complement for
//     symmetric, unsigned for asymmetric codes);
//   meta [n, k / 32] uint32, one word per 32 k of a row: 2:4: block b (k 4b .. 4b + 3) is nibble
//     b % 8 of word b / 8, idx0 | idx1 << 2 with idx0 < idx1 its kept positions; 16:32: bit i
//     set where k 32c + i is kept (16 bits);
//   scales, zeros [n, k / group_size]: groups counted in dense k (64 or 128), each holding
//     group_size / 2 kept values.
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/core/epilogue.cuh"

namespace ck {

constexpr int kSparseWordK = 32;          // dense k per metadata word (or mask) and per thread
constexpr int kSparseWordValues = 16;     // kept values per word: 8 bytes of codes
constexpr uint32_t kSparse24FirstTwo = 0x44444444u;  // every block keeps positions 0 and 1
constexpr int kSparsePackK = 128;         // dense k per prepacked chunk (gemm_sparse_w4a16.cu)
constexpr int kSparsePackRows = 16;       // rows per prepacked tile: one mma.sp A operand

inline bool sparse_group_ok(int64_t group_size) { return group_size == 64 || group_size == 128; }

// The kept positions (0 .. 31, ascending) of one 32-k word of either pattern, as a function
// pos(j) for kept value j < 16: 2:4 block j / 2's nibble; 16:32 the j-th set bit of the mask.
// Decoding a whole word at once (dense8 below decodes 8 dense k at a time).
template <bool k1632>
__device__ __forceinline__ int sparse_position(uint32_t meta, int j) {
    if constexpr (k1632) {
        uint32_t m = meta;
        for (int i = 0; i < j; ++i) m &= m - 1;  // clear the j lowest set bits
        return __ffs(m) - 1;
    } else {
        const uint32_t nib = meta >> (4 * (j / 2)) & 0xFu;
        return 4 * (j / 2) + int(j % 2 ? nib >> 2 : nib & 3u);
    }
}

// Kept value index (0 .. 15) of dense position p (0 .. 31) within a word, or -1 where p is not
// kept.
template <bool k1632>
__device__ __forceinline__ int sparse_value_index(uint32_t meta, int p) {
    if constexpr (k1632) {
        if (!(meta >> p & 1u)) return -1;
        return __popc(meta & ((1u << p) - 1u));
    } else {
        const uint32_t nib = meta >> (4 * (p / 4)) & 0xFu;
        const int in = p % 4;
        if (int(nib & 3u) == in) return 2 * (p / 4);
        if (int(nib >> 2) == in) return 2 * (p / 4) + 1;
        return -1;
    }
}

// Dense weights k0 .. k0 + 7 (k0 % 8 == 0) of a row in float, from the row's codes, metadata
// and its group's scale and zero: (q - zero) * scale rounded to T (ck_dequantize_int4's w'),
// +0 at pruned positions.
template <typename T, bool k1632, bool kAsym>
__device__ __forceinline__ void sparse_dense8(const uint8_t* row_codes, const uint32_t* row_meta,
                                              int64_t k0, float scale, int zero, float (&w)[8]) {
    const uint32_t meta = row_meta[k0 / kSparseWordK];
    const uint2 codes = *reinterpret_cast<const uint2*>(row_codes + k0 / kSparseWordK * 8);
    const uint64_t bits = uint64_t(codes.x) | uint64_t(codes.y) << 32;
    const int p0 = int(k0 % kSparseWordK);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int j = sparse_value_index<k1632>(meta, p0 + i);
        if (j < 0) {
            w[i] = 0.f;
            continue;
        }
        const int u = int(bits >> (4 * j) & 0xFu);
        const int q = kAsym ? u - zero : (u ^ 8) - 8;  // two's complement nibble
        w[i] = to_float(from_float<T>(float(q) * scale));
    }
}

// The 32 dense codes of one metadata word's k as four words of 8 (code k in nibble k % 8 of word
// k / 8: the interchange order of ck_quantize_int4): the word's 16 kept codes (its 8 bytes of
// codes) at their positions, `fill` at the pruned ones. Run once per weight by a prepack.
template <bool k1632>
__device__ __forceinline__ uint4 sparse_dense_codes(uint32_t meta, uint2 codes, uint32_t fill) {
    const uint64_t bits = uint64_t(codes.x) | uint64_t(codes.y) << 32;
    uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int p = 0; p < kSparseWordK; ++p) {
        const int j = sparse_value_index<k1632>(meta, p);
        const uint32_t code = j < 0 ? fill : uint32_t(bits >> (4 * j) & 0xFu);
        w[p / 8] |= code << (4 * (p % 8));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The launchers. Shapes: [n, k] weight, k % 32 == 0 and k % group_size == 0; T of scales is
// `dtype`; zeros nullptr means symmetric.
struct SparseWeight {
    bool k1632;                 // 16:32 (else 2:4)
    int64_t n, k, group_size;   // group_size 64 or 128
    ck_dtype_t dtype;           // the scales' (and the quantizer's input) type
    uint8_t* codes;             // [n, k / 4]
    uint32_t* meta;             // [n, k / 32]
    void* scales;               // [n, k / group_size]
    uint8_t* zeros;             // [n, k / group_size] or nullptr (symmetric)
};

// w [n, k] of w.dtype -> the pruned weight, same shape and type: the k/2 largest |w| of every
// block keep their bits (ties: the lower k; NaN below every number), the others +0.
cudaError_t sparse_prune(const void* w, const SparseWeight& shape, void* out, cudaStream_t stream);

// w -> codes, meta, scales, zeros. violations (or nullptr): the number of blocks with more than
// half non-zeros; such a block keeps its first non-zeros (lowest k).
cudaError_t sparse_quantize_int4(const void* w, const SparseWeight& out, int32_t* violations,
                                 cudaStream_t stream);

// 16:32 masks [n, k / 32] -> 2:4 metadata of the same positions; violations (or nullptr): the
// blocks of 4 that keep other than 2 positions (their metadata: positions 0 and 1).
cudaError_t sparse_1632_to_24(const uint32_t* masks, int64_t n, int64_t k, uint32_t* meta,
                              int32_t* violations, cudaStream_t stream);

// codes, meta, scales, zeros -> dense [n, k] of out_dtype (the scales' type).
cudaError_t sparse_dequantize_int4(const SparseWeight& in, void* out, cudaStream_t stream);

// The prepacked layout of a 2:4 weight (gemm_sparse_w4a16.cu says what it holds), k % 128 == 0.
__host__ __device__ inline int64_t sparse_prepacked_rows(int64_t n) {
    return ceil_div(n, kSparsePackRows) * kSparsePackRows;
}
struct SparsePrepackArgs {
    SparseWeight in;            // 2:4
    uint8_t* w_out;             // codes then metadata: rows16 * k * 3 / 8 bytes
    void* scales_out;           // rows16 * groups values
    uint8_t* zeros_out;         // same count, or nullptr
};
cudaError_t sparse_w4a16_prepack(const SparsePrepackArgs& args, cudaStream_t stream);

// One sparse W4A16 call: out[m, n] = act(x[m, k] w'[n, k]^T + bias[n]), w' as sparse_dense8.
struct SparseGemmArgs {
    const void* x;              // [m, k] dtype
    ck_dtype_t dtype;           // fp16 or bf16: x, scales, bias, out
    bool k1632, prepacked;
    const uint8_t* codes;       // interchange codes, or the prepacked weight (codes + metadata)
    const uint32_t* meta;       // interchange metadata (nullptr when prepacked)
    const void* scales;
    const uint8_t* zeros;       // nullptr: symmetric
    int64_t group_size, groups;
    const void* bias;
    ck_activation_t activation;
    int64_t m, n, k;
    void* out;
    template <typename T> __host__ __device__ FloatEpilogue<T> epilogue() const {
        return {static_cast<T*>(out), m, n, static_cast<const T*>(bias), activation, false};
    }
};

// The stream kernel's grid: 16-row blocks of x and 16-row tiles of the weight within a
// launch's limits (the tile groups along y, at most 65535, where x has more than 16 rows).
inline bool sparse_stream_grid_fits(int64_t m, int64_t n) {
    const int64_t row_blocks = ceil_div(m, kSparsePackRows), tiles = ceil_div(n, kSparsePackRows);
    return row_blocks <= INT32_MAX && tiles <= INT32_MAX && (row_blocks == 1 || tiles <= kMaxGridY);
}

// reference: either pattern on the interchange layout, or a prepacked 2:4 weight; any m, any GPU
// (tiled float32 FMAs).
cudaError_t gemm_sparse_w4a16_reference(const SparseGemmArgs& args, cudaStream_t stream);
// stream: a prepacked 2:4 weight, sm_80+ (cudaErrorNotSupported below): mma.sp tiles that
// stream the compressed weight once per 16 rows of x.
cudaError_t gemm_sparse_w4a16_stream(const SparseGemmArgs& args, cudaStream_t stream);
// tiles: a prepacked 2:4 weight, sm_80+: mma.sp tiles of 128 weight rows by 64 rows of x that
// read the weight about once (for m > 16), while their count fits one launch (2^31 - 1).
constexpr int64_t kSparseTileRows = 128, kSparseTileXRows = 64;
inline bool sparse_tiles_grid_fits(int64_t m, int64_t n) {
    const int64_t groups = ceil_div(n, kSparseTileRows), row_blocks = ceil_div(m, kSparseTileXRows);
    return groups <= INT32_MAX && row_blocks <= INT32_MAX / groups;
}
cudaError_t gemm_sparse_w4a16_tiles(const SparseGemmArgs& args, cudaStream_t stream);
// wgmma: a prepacked 2:4 weight on Hopper's sparse tensor cores (wgmma.mma_async.sp; compute
// capability 9.0 and a build with sm_90a: gemm_sparse_w4a16_wgmma_available), any m; m, k and
// the 16-row tiles below 2^31 (TMA's coordinates), blocks of 64, 128 or 256 rows of x by 128
// weight rows (fewer than 2^31 of them). cudaErrorNotSupported where it cannot run.
bool gemm_sparse_w4a16_wgmma_available();
cudaError_t gemm_sparse_w4a16_wgmma(const SparseGemmArgs& args, cudaStream_t stream);
// Whether the wgmma kernel's plan for [m, n] x k (its blocks, K split included) gives half the
// SMs a block at least: below that the stream kernel is left the call.
bool sparse_wgmma_fills_gpu(int64_t m, int64_t n, int64_t k);
// Whether the tiles kernel's grid for [m, n] fills the GPU (1.5 blocks per SM at least): below
// that the stream kernel, whose warps also split K, measured faster (benchmarks/NOTES.md).
bool sparse_tiles_fill_gpu(int64_t m, int64_t n);

}  // namespace ck
