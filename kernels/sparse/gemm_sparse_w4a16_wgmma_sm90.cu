// gemm_sparse_w4a16_wgmma_sm90.cu - the 2:4 sparse W4A16 GEMM on Hopper's sparse tensor cores:
// wgmma.mma_async.sp with the dequantized kept values in registers, x by TMA, warp-specialized
// (the "wgmma" variant of ck_gemm_sparse_w4a16_prepacked, which "auto" picks for M > 16 on
// compute capability 9.0).
//
// What it computes: gemm_sparse_w4a16.cu's out = act(x w'^T + bias), w' the dequantized kept
// values of a prepacked 2:4 weight (+0 where pruned), products and sums in float32, one rounding.
//
// Algorithm: the dense W4A16 wgmma kernel's (gemm_w4a16_prepacked_wgmma_sm90.cu) on the prepacked
// 2:4 layout (gemm_sparse_w4a16.cu's file comment). The wgmma computes out^T: A (64 x 32 dense k,
// 2:4 sparse: 64 x 16 kept values) is the weight, from registers; B (32 x kBM) is x^T, K-major
// in shared memory. One CTA per kBM x 128 output tile (kBM = 64, 128 or 256 rows of x by 128
// weight rows; the 64-row ones two per SM), or a cluster of 2, 4 or 8 CTAs that split its K and
// sum their partial tiles in distributed shared memory where the tiles alone would leave SMs
// idle (cluster_split.cuh, SparsePlan); K in 128-k chunks through a kStages-deep ring, each
// stage guarded by a full and an empty mbarrier; 384 threads:
//   - warpgroup 2, the producer (its registers go to the consumers): warp 8's lane 0 issues per
//     stage two TMA copies of x (kBM rows x 64 k, one 128-byte swizzle row each) and two of the
//     block's eight 16-row weight tiles, their codes (8 x 512 bytes) and their metadata (8 x 256
//     bytes), exactly as the lanes read them.
//   - warpgroups 0 and 1, the consumers: warp w of warpgroup c takes tile 4c + w (weight rows
//     64c + 16w .. + 15, the wgmma's rows 16w .. 16w + 15). Per chunk and 64-k half h, lane
//     (g, t) reads its code words of rows g and g + 8 and its metadata word h from the stage,
//     dequantizes the two words (Dequant<Int4Zp, T>::word: pairs (j, j + 4) are mma.sp
//     m16n8k32's A registers, which are also wgmma.sp's per warp) and issues the half's two k32
//     steps as wgmma.mma_async.sp m64n{kBM}k32, step 2h + ss with sparsity selector ss: the
//     prepack put step 2h + t / 2's metadata in word h of lane t, so lanes 2 ss and 2 ss + 1
//     hold it, as the selector says. Each wgmma retires before the next one's A registers are
//     written (kInFlight below). The scales (and zero points) of a chunk are read from global
//     memory one chunk ahead.
//   - TMA zero-fills x rows past M and weight tiles past the padded N (scale 0): no masking.
// Against the dense kernel: half the wgmmas (a k32 sparse step costs what a k16 dense one does)
// and half the dequantization per output.
//
// Floors: bytes = M K 2 + rows16 K 3/8 + scales + M N 2; flops = 2 M N K (dense-equivalent; the
// sparse tensor cores do half the products). 8192 x 28672 at M = 4096: 1.92 TFLOP -> 1.95 ms at
// the dense fp16 peak (~989 TFLOP/s), 0.98 ms at the sparse one.
#include <algorithm>
#include <atomic>

#include "kernels/core/cluster_split.cuh"
#include "kernels/core/dequant.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/core/ptx_sm90.cuh"
#include "kernels/core/tma.cuh"
#include "kernels/sparse/sparse_int4.cuh"

namespace ck {
namespace {

constexpr int kConsumers = 2;                         // consumer warpgroups
constexpr int kWarpgroupThreads = 128;
[[maybe_unused]] constexpr int kProducerWarp = 4 * kConsumers;  // warp 8
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;  // 384
constexpr int kBN = kConsumers * 64;                  // 128 weight rows per block
constexpr int kTiles = kBN / kSparsePackRows;         // 8 prepacked 16-row tiles
constexpr int kChunkK = kSparsePackK;                 // 128 k per stage
constexpr int kSteps = kChunkK / 32;                  // 4 wgmma.sp k32 steps per chunk
constexpr int kSwizzleBytes = 128, kSwizzleK = 64;    // x: 64 16-bit values per swizzle row
constexpr int kXBoxes = kChunkK / kSwizzleK;          // 2 x boxes per stage
constexpr int kCodeBytes = kTiles * 32 * 16;          // 4 KB: 16 bytes per lane and tile
constexpr int kMetaBytes = kTiles * 32 * 8;           // 2 KB: 8 bytes per lane and tile
constexpr int kWStageBytes = kCodeBytes + kMetaBytes;
// Every wgmma.sp retires before the next step's A registers are written (wgmma_wait<0>): with
// three queued (four register sets, as the dense kernel keeps its wgmmas queued) the results
// were wrong now and then (H100, CUDA 13.0: ptxas gave step s + 2 the A registers of step s
// while s could still be reading them), and the serial form measured 3-9% slower than that.
// Each 64-k half's dequantization still overlaps the step before it.
[[maybe_unused]] constexpr int kInFlight = 0;
[[maybe_unused]] constexpr int kEmptyArrivals = 4 * kConsumers;  // one per consumer warp
[[maybe_unused]] constexpr int kGroupM = 8;           // tile rows per rasterization group
// Named barrier: both consumer warpgroups are done with the ring (a split block's partials).
[[maybe_unused]] constexpr int kRingFreeBarrier = 1;
static_assert(kSteps == 4, "a chunk is two 64-k halves of two k32 steps");
static_assert(kThreads == kSplitThreads, "two consumer warpgroups, then the producer's");

// The 64-row block runs two per SM (80 registers per thread at launch, the consumers raised to
// 104): its wgmmas are short and retire one at a time, so a second block's hide their latency.
// The larger ones run one per SM (168, the consumers raised to 232).
template <int kRows> struct SparseWgmmaTile {
    static constexpr int kBM = kRows;
    static constexpr int kStages = kRows == 256 ? 3 : 4;
    static constexpr int kBlocksPerSm = kRows == 64 ? 2 : 1;
    static constexpr int kXBoxBytes = kBM * kSwizzleBytes;
    static constexpr int kXStageBytes = kXBoxes * kXBoxBytes;
    static constexpr int kTxBytes = kXStageBytes + kWStageBytes;
    static constexpr int kSmemBytes = 1024 + kStages * kTxBytes + 2 * kStages * 8;
    static constexpr int kProducerRegisters = SplitRegisters<kBlocksPerSm>::kProducer;
    static constexpr int kConsumerRegisters = SplitRegisters<kBlocksPerSm>::kConsumer;
    static_assert(kXBoxBytes % 1024 == 0, "swizzled tiles keep the 1024-byte alignment");
    static_assert(kSmemBytes * kBlocksPerSm <= 227 * 1024, "kBlocksPerSm blocks per SM");
    static_assert(kBM * kBN * 4 <= kStages * kTxBytes, "a split block's partial tile fits");
};
using SparseWgmmaShort = SparseWgmmaTile<64>;
using SparseWgmmaNarrow = SparseWgmmaTile<128>;
using SparseWgmmaWide = SparseWgmmaTile<256>;
static_assert(SparseWgmmaShort::kConsumerRegisters == 104 &&
                  SparseWgmmaShort::kProducerRegisters == 32 &&
                  SparseWgmmaNarrow::kConsumerRegisters == 232 &&
                  SparseWgmmaNarrow::kProducerRegisters == 40 &&
                  SparseWgmmaWide::kConsumerRegisters == 232 &&
                  SparseWgmmaWide::kProducerRegisters == 40,
              "the register split the comments and ptxas notes give");

// A lane's scale pairs (rows g and g + 8, one 32-bit word of two T) and zero-point pairs (one
// byte each) of both 64-k halves of a chunk: a group of 64 is one half, of 128 both.
struct ChunkScales {
    uint32_t s2[2];
    uint32_t z2[2];
};

template <bool kAsym>
__device__ __forceinline__ void load_chunk_scales(const SparseGemmArgs& a, int64_t tile,
                                                  int64_t tiles, int64_t kc, int g,
                                                  ChunkScales& out) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        out.s2[h] = 0u;  // padding tiles: scale 0 (their codes are TMA's zeros)
        out.z2[h] = kSymmetricZero * 0x0101u;
        if (tile >= tiles) continue;
        const int64_t group = (kc * kChunkK + h * 64) / a.group_size;
        const int64_t at = ((tile * a.groups + group) * 8 + g) * 2;  // values of row g, g + 8
        out.s2[h] = __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(a.scales) +
                                                            at));
        if constexpr (kAsym) out.z2[h] = __ldg(reinterpret_cast<const uint16_t*>(a.zeros + at));
    }
}

// kSplit: blocks_per_tile (2, 4 or 8) blocks, one cluster, share each output tile, each taking
// split_chunks of K; the cluster sums their partial tiles (cluster_split_sum) and block r stores
// the 8-row blocks j with j % split == r. Without kSplit none of the cluster's code is compiled in.
template <class Tile, typename T, bool kAsym, bool kSplit>
__global__ void __launch_bounds__(kThreads, Tile::kBlocksPerSm)
sparse_wgmma_kernel(const __grid_constant__ CUtensorMap map_x,
                    const __grid_constant__ CUtensorMap map_codes,
                    const __grid_constant__ CUtensorMap map_meta, const SparseGemmArgs args,
                    const int blocks_per_tile) {
#ifdef CK_SM90A_DEVICE
    const int split = kSplit ? blocks_per_tile : 1;
    constexpr int kBM = Tile::kBM, kStages = Tile::kStages;
    constexpr int kXBoxBytes = Tile::kXBoxBytes, kXStageBytes = Tile::kXStageBytes;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    uint8_t* x_stages = smem;                                 // [kStages][2][kBM][128 B]
    uint8_t* w_stages = x_stages + kStages * kXStageBytes;    // [kStages][codes | meta]
    uint64_t* full = reinterpret_cast<uint64_t*>(w_stages + kStages * kWStageBytes);
    uint64_t* empty = full + kStages;

    // A programmatic dependent of the stream's previous kernel: wait for it before any global
    // access; the next kernel may launch at once.
    wait_for_prior_grid();
    allow_dependent_launch();

    const int rank = split > 1 ? int(cluster_ctarank()) : 0;
    const TileOrigin origin = grouped_tile(blockIdx.x / split, args.m, args.n, kBM, kBN, kGroupM);
    const int64_t m0 = origin.m0, n0 = origin.n0;
    const ChunkRange kr = split_chunks(int(args.k / kChunkK), split, rank);
    const int64_t tiles = sparse_prepacked_rows(args.n) / kSparsePackRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    init_stage_ring<kStages>(full, empty, kEmptyArrivals);
    __syncthreads();

    if (warp >= kProducerWarp) {
        setmaxnreg_dec<Tile::kProducerRegisters>();
        if (warp == kProducerWarp && lane == 0) {
            prefetch_tensor_map(&map_x);
            prefetch_tensor_map(&map_codes);
            prefetch_tensor_map(&map_meta);
            const int tile0 = int(n0 / kSparsePackRows);
            ProducerCursor<kStages> ring;
            for (int kc = kr.begin; kc < kr.end; ++kc) {
                ring.acquire(full, empty, Tile::kTxBytes);
                uint64_t* bar = &full[ring.stage];
                uint8_t* xs = x_stages + ring.stage * kXStageBytes;
#pragma unroll
                for (int b = 0; b < kXBoxes; ++b)
                    tma_load_2d(xs + b * kXBoxBytes, &map_x, bar, kc * kChunkK + b * kSwizzleK,
                                int(m0));
                uint8_t* ws = w_stages + ring.stage * kWStageBytes;
                tma_load_3d(ws, &map_codes, bar, 0, kc, tile0);
                tma_load_3d(ws + kCodeBytes, &map_meta, bar, 0, kc, tile0);
                ring.next();
            }
        }
        if (split > 1) cluster_split_producer_wait();
        return;
    }

    // ---- Consumers: warpgroup c, warp w of it (tile 4c + w), lane (g, t) ----
    setmaxnreg_inc<Tile::kConsumerRegisters>();
    const int c = warp / 4, w = warp % 4;
    const int g = lane / 4;
    const int tile_in_block = 4 * c + w;
    const int64_t tile = n0 / kSparsePackRows + tile_in_block;
    using D = Dequant<Int4Zp, T>;
    ChunkScales next;
    if (kr.begin < kr.end) load_chunk_scales<kAsym>(args, tile, tiles, kr.begin, g, next);

    float acc[kBM / 2];  // 64 x kBM float32 over the warpgroup
#pragma unroll
    for (int i = 0; i < kBM / 2; ++i) acc[i] = 0.f;
    // A step's A registers and metadata: live from its wgmma until the wait that retires it (a
    // wgmma reads them after it issues).
    uint32_t a[4] = {};
    uint32_t meta[1] = {};

    StageCursor<kStages> ring;
    for (int kc = kr.begin; kc < kr.end; ++kc) {
        mbar_wait(&full[ring.stage], ring.parity());
        const uint64_t x_desc = wgmma_descriptor(x_stages + ring.stage * kXStageBytes);
        const uint8_t* ws = w_stages + ring.stage * kWStageBytes;
        const ChunkScales cur = next;
        if (kc + 1 < kr.end) load_chunk_scales<kAsym>(args, tile, tiles, kc + 1, g, next);
        const uint4 q = *reinterpret_cast<const uint4*>(ws + (tile_in_block * 32 + lane) * 16);
        const uint2 e = *reinterpret_cast<const uint2*>(ws + kCodeBytes +
                                                        (tile_in_block * 32 + lane) * 8);
        wgmma_fence_operands(acc);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t zg = kAsym ? cur.z2[h] & 0xFFu : kSymmetricZero;
            const uint32_t zg8 = kAsym ? cur.z2[h] >> 8 & 0xFFu : kSymmetricZero;
            const typename D::Block bg{zg, (cur.s2[h] & 0xFFFFu) * 0x10001u};
            const typename D::Block bg8{zg8, (cur.s2[h] >> 16) * 0x10001u};
            uint32_t pg[4], pg8[4];  // the dequantized pairs of rows g and g + 8
            D::word(word(q, 2 * h), bg, pg);
            D::word(word(q, 2 * h + 1), bg8, pg8);
#pragma unroll
            for (int ss = 0; ss < 2; ++ss) {
                const int s = 2 * h + ss;
                wgmma_wait<kInFlight>();  // the step before, a's and meta's last reader, is done
                wgmma_fence_operands(a);
                wgmma_fence_operands(meta);
                a[0] = pg[2 * ss];
                a[1] = pg8[2 * ss];
                a[2] = pg[2 * ss + 1];
                a[3] = pg8[2 * ss + 1];
                meta[0] = h == 0 ? e.x : e.y;
                wgmma_fence();
                const uint64_t desc =
                    wgmma_descriptor_advance(x_desc, (s / 2) * kXBoxBytes + (s % 2) * 64);
                if (ss == 0) wgmma_sp_m64nk32_rs<T, kBM, 0>(acc, a, desc, meta[0], 1);
                else wgmma_sp_m64nk32_rs<T, kBM, 1>(acc, a, desc, meta[0], 1);
                wgmma_commit();
            }
        }
        wgmma_fence_operands(acc);
        // The first step's wait retired the previous chunk's last wgmma: its stage may be
        // refilled.
        ring.next(empty, lane);
    }
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    wgmma_fence_operands(a);
    wgmma_fence_operands(meta);

    // ---- Split blocks: the cluster sums its partial tiles in the ring, once both warpgroups'
    // wgmmas are done reading it. ----
    if (split > 1) {
        named_barrier_sync<kConsumers * kWarpgroupThreads>(kRingFreeBarrier);
        cluster_split_sum(acc, smem, threadIdx.x, rank, split, m0, args.m);
    }

    // ---- Epilogue. Lane (g, t) holds out[rows 2t, 2t + 1] of columns col0 + g (acc[4j],
    // acc[4j + 1]) and col0 + g + 8 (acc[4j + 2], acc[4j + 3]) of each 8-row block j. Even g
    // trades its row-2t + 1 values for the odd neighbour's row-2t ones (shfl.xor 4), so that
    // each lane stores two adjacent columns of one row. A split block stores the blocks j it
    // summed. ----
    const FloatEpilogue<T> ep = args.epilogue<T>();
    const int t = lane % 4;
    const bool odd = g & 1;
    const int64_t col = n0 + c * 64 + w * 16 + (g & ~1);
    float bv[4];  // the bias of columns col, col + 1, col + 8, col + 9
#pragma unroll
    for (int i = 0; i < 4; ++i) bv[i] = ep.bias_at(col + (i & 1) + 8 * (i >> 1));
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
        if ((j & (split - 1)) != rank) continue;  // uniform over the warp: the shuffles below
        const float* v = acc + 4 * j;
        const float r0 = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 4);
        const float r1 = __shfl_xor_sync(0xffffffffu, odd ? v[2] : v[3], 4);
        const int64_t row = m0 + 8 * j + 2 * t + (odd ? 1 : 0);
        if (row >= args.m) continue;
        if (col < args.n)
            ep.store_pair(row, col, (odd ? r0 : v[0]) + bv[0], (odd ? v[1] : r0) + bv[1]);
        if (col + 8 < args.n)
            ep.store_pair(row, col + 8, (odd ? r1 : v[2]) + bv[2], (odd ? v[3] : r1) + bv[3]);
    }
#endif  // CK_SM90A_DEVICE
}

// The tensor maps of a call: x [m][k] 16-bit values in boxes of kBM rows x 64 k (128-byte
// swizzle rows); the codes as 32-bit words [tiles][chunks][128], a box one chunk of 8 tiles;
// the metadata after them as [tiles][chunks][64], likewise.
cudaError_t make_maps(const SparseGemmArgs& a, int box_rows, CUtensorMap* map_x,
                      CUtensorMap* map_codes, CUtensorMap* map_meta) {
    const int64_t tiles = sparse_prepacked_rows(a.n) / kSparsePackRows;
    const int64_t chunks = a.k / kChunkK;
    if (a.m > INT32_MAX || a.k > INT32_MAX || tiles > INT32_MAX) return cudaErrorNotSupported;
    cudaError_t err = make_tensor_map_2d(map_x, CU_TENSOR_MAP_DATA_TYPE_UINT16, a.x, a.m, a.k,
                                         a.k * 2, box_rows, kSwizzleK,
                                         CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
    const int64_t code_dims[3] = {128, chunks, tiles};
    const int64_t code_strides[2] = {512, chunks * 512};
    const int code_box[3] = {128, 1, kTiles};
    err = make_tensor_map_3d(map_codes, CU_TENSOR_MAP_DATA_TYPE_UINT32, a.codes, code_dims,
                             code_strides, code_box, CU_TENSOR_MAP_SWIZZLE_NONE);
    if (err != cudaSuccess) return err;
    const int64_t meta_dims[3] = {64, chunks, tiles};
    const int64_t meta_strides[2] = {256, chunks * 256};
    const int meta_box[3] = {64, 1, kTiles};
    return make_tensor_map_3d(map_meta, CU_TENSOR_MAP_DATA_TYPE_UINT32,
                              a.codes + tiles * chunks * 512, meta_dims, meta_strides, meta_box,
                              CU_TENSOR_MAP_SWIZZLE_NONE);
}

// One block per kBM x 128 output tile, or one cluster of `split` blocks (each a share of K).
template <class Tile, typename T, bool kAsym>
cudaError_t launch(const SparseGemmArgs& a, int split, cudaStream_t stream) {
    if (!split_allowed(split)) return cudaErrorInvalidValue;
    CUtensorMap map_x, map_codes, map_meta;
    cudaError_t err = make_maps(a, Tile::kBM, &map_x, &map_codes, &map_meta);
    if (err != cudaSuccess) return err;
    const int64_t blocks = output_tiles(a.m, a.n, Tile::kBM, kBN) * split;
    if (!grid_fits(blocks)) return cudaErrorInvalidConfiguration;
    auto kernel = split > 1 ? sparse_wgmma_kernel<Tile, T, kAsym, true>
                            : sparse_wgmma_kernel<Tile, T, kAsym, false>;
    static std::atomic<uint64_t> opted_in_whole{0}, opted_in_split{0};
    err = allow_dynamic_smem_once(kernel, Tile::kSmemBytes,
                                  split > 1 ? opted_in_split : opted_in_whole);
    if (err != cudaSuccess) return err;
    const ClusterLaunch launch(blocks, split, Tile::kSmemBytes, stream, /*dependent=*/true);
    return cudaLaunchKernelEx(&launch.config, kernel, map_x, map_codes, map_meta, a, split);
}

// The plan of a call: the rows of x per block and the blocks that share each output tile's K.
// Rows: 64 for m <= 64; above, 256 where the busiest SM's share of rows (one block per SM at a
// time) is smaller that way, counting a wide row at kWideRowCost of a narrow one (one A
// fragment feeds twice the products), else 128 (where 128-row tiles leave SMs idle, their
// split beat 64-row blocks: M = 256 on 4096 x 4096 and 14336 x 4096, benchmarks/NOTES.md).
// Split: the largest of 2, 4 or 8 whose blocks all run at once and still get kMinSplitChunks
// chunks each, else 1. CK_GEMM_SPARSE_WGMMA_ROWS (64, 128 or 256) and
// CK_GEMM_SPARSE_WGMMA_SPLIT (1, 2, 4, 8) force them (cuda_kernels.h; tests, benchmarks).
struct SparsePlan {
    int rows, split;
};
constexpr double kWideRowCost = 0.85;
constexpr int kMinSplitChunks = 4;

int block_rows(int64_t m, int64_t n) {
    if (const int forced = forced_plan_value("CK_GEMM_SPARSE_WGMMA_ROWS", {64, 128, 256}))
        return forced;
    if (m <= 64) return 64;
    const bool wide =
        busiest_sm_rows(m, n, 256, kBN) * kWideRowCost < busiest_sm_rows(m, n, 128, kBN);
    return wide ? 256 : 128;
}

template <class Tile> int tile_cluster_blocks(int split) {
    static ClusterOccupancyCache cache;
    return cluster_blocks(sparse_wgmma_kernel<Tile, __half, false, true>, Tile::kSmemBytes,
                          split, cache);
}

template <class Tile> int tile_split(int64_t m, int64_t n, int64_t chunks) {
    return plan_split("CK_GEMM_SPARSE_WGMMA_SPLIT", output_tiles(m, n, Tile::kBM, kBN), chunks,
                      kMinSplitChunks, tile_cluster_blocks<Tile>);
}

SparsePlan plan_sparse(int64_t m, int64_t n, int64_t k) {
    const int rows = block_rows(m, n);
    const int64_t chunks = k / kChunkK;
    const int split = rows == 256   ? tile_split<SparseWgmmaWide>(m, n, chunks)
                      : rows == 128 ? tile_split<SparseWgmmaNarrow>(m, n, chunks)
                                    : tile_split<SparseWgmmaShort>(m, n, chunks);
    return {rows, split};
}

template <typename T, bool kAsym>
cudaError_t run(const SparseGemmArgs& a, cudaStream_t stream) {
    const SparsePlan plan = plan_sparse(a.m, a.n, a.k);
    switch (plan.rows) {
        case 256: return launch<SparseWgmmaWide, T, kAsym>(a, plan.split, stream);
        case 128: return launch<SparseWgmmaNarrow, T, kAsym>(a, plan.split, stream);
        default: return launch<SparseWgmmaShort, T, kAsym>(a, plan.split, stream);
    }
}

}  // namespace

bool gemm_sparse_w4a16_wgmma_available() { return tma_wgmma_built_and_runnable(); }

bool sparse_wgmma_fills_gpu(int64_t m, int64_t n, int64_t k) {
    const SparsePlan plan = plan_sparse(m, n, k);
    const int64_t blocks = output_tiles(m, n, plan.rows, kBN) * plan.split;
    return 2 * blocks >= int64_t(std::max(sm_count(), 1));
}

cudaError_t gemm_sparse_w4a16_wgmma(const SparseGemmArgs& args, cudaStream_t stream) {
    if (args.m < 1 || !args.prepacked || args.k1632 || args.k % kSparsePackK ||
        !gemm_sparse_w4a16_wgmma_available())
        return cudaErrorNotSupported;
    const bool asym = args.zeros != nullptr;
    if (args.dtype == CK_DTYPE_BF16)
        return asym ? run<__nv_bfloat16, true>(args, stream)
                    : run<__nv_bfloat16, false>(args, stream);
    return asym ? run<__half, true>(args, stream) : run<__half, false>(args, stream);
}

}  // namespace ck
