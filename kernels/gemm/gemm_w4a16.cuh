// gemm_w4a16.cuh - launchers of the weight-only INT4 GEMM (gemm_w4a16.cu for the interchange
// layout and the prepack, gemm_w4a16_prepacked_stream.cu, gemm_w4a16_prepacked_tc.cu and
// gemm_w4a16_prepacked_wgmma_sm90.cu for the prepacked layout of w4a16_prepacked.cuh), called
// by the entry points after they validated every argument.
#pragma once

#include "kernels/core/common.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/gemm/w4a16_prepacked.cuh"

namespace ck {

// A kernel's rows and epilogue (the prepacked kernels' kMoe parameter): dense rows with the
// plain epilogue, the two expert-grouped modes (the MoE calls below), or dense rows with the
// fused Q/K/V projection's epilogue (QkvEpilogue, ck_qkv_projection).
enum MoeMode : int { kMoeDense = 0, kMoeSwiGLU = 1, kMoeWeighted = 2, kQkvRows = 3 };
__host__ __device__ constexpr bool grouped_rows(int mode) {
    return mode == kMoeSwiGLU || mode == kMoeWeighted;
}

// One W4A16 call: out[m, n] = act(x[m, k] . w'[n, k]^T + bias[n]), w' = (q - zero) * scale
// rounded to dtype (fp16 or bf16), as ck_dequantize_int4 computes it. Every W4A16 kernel takes
// the call as it is (by value, as its kernel argument); what the kernels derive from it (the group
// shift, chunk and tile counts, the epilogue) comes from derive() and epilogue() below, so the
// group size has one encoding.
// Interchange layout (ck_gemm_w4a16): w [n, k / 2], scales [n, groups], zeros [n, groups] or
// nullptr (symmetric, signed codes). Prepacked layout (ck_gemm_w4a16_prepacked,
// w4a16_prepacked.cuh): w in 512-byte tiles, scales and zeros [ceil(n / 8)][groups][8], codes
// always unsigned; zeros nullptr means symmetric (zero point 8).
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
    const float* global_scale;  // block formats (gemm_block4.cuh): NVFP4's float32 global scale

    // Set by derive() from the fields above, once on the host. The kernels read them as kernel
    // parameters (constant-bank operands); derived in the kernel, every value would hold a
    // register for the whole kernel, and the streaming kernels measured slower for it.
    //   group_shift: the group of k is k >> group_shift: 5, 6, 7 for groups of 32, 64, 128, and
    //     62 when a row is one group (every k < 2^62 maps to group 0);
    //   chunks: 128-k chunks of a row (the prepacked tile columns); tiles8: n8 output tiles;
    //   pair_aligned: n even and out 4-byte aligned, so an output pair is one 4-byte store.
    int group_shift;
    int64_t chunks, tiles8;
    bool pair_aligned;
    // The fused Q/K/V projection's outputs (ck_qkv_projection: out and bias unused, the kernels'
    // kQkvRows instantiations), or none (qkv.q nullptr). Last, so that the other fields keep
    // their offsets in the kernels' parameters.
    QkvOut qkv;
    static constexpr int kRowGroupShift = 62;
    void derive() {
        group_shift = groups == 1 ? kRowGroupShift : group_size == 32 ? 5 : group_size == 64 ? 6 : 7;
        chunks = prepacked_chunks(k);
        tiles8 = ceil_div(n, kPackRows);
        pair_aligned = n % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
    }

    template <typename T> __host__ __device__ const T* x_as() const { return static_cast<const T*>(x); }
    template <typename T> __host__ __device__ FloatEpilogue<T> epilogue() const {
        return {static_cast<T*>(out), m, n, static_cast<const T*>(bias), activation, pair_aligned};
    }
    // The epilogue of a kernel instantiated for rows and epilogue mode kMode (MoeMode).
    template <typename T, int kMode> __host__ __device__ auto epilogue_of() const {
        if constexpr (kMode == kQkvRows) return QkvEpilogue<T>{epilogue<T>(), qkv};
        else return epilogue<T>();
    }
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

// Prepacked layout on Hopper (gemm_w4a16_prepacked_wgmma_sm90.cu): wgmma fed by TMA, any m
// ("auto" gives it m > 16), K split over a cluster where the tiles alone leave SMs idle.
// Serves m, k and the n8 tile count below 2^31 (TMA coordinates are 32-bit); available where
// the GPU has compute capability 9.0, the library was built with sm_90a and the driver encodes
// tensor maps (cudaErrorNotSupported otherwise).
bool gemm_w4a16_wgmma_available();
cudaError_t gemm_w4a16_prepacked_wgmma(const GemmW4A16Args& args, cudaStream_t stream);

// Expert-grouped calls (the MoE layer, moe/moe.cuh). The rows are the (token, expert) pairs
// sorted by expert and padded per expert to blocks of kMoeBlockRows rows; block b of rows
// (blockIdx.y) multiplies its rows by the weight of expert block_expert[b] (w, scales and
// zeros of GemmW4A16Args point at expert 0; expert e's are w_expert_bytes and
// s_expert_values further), and a block whose expert is -1 does nothing. A row whose pair id
// is `pairs` is padding: it reads zeros and is never stored. Modes:
//   kMoeSwiGLU: the weight is w13 with gate and up interleaved in 8-row tiles (the MoE
//     prepack): out[row, c] = round_to_dtype(silu(gate_c) * up_c), out [rows, n / 2] dtype,
//     row the sorted row; x row of pair p is p / x_div (x [tokens, k]).
//   kMoeWeighted: pair_out[p, c] = pair_weights[p] * sum_c (float32, [pairs, n]); x row is the
//     sorted row (the intermediate that kMoeSwiGLU wrote).
constexpr int kMoeBlockRows = 16;  // the streaming kernel's rows per block
struct MoeRows {
    const int32_t* sorted_ids;   // [blocks * the call's rows per block] pair id, or `pairs`
    const int32_t* block_expert; // [blocks] expert, or -1
    int64_t pairs;
    int32_t x_div;               // kMoeSwiGLU: top_k
    int64_t w_expert_bytes, s_expert_values;
    const float* pair_weights;   // kMoeWeighted: [pairs]
    float* pair_out;             // kMoeWeighted: [pairs, n]
};

// The store of one accumulator fragment of the prepacked tensor-core kernels (tc and wgmma: both
// compute out^T, and share this layout). Lane (g, t) holds c[0], c[1] = out[rows 2t, 2t + 1] of
// column g of a 16-column block and c[2], c[3] the same of column g + 8; row is the lane's row
// after the exchange below (2t + odd), col the block's first column + (g & ~1), odd = g & 1, bv
// the bias of columns col, col + 1, col + 8, col + 9, cols the epilogue's column() of col and
// col + 8 (worked out once for all the rows a thread stores); out, m and n those of the call.
// Even g trades its row-2t + 1 values for the odd neighbour's row-2t values (shfl.xor 4 =
// g ^ 1): then even g stores row 2t, columns (g, g + 1) and (g + 8, g + 9), odd g row 2t + 1,
// columns (g - 1, g) and (g + 7, g + 8). The whole warp calls it (the shuffles). kMode picks
// the rows and the store:
//   kMoeSwiGLU: the 16 columns are a gate tile and its up tile (the MoE prepack's interleave):
//     silu(gate) * up of activation columns col / 2 - (col / 2) % 8 + (g & ~1), + 1, in the
//     sorted row `row` of the [rows, n / 2] intermediate, if the row holds a pair;
//   kMoeWeighted: pair_weights[pair] * value into pair_out[pair] of the row's pair, if any;
//   otherwise: ep.store_pair (plain or fused Q/K/V), rows past m dropped.
template <typename T, int kMode, class Ep>
__device__ __forceinline__ void store_w4a16_fragment(const Ep& ep, void* out, int64_t m, int64_t n,
                                                     const MoeRows& mr, int64_t row, int64_t col,
                                                     int g, bool odd, const float* c,
                                                     const float (&bv)[4],
                                                     const typename Ep::Column (&cols)[2]) {
    if constexpr (kMode == kMoeSwiGLU) {
        const float h0 = silu(c[0]) * c[2], h1 = silu(c[1]) * c[3];
        const float r = __shfl_xor_sync(0xffffffffu, odd ? h0 : h1, 4);
        const int64_t h_cols = n / 2, h_col = col / 2 - (col / 2) % 8 + (g & ~1);
        if (mr.sorted_ids[row] >= mr.pairs || h_col >= h_cols) return;
        T* h = static_cast<T*>(out) + row * h_cols + h_col;
        FloatEpilogue<T>::store_two(h, from_float<T>(odd ? r : h0), from_float<T>(odd ? h1 : r));
        return;
    }
    const float r0 = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[1], 4);
    const float r1 = __shfl_xor_sync(0xffffffffu, odd ? c[2] : c[3], 4);
    const float v0 = odd ? r0 : c[0], v1 = odd ? c[1] : r0;  // columns col, col + 1
    const float v2 = odd ? r1 : c[2], v3 = odd ? c[3] : r1;  // columns col + 8, col + 9
    if constexpr (kMode == kMoeWeighted) {
        const int64_t pair = mr.sorted_ids[row];
        if (pair >= mr.pairs) return;
        const float wgt = mr.pair_weights[pair];
        float* o = mr.pair_out + pair * n;
        if (col < n) *reinterpret_cast<float2*>(o + col) = make_float2(wgt * v0, wgt * v1);
        if (col + 8 < n) *reinterpret_cast<float2*>(o + col + 8) = make_float2(wgt * v2, wgt * v3);
        return;
    }
    if (row >= m) return;
    if (col < n) ep.store_pair(row, col, v0 + bv[0], v1 + bv[1], cols[0]);
    if (col + 8 < n) ep.store_pair(row, col + 8, v2 + bv[2], v3 + bv[3], cols[1]);
}

// active_experts: how many experts may have rows at once (at most): each gets
// SMs / active_experts blocks across its columns.
cudaError_t gemm_w4a16_prepacked_stream_grouped(const GemmW4A16Args& args, MoeMode mode,
                                                const MoeRows& rows, int64_t blocks,
                                                int64_t active_experts, cudaStream_t stream);
// The Hopper kernel grouped (gemm_w4a16_wgmma_available()): blocks of block_rows rows (its two
// tiles' x rows: kWgmmaNarrowRows or kWgmmaWideRows), x the sorted rows themselves
// ([row_blocks * block_rows, k]: for kMoeSwiGLU the caller gathers each pair's token row there
// first; rows.x_div unused), experts the number of experts whose weights follow expert 0's.
constexpr int kWgmmaShortRows = 64, kWgmmaNarrowRows = 128, kWgmmaWideRows = 256;
cudaError_t gemm_w4a16_prepacked_wgmma_grouped(const GemmW4A16Args& args, MoeMode mode,
                                               const MoeRows& rows, int block_rows,
                                               int64_t row_blocks, int64_t experts,
                                               cudaStream_t stream);
// The tensor-core kernel grouped: blocks of 64 or 128 rows (gemm_w4a16_tc_grouped_rows picks
// one from the expected rows per expert), grid tile columns x row blocks.
int gemm_w4a16_tc_grouped_rows(int64_t rows_per_expert);
cudaError_t gemm_w4a16_prepacked_tc_grouped(const GemmW4A16Args& args, MoeMode mode,
                                            const MoeRows& rows, int block_rows,
                                            int64_t row_blocks, cudaStream_t stream);

// A structured-sparse INT4 weight (kernels/sparse/sparse_int4.cuh) as the source of a dense
// prepack: w holds its kept codes [n, k / 4], meta its metadata [n, k / 32] (2:4, or 16:32
// masks); every pruned position becomes the code of 0 (0 when symmetric, else its group's zero
// point, zeros [n, k / group_size]), so that the dense weight's w' is the sparse one's.
struct SparseSource {
    const uint32_t* meta = nullptr;   // nullptr: a dense source
    bool k1632 = false;
    const uint8_t* zeros = nullptr;   // asymmetric zero points, or nullptr
    int64_t group_size = 0;
};

// The prepack (ck_w4a16_prepack): interchange -> prepacked, for an [n, k] weight.
struct W4A16PrepackArgs {
    const uint8_t* w;         // [n, k / 2]
    const void* scales;       // [n, groups] dtype
    const uint8_t* zeros;     // [n, groups] or nullptr (symmetric)
    ck_dtype_t dtype;
    int64_t n, k, group_size, groups;  // group_size resolved as in GemmW4A16Args
    int64_t interleave;       // 0, or n / 2: rows 0 .. n/2-1 and n/2 .. n-1 alternate in 8-row tiles
    uint8_t* w_out;           // w4a16_prepacked_bytes(n, k)
    void* scales_out;         // ceil(n / 8) * 8 * groups
    uint8_t* zeros_out;       // same count, or nullptr (symmetric)
    RopePairs rope;           // the fused Q/K/V weight's rotary pairs (ck_qkv_prepack), or none
    SparseSource sparse;      // a structured-sparse source (ck_sparse_w4a16_prepack_dense), or none
};
cudaError_t w4a16_prepack(const W4A16PrepackArgs& args, cudaStream_t stream);

// The codes half of a prepack, shared by the INT4 and block-format prepacks: w [n, k / 2] (k %
// 32 == 0), two codes per byte -> the prepacked tiles of w_out (w4a16_prepacked_bytes(n, k)).
// Each code is XOR-ed with the nibbles of `flip` (0x88888888 turns two's complement q into
// q + 8); padding rows and k get the word `pad`; high_first: element 2i sits in the high nibble
// of byte i (bitsandbytes' NF4), else in the low one; interleave as in W4A16PrepackArgs; with a
// sparse source, w holds its kept codes [n, k / 4] instead.
struct PrepackCodesArgs {
    const uint8_t* w;
    int64_t n, k, interleave;
    uint32_t flip, pad;
    bool high_first;
    uint8_t* w_out;
    RopePairs rope;
    SparseSource sparse;
};
cudaError_t prepack_codes(const PrepackCodesArgs& args, cudaStream_t stream);

// The grid of the prepack kernels' grid-stride loops over `items`: enough blocks of
// kPrepackThreads to fill the GPU, never more than the items need.
constexpr int kPrepackThreads = 256;
inline unsigned prepack_blocks(int64_t items) {
    const int64_t per_gpu = int64_t(std::max(sm_count(), 1)) * 8;
    return unsigned(std::max<int64_t>(1, std::min(ceil_div(items, int64_t(kPrepackThreads)), per_gpu)));
}

}  // namespace ck
