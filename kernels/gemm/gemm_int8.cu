// gemm_int8.cu - INT8 x INT8 -> INT32 matrix products with the shared epilogue (epilogue.cuh).
//
// What it computes: acc[m, n] = sum_k a[m, k] * b(k, n), exact int32 (wrapping) sums of int8
// products, then Epilogue<OutT> (raw int32, or scale_a * scale_b * acc + bias -> activation ->
// one rounding to fp32/fp16/bf16). Integer addition is associative, so every summation order
// gives the same bits: the kernels below reorder K freely (and the small-M kernel does).
//
// Layout: a [M, K] row-major; b [N, K] row-major (CK_LAYOUT_NK, nn.Linear weights) or [K, N]
// row-major (CK_LAYOUT_KN); out [M, N] row-major. The entry points guarantee M, N >= 1, K >= 16
// and K % 16 == 0, a and b 16-byte aligned, and N % 16 == 0 for CK_LAYOUT_KN: so every 16-byte
// vector of a row (16 k of a or NK-b, 16 n of KN-b) is either wholly inside the matrix or
// wholly outside. Partial tiles in M, N and K are zero-filled on load and dropped on store.
//
// Variants (cuda_kernels.cu picks one):
//   reference  any GPU (dp4a, sm_61+): 64x64 output tiles, 256 threads with 4x4 micro-tiles,
//              K in steps of 64 bytes through shared memory. The baseline the others are tested
//              against; also what sm_75 runs.
//   mma        sm_80+, M > 16 (or KN-b): mma.sync m16n8k32 s8 tensor-core tiles fed by a
//              4-stage cp.async pipeline, 128x128 tiles (8 warps of 64x32) or, when those make
//              less than one wave on the GPU, 64x64 tiles (4 warps of 32x32). BK = 64 bytes.
//   small_m    sm_80+, M <= 16 and NK-b (decode): streams the weight once, straight from global
//              memory into mma fragments (no shared-memory staging); memory-bound.
//
// Floors: bytes = M*K + N*K + M*N*sizeof(out) (+ scales and bias); ops = 2*M*N*K.
//   For M <= 16 the weight's N*K bytes dominate: time >= N*K / copy bandwidth (H100: 3.0 TB/s,
//   N=14336 K=4096 -> 20 us). For large M the tensor-core rate bounds it (mma.sync reaches a
//   fraction of the H100's dense INT8 peak; Hopper's wgmma kernel lives in gemm_int8_sm90.cu).
#include "kernels/core/epilogue.cuh"
#include "kernels/core/mma_pipeline.cuh"
#include "kernels/core/ptx.cuh"
#include "kernels/gemm/gemm_int8.cuh"


namespace ck {
namespace {

// The sm_80 kernels' bodies compile for every target; below sm_80 (and in the host pass) the
// PTX wrappers are empty and the kernels trap at entry, so nothing after the trap is emitted.
constexpr bool kHasSm80 = CK_SM80;
// FP8 tensor cores (mma.sync e4m3): sm_89 and newer.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
constexpr bool kHasSm89 = true;
#else
constexpr bool kHasSm89 = false;
#endif

// ---------------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------------
// Transposes a 4x4 byte block with 8 byte permutes (prmt): w[i] holds row i (bytes = columns
// 0..3); afterwards w[j] holds column j (byte i = row i).
__device__ __forceinline__ void transpose_4x4_bytes(uint32_t (&w)[4]) {
    const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140);  // w0.b0 w1.b0 w0.b1 w1.b1
    const uint32_t hi01 = __byte_perm(w[0], w[1], 0x7362);  // w0.b2 w1.b2 w0.b3 w1.b3
    const uint32_t lo23 = __byte_perm(w[2], w[3], 0x5140);  // w2.b0 w3.b0 w2.b1 w3.b1
    const uint32_t hi23 = __byte_perm(w[2], w[3], 0x7362);  // w2.b2 w3.b2 w2.b3 w3.b3
    w[0] = __byte_perm(lo01, lo23, 0x5410);                 // w0.b0 w1.b0 w2.b0 w3.b0
    w[1] = __byte_perm(lo01, lo23, 0x7632);                 // w0.b1 w1.b1 w2.b1 w3.b1
    w[2] = __byte_perm(hi01, hi23, 0x5410);
    w[3] = __byte_perm(hi01, hi23, 0x7632);
}

// ---------------------------------------------------------------------------------------------
// Shared pieces of the launchers
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Reference kernel: 64x64 tile per 256-thread block, K in 64-byte steps through shared memory,
// dp4a on 4-byte k groups. Shared tiles hold 32-bit words of 4 consecutive k, word-row major
// ([k / 4][m] and [k / 4][n]), so a thread's operands for one k group are plain word loads.
// Thread (ty, tx) = (tid / 16, tid % 16) owns rows ty + 16 i (i < 4) and column pairs
// 32 j + 2 tx + {0, 1} (j < 2): pairs of adjacent columns, the epilogue's store unit.
// ---------------------------------------------------------------------------------------------
constexpr int kRefBM = kDp4aBM, kRefBN = kDp4aBN;
constexpr int kRefBK = 64;                    // bytes of k per step: one 16-byte vector per thread
constexpr int kRefKWords = kRefBK / 4;        // 4-byte k groups per step
constexpr int kRefThreads = kDp4aThreads;

static_assert(kRefBM * kRefBK / 16 == kRefThreads, "one A vector per thread per step");
static_assert(kRefBN * kRefBK / 16 == kRefThreads, "one B vector (or 4x4 block) per thread");

template <ck_layout_t kLayout, typename OutT>
__global__ void __launch_bounds__(kRefThreads)
gemm_int8_reference_kernel(const int8_t* __restrict__ a, const int8_t* __restrict__ b, int64_t k,
                           Epilogue<OutT> ep) {
    const int64_t m = ep.m, n = ep.n;
    const Dp4aThread th(m);
    const int64_t m0 = th.m0, n0 = th.n0;
    const int tid = threadIdx.x;

    // Loader roles. Row-major vectors (A, NK-B): row tid / 4, 16 bytes at k (tid % 4) * 16.
    const int ld_row = tid / 4, ld_kw = (tid % 4) * 4;
    // KN-B: k rows 4 (tid / 16) .. +3, columns 4 (tid % 16) .. +3, transposed to 4 words.
    const int kn_kw = tid / 16, kn_col = (tid % 16) * 4;

    dp4a_reference_block<kRefKWords, kRefBK>(
        ep, th, k, [&](Dp4aTiles<kRefKWords>& tiles, int64_t k0) {
        auto& sa = tiles.a;
        auto& sb = tiles.b;
        uint4 va = make_uint4(0, 0, 0, 0);
        if (m0 + ld_row < m && k0 + ld_kw * 4 < k)
            va = *reinterpret_cast<const uint4*>(a + (m0 + ld_row) * k + k0 + ld_kw * 4);
        uint32_t vb[4] = {0, 0, 0, 0};
        if constexpr (kLayout == CK_LAYOUT_NK) {
            if (n0 + ld_row < n && k0 + ld_kw * 4 < k) {
                const uint4 v = *reinterpret_cast<const uint4*>(b + (n0 + ld_row) * k + k0 + ld_kw * 4);
                vb[0] = v.x, vb[1] = v.y, vb[2] = v.z, vb[3] = v.w;
            }
        } else {
            // k % 16 == 0 and n % 16 == 0: the 4 rows and 4 columns are all inside or all outside.
            if (k0 + 4 * kn_kw < k && n0 + kn_col < n) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    vb[i] = *reinterpret_cast<const uint32_t*>(b + (k0 + 4 * kn_kw + i) * n + n0 + kn_col);
                transpose_4x4_bytes(vb);
            }
        }
        __syncthreads();  // the previous step's reads of sa/sb are done
        sa[ld_kw + 0][ld_row] = va.x;
        sa[ld_kw + 1][ld_row] = va.y;
        sa[ld_kw + 2][ld_row] = va.z;
        sa[ld_kw + 3][ld_row] = va.w;
        if constexpr (kLayout == CK_LAYOUT_NK) {
#pragma unroll
            for (int i = 0; i < 4; ++i) sb[ld_kw + i][ld_row] = vb[i];
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) sb[kn_kw][kn_col + j] = vb[j];
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel (mma.sync m16n8k32 s8, sm_80+).
//
// Block tile kBM x kBN, K in steps of kBK = 64 bytes; kStages shared-memory stages filled by
// cp.async (16 bytes a thread at a time, zero-filled outside the matrix) so that the loads of
// step kt + kStages - 1 overlap the MMAs of step kt. Warps form a kWarpsM x kWarpsN grid; each
// owns a (kBM / kWarpsM) x (kBN / kWarpsN) sub-tile: kMI x kNI fragments of 16 x 8.
//
// Shared layouts (all 16-byte chunks, XOR-swizzled so that both the cp.async writes and the
// fragment reads touch every bank once per 128-byte wavefront):
//   A and NK-B: [rows][64 bytes] (4 chunks a row). ldmatrix reads 8 rows at one chunk; two rows
//     share a 128-byte line, so chunk c of row r goes to chunk c ^ ((r >> 1) & 3): rows r..r+7
//     land on 8 distinct 16-byte bank groups (4 * (r & 1) + swizzled chunk).
//     Fragments: one ldmatrix.x4 gives a whole A fragment (matrices: rows 0-7 / 8-15 x k bytes
//     0-15 / 16-31 = a0 a1 a2 a3) or the b0 b1 of two n8 tiles.
//   KN-B: [64 k rows][kBN bytes]. The b fragment wants 4 consecutive k of one n per register,
//     which are 4 different rows here. A thread reads a 4x4 byte block (4 k rows x 4 adjacent
//     columns: four 32-bit loads) and transposes it with 8 prmt: 4 registers of 4 k each, one
//     per column. To make those 4 columns the same fragment column of 4 different n8 tiles,
//     the fragment column j of n8 tile t (t < 4) within a 32-column group stands for physical
//     column 4 j + t. The thread with g = lane / 4 therefore reads physical columns 4g..4g+3,
//     and its accumulators c0/c1 of tiles 0..3 are physical columns 8t' + {0..3} / {4..7}
//     (t' = lane % 4): the epilogue undoes the permutation when it stores pairs.
//     Bank conflicts: the 4 rows 4t'+i of one load instruction are 4 rows apart, so chunk index
//     (within the flat tile) p goes to p ^ (2 * ((row >> 2) & 3)): the four row segments land on
//     four different 32-byte bank ranges. The XOR stays within a 128-byte line as long as a row
//     has at least 4 chunks (kBN >= 64).
// ---------------------------------------------------------------------------------------------
constexpr int kBK = kTileKBytes;         // bytes of k per pipeline stage (mma_pipeline.cuh)
constexpr int kChunkBytes = kTileChunkBytes;  // one cp.async
constexpr int kMmaK = 32;                // k of one mma.sync
constexpr int kGroupM = 8;               // tile rows per rasterization group (L2 reuse of B)

// What this family asks of a block tile beyond MmaTile's own checks.
template <class Tile> struct Int8TileChecks {
    static_assert(kBK % kMmaK == 0, "whole mma k steps per stage");
    static_assert(Tile::kWarpN % 32 == 0, "32-column groups per warp (KN-B permutation)");
    static_assert(Tile::kBN / kChunkBytes >= 4, "KN-B swizzle: at least 4 chunks per k row");
    static constexpr bool kOk = true;
};

// 128x128: 8 warps of 64x32, 4 stages x 16 KB = 64 KB (two blocks per SM on sm_80/sm_90).
using MmaTileLarge = MmaTile<128, 128, 2, 4, 4, 2>;
// 64x64: 4 warps of 32x32, 4 stages x 8 KB = 32 KB; for grids the large tile leaves short of
// one wave.
using MmaTileSmall = MmaTile<64, 64, 2, 2, 4, 4>;
static_assert(Int8TileChecks<MmaTileLarge>::kOk && Int8TileChecks<MmaTileSmall>::kOk, "tiles");

// Byte offset of chunk c (16 columns) of k row r in a KN-B stage ([64][kBN bytes]).
template <int kBN> __device__ __forceinline__ uint32_t kn_offset(int r, int c) {
    constexpr int kChunksN = kBN / kChunkBytes;
    return uint32_t((r * kChunksN + c) ^ (((r >> 2) & 3) << 1)) * kChunkBytes;
}

template <class Tile, ck_layout_t kLayout, typename OutT>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
gemm_int8_mma_kernel(const int8_t* __restrict__ a, const int8_t* __restrict__ b, int64_t k,
                     Epilogue<OutT> ep) {
    if constexpr (!kHasSm80) __trap();  // never launched below sm_80 (see kHasSm80)
    constexpr int kBN = Tile::kBN, kStages = Tile::kStages;
    constexpr int kMI = Tile::kMI, kNI = Tile::kNI, kThreads = Tile::kThreads;
    extern __shared__ __align__(128) uint8_t smem[];

    const int64_t m = ep.m, n = ep.n;
    const MmaWarpTile<Tile> wt(m, n, kGroupM);
    const int64_t m0 = wt.m0, n0 = wt.n0;
    const int tid = threadIdx.x, lane = wt.lane, wm0 = wt.wm0, wn0 = wt.wn0;
    const int g = wt.g, tq = wt.tq;  // mma fragment coordinates

    const uint32_t smem_base = shared_address(smem);
    const int64_t k_tiles = ceil_div(k, kBK);

    // Loads k tile kt into stage s: chunk idx = tid + i * kThreads of each operand.
    auto load_stage = [&](int s, int64_t kt) {
        const int64_t k0 = kt * kBK;
        const uint32_t sa = smem_base + s * Tile::kStageBytes;
        const uint32_t sb = sa + Tile::kABytes;
        load_rowk_tile<Tile::kALoads, kThreads>(sa, a, m0, m, k0, k);
        if constexpr (kLayout == CK_LAYOUT_NK) {
            load_rowk_tile<Tile::kBLoads, kThreads>(sb, b, n0, n, k0, k);
        } else {
#pragma unroll
            for (int i = 0; i < Tile::kBLoads; ++i) {
                const int idx = tid + i * kThreads;
                constexpr int kChunksN = kBN / kChunkBytes;
                const int r = idx / kChunksN, c = idx % kChunksN;
                const bool ok = k0 + r < k && n0 + c * kChunkBytes < n;
                const int8_t* src = ok ? b + (k0 + r) * n + n0 + c * kChunkBytes : b;
                cp_async_16_zfill(sb + kn_offset<kBN>(r, c), src, ok);
            }
        }
    };

    int32_t acc[kMI][kNI][4] = {};

    cp_async_pipeline<kStages>(k_tiles, load_stage, [&](int s) {
        const uint32_t sa = smem_base + s * Tile::kStageBytes;
        const uint32_t sb = sa + Tile::kABytes;
#pragma unroll
        for (int ks = 0; ks < kBK / kMmaK; ++ks) {
            const int c0 = ks * (kMmaK / kChunkBytes);  // first chunk of this k32 step
            uint32_t af[kMI][4];
            ldmatrix_a_fragments(af, sa, wm0, c0, lane);

            uint32_t bf[kNI][2];
            if constexpr (kLayout == CK_LAYOUT_NK) {
                ldmatrix_b_fragments(bf, sb, wn0, c0, lane);
            } else {
                const uint8_t* sbp = smem + s * Tile::kStageBytes + Tile::kABytes;
#pragma unroll
                for (int grp = 0; grp < kNI / 4; ++grp) {
                    const int col = wn0 + grp * 32 + g * 4;  // 4 physical columns of this thread
#pragma unroll
                    for (int h = 0; h < 2; ++h) {  // h = 0: b0 (k 4tq..), h = 1: b1 (k 16+4tq..)
                        uint32_t w[4];
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const int row = ks * kMmaK + h * 16 + tq * 4 + i;
                            w[i] = *reinterpret_cast<const uint32_t*>(
                                sbp + kn_offset<kBN>(row, col / kChunkBytes) + col % kChunkBytes);
                        }
                        transpose_4x4_bytes(w);
#pragma unroll
                        for (int t = 0; t < 4; ++t) bf[grp * 4 + t][h] = w[t];
                    }
                }
            }

#pragma unroll
            for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
                for (int ni = 0; ni < kNI; ++ni)
                    mma_s8_16x8x32(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3],
                                   bf[ni][0], bf[ni][1]);
        }
    });

    if constexpr (kLayout == CK_LAYOUT_NK) {
        wt.store_pairs(acc, [&](int64_t row, int64_t col, int32_t acc0, int32_t acc1) {
            ep.store_pair(row, col, acc0, acc1);
        });
    } else {
        // Physical columns 8tq + u (u < 8) of a group: u < 4 is tile u's c0 (c2), u >= 4 is
        // tile u - 4's c1 (c3). Pair p covers u = 2p, 2p + 1.
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) {
                const int64_t row = wt.row(mi, rh);
#pragma unroll
                for (int grp = 0; grp < kNI / 4; ++grp)
#pragma unroll
                    for (int p = 0; p < 4; ++p) {
                        const int t = (p % 2) * 2, reg = 2 * rh + p / 2;
                        ep.store_pair(row, n0 + wn0 + grp * 32 + tq * 8 + p * 2,
                                      acc[mi][grp * 4 + t][reg], acc[mi][grp * 4 + t + 1][reg]);
                    }
            }
    }
}

template <class Tile, ck_layout_t kLayout, typename OutT>
cudaError_t launch_mma(const IntGemmArgs& g, cudaStream_t stream) {
    static std::atomic<uint64_t> opted_in{0};  // per device, for this one kernel
    return launch_tiles<Tile>(gemm_int8_mma_kernel<Tile, kLayout, OutT>, opted_in, g.m, g.n,
                              stream, g.a_as<int8_t>(), g.b_as<int8_t>(), g.k,
                              make_epilogue<OutT>(g));
}

// ---------------------------------------------------------------------------------------------
// Small-M kernel (m <= 16, NK-B): a weight-streaming GEMV/GEMM on tensor cores.
//
// A block owns kSmallCols = 8 * kSmallTiles consecutive output columns (weight rows) and its
// kWarps warps split K: warp w takes k chunks of 64 bytes (w * U + u) + i * kWarps * U (U =
// kSmallUnroll consecutive chunks: 256 bytes of each weight row per warp and step).
// Per chunk and n8 tile, lane l loads 16 bytes of weight row n0 + 8t + l / 4 at k offset
// 16 (l % 4), and 16 bytes of activation rows l / 4 and l / 4 + 8 at the same offset (zeros for
// rows >= m, which are never read). These registers are used directly as m16n8k32 fragments:
// since a sum over k may run in any order as long as A and B agree on it, mma j (j < 2) of the
// chunk takes b0 = word 2j, b1 = word 2j + 1 of the weight vector and a0/a1 = word 2j of rows
// g/g+8, a2/a3 = word 2j + 1: both operands then see mma-k 4t'..4t'+3 (16..19 + 4t') as real k
// 16t' + 8j + 0..3 (+ 4..7), the same bijection. No shared memory, no shuffles: each weight
// byte is loaded once, by one lane, and the next step's loads are in flight during the MMAs.
// A (m x K, tiny) is read by every block, from L1/L2; one activation load serves kSmallTiles
// weight rows. At the end the warps add their partial accumulators through shared memory and
// the block stores its [m, kSmallCols] slice through the epilogue.
// FP8 (kFp8): the same fragments of E4M3 bytes through mma.sync e4m3 (sm_89+); each step's 8
// products of k32 per tile are summed from zero by the tensor cores, then added to the float32
// accumulators (the tensor cores' own sums keep fewer bits; see gemm_int8_sm90.cu). With block
// scales (kBlockScaled) a step's two 128-wide k-blocks (chunks 0-1, 2-3: a warp's steps start at
// multiples of 4 chunks) are summed apart and each scaled into the accumulators (BlockScales);
// their scales are loaded with the step's data, one step ahead.
// W4A8 (kW4A8, FP8 activations): a lane's weight vector is 8 bytes of packed INT4 codes (the same
// 16 k), converted to E4M3 in registers (int4_to_e4m3_x8); a step's two k-blocks are summed
// apart as with block scales, each scaled by its columns' group scales (GroupScales: 2 columns
// per n8 tile and lane).
// ---------------------------------------------------------------------------------------------
constexpr int kSmallTiles = 2;                 // n8 tiles per block
constexpr int kSmallCols = 8 * kSmallTiles;    // output columns per block
constexpr int kSmallChunk = 64;                // k bytes per chunk: 4 lanes x 16 bytes
constexpr int kSmallUnroll = 4;                // consecutive chunks in flight per warp and step
constexpr int kSmallMaxM = 16;                 // rows of the mma fragment
// FP8 and W4A8: blocks of 4 warps per SM the registers must leave room for (left alone, the
// compiler took 240-246 a thread: 2 blocks, too few loads in flight).
// (Without rows 8-15, kUpper false, a step holds half the activation registers: four blocks.)
template <bool kUpper> constexpr int kSmallFp8Blocks = kUpper ? 3 : 4;

template <int kWarps, typename OutT, bool kFp8 = false, bool kBlockScaled = false,
          bool kW4A8 = false, bool kUpper = true>
__global__ void __launch_bounds__(kWarps * 32, kFp8 && kWarps == 4 ? kSmallFp8Blocks<kUpper> : 1)
gemm_int8_small_m_kernel(const int8_t* __restrict__ a, const int8_t* __restrict__ w, int64_t k,
                         BlockScales scales, GroupScales group, Epilogue<OutT> ep) {
    static_assert(kFp8 || !kBlockScaled, "block scales are FP8's");
    static_assert(!kW4A8 || (kFp8 && !kBlockScaled), "W4A8: E4M3 activations, group scales");
    constexpr bool kBlockSums = kBlockScaled || kW4A8;  // a step's k-blocks summed apart
    using WVec = std::conditional_t<kW4A8, uint2, uint4>;
    static_assert(kSmallUnroll * kSmallChunk == 2 * kFp8Block, "a step: two k-blocks");
    if constexpr (!kHasSm80 || (kFp8 && !kHasSm89)) __trap();  // never launched there
    using Acc = std::conditional_t<kFp8, float, int32_t>;
    __shared__ WarpPartials<kWarps, kSmallTiles, 2, Acc> partial;

    const int64_t m = ep.m, n = ep.n;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, tq = lane % 4;
    const int64_t n0 = int64_t(blockIdx.x) * kSmallCols;

    // Weight rows of this lane (one per n8 tile); rows past n are never read.
    const int8_t* wrow[kSmallTiles];
    bool wok[kSmallTiles];
    lane_weight_rows(w, n0, n, g, kW4A8 ? k / 2 : k, kW4A8 ? 8 * tq : 16 * tq, wrow, wok);
    const bool a_lo = g < m, a_hi = kUpper && g + 8 < m;
    const int8_t* arow_lo = a + (a_lo ? g : 0) * k + 16 * tq;
    const int8_t* arow_hi = a + (a_hi ? g + 8 : 0) * k + 16 * tq;

    // One step = kSmallUnroll chunks: the weight and activation vectors of the step's loads.
    struct Step {
        WVec w[kSmallUnroll][kSmallTiles];
        uint4 lo[kSmallUnroll], hi[kUpper ? kSmallUnroll : 1];  // rows g, g + 8 (kUpper)
        // kBlockScaled: the scales of the step's k-blocks h for rows g and g + 8; kW4A8: for
        // columns n0 + 8 t + 2 tq and + 1.
        float scale[kBlockScaled ? 2 : 1][2];
        float column_scale[kW4A8 ? 2 : 1][kW4A8 ? kSmallTiles : 1][2];
    };
    const int64_t chunks = ceil_div(k, kSmallChunk);
    auto load_step = [&](int64_t c0, Step& s) {
#pragma unroll
        for (int u = 0; u < kSmallUnroll; ++u) {
            const int64_t kk = (c0 + u) * kSmallChunk;  // + 16 tq is in the row pointers
            const bool kok = kk + 16 * tq < k;          // the K tail (and chunks past it)
#pragma unroll
            for (int t = 0; t < kSmallTiles; ++t) {
                if constexpr (kW4A8)
                    s.w[u][t] = kok && wok[t] ? load_stream_8(wrow[t] + kk / 2) : WVec{};
                else
                    s.w[u][t] = kok && wok[t] ? load_stream_16(wrow[t] + kk) : WVec{};
            }
            s.lo[u] = kok && a_lo ? __ldg(reinterpret_cast<const uint4*>(arow_lo + kk)) : make_uint4(0, 0, 0, 0);
            if constexpr (kUpper)
                s.hi[u] = kok && a_hi ? __ldg(reinterpret_cast<const uint4*>(arow_hi + kk))
                                      : make_uint4(0, 0, 0, 0);
        }
        if constexpr (kBlockScaled) {
            // Outputs past m or n, and k-blocks past K (their sums are 0), read no scale.
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t kb = c0 / 2 + h;
                const bool kb_ok = kb < scales.k_blocks && n0 < n;
                s.scale[h][0] = kb_ok && a_lo ? scales.at(g, n0, kb) : 0.f;
                s.scale[h][1] = kb_ok && a_hi ? scales.at(g + 8, n0, kb) : 0.f;
            }
        }
        if constexpr (kW4A8) {
            // Columns past n and k-blocks past K (their sums are 0) read no scale.
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int t = 0; t < kSmallTiles; ++t)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int64_t kb = c0 / 2 + h, col = n0 + 8 * t + 2 * tq + c;
                        s.column_scale[h][t][c] =
                            kb < scales.k_blocks && col < n ? group.at(col, kb) : 0.f;
                    }
        }
    };

    // Software pipeline in registers: the next step's loads are issued before this step's
    // MMAs (register_pipeline, mma_pipeline.cuh).
    Acc acc[kSmallTiles][4] = {};
    register_pipeline<kWarps, kSmallUnroll, Step>(chunks, warp, load_step, [&](const Step& cur) {
        // INT8 sums straight into acc; FP8 into this step's own (one set per k-block with
        // block or group scales), added to acc after.
        constexpr int kSets = kBlockSums ? 2 : 1;
        [[maybe_unused]] float step[kSets][kSmallTiles][4] = {};
#pragma unroll
        for (int u = 0; u < kSmallUnroll; ++u) {
            uint4 wv[kSmallTiles];  // the weight's 16 k as int8 or E4M3 bytes
#pragma unroll
            for (int t = 0; t < kSmallTiles; ++t) {
                if constexpr (kW4A8) {
                    int4_to_e4m3_x8(cur.w[u][t].x, wv[t].x, wv[t].y);
                    int4_to_e4m3_x8(cur.w[u][t].y, wv[t].z, wv[t].w);
                } else {
                    wv[t] = cur.w[u][t];
                }
            }
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int t = 0; t < kSmallTiles; ++t) {
                    const uint32_t a0 = word(cur.lo[u], 2 * j);
                    const uint32_t a1 = kUpper ? word(cur.hi[kUpper ? u : 0], 2 * j) : 0u;
                    const uint32_t a2 = word(cur.lo[u], 2 * j + 1);
                    const uint32_t a3 = kUpper ? word(cur.hi[kUpper ? u : 0], 2 * j + 1) : 0u;
                    const uint32_t b0 = word(wv[t], 2 * j);
                    const uint32_t b1 = word(wv[t], 2 * j + 1);
                    if constexpr (kFp8)
                        mma_e4m3_16x8x32(step[kSets == 2 ? u / 2 : 0][t], a0, a1, a2, a3, b0, b1);
                    else
                        mma_s8_16x8x32(acc[t], a0, a1, a2, a3, b0, b1);
                }
        }
        if constexpr (kW4A8) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int t = 0; t < kSmallTiles; ++t)
#pragma unroll
                    for (int r = 0; r < 4; ++r)
                        acc[t][r] = __fmaf_rn(step[h][t][r], cur.column_scale[h][t][r % 2],
                                              acc[t][r]);
        } else if constexpr (kBlockScaled) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int t = 0; t < kSmallTiles; ++t)
#pragma unroll
                    for (int r = 0; r < 4; ++r)
                        acc[t][r] = __fmaf_rn(step[h][t][r], cur.scale[h][r / 2], acc[t][r]);
        } else if constexpr (kFp8) {
#pragma unroll
            for (int t = 0; t < kSmallTiles; ++t)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[t][r] += step[0][t][r];
        }
    });

    // Sum the warps' partial tiles; one thread per accumulator pair (c0 c1 or c2 c3) stores.
    sum_warp_partials(partial, acc, [&](int t, int rh, int l, Acc s0, Acc s1) {
        ep.store_pair(l / 4 + 8 * rh, n0 + 8 * t + 2 * (l % 4), s0, s1);
    });
}

template <int kWarps, typename OutT, bool kFp8, bool kW4A8>
cudaError_t launch_small_m(const IntGemmArgs& g, int64_t blocks, cudaStream_t stream) {
    // Rows 8-15 of the fragment only when m > 8.
    const bool upper = g.m > 8;
    const auto kernel =
        kW4A8 ? (upper ? gemm_int8_small_m_kernel<kWarps, OutT, kFp8, false, kW4A8, true>
                       : gemm_int8_small_m_kernel<kWarps, OutT, kFp8, false, kW4A8, false>)
        : g.block_scaled()
            ? (upper ? gemm_int8_small_m_kernel<kWarps, OutT, kFp8, kFp8, false, true>
                     : gemm_int8_small_m_kernel<kWarps, OutT, kFp8, kFp8, false, false>)
            : (upper ? gemm_int8_small_m_kernel<kWarps, OutT, kFp8, false, false, true>
                     : gemm_int8_small_m_kernel<kWarps, OutT, kFp8, false, false, false>);
    kernel<<<unsigned(blocks), kWarps * 32, 0, stream>>>(g.a_as<int8_t>(), g.b_as<int8_t>(), g.k,
                                                         block_scales(g), group_scales(g),
                                                         make_epilogue<OutT>(g));
    return cudaGetLastError();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers (arguments validated by cuda_kernels.cu)
// ---------------------------------------------------------------------------------------------
cudaError_t gemm_int8_reference(const IntGemmArgs& args, cudaStream_t stream) {
    return dispatch_out_dtype(args.out_dtype, [&](auto tag) {
        using OutT = decltype(tag);
        const auto kernel = args.b_layout == CK_LAYOUT_KN
                                ? gemm_int8_reference_kernel<CK_LAYOUT_KN, OutT>
                                : gemm_int8_reference_kernel<CK_LAYOUT_NK, OutT>;
        return launch_tile_grid(kernel, args.m, args.n, kRefBM, kRefBN, kRefThreads, 0, stream,
                                args.a_as<int8_t>(), args.b_as<int8_t>(), args.k,
                                make_epilogue<OutT>(args));
    });
}

cudaError_t gemm_int8_mma(const IntGemmArgs& args, cudaStream_t stream) {
    const bool small = short_of_one_wave<MmaTileLarge>(args.m, args.n);
    return dispatch_out_dtype(args.out_dtype, [&](auto tag) {
        using OutT = decltype(tag);
        if (args.b_layout == CK_LAYOUT_KN)
            return small ? launch_mma<MmaTileSmall, CK_LAYOUT_KN, OutT>(args, stream)
                         : launch_mma<MmaTileLarge, CK_LAYOUT_KN, OutT>(args, stream);
        return small ? launch_mma<MmaTileSmall, CK_LAYOUT_NK, OutT>(args, stream)
                     : launch_mma<MmaTileLarge, CK_LAYOUT_NK, OutT>(args, stream);
    });
}

namespace {

template <bool kFp8, bool kW4A8 = false>
cudaError_t small_m(const IntGemmArgs& args, cudaStream_t stream) {
    if (args.m > kSmallMaxM || args.b_layout != CK_LAYOUT_NK) return cudaErrorNotSupported;
    const int64_t blocks = ceil_div(args.n, kSmallCols);
    if (!grid_fits(blocks)) return cudaErrorInvalidConfiguration;
    const int64_t chunks = ceil_div(args.k, kSmallChunk);
    const int64_t sms = std::max(sm_count(), 1);
    const auto launch = [&](auto tag) {
        using OutT = decltype(tag);
        // Bandwidth wants many loads in flight on every SM. 4 warps per block, 2 tiles x 4
        // chunks of loads per warp and step, pipelined (the best of a sweep of eleven
        // configurations within noise at every shape, benchmarks/NOTES.md); 8 warps (more of
        // them splitting K) only when there are too few column groups to give every SM two
        // blocks. (16 warps would cap registers at 128 and spill.)
        if (blocks * 2 <= sms && chunks >= 8 * kSmallUnroll)
            return launch_small_m<8, OutT, kFp8, kW4A8>(args, blocks, stream);
        return launch_small_m<4, OutT, kFp8, kW4A8>(args, blocks, stream);
    };
    // FP8 writes float outputs only (the entry point's rule): no int32 instance.
    if constexpr (kFp8) return dispatch_float_dtype(args.out_dtype, launch);
    else return dispatch_out_dtype(args.out_dtype, launch);
}

}  // namespace

cudaError_t gemm_int8_small_m(const IntGemmArgs& args, cudaStream_t stream) {
    return small_m<false>(args, stream);
}

cudaError_t gemm_fp8_small_m(const IntGemmArgs& args, cudaStream_t stream) {
    return small_m<true>(args, stream);
}

cudaError_t gemm_w4a8_small_m(const IntGemmArgs& args, cudaStream_t stream) {
    return small_m<true, true>(args, stream);
}

// ---------------------------------------------------------------------------------------------
// The [K, N] -> [N, K] prepack (ck_int8_prepack): b_nk[n, k] = b_kn[k, n]. A 64 x 64 byte tile
// per block and loop step: each of the 256 threads loads one 16-byte vector of a b_kn row (16 n
// of one k) into shared memory, then stores one 16-byte vector of a b_nk row (16 k of one n)
// gathered from a shared-memory column. K and N are multiples of 16 (the entry point's rule),
// so a vector is wholly inside the matrix or wholly outside. Rows are padded by 16 bytes: the
// column reads of a warp (8 n, 4 groups of 16 k) then fall on distinct banks more often.
// Floor: 2 K N bytes at the copy bandwidth (8192 x 28672: 235 MB read + written, ~78 us).
// ---------------------------------------------------------------------------------------------
namespace {

constexpr int kPrepackTile = 64, kPrepackVec = 16, kPrepackPad = 16;
constexpr int kPrepackTileThreads = kPrepackTile * kPrepackTile / kPrepackVec;  // 256

__global__ void __launch_bounds__(kPrepackTileThreads)
int8_prepack_kernel(const int8_t* __restrict__ b_kn, int64_t k, int64_t n,
                    int8_t* __restrict__ b_nk) {
    __shared__ __align__(16) uint8_t tile[kPrepackTile][kPrepackTile + kPrepackPad];
    const int64_t tiles_n = ceil_div(n, int64_t(kPrepackTile));
    const int64_t tiles = ceil_div(k, int64_t(kPrepackTile)) * tiles_n;
    const int tid = threadIdx.x;
    const int row = tid / (kPrepackTile / kPrepackVec), vec = tid % (kPrepackTile / kPrepackVec);
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int64_t k0 = t / tiles_n * kPrepackTile, n0 = t % tiles_n * kPrepackTile;
        // Load: row `row` (k0 + row) of b_kn, columns n0 + 16 vec .. + 15.
        uint4 v = make_uint4(0, 0, 0, 0);
        if (k0 + row < k && n0 + kPrepackVec * vec < n)
            v = *reinterpret_cast<const uint4*>(b_kn + (k0 + row) * n + n0 + kPrepackVec * vec);
        __syncthreads();  // the previous tile's column reads are done
        *reinterpret_cast<uint4*>(&tile[row][kPrepackVec * vec]) = v;
        __syncthreads();
        // Store: row `row` (n0 + row) of b_nk, columns k0 + 16 vec .. + 15.
        if (n0 + row < n && k0 + kPrepackVec * vec < k) {
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                w[i] = 0;
#pragma unroll
                for (int b = 0; b < 4; ++b)
                    w[i] |= uint32_t(tile[kPrepackVec * vec + 4 * i + b][row]) << (8 * b);
            }
            *reinterpret_cast<uint4*>(b_nk + (n0 + row) * k + k0 + kPrepackVec * vec) =
                make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

}  // namespace

cudaError_t int8_prepack(const int8_t* b_kn, int64_t k, int64_t n, int8_t* b_nk,
                         cudaStream_t stream) {
    const int64_t tiles = ceil_div(k, int64_t(kPrepackTile)) * ceil_div(n, int64_t(kPrepackTile));
    const int64_t blocks = std::min<int64_t>(tiles, 16 * int64_t(std::max(sm_count(), 1)));
    int8_prepack_kernel<<<unsigned(blocks), kPrepackTileThreads, 0, stream>>>(b_kn, k, n, b_nk);
    return cudaGetLastError();
}

}  // namespace ck
